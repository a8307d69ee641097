"""Benchmark of what users install (issue 37): the .deb's exporter beside the venv's and Go's.

Run from the repository root::

    .venv/bin/python -m bench.installed                            # installed vs venv
    .venv/bin/python -m bench.installed --go-binary PATH/pg_exporter \\
        --go-config PATH/pg_exporter.yml [--deb dist/pg-exporter_VERSION-1_amd64.deb] \\
        [--rounds 3] [--scrapes 30] [--json out.json]

It builds the .deb with ``scripts/packages`` (or takes ``--deb``), unpacks it into a
throw-away root (``dpkg-deb -x``) and compiles its byte-code with the launcher's
interpreter as the postinst does, then serves the workload of ``bench.library`` (one
PostgreSQL 18, an extra database of 30 indexed tables, a ``pg_monitor`` role) with:

- ``installed``: the unpacked ``/usr/bin/pg_exporter`` (Debian's python3, ``-I -S``, the
  private site-packages) with the unpacked ``/etc/pg_exporter`` library;
- ``venv``: ``.venv/bin/python -m exporter`` with ``collectors/`` (the same files);
- ``go``: a Go pg_exporter binary given by ``--go-binary`` with ``--go-config`` (never
  built or fetched here; left out without it).

Two flavours, as ``bench.library``: ``uncached`` (``--disable-cache``) and ``cached``
(default TTLs), scraped back to back; trials interleave round by round, so machine
noise falls on every exporter alike. Per scrape: exporter CPU (utime+stime), wall
(median), PostgreSQL CPU, series, RSS after the scrapes; then the ratios of each round,
median [min–max], and what the installed exporter says of its code paths.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import exporter
from bench import library
from bench.cluster import REPO
from bench.exporters import ExporterFailed, Launch
from bench.library import _fmt, _progress
from rigs.localpg import LocalCluster, free_port, pg18_bindir

INSTALLED, VENV, GO = "installed", library.OURS, library.GO
TITLES = {INSTALLED: "installed .deb", VENV: "venv", GO: "Go pg_exporter binary"}
FIELDS = (("cpu_ms", "CPU ms"), ("wall_ms", "wall ms"), ("pg_cpu_ms", "PostgreSQL CPU ms"),
          ("series", "series"), ("rss_mib", "RSS MiB"))  # fmt: skip
RATIOS = ((INSTALLED, VENV), (INSTALLED, GO), (VENV, GO))


@dataclass(frozen=True, slots=True)
class Options:
    """Parsed command line."""

    deb: Path | None
    go_binary: Path | None
    go_config: Path | None
    bench: library.Options  # scrapes, warm-up, rounds, flavours, the Go paths


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Command line → Options; a given path must exist."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--deb", type=Path, metavar="PATH", help="the .deb (default: build it)")
    parser.add_argument("--go-binary", type=Path, metavar="PATH", help="a Go pg_exporter binary")
    parser.add_argument("--go-config", type=Path, metavar="PATH",
                        help="the Go exporter's pg_exporter.yml (with --go-binary)")  # fmt: skip
    parser.add_argument("--scrapes", type=int, default=30, help="measured scrapes per trial")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured scrapes first")
    parser.add_argument("--rounds", type=int, default=3, help="trials per exporter and flavour")
    parser.add_argument("--flavours", default=",".join(library.FLAVOURS), help="uncached,cached")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every trial as JSON")
    args = parser.parse_args(argv)
    for flag, path in (("--deb", args.deb), ("--go-binary", args.go_binary),
                       ("--go-config", args.go_config)):  # fmt: skip
        if path is not None and not path.is_file():
            parser.error(f"{flag} {path}: no such file")
    if (args.go_binary is None) != (args.go_config is None):
        parser.error("--go-binary and --go-config go together")
    flavours = tuple(f.strip() for f in args.flavours.split(",") if f.strip())
    if not flavours or any(f not in library.FLAVOURS for f in flavours):
        parser.error(f"--flavours: choose among {', '.join(library.FLAVOURS)}")
    bench = library.Options(
        scrapes=max(1, args.scrapes), warmup=max(0, args.warmup), rounds=max(1, args.rounds),
        flavours=flavours, go_config=args.go_config, go_binary=args.go_binary,
        json_path=args.json, ready_timeout=120.0, top_branches=0,
    )  # fmt: skip
    return Options(args.deb, args.go_binary, args.go_config, bench)


def build_deb() -> Path:
    """The .deb of this checkout, built by scripts/packages."""
    _progress("building the .deb (scripts/packages)")
    subprocess.run(["bash", str(REPO / "scripts/packages")], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return REPO / "dist" / f"pg-exporter_{exporter.__version__}-1_amd64.deb"


def unpack(deb: Path, root: Path) -> str:
    """The package's files under ``root``, byte-code compiled as its postinst does;
    returns what the installed launcher says with ``--version``."""
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    launcher = root / "usr/bin/pg_exporter"
    python = launcher.read_text().splitlines()[0].removeprefix("#!").split()[0]
    site = root / "usr/lib/pg_exporter/site-packages"
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(site)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return subprocess.run([str(launcher), "--version"], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip


def launcher_for(root: Path) -> library.Launcher:
    """bench.library's command lines, plus the unpacked package's exporter."""

    def launch(key: str, flavour: str, url: str, options: library.Options) -> Launch:
        if key != INSTALLED:
            return library.launch(key, flavour, url, options)
        port = free_port()
        uncached = ("--disable-cache", "--server.time-budget", "0") if flavour == "uncached" else ()
        argv = (str(root / "usr/bin/pg_exporter"), "--url", url,
                "--config", str(root / "etc/pg_exporter"), "--web.listen-address",
                f"127.0.0.1:{port}", "--log.level", "warn", *uncached)  # fmt: skip
        return Launch(INSTALLED, argv, port)

    return launch


def keys_of(options: Options) -> list[str]:
    return [INSTALLED, VENV] + ([GO] if options.go_binary is not None else [])


def run(options: Options, root: Path, workdir: Path) -> list[library.Pass]:
    """Every round of every flavour of every exporter, on one cluster."""
    passes = []
    launch = launcher_for(root)
    with LocalCluster(pg18_bindir(), settings=library.SERVER_SETTINGS) as cluster:
        library.populate(cluster)
        bench = library.Bench(cluster, options.bench, workdir, {})
        for rnd in range(1, options.bench.rounds + 1):
            for flavour in options.bench.flavours:
                for key in keys_of(options):
                    passes.append(_one(bench, key, flavour, rnd, launch))
    return passes


def _one(
    bench: library.Bench, key: str, flavour: str, rnd: int, launch: library.Launcher
) -> library.Pass:
    try:
        result = library.trial(bench, key, flavour, rnd, launch)
    except (ExporterFailed, OSError) as exc:
        log = bench.workdir / f"{key}-{flavour}-{rnd}.log"
        tail = log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []
        _progress(f"round {rnd} {flavour} {key}: FAILED {exc}\n" + "\n".join(tail))
        return library.Pass(key, flavour, rnd, 0, 0, 0, 0, 0, 0, error=str(exc))
    _progress(f"round {rnd} {flavour} {key}: cpu {result.cpu_ms:.1f} ms, wall "
              f"{result.wall_ms:.1f} ms, {result.series} series, "
              f"RSS {result.rss_mib:.1f} MiB")  # fmt: skip
    return result


def render(passes: list[library.Pass], options: Options) -> str:
    """Per flavour: each exporter's median over rounds, then the ratios round by round."""
    out = []
    keys = keys_of(options)
    for flavour in options.bench.flavours:
        rows = [p for p in passes if p.flavour == flavour and not p.error]
        out.append(f"\n### {flavour} ({options.bench.scrapes} scrapes a round, "
                   f"{options.bench.rounds} rounds; medians)")  # fmt: skip
        out.append("\n| per scrape | " + " | ".join(title for _, title in FIELDS) + " |")
        out.append("|---|" + "---|" * len(FIELDS))
        for key in keys:
            trials = [p for p in rows if p.exporter == key]
            cells = [_fmt(statistics.median(float(getattr(p, f)) for p in trials)) if trials
                     else "failed" for f, _ in FIELDS]  # fmt: skip
            out.append(f"| {TITLES[key]} | " + " | ".join(cells) + " |")
        for mine, peer in RATIOS:
            if mine in keys and peer in keys:
                cells = [_ratio(rows, mine, peer, field) for field, _ in FIELDS]
                out.append(f"| {TITLES[mine]} / {TITLES[peer]} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _ratio(rows: list[library.Pass], mine: str, peer: str, field: str) -> str:
    """mine/peer of one field, round by round: median [min–max]."""
    ratios = []
    for ours in (p for p in rows if p.exporter == mine):
        theirs = [p for p in rows if p.exporter == peer and p.round == ours.round]
        if theirs and float(getattr(theirs[0], field)):
            ratios.append(float(getattr(ours, field)) / float(getattr(theirs[0], field)))
    if not ratios:
        return "n/a"
    return f"{statistics.median(ratios):.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]"


def main(argv: Sequence[str] | None = None) -> int:
    """Build or take the .deb, run, print the Markdown tables; exit 0 whatever the figures."""
    options = parse_args(argv)
    if shutil.which("dpkg-deb") is None:
        _progress("bench.installed: dpkg-deb is missing (a Debian or Ubuntu machine is needed)")
        return 1
    deb = options.deb or build_deb()
    _progress(f"load average at start: {Path('/proc/loadavg').read_text().split()[0]}")
    if options.go_binary is None:
        _progress("no --go-binary: measuring the installed exporter beside the venv only")
    with tempfile.TemporaryDirectory(prefix="pgx-bench-installed-") as tmp:
        root, workdir = Path(tmp) / "root", Path(tmp) / "logs"
        workdir.mkdir()
        version = unpack(deb, root)
        _progress(f"installed exporter, from {deb.name}:\n{version}")
        passes = run(options, root, workdir)
    print(f"installed exporter ({deb.name}), --version:\n\n```\n{version.strip()}\n```")
    print(render(passes, options))
    if options.bench.json_path is not None:
        options.bench.json_path.write_text(json.dumps([asdict(p) for p in passes], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
