"""Command line and environment → Settings: the seam with the app's route table (the
flags themselves: tests/test_cli.py, through exporter.cli.parse_settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.config.commandline import read_settings
from exporter.errors import UsageError


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "c.yml"
    path.write_text("c:\n  query: SELECT 1 AS v\n  metrics:\n    - v: {usage: GAUGE}\n")
    return str(path)


def test_the_telemetry_path_is_checked_by_the_callers_rule(config: str) -> None:
    """The parser knows no route: the caller's check decides, and its words are quoted
    after where the path came from."""
    asked: list[str] = []

    def problems(path: str) -> list[str]:
        asked.append(path)
        return ["taken"] if path == "/taken" else []

    argv = ["-c", config, "--web.telemetry-path", "/free"]
    assert read_settings(argv, {}, [], problems).telemetry_path == "/free"
    with pytest.raises(UsageError, match=r"^\$PG_EXPORTER_TELEMETRY_PATH '/taken': taken$"):
        read_settings(["-c", config], {"PG_EXPORTER_TELEMETRY_PATH": "/taken"}, [], problems)
    assert asked == ["/free", "/taken"]


def test_the_default_path_is_not_asked_about(config: str) -> None:
    """/metrics is the exporter's own choice, served whatever the check would say."""
    settings = read_settings(["-c", config], {}, [], lambda path: ["never"])
    assert settings.telemetry_path == "/metrics"


def test_warnings_go_to_the_callers_list(config: str) -> None:
    """What is skipped is appended to the list the caller logs from."""
    warnings: list[str] = ["earlier"]
    read_settings(["-c", config, "-l", "bad"], {}, warnings, lambda path: [])
    assert warnings[0] == "earlier"
    assert warnings[1].startswith("--label: skipping 'bad'")
