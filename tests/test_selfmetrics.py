"""The self-metrics read each collector's runtime: per-query figures, back-off and
shedding (D10, D15, D16), without a database."""

from __future__ import annotations

import pytest

from exporter.collect.admission import Admission
from exporter.collect.cache import Entry, Outcome
from exporter.collect.exporter import Exporter
from exporter.collect.planning import make_plan
from exporter.config.definitions import Collector, Definitions
from exporter.config.settings import Settings
from exporter.expose.exposition import Format, encode
from exporter.pg.preflight import ServerFacts
from exporter.report.selfmetrics import SelfMetrics
from tests.fixtures.clock import FakeClock

FACTS = ServerFacts(version=180000, in_recovery=False, datname="db", username="u")
FAILING = Collector(key="failing", name="failing", query="SELECT 1", columns=(), ttl=10.0)
SHED = Collector(key="shed", name="shed", query="SELECT 1", columns=(), priority=200)


def test_per_query_figures_come_from_the_runtimes() -> None:
    """D15, D16: failures in a row, the back-off wait, the shed flag and the outcomes of
    each collector, and the count of shed collectors over every database."""
    clock = FakeClock()
    settings = Settings(url="postgresql://127.0.0.1:1/db", auto_discovery=False)
    definitions = Definitions((FAILING, SHED))
    exporter = Exporter(settings, definitions, clock=clock, random=lambda: 0.999)
    main = exporter.main
    main.plan, main.facts = make_plan(definitions, FACTS, ()), FACTS
    for _ in range(2):
        main.runtime(FAILING).settle(Entry((), Outcome.TIMEOUT, clock.now, 1.0))
        clock.advance(10.0)
    shed = main.runtime(SHED)
    shed.hold(clock.now, shed=True)
    shed.shed = True
    body = encode(SelfMetrics("pg", ()).families(exporter, Admission()), Format.TEXT).decode()
    failing, left_out = '{datname="db",query="failing"}', '{datname="db",query="shed"}'
    assert f"pg_exporter_query_consecutive_failures{failing} 2.0\n" in body
    wait = next(line for line in body.splitlines() if line.startswith(
        f"pg_exporter_query_backoff_seconds{failing} "))  # fmt: skip
    assert float(wait.split()[-1]) == pytest.approx(9.98)  # 19.98 s drawn, 10 s gone
    assert f"pg_exporter_query_scrape_error_count{failing} 2.0\n" in body
    assert f"pg_exporter_query_shed{left_out} 1.0\n" in body
    assert f"pg_exporter_query_shed{failing} 0.0\n" in body
    assert "pg_exporter_breaker_shed_collectors 1.0\n" in body
