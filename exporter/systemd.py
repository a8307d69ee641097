"""systemd's notify protocol (``sd_notify``) and socket activation, without a dependency.

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``, a datagram socket to
which the service sends ``READY=1`` once it serves, ``STOPPING=1`` when it
begins to shut down and, with ``WatchdogSec=``, ``WATCHDOG=1`` more often than
``$WATCHDOG_USEC``. Outside systemd the variable is absent and every call here
is a cheap no-op that returns False.

Socket activation (``sd_listen_fds``): a ``.socket`` unit listens for us and
passes the sockets as file descriptors 3, 4, … with ``$LISTEN_FDS`` (their
count) and ``$LISTEN_PID`` (the process they are meant for).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(message: str) -> bool:
    """Send one notification to ``$NOTIFY_SOCKET``; False when unset or undeliverable."""
    address = _socket_address(os.environ.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            # Never block the event loop: a full queue drops this message, and the
            # next watchdog ping comes soon enough.
            sock.setblocking(False)
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.debug("sd_notify %r to %r failed: %s", message, address, exc)
        return False
    return True


def _socket_address(value: str) -> bytes | None:
    """A filesystem path as is; ``@name`` is the abstract namespace; anything else unsupported."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + os.fsencode(value[1:])
    if value.startswith("/"):
        return os.fsencode(value)
    return None  # unset, or a vsock address, which a service on a host is never given


def ready() -> bool:
    """Tell systemd the exporter is listening."""
    return notify("READY=1")


def stopping() -> bool:
    """Tell systemd the exporter has begun to shut down."""
    return notify("STOPPING=1")


def watchdog_interval() -> float | None:
    """Seconds within which systemd expects a ping, or None when it expects none of us."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None  # the watchdog belongs to another process (our parent, say)
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1_000_000 if value > 0 else None


async def watchdog_loop(interval: float) -> None:
    """Ping the watchdog every ``interval / 2`` seconds until cancelled.

    The pings come from the event loop itself, not a thread: when the loop is
    wedged they stop, and systemd restarts the exporter.
    """
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval / 2)


LISTEN_FDS_START = 3


def listen_sockets() -> list[socket.socket]:
    """The sockets systemd passed to this process; empty when it passed none to us.

    The variables are removed so that no child process takes the sockets as its own.
    """
    pid = os.environ.pop("LISTEN_PID", "")
    count = os.environ.pop("LISTEN_FDS", "")
    os.environ.pop("LISTEN_FDNAMES", None)
    if pid != str(os.getpid()) or not count.isdigit():
        return []
    sockets = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + int(count)):
        os.set_inheritable(fd, False)
        sockets.append(socket.socket(fileno=fd))
    return sockets
