"""The monitoring mixin (issue 15): its rules are valid for promtool, every alert fires
in a promtool unit test, every alert is documented, the statement rules add the named
query IDs and the remainder into the whole (issue 38), and every dashboard expression
is PromQL that promtool parses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fixtures.monitoring import (
    ALERT_TESTS,
    DASHBOARDS,
    MONITORING,
    RULE_FILES,
    RULE_TESTS,
    alert_names,
    alerts_expected_to_fire,
    dashboard_expressions,
    panels,
)
from tests.fixtures.promtool import find_promtool

DOCS_PAGE = MONITORING.parent / "docs" / "monitoring.md"


def _promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_promtool(), *args], capture_output=True, text=True, check=False, cwd=cwd
    )


def test_rules_pass_promtool_check() -> None:
    """``promtool check rules`` accepts every rule file."""
    result = _promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("tests", RULE_TESTS, ids=lambda path: path.name)
def test_rule_unit_tests_pass(tests: Path) -> None:
    """``promtool test rules`` passes on every file of monitoring/tests: each alert fires
    on the series meant to raise it, with its labels and rendered annotations, and stays
    quiet where tested to; the statement rules record the whole of named and other."""
    assert ALERT_TESTS in RULE_TESTS
    result = _promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr


# The statement totals as a wrong rule would write them: only the named query IDs.
_NAMED_ONLY = {
    "pg:query_exec_time:rate5m": (
        "pg_query_exec_time[5m]",
        'pg_query_exec_time{query!="other"}[5m]',
    ),
    "pg:query_calls:rate5m": ("pg_query_calls[5m]", 'pg_query_calls{query!="other"}[5m]'),
}


def test_statement_tests_fail_a_total_without_the_remainder(tmp_path: Path) -> None:
    """statements.test.yml can fail: against a copy of the rules whose totals sum only
    the named query IDs (leaving out query="other"), promtool reports those totals and
    the shares computed from them."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    for path in RULE_FILES:
        document = yaml.safe_load(path.read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                if rule.get("record") in _NAMED_ONLY:
                    whole, named = _NAMED_ONLY[rule["record"]]
                    assert whole in rule["expr"], rule
                    rule["expr"] = rule["expr"].replace(whole, named)
        (tmp_path / "rules" / path.name).write_text(yaml.safe_dump(document, sort_keys=False))
    shutil.copy(MONITORING / "tests" / "statements.test.yml", tmp_path / "tests")
    result = _promtool("test", "rules", "tests/statements.test.yml", cwd=tmp_path)
    report = result.stdout + result.stderr
    assert result.returncode != 0, report
    for name in [*_NAMED_ONLY, "pg:query_exec_time_named:ratio_rate5m"]:
        assert f'expr: "{name}' in report or f'expr: "round(1e6 * {name}' in report, name


def test_every_alert_has_a_firing_test() -> None:
    """No alert goes without a promtool case that expects it to fire."""
    assert alert_names(), "no alerts found"
    assert set(alert_names()) - alerts_expected_to_fire() == set()
    assert len(alert_names()) == len(set(alert_names())), "an alert name is defined twice"


def test_every_alert_is_documented() -> None:
    """docs/monitoring.md has a row for every alert, and none for an alert that is gone."""
    section = DOCS_PAGE.read_text().split("## Alerts")[1].split("\n## ")[0]
    rows = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
    assert rows == set(alert_names())


def test_dashboards_are_grafana_json() -> None:
    """Each dashboard parses, has a unique uid, and every panel but a row has a PromQL
    target."""
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        uids.add(board["uid"])
        for panel in panels(board):
            assert panel.get("targets"), f"{path.name}: {panel['title']} has no query"
            assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    assert len(uids) == len(DASHBOARDS) == 2


def test_dashboard_expressions_parse(tmp_path: Path) -> None:
    """Every dashboard expression, Grafana's variables filled in, is PromQL: promtool
    parses each as the expression of a recording rule (it has no offline query), and
    none is left with a variable the tests do not fill in."""
    expressions = dashboard_expressions()
    assert expressions, "no dashboard expressions found"
    unfilled = [e.where for e in expressions if re.search(r"\$(\w|\{)", e.promql)]
    assert unfilled == [], "variables left in these expressions"
    rules = [
        {"record": f"dashboard:expr_{n}:check", "expr": e.promql} for n, e in enumerate(expressions)
    ]
    check = tmp_path / "dashboards.yml"
    check.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = _promtool("check", "rules", str(check))
    report = result.stdout + result.stderr
    for n, expression in enumerate(expressions):  # promtool names the rule; we the panel
        report = report.replace(f"dashboard:expr_{n}:check", expression.where)
    assert result.returncode == 0, report
