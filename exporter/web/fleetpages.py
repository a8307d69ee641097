"""The fleet's pages: ``/probe?target=NAME``, the exporter's own ``/metrics``, the
``/targets`` page and ``/sd`` (Prometheus's HTTP service discovery).

The three fleet-wide pages cost the event loop little however large the fleet (issue
25): each is rendered at most once per freshness period, or again when a reload changes
the fleet, and shared by every request meanwhile. The members are read and their lines
formatted in small chunks, between which the loop serves other requests (not in a worker
thread: pure-Python work there holds the interpreter lock, and under a flood of requests
the loop would wait for it at every socket call). Each page has its own admission: its
answers are written under the same write deadlines as a scrape's, and past a few unread
answers further requests get 503 at once.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from exporter.collect.admission import Admission
from exporter.collect.budget import SCRAPE_TIMEOUT_HEADER, budget_seconds
from exporter.config.logs import TARGET
from exporter.config.targetsfile import Declared
from exporter.expose.exposition import Family, Format, content_type, encode, make_family
from exporter.fleet.members import Fleet, Member
from exporter.health.probeslots import ProbeSlots
from exporter.pg.bulkheads import Bulkhead, server_samples
from exporter.report.process import runtime_families
from exporter.web.fleetrequests import FLEET, FLEET_PAGE, member_for
from exporter.web.metrics import Answer, expose, write
from exporter.web.pages import html_page

Samples = list[tuple[tuple[tuple[str, str], ...], float]]
T = TypeVar("T")

# A live page (/targets, /metrics) is rendered again once it is older than its last
# rendering took divided by this share, so rendering takes at most this share of the
# event loop however often it is asked for; and never shown older than MAX_PAGE_AGE.
PAGE_SHARE = 0.05
MAX_PAGE_AGE = 10.0  # seconds
READ_CHUNK = 200  # members read between two turns of the event loop
# Bytes of a page the kernel may hold for one connection (it doubles the figure): unread
# pages stall at this, hold one of a few writer places, and are cut off; without it 2 000
# unread /targets of 10 000 targets held 1.5 GB of kernel memory.
SEND_BUFFER = 128 * 1024


async def probe_handler(request: web.Request) -> web.StreamResponse:
    """One declared target's exposition, under that target's own admission, pass lock,
    caches and budget, and the fleet's ceiling (B1–B22 per target)."""
    member = member_for(request)  # 400 or 404 before anything runs
    token = TARGET.set(member.name)  # log lines of this request and its pass name it
    try:
        return await expose(request, member.state, runtime=False)
    finally:
        TARGET.reset(token)


@dataclass(slots=True)
class _Rendered:
    answer: Answer
    declared: Declared  # the targets it shows: a reload replaces the fleet's
    made: float  # the page's clock
    fresh_for: float  # seconds


