"""The repository is self-contained: nothing points outside it, every clause id cited is
defined in ``docs/``, and every relative Markdown link leads to a file and heading."""

from __future__ import annotations

import re
import shutil
import subprocess
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
