"""Soak: tens of thousands of scrapes of every kind against ONE exporter process.

Starts a throw-away PostgreSQL 18 with two extra databases, runs the real exporter
(``python -m exporter``, wrapped only to count its asyncio tasks on SIGUSR2) with a
few collectors, most of them cached (ttl), and sends a seeded mix of requests:

- normal scrapes (some gzip, some OpenMetrics),
- hang-ups right after the request, in the middle of the headers, and in the middle
  of the body (a small receive buffer, so the server is still writing),
- ``X-Prometheus-Scrape-Timeout-Seconds`` budgets: tiny, large and invalid,
- slow readers (SO_RCVBUF 4 KiB, reading 4 KiB at a time with a pause),
- bursts of concurrent scrapes over the admission limit (most answered 503).

Every ``--sample-every`` seconds it samples the process: resident memory (VmRSS),
open file descriptors, asyncio tasks, and the exporter's connections in
``pg_stat_activity``. At the end, idle, it checks that nothing leaked: file
descriptors back to the baseline, connections within databases + 1, no admission
slot held (two concurrent scrapes both get 200, and the in-flight gauge counts
only the scrape reading it). Prints start/end values and the least-squares slope
per 1000 scrapes.

    .venv/bin/python -m tests.reliability.soak            # 20 000 scrapes
    .venv/bin/python -m tests.reliability.soak --scrapes 50000 --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from exporter.collect.budget import SCRAPE_TIMEOUT_HEADER
from rigs.localpg import LocalCluster, free_port, pg18_bindir
from tests.fixtures.helpers import exporter_backends, value
from tests.fixtures.rawhttp import RawClient, get

REPO = Path(__file__).resolve().parents[2]

BUDGET_HEADER = SCRAPE_TIMEOUT_HEADER
EXTRA_DATABASES = ("soak_a", "soak_b")
# The main database plus the discovered ones, and the health probe's own connection.
CONNECTION_CAP = 1 + len(EXTRA_DATABASES) + 1
SERIES = 1500  # about 100 KB of text: larger than a 4 KiB receive buffer by far
SLOW_BUFFER = 4096
INVALID_BUDGETS = ("", "abc", "-1", "0", "nan", "NaN", "inf", "-inf", "1e999", " ", "0x10", "1,5")

# Collectors: one uncached (runs its SQL every pass), the rest cached, one per database.
COLLECTORS = f"""
soak_fast:
  query: SELECT 1 AS one
  tags: [cluster]
  metrics:
    - one: {{usage: GAUGE, description: runs every pass}}
soak_series:
  query: >-
    SELECT g::text AS item, g % 7 AS grp, g * 1.5 AS reading
    FROM generate_series(1, {SERIES}) g
  ttl: 10
  timeout: 2
  tags: [cluster]
  metrics:
    - item: {{usage: LABEL, description: item}}
    - grp: {{usage: LABEL, description: group}}
    - reading: {{usage: GAUGE, description: a cached collector with many series}}
soak_activity:
  query: SELECT count(*) AS backends FROM pg_stat_activity
  ttl: 2
  timeout: 1
  tags: [cluster]
  metrics:
    - backends: {{usage: GAUGE, description: cached for two seconds}}
soak_database:
  query: SELECT current_database() AS datname, pg_database_size(current_database()) AS bytes
  ttl: 5
  timeout: 1
  metrics:
    - datname: {{usage: LABEL, description: database}}
    - bytes: {{usage: GAUGE, description: per database, cached}}
"""

# The exporter's own CLI, plus a SIGUSR2 handler that appends the number of asyncio
# tasks to a file. A Python-level handler runs in the main thread, where the loop runs.
_SERVE = """
import asyncio, os, signal, sys
from exporter.cli import main

def _count_tasks(signum, frame):
    try:
        count = len(asyncio.all_tasks())
    except RuntimeError:
        count = -1
    with open(os.environ["SOAK_TASKS_FILE"], "a") as out:
        out.write(f"{count}\\n")

signal.signal(signal.SIGUSR2, _count_tasks)
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class SoakConfig:
    """How long and how hard to soak."""

    scrapes: int = 20_000
    workers: int = 2
    sample_every: float = 5.0
    seed: int = 8
    max_seconds: float = 1800.0  # a hard stop for the load, whatever the count
    warmup: int = 500  # scrapes before the baseline sample


@dataclass
class Sample:
    """One observation of the exporter process."""

    elapsed: float
    scrapes: int
    rss_kib: int
    fds: int
    tasks: int
    connections: int


