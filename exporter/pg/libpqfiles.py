"""The files libpq opens for a connection, examined off the event loop first (issue 29).

libpq opens files of its own when it connects, and again for every cancel request
(``PQcancelCreate`` reads the passfile anew): the passfile (``passfile``,
``$PGPASSFILE``, ``~/.pgpass``) and, when TLS may be used, the root certificates,
revocation lists, client certificate and key (``sslrootcert``, ``sslcrl``,
``sslcrldir``, ``sslcert``, ``sslkey``, their variables, ``~/.postgresql/``) and the
TLS key log (``sslkeylogfile``). It does so on the thread that connects, the event
loop's, holding the GIL: a FIFO there (libpq 18 opens the passfile before it looks at
what it is) or a file on a network mount that stopped answering froze every request,
the health probe and the signal handlers with it.

So each file libpq would open is found as libpq finds it, examined in a thread of its
own within :data:`CHECK_LIMIT`, and libpq is handed a path that cannot block:

- a regular file's content is copied into an anonymous in-memory file (a memfd, mode
  0600) and libpq opens that, as ``/proc/self/fd/N``: never a FIFO, a device or a
  network file, neither now nor for a cancel hours later, whatever replaces the
  original meanwhile;
- a file that is missing (or that libpq could not open either) becomes a path that
  can never exist, ``/proc/self/fd/absent-KEYWORD``;
- anything else (a FIFO, a device, a socket, a directory) refuses the connection with
  :class:`LibpqFileRefused`, which names the parameter, where it was set and the path.

libpq's rules on modes are kept: a passfile that group or others may read is ignored
with a warning, such a key file is refused. The revocation-list directory and the key
log cannot be copied; they are held open and handed over by descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import pwd
import re
import stat
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from exporter.config.files import kind_of_mode

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[tuple[object, ...]]

#: Seconds the files of one connection may take to examine (a stat on a dead network
#: mount never returns); the connection is then refused, naming the file.
CHECK_LIMIT = 5.0
#: Examinations whose thread has not returned, beyond which none is started (one stuck
#: on a dead mount holds its thread for good).
MOST_RUNNING = 32
#: Largest file copied (certificate chains and revocation lists included).
MOST_BYTES = 4 << 20
#: Most entries of a revocation-list directory examined.
MOST_ENTRIES = 10_000

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_HANDED = re.compile(r"/proc/self/fd/(?:absent-[a-z]+|\d+)")
_CRL_NAME = re.compile(r"[0-9a-f]{8}\.r[0-9]+")  # what OpenSSL opens in a hashed directory
_BY_DESCRIPTOR = os.path.isdir("/proc/self/fd") and hasattr(os, "memfd_create")


class Kind(enum.Enum):
    """How libpq uses a file."""

    PASSFILE = "passfile"  # read; ignored when group or others may read it
    READ = "read"  # read whole: certificates, revocation lists
    KEY = "key"  # read; refused when group or others may read it
    DIRECTORY = "directory"  # revocation lists, opened by hash name when needed
    APPEND = "append"  # written, created when missing: the TLS key log


@dataclass(frozen=True, slots=True)
class Parameter:
    """A connection parameter naming a file: its variable and its default in the home."""

    keyword: str
    envvar: str | None
    default: str | None
    kind: Kind
    tls: bool = True


PARAMETERS = (
    Parameter("passfile", "PGPASSFILE", ".pgpass", Kind.PASSFILE, tls=False),
    Parameter("sslrootcert", "PGSSLROOTCERT", ".postgresql/root.crt", Kind.READ),
    Parameter("sslcrl", "PGSSLCRL", ".postgresql/root.crl", Kind.READ),
    Parameter("sslcrldir", "PGSSLCRLDIR", None, Kind.DIRECTORY),
    Parameter("sslcert", "PGSSLCERT", ".postgresql/postgresql.crt", Kind.READ),
    Parameter("sslkey", "PGSSLKEY", ".postgresql/postgresql.key", Kind.KEY),
    Parameter("sslkeylogfile", None, None, Kind.APPEND),
)


@dataclass(frozen=True, slots=True)
class Wanted:
    """A file libpq would open: the parameter, the path and where the path was set."""

    keyword: str
    path: str
    source: str
    kind: Kind

    def __str__(self) -> str:
        return f"libpq's {self.keyword} {self.path!r} ({self.source})"


class LibpqFileRefused(psycopg.OperationalError):
    """Not connecting: a file libpq would open is not one it can open without blocking."""


@dataclass(frozen=True, slots=True)
class _Given:
    """A connection's parameters as libpq reads them: the parameter, else its variable."""

    params: Mapping[str, str]
    environ: Mapping[str, str]

    def get(self, keyword: str, envvar: str | None = None) -> tuple[str, str]:
        """The value and where it was set; ("", "") when unset."""
        if keyword in self.params:
            return self.params[keyword], f"{keyword}= in the URL"
        if envvar is not None and envvar in self.environ:
            return self.environ[envvar], f"${envvar}"
        return "", ""

    def value(self, keyword: str, envvar: str | None = None) -> str:
        return self.get(keyword, envvar)[0]


