"""Collector files accepted and served as the Go pg_exporter 1.4.1 does (issue 30).

``tests/data/gocompat/configs/`` holds collector files, valid and broken, and
directories of them; ``go-facts.json`` beside them records, for each, what the Go
binary did (``record.py`` there says how it was produced, and with which binary and
server): the exit code of ``--dry-run``, the branches it printed, and the ``t_*``
samples a start served against PostgreSQL 18. Ours must accept or refuse each as
Go does, plan the same branches with the same metric names and version range, and
serve the same series; the cases in :data:`KEPT` differ on purpose, each a row of
"Differences kept on purpose" in docs/compatibility.md, and there ours must give the
error that table quotes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.definitions import Collector, Definitions
from exporter.config.loading import load_for_settings
from exporter.config.settings import Settings
from exporter.errors import ConfigError
from exporter.web.app import create_app
from rigs.localpg import LocalCluster
from tests.data.gocompat.configs.record import GOOD, SPECIALS
from tests.fixtures.helpers import samples, settings_for

Client = TestClient[web.Request, web.Application]
CONFIGS = Path(__file__).parents[1] / "data" / "gocompat" / "configs"
FACTS: dict[str, Any] = json.loads((CONFIGS / "go-facts.json").read_text())
COMPATIBILITY = CONFIGS.parents[3] / "docs" / "compatibility.md"


@dataclass(frozen=True)
class Kept:
    """A case ours treats otherwise than Go on purpose: whether ours accepts it, and the
    error (or, accepted, the warning) it gives, as docs/compatibility.md quotes it."""

    accepts: bool
    message: str


_SEVERAL = Kept(False, "several statements, where a collector runs one")
_FIFO = "it is a FIFO, not a regular file"
_DEVICE = "it is a symbolic link to a character device, not a regular file"
#: The differences kept on purpose (docs/compatibility.md), by case: Go serves the first
#: statement's rows, runs a command as if it were a query, blocks on a FIFO for ever and
#: reads /dev/zero until it runs out of memory.
KEPT: dict[str, Kept] = {
    "two-statements.yml": _SEVERAL,
    "set-then-select.yml": _SEVERAL,
    "predicate-two-statements.yml": _SEVERAL,
    "begin-command.yml": Kept(False, "it controls the transaction, and could end the read-only"),
    "set-command.yml": Kept(False, "it changes the session for the collectors that follow"),
    "do-block.yml": Kept(False, "a procedure or DO block may commit, and write in the transac"),
    "special/in-dir/fifo": Kept(True, f"{_FIFO}; skipped"),
    "special/in-dir/dev-zero-link": Kept(True, f"{_DEVICE}; skipped"),
    "special/single/fifo": Kept(False, f"cannot read the file: {_FIFO}"),
    "special/single/dev-zero-link": Kept(
        False, "cannot read the file: it is a character device, not a regular file"
    ),
}


def case_path(name: str, scratch: Path) -> Path:
    """Where a case lives: committed, or a special entry made now under ``scratch``."""
    if not name.startswith("special/"):
        return CONFIGS / name
    _, where, kind = name.split("/")
    make = SPECIALS[kind]
    if where == "single":
        path = scratch / "config.yml"
        make(path)
        return path
    (scratch / "good.yml").write_text(GOOD)
    make(scratch / "entry.yml")
    return scratch


def load(path: Path, cluster: LocalCluster | None = None) -> tuple[Settings, Definitions | str]:
    """Our settings for a case and what loading it gave: definitions, or the error text."""
    base = settings_for(cluster) if cluster is not None else Settings()
    settings = replace(base, config=str(path), auto_discovery=False, disable_cache=True)
    try:
        return settings, load_for_settings(settings)
    except ConfigError as exc:
        return settings, "\n".join([str(exc), *map(str, exc.problems)])


def go_accepts(name: str) -> bool:
    return bool(FACTS["cases"][name]["dry_run"]["exit"] == 0)


def families(collector: Collector) -> list[str]:
    """The metric names of a branch's value columns, as Go's dry-run shows them."""
    return [collector.metric_name(c) for c in collector.columns if c.usage.is_value]


def planned(definitions: Definitions) -> dict[str, dict[str, Any]]:
    """Our branches in the shape of the facts' ``branches``."""
    return {
        c.key: {
            "name": c.name,
            "min_version": c.min_version,
            "max_version": c.max_version,
            "skip": c.skip,
            "fatal": c.fatal,
            "priority": c.priority,
            "metrics": sorted(families(c)),
        }
        for c in definitions.collectors
    }


