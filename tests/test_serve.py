"""The process layer without PostgreSQL: signals (reload on SIGHUP and SIGUSR1, stop on
SIGINT), the exit codes of a start that cannot go on, first contact, and the helpers
that name what it listens on. Nothing listens on port 1, so every target is refused at
once; a pass against a live server, and SIGTERM during one, are in tests/reliability/.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import queue
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from exporter import serve
from exporter.collect.exporter import Exporter
from exporter.config.definitions import Definitions
from exporter.config.settings import ListenAddress, Settings
from exporter.config.targetsfile import Declared, DeclaredTarget
from exporter.web.reloading import Reloader, ReloadResult
from exporter.web.webconfig import WebConfig
from tests.fixtures.dispositions import default_sigint

REPO = Path(__file__).resolve().parents[1]
DEADLINE = 30.0  # seconds; generous for a busy machine
NOWHERE = "postgresql://monitor:s3cret@127.0.0.1:1/{}?sslmode=disable"
LOOPBACK_ANY_PORT = (ListenAddress("127.0.0.1", 0),)


def collectors(count: int) -> str:
    return "".join(
        f"pg_c{n}:\n  query: SELECT 1 AS one\n  metrics:\n    - one: {{usage: GAUGE}}\n"
        for n in range(count)
    )


# --- the process, end to end ---------------------------------------------------------------


@dataclass
class Running:
    """``python -m exporter`` with its log lines gathered by a thread."""

    popen: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first log line from now on matching ``pattern``; fails after DEADLINE."""
        deadline = time.monotonic() + DEADLINE
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if found := re.search(pattern, line):
                return found
        raise AssertionError(f"no log line matched {pattern!r}; saw:\n" + "".join(self.seen))


@pytest.fixture
def exporter_process(tmp_path: Path) -> Iterator[tuple[Running, Path]]:
    """A running exporter on a free loopback port, and its collector file."""
    config = tmp_path / "collectors.yml"
    config.write_text(collectors(1))
    popen = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--url", NOWHERE.format("postgres"),
         "--config", str(config), "--web.listen-address=127.0.0.1:0"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint,  # noqa: PLW1509 (the test stops it with SIGINT)
    )  # fmt: skip
    running = Running(popen)
    assert popen.stderr is not None

    def gather() -> None:
        for line in popen.stderr or ():
            running.lines.put(line)

    reader = threading.Thread(target=gather)
    reader.start()
    try:
        yield running, config
    finally:
        popen.kill()
        popen.wait(DEADLINE)
        reader.join(DEADLINE)


def _get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=DEADLINE) as response:
        return response.status, response.read().decode()


def test_signals_reload_and_stop_the_process(exporter_process: tuple[Running, Path]) -> None:
    """Listening on port 0 logs the port chosen; SIGHUP and SIGUSR1 each reload a changed
    config (as /reload does); SIGINT ends the process with 0; no password is logged."""
    running, config = exporter_process
    port = int(running.wait_for(r"msg=listening address=127\.0\.0\.1:(\d+)")[1])
    # Answered, so it serves: reload signals go to the event loop from now on (before,
    # they were kept for this moment; tests/test_signals.py).
    status, body = _get(port, "/metrics")
    assert status == 200
    assert "\npg_up 0.0\n" in body
    for count, sig in ((2, signal.SIGHUP), (3, signal.SIGUSR1)):
        config.write_text(collectors(count))
        running.popen.send_signal(sig)
        running.wait_for(f"reloaded {count} collectors from {re.escape(str(config))}")
    running.popen.send_signal(signal.SIGINT)
    running.wait_for('msg="shutting down"')
    assert running.popen.wait(DEADLINE) == 0
    assert not any("s3cret" in line or "Traceback" in line for line in running.seen)


