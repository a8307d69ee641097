"""Serving: listen, act on signals and tell systemd, until SIGINT or SIGTERM.

The process side of ``pg_exporter`` without ``--dry-run`` or ``--explain``: the
CLI hands it the settings, the definitions and the web config.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import resource
import socket
import ssl
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from exporter import systemd
from exporter.collect.exporter import Exporter
from exporter.config.definitions import Definitions
from exporter.config.logs import TARGET
from exporter.config.settings import ListenAddress, Settings
from exporter.config.targetsfile import Declared
from exporter.signals import EXIT_DEADLINE, SIGNALS, exit_within
from exporter.web.app import create_app, create_fleet_app, make_runner
from exporter.web.appstate import STATE
from exporter.web.fleetrequests import FLEET
from exporter.web.reloading import RELOADER, Reloader, ReloadResult
from exporter.web.webconfig import WebConfig, ssl_context

log = logging.getLogger(__name__)


def run(
    settings: Settings,
    definitions: Definitions,
    web_config: WebConfig | None = None,
    declared: Declared | None = None,
) -> int:
    """Serve until SIGINT or SIGTERM; the exit code for the CLI. With ``declared``
    targets, serve them as a fleet."""
    _raise_fd_limit()
    _space_young_collections()
    return asyncio.run(_serve(settings, definitions, web_config or WebConfig(), declared))


def _raise_fd_limit() -> None:
    """Use the hard limit of open files, as Go programs do: every client holds a socket,
    and systemd's soft default (1024) lets ~1000 idle or slowloris clients block scrapes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


#: Allocations (net of frees) between two collections of the youngest generation. A pass
#: reads tens of thousands of rows, each a tuple of cells, alive until it is published:
#: at Python's default (700) a pass on a big database (5 000 statements, 20 000 tables)
#: ran about 19 young collections that scanned the rows still alive, 7.8 ms of CPU a
#: pass, uncached; at this threshold none (bench/README.md). Garbage is freed by
#: reference counting either way; this only spaces out the search for cycles.
YOUNG_COLLECTION_THRESHOLD = 20_000


def _space_young_collections() -> None:
    """Raise the youngest generation's collection threshold (never lower it: a larger
    one set for the interpreter stays); the older generations' are kept."""
    young, *older = gc.get_threshold()
    if 0 < young < YOUNG_COLLECTION_THRESHOLD:
        gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *older)


async def _serve(
    settings: Settings, definitions: Definitions, web_config: WebConfig, declared: Declared | None
) -> int:
    stop = asyncio.Event()
    # Before anything connects: a signal during the first contact stops or is queued.
    with SIGNALS.attached(asyncio.get_running_loop(), stop.set):
        app, runner, tls = await _set_up(settings, definitions, web_config, declared)
        targets = _to_contact(app, settings, declared)
        contacted = await _unless_stopped(_first_contact(targets, settings.fail_fast), stop)
        if contacted is not True:
            await runner.cleanup()
            return 0 if contacted is None else 2  # None: stopped before serving
        try:
            await _listen(runner, settings, tls)
        except OSError as exc:
            log.error("cannot listen: %s", exc)
            await runner.cleanup()
            return 1
        reloads: set[asyncio.Task[ReloadResult]] = set()  # keep references until done
        SIGNALS.serving(functools.partial(_reload_soon, app[RELOADER], reloads))
        await _serve_until(stop, runner)
    exit_within(EXIT_DEADLINE, 0)  # what is left is threads that cannot be interrupted
    return 0


async def _set_up(
    settings: Settings, definitions: Definitions, web_config: WebConfig, declared: Declared | None
) -> tuple[web.Application, web.AppRunner, ssl.SSLContext | None]:
    """The app, its runner set up (which starts a fleet's members) and the TLS context."""
    if declared is None:
        app = create_app(settings, definitions, web_config)
    else:
        app = create_fleet_app(settings, definitions, declared, web_config)
    tls = ssl_context(web_config.tls) if web_config.tls else None
    app[RELOADER].tls_context = tls
    app[RELOADER].rebase()  # the certificate files count from now on
    runner = make_runner(app)
    await runner.setup()
    return app, runner, tls


def _to_contact(
    app: web.Application, settings: Settings, declared: Declared | None
) -> list[tuple[str | None, Settings, Exporter]]:
    """The targets to contact at start. A fleet's are connected to when first probed,
    unless --fail-fast wants them all checked now: a replica of a sharded fleet never
    connects to the others'."""
    if declared is None:
        return [(None, settings, app[STATE].exporter)]
    if not settings.fail_fast:
        return []
    return [(m.name, m.state.settings, m.state.exporter) for m in app[FLEET].members.values()]


