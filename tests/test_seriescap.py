"""The exposition-wide series cap: whole collectors out, least important first (issue 13)."""

from __future__ import annotations

import logging

import pytest

from exporter.collect.seriescap import Part, SeriesCap, fit
from exporter.config.definitions import Collector
from exporter.expose.exposition import Family, make_family


def _collector(key: str, priority: int) -> Collector:
    return Collector(key=key, name=key, query="SELECT 1", columns=(), priority=priority)


def _family(name: str, series: int) -> Family:
    return make_family(name, "gauge", "h", [((("n", str(i)),), 1.0) for i in range(series)])


CORE, ACTIVITY, TABLES = _collector("core", 100), _collector("activity", 110), _collector("t", 190)


def _parts() -> list[Part]:
    """Two databases: core 1 + activity 5 + tables 40 series on each."""
    return [
        Part(c, (_family(f"{c.key}_{db}", n),))
        for db in ("a", "b")
        for c, n in ((CORE, 1), (ACTIVITY, 5), (TABLES, 40))
    ]


def test_under_the_limit_everything_is_published() -> None:
    """92 series fit a cap of 92: nothing is left out."""
    fitted = fit(_parts(), 92)
    assert (fitted.series, fitted.left_out, len(fitted.families)) == (92, {}, 6)


def test_the_least_important_collector_goes_first_on_every_database() -> None:
    """Over the limit, the highest priority number goes whole, on both databases."""
    fitted = fit(_parts(), 91)
    assert fitted.left_out == {"t": 80}
    assert fitted.series == 12
    assert {f.name for f in fitted.families} == {"core_a", "activity_a", "core_b", "activity_b"}


def test_as_many_collectors_as_needed_are_left_out() -> None:
    """A cap of 5 leaves only the most important collector."""
    assert fit(_parts(), 5).left_out == {"t": 80, "activity": 10}
    assert fit(_parts(), 5).series == 2


def test_zero_means_no_limit() -> None:
    """--max-total-series 0 turns the cap off."""
    assert fit(_parts(), 0).left_out == {}


def test_a_change_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """WARNING when collectors are first left out, nothing while it stays so, INFO after."""
    cap = SeriesCap(50)
    with caplog.at_level(logging.INFO, logger="exporter.collect.seriescap"):
        cap.apply(_parts())
        cap.apply(_parts())
        cap.limit = 0
        cap.apply(_parts())
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(messages) == 2
    assert messages[0][0] == logging.WARNING
    assert "leaving out collectors t (80 series)" in messages[0][1]
    assert messages[1] == (logging.INFO, "series budget: every collector is published again")
