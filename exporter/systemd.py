"""systemd's notify protocol (``sd_notify``) without a dependency: readiness, stop, watchdog.

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``, a datagram socket to
which the service sends ``READY=1`` once it serves, ``STOPPING=1`` when it
begins to shut down and, with ``WatchdogSec=``, ``WATCHDOG=1`` more often than
``$WATCHDOG_USEC``. Outside systemd the variable is absent and every call here
is a cheap no-op that returns False.
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