def plan(params: Mapping[str, str], environ: Mapping[str, str], home: str | None) -> list[Wanted]:
    """The files libpq would open for a connection with ``params``, found as libpq finds
    them: the parameter, else its variable, else the default under ``home``."""
    given = _Given(params, environ)
    wanted = []
    for parameter in PARAMETERS:
        value, source = given.get(parameter.keyword, parameter.envvar)
        if _unopened(parameter, value, given):
            continue
        if not value and parameter.default is not None and home:
            value = os.path.join(home, parameter.default)
            source = f"the default ~/{parameter.default}"
        if value:
            wanted.append(Wanted(parameter.keyword, value, source, parameter.kind))
    return wanted


def _unopened(parameter: Parameter, value: str, given: _Given) -> bool:
    """True when libpq does not open this parameter's file, whatever it names."""
    if parameter.tls and (given.value("sslmode", "PGSSLMODE") or "prefer") == "disable":
        return True
    keyword = parameter.keyword
    if keyword == "passfile":
        return bool(given.value("password", "PGPASSWORD"))  # a password needs no passfile
    if keyword == "sslrootcert":
        return value == "system"  # OpenSSL's own store
    if keyword == "sslcrl":
        return not value and bool(given.value("sslcrldir", "PGSSLCRLDIR"))
    if keyword in ("sslcert", "sslkey"):
        # A key with a colon names an OpenSSL engine's key, not a file.
        return given.value("sslcertmode", "PGSSLCERTMODE") == "disable" or ":" in value
    return False


def home_directory(environ: Mapping[str, str]) -> str | None:
    """The home directory as libpq finds it: $HOME, else the user database's entry
    (which may ask a network service: only ever called off the event loop)."""
    if home := environ.get("HOME"):
        return home
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return None


# --- examining (blocking: in a thread of its own) ------------------------------------------


