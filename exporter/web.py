"""The HTTP side: the application factory, its handlers, and ``run`` for the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import resource
import signal
import socket
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from exporter import systemd
from exporter.admission import Admission
from exporter.budget import SCRAPE_TIMEOUT_HEADER, Budget, Interruption, budget_seconds
from exporter.collection import Exporter
from exporter.definitions import Definitions
from exporter.exposition import (
    Family,
    Format,
    accepts_gzip,
    content_type,
    encode,
    negotiate,
    runtime_families,
)
from exporter.health import health_context
from exporter.reloading import RELOADER, Outcome, Reloader
from exporter.routes import add_routes
from exporter.selfmetrics import SelfMetrics
from exporter.settings import Settings
from exporter.state import STATE, State
from exporter.webauth import install
from exporter.webconfig import WebConfig, ssl_context

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = 10.0  # seconds for responses in flight to finish on SIGTERM
GZIP_LEVEL = 1  # metric text compresses well even at the cheapest level; CPU matters more
# However little of its budget a scrape has left, its answer may take this long to send.
MIN_WRITE_SECONDS = 2.0


def create_app(
    settings: Settings, definitions: Definitions, web_config: WebConfig | None = None
) -> web.Application:
    """The exporter's aiohttp application; connections close on cleanup.

    Basic auth and extra headers from the web config apply to every route.
    """
    app = web.Application()
    exporter = Exporter(settings, definitions)
    app[STATE] = State(
        settings=settings,
        exporter=exporter,
        admission=Admission(),
        selfmetrics=SelfMetrics(settings.effective_namespace(), settings.const_labels),
    )
    app[RELOADER] = Reloader(app[STATE])
    app.cleanup_ctx.append(_close_exporter)
    app.cleanup_ctx.append(health_context(settings))
    app.router.add_get(settings.telemetry_path, metrics_handler)
    add_routes(app)
    install(app, web_config or WebConfig())
    return app


async def _close_exporter(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[STATE].exporter.close()


async def metrics_handler(request: web.Request) -> web.StreamResponse:
    """The exposition, under admission and the request budget (B1–B3, B7, B21)."""
    state = request.app[STATE]
    with state.admission.slot() as admitted:  # released on every exit path (B3)
        if not admitted:  # B1, D12: at once, no SQL, no queueing
            return web.Response(status=503, text=_BUSY.format(state.admission.limit))
        budget = Budget.starting_now(
            budget_seconds(request.headers.get(SCRAPE_TIMEOUT_HEADER)),
            client_gone=lambda: _client_gone(request),
        )
        try:
            snapshot = await state.exporter.collect(budget)
        except asyncio.CancelledError:  # the client hung up (handler cancellation)
            state.admission.note_interrupted(Interruption.CLIENT)
            raise
        state.admission.note_wait(snapshot.waited, shared=snapshot.shared)
        if snapshot.interrupted is not None:
            state.admission.note_interrupted(snapshot.interrupted)
            return web.Response(status=503, text=_OUT_OF_BUDGET)  # B21: never partial
        fmt = (
            negotiate(request.headers.get("Accept")) if state.settings.openmetrics else Format.TEXT
        )
        body = encode(_all_families(state, snapshot.families), fmt)
        # The lock is already released (B20); the slot is held until the body is out (B2),
        # but no longer than the budget allows: a client that does not read is cut off.
        deadline = max(budget.remaining(), MIN_WRITE_SECONDS)
        return await _write(request, body, content_type(fmt), deadline)


_BUSY = "too many concurrent scrapes ({} are being served); try again later\n"
_OUT_OF_BUDGET = (
    "the scrape's budget ran out before the collection pass finished; "
    "collectors that completed are cached for the next scrape\n"
)


def _all_families(state: State, collected: list[Family]) -> list[Family]:
    families = list(collected)
    if not state.settings.disable_intro:
        families.extend(state.selfmetrics.families(state.exporter, state.admission))
    families.extend(runtime_families(state.settings.const_labels))
    return families


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _write(
    request: web.Request, body: bytes, ctype: str, deadline: float
) -> web.StreamResponse:
    """Write the whole body inside the handler, so the admission slot covers it (B2);
    a client that has not taken it within ``deadline`` seconds is disconnected."""
    response = web.StreamResponse(headers={"Content-Type": ctype})
    if accepts_gzip(request.headers.get("Accept-Encoding")):
        body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        response.headers["Content-Encoding"] = "gzip"
    response.content_length = len(body)
    admission = request.app[STATE].admission
    try:
        async with asyncio.timeout(deadline):
            await response.prepare(request)
            await response.write(body)
            await response.write_eof()
    except ConnectionError:  # the client left as the answer started: not a server error
        admission.note_interrupted(Interruption.CLIENT)
    except TimeoutError:
        admission.note_interrupted(Interruption.WRITE_TIMEOUT)
        log.warning(
            "a client did not read its answer within %.1fs; disconnected it",
            deadline,
            extra={"peer": request.remote or "?", "bytes": len(body)},
        )
        if request.transport is not None:
            request.transport.abort()
    return response


def make_runner(app: web.Application) -> web.AppRunner:
    """The runner used in production (and by tests that need real sockets)."""
    # Handler cancellation is on by choice: a client that hangs up cancels its handler,
    # which stops waiting for the lock at once (B5) and tells the pass, which runs in a
    # task of its own, to start nothing new; a bounded collector in flight is shielded
    # and finishes (B11).
    # On SIGTERM, handlers still running after SHUTDOWN_TIMEOUT are cancelled; the
    # exporter then waits for its pass (SHUTDOWN_GRACE) and closes its connections.
    return web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )


def run(settings: Settings, definitions: Definitions, web_config: WebConfig | None = None) -> int:
    """Serve until SIGINT or SIGTERM; the exit code for the CLI."""
    _raise_fd_limit()
    return asyncio.run(_serve(settings, definitions, web_config or WebConfig()))


def _raise_fd_limit() -> None:
    """Use the hard limit of open files, as Go programs do: every client holds a socket,
    and systemd's soft default (1024) lets ~1000 idle or slowloris clients block scrapes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _serve(settings: Settings, definitions: Definitions, web_config: WebConfig) -> int:
    app = create_app(settings, definitions, web_config)
    tls = ssl_context(web_config.tls) if web_config.tls else None
    app[STATE].tls_context = tls
    app[RELOADER].rebase()  # the certificate files count from now on
    if not await _first_contact(app[STATE].exporter, settings):
        return 2
    runner = make_runner(app)
    await runner.setup()
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
    reloads: set[asyncio.Task[Outcome]] = set()  # keep references until done
    for sig in (signal.SIGHUP, signal.SIGUSR1):  # the Go exporter reloads on both
        loop.add_signal_handler(sig, _reload_soon, app[RELOADER], reloads)
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
    return 0


