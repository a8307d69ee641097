"""Basic auth and client-certificate checks: right answers, fair under floods, uniform timing."""

from __future__ import annotations

import asyncio
import base64
import statistics
import time
from types import SimpleNamespace

import bcrypt
import pytest
from aiohttp.test_utils import make_mocked_request

from exporter.web.auth import (
    Credentials,
    Turns,
    basic_credentials,
    client_key,
    peer_has_allowed_san,
    uniform_checkpw,
)

PASSWORD = "s3cret pass"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
SLOW = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10))  # about 0.1 s a check


def basic(user: str, password: str) -> str:
    """An Authorization header value."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_right_credentials_pass_and_are_cached() -> None:
    """The right pair passes; the same pair again is answered from the cache, without bcrypt."""
    credentials = Credentials({"alice": HASH.encode()})
    assert await credentials.check(basic("alice", PASSWORD))
    assert await credentials.check(basic("alice", PASSWORD))
    assert credentials.bcrypt_runs == 1


async def test_wrong_or_missing_credentials_fail() -> None:
    """Wrong password, unknown user, no header and malformed headers all fail."""
    credentials = Credentials({"alice": HASH.encode()})
    assert not await credentials.check(basic("alice", "wrong"))
    assert not await credentials.check(basic("alice", "wrong"))
    assert credentials.bcrypt_runs == 2  # failures are never cached
    assert not await credentials.check(basic("mallory", PASSWORD))
    assert credentials.bcrypt_runs == 3  # unknown users pay bcrypt too
    for header in (None, "", "Basic !!!", "Bearer abc", "Basic " + base64.b64encode(b"x").decode()):
        assert not await credentials.check(header)
    assert credentials.bcrypt_runs == 3


def test_basic_credentials_are_parsed_as_go_does() -> None:
    """The scheme is case-insensitive, the password may hold colons and is kept as raw bytes."""
    raw = base64.b64encode(b"alice:p\xe4ss:word").decode()
    assert basic_credentials(f"basic {raw}") == ("alice", b"p\xe4ss:word")
    assert basic_credentials(basic("alice", "")) == ("alice", b"")
    bad_user = "Basic " + base64.b64encode(b"\xff:x").decode()
    for header in (None, "", "Basic", "Basic !!!", "Digest " + raw, bad_user):
        assert basic_credentials(header) is None


async def test_non_utf8_passwords_are_compared_as_bytes() -> None:
    """A password hashed from Latin-1 bytes still matches: bytes go to bcrypt untouched."""
    credentials = Credentials({"alice": bcrypt.hashpw(b"p\xe4ss", bcrypt.gensalt(4))})
    assert await credentials.check("Basic " + base64.b64encode(b"alice:p\xe4ss").decode())


async def test_long_passwords_compare_on_their_first_72_bytes() -> None:
    """Passwords over bcrypt's 72-byte limit do not raise; the first 72 bytes decide, as in Go."""
    long = "p" * 72
    credentials = Credentials({"alice": bcrypt.hashpw(long.encode(), bcrypt.gensalt(4))})
    assert await credentials.check(basic("alice", long + "ignored tail"))
    assert not await credentials.check(basic("alice", "q" * 100))


async def test_cache_is_bounded() -> None:
    """Past its limit the cache starts over instead of growing."""
    credentials = Credentials({"alice": HASH.encode(), "bob": HASH.encode()}, cache_limit=1)
    assert await credentials.check(basic("alice", PASSWORD))
    assert await credentials.check(basic("bob", PASSWORD))
    assert len(credentials.verified) == 1
    assert await credentials.check(basic("alice", PASSWORD))
    assert credentials.bcrypt_runs == 3


async def test_bcrypt_does_not_block_the_event_loop() -> None:
    """Other requests keep being served while a costly hash is checked."""
    credentials = Credentials({"alice": bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=11))})
    check = asyncio.create_task(credentials.check(basic("alice", "wrong")))
    ticks = 0
    while not check.done():
        await asyncio.sleep(0.005)
        ticks += 1
    assert not check.result()
    assert ticks >= 5