@dataclass
class SoakResult:
    """What the soak observed."""

    config: SoakConfig
    samples: list[Sample] = field(default_factory=list)
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    scrapes: int = 0
    seconds: float = 0.0
    baseline: Sample | None = None
    idle_end: Sample | None = None
    final_statuses: list[int] = field(default_factory=list)
    idle_in_flight: float = float("nan")  # as read by one scrape: itself only, so 1
    unexpected: list[str] = field(default_factory=list)  # anything that should not happen
    log_errors: list[str] = field(default_factory=list)
    max_connections: int = 0

    def slope(self, metric: str) -> float:
        """Least-squares slope of ``metric`` per 1000 scrapes, after the warm-up."""
        points = [
            (s.scrapes, float(getattr(s, metric)))
            for s in self.samples
            if s.scrapes >= self.config.warmup
        ]
        return 1000 * least_squares_slope(points)


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float:
    """The slope of the least-squares line through ``points`` (0 with fewer than 2)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var


# --- the exporter process and what we read from it -----------------------------------


class ExporterProcess:
    """The exporter as a real process, with its RSS, fds and asyncio tasks readable."""

    def __init__(self, cluster: LocalCluster, workdir: Path) -> None:
        self.port = free_port()
        config = workdir / "soak.yml"
        config.write_text(COLLECTORS)
        self.tasks_file = workdir / "tasks.txt"
        self.tasks_file.write_text("")
        self.log_path = workdir / "exporter.log"
        listen = f"127.0.0.1:{self.port}"
        args = ["-u", cluster.dsn(), "-c", str(config), "-T", "5000",
                "--web.listen-address", listen, "--log.level", "warn"]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _SERVE, *args],
                cwd=REPO,
                stdout=log,
                stderr=log,
                env={**os.environ, "SOAK_TASKS_FILE": str(self.tasks_file)},
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_kib(self) -> int:
        """VmRSS of the process in KiB."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1])

    def fds(self) -> int:
        """Open file descriptors of the process."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    async def tasks(self, within: float = 5.0) -> int:
        """The number of asyncio tasks, asked with SIGUSR2 (-1 when the loop is not running)."""
        before = len(self.tasks_file.read_text().splitlines())
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            lines = self.tasks_file.read_text().splitlines()
            if len(lines) > before:
                return int(lines[before])
            await asyncio.sleep(0.01)
        raise AssertionError("the exporter did not answer SIGUSR2 with its task count")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not stop; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log_errors(self) -> list[str]:
        """Log lines that show an error or a traceback (the run is at --log.level warn)."""
        text = self.log_path.read_text(errors="replace")
        return [
            line
            for line in text.splitlines()
            if "Traceback" in line or "level=error" in line or "Error handling request" in line
        ]


def exporter_connections(cluster: LocalCluster) -> int:
    """The exporter's backends in pg_stat_activity (the health probe's included)."""
    return exporter_backends(cluster, probe=True)


async def sample(process: ExporterProcess, cluster: LocalCluster, t0: float, done: int) -> Sample:
    """One observation of the process and its database connections."""
    return Sample(
        elapsed=round(time.monotonic() - t0, 2),
        scrapes=done,
        rss_kib=process.rss_kib(),
        fds=process.fds(),
        tasks=await process.tasks(),
        connections=await asyncio.to_thread(exporter_connections, cluster),
    )


# --- the load ----------------------------------------------------------------------


async def _status_of(client: RawClient, limit: float = 60.0) -> int:
    response = await client.response(limit)
    return response.status


async def normal(port: int, rng: random.Random) -> list[str]:
    """A scrape read to the end, sometimes gzip, sometimes OpenMetrics."""
    headers = {}
    if rng.random() < 0.3:
        headers["Accept-Encoding"] = "gzip"
    if rng.random() < 0.3:
        headers["Accept"] = "application/openmetrics-text; version=1.0.0"
    client = await RawClient.send(port, headers=headers)
    return [str(await _status_of(client))]


async def hangup_after_send(port: int, rng: random.Random) -> list[str]:
    """The whole request, then gone before any answer."""
    client = await RawClient.send(port)
    if rng.random() < 0.5:
        await asyncio.sleep(rng.uniform(0, 0.02))  # pacing: anywhere in the pass
    client.hang_up()
    return ["sent"]


async def hangup_mid_headers(port: int, rng: random.Random) -> list[str]:
    """Part of the request line or headers, then gone."""
    request = (
        f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{BUDGET_HEADER}: 5\r\nAccept: */*\r\n"
    )
    cut = rng.randrange(1, len(request))
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request[:cut].encode())
    await writer.drain()
    writer.close()
    return ["cut"]


async def hangup_mid_body(port: int, rng: random.Random) -> list[str]:
    """Read the headers and a little of the body through a small buffer, then gone."""
    client = await RawClient.send(port, receive_buffer=SLOW_BUFFER)
    async with asyncio.timeout(60):
        head = await client.reader.readuntil(b"\r\n\r\n")
        await client.reader.read(rng.randrange(1, SLOW_BUFFER))
    client.hang_up()
    return [head.split(b" ", 2)[1].decode()]


async def budget(port: int, rng: random.Random) -> list[str]:
    """A scrape with a tiny, a large or an invalid scrape-timeout header."""
    kind = rng.choice(("tiny", "large", "invalid"))
    if kind == "tiny":
        header = f"{rng.uniform(0.0001, 0.01):.4f}"
    elif kind == "large":
        header = rng.choice(("30", "120", "1e9"))
    else:
        header = rng.choice(INVALID_BUDGETS)
    client = await RawClient.send(port, headers={BUDGET_HEADER: header})
    return [f"{kind}:{await _status_of(client)}"]


async def slow_reader(port: int, rng: random.Random) -> list[str]:
    """A scrape read 4 KiB at a time through a 4 KiB receive buffer."""
    client = await RawClient.send(port, receive_buffer=SLOW_BUFFER)
    async with asyncio.timeout(60):
        head = await client.reader.readuntil(b"\r\n\r\n")
        for _ in range(10_000):  # bounded: ~40 MB at most
            if not await client.reader.read(SLOW_BUFFER):
                break
            await asyncio.sleep(0.001)  # pacing of a slow reader
    client.hang_up()
    return [head.split(b" ", 2)[1].decode()]


async def burst(port: int, rng: random.Random) -> list[str]:
    """Several scrapes at once, over the admission limit of two."""
    size = rng.randrange(4, 9)
    responses = await asyncio.gather(*(get(port) for _ in range(size)))
    return [str(r.status) for r in responses]


Action = Callable[[int, random.Random], Awaitable[list[str]]]
MIX: tuple[tuple[Action, int], ...] = (
    (normal, 40),
    (hangup_after_send, 8),
    (hangup_mid_headers, 8),
    (hangup_mid_body, 8),
    (budget, 20),
    (slow_reader, 6),
    (burst, 5),
)
# Statuses each action may see; anything else is a failure.
ALLOWED = {
    "normal": {"200", "503"},
    "hangup_after_send": {"sent"},
    "hangup_mid_headers": {"cut"},
    "hangup_mid_body": {"200", "503"},
    "budget": {"tiny:200", "tiny:503", "large:200", "large:503", "invalid:200", "invalid:503"},
    "slow_reader": {"200", "503"},
    "burst": {"200", "503"},
}


@dataclass
class Load:
    """Shared counters of the load generator."""

    target: int
    deadline: float
    done: int = 0
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    def more(self) -> bool:
        return self.done < self.target and time.monotonic() < self.deadline


async def worker(port: int, load: Load, rng: random.Random) -> None:
    """Pick actions from the mix until the load is done (bounded in count and time)."""
    actions = [a for a, _ in MIX]
    weights = [w for _, w in MIX]
    while load.more():
        action = rng.choices(actions, weights)[0]
        try:
            results = await action(port, rng)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            # A read cut short by the server is a failure of the run: counted, reported.
            load.errors[f"{action.__name__}: {type(exc).__name__}"] += 1
            results = ["client-error"]
        load.done += len(results)
        load.outcomes.setdefault(action.__name__, Counter()).update(results)


async def _until_idle(process: ExporterProcess, fds: int, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while process.fds() > fds and time.monotonic() < deadline:  # noqa: ASYNC110 (no event)
        await asyncio.sleep(0.05)  # polling /proc with a deadline: nothing to wait on


async def soak(config: SoakConfig, cluster: LocalCluster, workdir: Path) -> SoakResult:
    """Run the soak against a fresh exporter process on ``cluster``; never raises on figures."""
    for name in EXTRA_DATABASES:
        found = cluster.psql(f"SELECT count(*) FROM pg_database WHERE datname = '{name}'")
        if found.strip() == "0":
            cluster.psql(f"CREATE DATABASE {name}")
    process = ExporterProcess(cluster, workdir)
    result = SoakResult(config)
    try:
        await _wait_listening(process)
        await _run(process, cluster, config, result)
    finally:
        process.stop()
        result.log_errors = process.log_errors()
    return result


async def _wait_listening(process: ExporterProcess, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.process.poll() is not None:
            raise RuntimeError(f"the exporter exited: {process.log_path.read_text()}")
        try:
            if (await get(process.port, "/")).status == 200:
                return
        except OSError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("the exporter did not start listening")


async def _run(
    process: ExporterProcess, cluster: LocalCluster, config: SoakConfig, result: SoakResult
) -> None:
    port = process.port
    rng = random.Random(config.seed)
    t0 = time.monotonic()
    # Warm-up: plain scrapes until every collector has run and the allocator has settled.
    warm = Load(config.warmup, t0 + 120)
    await asyncio.gather(*(worker_plain(port, warm) for _ in range(2)))
    fds_idle = process.fds()
    result.baseline = await sample(process, cluster, t0, warm.done)
    result.samples.append(result.baseline)
    load = Load(config.scrapes, time.monotonic() + config.max_seconds, done=warm.done)
    load.target += warm.done
    workers = [
        asyncio.create_task(worker(port, load, random.Random(rng.random())))
        for _ in range(config.workers)
    ]
    while not all(w.done() for w in workers):
        await asyncio.wait(workers, timeout=config.sample_every)
        result.samples.append(await sample(process, cluster, t0, load.done))
    for w in workers:
        w.result()  # a worker's unexpected exception fails the run here
    result.seconds = time.monotonic() - t0
    result.scrapes = load.done - warm.done
    await _until_idle(process, fds_idle)
    result.idle_end = await sample(process, cluster, t0, load.done)
    result.samples.append(result.idle_end)
    # No slot leaked: two scrapes at once are both admitted.
    pair = await asyncio.gather(get(port), get(port))
    result.final_statuses = [r.status for r in pair]
    last = await get(port)
    result.idle_in_flight = value(last.text, "pg_exporter_requests_in_flight")
    result.max_connections = max(s.connections for s in result.samples)
    result.outcomes = {k: dict(v) for k, v in sorted(load.outcomes.items())}
    result.outcomes["warmup"] = dict(warm.outcomes.get("plain", Counter()))
    for name, counts in load.outcomes.items():
        for status, count in counts.items():
            if status not in ALLOWED[name]:
                result.unexpected.append(f"{name}: {status} x{count}")
    result.unexpected.extend(f"{what} x{count}" for what, count in load.errors.items())


async def worker_plain(port: int, load: Load) -> None:
    """Back-to-back normal scrapes (the warm-up)."""
    while load.more():
        status = (await get(port)).status
        load.done += 1
        load.outcomes.setdefault("plain", Counter())[str(status)] += 1


# --- the report --------------------------------------------------------------------


def report(result: SoakResult) -> str:
    """The figures as a Markdown table and a summary of outcomes."""
    base, end = result.baseline, result.idle_end
    assert base is not None
    assert end is not None
    rate = result.scrapes / result.seconds if result.seconds else 0.0
    lines = [
        f"soak: {result.scrapes} scrapes (after {result.config.warmup} warm-up) in "
        f"{result.seconds:.0f} s ({rate:.0f}/s), {result.config.workers} workers, "
        f"seed {result.config.seed}, {len(result.samples)} samples",
        "",
        "| measure | start | end (idle) | max | slope per 1000 scrapes |",
        "|---|---|---|---|---|",
    ]
    for label, metric, unit in (
        ("resident memory", "rss_kib", "MiB"),
        ("open file descriptors", "fds", ""),
        ("asyncio tasks", "tasks", ""),
        ("database connections", "connections", ""),
    ):
        top = max(getattr(s, metric) for s in result.samples)
        slope = result.slope(metric)
        if unit == "MiB":
            lines.append(
                f"| {label} | {base.rss_kib / 1024:.1f} MiB | {end.rss_kib / 1024:.1f} MiB "
                f"| {top / 1024:.1f} MiB | {slope:+.1f} KiB |"
            )
        else:
            lines.append(
                f"| {label} | {getattr(base, metric)} | {getattr(end, metric)} | {top} "
                f"| {slope:+.3f} |"
            )
    lines += [
        "",
        f"in flight when idle (read by a scrape, which counts itself): {result.idle_in_flight:g}",
        f"two concurrent scrapes after the run: {result.final_statuses}",
        f"connection cap (databases + probe): {CONNECTION_CAP}, max seen {result.max_connections}",
        "",
        "outcomes by action:",
    ]
    lines += [
        f"  {name}: {', '.join(f'{k}={v}' for k, v in sorted(counts.items()))}"
        for name, counts in result.outcomes.items()
    ]
    lines.append(f"unexpected: {result.unexpected or 'none'}")
    lines.append(f"exporter log errors: {len(result.log_errors)}")
    lines += [f"  {line}" for line in result.log_errors[:10]]
    return "\n".join(lines)


@contextmanager
def soak_cluster() -> Iterator[LocalCluster]:
    """A throw-away PostgreSQL 18 (statement logging off: the soak runs many statements)."""
    with LocalCluster(pg18_bindir()) as cluster:
        yield cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scrapes", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=1800.0)
    parser.add_argument("--json", help="also write the samples and figures here")
    args = parser.parse_args(argv)
    config = SoakConfig(
        scrapes=args.scrapes,
        workers=args.workers,
        sample_every=args.sample_every,
        seed=args.seed,
        max_seconds=args.max_seconds,
    )
    with soak_cluster() as cluster, tempfile.TemporaryDirectory(prefix="soak-") as workdir:
        print(f"soaking {config.scrapes} scrapes ...", file=sys.stderr)
        result = asyncio.run(soak(config, cluster, Path(workdir)))
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(result), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
