"""sd_notify: readiness, stop and watchdog messages observed on a real notify socket."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter import systemd
from rigs.localpg import free_port

REPO = Path(__file__).resolve().parents[1]
DEADLINE = 30.0  # seconds; generous for a busy CI machine


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket bound to a file, named by $NOTIFY_SOCKET."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(DEADLINE)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def test_ready_reaches_a_filesystem_socket(notify_socket: socket.socket) -> None:
    """ready() sends READY=1 to the socket path in $NOTIFY_SOCKET and reports success."""
    assert systemd.ready() is True
    assert notify_socket.recv(4096) == b"READY=1"


def test_stopping_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """'@name' in $NOTIFY_SOCKET addresses the abstract namespace, as systemd means it."""
    name = f"pg-exporter-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(DEADLINE)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.stopping() is True
        assert sock.recv(4096) == b"STOPPING=1"


@pytest.mark.parametrize("value", [None, "", "vsock:2:1234", "relative/path", "@"])
def test_notify_without_a_usable_socket_is_a_quiet_no_op(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    """Outside systemd, or with an address we do not speak, notify() returns False."""
    if value is None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    else:
        monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert systemd.notify("READY=1") is False


def test_notify_to_a_vanished_socket_returns_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket path with nobody behind it is reported, never raised."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert systemd.notify("WATCHDOG=1") is False


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 30.0),
        ("500000", "self", 0.5),
        ("30000000", "1", None),  # meant for another process
        (None, None, None),
        ("0", None, None),
        ("soon", None, None),
    ],
)
def test_watchdog_interval_reads_systemd_variables(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    """WATCHDOG_USEC becomes seconds, only when WATCHDOG_PID is absent or names us."""
    for name, text in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if text is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(os.getpid()) if text == "self" else text)
    assert systemd.watchdog_interval() == expected


async def test_watchdog_loop_pings_at_half_the_interval(notify_socket: socket.socket) -> None:
    """watchdog_loop sends WATCHDOG=1 repeatedly, interval / 2 apart."""
    notify_socket.setblocking(False)
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(systemd.watchdog_loop(1.0))
    try:
        started = time.monotonic()
        pings = [await asyncio.wait_for(loop.sock_recv(notify_socket, 64), DEADLINE)]
        pings += [await asyncio.wait_for(loop.sock_recv(notify_socket, 64), DEADLINE)]
        pings += [await asyncio.wait_for(loop.sock_recv(notify_socket, 64), DEADLINE)]
        elapsed = time.monotonic() - started
    finally:
        task.cancel()
    assert pings == [b"WATCHDOG=1"] * 3
    assert 0.8 <= elapsed < 1.6  # two gaps of 0.5 s; pings a full interval apart would take 2 s


async def test_a_wedged_event_loop_stops_the_pings(notify_socket: socket.socket) -> None:
    """While the event loop is blocked no WATCHDOG=1 leaves, so systemd would restart us."""
    notify_socket.setblocking(False)
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(systemd.watchdog_loop(0.2))
    try:
        assert await asyncio.wait_for(loop.sock_recv(notify_socket, 64), DEADLINE)
        # The wedge under test: block the loop itself for five ping periods.
        time.sleep(0.5)  # noqa: ASYNC251
        with pytest.raises(BlockingIOError):
            notify_socket.recv(64)
        assert await asyncio.wait_for(loop.sock_recv(notify_socket, 64), DEADLINE)
    finally:
        task.cancel()


def _await_message(sock: socket.socket, wanted: bytes) -> None:
    """Read datagrams until ``wanted``; the socket's timeout raises when it never comes."""
    while sock.recv(4096) != wanted:
        pass


def test_the_exporter_notifies_ready_watchdog_and_stopping(
    notify_socket: socket.socket, tmp_path: Path
) -> None:
    """Serving: READY=1 once it listens, WATCHDOG=1 pings, STOPPING=1 and exit 0 on SIGTERM."""
    port = free_port()
    env = {
        **os.environ,
        "NOTIFY_SOCKET": notify_socket.getsockname(),
        "WATCHDOG_USEC": "400000",
    }
    env.pop("WATCHDOG_PID", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--url", "postgresql://127.0.0.1:1/none",
         "--config", str(REPO / "collectors"), f"--web.listen-address=127.0.0.1:{port}"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _await_message(notify_socket, b"READY=1")
        # Ready means listening: the port accepts at once, with no retry.
        socket.create_connection(("127.0.0.1", port), timeout=DEADLINE).close()
        _await_message(notify_socket, b"WATCHDOG=1")
        process.send_signal(signal.SIGTERM)
        _await_message(notify_socket, b"STOPPING=1")
        assert process.wait(DEADLINE) == 0
    finally:
        process.kill()
        _, stderr = process.communicate()
    assert b"Traceback" not in stderr, stderr.decode()
