"""The repository is self-contained: nothing points outside it, every clause id cited is
defined in ``docs/``, and every relative Markdown link leads to a file and heading."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Places that exist only beside a checkout, never in it.
OUTSIDE = ("../shared", "shared/spec", "shared/compat", "compatibility spec")
CLAUSE = re.compile(r"\b([BD])(\d{1,2})\b")
SECTION = re.compile(r"§(\d+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def repository_texts() -> Iterator[tuple[str, str]]:
    """(path, text) of every text file git tracks or would track (new files included),
    this one excepted: it spells out what it looks for."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    me = Path(__file__).resolve()
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path == me or not path.is_file():
            continue  # deleted in the working tree
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            yield name, data.decode()
        except UnicodeDecodeError:
            continue


def defined_clauses() -> set[str]:
    """Clause ids defined in docs: a bold ``**B7**`` or ``**D7**``, and ``## §3`` headings."""
    ids = set()
    for page in ("bounded-scrapes.md", "database-safety.md"):
        ids |= set(re.findall(r"\*\*([BD]\d{1,2})\*\*", (DOCS / page).read_text()))
    compat = (DOCS / "compatibility.md").read_text()
    ids |= {f"§{n}" for n in re.findall(r"^## §(\d+) ", compat, re.MULTILINE)}
    return ids


def cited_clauses(text: str) -> set[str]:
    return {b + n for b, n in CLAUSE.findall(text)} | {f"§{n}" for n in SECTION.findall(text)}


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation and symbols dropped,
    spaces to hyphens."""
    text = heading.replace("`", "").strip().lower()
    kept = [c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN"]
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(_without_code(path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def _without_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def broken_links(name: str, text: str) -> Iterator[str]:
    """Relative links of one Markdown file that leave the repository or lead nowhere."""
    for target in LINK.findall(_without_code(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (ROOT / name).parent / file_part if file_part else ROOT / name
        linked = linked.resolve()
        if not linked.is_relative_to(ROOT):
            yield f"{name}: {target} points outside the repository"
        elif not linked.exists():
            yield f"{name}: {target} does not exist"
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            yield f"{name}: {target} has no heading #{anchor}"


def test_nothing_points_outside_the_repository() -> None:
    """No file names the shared folder or spec that only exists beside a checkout."""
    hits = [
        f"{name}:{number}: {line.strip()}"
        for name, text in repository_texts()
        for number, line in enumerate(text.split("\n"), 1)
        if any(needle in line.lower() for needle in OUTSIDE)
    ]
    assert hits == []


def test_every_cited_clause_is_defined_in_docs() -> None:
    """B…, D… and § ids cited in code, tests, docs or packaging are defined in docs/."""
    defined = defined_clauses()
    assert {"B1", "B22", "D1", "D14", "§1", "§7"} <= defined
    undefined = {
        f"{name}: {clause}"
        for name, text in repository_texts()
        for clause in cited_clauses(text) - defined
    }
    assert undefined == set()


def test_markdown_links_resolve() -> None:
    """Every relative link in a Markdown file reaches a file, and its heading when it
    names one."""
    broken = [
        problem
        for name, text in repository_texts()
        if name.endswith(".md")
        for problem in broken_links(name, text)
    ]
    assert broken == []


def test_checks_see_what_they_look_for() -> None:
    """The helpers find an outside reference, an undefined clause and a broken link."""
    assert cited_clauses("cites B23, D3 and §9; not AB12 or B123") == {"B23", "D3", "§9"}
    assert slug("§5 Self-metrics") == "5-self-metrics"
    assert slug("Reading `/explain` and `/stat`") == "reading-explain-and-stat"
    links = list(broken_links("docs/README.md", "[a](nowhere.md) [b](../../x) [c](security.md#no)"))
    assert len(links) == 3


# --- docs/switching.md: every name it gives the operator is one the product has ---------

SWITCHING = DOCS / "switching.md"
TICKED = re.compile(r"`([^`\n]+)`")
# Spelt wrong on purpose: the page shows what an unknown flag answers.
MISSPELT_FLAG = "web.listen-adress"
# Directories of the host (systemd's, the distribution's), not of our packages.
HOST_PATHS = ("/home", "/tmp", "/run/postgresql", "/etc/systemd/system/")
# A command line of another program, whose flags are not ours.
OTHER_COMMANDS = re.compile(r"`(?:apt-get|dnf|systemctl|curl) [^`]*`")


def switching_ticked() -> list[str]:
    return TICKED.findall(SWITCHING.read_text())


def test_switching_is_linked_from_both_indexes() -> None:
    """The README's docs list and the docs index both lead to the switching page."""
    assert "](docs/switching.md)" in (ROOT / "README.md").read_text()
    assert "](switching.md)" in (DOCS / "README.md").read_text()


