"""Reading the small files an operator names: secrets, configs, certificates.

A path can name something that is not a file: a FIFO (opening it for reading
waits for a writer, forever), a device that never ends (/dev/zero), a socket.
Every such read goes through :func:`read_regular`: the file is opened without
blocking, checked to be a regular file on the descriptor itself (so it cannot be
swapped between the check and the read), and read up to a limit.
"""

from __future__ import annotations

import errno
import os
import stat

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFREG: "a regular file",
}


def kind_of_mode(mode: int) -> str:
    """What a file of this ``st_mode`` is, in a few words ("a FIFO", "a directory")."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


class FileRefused(OSError):
    """The path cannot be read as a small regular file; ``str()`` says why, in a few words."""

    def __init__(self, reason: str, *, missing: bool = False, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.missing = missing
        self.too_large = too_large

    def __str__(self) -> str:
        return self.reason


def read_regular(path: str, limit: int) -> str:
    """The UTF-8 text of the regular file ``path``, which holds at most ``limit`` bytes.

    FileRefused (never quoting the content) when it is missing, unreadable, not a
    regular file, larger than ``limit`` or not UTF-8. Never blocks on a FIFO.
    """
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise FileRefused(reason, missing=isinstance(exc, FileNotFoundError)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = kind_of_mode(mode)
            raise FileRefused(f"it is {kind}, not a regular file; give the path of a file")
        data = _read_at_most(fd, limit + 1)
    except FileRefused:
        raise
    except OSError as exc:
        raise FileRefused(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileRefused(f"it holds more than {limit} bytes", too_large=True)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileRefused("it is not UTF-8 text") from None


def entry_kind(path: str) -> str | None:
    """None when ``path`` is (or links to) a regular file; else why it is not one, in a
    few words. Looks with stat alone and never opens it, so a FIFO cannot block."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return _stat_failure(path, exc)
    if stat.S_ISREG(mode):
        return None
    kind = kind_of_mode(mode)
    link = "a symbolic link to " if os.path.islink(path) else ""
    return f"it is {link}{kind}, not a regular file"


def _stat_failure(path: str, exc: OSError) -> str:
    """Why stat failed, said for what the entry is: a link to nothing, a loop, or else."""
    if exc.errno == errno.ELOOP:
        return "it is a symbolic link in a loop"
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return f"it is a symbolic link to {os.readlink(path)!r}, which does not exist"
    return f"cannot read it: {exc.strerror or type(exc).__name__}"


def _read_at_most(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
