"""Serving: listen, answer signals and tell systemd, until SIGINT or SIGTERM.

The process side of ``pg_exporter`` without ``--dry-run`` or ``--explain``: the
CLI hands it the settings, the definitions and the web config.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import socket
import ssl
import threading
from typing import Any

from aiohttp import web

from exporter import systemd
from exporter.collection import Exporter
from exporter.declared import Declared
from exporter.definitions import Definitions
from exporter.logs import TARGET
from exporter.settings import ListenAddress, Settings
from exporter.web.app import create_app, create_fleet_app, make_runner
from exporter.web.config import WebConfig, ssl_context
from exporter.web.fleet import FLEET
from exporter.web.reloading import RELOADER, Reloader, ReloadResult
from exporter.web.state import STATE

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
    return asyncio.run(_serve(settings, definitions, web_config or WebConfig(), declared))


#: After SIGINT or SIGTERM the process has ended within this many seconds, whatever
#: still runs: under systemd's default stop timeout (30 s), after which it would kill.
#: The graceful part (responses in flight, a bounded collector's query) fits in it.
STOP_DEADLINE = 25.0
#: Once the server is closed, what may still run is a thread nothing can interrupt
#: (a file read on a hung mount, a DNS lookup, a bcrypt check); Python would wait for
#: it at exit, without limit. It gets this long.
EXIT_DEADLINE = 3.0


def exit_within(seconds: float, code: int) -> threading.Timer:
    """End the process with ``code`` in ``seconds`` unless it has ended by then."""

    def hard_exit() -> None:
        log.warning("still stopping after %gs (a blocked thread); exiting now", seconds)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(code)

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True  # never what keeps the process alive
    timer.start()
    return timer


def _raise_fd_limit() -> None:
    """Use the hard limit of open files, as Go programs do: every client holds a socket,
    and systemd's soft default (1024) lets ~1000 idle or slowloris clients block scrapes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _serve(
    settings: Settings, definitions: Definitions, web_config: WebConfig, declared: Declared | None
) -> int:
    if declared is None:
        app = create_app(settings, definitions, web_config)
    else:
        app = create_fleet_app(settings, definitions, declared, web_config)
    tls = ssl_context(web_config.tls) if web_config.tls else None
    app[RELOADER].tls_context = tls
    app[RELOADER].rebase()  # the certificate files count from now on
    runner = make_runner(app)
    await runner.setup()  # starts the fleet's members
    # A fleet's targets are connected to when first probed, unless --fail-fast wants
    # them all checked now: a replica of a sharded fleet never connects to the others'.
    exporters: list[tuple[str | None, Settings, Exporter]] = (
        [(None, settings, app[STATE].exporter)]
        if declared is None
        else [(m.name, m.state.settings, m.state.exporter) for m in app[FLEET].members.values()]
        if settings.fail_fast
        else []
    )
    if not await _first_contact(exporters, settings.fail_fast):
        await runner.cleanup()
        return 2
    try:
        await _listen(runner, settings, tls)
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        await runner.cleanup()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[ReloadResult]] = set()  # keep references until done
    for sig in (signal.SIGHUP, signal.SIGUSR1):  # the Go exporter reloads on both
        loop.add_signal_handler(sig, _reload_soon, app[RELOADER], reloads)
    systemd.ready()
    interval = systemd.watchdog_interval()
    # Pinged from the event loop itself, so a wedged loop stops the pings and
    # systemd restarts the service.
    watchdog = asyncio.create_task(systemd.watchdog_loop(interval)) if interval else None
    await stop.wait()
    exit_within(STOP_DEADLINE, 0)
    systemd.stopping()
    log.info("shutting down")
    await runner.cleanup()
    if watchdog is not None:
        watchdog.cancel()
    exit_within(EXIT_DEADLINE, 0)  # what is left is threads that cannot be interrupted
    return 0


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
