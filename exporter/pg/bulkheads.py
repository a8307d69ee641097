"""Per-server bulkheads: what the exporter holds at one PostgreSQL server (issue 29).

Each target keeps its own budget (``--max-connections``, its login back-off), but a
fleet may declare thousands of targets on one server, and their databases, passes and
health probes would all add up there. One bulkhead per server, as resolved
(:mod:`exporter.pg.addresses`), bounds the sum, for the whole process:

- *Places*: at most ``limit`` backends at once. A connection takes its place before it
  dials and gives it back once its backend has ended; a login we gave up on (it timed
  out, or its request ended) keeps its place a moment longer, since its backend may
  still be at work. Health probes hold at most half the places, so anonymous health
  requests cannot take what the passes need. With every place taken, an idle pass
  connection (kept between passes) is closed, least recently used first, whichever
  target it serves; failing that a pass waits for a place (its request's budget
  bounds the wait) and a health probe does not look: its target reads "not probed".
- *Failed logins* (:mod:`exporter.pg.loginrate`): a bucket of ``limit`` tokens, refilled
  at ``per_minute``. A login takes a token before it dials; a success gives it back, a
  refusal (or a login we gave up on, which the server may have judged) spends it.
  With no token left nothing is dialled (a pass fails at once, saying why; a probe
  reads "not probed"), so the server sees at most ``limit`` failed logins at once and
  then ``per_minute`` a minute, however many targets hold a wrong password. Each login
  in flight holds a place, so a server that refuses nothing never runs out of tokens;
  health probes leave half the bucket to the passes, as they leave them half the places.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Protocol

import psycopg

from exporter.config.settings import (
    DEFAULT_SERVER_MAX_CONNECTIONS,
    DEFAULT_SERVER_MAX_FAILED_LOGINS,
    Settings,
)
from exporter.config.target import PGBOUNCER_DATABASE, database_of
from exporter.pg import guards as table
from exporter.pg import postgres
from exporter.pg.addresses import Attempt, ServerKey, resolve
from exporter.pg.loginrate import LoginBucket, cut_short, refused_login

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[tuple[object, ...]]
Connector = Callable[[str, float], Awaitable[Conn]]

# A login we gave up on keeps its place this long: the server may still be authenticating
# it, and a backend that notices its client gone a moment later still held a slot.
LINGER = postgres.BACKEND_EXIT_WAIT  # seconds
LOG_PERIOD = 60.0  # seconds between two warnings about one server's limits
PRUNE_AFTER = 600.0  # seconds a bulkhead with nothing held and nothing owed is kept
# Why a health probe dialled nothing (its answer then says "not probed: " and this).
HELD_CONNECTIONS = "the exporter holds every connection it may at this target's server"
HELD_PROBES = "health probes hold every connection they may at this target's server"
HELD_LOGINS = "the exporter's logins at this target's server keep failing or timing out"


class NotAdmitted(Exception):
    """A health probe dialled nothing: its server's bulkhead held it back (the text
    says why)."""


class LoginsHeld(psycopg.OperationalError):
    """A pass dialled nothing: too many of the exporter's logins there failed lately."""


class Evictable(Protocol):
    """What holds an idle pass connection and can let it go (a ``Server``)."""

    async def disconnect(self) -> None: ...


class Lease:
    """One place at a server, from before the login until its backend has ended."""

    __slots__ = ("bulkhead", "holder", "probe", "released", "role")

    def __init__(self, bulkhead: Bulkhead, *, probe: bool) -> None:
        self.bulkhead = bulkhead
        self.probe = probe
        self.holder: Evictable | None = None  # a pass connection's, to close it for room
        self.released = False
        self.role = ""  # the role its connection logs in as (its login options')

    def use(self, *, busy: bool) -> None:
        """A pass starts (True) or ends (False) using the connection: idle ones may be
        closed to make room at the server."""
        self.bulkhead.use(self, busy=busy)

    def release(self) -> None:
        """The backend has ended: the place is free."""
        if not self.released:
            self.released = True
            self.bulkhead.release(self)

    def release_later(self, seconds: float) -> None:
        """The place is free ``seconds`` from now (a login we gave up on)."""
        asyncio.get_running_loop().call_later(seconds, self.release)


