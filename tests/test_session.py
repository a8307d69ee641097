"""A collector's run on one connection: what a timeout tells, the bookkeeping of the
connection's cursor, limits and prepared statements (issue 22), and rows into samples
under the series cap (D9), without a database. The SQL it sends (limits, PREPARE,
EXECUTE, predicates, streaming) is covered against PostgreSQL in tests/integration."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import cast

import psycopg
import pytest
from psycopg import errors as pgerrors
from psycopg.adapt import AdaptersMap

from exporter.collect.budget import Budget
from exporter.collect.cache import Outcome
from exporter.collect.runtime import CollectorRuntime, Rules
from exporter.collect.session import Conn, Place, Session, timeout_message
from exporter.config.definitions import Collector, Column, Usage
from exporter.errors import TooManySeriesError
from exporter.pg.limits import Guards, Limits
from exporter.pg.postgres import Batch
from exporter.pg.prepared import Prepared
from tests.fixtures.clock import FakeClock


def _collector(*, timeout: float | None = 2.5, max_series: int | None = None) -> Collector:
    columns = (Column("l", Usage.LABEL), Column("v", Usage.GAUGE))
    return Collector(key="pg_c", name="pg_c", query="SELECT 1", columns=columns,
                     timeout=timeout, max_series=max_series)  # fmt: skip


def _session(clock: FakeClock | None = None, max_series: int = 100) -> Session:
    return Session(pgbouncer=False, const_labels=(("job", "pg"),), max_series=max_series,
                   clock=clock or FakeClock())  # fmt: skip


class _Cursor:
    """Only what a new cursor is given: loaders of its own (issue 30)."""

    def __init__(self) -> None:
        self.adapters = AdaptersMap(psycopg.adapters)


class _Conn:
    """Only what the cursor bookkeeping touches of a connection: ``cursor()``."""

    def __init__(self) -> None:
        self.made: list[object] = []

    def cursor(self) -> object:
        self.made.append(_Cursor())
        return self.made[-1]


def _conn(fake: _Conn) -> Conn:
    return cast(Conn, fake)


# --- what a timeout tells -----------------------------------------------------------


def test_a_client_deadline_names_the_timeout_and_the_deadline() -> None:
    """TimeoutError: the collector's timeout in seconds, the deadline, and what to do."""
    text = timeout_message(_collector(), TimeoutError())
    assert text == (
        "collector pg_c exceeded its timeout of 2.5s (deadline); "
        "raise its timeout or make the query cheaper"
    )


def test_a_server_cancel_names_the_server_side_limit() -> None:
    """QueryCanceled (statement_timeout): the server-side limit; an unbounded collector
    says its server limit instead of seconds."""
    assert "timeout of 2.5s (server-side limit)" in timeout_message(
        _collector(), pgerrors.QueryCanceled()
    )
    assert "timeout of its server limit (server-side limit)" in timeout_message(
        _collector(timeout=None), pgerrors.QueryCanceled()
    )


def test_a_lock_timeout_says_it_waited_for_a_lock_not_that_it_was_slow() -> None:
    """LockNotAvailable (lock_timeout): another session's lock, no 'timeout of' wording."""
    text = timeout_message(_collector(), pgerrors.LockNotAvailable())
    assert "waited too long for a lock held by another session (lock_timeout)" in text
    assert "exceeded" not in text


# --- the connection's cursor, limits and prepared statements ------------------------


def test_one_cursor_per_connection_and_a_new_one_for_a_new_connection() -> None:
    """Every collector on one connection gets the same cursor; a replaced connection
    (after a loss) gets one of its own, never the old connection's."""
    session, first, second = _session(), _Conn(), _Conn()
    cursor = session._cursor(_conn(first))
    assert session._cursor(_conn(first)) is cursor
    assert len(first.made) == 1
    other = session._cursor(_conn(second))
    assert other is not cursor
    assert len(second.made) == 1
    assert session._cursor(_conn(first)) is not cursor  # back on the first: made again
    assert len(first.made) == 2


def test_forget_limits_makes_every_limit_go_again() -> None:
    """After a collector that may change a limit, nothing is taken as already set."""
    session = _session()
    session.limits = (_conn(_Conn()), Limits.of(2.5, Guards(180000)))
    session.forget_limits()
    assert session.limits is None


def test_a_reload_marks_what_was_prepared_obsolete() -> None:
    """reloaded(): the statements prepared stay until their next use drops them all;
    with nothing prepared it is a no-op."""
    session = _session()
    session.reloaded()
    assert session.prepared is None
    session.prepared = Prepared(_Conn(), names={"pgx_a"})
    session.reloaded()
    assert session.prepared.obsolete
    assert session.prepared.names == {"pgx_a"}