class Held:
    """A descriptor libpq is handed as ``/proc/self/fd/N``, closed once nothing holds it."""

    __slots__ = ("__weakref__", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        weakref.finalize(self, os.close, fd)

    @property
    def path(self) -> str:
        return f"/proc/self/fd/{self.fd}"


@dataclass(frozen=True, slots=True)
class Handed:
    """What libpq is given for a file it would open, and what keeps that valid."""

    wanted: Wanted
    value: str
    held: Held | None = None
    warning: str = ""


def absent(wanted: Wanted, warning: str = "") -> Handed:
    """A path that can never exist (nothing can be made under /proc/self/fd): missing
    stays missing, even when a FIFO appears at the original path later."""
    return Handed(wanted, f"/proc/self/fd/absent-{wanted.keyword}", None, warning)


class _Copies:
    """Descriptors by what they hold, so that every connection to one file shares a copy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: weakref.WeakValueDictionary[tuple[int, ...], Held] = (
            weakref.WeakValueDictionary()
        )

    def find(self, key: tuple[int, ...]) -> Held | None:
        with self._lock:
            return self._held.get(key)

    def keep(self, key: tuple[int, ...], fd: int) -> Held:
        held = Held(fd)
        with self._lock:
            self._held[key] = held
        return held


_COPIES = _Copies()


def examine(wanted: Wanted) -> Handed:
    """What to hand libpq instead of ``wanted``; LibpqFileRefused when it is neither
    missing nor what libpq expects. Blocks on a hung file system: never on the loop."""
    try:
        info = os.stat(wanted.path)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and wanted.kind is Kind.APPEND and _BY_DESCRIPTOR:
            return _appended(wanted, create=True)  # libpq would create it
        return absent(wanted)  # missing, or libpq could not open it either
    if not (stat.S_ISDIR if wanted.kind is Kind.DIRECTORY else stat.S_ISREG)(info.st_mode):
        raise _refused(wanted, info.st_mode)
    if not _BY_DESCRIPTOR:
        return Handed(wanted, wanted.path)  # checked; libpq opens it itself
    return _opened(wanted)


def _opened(wanted: Wanted) -> Handed:
    if wanted.kind is Kind.DIRECTORY:
        return _directory(wanted)
    if wanted.kind is Kind.APPEND:
        return _appended(wanted, create=False)
    return _copied(wanted)


def _copied(wanted: Wanted) -> Handed:
    try:
        fd = os.open(wanted.path, _READ)
    except OSError:
        return absent(wanted)
    try:
        info = os.fstat(fd)  # what was opened, whatever the path names by now
        if not stat.S_ISREG(info.st_mode):
            raise _refused(wanted, info.st_mode)
        if (ignored := _loose(wanted, stat.S_IMODE(info.st_mode), info.st_uid)) is not None:
            return ignored
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        held = _COPIES.find(key) or _COPIES.keep(key, _memfd(wanted, _read_all(wanted, fd)))
    finally:
        os.close(fd)
    return Handed(wanted, held.path, held)


def _loose(wanted: Wanted, mode: int, owner: int) -> Handed | None:
    """libpq's rules on who may read a passfile or a key (the copy is 0600 whatever the
    original): such a passfile is ignored, such a key refused."""
    if wanted.kind is Kind.PASSFILE and mode & 0o077:
        return absent(
            wanted,
            f"{wanted} is ignored, as libpq ignores it: group or others may read it "
            f"(mode {mode:04o}); chmod 0600 it",
        )
    if wanted.kind is Kind.KEY and mode & (0o037 if owner == 0 else 0o077):
        raise LibpqFileRefused(
            f"{wanted}: group or others may read it (mode {mode:04o}), and libpq refuses "
            "such a key; chmod 0600 it (0640 if root owns it)"
        )
    return None


def _read_all(wanted: Wanted, fd: int) -> bytes:
    chunks, size = [], 0
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > MOST_BYTES:
            raise LibpqFileRefused(f"{wanted}: it holds more than {MOST_BYTES} bytes")
    return b"".join(chunks)


def _memfd(wanted: Wanted, data: bytes) -> int:
    fd = os.memfd_create(f"pg_exporter {wanted.keyword}", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, 0o600)  # a memfd starts at 0777, which libpq refuses for a passfile
    except BaseException:
        os.close(fd)
        raise
    return fd


def _directory(wanted: Wanted) -> Handed:
    """A revocation-list directory, held open; the entries OpenSSL would open are checked
    now (those added later are not: what remains is in docs/security.md)."""
    try:
        held = Held(os.open(wanted.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError:
        return absent(wanted)
    with os.scandir(held.fd) as entries:
        for count, entry in enumerate(entries):
            if count >= MOST_ENTRIES:
                raise LibpqFileRefused(f"{wanted}: it holds more than {MOST_ENTRIES} entries")
            if not _CRL_NAME.fullmatch(entry.name):
                continue
            with contextlib.suppress(OSError):  # unreadable: OpenSSL skips it as well
                if not stat.S_ISREG(mode := entry.stat().st_mode):
                    raise _refused(wanted, mode, entry.name)
    return Handed(wanted, held.path, held)


def _appended(wanted: Wanted, *, create: bool) -> Handed:
    """The TLS key log: written by libpq, so the file itself is held open, not a copy."""
    try:
        held = Held(os.open(wanted.path, _APPEND | (os.O_CREAT if create else 0), 0o600))
    except OSError:  # a FIFO nobody reads, or not writable: libpq could not write it either
        return absent(wanted)
    if not stat.S_ISREG(mode := os.fstat(held.fd).st_mode):
        raise _refused(wanted, mode)
    return Handed(wanted, held.path, held)


def _refused(wanted: Wanted, mode: int, entry: str = "") -> LibpqFileRefused:
    kind = kind_of_mode(mode)
    expected = "a directory" if wanted.kind is Kind.DIRECTORY and not entry else "a regular file"
    what = f"its entry {entry!r}" if entry else "it"
    why = ": libpq would wait on it, and the exporter with it" if stat.S_ISFIFO(mode) else ""
    return LibpqFileRefused(
        f"{wanted}: {what} is {kind}, not {expected}{why}; give the path of {expected}"
    )


def examine_all(
    params: Mapping[str, str], environ: Mapping[str, str], watch: Watch
) -> list[Handed]:
    """What to hand libpq for each file it would open (blocking)."""
    handed = []
    for wanted in plan(params, environ, home_directory(environ)):
        watch.now = wanted
        handed.append(examine(wanted))
    watch.now = None
    return handed


# --- on the event loop ---------------------------------------------------------------------


class Watch:
    """What an examination is looking at, for the message when it does not return."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now: Wanted | None = None


