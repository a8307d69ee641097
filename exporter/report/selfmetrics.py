"""The exporter's own metrics (compatibility §5), built fresh for every response.

Names are exactly those of the Go exporter under the chosen namespace. The
counters among them keep their names in the text format (no ``_total``).
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence

from exporter import __version__
from exporter.collect.admission import Admission
from exporter.collect.breaker import BreakerState
from exporter.collect.exporter import Exporter
from exporter.collect.runtime import CollectorState
from exporter.collect.server import Server
from exporter.expose.exposition import Family, make_family
from exporter.pg.bulkheads import server_samples
from exporter.report.stat import CollectorRow, collector_rows

Labels = Sequence[tuple[str, str]]
Samples = list[tuple[Labels, float]]

#: Go's names (runtime.GOARCH, runtime.GOOS) for what Python calls otherwise.
_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
            "i386": "386", "i686": "386", "armv6l": "arm", "armv7l": "arm"}  # fmt: skip
_GO_OS = {"win32": "windows", "cygwin": "windows"}


def _go_build_labels() -> tuple[tuple[str, str], ...]:
    """The Go exporter's build labels, true for this process: dashboards group by them."""
    machine = platform.machine()
    goos = _GO_OS.get(sys.platform, sys.platform.rstrip("0123456789"))  # freebsd14 → freebsd
    return (
        ("goversion", f"python{platform.python_version()}"),
        ("goos", goos),
        ("goarch", _GO_ARCH.get(machine.lower(), machine.lower())),
    )


GO_BUILD_LABELS = _go_build_labels()


