"""The telemetry path: the exposition, under admission and the request budget.

Writing an answer is bounded apart from making it: the admission slot is given back
once the answer is rendered, and the answer is written in chunks, each of which the
client must take within a few seconds (issue 25: clients that never read cannot hold
the slots a scrape needs, nor make memory grow).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import socket
import threading
import time
import weakref
import zlib
from collections.abc import Sequence

from aiohttp import hdrs, web

from exporter.collect.admission import Admission
from exporter.collect.budget import SCRAPE_TIMEOUT_HEADER, Budget, Interruption, budget_seconds
from exporter.expose.exposition import (
    Family,
    Format,
    accepts_gzip,
    content_type,
    encode_chunks,
    negotiate,
)
from exporter.fleet.state import State
from exporter.report.heap import TRIMMER
from exporter.report.process import runtime_families
from exporter.web.appstate import STATE

log = logging.getLogger(__name__)

GZIP_LEVEL = 1  # metric text compresses well even at the cheapest level; CPU matters more
# However little of its budget a scrape has left, its answer may take this long to send.
MIN_WRITE_SECONDS = 2.0
# A client must take each chunk of its answer within this long (and the whole answer
# within its budget): the kernel's buffers absorb the first few hundred KiB, so a client
# that reads nothing is cut off after about this long, whatever its budget.
WRITE_STALL_SECONDS = 5.0
WRITE_CHUNK = 64 * 1024  # bytes handed to the socket at once: what one connection buffers
CUT_OFF_LOG_PERIOD = 10.0  # seconds between two warnings about clients that did not read


class PrefixGzip:
    """Gzips expositions whose leading pieces repeat, compressing only what follows them.

    Cached collector families hand out the same bytes objects pass after pass, so the
    pieces an exposition is joined from (:func:`encode_chunks`) mostly begin as the last
    one's did, by identity; the self-metrics, which change every pass, come last. This
    keeps the compressor as it stood after the pieces both of the last two expositions
    began with (flushed to a byte boundary with ``Z_SYNC_FLUSH``, which keeps its window)
    and the bytes it had written; an exposition that begins with those pieces again
    starts from a copy of it. The answer is always one gzip member with one CRC.

    Memory: one saved compressor (about 270 KiB of zlib state), its output so far, and
    references to the last exposition's pieces (mostly held by the cache anyway).
    """

    def __init__(self, level: int = GZIP_LEVEL) -> None:
        self.level = level
        self._lock = threading.Lock()  # two answers compressed at once take turns
        self._previous: tuple[bytes, ...] = ()  # pieces of the last exposition
        # (n, compressor after previous[:n], its output): previous[:n] never changes.
        self._saved: tuple[int, zlib._Compress, bytes] | None = None

    def compress(self, chunks: Sequence[bytes]) -> bytes:
        """``b"".join(chunks)`` as one gzip member."""
        with self._lock:
            return self._compress(tuple(chunks))

    def _compress(self, chunks: tuple[bytes, ...]) -> bytes:
        same = _common_prefix(chunks, self._previous)
        saved = self._saved
        if saved is not None and saved[0] <= same:
            start, compressor, head = saved[0], saved[1].copy(), saved[2]
        else:
            start, compressor, head = 0, zlib.compressobj(self.level, zlib.DEFLATED, 31), b""
            saved = None
        out = [head, *map(compressor.compress, chunks[start:same])]
        if same > start:
            out.append(compressor.flush(zlib.Z_SYNC_FLUSH))
            head = b"".join(out)
            saved, out = (same, compressor.copy(), head), [head]
        out.extend(map(compressor.compress, chunks[same:]))
        out.append(compressor.flush())
        self._previous, self._saved = chunks, saved
        return b"".join(out)


def _common_prefix(a: tuple[bytes, ...], b: tuple[bytes, ...]) -> int:
    """How many leading pieces ``a`` and ``b`` share, by identity (not content)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x is not y:
            break
        n += 1
    return n