class Page:
    """One fleet-wide page: its rendered answers (one per variant, e.g. text or HTML),
    shared until stale, made by one rendering at a time; and its own admission."""

    def __init__(
        self,
        make: Callable[[Fleet, str], Awaitable[Answer]],
        *,
        live: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.make = make
        self.clock = clock
        self.live = live  # shows values that change without a reload
        self.admission = Admission()
        self.renderings = 0
        self._rendered: dict[str, _Rendered] = {}
        self._making: dict[str, asyncio.Task[_Rendered]] = {}

    async def answer(self, fleet: Fleet, variant: str) -> Answer:
        """The page as rendered lately enough, or as the rendering in flight makes it."""
        rendered = self._rendered.get(variant)
        now = self.clock()
        if (
            rendered
            and rendered.declared is fleet.declared
            and now - rendered.made < rendered.fresh_for
        ):
            return rendered.answer
        making = self._making.get(variant)
        if making is None:
            making = asyncio.create_task(self._render(fleet, variant), name=f"render {variant}")
            self._making[variant] = making
            making.add_done_callback(lambda _: self._making.pop(variant, None))
        return (await asyncio.shield(making)).answer  # a hang-up stops no other request

    async def _render(self, fleet: Fleet, variant: str) -> _Rendered:
        declared, started = fleet.declared, self.clock()
        answer = await self.make(fleet, variant)
        made = self.clock()
        self.renderings += 1
        fresh_for = min((made - started) / PAGE_SHARE, MAX_PAGE_AGE) if self.live else math.inf
        self._rendered[variant] = rendered = _Rendered(answer, declared, made, fresh_for)
        return rendered

    async def serve(self, request: web.Request, variant: str = "") -> web.StreamResponse:
        """The page under its admission and the request's budget as write deadline."""
        with self.admission.slot() as admitted:
            if not admitted:
                return web.Response(status=503, text=_BUSY)
            answer = await self.answer(request.app[FLEET], variant)
        deadline = budget_seconds(request.headers.get(SCRAPE_TIMEOUT_HEADER))
        return await write(request, self.admission, answer, deadline, send_buffer=SEND_BUFFER)


_BUSY = "too many answers of this page are being written; try again later\n"


@dataclass(frozen=True, slots=True)
class FleetPages:
    """The fleet-wide pages of one application."""

    metrics: Page
    targets: Page
    sd: Page

    @classmethod
    def create(cls) -> FleetPages:
        """Pages rendering what they show from the fleet they are asked about."""
        return cls(
            Page(_metrics_answer, live=True),
            Page(_targets_answer, live=True),
            Page(_sd_answer, live=False),
        )


FLEET_PAGES = web.AppKey("fleet_pages", FleetPages)


async def read_members(fleet: Fleet, read: Callable[[Member], T]) -> list[T]:
    """``read`` of every member in name order, a chunk at a time: the event loop serves
    other requests between two chunks, however large the fleet."""
    members = sorted(fleet.members.values(), key=lambda m: m.name)
    rows: list[T] = []
    for start in range(0, len(members), READ_CHUNK):
        rows.extend(read(member) for member in members[start : start + READ_CHUNK])
        await asyncio.sleep(0)
    return rows


async def fleet_metrics_handler(request: web.Request) -> web.StreamResponse:
    """The exporter's own metrics in fleet mode: the process, the ceiling and each
    target's status. No database is asked: targets are scraped at /probe."""
    return await request.app[FLEET_PAGES].metrics.serve(request)


async def _metrics_answer(fleet: Fleet, _variant: str) -> Answer:
    rows = await read_members(fleet, _metrics_row)
    gate = fleet.gate
    ceiling = (gate.limit, gate.active, gate.waiting, gate.entered, gate.waited, gate.refused,
               gate.wait_seconds)  # fmt: skip
    namespace = f"{fleet.settings.effective_namespace()}_exporter_fleet"
    const = fleet.settings.const_labels
    families = ceiling_families(namespace, const, ceiling, len(rows))
    families.extend(probe_families(namespace, const, fleet.probes))
    for start in range(0, len(rows), READ_CHUNK):  # same-name families merge when encoded
        families.extend(target_families(namespace, const, rows[start : start + READ_CHUNK]))
        await asyncio.sleep(0)
    families.extend(await server_families(fleet.settings.effective_namespace(), const, fleet))
    body = encode([*families, *runtime_families(const)], Format.TEXT)  # joins rendered text
    return Answer(body, content_type(Format.TEXT))


@dataclass(frozen=True, slots=True)
class _MetricsRow:
    """What /metrics shows of one member, read on the event loop."""

    name: str
    health: str | None  # the probe's status word, None when it is not probed
    up: float
    scrapes: float
    last_duration: float
    rejected: float


def _metrics_row(member: Member) -> _MetricsRow:
    exporter = member.state.exporter
    return _MetricsRow(
        member.name,
        member.probe.current().status.value if member.probing else None,
        float(exporter.main.up),
        float(exporter.stats.scrapes),
        exporter.stats.last_duration,
        float(member.state.admission.rejected),
    )


Ceiling = tuple[int, int, int, int, int, int, float]  # the gate's figures, in this order


def ceiling_families(
    ns: str, const: Sequence[tuple[str, str]], ceiling: Ceiling, targets: int
) -> list[Family]:
    """Self-metrics of the fleet as a whole: its size and the ceiling's use."""
    limit, active, waiting, entered, waited, refused, wait_seconds = ceiling

    def single(suffix: str, kind: str, help_: str, value: float) -> Family:
        return make_family(f"{ns}_{suffix}", kind, help_, [(tuple(const), value)])

    return [
        single("targets", "gauge", "targets the targets file declares", float(targets)),
        single("max_concurrent", "gauge", "most targets collected at once", float(limit)),
        single("collecting", "gauge", "targets being collected right now", float(active)),
        single("waiting", "gauge", "passes waiting for a place under the ceiling",
               float(waiting)),
        single("passes_total", "counter", "passes that took a place under the ceiling",
               float(entered)),
        single("waited_total", "counter", "passes that found every place taken and waited",
               float(waited)),
        single("refused_total", "counter",
               "passes whose request's budget ran out waiting for a place (answered 503)",
               float(refused)),
        single("wait_seconds_total", "counter", "seconds passes spent waiting for a place",
               wait_seconds),
    ]  # fmt: skip


def probe_families(ns: str, const: Sequence[tuple[str, str]], slots: ProbeSlots) -> list[Family]:
    """Self-metrics of the fleet's ceilings on health probes: their use, and the health
    requests they answered "not probed"."""

    def single(suffix: str, kind: str, help_: str, value: float) -> Family:
        return make_family(f"{ns}_probes{suffix}", kind, help_, [(tuple(const), value)])

    connecting = slots.connecting
    return [
        single("", "gauge", "targets whose health is probed now (each holds a place)",
               float(slots.alive)),
        single("_max", "gauge", "most targets probed at once", float(slots.limit)),
        single("_connecting", "gauge", "health probes opening a connection now",
               float(connecting.held)),
        single("_connecting_max", "gauge", "most health probes opening a connection at once",
               float(connecting.limit)),
        single("_refused_total", "counter",
               'health requests answered 503 "not probed": every place was held by a target '
               "asked about recently", float(slots.refused)),
        single("_displaced_total", "counter",
               "health probes stopped to give their place to another target's, nobody having "
               "asked about them for a while", float(slots.displaced)),
    ]  # fmt: skip


async def server_families(ns: str, const: Sequence[tuple[str, str]], fleet: Fleet) -> list[Family]:
    """The per-server bulkheads' self-metrics (issue 29), a chunk of servers at a time."""
    servers = list(fleet.servers)
    families: list[Family] = []
    for start in range(0, len(servers), READ_CHUNK):
        for suffix, kind, help_, samples in server_samples(servers[start : start + READ_CHUNK]):
            labelled = [((*labels, *const), value) for labels, value in samples]
            families.append(make_family(f"{ns}_{suffix}", kind, help_, labelled))
        await asyncio.sleep(0)
    return families


def target_families(
    ns: str, const: Sequence[tuple[str, str]], rows: Sequence[_MetricsRow]
) -> list[Family]:
    """Self-metrics of each target of ``rows``: its state as the fleet sees it."""

    def family(suffix: str, kind: str, help_: str, samples: Samples) -> Family:
        labelled = [((*labels, *const), value) for labels, value in samples]
        return make_family(f"{ns}_{suffix}", kind, help_, labelled)

    def per_target(value: Callable[[_MetricsRow], float]) -> Samples:
        return [((("target", r.name),), value(r)) for r in rows]

    health: Samples = [  # only targets whose health is being asked about are probed
        ((("target", r.name), ("status", r.health)), 1.0) for r in rows if r.health is not None
    ]
    return [
        family("target_up", "gauge", "1 when the target answered its last pass",
               per_target(lambda r: r.up)),
        family("target_health", "gauge",
               "the health probe's status word of each target whose health is asked about",
               health),
        family("target_scrapes_total", "counter", "collection passes run for the target",
               per_target(lambda r: r.scrapes)),
        family("target_last_scrape_duration_seconds", "gauge",
               "seconds the target's last pass took",
               per_target(lambda r: r.last_duration)),
        family("target_rejected_total", "counter",
               "probes of the target refused with 503: two were being served",
               per_target(lambda r: r.rejected)),
    ]  # fmt: skip


async def service_discovery_handler(request: web.Request) -> web.StreamResponse:
    """The declared names in Prometheus's HTTP service discovery format
    (``http_sd_configs``), so the targets are declared once, here: one group per
    target, with ``__meta_pg_exporter_*`` labels for relabelling. Names only: no URL."""
    return await request.app[FLEET_PAGES].sd.serve(request)


async def _sd_answer(fleet: Fleet, _variant: str) -> Answer:
    groups = await read_members(fleet, lambda member: json.dumps(_sd_group(member)))
    return Answer(f"[{', '.join(groups)}]".encode(), "application/json; charset=utf-8")


def _sd_group(member: Member) -> dict[str, object]:
    settings = member.state.settings
    return {
        "targets": [member.name],
        "labels": {
            "__meta_pg_exporter_pgbouncer": str(settings.is_pgbouncer).lower(),
            "__meta_pg_exporter_tags": ",".join(settings.tags),
        },
    }


async def targets_handler(request: web.Request) -> web.StreamResponse:
    """Every declared target: health, pg_up, passes, errors, last pass, breaker, URL."""
    variant = "html" if "text/html" in request.headers.get("Accept", "") else "text"
    return await request.app[FLEET_PAGES].targets.serve(request, variant)


_HEADER = ("target", "health", "up", "passes", "errors", "last", "took", "breaker", "url")


async def _targets_answer(fleet: Fleet, variant: str) -> Answer:
    now = time.time()
    rows = await read_members(fleet, lambda member: _targets_row(member, now))
    gate = fleet.gate
    summary = (
        f"{len(rows)} targets from {fleet.declared.path}; "
        f"{gate.active} of at most {gate.limit} being collected, {gate.waiting} waiting\n"
        f"{servers_summary(list(fleet.servers), fleet)}"
        f"per target: /probe?target=NAME, /stat?target=NAME, /explain?target=NAME, "
        f"/primary?target=NAME (and every health path)\n\n"
    )
    text = summary + await _table(rows)
    if variant == "html":
        return Answer(html_page(FLEET_PAGE.strip("/"), text).encode(), "text/html; charset=utf-8")
    return Answer(text.encode(), "text/plain; charset=utf-8")


SERVERS_SHOWN = 10  # servers the fleet page describes, those holding most first


def servers_summary(servers: list[Bulkhead], fleet: Fleet) -> str:
    """What the per-server bulkheads hold (issue 29): the busiest servers, one a line."""
    limits = fleet.servers
    lines = [
        f"{len(servers)} servers, each at most {limits.max_connections} connections and "
        f"{limits.failed_logins:g} failed logins a minute\n"
    ]
    busiest = sorted(servers, key=lambda b: (-b.held, -b.logins.failed, b.key))
    for bulkhead in busiest[:SERVERS_SHOWN]:
        lines.append(
            f"  server {bulkhead.key}: {bulkhead.held} of {bulkhead.limit} connections held "
            f"({bulkhead.probes} by health probes), {bulkhead.waiting} passes waiting, "
            f"{bulkhead.refused} probes not probed, {bulkhead.evictions} idle closed, "
            f"{bulkhead.logins.failed} failed logins, {bulkhead.logins.held} held back\n"
        )
    if len(servers) > SERVERS_SHOWN:
        lines.append(f"  … and {len(servers) - SERVERS_SHOWN} more (see /metrics)\n")
    return "".join(lines)


def _targets_row(member: Member, now: float) -> tuple[str, ...]:
    exporter = member.state.exporter
    stats = exporter.stats
    last = f"{now - stats.last_scrape_time:.0f}s ago" if stats.last_scrape_time else "never"
    return (
        member.name,
        member.probe.current().status.value if member.probing else "-",
        "1" if exporter.main.up else "0",
        str(stats.scrapes),
        str(stats.errors),
        last,
        f"{stats.last_duration:.3f}s",
        exporter.breaker.state.value,
        member.state.settings.masked_url,
    )


async def _table(rows: Sequence[tuple[str, ...]]) -> str:
    """The header and ``rows`` as aligned columns, a chunk at a time."""
    widths = [len(cell) for cell in _HEADER]
    for start in range(0, len(rows), READ_CHUNK):
        for row in rows[start : start + READ_CHUNK]:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        await asyncio.sleep(0)
    lines = [_line(_HEADER, widths)]
    for start in range(0, len(rows), READ_CHUNK):
        lines.extend(_line(row, widths) for row in rows[start : start + READ_CHUNK])
        await asyncio.sleep(0)
    return "\n".join(lines) + "\n"


def _line(row: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