class Bulkhead:
    """One server's places and failed-login bucket, with what they did."""

    def __init__(
        self, key: ServerKey, limit: int, per_minute: float, clock: Callable[[], float]
    ) -> None:
        self.key = key
        self.limit = limit
        self.probe_share = max(1, limit // 2)  # places health probes may hold at most
        self.clock = clock
        self.logins = LoginBucket(limit, per_minute, clock)
        self.held = 0  # places taken: connections open, being opened, or closing
        self.probes = 0  # of which health probes hold
        self.waiting = 0  # passes waiting for a place now
        self.peak = 0
        self.waits = 0  # passes that waited for a place
        self.refused = 0  # health probes held back (cap or logins): "not probed"
        self.evictions = 0  # idle pass connections closed to make room
        self.used_at = clock()
        # libpq options that put our guards in force at login, per role (issue 36): absent,
        # those every major has (a first login); text, this server's whole set; None,
        # none (a session of that role here was not direct, or the server refused them).
        self.login_options: dict[str, str | None] = {}
        self.login_refused: set[str] = set()  # roles whose options the server refused
        self._idle: OrderedDict[Lease, None] = OrderedDict()  # least recently used first
        self._changed = asyncio.Event()  # replaced at each change; waiters hold the old one
        # Each strain is warned about once (at most once a period), and its end told only
        # if its start was: "places" (every place was taken when one more was wanted) and
        # "logins" (a login was held back, and the bucket has not refilled since).
        self._strained: dict[str, bool] = {}  # strain: whether its start was logged
        self._warned_at: dict[str, float] = {}  # strain: when it was last warned about

    def _fits(self, *, probe: bool) -> bool:
        return self.held < self.limit and (not probe or self.probes < self.probe_share)

    async def take(self, *, probe: bool) -> Lease:
        """A place for one more connection, making room or waiting as the module says;
        NotAdmitted for a health probe that finds none."""
        waited = False
        while not self._fits(probe=probe):
            share_held = probe and self.probes >= self.probe_share
            if self._idle and not share_held:
                await self._evict()
                continue
            if share_held:
                self._strain("health probes hold every connection they may there (half)")
            else:
                self._strain("every connection the exporter may hold there is taken")
            if probe:
                self.refused += 1
                raise NotAdmitted(HELD_PROBES if share_held else HELD_CONNECTIONS)
            self.waits += not waited
            waited = True
            self.waiting += 1
            try:
                await self._changed.wait()
            finally:
                self.waiting -= 1
        self.held += 1
        self.probes += probe
        self.peak = max(self.peak, self.held)
        self.used_at = self.clock()
        return Lease(self, probe=probe)

    async def _evict(self) -> None:
        lease = next(iter(self._idle))
        del self._idle[lease]  # at once: no other request picks the same one
        self.evictions += 1
        if lease.holder is not None:
            await lease.holder.disconnect()  # frees the place once its backend has ended

    def admit_login(self, *, probe: bool) -> None:
        """Take a login token, or raise: NotAdmitted for a probe, LoginsHeld for a pass.
        A probe leaves half the bucket to the passes."""
        if self.logins.take(keep=self.logins.capacity / 2 if probe else 0.0):
            return
        self._hold_logins()
        if probe:
            self.refused += 1
            raise NotAdmitted(HELD_LOGINS)
        raise LoginsHeld(
            f"not tried: {self.logins.failed} of the exporter's logins at {self.key} failed or "
            f"timed out, and it tries at most {self.logins.rate * 60:g} failing ones a minute "
            f"there after the first {self.limit} (--server.max-failed-logins); the next in "
            f"{self.logins.next_in():.0f}s"
        )

    def login_ended(self, *, failed: bool) -> None:
        """A login dialled under :meth:`admit_login` ended: refused, given up on, or not."""
        self.logins.give_back(spent=failed)
        if "logins" in self._strained and self.logins.full:
            self._eased("logins", "logins at this server are no longer held back",
                        failed_logins=self.logins.failed)  # fmt: skip
        self._notify()

    def use(self, lease: Lease, *, busy: bool) -> None:
        """Note a pass connection in use, or idle (then the most recently used)."""
        if lease.released or lease.holder is None:
            return
        if busy:
            self._idle.pop(lease, None)
        else:
            self._idle[lease] = None
            self._idle.move_to_end(lease)
            self._notify()  # a waiting pass may close it for room

    def release(self, lease: Lease) -> None:
        """Give a lease's place back."""
        self._idle.pop(lease, None)
        self.held -= 1
        self.probes -= lease.probe
        self.used_at = self.clock()
        if "places" in self._strained and self.held <= self.limit // 2 and not self.waiting:
            self._eased("places", "connections at this server are back under its limit",
                        held=self.held, limit=self.limit)  # fmt: skip
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _strain(self, why: str) -> None:
        """Warn that the places hold work back: once a strain, at most once a period."""
        self._warn("places", f"{why} (--server.max-connections {self.limit}): passes wait "
                   'for a place, health probes of its targets answer 503 "not probed"')  # fmt: skip

    def _hold_logins(self) -> None:
        """Warn that the bucket holds logins back: once a strain, at most once a period."""
        self._warn("logins", f"{self.logins.failed} logins there failed or timed out; no more "
                   f"are tried until the bound allows ({self.logins.rate * 60:g} a minute, "
                   "--server.max-failed-logins)")  # fmt: skip

    def _warn(self, strain: str, what: str) -> None:
        if strain in self._strained:
            return
        now = self.clock()
        logged = now - self._warned_at.get(strain, float("-inf")) >= LOG_PERIOD
        self._strained[strain] = logged
        if logged:
            self._warned_at[strain] = now
            log.warning("server %s: %s", self.key, what, extra={"server": str(self.key)})

    def _eased(self, strain: str, what: str, **fields: object) -> None:
        if self._strained.pop(strain):
            log.info(what, extra={"server": str(self.key), **fields})

    @property
    def idle(self) -> bool:
        """True when nothing is held, waited for or owed here."""
        return not self.held and not self.waiting and self.logins.full


class Bulkheads:
    """Every server's bulkhead, by key: one registry for the whole process."""

    def __init__(
        self,
        max_connections: int = DEFAULT_SERVER_MAX_CONNECTIONS,
        failed_logins: float = DEFAULT_SERVER_MAX_FAILED_LOGINS,
        *,
        clock: Callable[[], float] = time.monotonic,
        linger: float = LINGER,
    ) -> None:
        if max_connections < 2 or failed_logins <= 0:
            raise ValueError("a server's bulkhead needs 2 places and some failed logins")
        self.max_connections = max_connections
        self.failed_logins = failed_logins  # a minute
        self.clock = clock
        self.linger = linger
        self._servers: dict[ServerKey, Bulkhead] = {}
        self._pruned_at = clock()

    @classmethod
    def for_settings(cls, settings: Settings) -> Bulkheads:
        """The bulkheads the process's settings ask for."""
        return cls(settings.effective_server_max_connections(), settings.server_max_failed_logins)

    def of(self, key: ServerKey) -> Bulkhead:
        """The bulkhead of ``key``'s server, made on first use."""
        found = self._servers.get(key)
        if found is None:
            self._prune()
            found = self._servers[key] = Bulkhead(
                key, self.max_connections, self.failed_logins, self.clock
            )
        return found

    def _prune(self) -> None:
        """Forget servers nothing has used for a while (a target's address changed)."""
        now = self.clock()
        if now - self._pruned_at < PRUNE_AFTER:
            return
        self._pruned_at = now
        unused = [k for k, b in self._servers.items() if b.idle and now - b.used_at > PRUNE_AFTER]
        for key in unused:
            del self._servers[key]

    def __iter__(self) -> Iterator[Bulkhead]:
        return iter([self._servers[key] for key in sorted(self._servers)])

    def known(self, keys: Iterable[ServerKey]) -> list[Bulkhead]:
        """The bulkheads of ``keys`` that exist, in key order."""
        return [self._servers[key] for key in sorted(keys) if key in self._servers]

    async def connect(
        self,
        conninfo: str,
        connect_timeout: float,
        *,
        probe: bool,
        connector: Connector = postgres.connect,
    ) -> tuple[Conn, Lease]:
        """Open a connection within the bulkheads of the servers it may reach, trying each
        of libpq's attempts in turn; resolving takes at most ``connect_timeout``, as does
        each dial."""
        try:
            async with asyncio.timeout(connect_timeout):
                attempts = await resolve(conninfo)
        except TimeoutError:
            raise psycopg.OperationalError(
                f"resolving the target's host took longer than {connect_timeout:g}s"
            ) from None
        errors: list[Exception] = []
        for attempt in attempts:
            try:
                return await self._attempt(
                    attempt, connect_timeout, probe=probe, connector=connector
                )
            except (psycopg.Error, NotAdmitted) as exc:
                errors.append(exc)
        raise _last(errors)

    async def _attempt(
        self, attempt: Attempt, connect_timeout: float, *, probe: bool, connector: Connector
    ) -> tuple[Conn, Lease]:
        bulkhead = self.of(attempt.key)
        lease = await bulkhead.take(probe=probe)
        try:
            bulkhead.admit_login(probe=probe)
        except BaseException:
            lease.release()
            raise
        try:
            conn = await _dial_guarded(bulkhead, attempt.conninfo, connect_timeout, connector)
        except BaseException as exc:
            given_up = cut_short(exc)
            bulkhead.login_ended(failed=given_up or refused_login(exc))
            if given_up:
                lease.release_later(self.linger)
            else:
                lease.release()
            raise
        bulkhead.login_ended(failed=False)
        return conn, lease


async def _dial_guarded(
    bulkhead: Bulkhead, conninfo: str, connect_timeout: float, connector: Connector
) -> Conn:
    """Dial with the guards at login (issue 36), from the first byte: at a first login the
    ones every major has, then this server's whole set once a session proved direct;
    none where a session of the role was not direct. A server (or pooler) that refuses
    them at login is dialled again without them, and not given them again: our
    statements then get them after login (``session``, ``limits``)."""
    if database_of(conninfo) == PGBOUNCER_DATABASE:  # its admin console: no settings (D4)
        return await connector(conninfo, connect_timeout)
    role = postgres.role_of(conninfo)
    options = bulkhead.login_options.get(role, table.first_login_options())
    if options is None:
        return await connector(conninfo, connect_timeout)
    try:
        return await connector(postgres.with_options(conninfo, options), connect_timeout)
    except psycopg.OperationalError as exc:
        if not postgres.refused_options(exc):
            raise
        bulkhead.login_options[role] = None
        bulkhead.login_refused.add(role)
        # A pooler (pgBouncer refuses any options) is not direct anyway: said at INFO.
        log.info(
            "the server refused the guards at login (%s): our role's logins there go "
            "without them; our statements get them after login (session settings where the "
            "session is proven direct, else a transaction of their own)",
            postgres.first_line(exc), extra={"server": str(bulkhead.key)},
        )  # fmt: skip
    return await connector(conninfo, connect_timeout)


def _last(errors: list[Exception]) -> Exception:
    """What a failed connection raises: its one attempt's error, or, after several, the
    last with every attempt's reason (a held-back probe only when nothing was tried)."""
    tried = [exc for exc in errors if isinstance(exc, psycopg.Error)]
    if not tried:
        return errors[-1]
    if len(tried) == 1:
        return tried[0]
    lines = [str(tried[-1]), "every attempt failed:", *(f"- {exc}" for exc in tried)]
    return type(tried[-1])("\n".join(lines))


Samples = list[tuple[Sequence[tuple[str, str]], float]]
#: The ``*_exporter_server_*`` self-metrics: name suffix, type, help, figure of a bulkhead.
_FIGURES: tuple[tuple[str, str, str, Callable[[Bulkhead], float]], ...] = (
    ("exporter_server_connections", "gauge",
     "backends the exporter holds at the server now, every target's passes and probes",
     lambda b: b.held),
    ("exporter_server_probe_connections", "gauge",
     "of which health probes hold (at most half of the limit)", lambda b: b.probes),
    ("exporter_server_connections_max", "gauge",
     "--server.max-connections: most backends the exporter holds at the server at once",
     lambda b: b.limit),
    ("exporter_server_waits_total", "counter",
     "connections of passes that waited for a place at the server", lambda b: b.waits),
    ("exporter_server_evictions_total", "counter",
     "idle pass connections closed to make room at the server", lambda b: b.evictions),
    ("exporter_server_refused_total", "counter",
     'health probes held back by the server\'s limits (answered 503 "not probed")',
     lambda b: b.refused),
    ("exporter_server_failed_logins_total", "counter",
     "logins the server refused, or given up on (a timeout, or the request ended)",
     lambda b: b.logins.failed),
    ("exporter_server_logins_held_total", "counter",
     "logins not tried: too many failed lately", lambda b: b.logins.held),
    ("exporter_server_failed_logins_max", "gauge",
     "--server.max-failed-logins: most failed logins a minute at the server, after a burst",
     lambda b: b.logins.rate * 60),
)  # fmt: skip


def server_samples(bulkheads: Iterable[Bulkhead]) -> list[tuple[str, str, str, Samples]]:
    """The self-metrics of ``bulkheads``: (name suffix, type, help, samples labelled by
    ``server``) of each family, for /metrics in both modes."""
    rows = list(bulkheads)
    return [
        (suffix, kind, help_, [((("server", str(b.key)),), float(figure(b))) for b in rows])
        for suffix, kind, help_, figure in _FIGURES
    ]