def test_exit_within_ends_a_process_a_thread_keeps(tmp_path: Path) -> None:
    """exit_within ends the process with its code even while the main thread is blocked
    for good, saying why first."""
    code = (
        "import threading\n"
        "from exporter.config.logs import configure_logging\n"
        "from exporter.serve import exit_within\n"
        "configure_logging('info', 'logfmt')\n"
        "exit_within(0.2, 7)\n"
        "threading.Event().wait()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 7
    assert "still stopping after 0.2s (a blocked thread); exiting now" in done.stderr


# --- starts that cannot go on, in this process ---------------------------------------------


def _settings(**fields: object) -> Settings:
    given: dict[str, object] = {
        "url": NOWHERE.format("postgres"),
        "connect_timeout": 0.1,
        "auto_discovery": False,
        "listen_addresses": LOOPBACK_ANY_PORT,
        **fields,
    }
    return Settings(**given)  # type: ignore[arg-type]


async def _serve(
    settings: Settings, definitions: Definitions, web_config: WebConfig, declared: Declared | None
) -> int:
    """serve._serve under a deadline: one that goes on serving by mistake fails the test
    (it would wait for a signal for good)."""
    async with asyncio.timeout(DEADLINE):
        return await serve._serve(settings, definitions, web_config, declared)


async def test_fail_fast_and_an_unreachable_target_exit_2(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--fail-fast with the target refusing: exit code 2 before listening, the error
    naming the target by its masked URL."""
    caplog.set_level(logging.INFO, logger=serve.__name__)
    code = await _serve(_settings(fail_fast=True), Definitions(()), WebConfig(), None)
    assert code == 2
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage().startswith("target unreachable and --fail-fast is set")
    assert (
        error.__dict__["url"] == "postgresql://monitor:xxxxx@127.0.0.1:1/postgres?sslmode=disable"
    )
    assert not [r for r in caplog.records if r.getMessage() == "listening"]


async def test_fail_fast_in_a_fleet_contacts_every_target(caplog: pytest.LogCaptureFixture) -> None:
    """A fleet with --fail-fast contacts each declared target at start, and exits 2
    when one is unreachable."""
    caplog.set_level(logging.INFO, logger=serve.__name__)
    targets = tuple(
        DeclaredTarget(name, Settings(url=NOWHERE.format(name), connect_timeout=0.1))
        for name in ("one", "two")
    )
    declared = Declared("/etc/pg_exporter/targets.yml", targets)
    settings = _settings(fail_fast=True)
    assert await _serve(settings, Definitions(()), WebConfig(), declared) == 2
    urls = {r.__dict__["url"] for r in caplog.records if r.levelno == logging.ERROR}
    assert urls == {
        "postgresql://monitor:xxxxx@127.0.0.1:1/one?sslmode=disable",
        "postgresql://monitor:xxxxx@127.0.0.1:1/two?sslmode=disable",
    }


async def test_a_port_taken_exits_1(caplog: pytest.LogCaptureFixture) -> None:
    """Without --fail-fast an unreachable target is only a warning; a listen address
    already in use is exit code 1, said in one line."""
    caplog.set_level(logging.INFO, logger=serve.__name__)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = _settings(listen_addresses=(ListenAddress("127.0.0.1", port),))
        assert await _serve(settings, Definitions(()), WebConfig(), None) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("target unreachable at start, will retry") for m in messages)
    assert any(m.startswith("cannot listen: ") for m in messages)


async def test_systemd_socket_without_sockets_exits_1(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--web.systemd-socket when systemd passed none: exit 1 naming $LISTEN_FDS."""
    monkeypatch.delenv("LISTEN_FDS", raising=False)
    monkeypatch.delenv("LISTEN_PID", raising=False)
    settings = _settings(systemd_socket=True)
    assert await _serve(settings, Definitions(()), WebConfig(), None) == 1
    assert any("systemd passed no socket ($LISTEN_FDS)" in r.getMessage() for r in caplog.records)


# --- first contact -------------------------------------------------------------------------


@dataclass
class Contacted:
    """A stand-in for Exporter.main: records how many prepare() at once."""

    gate: asyncio.Event
    state: dict[str, int]

    async def prepare(self) -> None:
        self.state["now"] += 1
        self.state["most"] = max(self.state["most"], self.state["now"])
        try:
            await self.gate.wait()
        finally:
            self.state["now"] -= 1


async def test_first_contact_goes_a_few_targets_at_a_time() -> None:
    """At start a fleet's targets are contacted at most FIRST_CONTACTS_AT_ONCE at once."""
    gate, state = asyncio.Event(), {"now": 0, "most": 0}

    @dataclass
    class Stub:
        main: Contacted

    settings = _settings()
    exporters: list[tuple[str | None, Settings, Exporter]] = [
        (f"t{n}", settings, cast(Exporter, Stub(Contacted(gate, state)))) for n in range(20)
    ]
    contact = asyncio.create_task(serve._first_contact(exporters, fail_fast=True))
    async with asyncio.timeout(DEADLINE):
        while True:
            if state["now"] >= serve.FIRST_CONTACTS_AT_ONCE:
                break
            await asyncio.sleep(0)
    for _ in range(10):  # give any contact beyond the ceiling the chance to start
        await asyncio.sleep(0)
    gate.set()
    assert await contact
    assert state["most"] == serve.FIRST_CONTACTS_AT_ONCE


async def test_a_refused_target_stops_the_start_only_with_fail_fast() -> None:
    """First contact with a refusing target: go on without --fail-fast, stop with it."""
    settings = _settings()
    exporter = Exporter(settings, Definitions(()))
    try:
        assert await serve._first_contact([(None, settings, exporter)], fail_fast=False)
        assert not await serve._first_contact([(None, settings, exporter)], fail_fast=True)
    finally:
        await exporter.close()


async def test_a_stop_during_the_first_contact_abandons_it() -> None:
    """A stop signal while the first contact waits on a server that never answers: it
    is abandoned at once (None), not awaited; without one the contact's outcome counts."""
    stop, hanging = asyncio.Event(), asyncio.Event()

    async def never() -> bool:
        await hanging.wait()
        return True

    work = asyncio.ensure_future(never())
    asyncio.get_running_loop().call_soon(stop.set)
    async with asyncio.timeout(DEADLINE):
        assert await serve._unless_stopped(work, stop) is None
    assert work.cancelled()

    async def answers() -> bool:
        return False

    assert await serve._unless_stopped(answers(), asyncio.Event()) is False


# --- small helpers -------------------------------------------------------------------------


async def test_a_signalled_reload_is_kept_until_it_ends() -> None:
    """A reload started by a signal is referenced until done (a task nobody holds may be
    collected mid-way), then forgotten."""
    release = asyncio.Event()

    class SlowReloader:
        async def reload(self) -> ReloadResult:
            await release.wait()
            return ReloadResult(True, "done")

    tasks: set[asyncio.Task[ReloadResult]] = set()
    serve._reload_soon(cast(Reloader, SlowReloader()), tasks)
    (task,) = tasks
    release.set()
    assert await task == ReloadResult(True, "done")
    await asyncio.sleep(0)  # done callbacks run on the loop's next turn
    assert tasks == set()


def test_port_zero_is_logged_with_the_ports_chosen() -> None:
    """Port 0 becomes the ports the system chose (a launcher reads them from the log);
    a fixed port is logged as given."""
    wildcard = ListenAddress(None, 0)
    names = {("0.0.0.0", 41000), ("::", 41000, 0, 0), ("0.0.0.0", 41001), "/run/x.sock"}
    assert serve._bound(wildcard, names) == [ListenAddress(None, 41000), ListenAddress(None, 41001)]
    fixed = ListenAddress("127.0.0.1", 9630)
    assert serve._bound(fixed, {("127.0.0.1", 9630)}) == [fixed]


def test_socket_names_read_as_addresses(tmp_path: Path) -> None:
    """A TCP socket is named host:port, a Unix socket by its path."""
    with socket.socket() as tcp:
        tcp.bind(("127.0.0.1", 0))
        assert serve._name(tcp) == f"127.0.0.1:{tcp.getsockname()[1]}"
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(path))
        assert serve._name(unix) == str(path)


def test_the_open_files_limit_is_raised_to_the_hard_one() -> None:
    """The soft limit of open files goes up to the hard limit, as Go programs do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        serve._raise_fd_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_young_generation_collections_are_spaced_out_never_made_closer_nor_turned_on() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        serve._space_young_collections()
        assert gc.get_threshold() == (serve.YOUNG_COLLECTION_THRESHOLD, 10, 10)
        gc.set_threshold(100_000, 5, 5)  # a larger one chosen for the interpreter stays
        serve._space_young_collections()
        assert gc.get_threshold() == (100_000, 5, 5)
        gc.set_threshold(0)  # 0: cycle collection is off, and stays off
        serve._space_young_collections()
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)