async def _listen(runner: web.AppRunner, settings: Settings, tls: ssl.SSLContext | None) -> None:
    """Start a site per listen address, or per socket systemd passed (socket activation)."""
    if not settings.systemd_socket:
        for address in settings.listen_addresses:
            await web.TCPSite(runner, address.host, address.port, ssl_context=tls).start()
            log.info("listening", extra={"address": str(address)})
        return
    sockets = systemd.listen_sockets()
    if not sockets:
        raise OSError("--web.systemd-socket is set but systemd passed no socket ($LISTEN_FDS)")
    for sock in sockets:
        await web.SockSite(runner, sock, ssl_context=tls).start()
        log.info("listening on a socket from systemd", extra={"address": _name(sock)})


def _name(sock: socket.socket) -> str:
    address = sock.getsockname()
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


def _reload_soon(reloader: Reloader, tasks: set[asyncio.Task[Outcome]]) -> None:
    """SIGHUP, SIGUSR1: reload like ``/reload`` does, in a task of the event loop."""
    task = asyncio.get_running_loop().create_task(reloader.reload())
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _first_contact(exporter: Exporter, settings: Settings) -> bool:
    """Try the target once at start; False only when --fail-fast forbids going on."""
    try:
        await exporter.main.prepare()
    except Exception as exc:
        if settings.fail_fast:
            log.error("target unreachable and --fail-fast is set: %s", exc)
            return False
        log.warning("target unreachable at start, will retry on each scrape: %s", exc)
        return True
    log.info("connected", extra={"url": settings.masked_url})
    return True
