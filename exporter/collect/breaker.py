"""The target's circuit breaker: shed the least important collectors while it is in
distress, probe it again after a cool-down, and come back a tier at a time (D16).

Pure logic: each pass hands in a :class:`PassTally`, :func:`judge` calls the pass
healthy, distressed or neither, and :class:`Breaker` moves between its three
states. Which collectors a shedding level leaves out is decided by
:func:`shed_cut` from the run order alone, so it is the same for every database.
"""

from __future__ import annotations

import enum
import math
import random as _random
from collections.abc import Sequence
from dataclasses import dataclass, field

from exporter.collect.backoff import spread
from exporter.collect.budget import Interruption
from exporter.config.definitions import Collector
from exporter.pg.loginrate import Random

#: Connection refusals that say the server is overloaded or not ready, not gone:
#: SQLSTATE and, since libpq gives none for a refused connection, the server's words.
DISTRESS_SQLSTATES = {
    "53300": "too many connections (53300)",
    "57P03": "the server cannot accept connections now (57P03)",
}
_DISTRESS_TEXTS = {
    "too many clients already": "53300",
    "too many connections for": "53300",  # a role's or a database's CONNECTION LIMIT
    "remaining connection slots are reserved": "53300",
    "the database system is starting up": "57P03",
    "the database system is not yet accepting connections": "57P03",
    "the database system is not accepting connections": "57P03",
}
#: A refusal by one database's own CONNECTION LIMIT, which its owner sets: that database's
#: trouble, not the server's (issue 36).
DATABASE_LIMIT = "too many connections for that database (53300)"
COOL_DOWN_JITTER = 0.2  # a cool-down ends up to this fraction early (D17)


class BreakerState(enum.Enum):
    """The breaker's states, in the words the exporter shows."""

    NORMAL = "normal"  # closed: every planned collector runs
    DEGRADED = "degraded"  # open: the least important collectors are shed
    PROBING = "probing"  # half-open: shed collectors come back one tier at a time


class Verdict(enum.Enum):
    """What one pass says about the target."""

    HEALTHY = "healthy"
    DISTRESSED = "distressed"
    NEUTRAL = "neutral"  # says nothing: cut short by its client, target down, or all cached


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """The breaker's thresholds; the defaults are documented in docs/degradation.md."""

    trip_after: int = 2  # distressed passes in a row that trip it
    recover_after: int = 3  # healthy passes in a row that restore one tier
    cool_down: float = 30.0  # seconds shedding before the first probe
    max_cool_down: float = 300.0  # a failed probe doubles the cool-down up to this
    levels: int = 3  # level k sheds k thirds of the non-fatal collectors, the first kept
    min_timeouts: int = 2  # a pass needs at least this many timeouts to count as distress
    # Seconds a pass must have run before its budget ran out for that to count as distress:
    # a budget spent before the pass started (a queued request, a client asking for a few
    # microseconds) says nothing about the server.
    min_judged_run: float = 1.0


@dataclass(slots=True)
class PassTally:
    """What one database's part of a pass did, for the breaker."""

    executed: int = 0  # collectors that sent their SQL
    timeouts: int = 0
    shed: list[str] = field(default_factory=list)  # branch keys left out
    distress: str = ""  # a connection refusal that signals distress


def distress_of(exc: BaseException) -> str:
    """The distress a connection or preflight error signals, or '' for any other error."""
    if "too many connections for database" in str(exc).lower():
        return DATABASE_LIMIT
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate in DISTRESS_SQLSTATES:
        return DISTRESS_SQLSTATES[sqlstate]
    text = str(exc).lower()
    for words, code in _DISTRESS_TEXTS.items():
        if words in text:
            return DISTRESS_SQLSTATES[code]
    return ""


def judge(
    tally: PassTally, *, interrupted: Interruption | None, policy: BreakerPolicy, ran_for: float
) -> tuple[Verdict, str]:
    """The verdict on one pass that ran ``ran_for`` seconds, and the reason when it shows
    distress."""
    if tally.distress:
        return Verdict.DISTRESSED, tally.distress
    if interrupted is Interruption.BUDGET and ran_for >= policy.min_judged_run:
        return Verdict.DISTRESSED, "the pass ran past its request's budget"
    if interrupted is not None:
        return Verdict.NEUTRAL, ""
    if tally.timeouts >= policy.min_timeouts and 2 * tally.timeouts >= tally.executed:
        return Verdict.DISTRESSED, f"{tally.timeouts} of {tally.executed} collectors timed out"
    return (Verdict.HEALTHY if tally.executed else Verdict.NEUTRAL), ""


def judge_pass(
    main: PassTally,
    others: Sequence[PassTally],
    *,
    interrupted: Interruption | None,
    policy: BreakerPolicy,
    ran_for: float,
) -> tuple[Verdict, str]:
    """The verdict on a pass from the main database's part (:func:`judge`), whose trouble
    is the target's. A discovered database's is its own (issue 36): its collectors timing
    out and its own connection limit say nothing of the server (its collectors back off,
    D15), so they never shed another database's collectors; a refusal of the server's
    connections, by whichever database saw it, does. Any database's runs count as health."""
    server_wide = (t.distress for t in others if t.distress and t.distress != DATABASE_LIMIT)
    tally = PassTally(main.executed, main.timeouts, distress=main.distress or next(server_wide, ""))
    verdict, reason = judge(tally, interrupted=interrupted, policy=policy, ran_for=ran_for)
    if verdict is Verdict.NEUTRAL and interrupted is None and any(t.executed for t in others):
        return Verdict.HEALTHY, ""
    return verdict, reason


