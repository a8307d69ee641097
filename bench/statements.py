"""Database time per collector branch (issue 22): ``pg_stat_statements`` of the monitor
role, each statement named by the branch whose SQL it is.

pg_stat_statements keeps a statement's text with its constants replaced by ``$n`` (and takes
more for constants than we can tell: ``epoch`` in ``extract(epoch FROM x)``, ``true``), so a
statement belongs to the branch whose SQL shares the most words with it (Jaccard index of
the sets of words outside string literals, at least ``MIN_SIMILARITY``); branches for other
versions of a family differ in their column names. Utility statements (``BEGIN``, ``SET``,
``COMMIT``) are named by their first word.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from exporter.config.loading import load_definitions
from rigs.localpg import LocalCluster

UTILITY = re.compile(r"\s*(BEGIN|SET|RESET|COMMIT|ROLLBACK|DISCARD)\b", re.IGNORECASE)
STRING = re.compile(r"'(?:[^']|'')*'")
WORD = re.compile(r"[a-z_][a-z0-9_]*")
MIN_SIMILARITY = 0.6  # below, two texts share SQL words, not a branch


@dataclass(frozen=True, slots=True)
class Cost:
    """One branch (or utility command) over one trial."""

    name: str
    ms_per_call: float
    calls_per_pass: float

    @property
    def ms_per_pass(self) -> float:
        """Database time this branch adds to one pass."""
        return self.ms_per_call * self.calls_per_pass


def branch_queries(config: Path) -> dict[str, frozenset[str]]:
    """Branch key → the words of its SQL, for every branch of a collector config."""
    return {c.key: _words(c.query) for c in load_definitions(str(config)).collectors}


def name_of(text: str, queries: Mapping[str, frozenset[str]]) -> str:
    """The branch a statement belongs to, its first word for a utility, or ``other``."""
    utility = UTILITY.match(text)
    if utility:
        return utility.group(1).upper()
    words = _words(text)
    best, most = "other", MIN_SIMILARITY
    for key, theirs in queries.items():
        similarity = len(words & theirs) / len(words | theirs) if words or theirs else 0.0
        if similarity > most:
            best, most = key, similarity
    return best


def measure(
    cluster: LocalCluster, role: str, queries: Mapping[str, frozenset[str]], passes: int
) -> list[Cost]:
    """Per-branch figures of the role since its last pg_stat_statements reset."""
    rows = cluster.psql(
        "SELECT calls, total_exec_time, replace(regexp_replace(query, '\\s+', ' ', 'g'), '|', '/')"
        f" FROM pg_stat_statements WHERE userid = '{role}'::regrole"
    )
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for line in filter(None, rows.splitlines()):
        calls, ms, text = line.split("|", 2)
        total = totals[name_of(text, queries)]
        total[0] += float(calls)
        total[1] += float(ms)
    return [Cost(name, ms / calls if calls else 0.0, calls / passes)
            for name, (calls, ms) in totals.items()]  # fmt: skip


def render(trials: Iterable[list[Cost]], top: int) -> str:
    """Markdown: the ``top`` branches by median database time per pass over the trials."""
    by_name: dict[str, list[Cost]] = defaultdict(list)
    for costs in trials:
        for cost in costs:
            by_name[cost.name].append(cost)
    medians = sorted(
        ((name, statistics.median(c.ms_per_call for c in cs),
          statistics.median(c.calls_per_pass for c in cs),
          statistics.median(c.ms_per_pass for c in cs)) for name, cs in by_name.items()),
        key=lambda row: -row[3],
    )  # fmt: skip
    out = ["| branch | ms per call | calls per pass | ms per pass |", "|---|---|---|---|"]
    out += [
        f"| {n} | {call:.2f} | {calls:.2f} | {per:.2f} |" for n, call, calls, per in medians[:top]
    ]
    return "\n".join(out)


def _words(sql: str) -> frozenset[str]:
    return frozenset(WORD.findall(STRING.sub(" ", sql.lower())))
