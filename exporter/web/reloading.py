"""Reload: read the collector config (and TLS certificate) again, safely under a flood.

``/reload`` (GET, as in the Go exporter, or POST), SIGHUP and SIGUSR1 all come
here. One reload runs at a time; requests arriving meanwhile share the result of
one more reload that starts when the running one ends (so a change made during a
reload is never missed, and a thousand requests cost at most two reloads). A
reload whose files did not change keeps the running plans and caches: it reads
the files to compare them, but parses nothing and runs no extra SQL.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import os
import ssl
import stat
from collections.abc import Sequence
from typing import NamedTuple

from aiohttp import web

from exporter.collect.exporter import Exporter
from exporter.config.loading import YAML_SUFFIXES, load_for_settings
from exporter.config.settings import Settings
from exporter.config.targetsfile import load_targets
from exporter.errors import ConfigError, UsageError
from exporter.fleet.members import Fleet
from exporter.web.webconfig import TlsConfig, load_certificates, load_web_config, ssl_context

log = logging.getLogger(__name__)

#: Files larger than this are hashed by size and mtime only (a collector file is KBs).
_HASH_LIMIT = 16 * 1024 * 1024


class ReloadResult(NamedTuple):
    """What one reload did: ``ok`` False keeps the running config."""

    ok: bool
    message: str


def fingerprint(settings: Settings, tls_context: ssl.SSLContext | None) -> tuple[str, str]:
    """Digests of the files a reload would read, apart: the collector config, and the web
    config with the certificate and key it names (when TLS is on). Apart, so that a
    renewed certificate does not cost the collectors their plans and caches."""
    collectors = _digest_of(_config_files(settings.config or ""))
    web = hashlib.sha256()
    web_config = settings.web_config_file
    if web_config:
        paths = [web_config]
        if tls_context is not None:
            try:
                paths.extend(_tls_files(web_config))
            except UsageError as exc:  # e.g. a renewed certificate before its key
                web.update(str(exc).encode())
        _add_files(web, paths)
    return collectors, web.hexdigest()


def _config_files(path: str) -> list[str]:
    """The config file, or the collector files of the config directory that the loader
    reads (``*.yml``, ``*.yaml``), in name order."""
    if not os.path.isdir(path):
        return [path]
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(YAML_SUFFIXES))
    except OSError:
        return [path]
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


def _tls_files(web_config: str) -> list[str]:
    """The certificate and key files the web config names (UsageError when it is broken)."""
    tls = load_web_config(web_config).tls
    return [p for p in (tls.cert_file, tls.key_file) if p] if tls else []


def _file_digest(path: str) -> bytes:
    """The content's hash; size and time for a huge file; kind for a device or FIFO
    (which could block or never end: the loader refuses them anyway)."""
    try:
        status = os.stat(path)
        if not stat.S_ISREG(status.st_mode):
            return f"not-a-file:{stat.S_IFMT(status.st_mode)}".encode()
        if status.st_size > _HASH_LIMIT:
            return f"{status.st_size}:{status.st_mtime_ns}".encode()
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read(_HASH_LIMIT + 1)).digest()
    except OSError as exc:
        return f"unreadable:{exc.errno}".encode()


class Reloader:
    """Serialises reloads and coalesces the requests that arrive during one.

    It reloads the collector config for the one target's exporter, or, in fleet mode,
    the config and the targets file (with the URL and password files it names) for the
    fleet.
    """

    def __init__(
        self, settings: Settings, *, exporter: Exporter | None = None, fleet: Fleet | None = None
    ) -> None:
        self.settings = settings
        self.exporter = exporter
        self.fleet = fleet
        # The listener's TLS context, whose certificate and key a reload re-reads.
        self.tls_context: ssl.SSLContext | None = None
        self.current = self._fingerprints()  # of the files the running config came from
        self.running: asyncio.Task[ReloadResult] | None = None
        self.queued: asyncio.Task[ReloadResult] | None = None
        self.reloads = 0  # reloads that parsed a changed config
        # The last failure and the files it came from: the same broken files are not
        # parsed again on every request of a flood.
        self.failed: tuple[tuple[str, str, str], ReloadResult] | None = None

    def _fingerprints(self) -> tuple[str, str, str]:
        """(collector config, web config with its TLS files, targets file with its
        secret files)."""
        collectors, web = fingerprint(self.settings, self.tls_context)
        if self.fleet is None:
            return collectors, web, ""
        declared = self.fleet.declared
        return collectors, web, _digest_of([declared.path, *declared.secret_files])

    def rebase(self) -> None:
        """Take the files as they are now as the running config's (after start-up)."""
        self.current = self._fingerprints()

    async def reload(self) -> ReloadResult:
        """Reload, or share the reload queued behind the running one."""
        if self.running is None:
            self.running = asyncio.create_task(self._run_then_release())
            return await asyncio.shield(self.running)
        if self.queued is None:
            self.queued = asyncio.create_task(self._after(self.running))
        return await asyncio.shield(self.queued)

    async def _after(self, running: asyncio.Task[ReloadResult]) -> ReloadResult:
        await asyncio.wait({running})
        self.running, self.queued = self.queued, None
        return await self._run_then_release()

    async def _run_then_release(self) -> ReloadResult:
        try:
            return await self._reload_once()
        finally:
            if self.queued is None:
                self.running = None

    def _forget_refused_logins(self) -> None:
        """The password may be fixed: every target logs in at once again (issue 25).
        Once a reload run, not once a request: a fleet's thousands of targets take
        milliseconds of the event loop, which a flood of /reload would multiply."""
        if self.exporter is not None:
            self.exporter.connections.logins.reset()
        for member in self.fleet.members.values() if self.fleet is not None else ():
            member.state.exporter.connections.logins.reset()

    async def _reload_once(self) -> ReloadResult:
        self._forget_refused_logins()
        settings = self.settings
        now = await asyncio.to_thread(self._fingerprints)
        if now == self.current:
            message = f"{settings.config} unchanged; the running config stays as it is"
            if self.fleet is not None:
                message = f"{settings.config} and {settings.targets_file} unchanged; " + (
                    "the running config stays as it is"
                )
            log.debug(message)
            return ReloadResult(True, message)
        if self.failed is not None and self.failed[0] == now:
            return self.failed[1]
        config_changed = now[0] != self.current[0]
        try:
            definitions = (
                await asyncio.to_thread(load_for_settings, settings) if config_changed else None
            )
            declared = (
                await asyncio.to_thread(load_targets, settings.targets_file, settings)
                if self.fleet is not None and settings.targets_file
                else None
            )
            tls = await asyncio.to_thread(_renewed_tls, settings, self.tls_context)
        except (ConfigError, UsageError) as exc:
            log.error("reload failed, the running config stays: %s", exc)
            failure = ReloadResult(False, f"reload failed, the running config stays:\n{exc}")
            self.failed = (now, failure)
            return failure
        parts = []
        if definitions is not None:
            parts.append(
                f"reloaded {len(definitions.collectors)} collectors from {settings.config}; "
                "they apply from the next pass"
            )
            if self.exporter is not None:
                self.exporter.schedule(definitions)
        # Of the files as read before loading: a change made meanwhile is seen next time.
        # (When the new file names other secret files, the next reload parses once more.)
        self.current = now
        if self.fleet is not None and declared is not None:
            parts.append(await self.fleet.apply(declared, definitions))
            settle_heap()  # the replaced targets' objects are garbage now
        self.reloads += 1
        if tls is not None and self.tls_context is not None:
            load_certificates(self.tls_context, tls)
            parts.append(f"certificate {tls.cert_file or '(inline)'} reloaded")
        message = "; ".join(parts) or "the web config was read again"
        log.info(message)
        for warning in (*(definitions.warnings if definitions else ()),
                        *(declared.warnings if declared else ())):  # fmt: skip
            log.warning(warning)
        return ReloadResult(True, message)


