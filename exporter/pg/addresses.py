"""Which PostgreSQL server a connection reaches: its address as resolved (issue 29).

The per-server bulkheads (:mod:`exporter.pg.bulkheads`) bound what the exporter holds at
one server whatever names its targets give it, so a connection is counted where it
really goes. A target's URL is split into libpq's attempts (one per host of a
multi-host URL, one per address a name resolves to) and each attempt is dialled on
its own, with the address it was counted at (``hostaddr``), so what is counted and
what is dialled cannot differ. libpq keeps the name for TLS checks and passfiles.

Several names of one address share its bulkhead. A server on this host is one server
whatever the way to it: every loopback address and every Unix socket with the same
port count as ``localhost:PORT``; one of them could in theory be another server, and
then two share a limit, never the other way round. A remote server reached at several
addresses (IPv4 and IPv6, two interfaces) counts once per address: nothing before a
login tells they are one. Resolving is the only I/O here; reading the keys is pure.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import socket
from dataclasses import dataclass, field

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

LOCAL = "localhost"  # this host: every loopback address and Unix socket
DEFAULT_PORT = 5432
# libpq's own defaults when the URL says nothing.
_ENVIRONMENT = {"host": "PGHOST", "hostaddr": "PGHOSTADDR", "port": "PGPORT"}


@dataclass(frozen=True, slots=True, order=True)
class ServerKey:
    """One server as the bulkheads know it: an address (or LOCAL) and a port."""

    host: str  # an IP address as ipaddress writes it, LOCAL, or "service=NAME"
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One connection attempt: a conninfo naming one host (its address resolved), and
    the server it reaches."""

    conninfo: str = field(repr=False)  # may hold a password
    key: ServerKey


def address_key(address: str, port: int) -> ServerKey:
    """The key of an IP address: IPv4-mapped IPv6 as IPv4, loopback as LOCAL."""
    ip = ipaddress.ip_address(address.partition("%")[0])  # an IPv6 zone says nothing more
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return ServerKey(LOCAL, port)
    return ServerKey(str(ip), port)


def is_ip(text: str) -> bool:
    """True for an IPv4 or IPv6 address (a zone allowed)."""
    try:
        ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return False
    return True


def _value(params: dict[str, str], name: str) -> str:
    """A parameter as libpq takes it: from the URL, else from its PG* variable."""
    given = params.get(name)
    return given if given is not None else os.environ.get(_ENVIRONMENT[name], "")


def split_hosts(params: dict[str, str]) -> list[tuple[str, str, int]]:
    """(host, hostaddr, port) of each host libpq would try, in order; OperationalError
    for lists libpq cannot pair (it would refuse them too)."""
    hosts = _value(params, "host").split(",")
    addrs = _value(params, "hostaddr").split(",")
    ports = _value(params, "port").split(",")
    count = max(len(hosts), len(addrs))
    if len(hosts) not in (1, count) or len(addrs) not in (1, count):
        raise psycopg.OperationalError(
            f"could not match {len(hosts)} host names with {len(addrs)} hostaddr values"
        )
    if len(ports) not in (1, count):
        raise psycopg.OperationalError(
            f"could not match {len(ports)} port numbers to {count} hosts"
        )

    def each(values: list[str]) -> list[str]:  # one value stands for every host
        return values * count if len(values) == 1 else values

    return [
        (host.strip(), addr.strip(), _port(port))
        for host, addr, port in zip(each(hosts), each(addrs), each(ports), strict=True)
    ]


def _port(text: str) -> int:
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else DEFAULT_PORT


def local_key(host: str, port: int, params: dict[str, str]) -> ServerKey | None:
    """The key of a host that needs no resolving: a socket directory, libpq's default
    (a socket, or a service's host), or an address; None for a name."""
    if host.startswith(("/", "@")):  # a Unix socket directory, or Linux's abstract one
        return ServerKey(LOCAL, port)
    if not host:
        service = params.get("service") or os.environ.get("PGSERVICE")
        return ServerKey(f"service={service}", port) if service else ServerKey(LOCAL, port)
    return address_key(host, port) if is_ip(host) else None


async def resolve(conninfo: str) -> list[Attempt]:
    """libpq's attempts for ``conninfo``, each dialling one address, in libpq's order
    (shuffled under ``load_balance_hosts=random``); OperationalError when no host can be
    resolved, as libpq would fail."""
    params = {key: str(value) for key, value in conninfo_to_dict(conninfo).items()}
    attempts: list[Attempt] = []
    problems: list[str] = []
    for host, hostaddr, port in split_hosts(params):
        one = {**params, "host": host, "hostaddr": hostaddr, "port": str(port)}
        one = {key: value for key, value in one.items() if value != ""}
        if hostaddr:
            attempts.append(Attempt(make_conninfo("", **one), address_key(hostaddr, port)))
        elif (key := local_key(host, port, params)) is not None:
            attempts.append(Attempt(make_conninfo("", **one), key))
        else:
            try:
                addresses = await _addresses(host, port)
            except OSError as exc:
                problems.append(f"failed to resolve host {host!r}: {exc}")
                continue
            attempts.extend(
                Attempt(make_conninfo("", **one, hostaddr=a), address_key(a, port))
                for a in addresses
            )
    if not attempts:
        raise psycopg.OperationalError("; ".join(problems) or "no host to connect to")
    if params.get("load_balance_hosts") == "random":
        random.shuffle(attempts)
    return attempts


async def _addresses(host: str, port: int) -> list[str]:
    """The addresses of a name, in the resolver's order, each once."""
    loop = asyncio.get_running_loop()
    found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(item[4][0]) for item in found))
