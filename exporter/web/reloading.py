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
import hashlib
import logging
import os
import stat
from typing import NamedTuple

from aiohttp import web

from exporter.errors import ConfigError, UsageError
from exporter.loading import load_for_settings
from exporter.web.config import TlsConfig, load_certificates, load_web_config, ssl_context
from exporter.web.state import State

log = logging.getLogger(__name__)

#: Files larger than this are hashed by size and mtime only (a collector file is KBs).
_HASH_LIMIT = 16 * 1024 * 1024


class Outcome(NamedTuple):
    """What one reload did: ``ok`` False keeps the running config."""

    ok: bool
    message: str


def fingerprint(state: State) -> str:
    """A digest of every file a reload would read: the config, the web config and the
    certificate and key it names (when TLS is on)."""
    digest = hashlib.sha256()
    paths = _config_files(state.settings.config or "")
    web_config = state.settings.web_config_file
    if web_config:
        paths.append(web_config)
        if state.tls_context is not None:
            try:
                paths.extend(_tls_files(web_config))
            except UsageError as exc:  # e.g. a renewed certificate before its key
                digest.update(str(exc).encode())
    for path in paths:
        digest.update(path.encode(errors="surrogateescape") + b"\0")
        digest.update(_file_digest(path))
    return digest.hexdigest()


def _config_files(path: str) -> list[str]:
    """The config file, or every regular file of the config directory, in name order."""
    if not os.path.isdir(path):
        return [path]
    try:
        names = sorted(os.listdir(path))
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
    """Serialises reloads and coalesces the requests that arrive during one."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.current = fingerprint(state)  # of the files the running config came from
        self.running: asyncio.Task[Outcome] | None = None
        self.queued: asyncio.Task[Outcome] | None = None
        self.reloads = 0  # reloads that parsed a changed config
        # The last failure and the files it came from: the same broken files are not
        # parsed again on every request of a flood.
        self.failed: tuple[str, Outcome] | None = None

    def rebase(self) -> None:
        """Take the files as they are now as the running config's (after start-up)."""
        self.current = fingerprint(self.state)

    async def reload(self) -> Outcome:
        """Reload, or share the reload queued behind the running one."""
        if self.running is None:
            self.running = asyncio.create_task(self._run_then_release())
            return await asyncio.shield(self.running)
        if self.queued is None:
            self.queued = asyncio.create_task(self._after(self.running))
        return await asyncio.shield(self.queued)

    async def _after(self, running: asyncio.Task[Outcome]) -> Outcome:
        await asyncio.wait({running})
        self.running, self.queued = self.queued, None
        return await self._run_then_release()

    async def _run_then_release(self) -> Outcome:
        try:
            return await self._reload_once()
        finally:
            if self.queued is None:
                self.running = None

    async def _reload_once(self) -> Outcome:
        state = self.state
        now = await asyncio.to_thread(fingerprint, state)
        if now == self.current:
            message = f"{state.settings.config} unchanged; the running config stays as it is"
            log.debug(message)
            return Outcome(True, message)
        if self.failed is not None and self.failed[0] == now:
            return self.failed[1]
        try:
            definitions = await asyncio.to_thread(load_for_settings, state.settings)
            tls = await asyncio.to_thread(_renewed_tls, state)
        except (ConfigError, UsageError) as exc:
            log.error("reload failed, the running config stays: %s", exc)
            failure = Outcome(False, f"reload failed, the running config stays:\n{exc}")
            self.failed = (now, failure)
            return failure
        state.exporter.schedule(definitions)
        self.current = now
        self.reloads += 1
        message = (
            f"reloaded {len(definitions.collectors)} collectors from {state.settings.config}; "
            "they apply from the next pass"
        )
        if tls is not None and state.tls_context is not None:
            load_certificates(state.tls_context, tls)
            message += f"; certificate {tls.cert_file or '(inline)'} reloaded"
        log.info(message)
        for warning in definitions.warnings:
            log.warning(warning)
        return Outcome(True, message)


RELOADER = web.AppKey("reloader", Reloader)


def _renewed_tls(state: State) -> TlsConfig | None:
    """The web config's TLS section, checked by building a context from it (or None)."""
    path = state.settings.web_config_file
    if state.tls_context is None or not path:
        return None
    tls = load_web_config(path).tls
    if tls is None:
        raise UsageError(f"{path}: tls_server_config was removed; TLS changes need a restart")
    ssl_context(tls)  # raises UsageError naming what is wrong, before anything changes
    return tls
