"""promtool as a real linter of our output, and the naming advice compatibility forces."""

from __future__ import annotations

import subprocess

from tests.programs import required

# promtool's naming advice that our compatible names break on purpose: counters keep their
# names, histogram parts are separate gauge families, and the Go exporter's names carry
# abbreviated units. Anything else promtool says is a real problem.
ACCEPTED_LINT = (
    'counter metrics should have "_total" suffix',
    "non-histogram and non-summary metrics should not have",
    'non-histogram metrics should not have "_bucket" suffix',
    'non-histogram metrics should not have "le" label',
    "metric names should not contain abbreviated units",
)


def find_promtool() -> str:
    """Path of promtool, from Debian's prometheus package (``scripts/setup`` installs it)."""
    return required("promtool", package="prometheus")


def unexpected_problems(promtool: str, exposition: bytes) -> list[str]:
    """What ``promtool check metrics`` reports beyond the accepted naming advice."""
    result = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, check=False
    )
    report = (result.stdout + result.stderr).decode()
    if result.returncode not in (0, 3):  # 3: lint advice only; anything else: unparseable
        return [f"promtool exit {result.returncode}: {report}"]
    return [
        line
        for line in filter(None, report.splitlines())
        if not any(advice in line for advice in ACCEPTED_LINT)
    ]
