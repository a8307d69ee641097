"""The big database of issue 31 for ``bench.bigdb``: built once, kept between runs.

One extra database ``bigdb`` holds ``tables`` tables of ``rows`` rows, each with a
primary key and a second index (two indexes a table, no TOAST); an application role
runs ``statements`` distinct statements ``calls`` times each over them, and
``giants`` statements whose normalized text is ``giant_kb`` KB (a VALUES list of as
many constants: what an ORM's bulk statement leaves in ``pg_stat_statements``). The
monitor role every exporter logs in as is in ``pg_monitor``.

Building 20 000 tables takes minutes, so the data directory is kept under a cache
directory (``bench/results/bigdb`` unless told otherwise), one per major version and
size, and reused when its ``built.json`` names the same sizes. The server is started
afresh for each settings variant on that directory; ``pg_stat_statements`` and the
statistics survive a clean stop, and a run after a crash replays the statements.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

from bench import library
from bench.cluster import REPO
from rigs.localpg import LocalCluster, bindir_for

DATABASE = "bigdb"
APP = "bench_app"  # runs the workload's statements (not the bootstrap superuser: Go skips it)
CANARY = "bench_canary"  # runs one statement that must get JIT and workers, to prove we see them
MONITOR = library.ROLE  # in pg_monitor; every exporter logs in as it
CACHE = REPO / "bench/results/bigdb"
MARKER = "built.json"
BATCH = 100  # tables per transaction: 300 locks, well within the lock table
#: What every variant runs with: the bench's own server settings, every backend's login in
#: the log (to tell the monitor role's pids) and the postmaster's DEBUG1 lines, which name
#: each parallel worker's leader ("parallel worker for PID n") on every version.
BASE_SETTINGS: Mapping[str, str] = {
    **library.SERVER_SETTINGS,
    "log_connections": "on",
    "log_min_messages": "debug1",
}
#: A server tuned against us (issue 31: "whatever the server's defaults say"): JIT for any
#: statement, parallel workers for any scan, a gigabyte of work_mem for every sort.
HOSTILE: Mapping[str, str] = {
    "jit_above_cost": "10",
    "max_parallel_workers_per_gather": "8",
    "parallel_setup_cost": "0",
    "parallel_tuple_cost": "0",
    "min_parallel_table_scan_size": "0",
    "min_parallel_index_scan_size": "0",
    "work_mem": "1GB",
}
VARIANTS: Mapping[str, Mapping[str, str]] = {"default": {}, "hostile": HOSTILE}


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big the workload is; the cache directory's name says it."""

    tables: int = 20_000
    rows: int = 10
    statements: int = 5_000
    calls: int = 5
    giants: int = 20
    giant_kb: int = 600

    @property
    def tag(self) -> str:
        """A directory name that changes whenever a size does."""
        return (f"{self.tables}t-{self.rows}r-{self.statements}s-{self.calls}c"
                f"-{self.giants}g-{self.giant_kb}k")  # fmt: skip


def table_sql(n: int, rows: int) -> str:
    """Table ``t<n>``: a primary key, a second index, ``rows`` rows; no TOAST table."""
    return (f"CREATE TABLE t{n} (id int PRIMARY KEY, w int); CREATE INDEX t{n}_w ON t{n} (w);"
            f" INSERT INTO t{n} SELECT g, g % 7 FROM generate_series(1, {rows}) AS g;")  # fmt: skip


