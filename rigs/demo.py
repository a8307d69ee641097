"""A local demo: a throw-away PostgreSQL 18 with a little steady activity, watched by the exporter.

Run ``scripts/demo`` (or ``python -m rigs.demo``) and open
http://localhost:9630/metrics. Ctrl-C stops the exporter and the cluster.
Arguments other than ``--port`` are passed on to the exporter.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import psycopg

from rigs.localpg import LocalCluster, pg18_bindir

DEFAULT_PORT = 9630
ACTIVITY_INTERVAL = 3.0  # seconds between rounds of demo queries
# Function and I/O statistics are off by default; the demo wants metrics for them.
DEMO_SETTINGS = {"track_functions": "all", "track_io_timing": "on"}

SCHEMA_SQL = """
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
CREATE TABLE customers (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE orders (
    id bigserial PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers (id),
    amount numeric(10, 2) NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orders_customer_idx ON orders (customer_id);
CREATE INDEX orders_placed_idx ON orders (placed_at);
CREATE SEQUENCE invoice_numbers;
-- plpgsql rather than sql: SQL functions get inlined and never show up in pg_stat_user_functions.
CREATE FUNCTION order_total(customer bigint) RETURNS numeric LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(sum(amount), 0) FROM orders WHERE customer_id = customer);
END
$$;
INSERT INTO customers (name) SELECT 'customer ' || g FROM generate_series(1, 200) AS g;
INSERT INTO orders (customer_id, amount)
    SELECT 1 + g % 200, (g % 97) + 0.5 FROM generate_series(1, 5000) AS g;
ANALYZE;
"""

ACTIVITY_SQL = (
    "INSERT INTO orders (customer_id, amount)"
    " SELECT 1 + floor(random() * 200)::int, round((random() * 100)::numeric, 2)"
    " FROM generate_series(1, 20)",
    "UPDATE customers SET name = name WHERE id = 1 + floor(random() * 200)::int",
    "DELETE FROM orders WHERE id IN (SELECT id FROM orders ORDER BY random() LIMIT 5)",
    "SELECT name, order_total(id) FROM customers ORDER BY random() LIMIT 10",
    "SELECT nextval('invoice_numbers')",
    "SELECT count(*) FROM orders WHERE placed_at > now() - interval '1 minute'",
)


def seed(cluster: LocalCluster) -> None:
    """Create the ``demo`` database with tables, indexes, a function, a sequence and rows."""
    cluster.psql("CREATE DATABASE demo")
    cluster.psql(SCHEMA_SQL, dbname="demo")


class Activity:
    """Light, steady work on the demo database from a background thread."""

    def __init__(self, dsn: str, interval: float = ACTIVITY_INTERVAL) -> None:
        self.dsn = dsn
        self.interval = interval
        self.rounds = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-activity", daemon=True)

    def start(self) -> None:
        """Begin a round of queries every ``interval`` seconds."""
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to finish and wait for it (briefly)."""
        self._stopping.set()
        self._thread.join(timeout=10)

    def run_round(self) -> None:
        """One round of demo statements on a fresh connection."""
        with psycopg.connect(self.dsn, autocommit=True, application_name="demo-activity") as conn:
            for statement in ACTIVITY_SQL:
                conn.execute(statement)
        self.rounds += 1

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.run_round()
            except psycopg.Error as error:  # keep going: the demo may be shutting down
                print(f"demo activity: {error}", file=sys.stderr)


def collectors_dir() -> Path:
    """The repository's collectors/ directory: next to the package, else in the cwd."""
    candidates = (Path(__file__).resolve().parent.parent / "collectors", Path.cwd() / "collectors")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise SystemExit("demo: no collectors/ directory found; run it from the repository")


def main(argv: Sequence[str] | None = None) -> int:
    """Start PostgreSQL 18 with activity, run the exporter against it until interrupted."""
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="exporter HTTP port")
    args, extra = parser.parse_known_args(argv)
    config = collectors_dir()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # so the cluster is stopped on TERM
    try:
        return _run(config, args.port, extra)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(config: Path, port: int, extra: Sequence[str]) -> int:
    with LocalCluster(pg18_bindir(), settings=DEMO_SETTINGS) as cluster:
        seed(cluster)
        activity = Activity(cluster.dsn("demo"))
        activity.start()
        try:
            _banner(cluster, port)
            return _serve(cluster.dsn(), config, port, extra)
        finally:
            activity.stop()


def _serve(url: str, config: Path, port: int, extra: Sequence[str]) -> int:
    """Run the exporter in the foreground; it returns on SIGINT/SIGTERM."""
    # Looked up in sys.modules at call time (not bound by an import), so a test can
    # stand in for the CLI without serving for real.
    cli = importlib.import_module("exporter.cli")
    argv = ["--url", url, "--config", str(config), "--web.listen-address", f":{port}", *extra]
    status: int = cli.main(argv)
    return status


def _banner(cluster: LocalCluster, port: int) -> None:
    print(f"PostgreSQL {cluster.version // 10000} demo cluster: {cluster.dsn('demo')}")
    print(f"  server log: {cluster.log_path}")
    print(f"Metrics:  http://localhost:{port}/metrics")
    print(f"Exporter: http://localhost:{port}/")
    print("Ctrl-C stops the exporter and the cluster.", flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