def test_switching_names_only_real_flags_and_variables() -> None:
    """Every flag and PG_EXPORTER_* variable the page names exists, and its example of
    an unknown flag is unknown."""
    from exporter.config.flags import BY_LONG, FLAGS

    text = re.sub(OTHER_COMMANDS, "", SWITCHING.read_text())
    named = set(re.findall(r"--([a-z][a-z0-9.-]*[a-z0-9])", text)) - {MISSPELT_FLAG}
    assert named
    assert named <= set(BY_LONG)
    assert MISSPELT_FLAG not in BY_LONG
    variables = {f.env for f in FLAGS if f.env} | {
        "PG_EXPORTER_URL",
        "PG_EXPORTER_URL_FILE",
        "PG_EXPORTER_OPTS",
    }
    assert set(re.findall(r"PG_EXPORTER_[A-Z_]*[A-Z]", text)) <= variables


def test_switching_lists_exactly_our_own_flags() -> None:
    """The page's list of flags of our own is the README flag table's rows marked ours."""
    ours_in_readme = {
        row.split("`")[1]
        for row in (ROOT / "README.md").read_text().splitlines()
        if row.startswith("| `--") and "ours" in row.rsplit("|", 2)[1]
    }
    paragraph = SWITCHING.read_text().split("Flags of our own")[1].split("- [ ]")[0]
    assert set(re.findall(r"`(--[a-z.-]+)`", paragraph)) == ours_in_readme
    assert len(ours_in_readme) == 11


def test_switching_names_only_real_routes() -> None:
    """Every HTTP path the page names is served, and the health paths are fifteen."""
    from exporter.web.healthpages import HEALTH_PATHS
    from exporter.web.routes import ROUTES

    served = {route.path for route in ROUTES} | {"/", "/metrics"}
    text = SWITCHING.read_text()
    named = {t for t in switching_ticked() if re.fullmatch(r"/[a-z-]*", t)}
    named |= set(re.findall(r"localhost:9630(/[a-z-]*)", text))
    assert named - set(HOST_PATHS) <= served
    assert "/alive" in named
    assert len(HEALTH_PATHS) == 15
    assert "fifteen health" in text


def test_switching_names_only_installed_files() -> None:
    """Every file of the host the page names is one the packages install or the config
    lookup reads; every repository path it names exists."""
    from exporter.config.settings import CONFIG_CANDIDATES

    installed = (ROOT / "packaging" / "nfpm.yaml").read_text() + " ".join(CONFIG_CANDIDATES)
    for token in switching_ticked():
        path = token.split()[0]
        if path.startswith(("/etc/", "/usr/", "/run/")) and path not in HOST_PATHS:
            assert path.rstrip("/") in installed, path
        if path.startswith(("exporter/", "tests/", "monitoring/", "packaging/", "collectors/")):
            assert (ROOT / path).exists(), path


def test_switching_quotes_the_unit_and_env_file_as_shipped() -> None:
    """A ``Key=value`` setting the page quotes is a line of the unit or the env file."""
    shipped = set(
        (ROOT / "packaging" / "pg_exporter.service").read_text().splitlines()
        + (ROOT / "packaging" / "pg_exporter.default").read_text().splitlines()
    )
    quoted = [t for t in switching_ticked() if re.fullmatch(r"[A-Z][A-Za-z_]+=\S.*", t)]
    assert len(quoted) >= 5
    assert [q for q in quoted if q not in shipped] == []


def test_switching_states_the_defaults_in_force() -> None:
    """The limits the page quotes are the defaults the exporter runs with."""
    from exporter.config import settings

    def spaced(n: int) -> str:
        return f"{n:,}".replace(",", " ")

    text = " ".join(SWITCHING.read_text().split())
    assert f"`--max-series` series ({spaced(settings.DEFAULT_MAX_SERIES)})" in text
    assert f"`--max-total-series` ({spaced(settings.DEFAULT_MAX_TOTAL_SERIES)})" in text
    assert f"`--backoff-ceiling` ({settings.DEFAULT_BACKOFF_CEILING:g} s)" in text
    assert f"`--max-connections` ({settings.DEFAULT_MAX_CONNECTIONS} by default)" in text


