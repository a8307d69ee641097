"""A server's failed logins, bounded: what counts as one, and the bucket of them (issue 29).

Each target already waits after the server refuses its login (:class:`~exporter.pg.
connections.Logins`), but a fleet of thousands of targets holding one wrong password
would still cost their server a refusal each. The bucket bounds them per server,
whichever targets they come from (:mod:`exporter.pg.bulkheads` keeps one per server).
Pure: the clock is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import psycopg

# libpq reports no SQLSTATE for a failed connection, so the server's (English) message
# says when it refused the login itself: SQLSTATE class 28 (28P01 authentication failed,
# 28000 no such role, not allowed to log in, a pg_hba rule), or libpq had no password.
_REFUSED_LOGIN = re.compile(
    r'authentication failed for user|pg_hba\.conf rejects|no pg_hba\.conf entry|role ".*" does '
    r"not exist|is not permitted to log in|no password supplied"
)
_TIMEOUTS = (TimeoutError, getattr(psycopg.errors, "ConnectionTimeout", TimeoutError))

Random = Callable[[], float]  # uniform in [0, 1), like random.random
_MAX_DOUBLINGS = 40  # 2**40 s is beyond any ceiling: stops the float from growing

#: After a login the server refused (a wrong password, no such role, a pg_hba rule), the
#: next waits this long, doubling with each refusal in a row up to LOGIN_CEILING: a few
#: failed logins a minute, so lockout tools never count the exporter as an attack.
LOGIN_FIRST_WAIT = 1.0
LOGIN_CEILING = 60.0


def login_wait(
    refusals: int, random: Random, first: float = LOGIN_FIRST_WAIT, ceiling: float = LOGIN_CEILING
) -> float:
    """Seconds before the next login after ``refusals`` refused in a row (issue 25).

    ``first`` doubles per refusal up to ``ceiling``, less up to half of it at random
    ("equal jitter"): exporters sharing a role spread their attempts apart, yet each
    waits at least half the step, so the ceiling bounds the failed logins a minute.
    """
    step = min(ceiling, first * 2.0 ** min(max(refusals, 1) - 1, _MAX_DOUBLINGS))
    return step * (1.0 - 0.5 * random())


def refused_login(exc: BaseException) -> bool:
    """True when the server refused to let us log in: trying again at once cannot succeed,
    and each try is one more failed login in its log, which lockout tools count."""
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate.startswith("28")
    return isinstance(exc, psycopg.Error) and _REFUSED_LOGIN.search(str(exc)) is not None


def cut_short(exc: BaseException) -> bool:
    """True when we gave up on a login the server may still be working on (a timeout, or
    its request ended): its backend may outlive the attempt, and may yet refuse it."""
    if not isinstance(exc, psycopg.Error):
        return True  # cancelled
    return isinstance(exc, _TIMEOUTS) or isinstance(exc.__context__, _TIMEOUTS)


class LoginBucket:
    """Failed logins at one server: ``capacity`` at once, then ``per_minute`` a minute.

    A login counts as failed when the server refused it, and when we gave up on it
    (a timeout, or its request ended): the server may have judged it all the same.
    """

    def __init__(self, capacity: int, per_minute: float, clock: Callable[[], float]) -> None:
        self.capacity = float(capacity)
        self.rate = per_minute / 60.0  # tokens a second
        self.clock = clock
        self._tokens = self.capacity
        self._at = clock()
        self.pending = 0  # tokens taken by logins in flight
        self.failed = 0  # logins refused, or given up on
        self.held = 0  # logins not dialled: no token was left

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self, *, keep: float = 0.0) -> bool:
        """Take a token for a login about to be dialled, leaving at least ``keep`` for
        others; False (counted) when there is none to take."""
        self._refill()
        if self._tokens - self.pending < 1.0 + keep:
            self.held += 1
            return False
        self.pending += 1
        return True

    def give_back(self, *, spent: bool) -> None:
        """The login ended: its token comes back, unless it failed."""
        self.pending -= 1
        if spent:
            self._refill()
            self._tokens -= 1.0
            self.failed += 1

    @property
    def full(self) -> bool:
        """True when no refusal is owed any more: the bucket has refilled."""
        self._refill()
        return self._tokens >= self.capacity

    def next_in(self) -> float:
        """Seconds until a token is free for another login."""
        self._refill()
        return max(0.0, (1.0 - (self._tokens - self.pending)) / self.rate)
