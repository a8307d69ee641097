"""The monitoring mixin as data: its rules, alerts and the PromQL of its dashboards."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).resolve().parent.parent / "monitoring"
RULE_FILES = sorted((MONITORING / "rules").glob("*.yml"))
DASHBOARDS = sorted((MONITORING / "dashboards").glob("*.json"))
ALERT_TESTS = MONITORING / "tests" / "alerts.test.yml"

# Grafana's variables, as a dashboard with every job and instance selected sends them.
# The rate window is short because the tests' Prometheus scrapes every second.
GRAFANA_VARIABLES = {"$__rate_interval": "10s", "$job": ".+", "$instance": ".+"}


@dataclass(frozen=True)
class Expression:
    """One PromQL expression of the mixin and where it comes from."""

    where: str
    promql: str


def _rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(group["rules"])
    return rules


def alert_names() -> list[str]:
    """Every alert the mixin defines, in file order."""
    return [rule["alert"] for rule in _rules() if "alert" in rule]


def recording_rules() -> list[Expression]:
    """Each recording rule's expression, named by the series it records."""
    return [Expression(rule["record"], rule["expr"]) for rule in _rules() if "record" in rule]


def dashboard_expressions() -> list[Expression]:
    """Each dashboard target's expression with Grafana's variables filled in."""
    found = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                promql = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    promql = promql.replace(variable, value)
                where = f"{path.name}: {panel['title']} [{target['refId']}]"
                found.append(Expression(where, promql))
    return found


def alerts_expected_to_fire() -> set[str]:
    """Alerts that some case of the promtool tests expects to fire."""
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    return {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
