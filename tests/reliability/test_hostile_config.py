"""Careless or hostile collector files: bounded time, memory and messages on every path.

Start-up, ``--dry-run`` and every reload read collector files through one function,
``loading.load_for_settings``. A 412-byte file of nested YAML aliases (a "billion
laughs" file) once built a 72 MB error message, or died of MemoryError, because
messages quoted whole values. Here such files go through the real CLI (a process
under an address-space limit) and, as properties, through the loader with its
memory traced; tests/integration/test_config_bounds.py sends one to /reload.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exporter.config.definitions import Definitions
from exporter.config.loading import load_definitions
from exporter.errors import ConfigError
from tests.fixtures.helpers import REPO

MESSAGE_CHARS = 600  # the longest line a problem or warning may take, with its location
MEMORY = 64 * 1024 * 1024  # bytes a load may allocate at its peak
SECONDS = 20.0  # wide: a loaded CI machine; each load here takes well under a second
ADDRESS_SPACE = 512 * 1024 * 1024  # the CLI process's limit; the stock library needs ~200 MiB
VALID = "pg_ok:\n  query: SELECT 1 AS v\n  metrics:\n    - v: {usage: GAUGE, description: d}\n"


def alias_bomb(levels: int, fanout: int = 9, leaf: str = '"lol"') -> str:
    """Anchors ``l0``…: each level repeats the level before ``fanout`` times."""
    lines = [f"l0: &l0 [{','.join([leaf] * fanout)}]"]
    lines += [f"l{n}: &l{n} [{','.join([f'*l{n - 1}'] * fanout)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


# The file, near enough: 9**9 "lol"s quoted by a bucket error and a name error.
BOMB = alias_bomb(9) + (
    "pg_bomb:\n  name: *l8\n  query: SELECT 1\n"
    "  metrics:\n    - x: {usage: HISTOGRAM, bucket: *l8}\n"
)


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The exporter's CLI in a process whose address space is capped; and its duration."""
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))\n"
        "from exporter.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize(
    ("mode", "code"), [(("--dry-run",), 1), (("--url", "postgresql://u@127.0.0.1:1/db"), 2)]
)
def test_cli_refuses_an_alias_bomb_quickly_in_little_memory(
    tmp_path: Path, mode: tuple[str, ...], code: int
) -> None:
    """``--dry-run`` and start-up refuse the bomb with a short message naming file and line."""
    path = tmp_path / "bomb.yml"
    path.write_text(BOMB)
    done, seconds = run_cli("--config", str(path), *mode)
    assert done.returncode == code, done.stderr[-2000:]
    assert seconds < SECONDS
    assert f"{path}:line 6: aliases expand the document by more than" in done.stderr
    assert len(done.stderr) < 2000, done.stderr[:2000]


def test_cli_refuses_a_multi_gigabyte_file_without_reading_it(tmp_path: Path) -> None:
    """A 16 GiB file (sparse) is refused at start-up: only its first 4 MiB are read."""
    path = tmp_path / "huge.yml"
    with path.open("wb") as file:
        file.truncate(16 * 1024**3)
    done, seconds = run_cli("--config", str(path), "--dry-run")
    assert done.returncode == 1, done.stderr[-2000:]
    assert seconds < SECONDS
    assert f"{path}: more than 4 MiB of text" in done.stderr


def test_a_bomb_in_a_directory_is_skipped_in_a_short_warning(tmp_path: Path) -> None:
    """Directory mode: the bomb file is skipped with short lines, the others load."""
    (tmp_path / "0100-good.yml").write_text(VALID)
    (tmp_path / "0200-bomb.yml").write_text(BOMB)
    definitions = bounded_load(tmp_path / "0200-bomb.yml", None, directory=tmp_path)
    assert isinstance(definitions, Definitions)
    assert [c.key for c in definitions.collectors] == ["pg_ok"]
    assert definitions.skipped_files == (str(tmp_path / "0200-bomb.yml"),)


def bounded_load(path: Path, text: str | None, directory: Path | None = None) -> object:
    """Load ``text`` from ``path`` (or the directory) under the bounds; the result or error."""
    if text is not None:
        path.write_text(text, encoding="utf-8")
    tracemalloc.start()
    started = time.monotonic()
    try:
        result: object = load_definitions(str(directory or path))
    except ConfigError as exc:
        result = exc
    finally:
        seconds = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert seconds < SECONDS
    assert peak < MEMORY, f"{peak} bytes at the peak"
    lines = [str(p) for p in result.problems] if isinstance(result, ConfigError) else []
    lines += result.warnings if isinstance(result, Definitions) else []
    assert all(len(line) < MESSAGE_CHARS for line in lines), max(lines, key=len)[:2000]
    assert all(line.lstrip().startswith(str(directory or path)) for line in lines)
    return result


def anchored_collector(levels: int, fanout: int, leaf: str) -> str:
    """A valid branch whose unknown field holds anchors ``l0``… and ``top``, as alias_bomb."""
    bomb = alias_bomb(levels, fanout, leaf).splitlines()
    anchors = [f"    - {line.split(': ', 1)[1]}" for line in bomb]
    anchors.append(f"    - &top [*l{levels - 1}]")
    return VALID + "  x_anchors:\n" + "\n".join(anchors) + "\n"


# How a collector file may use the last anchor: every field, a column, a whole branch.
USES = [
    "pg_b:\n  name: *top\n  query: SELECT 1\n  metrics: [{v: {usage: GAUGE}}]\n",
    "pg_b:\n  desc: *top\n  query: SELECT 1 AS v\n  metrics: [{v: {usage: GAUGE}}]\n",
    "pg_b:\n  query: *top\n  metrics: [{v: {usage: GAUGE}}]\n",
    "pg_b:\n  ttl: *top\n  query: SELECT 1\n  metrics: [{v: {usage: GAUGE}}]\n",
    "pg_b:\n  tags: *top\n  query: SELECT 1\n  metrics: [{v: {usage: GAUGE}}]\n",
    "pg_b:\n  query: SELECT 1\n  metrics: *top\n",
    "pg_b:\n  query: SELECT 1\n  metrics: [{v: *top}]\n",
    "pg_b:\n  query: SELECT 1\n  metrics: [{v: {usage: HISTOGRAM, bucket: *top}}]\n",
    "pg_b:\n  query: SELECT 1\n  metrics: [{v: {usage: GAUGE, description: *top}}]\n",
    "pg_b:\n  query: SELECT 1\n  unknown: *top\n  metrics: [{v: {usage: GAUGE}}]\n",
    "pg_b: *top\n",
    "pg_b: [*top, *top, *top]\n",
]
LEAVES = st.sampled_from(['"lol"', "1", "x" * 300, "{usage: GAUGE}", "[]", "null"])


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@example(levels=5, fanout=9, leaf='"lol"', use=USES[1])  # desc: 0.66 M characters, accepted
@example(levels=5, fanout=9, leaf='"lol"', use=USES[8])  # description, the same
@example(levels=9, fanout=9, leaf='"lol"', use=USES[7])  # the bucket, refused
@given(
    levels=st.integers(1, 14),
    fanout=st.integers(1, 12),
    leaf=LEAVES,
    use=st.sampled_from(USES),
)
def test_any_alias_tree_in_any_field_is_bounded(
    tmp_path: Path, levels: int, fanout: int, leaf: str, use: str
) -> None:
    """Anchors of any depth and fan-out, used anywhere: loaded or refused, within bounds."""
    bounded_load(tmp_path / "tree.yml", anchored_collector(levels, fanout, leaf) + use)
