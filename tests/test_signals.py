"""Signals taken by a thread of their own from the first instant (issue 29): real signals
to small Python processes whose main thread is busy, blocked in a system call or
running a wedged event loop, started with SIGINT's default action or with it ignored
(issue 36); the exporter signalled while its modules are still being imported, and
``--explain`` waiting for a login; the reload hand-over in this process. The exporter
signalled while its first contact is held is in tests/integration/test_early_signals.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.signals import EXIT_DEADLINE, Signals
from rigs.localpg import free_port
from tests.fixtures.dispositions import default_sigint, ignored_sigint
from tests.fixtures.helpers import COLLECTORS, terminate
from tests.fixtures.polling import wait_for

REPO = Path(__file__).resolve().parents[1]
MARGIN = 10.0  # seconds beyond a deadline, for a busy shared machine
DEADLINE = 30.0  # seconds for a condition to come about

_PRELUDE = """
import asyncio, os, sys, time
from exporter.config.logs import configure_logging
from exporter import signals
configure_logging("info", "logfmt")
"""


def _start(body: str, dispositions: Callable[[], None] = default_sigint) -> subprocess.Popen[str]:
    """``body`` in a Python process (after the prelude) started with ``dispositions``;
    returns once it printed 'ready'."""
    process = subprocess.Popen(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=dispositions,  # noqa: PLW1509 (it only sets a disposition before exec)
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", process.stderr
    return process


def _ended(process: subprocess.Popen[str], sig: signal.Signals) -> tuple[int, float, str]:
    """Send ``sig``: the exit code, the seconds until it ended and what it logged."""
    started = time.monotonic()
    process.send_signal(sig)
    try:
        code = process.wait(timeout=EXIT_DEADLINE + MARGIN)
    finally:
        process.kill()
    took = time.monotonic() - started
    assert process.stderr is not None
    return code, took, process.stderr.read()


# Blocked in a system call: the thread releases the GIL, but only a signal the main
# thread takes interrupts the call, and every one of ours goes to the waiter.
_BLOCKED_IN_A_SYSTEM_CALL = """
with signals.SIGNALS.installed():
    readable, _ = os.pipe()
    try:
        print("ready", flush=True)
        os.read(readable, 1)
    except KeyboardInterrupt:  # the signal came before the read
        sys.exit(signals.SIGNALS.exit_code())
