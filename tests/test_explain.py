"""``/explain`` reads the last pass's plans and each collector's runtime, with no lock and
no SQL (D15, D16), tested without a database."""

from __future__ import annotations

from exporter.collect.cache import Entry, Outcome
from exporter.collect.exporter import Exporter
from exporter.collect.planning import make_plan
from exporter.config.definitions import Collector, Definitions
from exporter.config.settings import Settings
from exporter.pg.preflight import ServerFacts
from exporter.report.explain import degradation_text, last_plans
from tests.fixtures.clock import FakeClock

FACTS = ServerFacts(version=180000, in_recovery=False, datname="db", username="u")
FAILING = Collector(key="failing", name="failing", query="SELECT 1", columns=(), ttl=10.0)
SHED = Collector(key="shed", name="shed", query="SELECT 1", columns=(), priority=200)


def _exporter(clock: FakeClock) -> Exporter:
    settings = Settings(url="postgresql://127.0.0.1:1/db", auto_discovery=False)
    return Exporter(settings, Definitions((FAILING, SHED)), clock=clock, random=lambda: 0.999)


def test_nothing_is_planned_before_the_first_pass_reaches_the_target() -> None:
    """Before any pass the page says so instead of showing an empty plan."""
    assert last_plans(_exporter(FakeClock())).startswith("nothing planned yet")


def test_the_page_names_what_is_shed_and_what_backs_off_with_its_next_try() -> None:
    """D15, D16: the shed branches and those backing off, with their failures in a row and
    seconds until the next try, read from the runtimes; a collector that failed once is
    not listed (it only waits its TTL)."""
    clock = FakeClock()
    exporter = _exporter(clock)
    main = exporter.main
    main.plan, main.facts = make_plan(exporter.definitions, FACTS, ()), FACTS
    failing = main.runtime(FAILING)
    failing.settle(Entry((), Outcome.TIMEOUT, clock.now, 1.0))
    assert "backing off" not in degradation_text(exporter)
    clock.advance(10.0)
    failing.settle(Entry((), Outcome.TIMEOUT, clock.now, 1.0))  # waits 19.98 s
    main.runtime(SHED).shed = True
    clock.advance(5.0)
    lines = degradation_text(exporter).splitlines()
    assert lines == [
        "breaker: normal: every planned collector runs",
        "server-time budget: 200 ms/s, not measured yet: it acts after 30s of passes",
        "  shed on db: shed",
        "  backing off on db: failing (2 failures in a row, next try in 15s)",
    ]
    assert "planned (2, in run order)" in last_plans(exporter)
