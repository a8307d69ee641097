"""A server's failed logins, bounded (issue 29): what counts as one, and the bucket."""

from __future__ import annotations

import asyncio
import random

import psycopg
import pytest

from exporter.pg.loginrate import (
    LOGIN_CEILING,
    LoginBucket,
    cut_short,
    login_wait,
    refused_login,
)
from tests.fixtures.clock import FakeClock


def _timed_out() -> psycopg.OperationalError:
    """The error postgres.connect raises when its own deadline passes."""
    try:
        try:
            raise TimeoutError
        except TimeoutError:
            raise psycopg.OperationalError("connecting took longer than 0.1s") from None
    except psycopg.OperationalError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "given_up"),
    [
        (asyncio.CancelledError(), True),  # its request ended mid-login
        (_timed_out(), True),
        (psycopg.errors.ConnectionTimeout("connection timeout expired"), True),
        (psycopg.OperationalError("FATAL:  password authentication failed"), False),
        (psycopg.OperationalError("Connection refused"), False),
    ],
)
def test_a_login_given_up_on_is_told_from_an_answered_one(
    exc: BaseException, given_up: bool
) -> None:
    """Cancelled or timed out: the server may still judge it. An error the server or the
    network gave: the attempt is over."""
    assert cut_short(exc) is given_up


def test_refusals_are_the_servers_verdict_on_the_login() -> None:
    """A wrong password or a pg_hba rule; not a server that is down."""
    assert refused_login(psycopg.OperationalError('password authentication failed for user "x"'))
    assert refused_login(psycopg.OperationalError('no pg_hba.conf entry for host "1.2.3.4"'))
    assert not refused_login(psycopg.OperationalError("Connection refused"))


def test_a_burst_then_the_rate() -> None:
    """``capacity`` failures at once, then one per 60/``per_minute`` seconds."""
    clock = FakeClock()
    bucket = LoginBucket(3, 60, clock)
    for _ in range(3):
        assert bucket.take()
        bucket.give_back(spent=True)
    assert not bucket.take()  # the burst is spent
    assert (bucket.failed, bucket.held) == (3, 1)
    assert bucket.next_in() == pytest.approx(1.0)
    clock.advance(0.5)
    assert not bucket.take()
    clock.advance(0.5)
    assert bucket.take()  # one a second
    bucket.give_back(spent=True)
    assert not bucket.take()
    clock.advance(10)
    assert bucket.full  # refilled to the burst, no further
    assert sum(bucket.take() for _ in range(5)) == 3


def test_logins_that_succeed_cost_nothing() -> None:
    """A success gives its token back: a server that refuses nothing never runs out."""
    bucket = LoginBucket(2, 60, FakeClock())
    for _ in range(100):
        assert bucket.take()
        bucket.give_back(spent=False)
    assert bucket.full
    assert bucket.failed == 0


def test_logins_in_flight_hold_their_tokens() -> None:
    """Each login in flight holds a token, so failures can never exceed what was there."""
    bucket = LoginBucket(2, 60, FakeClock())
    assert bucket.take()
    assert bucket.take()
    assert not bucket.take()  # both in flight: either may fail
    bucket.give_back(spent=False)
    assert bucket.take()


def test_a_caller_can_leave_tokens_to_others() -> None:
    """``keep`` tokens stay for others: a health probe leaves half to the passes."""
    bucket = LoginBucket(4, 60, FakeClock())
    assert bucket.take(keep=2)
    bucket.give_back(spent=True)
    assert bucket.take(keep=2)
    bucket.give_back(spent=True)
    assert not bucket.take(keep=2)  # two left: they are the others'
    assert bucket.take()


def test_login_wait_doubles_from_one_second_to_the_ceiling_with_equal_jitter() -> None:
    """A refused login waits 1 s, then 2, 4 … up to 60 s; jitter takes at most half off."""
    assert [login_wait(n, lambda: 0.0) for n in (1, 2, 3, 7, 8, 50)] == [1, 2, 4, 60, 60, 60]
    assert login_wait(3, lambda: 0.999999) == pytest.approx(2.0, abs=1e-4)
    draws = [login_wait(20, random.Random(seed).random) for seed in range(200)]
    assert all(LOGIN_CEILING / 2 < wait <= LOGIN_CEILING for wait in draws)
    assert len(set(draws)) > 100  # exporters sharing a role spread apart