def shed_cut(planned: Sequence[Collector], level: int, levels: int) -> tuple[int, str] | None:
    """The run-order position (priority, key) of the last collector kept at ``level``.

    Level k keeps the first ceil(n * (levels - k) / levels) of the n non-fatal
    collectors in run order, and at least the first; None when nothing is shed.
    """
    ranked = [c for c in planned if not c.fatal]
    if level <= 0 or not ranked:
        return None
    keep = max(1, math.ceil(len(ranked) * (levels - level) / levels))
    if keep >= len(ranked):
        return None
    last = ranked[keep - 1]
    return last.priority, last.key


def is_shed(collector: Collector, cut: tuple[int, str] | None) -> bool:
    """True when ``collector`` comes after the cut in run order; a fatal one never is."""
    return cut is not None and not collector.fatal and (collector.priority, collector.key) > cut


@dataclass(frozen=True, slots=True)
class Shedding:
    """What one pass sheds: a level, cut in the run order of ``reference`` when given
    (the main database's plan, for the others), else of each database's own plan."""

    level: int = 0
    levels: int = 3
    reference: tuple[Collector, ...] | None = None

    def cut(self, planned: Sequence[Collector]) -> tuple[int, str] | None:
        """The last kept position for a database whose plan is ``planned``."""
        order = planned if self.reference is None else self.reference
        return shed_cut(order, self.level, self.levels)


NO_SHEDDING = Shedding()


@dataclass(slots=True)
class Breaker:
    """One target's breaker. ``begin`` at the start of each pass, ``observe`` at its end."""

    policy: BreakerPolicy = field(default_factory=BreakerPolicy)
    random: Random = _random.random
    state: BreakerState = BreakerState.NORMAL
    level: int = 0  # shedding level, 0 (nothing shed) to policy.levels
    streak: int = 0  # distressed passes in a row (normal) or healthy ones (probing)
    cool_down: float = 0.0  # the current cool-down, doubled by each failed probe
    probe_at: float = 0.0  # monotonic; when a degraded breaker starts probing
    reason: str = ""  # the distress that tripped or re-tripped it
    trips: int = 0  # times it left the normal state since start

    def begin(self, now: float) -> bool:
        """Start probing once the cool-down is over; True when the state changed."""
        if self.state is not BreakerState.DEGRADED or now < self.probe_at:
            return False
        self.state, self.level, self.streak = BreakerState.PROBING, self.level - 1, 0
        return True

    def observe(self, verdict: Verdict, reason: str, now: float) -> bool:
        """Take one pass's verdict; True when the state or the level changed."""
        if verdict is Verdict.NEUTRAL:
            return False
        if self.state is BreakerState.NORMAL:
            return self._normal(verdict, reason, now)
        if verdict is Verdict.DISTRESSED:
            return self._distressed(reason, now)
        if self.state is BreakerState.PROBING:
            return self._healthy_probe()
        return False  # degraded and healthy: the cool-down decides

    def _normal(self, verdict: Verdict, reason: str, now: float) -> bool:
        """Closed: trip after ``trip_after`` distressed passes in a row."""
        self.streak = self.streak + 1 if verdict is Verdict.DISTRESSED else 0
        if self.streak < self.policy.trip_after:
            return False
        self.trips += 1
        self.state, self.level, self.streak = BreakerState.DEGRADED, 1, 0
        self.cool_down = self.policy.cool_down
        self._cool(reason, now)
        return True

    def _distressed(self, reason: str, now: float) -> bool:
        """Open or half-open and still in distress: shed one tier more, cool down again.

        Still degraded at the last level is no change (nothing to log), though the
        cool-down starts over: the breaker probes only after a quiet spell.
        """
        before = (self.state, self.level)
        if self.state is BreakerState.PROBING:  # the probe failed: wait longer next time
            self.cool_down = min(2 * self.cool_down, self.policy.max_cool_down)
        self.state, self.streak = BreakerState.DEGRADED, 0
        self.level = min(self.level + 1, self.policy.levels)
        self._cool(reason, now)
        return (self.state, self.level) != before

    def _healthy_probe(self) -> bool:
        """Half-open: each ``recover_after`` healthy passes restore a tier, then close."""
        self.streak += 1
        if self.streak < self.policy.recover_after:
            return False
        self.streak = 0
        if self.level > 0:
            self.level -= 1
        else:
            self.state, self.reason = BreakerState.NORMAL, ""
        return True

    def _cool(self, reason: str, now: float) -> None:
        self.reason = reason
        self.probe_at = now + spread(self.cool_down, COOL_DOWN_JITTER, self.random)

    def describe(self, now: float) -> str:
        """The state in one line, for the log and ``/explain``."""
        if self.state is BreakerState.NORMAL:
            return "normal: every planned collector runs"
        tier = f"shedding level {self.level} of {self.policy.levels}"
        if self.state is BreakerState.DEGRADED:
            wait = max(0.0, self.probe_at - now)
            return f"degraded ({self.reason}): {tier}, probing in {wait:.0f}s"
        healthy = f"{self.streak} of {self.policy.recover_after} healthy passes"
        return f"probing after {self.reason}: {tier}, {healthy} towards the next tier"
