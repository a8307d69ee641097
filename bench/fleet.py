"""Fleet mode against one exporter per database (issue 14), both scraped by a real Prometheus.

Run from the repository root::

    .venv/bin/python -m bench.fleet                      # 50 targets on 2 clusters, 3 + 3 minutes
    .venv/bin/python -m bench.fleet --minutes 1 --targets 10 --clusters 1   # a smoke run

A few throw-away PostgreSQL 18 clusters hold ``--targets`` databases between
them (copies of one small template). Two phases run one after the other for
the same wall time, each with a fresh Debian ``prometheus`` scraping every
target at ``--interval`` seconds through file-based service discovery:

- ``fleet``: one exporter with ``--targets.file`` declaring every database as a
  target (``auto_discovery: false``), scraped at ``/probe?target=NAME`` through
  the usual relabelling (``__param_target``, ``instance``, ``__address__``);
- ``singles``: one exporter per database (``--url`` of that database,
  ``--no-auto-discovery``), each scraped at ``/metrics``.

Both serve the default collector library. Measured over the phase window:
exporter CPU (utime+stime of every exporter process) per successful scrape,
the clusters' CPU per scrape, the sum of ``VmRSS`` (peak and end), exporter
backends in ``pg_stat_activity`` (peak and median of the second half),
``scrape_duration_seconds`` p50/p99 and the share of ``up`` == 1 samples, all
from Prometheus. Before each phase's Prometheus starts, a *cold wave* fires one
request per target at the same instant (fresh exporters, nothing cached); after
it stops, a *warm wave* does it again. For each wave: the most backends seen at
once, the backends opened during it, how long the last answer took and its
statuses.

A table and the fleet/singles ratios go to stdout, progress to stderr; the
figures are written to ``bench/results/fleet-<time>.json`` and ``.md``. Every
process and cluster started here is stopped on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

import psycopg

from bench.cluster import REPO
from bench.exporters import ours_python
from bench.measure import percentile, postgres_cpu_seconds, process_cpu_seconds, scrape
from rigs.localpg import LocalCluster, free_port, pg18_bindir

RESULTS = REPO / "bench/results"
COLLECTORS = REPO / "collectors"
APPLICATION = "pg_exporter"
TABLES = 10  # per database: enough for the table collectors to have rows
#: Room for 25 single exporters per cluster at their default budget of 4, plus ours.
SERVER_SETTINGS = {"max_connections": "300", "synchronous_commit": "off"}
SAMPLE_SECONDS = 0.5
WAVE_SAMPLE_SECONDS = 0.05
READY_SECONDS = 240.0
MIB = 1024.0


@dataclass(frozen=True, slots=True)
class Options:
    """Parsed command line."""

    targets: int
    clusters: int
    minutes: float
    interval: int
    max_concurrent: int | None
    waves: bool
    out: Path
    keep: bool


def parse_args(argv: list[str] | None = None) -> Options:
    """Command line → Options."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--targets", type=int, default=50, help="declared targets (databases)")
    parser.add_argument("--clusters", type=int, default=2, help="clusters sharing the targets")
    parser.add_argument("--minutes", type=float, default=3.0, help="wall time of each phase")
    parser.add_argument("--interval", type=int, default=15, help="scrape interval, seconds")
    parser.add_argument(
        "--max-concurrent", type=int, default=None, help="--targets.max-concurrent (default: 8)"
    )
    parser.add_argument("--no-waves", action="store_true", help="skip the scrape waves")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results are written")
    parser.add_argument("--keep", action="store_true", help="keep configs and logs")
    args = parser.parse_args(argv)
    if args.targets < 1 or args.clusters < 1 or args.clusters > args.targets:
        parser.error("need 1 <= --clusters <= --targets")
    if args.minutes <= 0 or args.interval < 1:
        parser.error("--minutes must be > 0 and --interval >= 1")
    return Options(
        targets=args.targets,
        clusters=args.clusters,
        minutes=args.minutes,
        interval=args.interval,
        max_concurrent=args.max_concurrent,
        waves=not args.no_waves,
        out=args.out,
        keep=args.keep,
    )