"""


def _read_syscall() -> str:
    """This machine's number for read(2), as /proc/TID/syscall shows a thread in it."""
    readable, writable = os.pipe()
    tids: list[int] = []

    def read() -> None:
        tids.append(threading.get_native_id())
        os.read(readable, 1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            if tids and (state := _syscall(os.getpid(), tids[0])) is not None:
                return state
            time.sleep(0.01)  # polling a condition with a deadline
        raise AssertionError("the reader thread never blocked in read(2)")
    finally:
        os.write(writable, b"x")
        reader.join()
        os.close(readable)
        os.close(writable)


def _syscall(pid: int, tid: int) -> str | None:
    """The system call thread ``tid`` of ``pid`` is blocked in, or None when it runs."""
    with open(f"/proc/{pid}/task/{tid}/syscall", encoding="ascii") as f:
        fields = f.read().split()
    return fields[0] if fields and fields[0] not in ("running", "-1") else None


def _blocked(process: subprocess.Popen[str]) -> subprocess.Popen[str]:
    """Once the process's main thread waits in read(2): the signal finds it there."""
    number = _read_syscall()
    deadline = time.monotonic() + DEADLINE
    while _syscall(process.pid, process.pid) != number:
        assert time.monotonic() < deadline, "the main thread never blocked in read(2)"
        time.sleep(0.01)  # polling a condition with a deadline
    return process


def test_reload_signals_while_starting_are_logged_not_fatal() -> None:
    """SIGHUP and SIGUSR1 before the exporter serves are logged and the process lives
    on (the default action would end it); SIGTERM then ends it with 0."""
    process = _blocked(_start(_BLOCKED_IN_A_SYSTEM_CALL))
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        process.send_signal(sig)
    code, _, log = _ended(process, signal.SIGTERM)  # taken after the two, in order
    assert code == 0, log
    assert "SIGHUP while starting: the config is read again once it serves" in log
    assert "SIGUSR1 while starting: the config is read again once it serves" in log


def test_sigterm_ends_a_start_held_in_a_system_call() -> None:
    """SIGTERM while the main thread waits in a system call nothing interrupts: the
    process ends with 0 within EXIT_DEADLINE, saying why."""
    code, took, log = _ended(_blocked(_start(_BLOCKED_IN_A_SYSTEM_CALL)), signal.SIGTERM)
    assert code == 0, log
    assert took < EXIT_DEADLINE + MARGIN
    assert "SIGTERM while starting: stopping" in log
    assert "still stopping after 3s" in log


_BUSY = """
with signals.SIGNALS.installed():
    try:
        print("ready", flush=True)
        while True:
            sum(range(1000))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(signals.SIGNALS.exit_code())
"""


@pytest.mark.parametrize(
    ("sig", "code", "dispositions"),
    [(signal.SIGTERM, 0, default_sigint), (signal.SIGINT, 130, default_sigint),
     (signal.SIGTERM, 0, ignored_sigint)],
    ids=["SIGTERM", "SIGINT", "SIGTERM-with-SIGINT-ignored"],
)  # fmt: skip
def test_a_stop_signal_interrupts_a_busy_start(
    sig: signal.Signals, code: int, dispositions: Callable[[], None]
) -> None:
    """SIGTERM or SIGINT while the main thread runs Python: KeyboardInterrupt there at
    once, and the exit code a supervisor or a shell expects; SIGTERM does so too in a
    process started with SIGINT ignored (it once waited EXIT_DEADLINE there, issue 36)."""
    got, took, log = _ended(_start(_BUSY, dispositions), sig)
    assert (got, "interrupted" in log) == (code, True), log
    assert took < EXIT_DEADLINE  # the interruption, not the deadline, ended it
    assert "still stopping after" not in log


def test_an_inherited_ignored_sigint_stays_ignored() -> None:
    """Started with SIGINT ignored (a background job of a script), SIGINT is not taken:
    the process goes on and hears the signals after it; SIGTERM ends it with 0."""
    process = _start(_BUSY, ignored_sigint)
    # Taken in order of their numbers when pending together: SIGINT (2), if it were
    # taken, would be acted on before SIGUSR1 (10) and SIGTERM (15).
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGUSR1)
    code, _, log = _ended(process, signal.SIGTERM)
    assert code == 0, log
    assert "SIGUSR1 while starting: the config is read again once it serves" in log
    assert "SIGINT" not in log
    assert "interrupted" in log  # by SIGTERM, at once


def test_sigterm_ends_a_wedged_event_loop_within_the_stop_deadline() -> None:
    """Attached to an event loop that never turns again (its thread blocked in a call),
    SIGTERM still ends the process with 0, STOP_DEADLINE later."""
    wedged = """
    signals.STOP_DEADLINE = 0.5
    async def main():
        with signals.SIGNALS.attached(asyncio.get_running_loop(), lambda: None):
            print("ready", flush=True)
            time.sleep(3600)  # the loop's own thread, blocked
    with signals.SIGNALS.installed():
        asyncio.run(main())
    """
    code, took, log = _ended(_start(wedged), signal.SIGTERM)
    assert code == 0, log
    assert took < 0.5 + MARGIN
    assert "still stopping after 0.5s (a blocked thread); exiting now" in log


# --- the exporter, signalled while its modules are imported ------------------------------

# SIGHUP at the instant the exporter imports its first layer (config), sent by the
# process to itself from an audit hook: the moment is exact, not a race with a timer.
# The two entries: ``python -m exporter``, and the console script's and the packaged
# launcher's ``from exporter.cli import main``.
_SIGHUP_AT_FIRST_LAYER = """
import os, runpy, signal, sys
sent = []
def hook(event, args):
    if event == "import" and str(args[0]).startswith("exporter.config") and not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGHUP)
sys.addaudithook(hook)
sys.argv[1:] = {argv!r}
"""
_ENTRIES = {
    "python -m exporter": "runpy.run_module('exporter', run_name='__main__', alter_sys=True)",
    "console script": "from exporter.cli import main\nsys.exit(main())",
}