async def _serve_until(stop: asyncio.Event, runner: web.AppRunner) -> None:
    """Serve until SIGINT or SIGTERM (which also armed the exit STOP_DEADLINE later)."""
    systemd.ready()
    interval = systemd.watchdog_interval()
    # Pinged from the event loop itself, so a wedged loop stops the pings and
    # systemd restarts the service.
    watchdog = asyncio.create_task(systemd.watchdog_loop(interval)) if interval else None
    await stop.wait()
    systemd.stopping()
    log.info("shutting down")
    await runner.cleanup()
    if watchdog is not None:
        watchdog.cancel()


#: Seconds spent at most unwinding a first contact that a stop signal interrupted.
ABANDON_LIMIT = 1.0


async def _unless_stopped(work: Awaitable[bool], stop: asyncio.Event) -> bool | None:
    """What ``work`` returns, or None when ``stop`` is set first. The work is then
    abandoned, not awaited: a preflight the server never answers must not hold a stop."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not stop.is_set():
        return task.result()
    log.info("stopping before serving")
    # psycopg answers the first cancellation of a query by asking the server to cancel
    # it and waiting; a further one makes it close the connection at once.
    deadline = asyncio.get_running_loop().time() + ABANDON_LIMIT
    while not task.done() and asyncio.get_running_loop().time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=0.01)
    return None


async def _listen(runner: web.AppRunner, settings: Settings, tls: ssl.SSLContext | None) -> None:
    """Start a site per listen address, or per socket systemd passed (socket activation)."""
    if not settings.systemd_socket:
        for address in settings.listen_addresses:
            before = set(runner.addresses)
            await web.TCPSite(runner, address.host, address.port, ssl_context=tls).start()
            for bound in _bound(address, set(runner.addresses) - before):
                log.info("listening", extra={"address": str(bound)})
        return
    sockets = systemd.listen_sockets()
    if not sockets:
        raise OSError("--web.systemd-socket is set but systemd passed no socket ($LISTEN_FDS)")
    for sock in sockets:
        await web.SockSite(runner, sock, ssl_context=tls).start()
        log.info("listening on a socket from systemd", extra={"address": _name(sock)})


def _bound(address: ListenAddress, sockets: set[Any]) -> list[ListenAddress]:
    """The address as given, or with port 0 the ports the system chose (one a socket):
    a launcher or test reads the port from this line."""
    if address.port != 0:
        return [address]
    ports = sorted({name[1] for name in sockets if isinstance(name, tuple)})
    return [address._replace(port=port) for port in ports]


def _name(sock: socket.socket) -> str:
    address = sock.getsockname()
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


def _reload_soon(reloader: Reloader, tasks: set[asyncio.Task[ReloadResult]]) -> None:
    """SIGHUP, SIGUSR1: reload like ``/reload`` does, in a task of the event loop."""
    task = asyncio.get_running_loop().create_task(reloader.reload())
    tasks.add(task)
    task.add_done_callback(tasks.discard)


#: Fleet mode: targets first contacted at once at start (each within its connect timeout).
FIRST_CONTACTS_AT_ONCE = 8
#: Seconds the first preflight may take at start beyond --connect-timeout.
FIRST_CONTACT_GRACE = 5.0


async def _first_contact(
    exporters: list[tuple[str | None, Settings, Exporter]], fail_fast: bool
) -> bool:
    """Try each target (a fleet member's name, or None) once at start, a few at a
    time; False only when --fail-fast forbids going on because one is unreachable."""
    gate = asyncio.Semaphore(FIRST_CONTACTS_AT_ONCE)

    async def contact(name: str | None, settings: Settings, exporter: Exporter) -> bool:
        TARGET.set(name)  # this task's log lines name the member
        async with gate:
            within = settings.connect_timeout + FIRST_CONTACT_GRACE
            try:
                # Connecting has its own bound; the preflight has none but this one, and a
                # server that accepts and then never answers must not hold the start.
                async with asyncio.timeout(within):
                    await exporter.main.prepare()
            except Exception as exc:
                reason = str(exc) or f"no answer within {within:g}s"
                if isinstance(exc, TimeoutError):
                    await exporter.main.disconnect()
                if fail_fast:
                    log.error("target unreachable and --fail-fast is set: %s", reason,
                              extra={"url": settings.masked_url})  # fmt: skip
                    return False
                log.warning("target unreachable at start, will retry on each scrape: %s", reason,
                            extra={"url": settings.masked_url})  # fmt: skip
                return True
            log.info("connected", extra={"url": settings.masked_url})
            return True

    return all(await asyncio.gather(*(contact(n, s, e) for n, s, e in exporters)))
