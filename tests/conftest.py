"""Shared pytest options (long variants run only with ``--run-slow``) and fixtures."""

from __future__ import annotations

import pytest

from tests.fixtures.promtool import find_promtool


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow", action="store_true", default=False, help="also run tests marked slow"
    )
    parser.addoption(
        "--repeat", default="1", help="run tests marked concurrency this many times each"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    opt_in = pytest.mark.skip(reason="slow variant: opt in with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(opt_in)


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool (Debian's prometheus package; the test fails when it is missing)."""
    return find_promtool()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``--repeat N`` runs each concurrency test N times, to show it is not flaky."""
    repeat = int(metafunc.config.getoption("--repeat"))
    if repeat > 1 and metafunc.definition.get_closest_marker("concurrency"):
        metafunc.fixturenames.append("repetition")
        metafunc.parametrize("repetition", range(1, repeat + 1), ids=lambda r: f"rep{r}")
