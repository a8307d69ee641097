"""The telemetry path: the exposition, under admission and the request budget."""

from __future__ import annotations

import asyncio
import gzip
import logging

from aiohttp import web

from exporter.admission import Admission
from exporter.budget import SCRAPE_TIMEOUT_HEADER, Budget, Interruption, budget_seconds
from exporter.exposition import (
    Family,
    Format,
    accepts_gzip,
    content_type,
    encode,
    negotiate,
    runtime_families,
)
from exporter.web.state import STATE, State

log = logging.getLogger(__name__)

GZIP_LEVEL = 1  # metric text compresses well even at the cheapest level; CPU matters more
# However little of its budget a scrape has left, its answer may take this long to send.
MIN_WRITE_SECONDS = 2.0


async def metrics_handler(request: web.Request) -> web.StreamResponse:
    """The exposition of the one target, under admission and the request budget."""
    return await expose(request, request.app[STATE])


async def expose(request: web.Request, state: State, *, runtime: bool = True) -> web.StreamResponse:
    """``state``'s target's exposition, under its admission and the request budget
    (B1–B3, B7, B21). ``runtime``: add the process's own metrics (a fleet's /probe
    leaves them to /metrics)."""
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
        body = encode(_all_families(state, snapshot.families, runtime=runtime), fmt)
        # The lock is already released (B20); the slot is held until the body is out (B2),
        # but no longer than the budget allows: a client that does not read is cut off.
        deadline = max(budget.remaining(), MIN_WRITE_SECONDS)
        return await write(request, state.admission, body, content_type(fmt), deadline)


_BUSY = "too many concurrent scrapes ({} are being served); try again later\n"
_OUT_OF_BUDGET = (
    "the scrape's budget ran out before the collection pass finished; "
    "collectors that completed are cached for the next scrape\n"
)


def _all_families(state: State, collected: list[Family], *, runtime: bool) -> list[Family]:
    families = list(collected)
    if not state.settings.disable_intro:
        families.extend(state.selfmetrics.families(state.exporter, state.admission))
    if runtime:
        families.extend(runtime_families(state.settings.const_labels))
    return families


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def write(
    request: web.Request, admission: Admission | None, body: bytes, ctype: str, deadline: float
) -> web.StreamResponse:
    """Write the whole body inside the handler, so the admission slot covers it (B2);
    a client that has not taken it within ``deadline`` seconds is disconnected (and
    counted by ``admission``, when the page has one)."""
    response = web.StreamResponse(headers={"Content-Type": ctype})
    if accepts_gzip(request.headers.get("Accept-Encoding")):
        body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        response.headers["Content-Encoding"] = "gzip"
    response.content_length = len(body)
    try:
        async with asyncio.timeout(deadline):
            await response.prepare(request)
            await response.write(body)
            await response.write_eof()
    except ConnectionError:  # the client left as the answer started: not a server error
        if admission is not None:
            admission.note_interrupted(Interruption.CLIENT)
    except TimeoutError:
        if admission is not None:
            admission.note_interrupted(Interruption.WRITE_TIMEOUT)
        log.warning(
            "a client did not read its answer within %.1fs; disconnected it",
            deadline,
            extra={"peer": request.remote or "?", "bytes": len(body)},
        )
        if request.transport is not None:
            request.transport.abort()
    return response
