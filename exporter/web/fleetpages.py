"""The fleet's pages: ``/probe?target=NAME``, the exporter's own ``/metrics`` and the
``/targets`` page listing every declared target with its status."""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from exporter.exposition import Family, Format, content_type, encode, make_family, runtime_families
from exporter.logs import TARGET
from exporter.web.fleet import FLEET, FLEET_PAGE, Fleet, Member, member_for
from exporter.web.metrics import MIN_WRITE_SECONDS, expose, write
from exporter.web.pages import text_or_html

Samples = list[tuple[tuple[tuple[str, str], ...], float]]


async def probe_handler(request: web.Request) -> web.StreamResponse:
    """One declared target's exposition, under that target's own admission, pass lock,
    caches and budget, and the fleet's ceiling (B1–B22 per target)."""
    member = member_for(request)  # 400 or 404 before anything runs
    token = TARGET.set(member.name)  # log lines of this request and its pass name it
    try:
        return await expose(request, member.state, runtime=False)
    finally:
        TARGET.reset(token)


async def fleet_metrics_handler(request: web.Request) -> web.StreamResponse:
    """The exporter's own metrics in fleet mode: the process, the ceiling and each
    target's status. No database is asked: targets are scraped at /probe."""
    fleet = request.app[FLEET]
    families = [*fleet_families(fleet), *runtime_families(fleet.settings.const_labels)]
    body = encode(families, Format.TEXT)
    return await write(request, None, body, content_type(Format.TEXT), MIN_WRITE_SECONDS)


def fleet_families(fleet: Fleet) -> list[Family]:
    """Self-metrics of the fleet: the ceiling's use, and per target its state."""
    ns = f"{fleet.settings.effective_namespace()}_exporter_fleet"
    const = fleet.settings.const_labels
    gate = fleet.gate

    def family(suffix: str, kind: str, help_: str, samples: Samples) -> Family:
        rows = [((*labels, *const), value) for labels, value in samples]
        return make_family(f"{ns}_{suffix}", kind, help_, rows)

    def single(suffix: str, kind: str, help_: str, value: float) -> Family:
        return family(suffix, kind, help_, [((), value)])

    members = sorted(fleet.members.values(), key=lambda m: m.name)

    def per_target(value: Callable[[Member], float]) -> Samples:
        return [((("target", m.name),), value(m)) for m in members]

    health: Samples = [  # only targets whose health is being asked about are probed
        ((("target", m.name), ("status", m.probe.current().status.value)), 1.0)
        for m in members
        if m.probing
    ]
    return [
        single("targets", "gauge", "targets the targets file declares", float(len(members))),
        single("max_concurrent", "gauge", "most targets collected at once", float(gate.limit)),
        single("collecting", "gauge", "targets being collected right now", float(gate.active)),
        single("waiting", "gauge", "passes waiting for a place under the ceiling",
               float(gate.waiting)),
        single("passes_total", "counter", "passes that took a place under the ceiling",
               float(gate.entered)),
        single("waited_total", "counter", "passes that found every place taken and waited",
               float(gate.waited)),
        single("refused_total", "counter",
               "passes whose request's budget ran out waiting for a place (answered 503)",
               float(gate.refused)),
        single("wait_seconds_total", "counter", "seconds passes spent waiting for a place",
               gate.wait_seconds),
        family("target_up", "gauge", "1 when the target answered its last pass",
               per_target(lambda m: float(m.state.exporter.main.up))),
        family("target_health", "gauge",
               "the health probe's status word of each target whose health is asked about",
               health),
        family("target_scrapes_total", "counter", "collection passes run for the target",
               per_target(lambda m: float(m.state.exporter.stats.scrapes))),
        family("target_last_scrape_duration_seconds", "gauge",
               "seconds the target's last pass took",
               per_target(lambda m: m.state.exporter.stats.last_duration)),
        family("target_rejected_total", "counter",
               "probes of the target refused with 503: two were being served",
               per_target(lambda m: float(m.state.admission.rejected))),
    ]  # fmt: skip


async def service_discovery_handler(request: web.Request) -> web.Response:
    """The declared names in Prometheus's HTTP service discovery format
    (``http_sd_configs``), so the targets are declared once, here: one group per
    target, with ``__meta_pg_exporter_*`` labels for relabelling. Names only: no URL."""
    groups = [
        {
            "targets": [member.name],
            "labels": {
                "__meta_pg_exporter_pgbouncer": str(member.state.settings.is_pgbouncer).lower(),
                "__meta_pg_exporter_tags": ",".join(member.state.settings.tags),
            },
        }
        for member in sorted(request.app[FLEET].members.values(), key=lambda m: m.name)
    ]
    return web.json_response(groups)


async def targets_handler(request: web.Request) -> web.Response:
    """Every declared target: health, pg_up, passes, errors, last pass, breaker, URL."""
    fleet = request.app[FLEET]
    now = time.time()
    header = ("target", "health", "up", "passes", "errors", "last", "took", "breaker", "url")
    rows = [header]
    for member in sorted(fleet.members.values(), key=lambda m: m.name):
        exporter = member.state.exporter
        stats = exporter.stats
        last = f"{now - stats.last_scrape_time:.0f}s ago" if stats.last_scrape_time else "never"
        rows.append(
            (
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
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]  # fmt: skip
    gate = fleet.gate
    summary = (
        f"{len(fleet.members)} targets from {fleet.declared.path}; "
        f"{gate.active} of at most {gate.limit} being collected, {gate.waiting} waiting\n"
        f"per target: /probe?target=NAME, /stat?target=NAME, /explain?target=NAME, "
        f"/primary?target=NAME (and every health path)\n\n"
    )
    return text_or_html(request, FLEET_PAGE.strip("/"), summary + "\n".join(lines) + "\n")