class Answer:
    """A rendered answer; a cached page's is shared by every request for it.

    ``chunks`` (the pieces the body is joined from) and ``compressor`` let the gzipped
    body reuse the last answer's compression of the pieces they share. Given chunks,
    the body is joined only when a client takes it uncompressed: a gzipped answer never
    needs it whole (on a database of 20 000 tables, 6 MB a scrape that glibc then keeps
    in its heap; issue 31)."""

    def __init__(
        self,
        body: bytes | None,
        content_type: str,
        chunks: Sequence[bytes] = (),
        compressor: PrefixGzip | None = None,
    ) -> None:
        self._body = body if body is not None or chunks else b""
        self.content_type = content_type
        self.chunks = chunks
        self.compressor = compressor
        self._gzipped: asyncio.Future[bytes] | None = None

    @property
    def joined(self) -> bool:
        """Whether the uncompressed body exists (given, or joined for a client)."""
        return self._body is not None

    @property
    def body(self) -> bytes:
        """The answer uncompressed, joined from its chunks at the first call."""
        if self._body is None:
            self._body = b"".join(self.chunks)  # a race to join yields equal bytes
        return self._body

    async def gzipped(self) -> bytes:
        """The body compressed, once, off the event loop (zlib lets the loop run)."""
        if self._gzipped is None:
            self._gzipped = asyncio.ensure_future(asyncio.to_thread(self._compress))
        return await asyncio.shield(self._gzipped)  # one request's hang-up stops no other

    def _compress(self) -> bytes:
        if self.compressor is None or not self.chunks:
            return gzip.compress(self.body, compresslevel=GZIP_LEVEL)
        return self.compressor.compress(self.chunks)


#: One :class:`PrefixGzip` per target and format, gone with the target's exporter.
_COMPRESSORS: weakref.WeakKeyDictionary[object, dict[Format, PrefixGzip]] = (
    weakref.WeakKeyDictionary()
)
#: At most this many are kept, about 300 KiB each: a fleet of thousands of targets would
#: otherwise hold a compressor per target. The first ones keep theirs (no eviction, which
#: would cost a fleet scraped in turn the saving of every target and the copies besides).
MAX_COMPRESSORS = 8


def compressor_for(owner: object, fmt: Format) -> PrefixGzip | None:
    """The prefix compressor of ``owner``'s (a target's) expositions in ``fmt``, or None
    when :data:`MAX_COMPRESSORS` are kept already (its answers are gzipped whole)."""
    by_format = _COMPRESSORS.get(owner)
    found = by_format.get(fmt) if by_format is not None else None
    if found is None:
        if sum(map(len, _COMPRESSORS.values())) >= MAX_COMPRESSORS:
            return None
        found = _COMPRESSORS.setdefault(owner, {})[fmt] = PrefixGzip()
    return found