def statement_sql(k: int, tables: int) -> str:
    """The k-th distinct statement: a table per statement, one more predicate per lap."""
    extra = " AND id <> %s" * (k // tables)
    return f"SELECT count(*) FROM t{k % tables} WHERE w = %s{extra}"


def giant_sql(g: int, kb: int) -> str:
    """The g-th giant: a VALUES list whose normalized text (each constant a ``$n``) is at
    least ``kb`` KB; one row more per giant, so that each is its own entry."""
    rows = giant_rows(kb) + g
    values = ", ".join(f"({i})" for i in range(1, rows + 1))
    return f"SELECT count(*) FROM (VALUES {values}) AS v(x)"


def giant_rows(kb: int) -> int:
    """Rows of ``($n), `` pieces that make ``kb`` KB of normalized text."""
    size, rows = 0, 0
    while size < kb * 1024:
        rows += 1
        size += len(f"(${rows}), ")
    return rows


@contextlib.contextmanager
def server(
    version: int,
    sizes: Sizes,
    variant: str,
    cache: Path | None,
    progress: Callable[[str], None],
    *,
    rebuild: bool = False,
) -> Iterator[LocalCluster]:
    """A started server on the big database (built first when it is not cached, or when
    ``rebuild``), with ``variant``'s settings; stopped on exit, its directory kept when
    ``cache`` is set."""
    base = _base(version, sizes, cache, rebuild)
    try:
        (base / "postgres.log").unlink(missing_ok=True)  # one log per variant
        settings = {**BASE_SETTINGS, **VARIANTS[variant]}
        cluster = LocalCluster(bindir_for(version), base_dir=base, settings=settings)
        try:
            cluster.start()
        except Exception as exc:
            hint = f"(a server left running there? pg_ctl -D {base / 'data'} stop)"
            raise SystemExit(f"PostgreSQL {version} on {base}: {exc}\n{hint}") from None
        with contextlib.closing(cluster):
            _ensure_built(cluster, sizes, base, progress)
            yield cluster
    finally:
        if cache is None:
            shutil.rmtree(base, ignore_errors=True)


def _base(version: int, sizes: Sizes, cache: Path | None, rebuild: bool) -> Path:
    """The cluster's directory: cached by version and sizes, else a fresh temporary one."""
    if cache is None:
        return Path(tempfile.mkdtemp(prefix="pgx-bench-bigdb-"))
    base = cache / f"pg{version}-{sizes.tag}"
    if rebuild or _marker(base) != asdict(sizes):
        shutil.rmtree(base, ignore_errors=True)  # half-built, or other sizes: start over
    base.parent.mkdir(parents=True, exist_ok=True)
    return base


def _marker(base: Path) -> dict[str, int] | None:
    try:
        found: dict[str, int] = json.loads((base / MARKER).read_text())["sizes"]
    except (OSError, ValueError, KeyError):
        return None
    return found


def _ensure_built(
    cluster: LocalCluster, sizes: Sizes, base: Path, progress: Callable[[str], None]
) -> None:
    """Build on a new directory; on a cached one, replay the statements if a crash lost
    pg_stat_statements (it is saved only at a clean stop)."""
    if _marker(base) is None:
        started = time.monotonic()
        build(cluster, sizes, progress)
        seconds = round(time.monotonic() - started, 1)
        (base / MARKER).write_text(json.dumps({"sizes": asdict(sizes), "seconds": seconds}))
        progress(f"built PostgreSQL {cluster.version // 10000} workload in {seconds:.0f} s: {base}")
        return
    if app_entries(cluster) < sizes.statements + sizes.giants:
        progress("pg_stat_statements lost the workload's statements: running them again")
        run_statements(cluster, sizes)


def build(cluster: LocalCluster, sizes: Sizes, progress: Callable[[str], None]) -> None:
    """Roles, the database, its tables and statistics, then the statements."""
    cluster.psql(
        f"CREATE ROLE {MONITOR} LOGIN IN ROLE pg_monitor; CREATE ROLE {APP} LOGIN;"
        f" CREATE ROLE {CANARY} LOGIN; CREATE EXTENSION IF NOT EXISTS pg_stat_statements;"
        f" CREATE DATABASE {DATABASE} OWNER {APP}"
    )
    cluster.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", dbname=DATABASE)
    with psycopg.connect(cluster.dsn(DATABASE, user=APP), autocommit=True) as conn:
        for start in range(0, sizes.tables, BATCH):
            stop = min(start + BATCH, sizes.tables)
            conn.execute("".join(table_sql(n, sizes.rows) for n in range(start, stop)).encode())
            if stop % 2000 == 0:
                progress(f"  {stop} of {sizes.tables} tables")
        conn.execute("ANALYZE")
    cluster.psql("SELECT pg_stat_statements_reset()")  # the DDL's entries are not the workload
    run_statements(cluster, sizes)


def run_statements(cluster: LocalCluster, sizes: Sizes) -> None:
    """Every statement and giant ``calls`` times, as the application role, pipelined."""
    with (psycopg.connect(cluster.dsn(DATABASE, user=APP), autocommit=True) as conn,
          conn.pipeline() as pipeline):  # fmt: skip
        for k in range(sizes.statements):
            sql = statement_sql(k, sizes.tables)
            for call in range(sizes.calls):
                conn.execute(sql.encode(), [call] * sql.count("%s"))
            if k % BATCH == 0:
                pipeline.sync()  # ends the implicit transaction, and its locks, of a pipeline
        for g in range(sizes.giants):
            giant = giant_sql(g, sizes.giant_kb).encode()
            for _ in range(sizes.calls):
                conn.execute(giant)


def app_entries(cluster: LocalCluster) -> int:
    """The application role's entries in pg_stat_statements."""
    return int(cluster.psql(
        f"SELECT count(*) FROM pg_stat_statements(false) WHERE userid = '{APP}'::regrole"
    ))  # fmt: skip
