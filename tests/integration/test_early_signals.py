"""Signals from the first instant (issue 29, finding 7), on real processes: the target
accepts the login and then never answers (a proxy relays the login and holds every
query), so the exporter is still starting when the signal comes. SIGHUP once killed it
there (the handlers were installed after the first contact); SIGTERM killed it by the
default action rather than stopping it cleanly.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from rigs.localpg import LocalCluster, free_port
from tests.fixtures.dispositions import default_sigint
from tests.fixtures.helpers import COLLECTORS, REPO, http_get, terminate
from tests.fixtures.holdingproxy import holding_proxy
from tests.fixtures.polling import wait_for

# A stop signal ends the process within this many seconds while it starts: it gives up
# the held first contact at once (and a held --explain within 3 s); the rest is margin
# for a busy shared machine. The first contact itself would hold it for 7 s.
PROMPT_EXIT = 6.0


def _held(cluster: LocalCluster) -> bool:
    """True once an exporter's login was relayed: its first query is being held."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_exporter'"
        ).fetchone()
    return row is not None and row[0] > 0


@pytest.fixture
def held_start(pg18: LocalCluster, tmp_path: Path) -> Iterator[object]:
    """Start ``python -m exporter`` (extra arguments) through the holding proxy; returns
    the process, its port and its log once its first query is held."""
    processes: list[subprocess.Popen[bytes]] = []
    with holding_proxy(pg18.port) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy}/postgres?sslmode=disable"

        def launch(*extra: str) -> tuple[subprocess.Popen[bytes], int, Path]:
            port, log = free_port(), tmp_path / f"exporter-{len(processes)}.log"
            with log.open("wb") as sink:
                process = subprocess.Popen(
                    [sys.executable, "-m", "exporter", "-u", url, "-c", str(COLLECTORS),
                     "--web.listen-address", f"127.0.0.1:{port}", "--connect-timeout", "2000",
                     "--no-auto-discovery", *extra],
                    cwd=REPO, stdout=sink, stderr=sink,
                    # SIGINT stops it whatever pytest's disposition (its test sends one).
                    preexec_fn=default_sigint,  # noqa: PLW1509 (it only sets a disposition)
                )  # fmt: skip
            processes.append(process)
            wait_for(lambda: _held(pg18), "the exporter's first query to be held")
            return process, port, log

        try:
            yield launch
        finally:
            for process in processes:
                terminate(process)
    # The proxy cut its connections as it stopped: the next test starts with none held.
    wait_for(lambda: not _held(pg18), "the exporter's backends to end")


def _wait_for_line(log: Path, text: str) -> None:
    wait_for(lambda: text in log.read_text(), repr(text))


def _listening(port: int) -> bool:
    return http_get(f"http://127.0.0.1:{port}/version")[0] == 200


def test_sighup_while_the_first_preflight_is_held_waits_until_serving(held_start: object) -> None:
    """SIGHUP during the held first preflight: the process lives on, serves once the
    first contact gives up, and then reloads."""
    assert callable(held_start)
    process, port, log = held_start()
    assert not _listening(port)  # still starting
    process.send_signal(signal.SIGHUP)
    wait_for(lambda: _listening(port), "the exporter to serve after SIGHUP", within=40)
    text = log.read_text()
    assert process.poll() is None, text
    assert "SIGHUP while starting: the config is read again once it serves" in text
    _wait_for_line(log, "reloading for the SIGHUP that came while starting")
    assert terminate(process) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_while_the_first_preflight_is_held_stops_at_once(
    held_start: object, sig: signal.Signals
) -> None:
    """SIGTERM or SIGINT during the held first preflight: a clean exit (0) at once,
    without waiting for the server that never answers."""
    assert callable(held_start)
    process, port, log = held_start()
    assert not _listening(port)
    started = time.monotonic()
    process.send_signal(sig)
    code = process.wait(timeout=30)
    took = time.monotonic() - started
    assert code == 0, log.read_text()
    assert took < PROMPT_EXIT, log.read_text()
    assert "stopping before serving" in log.read_text()


def test_explain_held_by_its_preflight_survives_reload_signals_and_stops_on_sigterm(
    held_start: object,
) -> None:
    """--explain waits for the held preflight outside the served event loop: SIGHUP and
    SIGUSR1 are logged and ignored there, SIGTERM ends the process with 0 at once."""
    assert callable(held_start)
    process, _, log = held_start("--explain")
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        process.send_signal(sig)
        _wait_for_line(log, f"{sig.name} while starting: the config is read again once it serves")
    assert process.poll() is None
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=30)
    assert code == 0, log.read_text()
    assert time.monotonic() - started < PROMPT_EXIT
