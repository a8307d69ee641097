"""Which server a connection reaches (issue 29): keys, libpq's attempts, resolution."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from exporter.pg import addresses
from exporter.pg.addresses import LOCAL, ServerKey, address_key, resolve, split_hosts


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("10.0.0.5", ServerKey("10.0.0.5", 5432)),
        ("2001:db8::1", ServerKey("2001:db8::1", 5432)),
        ("2001:DB8:0::1", ServerKey("2001:db8::1", 5432)),  # written one way
        ("::ffff:10.0.0.5", ServerKey("10.0.0.5", 5432)),  # IPv4-mapped: the IPv4 server
        ("fe80::1%eth0", ServerKey("fe80::1", 5432)),  # the zone names no other server
        ("127.0.0.1", ServerKey(LOCAL, 5432)),
        ("127.1.2.3", ServerKey(LOCAL, 5432)),
        ("::1", ServerKey(LOCAL, 5432)),
        ("0.0.0.0", ServerKey(LOCAL, 5432)),  # dialling it reaches this host
    ],
)
def test_an_address_is_keyed_once_whatever_its_spelling(address: str, key: ServerKey) -> None:
    """Every spelling of one address, and every loopback address, give one key."""
    assert address_key(address, 5432) == key


def test_a_key_reads_as_host_and_port() -> None:
    """IPv6 in brackets, as a URL would write it."""
    assert str(ServerKey("10.0.0.5", 5432)) == "10.0.0.5:5432"
    assert str(ServerKey("2001:db8::1", 6432)) == "[2001:db8::1]:6432"
    assert str(ServerKey(LOCAL, 5433)) == "localhost:5433"


def test_hosts_pair_with_ports_as_libpq_pairs_them() -> None:
    """One port stands for every host; a list of ports pairs one by one; a missing or
    empty port is libpq's default."""
    params = {"host": "a,b", "port": "5433"}
    assert split_hosts(params) == [("a", "", 5433), ("b", "", 5433)]
    params = {"host": "a,b", "port": "5433,5434"}
    assert split_hosts(params) == [("a", "", 5433), ("b", "", 5434)]
    assert split_hosts({"host": "a"}) == [("a", "", 5432)]
    assert split_hosts({"hostaddr": "10.0.0.5,10.0.0.6", "port": ","}) == [
        ("", "10.0.0.5", 5432),
        ("", "10.0.0.6", 5432),
    ]


def test_lists_libpq_cannot_pair_are_refused() -> None:
    """Three hosts and two ports: libpq would refuse to connect, so do we."""
    with pytest.raises(psycopg.OperationalError, match="port numbers"):
        split_hosts({"host": "a,b,c", "port": "1,2"})
    with pytest.raises(psycopg.OperationalError, match="hostaddr"):
        split_hosts({"host": "a,b", "hostaddr": "10.0.0.1,10.0.0.2,10.0.0.3"})


def test_the_environment_fills_what_the_url_leaves_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """PGHOST and PGPORT count as libpq counts them, behind the URL's own values."""
    monkeypatch.setenv("PGHOST", "10.0.0.9")
    monkeypatch.setenv("PGPORT", "6000")
    assert split_hosts({}) == [("10.0.0.9", "", 6000)]
    assert split_hosts({"host": "10.0.0.1"}) == [("10.0.0.1", "", 6000)]


async def test_an_address_is_dialled_as_given() -> None:
    """An IP in the URL is one attempt, keyed by it, dialled at it."""
    [attempt] = await resolve("postgresql://u:secret@10.0.0.5:5433/db?sslmode=require")
    assert attempt.key == ServerKey("10.0.0.5", 5433)
    params = conninfo_to_dict(attempt.conninfo)
    assert (params["host"], params["port"]) == ("10.0.0.5", "5433")
    assert (params["password"], params["sslmode"], params["dbname"]) == ("secret", "require", "db")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql:///postgres",  # libpq's default: a socket of this host
        "host=/var/run/postgresql dbname=postgres",
        "host=@abstract dbname=postgres",  # Linux's abstract socket namespace
        "postgresql://127.0.0.1/postgres",
        "postgresql://[::1]/postgres",
    ],
)
async def test_this_hosts_sockets_and_loopback_are_one_server(url: str) -> None:
    """A socket, the default and loopback addresses with the same port: localhost:5432."""
    attempts = await resolve(url)
    assert {attempt.key for attempt in attempts} == {ServerKey(LOCAL, 5432)}


async def test_a_name_is_dialled_at_each_address_it_resolves_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name's addresses, each once and in the resolver's order, each dialled with the
    name kept for TLS checks and the passfile."""

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("db.internal", 5432)
        return ["10.0.0.7", "2001:db8::7"]

    monkeypatch.setattr(addresses, "_addresses", resolver)
    attempts = await resolve("postgresql://u@db.internal/app?sslmode=verify-full")
    assert [a.key for a in attempts] == [
        ServerKey("10.0.0.7", 5432),
        ServerKey("2001:db8::7", 5432),
    ]
    params = conninfo_to_dict(attempts[1].conninfo)
    assert (params["host"], params["hostaddr"], params["sslmode"]) == (
        "db.internal",
        "2001:db8::7",
        "verify-full",
    )


async def test_localhost_resolves_to_this_host() -> None:
    """The real resolver: ``localhost``'s every address (127.0.0.1, ::1) is this host."""
    attempts = await resolve("postgresql://u@localhost:5999/postgres")
    assert attempts
    assert {attempt.key for attempt in attempts} == {ServerKey(LOCAL, 5999)}


async def test_a_multi_host_url_is_each_host_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts, each with its port: two attempts, in order, each its own server."""

    async def resolver(host: str, port: int) -> list[str]:
        return {"a.internal": ["10.0.0.1"], "b.internal": ["10.0.0.2"]}[host]

    monkeypatch.setattr(addresses, "_addresses", resolver)
    attempts = await resolve("host=a.internal,b.internal port=5432,5433 dbname=x")
    assert [a.key for a in attempts] == [ServerKey("10.0.0.1", 5432), ServerKey("10.0.0.2", 5433)]
    assert [conninfo_to_dict(a.conninfo)["host"] for a in attempts] == ["a.internal", "b.internal"]


async def test_an_unresolvable_host_is_skipped_and_none_left_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host that does not resolve is left out, as libpq would skip it; with none left
    the connection fails, naming the host."""

    async def resolver(host: str, port: int) -> list[str]:
        if host == "gone.internal":
            raise OSError("Name or service not known")
        return ["10.0.0.2"]

    monkeypatch.setattr(addresses, "_addresses", resolver)
    attempts = await resolve("host=gone.internal,b.internal dbname=x")
    assert [a.key for a in attempts] == [ServerKey("10.0.0.2", 5432)]
    with pytest.raises(psycopg.OperationalError, match=r"gone\.internal"):
        await resolve("host=gone.internal dbname=x")


async def test_a_service_is_its_own_server() -> None:
    """Without a host, a pg_service.conf service decides where libpq goes: keyed by it."""
    [attempt] = await resolve("service=orders dbname=x")
    assert attempt.key == ServerKey("service=orders", 5432)
