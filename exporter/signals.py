"""What a signal does, from the process's first instant to its last (issue 29).

SIGTERM and SIGINT stop the exporter; SIGHUP and SIGUSR1 reload its config, as in the
Go exporter. The event loop's handlers exist only once the loop runs and act only when
it turns; Python's run only between two bytecodes of the main thread. Installed after
the first contact with the target, they left a SIGHUP during start-up to its default
action, which ends the process, and a signal that came while the main thread waited
in a system call went unheard.

So the four are blocked in every thread from the first line of
:func:`exporter.cli.main`, before any of the exporter's layers is imported (the CLI
module imports only this one, which imports no more than the standard library's
``logging`` and ``threading``), and a thread of their own takes them (``sigwait``). A
signal that comes before the waiter runs stays pending and is taken then.

An inherited disposition does not change what SIGTERM, SIGHUP and SIGUSR1 do (an
ignored SIGHUP, as ``nohup`` leaves it, still reloads, as in the Go exporter). SIGINT is
the exception: a POSIX shell starts a script's background jobs with it ignored, so
that Ctrl-C stops only the foreground job; inherited ignored, it stays so (blocked and
never taken). Either way the main thread is interrupted as by SIGINT
(KeyboardInterrupt, or ``asyncio.run`` cancelling its task): Python is given its
default SIGINT handler while installed, which only a simulated SIGINT reaches, since
the real one is blocked in every thread.

- while starting (settings, files, the first contact), SIGTERM and SIGINT stop the
  process at once (the main thread is interrupted, and ended EXIT_DEADLINE later if
  a system call holds it); SIGHUP and SIGUSR1 are logged and reload once it serves;
- once :meth:`Signals.attached` to the event loop, they are handed to it; SIGTERM and
  SIGINT also arm an exit STOP_DEADLINE later, which fires even if the loop never
  turns again.

No thread helps against a C call that holds the GIL and never returns: libpq opening
a FIFO was one (:mod:`exporter.pg.libpqfiles` keeps it from happening).
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # asyncio costs 60 ms to import, and this module is imported first
    import asyncio

log = logging.getLogger(__name__)

STOPS = frozenset({signal.SIGTERM, signal.SIGINT})
RELOADS = frozenset({signal.SIGHUP, signal.SIGUSR1})  # the Go exporter reloads on both
TAKEN = STOPS | RELOADS
#: After SIGINT or SIGTERM the process has ended within this many seconds, whatever
#: still runs: under systemd's default stop timeout (30 s), after which it would kill.
#: The graceful part (responses in flight, a bounded collector's query) fits in it.
STOP_DEADLINE = 25.0
#: Once the server is closed, what may still run is a thread nothing can interrupt
#: (a file read on a hung mount, a DNS lookup, a bcrypt check); Python would wait for
#: it at exit, without limit. It gets this long. So does a start-up that is stopped.
EXIT_DEADLINE = 3.0


def exit_within(seconds: float, code: int) -> threading.Timer:
    """End the process with ``code`` in ``seconds`` unless it has ended by then."""

    def hard_exit() -> None:
        log.warning("still stopping after %gs (a blocked thread); exiting now", seconds)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(code)

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True  # never what keeps the process alive
    timer.start()
    return timer


class Signals:
    """The process's signals: taken by a thread of their own once installed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiter: threading.Thread | None = None
        self._closing = False
        self._mask: set[int | signal.Signals] = set()  # the main thread's, before installing
        self._taken: frozenset[signal.Signals] = TAKEN  # without SIGINT if inherited ignored
        self._sigint: signal._HANDLER = None  # Python's SIGINT handler before installing
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: Callable[[], None] | None = None
        self._reload: Callable[[], None] | None = None
        self.stopped_by: signal.Signals | None = None
        self.pending_reload: signal.Signals | None = None  # came before serving

    @contextlib.contextmanager
    def installed(self) -> Iterator[Signals]:
        """Take the four signals for the block (again: a no-op when already taken)."""
        if self._waiter is not None:
            yield self
            return
        # Blocked before any other thread starts, so every thread inherits the mask
        # and the waiter alone takes them.
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, TAKEN)
        self._sigint = signal.getsignal(signal.SIGINT)
        self._taken = TAKEN - {signal.SIGINT} if self._sigint == signal.SIG_IGN else TAKEN
        # What _thread.interrupt_main() and asyncio.run act on: without it, an inherited
        # SIG_IGN made the interruption a no-op and a stop waited EXIT_DEADLINE.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self._closing = False
        self.stopped_by = self.pending_reload = None
        self._waiter = threading.Thread(target=self._wait, name="signals", daemon=True)
        self._waiter.start()
        try:
            yield self
        finally:
            self._uninstall()

    def _uninstall(self) -> None:
        # An exit a stop signal armed stays armed: the process is on its way out, and
        # Python's own exit would wait for a stuck thread without limit.
        waiter, self._waiter = self._waiter, None
        self._closing = True
        if waiter is not None and waiter.ident is not None and waiter.is_alive():
            signal.pthread_kill(waiter.ident, signal.SIGUSR1)  # wakes sigwait to see _closing
            waiter.join(EXIT_DEADLINE)
        # Ignored again before it is unblocked: a SIGINT pending meanwhile is discarded.
        if self._sigint is not None:  # None: set outside Python, which cannot restore it
            signal.signal(signal.SIGINT, self._sigint)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)

    def _wait(self) -> None:
        while True:
            signum = signal.sigwait(self._taken)
            if self._closing:
                return
            try:
                self.deliver(signal.Signals(signum))
            except Exception:  # the waiter must outlive any one signal, or none is heard
                log.exception("acting on %s failed", signal.Signals(signum).name)

    def deliver(self, sig: signal.Signals) -> None:
        """Act on ``sig`` as the waiter does when it takes it."""
        with self._lock:
            loop, stop, reload = self._loop, self._stop, self._reload
        if sig in STOPS:
            self._stopping(sig, loop, stop)
        elif loop is None or reload is None or not _call_soon(loop, reload):
            self.pending_reload = sig
            log.info("%s while starting: the config is read again once it serves",
                     sig.name)  # fmt: skip

    def _stopping(
        self,
        sig: signal.Signals,
        loop: asyncio.AbstractEventLoop | None,
        stop: Callable[[], None] | None,
    ) -> None:
        first = self.stopped_by is None
        if first:
            self.stopped_by = sig
        if loop is not None and stop is not None and _call_soon(loop, stop):
            if first:
                exit_within(STOP_DEADLINE, 0)
            return
        log.info("%s while starting: stopping", sig.name)
        if first:
            exit_within(EXIT_DEADLINE, self.exit_code())
        _thread.interrupt_main()  # KeyboardInterrupt in the main thread, at its next bytecode

    def exit_code(self) -> int:
        """The exit code of a start-up a signal stopped: 0 for SIGTERM (a clean stop for
        systemd), 130 for SIGINT (as a shell expects of Ctrl-C)."""
        return 0 if self.stopped_by is signal.SIGTERM else 130

    @contextlib.contextmanager
    def attached(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> Iterator[None]:
        """Hand SIGTERM and SIGINT to ``stop`` on ``loop`` for the block; reloads wait
        for :meth:`serving`. A stop that came before is handed over at once."""
        with self._lock:
            self._loop, self._stop = loop, stop
        if self.stopped_by is not None:
            loop.call_soon(stop)
        try:
            yield
        finally:
            with self._lock:
                self._loop = self._stop = self._reload = None

    def serving(self, reload: Callable[[], None]) -> None:
        """The exporter serves: reloads go to ``reload`` (on the loop), starting with one
        that came while it started."""
        with self._lock:
            self._reload = reload
        if (pending := self.pending_reload) is not None:
            self.pending_reload = None
            log.info("reloading for the %s that came while starting", pending.name)
            reload()


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> bool:
    """Schedule ``callback`` on ``loop`` from another thread; False once it has closed."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        return False
    return True


#: The process's signals, installed by :func:`exporter.cli.main`.
SIGNALS = Signals()