async def started(credentials: Credentials, header: str, client: str) -> asyncio.Task[bool]:
    """A check whose bcrypt run has started (a task runs up to its first wait at once)."""
    task = asyncio.create_task(credentials.check(header, client))
    await asyncio.sleep(0)
    assert credentials.running
    return task


async def test_checks_past_the_thread_limit_are_refused_at_once() -> None:
    """With every thread busy, another client's check answers False without waiting."""
    credentials = Credentials({"alice": SLOW}, threads=2)
    busy = [await started(credentials, basic("alice", f"wrong{n}"), f"10.0.0.{n}") for n in (1, 2)]
    begin = time.perf_counter()
    assert not await credentials.check(basic("alice", PASSWORD), "10.0.0.3")
    assert time.perf_counter() - begin < 0.05
    assert (credentials.refused, credentials.bcrypt_runs) == (1, 2)
    assert await asyncio.gather(*busy) == [False, False]


async def test_one_check_at_a_time_per_client() -> None:
    """A client with a check running is refused a second one; another client is not."""
    credentials = Credentials({"alice": SLOW}, threads=2)
    busy = await started(credentials, basic("alice", "wrong"), "10.0.0.1")
    assert not await credentials.check(basic("alice", "other"), "10.0.0.1")
    assert credentials.refused == 1
    assert await credentials.check(basic("alice", PASSWORD), "10.0.0.2")
    assert not await busy
    assert credentials.bcrypt_runs == 2


async def test_the_same_pair_at_once_shares_one_check() -> None:
    """Concurrent logins with the same pair (one client or several) wait for one bcrypt run."""
    credentials = Credentials({"alice": SLOW})
    logins = [credentials.check(basic("alice", PASSWORD), f"10.0.0.{n % 2}") for n in range(5)]
    assert await asyncio.gather(*logins) == [True] * 5
    assert (credentials.bcrypt_runs, credentials.refused) == (1, 0)


async def test_a_hangup_keeps_its_turn_until_bcrypt_ends() -> None:
    """A cancelled check (the client hung up) still holds its thread and its client's turn
    until bcrypt returns, so hanging up and retrying cannot start more bcrypt runs."""
    credentials = Credentials({"alice": SLOW})
    hung_up = await started(credentials, basic("alice", "wrong"), "10.0.0.1")
    (bcrypt_run,) = credentials.running.values()
    hung_up.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hung_up
    assert not await credentials.check(basic("alice", PASSWORD), "10.0.0.1")
    assert credentials.refused == 1
    assert not await bcrypt_run
    assert await credentials.check(basic("alice", PASSWORD), "10.0.0.1")


def test_turns_keep_a_thread_for_clients_in_good_standing() -> None:
    """Clients whose last check failed share all threads but one; the last is kept for
    the others, so a flood from many addresses still leaves a scraper a thread."""
    turns = Turns(threads=3)
    for client in ("a", "b", "c"):
        assert turns.take(client)
        turns.give_back(client, failed=True)
    assert turns.take("a")
    assert turns.take("b")
    assert not turns.take("c")  # the suspects' two threads are busy
    assert turns.take("scraper")
    assert not turns.take("d")  # every thread is busy


def test_turns_one_per_client_and_a_success_clears_a_suspect() -> None:
    """A client gets one thread at a time; a success takes it off the suspects, whose
    number is bounded (the oldest failure is forgotten first)."""
    turns = Turns(threads=2, kept=2)
    assert turns.take("a")
    assert not turns.take("a")
    turns.give_back("a", failed=True)
    assert list(turns.suspects) == ["a"]
    assert turns.take("a")
    turns.give_back("a", failed=False)
    assert list(turns.suspects) == []
    for client in ("x", "y", "z"):
        assert turns.take(client)
        turns.give_back(client, failed=True)
    assert list(turns.suspects) == ["y", "z"]