# --- targets and processes ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """One database: a declared target of the fleet, or one single exporter's URL."""

    name: str
    cluster: int  # index into the run's clusters
    url: str


def make_targets(clusters: Sequence[LocalCluster], count: int) -> list[Target]:
    """``count`` databases spread round-robin over the clusters, created from a template."""
    targets = [
        Target(f"c{i % len(clusters)}-db{i // len(clusters):03d}", i % len(clusters), "")
        for i in range(count)
    ]
    tables = "\n".join(
        f"CREATE TABLE t{n} (id int PRIMARY KEY, v text); INSERT INTO t{n} VALUES (1, 'x');"
        for n in range(TABLES)
    )
    out = []
    for index, cluster in enumerate(clusters):
        mine = [t for t in targets if t.cluster == index]
        cluster.psql("CREATE DATABASE bench_template;")
        cluster.psql(tables, dbname="bench_template")
        cluster.psql(
            "\n".join(f'CREATE DATABASE "{t.name}" TEMPLATE bench_template;' for t in mine)
        )
        out += [Target(t.name, index, cluster.dsn(t.name)) for t in mine]
    return sorted(out, key=lambda t: t.name)


class Processes:
    """Processes this run started; each is stopped on close (SIGTERM, then SIGKILL)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        """Start one process in its own session (Ctrl-C reaches only us), output to ``log``."""
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                list(argv), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.started.append(proc)
        return proc

    def stop(self, procs: Sequence[subprocess.Popen[bytes]] | None = None) -> None:
        """Stop ``procs`` (default: all still listed) at once, then wait for each."""
        chosen = list(self.started if procs is None else procs)
        for proc in chosen:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 20
        for proc in chosen:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.started = [p for p in self.started if p not in chosen]


def wait_http(url: str, procs: Sequence[subprocess.Popen[bytes]], what: str) -> None:
    """Poll ``url`` until it answers 200; fail when a process exits or time runs out."""
    deadline = time.monotonic() + READY_SECONDS
    while True:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"{what} exited before it was ready")
        if http_status(url) == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {READY_SECONDS:.0f}s")
        time.sleep(0.2)  # polling interval of a condition with a deadline


def http_status(url: str, timeout: float = 10.0) -> int:
    """Status of a GET, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def prometheus_config(job: str, sd_file: Path, interval: int, fleet_port: int | None) -> str:
    """One job over a file_sd list; in fleet mode relabelled to /probe?target=NAME."""
    lines = [
        "global:",
        f"  scrape_interval: {interval}s",
        f"  scrape_timeout: {min(10, interval)}s",
        "scrape_configs:",
        f"  - job_name: {job}",
        f"    metrics_path: {'/probe' if fleet_port else '/metrics'}",
        "    file_sd_configs:",
        f"      - files: ['{sd_file}']",
        "        refresh_interval: 5s",
    ]
    if fleet_port:
        lines += [
            "    relabel_configs:",
            "      - source_labels: [__address__]",
            "        target_label: __param_target",
            "      - source_labels: [__param_target]",
            "        target_label: instance",
            "      - target_label: __address__",
            f"        replacement: 127.0.0.1:{fleet_port}",
        ]
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class Prometheus:
    """A running Debian prometheus: its base URL."""

    base: str

    def query(self, expr: str, at: float) -> list[dict[str, object]]:
        """An instant query evaluated at ``at`` (unix time); the result list."""
        params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        with urllib.request.urlopen(f"{self.base}/api/v1/query?{params}", timeout=60) as resp:
            document = json.load(resp)
        if document.get("status") != "success":
            raise RuntimeError(f"prometheus query {expr!r} failed: {document}")
        result: list[dict[str, object]] = document["data"]["result"]
        return result

    def raw_values(self, metric: str, at: float, seconds: float) -> list[float]:
        """Every stored sample of ``metric`` in the ``seconds`` before ``at``."""
        values: list[float] = []
        for series in self.query(f"{metric}[{max(1, round(seconds))}s]", at):
            points = series.get("values")
            assert isinstance(points, list)
            values += [float(v) for _, v in points]
        return values