def test_a_statement_gone_from_the_session_starts_over() -> None:
    """26000 (a collector's own DEALLOCATE): everything prepared is forgotten, since more
    than that one statement may be gone."""
    session = _session()
    session.prepared = Prepared(_Conn(), names={"pgx_a", "pgx_b"})
    assert session._forget_statement("EXECUTE pgx_a", pgerrors.InvalidSqlStatementName())
    assert session.prepared is None


def test_a_statement_whose_plan_no_longer_fits_runs_as_text_from_then_on() -> None:
    """0A000 (a view changed under it): that name is refused on this connection, the
    others stay prepared."""
    session = _session()
    held = session.prepared = Prepared(_Conn(), names={"pgx_a", "pgx_b"})
    assert session._forget_statement("EXECUTE pgx_a", pgerrors.FeatureNotSupported())
    assert session.prepared is held
    assert (held.names, held.refused) == ({"pgx_b"}, {"pgx_a"})
    assert not held.due("pgx_a")


def test_nothing_prepared_means_the_error_is_the_collectors() -> None:
    """Without prepared statements there is nothing to forget: the error stands."""
    assert not _session()._forget_statement("EXECUTE x", pgerrors.FeatureNotSupported())


# --- rows into samples, and a run without a connection ------------------------------


async def _batches(*batches: Sequence[tuple[object, ...]]) -> AsyncGenerator[Batch, None]:
    for rows in batches:
        yield ("l", "v"), (25, 23), list(rows)  # text, int4


async def test_an_empty_result_builds_nothing() -> None:
    """No batch at all: None, so the run publishes nothing and succeeds."""
    assert await _session()._build(_collector(), _batches()) is None


async def test_batches_build_one_set_of_families_with_the_constant_labels() -> None:
    """Rows of every batch become series of one builder, with the session's labels."""
    builder = await _session()._build(_collector(), _batches([("a", 1)], [("b", 2)]))
    assert builder is not None
    assert builder.series == 2
    (family,) = builder.finish()
    assert b'job="pg"' in family.text_samples


async def test_the_series_cap_is_the_collectors_own_else_the_sessions() -> None:
    """A collector's max_series wins over the exporter's; over the cap is an error."""
    rows = [(f"r{i}", i) for i in range(3)]
    with pytest.raises(TooManySeriesError, match="more than 2 series"):
        await _session(max_series=2)._build(_collector(), _batches(rows))
    builder = await _session(max_series=2)._build(_collector(max_series=5), _batches(rows))
    assert builder is not None
    assert builder.series == 3
    with pytest.raises(TooManySeriesError, match="more than 1 series"):
        await _session(max_series=100)._build(_collector(max_series=1), _batches(rows))


async def test_a_run_without_a_connection_is_an_error_entry_not_an_exception() -> None:
    """No connection: an ERROR entry naming the database, finished on the session's
    clock, with nothing published."""
    clock = FakeClock()
    runtime = CollectorRuntime(_collector(), Rules(False, 300.0, lambda: 0.5))

    async def disconnect() -> None:
        raise AssertionError("nothing to disconnect")

    place = Place(None, None, "db", fenced=False, disconnect=disconnect)
    entry = await _session(clock).run(place, runtime, Budget.starting_now(5.0, clock=clock))
    assert (entry.outcome, entry.families, entry.series) == (Outcome.ERROR, (), 0)
    assert entry.error == "collector pg_c on db: no connection to db"
    assert entry.finished_at == clock.now


def test_the_client_deadline_is_the_collectors_timeout() -> None:
    """D1: the client-side deadline is the collector's timeout (None: unbounded)."""
    assert _session().client_deadline(_collector(timeout=4.0)) == 4.0
    assert _session().client_deadline(_collector(timeout=None)) is None


async def test_a_fault_of_ours_in_a_collectors_rows_fails_that_run_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception that is no database or collector error (a bug in ranking or
    rendering) is an ERROR entry naming the collector, logged with its traceback,
    never an exception that would fail the whole scrape."""
    clock = FakeClock()
    runtime = CollectorRuntime(_collector(), Rules(False, 300.0, lambda: 0.5))
    session = _session(clock)

    async def broken(*_: object, **__: object) -> None:
        raise KeyError("a key")

    monkeypatch.setattr(session, "_execute", broken)

    async def disconnect() -> None:
        raise AssertionError("nothing to disconnect")

    place = Place(_conn(_Conn()), None, "db", fenced=False, disconnect=disconnect)
    entry = await session.run(place, runtime, Budget.starting_now(5.0, clock=clock))
    assert (entry.outcome, entry.families) == (Outcome.ERROR, ())
    assert entry.error.startswith("collector pg_c on db: internal error KeyError")
    assert any(record.exc_info for record in caplog.records)
