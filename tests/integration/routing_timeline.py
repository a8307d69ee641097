"""What a failover looks like from outside: several sources sampled side by side, then
durations computed from them (how long no primary was writable, how long none was
routed, how long writes were routed to a node that could not take them).

Each source is polled in a task of its own, every ``PERIOD`` seconds; a sample is
stamped at the middle of its request and its value holds until the next sample of
the same source. Durations are therefore exact up to about one period per edge.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
import psycopg

PERIOD = 0.05  # seconds between the starts of two samples of one source
REQUEST_TIMEOUT = 1.0


@dataclass
class Series:
    """One source's samples: (loop time, value), in time order."""

    samples: list[tuple[float, object]] = field(default_factory=list)

    def at(self, when: float) -> object:
        """The value sampled last at or before ``when`` (the first one before any)."""
        times = [t for t, _ in self.samples]
        index = bisect.bisect_right(times, when) - 1
        return self.samples[max(index, 0)][1]


Fetch = Callable[[], Awaitable[object]]


class Timeline:
    """Polls named sources until stopped; durations over the samples afterwards."""

    def __init__(self, sources: Mapping[str, Fetch]) -> None:
        self.sources = dict(sources)
        self.series = {name: Series() for name in sources}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start one polling task per source."""
        self._tasks = [asyncio.create_task(self._poll(name)) for name in self.sources]

    async def stop(self) -> None:
        """Stop polling after the samples in flight."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def count(self) -> int:
        """Samples of the least sampled source so far."""
        return min(len(s.samples) for s in self.series.values())

    async def _poll(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        fetch, series = self.sources[name], self.series[name]
        while not self._stop.is_set():
            started = loop.time()
            value = await fetch()
            series.samples.append(((started + loop.time()) / 2, value))
            await asyncio.sleep(max(0.0, PERIOD - (loop.time() - started)))

    def duration(
        self, start: float, end: float, holds: Callable[[Mapping[str, object]], bool]
    ) -> float:
        """Seconds within [start, end] during which ``holds`` is true of the sources' values."""
        inside = {t for s in self.series.values() for t, _ in s.samples if start < t < end}
        edges = sorted({start, end, *inside})
        total = 0.0
        for left, right in itertools.pairwise(edges):
            if holds({name: s.at(left) for name, s in self.series.items()}):
                total += right - left
        return total


async def http_status(session: aiohttp.ClientSession, url: str, method: str = "GET") -> int:
    """The status of one request; 0 when nothing answered in time."""
    try:
        async with session.request(method, url) as response:
            await response.read()
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


async def http_text(session: aiohttp.ClientSession, url: str) -> str:
    """The body of one GET; empty when nothing answered in time."""
    try:
        async with session.get(url) as response:
            return await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return ""


class RoleProbe:
    """PostgreSQL's own word on a node: ``primary``, ``replica`` or ``""`` (unreachable).

    One connection kept open (named ``ha-truth``), replaced after any failure; a new
    connection is tried on the next sample, within the request timeout.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    async def __call__(self) -> object:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                if self._conn is None:
                    self._conn = await psycopg.AsyncConnection.connect(
                        self.dsn, autocommit=True, application_name="ha-truth", connect_timeout=2
                    )
                cur = await self._conn.execute("SELECT pg_is_in_recovery()")
                row = await cur.fetchone()
        except (psycopg.Error, OSError, TimeoutError):
            await self.close()
            return ""
        return "replica" if row is not None and row[0] else "primary"

    async def close(self) -> None:
        """Close the kept connection, if any."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


@dataclass(frozen=True)
class Figures:
    """How routing followed one event, in seconds within the sampled window."""

    truth_gap: float  # no node writable, as PostgreSQL itself said
    routed_gap: float  # no node's exporter said primary
    double: float  # two exporters said primary
    ours_wrong: float  # an exporter said primary while its node was not writable
    patroni_wrong: float  # the same for Patroni's REST /primary
    haproxy_double: float  # HAProxy had two servers UP for writes
    haproxy_wrong: float  # HAProxy had a server UP for writes that was not writable
    reachable: float  # node-seconds during which PostgreSQL answered, summed over nodes


def figures(timeline: Timeline, nodes: list[str], start: float, end: float) -> Figures:
    """The figures of ``timeline`` between ``start`` and ``end``, from the sources that
    ``node.truth`` (a role or ""), ``node.ours`` and ``node.patroni`` (an HTTP status)
    and ``haproxy`` (the set of servers UP for writes) name."""

    def writable(v: Mapping[str, object], n: str) -> bool:
        return v[f"{n}.truth"] == "primary"

    def routed(v: Mapping[str, object], n: str, by: str = "ours") -> bool:
        return v[f"{n}.{by}"] == 200

    def chosen(v: Mapping[str, object]) -> frozenset[str]:
        up = v["haproxy"]
        assert isinstance(up, frozenset)
        return up

    def wrong(v: Mapping[str, object], by: str) -> bool:
        return any(routed(v, n, by) and not writable(v, n) for n in nodes)

    def time_when(holds: Callable[[Mapping[str, object]], bool]) -> float:
        return timeline.duration(start, end, holds)

    def reachable(n: str) -> float:
        return time_when(lambda v: v[f"{n}.truth"] != "")

    return Figures(
        truth_gap=time_when(lambda v: not any(writable(v, n) for n in nodes)),
        routed_gap=time_when(lambda v: not any(routed(v, n) for n in nodes)),
        double=time_when(lambda v: sum(routed(v, n) for n in nodes) > 1),
        ours_wrong=time_when(lambda v: wrong(v, "ours")),
        patroni_wrong=time_when(lambda v: wrong(v, "patroni")),
        haproxy_double=time_when(lambda v: len(chosen(v)) > 1),
        haproxy_wrong=time_when(lambda v: any(not writable(v, n) for n in chosen(v))),
        reachable=sum(reachable(n) for n in nodes),
    )