class SelfMetrics:
    """Renders self-metric families for one namespace and set of const labels."""

    def __init__(self, namespace: str, const_labels: Labels) -> None:
        self.ns = namespace
        self.const = tuple(const_labels)
        # Each family's samples and rendering at the last call: most self-metrics do not
        # change from one cached pass to the next, and comparing samples costs less than
        # rendering them. A family given back again is the same object, bytes included.
        self._last: dict[tuple[str, str, str], tuple[Samples, Family]] = {}

    def _family(self, suffix: str, kind: str, help_: str, samples: Samples) -> Family:
        key = (suffix, kind, help_)
        last = self._last.get(key)
        # Equal samples render alike (a NaN equals only itself: at worst it is rendered
        # again; -0.0 equals 0.0 and may keep its last rendering, the same number).
        if last is not None and last[0] == samples:
            return last[1]
        rows = [((*labels, *self.const), value) for labels, value in samples]
        family = make_family(f"{self.ns}_{suffix}", kind, help_, rows)
        self._last[key] = (samples, family)
        return family

    def _single(self, suffix: str, kind: str, help_: str, value: float) -> Family:
        return self._family(suffix, kind, help_, [((), value)])

    def families(self, exporter: Exporter, admission: Admission) -> list[Family]:
        """Every self-metric family for the exporter's current state."""
        rows = collector_rows(exporter.servers, exporter.clock())
        return [
            *self.target(exporter),
            *self.exporter(exporter),
            *self.per_server(exporter),
            *self.prepared(exporter),
            *self.per_query(rows),
            *self.degradation(exporter),
            *self.server_time(exporter),
            *self.connections(exporter),
            *self.series_cap(exporter),
            *self.requests(admission),
            self.outcomes(rows),
        ]

    def requests(self, admission: Admission) -> list[Family]:
        """Admission and waiting on the telemetry path (ours, beyond the Go exporter's)."""
        interrupted: Samples = [
            ((("reason", reason.value),), float(count))
            for reason, count in admission.interrupted.items()
        ]
        return [
            self._single("exporter_requests_admitted_total", "counter",
                         "telemetry requests admitted", float(admission.admitted)),
            self._single("exporter_requests_rejected_total", "counter",
                         "telemetry requests refused with 503: too many at once",
                         float(admission.rejected)),
            self._family("exporter_requests_interrupted_total", "counter",
                         "admitted requests that ended before their answer, by reason",
                         interrupted),
            self._single("exporter_requests_in_flight", "gauge",
                         "telemetry requests admitted right now", float(admission.active)),
            self._single("exporter_pass_wait_seconds_total", "counter",
                         "seconds admitted requests spent waiting for another's pass",
                         admission.wait_seconds),
            self._single("exporter_last_pass_shared", "gauge",
                         "1 when the last request waited behind another request's pass",
                         _b(admission.last_shared)),
        ]  # fmt: skip

    def outcomes(self, rows: Iterable[CollectorRow]) -> Family:
        """Collector executions by outcome (D10)."""
        samples: Samples = []
        for row in rows:
            for outcome, count in row.outcomes.items():
                labels = (("datname", row.datname), ("query", row.name), ("outcome", outcome.value))
                samples.append((labels, float(count)))
        return self._family(
            "exporter_query_outcome_total",
            "counter",
            "collector executions and cache hits by how they ended",
            samples,
        )

    def target(self, exporter: Exporter) -> list[Family]:
        """``pg_up``, ``pg_version``, ``pg_in_recovery`` of the main database."""
        main = exporter.main
        facts = main.facts
        return [
            self._single("up", "gauge", "1 when the target answered the last pass", _b(main.up)),
            self._single(
                "version",
                "gauge",
                "server version number of the target",
                float(facts.version) if facts else 0.0,
            ),
            self._single(
                "in_recovery",
                "gauge",
                "1 when the target is in recovery (a replica)",
                _b(facts.in_recovery) if facts else 0.0,
            ),
        ]

    def exporter(self, exporter: Exporter) -> list[Family]:
        """Build info, uptime and pass counters."""
        stats = exporter.stats
        build = (
            ("version", __version__),
            ("revision", ""),
            ("branch", ""),
            ("builddate", ""),
            ("pyversion", platform.python_version()),
            ("os", sys.platform),
            ("arch", platform.machine()),
            *GO_BUILD_LABELS,
        )
        return [
            self._family(
                "exporter_build_info", "gauge", "exporter build facts; value 1", [(build, 1.0)]
            ),
            self._single("exporter_up", "gauge", "always 1 while the exporter runs", 1.0),
            self._single(
                "exporter_uptime",
                "gauge",
                "seconds since the exporter started",
                time.time() - stats.started_at,
            ),
            self._single(
                "exporter_last_scrape_time",
                "gauge",
                "Unix time when the last pass ended",
                stats.last_scrape_time,
            ),
            self._single(
                "exporter_scrape_duration",
                "gauge",
                "seconds the last pass took",
                stats.last_duration,
            ),
            self._single(
                "exporter_scrape_total_count",
                "counter",
                "passes run since start",
                float(stats.scrapes),
            ),
            self._single(
                "exporter_scrape_error_count",
                "counter",
                "passes that failed (connection or fatal collector)",
                float(stats.errors),
            ),
        ]

    def per_server(self, exporter: Exporter) -> list[Family]:
        """Per-database statistics."""
        servers = exporter.servers
        per_db: list[tuple[str, str, Callable[[Server], float]]] = [
            (
                "exporter_server_scrape_duration",
                "seconds the last pass of this database took",
                lambda s: s.last_duration,
            ),
            (
                "exporter_server_scrape_total_seconds",
                "seconds spent on this database since start",
                lambda s: s.total_seconds,
            ),
            (
                "exporter_server_scrape_total_count",
                "passes of this database since start",
                lambda s: float(s.scrape_count),
            ),
            (
                "exporter_server_scrape_error_count",
                "failed passes of this database since start",
                lambda s: float(s.error_count),
            ),
        ]
        return [
            self._family(name, "gauge", help_, [((("datname", s.label),), get(s)) for s in servers])
            for name, help_, get in per_db
        ]

    def prepared(self, exporter: Exporter) -> list[Family]:
        """Prepared collector queries per database and the backend memory of their plans,
        where our role may read it (issue 31)."""
        servers = exporter.servers
        read = [s for s in servers if s.session.plan_bytes is not None]
        return [
            self._family("exporter_server_prepared_statements", "gauge",
                         "collector queries prepared on this database's connection",
                         [((("datname", s.label),), float(s.session.prepared_count))
                          for s in servers]),
            self._family("exporter_server_prepared_plan_bytes", "gauge",
                         "backend memory of those prepared plans, read once a minute",
                         [((("datname", s.label),), float(s.session.plan_bytes or 0))
                          for s in read]),
        ]  # fmt: skip

    def per_query(self, rows: Iterable[CollectorRow]) -> list[Family]:
        """``*_exporter_query_*`` families, one sample per collector name and database."""
        ran = [row for row in rows if row.ran]
        labels = [(("datname", row.datname), ("query", row.name)) for row in ran]
        return [
            self._family(
                f"exporter_query_{name}", "gauge", help_,
                list(zip(labels, [float(get(row)) for row in ran], strict=True)),
            )
            for name, help_, get in _PER_QUERY
        ]  # fmt: skip

    def degradation(self, exporter: Exporter) -> list[Family]:
        """The target's breaker: its state, shedding level and trips (D16)."""
        breaker = exporter.breaker
        states: Samples = [
            ((("state", state.value),), _b(breaker.state is state)) for state in BreakerState
        ]
        shed = sum(len(server.shed) for server in exporter.servers)
        return [
            self._family("exporter_breaker_state", "gauge",
                         "1 for the state the target's breaker is in", states),
            self._single("exporter_breaker_level", "gauge",
                         "shedding level: 0 runs every collector, each level sheds a third more",
                         float(breaker.level)),
            self._single("exporter_breaker_trips_total", "counter",
                         "times the breaker left its normal state since start",
                         float(breaker.trips)),
            self._single("exporter_breaker_shed_collectors", "gauge",
                         "collectors, over all databases, the breaker left out of the last pass",
                         float(shed)),
        ]  # fmt: skip

    def server_time(self, exporter: Exporter) -> list[Family]:
        """What the exporter's statements take of the server's time, and its budget (issue
        31); per collector, the ttl it is stretched to is among the ``…_query_*``."""
        budget = exporter.server_time
        return [
            self._single("exporter_server_time_seconds_total", "counter",
                         "seconds the exporter's statements took, as the client waited for them",
                         budget.meter.total),
            self._single("exporter_server_time_budget_ratio", "gauge",
                         "--server.time-budget: seconds of server time a second; 0 for none",
                         budget.budget),
            self._single("exporter_server_time_demand_ratio", "gauge",
                         "seconds a second the collectors would take unstretched, as predicted",
                         budget.demand),
            self._single("exporter_server_time_stretched_collectors", "gauge",
                         "collectors, over all databases, refreshed less often for the budget",
                         float(len(budget.stretched))),
        ]  # fmt: skip

    def connections(self, exporter: Exporter) -> list[Family]:
        """The connection limit and its churn (issue 13); the probe's is not counted."""
        connections = exporter.connections
        limit = float(connections.limit) if connections.limit is not None else 0.0
        return [
            self._single("exporter_connections_max", "gauge",
                         "most connections to the target at once, the health probe's included",
                         limit),
            self._single("exporter_connections_open", "gauge",
                         "connections the scraped databases hold now (the probe's not counted)",
                         float(connections.open)),
            self._single("exporter_connections_opened_total", "counter",
                         "connections opened to scraped databases since start",
                         float(connections.opened)),
            self._single("exporter_connections_evicted_total", "counter",
                         "connections closed to make room for another database's",
                         float(connections.evictions)),
            self._single("exporter_connections_login_wait_seconds", "gauge",
                         "seconds until the next login, after the server refused the last",
                         connections.logins.wait()),
            self._single("exporter_connections_logins_held_total", "counter",
                         "connections not attempted because the server refused the last login",
                         float(connections.logins.held)),
            *self.servers(exporter),
        ]  # fmt: skip

    def servers(self, exporter: Exporter) -> list[Family]:
        """The bulkheads of the servers the target's connections reach (issue 29)."""
        connections = exporter.connections
        known = connections.servers.known(connections.logins.keys)
        return [self._family(*family) for family in server_samples(known)]

    def series_cap(self, exporter: Exporter) -> list[Family]:
        """The exposition-wide series cap and the collectors it left out (issue 13)."""
        cap = exporter.series_cap
        left_out: Samples = [
            ((("query", name),), float(n)) for name, n in sorted(cap.left_out.items())
        ]
        return [
            self._single("exporter_series_limit", "gauge",
                         "--max-total-series: most series one scrape publishes; 0 for no limit",
                         float(cap.limit)),
            self._single("exporter_series_published", "gauge",
                         "series the collectors published at the last pass, over every database",
                         float(cap.series)),
            self._family("exporter_series_left_out", "gauge",
                         "series of each collector the series budget left out of the last pass",
                         left_out),
        ]  # fmt: skip


