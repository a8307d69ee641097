"""``/stat`` and the per-query self-metrics read each collector's runtime: figures by
collector name, back-off and shedding folded in (D10, D15, D16), without a database."""

from __future__ import annotations

from exporter.collect.cache import Entry, Outcome
from exporter.collect.planning import make_plan
from exporter.collect.runtime import CollectorState
from exporter.collect.server import Server, ServerOptions
from exporter.config.definitions import Collector, Definitions
from exporter.pg.preflight import ServerFacts
from exporter.report.stat import collector_rows
from tests.fixtures.clock import FakeClock

FACTS = ServerFacts(version=180000, in_recovery=False, datname="db", username="u")
OPTIONS = ServerOptions(url="postgresql:///db", connect_timeout=1.0, const_labels=(), tags=(),
                        disable_cache=False, max_series=100)  # fmt: skip


def _branch(key: str, name: str, priority: int) -> Collector:
    return Collector(key=key, name=name, query="SELECT 1", columns=(), ttl=10.0,
                     priority=priority)  # fmt: skip


def _server(*collectors: Collector, clock: FakeClock) -> Server:
    definitions = Definitions(collectors)
    server = Server(None, OPTIONS, definitions, is_main=True, clock=clock, random=lambda: 0.999)
    server.plan = make_plan(definitions, FACTS, ())
    server.facts = FACTS
    return server


def test_a_planned_collector_that_never_ran_has_a_row_without_figures() -> None:
    """A planned name is listed from the start, not yet ran, in its normal state."""
    clock = FakeClock()
    server = _server(_branch("a", "a", 1), clock=clock)
    (row,) = collector_rows([server], clock.now)
    assert (row.datname, row.name, row.branches, row.ran) == ("db", "a", ["a"], False)
    assert (row.total, row.state, row.ttl, row.ttl_left) == (0, CollectorState.NORMAL, 10.0, 0.0)


def test_branches_of_one_name_add_up_and_the_worst_state_shows() -> None:
    """Two branches of one name: counts add up under the name, the cache's time left is
    the longest, and one branch backing off puts the row in back-off with its count."""
    clock = FakeClock()
    ok, failing = _branch("n_a", "n", 1), _branch("n_b", "n", 2)
    server = _server(ok, failing, clock=clock)
    server.runtime(failing).settle(Entry((), Outcome.TIMEOUT, clock.now, 1.0))
    clock.advance(10.0)
    server.runtime(failing).settle(Entry((), Outcome.TIMEOUT, clock.now, 1.0))
    clock.advance(2.0)
    server.runtime(ok).settle(Entry((), Outcome.OK, clock.now, 0.5, series=3))
    clock.advance(5.0)
    (row,) = collector_rows([server], clock.now)
    assert (row.ran, row.total, row.errors, row.series) == (True, 3, 2, 3)
    assert row.outcomes == {Outcome.OK: 1, Outcome.TIMEOUT: 2}
    assert row.ttl_left == 5.0  # the first branch, run 5 s ago
    assert (row.state, row.failures) == (CollectorState.BACKOFF, 2)
    assert row.retry_in > 0


def test_a_shed_branch_marks_its_row_shed() -> None:
    """D16: a branch the breaker left out of the last pass makes its row ``shed``."""
    clock = FakeClock()
    collector = _branch("s", "s", 1)
    server = _server(collector, clock=clock)
    server.runtime(collector).shed = True
    (row,) = collector_rows([server], clock.now)
    assert row.state is CollectorState.SHED
    assert server.shed == ("s",)