@pytest.mark.parametrize("entry", list(_ENTRIES))
def test_sighup_while_the_exporter_imports_its_modules_reloads_once_serving(
    entry: str, tmp_path: Path
) -> None:
    """SIGHUP while the exporter's layers are still being imported (the first ~200 ms
    after exec) does not end the process (it once did, with 129): it stays pending
    until the signals' thread takes it, and the exporter reloads once it serves."""
    argv = ["-u", f"postgresql://nobody@127.0.0.1:{free_port()}/postgres", "-c", str(COLLECTORS),
            "--web.listen-address", "127.0.0.1:0", "--no-auto-discovery"]  # fmt: skip
    log = tmp_path / "exporter.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", _SIGHUP_AT_FIRST_LAYER.format(argv=argv) + _ENTRIES[entry]],
            cwd=REPO, stdout=sink, stderr=sink,
            preexec_fn=default_sigint,  # noqa: PLW1509 (it only sets a disposition before exec)
        )  # fmt: skip
    try:
        wait_for(
            lambda: process.poll() is not None or "reloading for the SIGHUP" in log.read_text(),
            "the exporter to serve and reload, or end", within=DEADLINE,
        )  # fmt: skip
        assert process.poll() is None, f"ended with {process.returncode}: {log.read_text()}"
        assert "reloading for the SIGHUP that came while starting" in log.read_text()
    finally:
        code = terminate(process)
    assert code == 0, log.read_text()


@pytest.mark.parametrize(
    "dispositions", [default_sigint, ignored_sigint], ids=["SIGINT-default", "SIGINT-ignored"]
)
def test_sigterm_stops_explain_waiting_for_a_login_at_once(
    dispositions: Callable[[], None], tmp_path: Path
) -> None:
    """--explain waiting for a server that accepts and never answers stops on SIGTERM at
    once (0.2 s here), with SIGINT's default action or ignored: started with SIGINT
    ignored, the main thread could not be interrupted and the exit EXIT_DEADLINE later
    ended it (issue 36, finding 7)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(DEADLINE)
        url = f"postgresql://nobody@127.0.0.1:{listener.getsockname()[1]}/postgres?sslmode=disable"
        log = tmp_path / "explain.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "exporter", "--explain", "-u", url, "-c", str(COLLECTORS),
                 "--connect-timeout", "60000"],
                cwd=REPO, stdout=sink, stderr=sink,
                preexec_fn=dispositions,  # noqa: PLW1509 (it only sets a disposition before exec)
            )  # fmt: skip
        try:
            connection, _ = listener.accept()  # it waits for the server's first byte now
        except TimeoutError:
            process.kill()
            raise
        with connection:
            started = time.monotonic()
            code = terminate(process, within=EXIT_DEADLINE + MARGIN)
            took = time.monotonic() - started
    text = log.read_text()
    assert code == 0, text
    assert "still stopping after" not in text  # the interruption, not the deadline
    assert took < EXIT_DEADLINE, text


# --- the hand-over, in this process (no signal is sent) -----------------------------------


async def test_a_reload_that_came_while_starting_runs_once_serving() -> None:
    """A reload signal before serving is kept; serving() runs it once, and later ones go
    straight to the loop."""
    signals, reloads = Signals(), list[str]()
    loop = asyncio.get_running_loop()
    signals.deliver(signal.SIGHUP)  # before the loop is attached
    with signals.attached(loop, lambda: None):
        signals.deliver(signal.SIGUSR1)  # attached, not serving yet
        assert reloads == []
        signals.serving(lambda: reloads.append("now"))
        assert reloads == ["now"]  # one reload for both
        signals.deliver(signal.SIGHUP)
        await asyncio.sleep(0)  # the loop runs what the waiter scheduled
        assert reloads == ["now", "now"]
    signals.deliver(signal.SIGHUP)  # detached again: kept, not run
    assert signals.pending_reload is signal.SIGHUP


def test_installing_blocks_the_signals_and_uninstalling_restores_the_mask() -> None:
    """While installed the four are blocked in the main thread (a waiter takes them);
    afterwards the mask is what it was and the waiter has ended."""
    signals = Signals()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with signals.installed():
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1} <= blocked
        with signals.installed():  # again: nothing changes
            pass
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == blocked
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    assert signals._waiter is None