def _b(flag: bool) -> float:
    return 1.0 if flag else 0.0


#: The ``*_exporter_query_*`` families: name suffix, help, value of a collector's row.
_PER_QUERY: tuple[tuple[str, str, Callable[[CollectorRow], float]], ...] = (
    ("cache_ttl", "seconds until the collector's cached result expires",
     lambda row: row.ttl_left),
    ("scrape_total_count", "executions and cache hits of the collector",
     lambda row: row.total),
    ("scrape_hit_count", "times the collector was served from its cache",
     lambda row: row.hits),
    ("scrape_error_count", "failed executions of the collector",
     lambda row: row.errors),
    ("scrape_predicate_skip_count", "executions skipped by a predicate query",
     lambda row: row.skips),
    ("scrape_duration", "seconds the collector's last execution took",
     lambda row: row.last_duration),
    ("scrape_metric_count", "series the collector's last execution produced",
     lambda row: row.series),
    ("backoff_seconds", "seconds until the collector, failing in a row, may run again",
     lambda row: row.retry_in),
    ("consecutive_failures", "failures in a row of the collector (0 after a success)",
     lambda row: row.failures),
    ("shed", "1 when the breaker left the collector out of the last pass",
     lambda row: _b(row.state is CollectorState.SHED)),
    ("stretched_ttl_seconds", "the ttl the server-time budget stretched the collector to; 0: none",
     lambda row: row.stretched),
)  # fmt: skip