class _Threads:
    """The examinations' threads; one stuck on a dead mount is counted, never waited for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0

    def start(
        self,
        work: Callable[[], list[Handed]],
        loop: asyncio.AbstractEventLoop,
        done: asyncio.Future[list[Handed]],
    ) -> bool:
        """Run ``work`` in a daemon thread, its outcome for ``done``; False when too many
        have not returned."""
        with self._lock:
            if self.running >= MOST_RUNNING:
                return False
            self.running += 1
        thread = threading.Thread(
            target=self._run, args=(work, loop, done), name="libpq files", daemon=True
        )
        thread.start()
        return True

    def _run(
        self,
        work: Callable[[], list[Handed]],
        loop: asyncio.AbstractEventLoop,
        done: asyncio.Future[list[Handed]],
    ) -> None:
        result: list[Handed] = []
        error: BaseException | None = None
        try:
            result = work()
        except BaseException as exc:  # handed to the loop, which raises it
            error = exc
        finally:
            with self._lock:
                self.running -= 1
        with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
            loop.call_soon_threadsafe(_settle, done, result, error)


_THREADS = _Threads()


def _settle(
    done: asyncio.Future[list[Handed]], result: list[Handed], error: BaseException | None
) -> None:
    if done.done():
        return  # given up on; what it holds is closed as it is dropped
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


async def handed_for(params: Mapping[str, str]) -> list[Handed]:
    """What to give libpq instead of each file it would open for ``params``, examined in
    a thread within CHECK_LIMIT; LibpqFileRefused when one cannot be given."""
    environ = dict(os.environ)
    if not plan(params, environ, home="/"):  # nothing to open, whatever the home
        return []
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[Handed]] = loop.create_future()
    watch = Watch()
    if not _THREADS.start(lambda: examine_all(params, environ, watch), loop, done):
        raise LibpqFileRefused(
            f"{MOST_RUNNING} examinations of libpq's files have not returned (a network "
            "file system that stopped answering?); no connection is tried until one does"
        )
    try:
        async with asyncio.timeout(CHECK_LIMIT):
            return await done
    except TimeoutError:
        raise LibpqFileRefused(
            f"{watch.now or 'the home directory'} did not answer within {CHECK_LIMIT:g}s "
            "(a network file system that stopped answering?)"
        ) from None
    except asyncio.CancelledError:
        if watch.now is not None:
            log.warning("gave up connecting while %s had not answered", watch.now)
        raise


_WARNED: set[str] = set()


async def connect(
    conninfo: str, *, autocommit: bool = False, prepare_threshold: int | None = 5
) -> Conn:
    """psycopg's ``AsyncConnection.connect``, with libpq handed only files that cannot
    block it; libpq's messages name the operator's paths, not the ones handed over."""
    params = {key: str(value) for key, value in conninfo_to_dict(conninfo).items()}
    handed = await handed_for(params)
    for warning in {h.warning for h in handed} - {""} - _WARNED:
        _WARNED.add(warning)  # once: the probe may reconnect every second
        log.warning(warning)
    if handed:
        conninfo = make_conninfo(conninfo, **{h.wanted.keyword: h.value for h in handed})
    try:
        conn = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=autocommit, prepare_threshold=prepare_threshold
        )
    except psycopg.Error as exc:
        restore_paths(exc, handed)
        raise
    if held := tuple(h.held for h in handed if h.held is not None):
        # libpq opens them again for every cancel request: kept as long as the connection.
        weakref.finalize(conn, _release, held)
    return conn


def _release(held: tuple[Held, ...]) -> None:
    """Nothing to do: holding ``held`` until the connection was collected was the point."""


def restore_paths(exc: BaseException, handed: Iterable[Handed]) -> None:
    """Put the operator's paths back into libpq's message in place of those handed over."""
    names = {h.value: h.wanted.path for h in handed}
    if not names or not exc.args or not isinstance(exc.args[0], str):
        return
    text = exc.args[0]
    restored = _HANDED.sub(lambda m: names.get(m.group(0), m.group(0)), text)
    if restored != text:
        exc.args = (restored, *exc.args[1:])