def test_turns_need_two_threads() -> None:
    """With one thread there would be none to keep for clients in good standing."""
    with pytest.raises(ValueError, match="two threads"):
        Turns(threads=1)


async def test_every_failure_lasts_as_long_as_the_costliest_check() -> None:
    """Unknown user, wrong password on a cheap hash and on a costly one: the same time.

    Before, the cheap hash answered in about 2 ms and the others in about 0.17 s.
    """
    credentials = Credentials({"cheap": HASH.encode(), "costly": SLOW})

    async def median(user: str) -> float:
        times = []
        for attempt in range(5):
            begin = time.perf_counter()
            assert not await credentials.check(basic(user, f"wrong{attempt}"))
            times.append(time.perf_counter() - begin)
        return statistics.median(times)

    medians = {user: await median(user) for user in ("nobody", "cheap", "costly")}
    assert max(medians.values()) < 2 * min(medians.values()), medians
    assert credentials.refused == 0


def test_a_failure_does_the_work_of_the_top_cost() -> None:
    """On a cheap hash a wrong password goes on with decoys up to the top cost's rounds;
    a right one stops at once."""
    costs: list[int] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        costs.append(int(hashed[4:6]))
        return real(password, hashed)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bcrypt, "checkpw", counting)
        assert not uniform_checkpw(b"wrong", HASH.encode(), top_cost=7)
        assert sum(2**cost for cost in costs) == 2**7
        costs.clear()
        assert uniform_checkpw(PASSWORD.encode(), HASH.encode(), top_cost=7)
        assert costs == [4]


@pytest.mark.parametrize(
    ("remote", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::ffff", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        (None, ""),
        ("", ""),
    ],
)
def test_clients_are_told_apart_by_address_ipv6_by_prefix(remote: str | None, key: str) -> None:
    """One turn per IPv4 address, per IPv6 /64 (what one host usually gets)."""
    assert client_key(remote) == key


def peer(cert: dict[str, object] | None) -> SimpleNamespace:
    """A transport whose TLS peer certificate is ``cert``."""
    return SimpleNamespace(get_extra_info=lambda name, default=None: cert)


@pytest.mark.parametrize(
    ("sans", "allowed", "expected"),
    [
        ((("DNS", "scraper.example"),), ("scraper.example",), True),
        ((("DNS", "scraper.example"),), ("other.example",), False),
        ((("IP Address", "2001:DB8:0:0:0:0:0:1\n"),), ("2001:db8::1",), True),
        ((("email", "ops@example.org"), ("URI", "spiffe://a/b")), ("spiffe://a/b",), True),
        ((("DirName", ((("commonName", "scraper.example"),),)),), ("scraper.example",), False),
        ((("othername", "<unsupported>"),), ("<unsupported>",), False),
        ((("Registered ID", "1.2.3.4"),), ("1.2.3.4",), False),
        ((("DirName", ((("commonName", "x"),),)), ("DNS", "a.example")), ("a.example",), True),
        ((), ("scraper.example",), False),
    ],
)
def test_client_sans_are_matched(
    sans: tuple[tuple[str, str], ...], allowed: tuple[str, ...], expected: bool
) -> None:
    """client_allowed_sans matches DNS, IP (by value), email and URI names of the peer;
    other kinds (directory names, otherName, registered IDs) are skipped, never compared."""
    request = make_mocked_request("GET", "/", transport=peer({"subjectAltName": sans}))
    assert peer_has_allowed_san(request, allowed) is expected


def test_no_client_certificate_matches_nothing() -> None:
    """Without a verified peer certificate no SAN can match."""
    request = make_mocked_request("GET", "/", transport=peer(None))
    assert not peer_has_allowed_san(request, ("scraper.example",))