@contextlib.contextmanager
def prometheus(procs: Processes, home: Path, config: str) -> Iterator[Prometheus]:
    """Debian's prometheus with ``config``, stopped (and its data removed with home) after."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is missing: scripts/setup installs it")
    (home / "prometheus.yml").write_text(config)
    port = free_port()
    argv = [binary, f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn"]  # fmt: skip
    proc = procs.start(argv, home / "prometheus.log")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/-/ready", [proc], "prometheus")
        yield Prometheus(base)
    finally:
        procs.stop([proc])


# --- sampling ---------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Exporter backends per cluster and the exporters' RSS, every ``period`` seconds."""

    def __init__(
        self, clusters: Sequence[LocalCluster], pids: Sequence[int], period: float
    ) -> None:
        super().__init__(daemon=True)
        self.urls = [c.dsn() for c in clusters]
        self.pids = list(pids)
        self.period = period
        self.halt = threading.Event()
        self.backends: list[tuple[float, int]] = []  # (monotonic time, exporter backends)
        self.rss_kib: list[int] = []
        self.peak_active = 0  # most exporter backends running a statement at once
        self.opened: set[tuple[int, int, float]] = set()  # (cluster, pid, backend_start)
        self.error: str | None = None

    def run(self) -> None:
        sql = (
            "SELECT pid, extract(epoch FROM backend_start)::float8, state = 'active'"
            " FROM pg_stat_activity"
            f" WHERE application_name = '{APPLICATION}'"
        )
        try:
            with contextlib.ExitStack() as stack:
                conns = [
                    stack.enter_context(
                        psycopg.connect(u, autocommit=True, application_name="bench_sampler")
                    )
                    for u in self.urls
                ]
                while not self.halt.is_set():
                    total = active = 0
                    for index, conn in enumerate(conns):
                        rows = conn.execute(sql).fetchall()
                        total += len(rows)
                        active += sum(1 for *_, busy in rows if busy)
                        self.opened.update((index, int(pid), float(at)) for pid, at, _ in rows)
                    self.backends.append((time.monotonic(), total))
                    self.peak_active = max(self.peak_active, active)
                    self.rss_kib.append(sum(rss_kib(pid) for pid in self.pids))
                    self.halt.wait(self.period)
        except (psycopg.Error, OSError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def finish(self) -> None:
        """Stop sampling and wait for the thread."""
        self.halt.set()
        self.join(timeout=30)
        if self.error:
            progress(f"sampler stopped early: {self.error}")


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime+stime summed over processes."""
    return sum(process_cpu_seconds(pid) for pid in pids)


def clusters_cpu(clusters: Sequence[LocalCluster]) -> float:
    """Whole-cluster CPU of every cluster (postmasters, live and exited backends)."""
    total = 0.0
    for cluster in clusters:
        pid = int((cluster.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        total += postgres_cpu_seconds(pid)
    return total


# --- one phase -------------------------------------------------------------------------


@dataclass(slots=True)
class Wave:
    """One request per target fired at the same instant."""

    name: str
    requests: int = 0
    ok: int = 0  # answered 200
    statuses: dict[str, int] = field(default_factory=dict)
    last_answer_s: float = 0.0  # the slowest request, sent → last byte
    peak_backends: int = 0  # most exporter backends seen at once during the wave
    peak_active: int = 0  # most of them running a statement at once
    backends_before: int = 0
    opened: int = 0  # backends seen during the wave that were not there before it
    opened_1s: int = 0  # the most of those opened within one second


@dataclass(slots=True)
class Phase:
    """What one deployment cost over its measured window."""

    name: str
    processes: int = 0
    start_backends: int = 0  # exporter backends held once started, before any scrape
    start_burst_1s: int = 0  # most of those opened within one second
    window_s: float = 0.0
    scrapes: int = 0  # `up` samples in the window
    ok_scrapes: int = 0  # `up` == 1
    up_fraction: float = 0.0
    cpu_s: float = 0.0  # exporter processes over the window
    cpu_ms_per_scrape: float = 0.0
    pg_cpu_ms_per_scrape: float = 0.0
    rss_peak_mib: float = 0.0
    rss_end_mib: float = 0.0
    peak_backends: int = 0
    peak_active: int = 0  # most exporter backends running a statement at once (sampled)
    steady_backends: float = 0.0  # median over the second half of the window
    scrape_p50_ms: float = 0.0
    scrape_p99_ms: float = 0.0
    exporter_passes: int | None = None  # fleet only: pg_exporter_fleet_passes_total
    waves: list[Wave] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Run:
    """What both phases share."""

    options: Options
    clusters: Sequence[LocalCluster]
    targets: Sequence[Target]
    workdir: Path
    procs: Processes


def run_fleet(run: Run) -> Phase:
    """One exporter with every target declared, scraped at /probe?target=NAME."""
    home = run.workdir / "fleet"
    home.mkdir()
    targets_file = home / "targets.yml"
    targets_file.write_text(
        json.dumps(  # JSON is YAML: no quoting surprises in URLs
            {
                "targets": [
                    {"name": t.name, "url": t.url, "auto_discovery": False} for t in run.targets
                ]
            },
            indent=1,
        )
    )
    port = free_port()
    argv = [ours_python(), "-m", "exporter", "--config", str(COLLECTORS),
            "--targets.file", str(targets_file), "--web.listen-address", f"127.0.0.1:{port}",
            "--log.level", "warn"]  # fmt: skip
    if run.options.max_concurrent is not None:
        argv += ["--targets.max-concurrent", str(run.options.max_concurrent)]
    progress(f"fleet: starting one exporter for {len(run.targets)} targets on port {port}")
    proc = run.procs.start(argv, home / "exporter.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", [proc], "the fleet exporter")
        urls = [f"http://127.0.0.1:{port}/probe?target={t.name}" for t in run.targets]
        sd: list[dict[str, object]] = [{"targets": [t.name for t in run.targets]}]
        phase = measure_phase(
            run, "fleet", pids=[proc.pid], urls=urls, sd=sd, fleet_port=port, home=home
        )
        phase.exporter_passes = fleet_passes(port)
        return phase
    finally:
        run.procs.stop([proc])


def run_singles(run: Run) -> Phase:
    """One exporter per database (``--url``, ``--no-auto-discovery``), scraped at /metrics."""
    home = run.workdir / "singles"
    home.mkdir()
    ports = [free_port() for _ in run.targets]
    progress(f"singles: starting {len(run.targets)} exporters")
    started = []
    try:
        for target, port in zip(run.targets, ports, strict=True):
            argv = [ours_python(), "-m", "exporter", "--url", target.url,
                    "--config", str(COLLECTORS), "--no-auto-discovery",
                    "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warn"]  # fmt: skip
            started.append(run.procs.start(argv, home / f"{target.name}.log"))
        for port, proc in zip(ports, started, strict=True):
            wait_http(f"http://127.0.0.1:{port}/version", [proc], f"the exporter on {port}")
        urls = [f"http://127.0.0.1:{port}/metrics" for port in ports]
        sd: list[dict[str, object]] = [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"target": t.name}}
            for t, port in zip(run.targets, ports, strict=True)
        ]
        pids = [p.pid for p in started]
        return measure_phase(
            run, "singles", pids=pids, urls=urls, sd=sd, fleet_port=None, home=home
        )
    finally:
        run.procs.stop(started)


def settle(clusters: Sequence[LocalCluster]) -> tuple[int, int]:
    """After start-up work (first contacts, health probes' first connections): exporter
    backends held, and the most of them whose backend_start falls within one second."""
    time.sleep(3)
    sql = (
        "SELECT extract(epoch FROM backend_start) FROM pg_stat_activity"
        f" WHERE application_name = '{APPLICATION}'"
    )
    starts = sorted(float(v) for c in clusters for v in c.psql(sql).split() if v)
    return len(starts), most_within(starts, 1.0)


def most_within(times: Sequence[float], seconds: float) -> int:
    """The most of the sorted ``times`` falling in any window of ``seconds``."""
    best, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] > seconds:
            first += 1
        best = max(best, last - first + 1)
    return best


def measure_phase(
    run: Run,
    name: str,
    *,
    pids: list[int],
    urls: list[str],
    sd: list[dict[str, object]],
    fleet_port: int | None,
    home: Path,
) -> Phase:
    """Cold wave, then the window under Prometheus, then a warm wave."""
    phase = Phase(name, processes=len(pids))
    phase.start_backends, phase.start_burst_1s = settle(run.clusters)
    progress(
        f"  after start: {phase.start_backends} exporter backends, "
        f"{phase.start_burst_1s} of them opened within one second"
    )
    if run.options.waves:
        phase.waves.append(wave("cold", run.clusters, pids, urls))
    sd_file = home / "targets.json"
    sd_file.write_text(json.dumps(sd))
    config = prometheus_config(name, sd_file, run.options.interval, fleet_port)
    with prometheus(run.procs, home, config) as prom:
        sampler = Sampler(run.clusters, pids, SAMPLE_SECONDS)
        cpu0, pg0, started = cpu_seconds(pids), clusters_cpu(run.clusters), time.time()
        sampler.start()
        window = run.options.minutes * 60
        progress(f"{name}: measuring for {window:.0f}s (Prometheus at {prom.base})")
        time.sleep(window)
        cpu1, pg1, ended = cpu_seconds(pids), clusters_cpu(run.clusters), time.time()
        sampler.finish()
        phase.window_s = ended - started
        ups = prom.raw_values("up", ended, phase.window_s)
        durations = prom.raw_values("scrape_duration_seconds", ended, phase.window_s)
    phase.scrapes, phase.ok_scrapes = len(ups), sum(1 for v in ups if v == 1.0)
    phase.up_fraction = phase.ok_scrapes / phase.scrapes if phase.scrapes else 0.0
    phase.cpu_s = cpu1 - cpu0
    per = max(1, phase.ok_scrapes)
    phase.cpu_ms_per_scrape = phase.cpu_s * 1000 / per
    phase.pg_cpu_ms_per_scrape = (pg1 - pg0) * 1000 / per
    if sampler.rss_kib:
        phase.rss_peak_mib = max(sampler.rss_kib) / MIB
        phase.rss_end_mib = sampler.rss_kib[-1] / MIB
    counts = [n for _, n in sampler.backends]
    if counts:
        phase.peak_backends = max(counts)
        phase.peak_active = sampler.peak_active
        phase.steady_backends = statistics.median(counts[len(counts) // 2 :])
    if durations:
        phase.scrape_p50_ms = percentile(durations, 0.5) * 1000
        phase.scrape_p99_ms = percentile(durations, 0.99) * 1000
    if run.options.waves:
        phase.waves.append(wave("warm", run.clusters, pids, urls))
    progress(
        f"{name}: {phase.ok_scrapes}/{phase.scrapes} scrapes up, "
        f"{phase.cpu_ms_per_scrape:.1f} ms CPU per scrape, "
        f"peak backends {phase.peak_backends}, RSS peak {phase.rss_peak_mib:.0f} MiB"
    )
    return phase


def wave(name: str, clusters: Sequence[LocalCluster], pids: list[int], urls: list[str]) -> Wave:
    """Every target requested at the same instant, backends sampled every 50 ms meanwhile."""
    result = Wave(name, requests=len(urls))
    sampler = Sampler(clusters, pids, WAVE_SAMPLE_SECONDS)
    sampler.start()
    time.sleep(0.5)  # a few samples of what was open before the wave
    before = set(sampler.opened)
    result.backends_before = sampler.backends[-1][1] if sampler.backends else 0
    barrier = threading.Barrier(len(urls))

    def one(url: str) -> tuple[int, float]:
        port = int(urllib.parse.urlsplit(url).port or 80)
        path = url.split(f":{port}", 1)[1]
        barrier.wait()
        try:
            answer = scrape(port, path, gzip_ok=True, timeout=30)
        except OSError:
            return 0, 30.0
        return answer.status, answer.seconds

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(urls)) as pool:
        answers = list(pool.map(one, urls))
    time.sleep(0.5)  # backends opened at the very end are sampled too
    sampler.finish()
    for status, _ in answers:
        result.statuses[str(status)] = result.statuses.get(str(status), 0) + 1
    result.ok = result.statuses.get("200", 0)
    result.last_answer_s = max(seconds for _, seconds in answers)
    result.peak_backends = max((n for _, n in sampler.backends), default=0)
    new = sampler.opened - before
    result.opened = len(new)
    result.opened_1s = most_within(sorted(at for *_, at in new), 1.0)
    result.peak_active = sampler.peak_active
    progress(
        f"  {name} wave: {result.ok}/{result.requests} answered 200 in "
        f"{result.last_answer_s:.2f}s, peak backends {result.peak_backends} "
        f"({result.peak_active} running a statement), "
        f"opened {result.opened}"
    )
    return result


def fleet_passes(port: int) -> int | None:
    """pg_exporter_fleet_passes_total from the fleet's own /metrics."""
    try:
        body = scrape(port, "/metrics", gzip_ok=False, timeout=10).body.decode()
    except OSError:
        return None
    for line in body.splitlines():
        if line.startswith("pg_exporter_fleet_passes_total"):
            return int(float(line.split()[-1]))
    return None


# --- report -----------------------------------------------------------------------------

#: (label, attribute, format) of the table's rows; lower is better for all but `up`.
ROWS = (
    ("exporter processes", "processes", "{:d}"),
    ("backends held after start", "start_backends", "{:d}"),
    ("  of which opened within 1 s", "start_burst_1s", "{:d}"),
    ("successful scrapes", "ok_scrapes", "{:d}"),
    ("up == 1 fraction", "up_fraction", "{:.4f}"),
    ("CPU ms per scrape per target", "cpu_ms_per_scrape", "{:.2f}"),
    ("exporter CPU s in the window", "cpu_s", "{:.1f}"),
    ("PostgreSQL CPU ms per scrape", "pg_cpu_ms_per_scrape", "{:.2f}"),
    ("RSS peak MiB (sum)", "rss_peak_mib", "{:.0f}"),
    ("RSS end MiB (sum)", "rss_end_mib", "{:.0f}"),
    ("peak exporter backends", "peak_backends", "{:d}"),
    ("steady exporter backends", "steady_backends", "{:.0f}"),
    ("peak backends running a statement", "peak_active", "{:d}"),
    ("scrape_duration p50 ms", "scrape_p50_ms", "{:.1f}"),
    ("scrape_duration p99 ms", "scrape_p99_ms", "{:.1f}"),
)
WAVE_ROWS = (
    ("answered 200", "ok", "{:d}"),
    ("slowest answer s", "last_answer_s", "{:.2f}"),
    ("backends before", "backends_before", "{:d}"),
    ("peak backends", "peak_backends", "{:d}"),
    ("peak backends running a statement", "peak_active", "{:d}"),
    ("backends opened", "opened", "{:d}"),
    ("  of which opened within 1 s", "opened_1s", "{:d}"),
)


def table(fleet: Phase, singles: Phase) -> list[str]:
    """Markdown table: one row per figure, fleet | singles | fleet/singles."""
    lines = ["| figure | fleet | singles | fleet/singles |", "|---|---:|---:|---:|"]
    for label, attr, fmt in ROWS:
        a, b = getattr(fleet, attr), getattr(singles, attr)
        lines.append(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio(a, b)} |")
    for fw, sw in zip(fleet.waves, singles.waves, strict=True):
        for label, attr, fmt in WAVE_ROWS:
            a, b = getattr(fw, attr), getattr(sw, attr)
            lines.append(
                f"| {fw.name} wave: {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio(a, b)} |"
            )
    return lines


def ratio(a: float, b: float) -> str:
    """``a / b`` with two decimals, a dash when b is zero."""
    return f"{a / b:.2f}" if b else "-"


def environment(options: Options, clusters: Sequence[LocalCluster]) -> dict[str, str]:
    """Machine and versions recorded with the figures."""
    version = clusters[0].psql("SHOW server_version")
    prom = subprocess.run(
        ["prometheus", "--version"], capture_output=True, text=True, check=False, timeout=30
    )
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(),
        "cpus": str(len(os.sched_getaffinity(0))),
        "memory_gib": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f}",
        "loadavg_at_start": Path("/proc/loadavg").read_text().split(" ", 1)[0],
        "postgresql": version,
        "prometheus": (prom.stdout + prom.stderr).splitlines()[0] if prom.stdout else "unknown",
        "python": platform.python_version(),
        "targets": str(options.targets),
        "clusters": str(options.clusters),
        "minutes_per_phase": f"{options.minutes:g}",
        "scrape_interval_s": str(options.interval),
        "max_concurrent": str(options.max_concurrent or "default (8)"),
    }