class Throttle:
    """Lets a repeated log line through at most once a period."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.suppressed = 0
        self._last = float("-inf")

    def allow(self) -> int | None:
        """The number of lines held back since the last one let through, or None when
        this one is held back too."""
        now = time.monotonic()
        if now - self._last < self.period:
            self.suppressed += 1
            return None
        self._last, held, self.suppressed = now, self.suppressed, 0
        return held


_cut_off = Throttle(CUT_OFF_LOG_PERIOD)


async def metrics_handler(request: web.Request) -> web.StreamResponse:
    """The exposition of the one target, under admission and the request budget."""
    return await expose(request, request.app[STATE])


async def expose(request: web.Request, state: State, *, runtime: bool = True) -> web.StreamResponse:
    """``state``'s target's exposition, under its admission and the request budget
    (B1–B3, B7, B21). ``runtime``: add the process's own metrics (a fleet's /probe
    leaves them to /metrics)."""
    with state.admission.slot() as admitted:  # released on every exit path (B3)
        if not admitted:  # B1, D12: at once, no SQL, no queueing
            return web.Response(status=503, text=_busy(state.admission))
        budget = Budget.starting_now(
            budget_seconds(request.headers.get(SCRAPE_TIMEOUT_HEADER)),
            client_gone=lambda: _client_gone(request),
        )
        rendered = await _render(request, state, budget, runtime=runtime)
    if isinstance(rendered, web.Response):
        return rendered
    # The slot is free again: a client that does not read holds a writer's place only,
    # for a few seconds, never the slots a scrape needs (issue 25).
    return await write(
        request, state.admission, rendered, max(budget.remaining(), MIN_WRITE_SECONDS)
    )


async def _render(
    request: web.Request, state: State, budget: Budget, *, runtime: bool
) -> Answer | web.Response:
    """The answer of one admitted request, or the 503 that replaces a partial one."""
    try:
        snapshot = await state.exporter.collect(budget)
    except asyncio.CancelledError:  # the client hung up (handler cancellation)
        state.admission.note_interrupted(Interruption.CLIENT)
        raise
    state.admission.note_wait(snapshot.waited, shared=snapshot.shared)
    if snapshot.interrupted is not None:
        state.admission.note_interrupted(snapshot.interrupted)
        return web.Response(status=503, text=_OUT_OF_BUDGET)  # B21: never partial
    fmt = negotiate(request.headers.get("Accept")) if state.settings.openmetrics else Format.TEXT
    chunks = encode_chunks(_all_families(state, snapshot.families, runtime=runtime), fmt)
    compressor = compressor_for(state.exporter, fmt)
    # The lock is already released (B20).
    return Answer(None, content_type(fmt), chunks, compressor)


def _busy(admission: Admission) -> str:
    if admission.collecting >= admission.limit:
        return (
            f"too many concurrent scrapes ({admission.limit} are being served); try again later\n"
        )
    return (
        f"too many concurrent scrapes ({admission.writing} answers are being sent to clients "
        "that do not read them); try again later\n"
    )


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
    request: web.Request,
    admission: Admission,
    answer: Answer,
    deadline: float,
    *,
    send_buffer: int | None = None,
) -> web.StreamResponse:
    """Write the whole answer inside the handler, holding a writer's place of
    ``admission``; a client that has not taken it within ``deadline`` seconds, or a chunk
    of it within :data:`WRITE_STALL_SECONDS`, is disconnected and counted.

    ``send_buffer`` caps the kernel's send buffer of the connection: otherwise the kernel
    takes up to megabytes of an answer nobody reads, and keeps them while the connection
    is open (a shared page costs the process nothing per request, but not the kernel).
    """
    if send_buffer is not None:
        _cap_send_buffer(request, send_buffer)
    with admission.writer():
        response = web.StreamResponse(headers={"Content-Type": answer.content_type})
        body = b""
        try:
            async with asyncio.timeout(deadline):
                if accepts_gzip(request.headers.get("Accept-Encoding")):
                    body = await answer.gzipped()
                    response.headers["Content-Encoding"] = "gzip"
                else:
                    body = answer.body
                response.content_length = len(body)
                await response.prepare(request)
                # HEAD: GET's headers only; a body after them would be read as the next
                # response on the connection (aiohttp sends what a StreamResponse writes).
                if request.method != hdrs.METH_HEAD:
                    await _send(response, body, min(WRITE_STALL_SECONDS, deadline))
                await response.write_eof()
        except ConnectionError:  # the client left as the answer started: not a server error
            admission.note_interrupted(Interruption.CLIENT)
        except TimeoutError:
            admission.note_interrupted(Interruption.WRITE_TIMEOUT)
            _log_cut_off(request, len(body))
            if request.transport is not None:
                request.transport.abort()
    # Once this request's frames are gone and its buffers free, glibc may give them back.
    asyncio.get_running_loop().call_soon(TRIMMER.after_answer)
    return response


def _cap_send_buffer(request: web.Request, size: int) -> None:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        with contextlib.suppress(OSError):  # a closed socket: the write will tell
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


async def _send(response: web.StreamResponse, body: bytes, stall: float) -> None:
    """``body`` chunk by chunk, each taken by the client within ``stall`` seconds; the
    socket buffers at most a chunk or two beyond what the client took, and a shared body
    is never copied whole."""
    view = memoryview(body)
    for start in range(0, len(body), WRITE_CHUNK):
        async with asyncio.timeout(stall):
            await response.write(view[start : start + WRITE_CHUNK])


def _log_cut_off(request: web.Request, size: int) -> None:
    held = _cut_off.allow()
    if held is None:
        return
    log.warning(
        "a client did not read its answer in time; disconnected it%s",
        f" ({held} more since the last warning)" if held else "",
        extra={"peer": request.remote or "?", "bytes": size},
    )