def go_planned(name: str) -> dict[str, dict[str, Any]]:
    return dict(FACTS["cases"][name]["dry_run"]["branches"])


def all_cases() -> Iterator[str]:
    yield from sorted(FACTS["cases"])


def disagreements(scratch: Path) -> list[str]:
    """Cases that one accepts and the other refuses (or hangs on), KEPT ones included."""
    found = []
    for index, name in enumerate(all_cases()):
        (scratch / str(index)).mkdir()
        _, loaded = load(case_path(name, scratch / str(index)))
        if go_accepts(name) != isinstance(loaded, Definitions):
            found.append(name)
    return found


def test_the_corpus_is_what_the_facts_describe() -> None:
    """Every committed case has its facts, recorded by the Go binary, and no fact is stale."""
    committed = {p.name for p in CONFIGS.glob("*.yml")}
    committed |= {f"dirs/{p.name}" for p in (CONFIGS / "dirs").iterdir()}
    recorded = {name for name in FACTS["cases"] if not name.startswith("special/")}
    assert committed == recorded
    assert len(FACTS["cases"]) > 100  # docs/compatibility.md: "more than 100"
    assert FACTS["produced_by"]["binary"].startswith("pg_exporter v1.4.1")


def test_ours_accepts_and_refuses_what_go_does(tmp_path: Path) -> None:
    """Accepted by one and refused by the other: only the differences kept on purpose."""
    differ = disagreements(tmp_path)
    total = len(FACTS["cases"])
    print(f"\n{len(differ)} of {total} cases accepted by one and refused by the other: {differ}")
    assert sorted(differ) == sorted(n for n, k in KEPT.items() if k.accepts != go_accepts(n))


@pytest.mark.parametrize("name", sorted(KEPT))
def test_each_kept_difference_gives_its_documented_message(name: str, tmp_path: Path) -> None:
    """Where we differ on purpose, the user reads what the compatibility table quotes."""
    kept = KEPT[name]
    _, loaded = load(case_path(name, tmp_path))
    if kept.accepts:
        assert isinstance(loaded, Definitions), loaded
        assert any(kept.message in warning for warning in loaded.warnings), loaded.warnings
    else:
        assert isinstance(loaded, str)
        assert kept.message in loaded
    assert kept.message in COMPATIBILITY.read_text()


@pytest.mark.parametrize("name", [n for n in all_cases() if go_accepts(n) and n not in KEPT])
def test_accepted_cases_plan_the_branches_go_prints(name: str, tmp_path: Path) -> None:
    """The same branch keys, prefixes, version range, flags and metric names."""
    _, loaded = load(case_path(name, tmp_path))
    assert isinstance(loaded, Definitions), loaded
    assert planned(loaded) == go_planned(name)


def go_series(name: str) -> list[str]:
    return sorted(FACTS["cases"][name]["start"].get("samples", []))


_SERIES = re.compile(r"^([^{]+)(?:\{(.*)\})?$")


def series(body: str) -> list[str]:
    """The ``t_*`` samples of an exposition, written as Go's are (labels in name order)."""
    found = []
    for sample_name, labels in samples(body):
        if sample_name.startswith("t_"):
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels))
            found.append(f"{sample_name}{{{text}}}" if labels else sample_name)
    return sorted(found)


@pytest.mark.parametrize(
    "name", [n for n in all_cases() if FACTS["cases"][n]["start"]["serves"] and n not in KEPT]
)
async def test_served_cases_serve_the_series_go_serves(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, name: str, tmp_path: Path
) -> None:
    """A start on PostgreSQL 18 serves the very series the Go binary served there."""
    settings, loaded = load(case_path(name, tmp_path), pg18)
    assert isinstance(loaded, Definitions), loaded
    client: Client = await aiohttp_client(create_app(settings, loaded))
    for _ in range(2):  # as the facts: the second scrape
        response = await client.get("/metrics")
        assert response.status == 200
    assert series(await response.text()) == go_series(name)