def commit() -> str:
    """HEAD of the checkout, marked when exporter/ differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "exporter", "collectors"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} (exporter/ or collectors/ modified)" if dirty else head


def write_results(
    out: Path, env: dict[str, str], fleet: Phase, singles: Phase, lines: list[str]
) -> Path:
    """bench/results/fleet-<time>.json and .md; the JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    document = {"environment": env, "phases": [asdict(fleet), asdict(singles)]}
    path = out / f"fleet-{stamp}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    head = [f"- {k}: {v}" for k, v in env.items()]
    (out / f"fleet-{stamp}.md").write_text("\n".join(["# bench.fleet", "", *head, "", *lines]))
    return path


# --- main -------------------------------------------------------------------------------


def progress(message: str) -> None:
    """Progress goes to stderr so stdout carries only the table."""
    print(message, file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so every process and cluster is stopped."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Set up the clusters, run both phases, print and write the figures."""
    options = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="pgx-bench-fleet-"))
    procs = Processes()
    failed = False
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(procs.stop)  # whatever is still running, on any exit
            clusters = [
                stack.enter_context(LocalCluster(pg18_bindir(), settings=SERVER_SETTINGS))
                for _ in range(options.clusters)
            ]
            progress(f"{options.clusters} clusters up; creating {options.targets} databases")
            targets = make_targets(clusters, options.targets)
            env = environment(options, clusters)
            for key, value in env.items():
                progress(f"{key}: {value}")
            run = Run(options, clusters, targets, workdir, procs)
            fleet = run_fleet(run)
            singles = run_singles(run)
        lines = table(fleet, singles)
        print("\n".join(lines))
        path = write_results(options.out, env, fleet, singles, lines)
        print(f"\nresults written to {path} (and .md)")
    except KeyboardInterrupt:
        progress("interrupted: every process and cluster was stopped")
        return 130
    except BaseException:
        failed = True
        raise
    finally:
        if options.keep or failed:
            progress(f"configs and logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