def _digest_of(paths: Sequence[str]) -> str:
    digest = hashlib.sha256()
    _add_files(digest, paths)
    return digest.hexdigest()


def _add_files(digest: hashlib._Hash, paths: Sequence[str]) -> None:
    """Each path and its content's digest (see :func:`_file_digest`)."""
    for path in paths:
        digest.update(path.encode(errors="surrogateescape") + b"\0")
        digest.update(_file_digest(path))


RELOADER = web.AppKey("reloader", Reloader)


def settle_heap() -> None:
    """Collect the garbage once, then exempt every object alive from later collections.

    A fleet's targets are hundreds of thousands of long-lived objects (0.3 s to scan at
    10 000 targets): without this, every full collection the allocations of requests
    trigger stalls the event loop that long (issue 25). Called when a fleet starts and
    after a reload changed its targets, so the replaced ones are collected first.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _renewed_tls(settings: Settings, tls_context: ssl.SSLContext | None) -> TlsConfig | None:
    """The web config's TLS section, checked by building a context from it (or None)."""
    path = settings.web_config_file
    if tls_context is None or not path:
        return None
    tls = load_web_config(path).tls
    if tls is None:
        raise UsageError(f"{path}: tls_server_config was removed; TLS changes need a restart")
    ssl_context(tls)  # raises UsageError naming what is wrong, before anything changes
    return tls
