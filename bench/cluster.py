"""A throw-away PostgreSQL 18 for one benchmark run, with the workload table in it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rigs.localpg import LocalCluster, pg18_bindir

REPO = Path(__file__).resolve().parents[1]
DATABASE = "bench"
#: Big enough for the largest workload (25 000 rows).
TABLE_ROWS = 25_000
#: localpg preloads pg_stat_statements for the tests; the bench wants the plain server,
#: so every exporter's SQL costs the same and nothing else runs per statement.
SERVER_SETTINGS = {
    "shared_preload_libraries": "",
    "synchronous_commit": "off",
    "max_connections": "50",
}


@dataclass(frozen=True, slots=True)
class Server:
    """A running PostgreSQL that the exporters under test reach over TCP."""

    url: str  # libpq URL of the bench database; trust auth, no password
    data_dir: Path

    def postmaster_pid(self) -> int:
        """Pid of the postmaster, read from its pid file (first line)."""
        return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[Server]:
    """Start a PostgreSQL 18 in a temporary directory, with the workload table loaded."""
    with LocalCluster(pg18_bindir(), settings=SERVER_SETTINGS) as cluster:
        cluster.psql(f"CREATE DATABASE {DATABASE}")
        cluster.psql(_workload_sql(), dbname=DATABASE)
        yield Server(cluster.dsn(DATABASE), cluster.data_dir)


def _workload_sql() -> str:
    """The table every workload query reads: labels and eight numeric columns per row."""
    return f"""
        CREATE TABLE bench_items (
            id integer PRIMARY KEY, grp text NOT NULL, key text NOT NULL,
            c1 float8, c2 float8, c3 float8, c4 float8,
            c5 float8, c6 float8, c7 float8, c8 float8);
        INSERT INTO bench_items
        SELECT i, 'g' || (i % 50), 'k' || i,
               i * 1.0, i * 2.5, i % 97, random() * 1000, i / 7.0, -i, i * 0.001, 42
          FROM generate_series(1, {TABLE_ROWS}) AS i;
        VACUUM ANALYZE bench_items;
    """