def test_fleet_page_shows_the_error_the_exporter_gives() -> None:
    """The targets-file problem fleet.md quotes for max_connections is the exporter's."""
    example = next(
        line
        for line in (DOCS / "fleet.md").read_text().splitlines()
        if line.startswith("targets.yml:") and ".max_connections:" in line
    )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "targets.yml").write_text(
            "targets:\n"
            "  - {name: orders-primary, url: 'postgresql://monitor@127.0.0.1:1/postgres'}\n"
            "  - {name: orders-replica, url: 'postgresql://monitor@127.0.0.1:1/postgres',\n"
            "     max_connections: 1}\n"
        )
        run = subprocess.run(
            [sys.executable, "-m", "exporter", "--targets.file", "targets.yml",
             "--config", str(ROOT / "collectors"), "--web.listen-address", "127.0.0.1:0"],
            cwd=tmp, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert run.returncode == 2
    assert example in [line.strip() for line in run.stderr.splitlines()]


def test_the_layout_names_every_layer_in_order() -> None:
    """docs/development.md's ``exporter/`` entry names each layer package of exporter/
    in the order tests/test_layout.py holds, and no package that is gone."""
    from tests.test_layout import LAYERS

    text = (DOCS / "development.md").read_text()
    entry = re.search(r"^- `exporter/`:.*?(?=^- )", text, re.MULTILINE | re.DOTALL)
    assert entry, "docs/development.md has no `exporter/` entry in its layout"
    named = re.findall(r"^  - `(\w+)(?:/|\.py)`", entry.group(0), re.MULTILINE)
    packages = {p.name for p in (ROOT / "exporter").iterdir() if (p / "__init__.py").is_file()}
    assert named[: len(LAYERS)] == list(LAYERS)
    assert packages == set(LAYERS) - {"errors"}


def test_clause_ranges_end_at_the_last_clause() -> None:
    """docs/development.md's "B1…Bn", "D1…Dn" and "§1…§n" end at the last id defined."""
    text = (DOCS / "development.md").read_text()
    defined = defined_clauses()
    for prefix in ("B", "D", "§"):
        last = max(int(c[len(prefix) :]) for c in defined if c.startswith(prefix))
        assert f"{prefix}1…{prefix}{last} " in text, f"{prefix}1…{prefix}{last} is not stated"


# How a collector's limits are put in force, by the names the pages and /explain use:
# session settings on a connection proven direct to PostgreSQL 14+, a transaction of
# the collector's own otherwise (D1, issue 22).
COLLECTOR_MODES = {
    "session settings": re.compile(r"session settings", re.IGNORECASE),
    "own transaction": re.compile(
        r"(read-only )?transaction (of its own|per collector)", re.IGNORECASE
    ),
}
# What the pages said before issue 22 made the transaction the exception.
STALE_CLAIM = re.compile(
    r"every collector runs (in|inside) (a|its own) `?read[ -]only`? transaction", re.IGNORECASE
)


@pytest.mark.parametrize(
    "page", ["README.md", "docs/operations.md", "docs/switching.md", "docs/database-safety.md"]
)
def test_pages_say_how_collectors_run_as_the_code_does(page: str) -> None:
    """Each page that says how collectors run names both modes, as /explain's limits
    line does, and none says every collector has a transaction of its own."""
    from exporter.collect.planning import Plan, explain_text
    from exporter.pg.preflight import ServerFacts

    direct = ServerFacts(version=180000, in_recovery=False, datname="postgres", username="u")
    pooled = ServerFacts(
        version=180000, in_recovery=False, datname="postgres", username="u",
        own_transaction="a pooler is between",
    )  # fmt: skip
    explained = {
        "session settings": explain_text(Plan(direct, (), ())),
        "own transaction": explain_text(Plan(pooled, (), ())),
    }
    text = " ".join((ROOT / page).read_text().split())
    for mode, pattern in COLLECTOR_MODES.items():
        assert pattern.search(explained[mode]), f"/explain no longer names {mode!r}"
        assert pattern.search(text), f"{page} does not name the {mode!r} mode"
    assert not STALE_CLAIM.search(text), f"{page} says every collector has a transaction"


def test_the_guards_table_in_the_docs_is_the_codes() -> None:
    """Issue 36: docs/database-safety.md shows the guards exactly as guards.GUARDS has them."""
    from exporter.pg.guards import markdown_table

    text = (Path(__file__).parent.parent / "docs" / "database-safety.md").read_text()
    assert markdown_table() in text
