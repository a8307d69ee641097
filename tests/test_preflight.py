"""The preflight's pure parts: when session limits are safe (issue 22)."""

from __future__ import annotations

import pytest

from exporter.pg.preflight import Endpoint, socket_directories, why_not_direct

TCP = Endpoint("10.0.0.5", 5432)
SOCKET = Endpoint("", 5432, "/var/run/postgresql")
SERVER_SOCKETS = Endpoint("", 5432, "/var/run/postgresql, /tmp")


@pytest.mark.parametrize(
    ("dialed", "seen"),
    [
        (TCP, TCP),
        (Endpoint("::1", 5432), Endpoint("::1", 5432)),
        (Endpoint("127.0.0.1", 5432), Endpoint("::ffff:127.0.0.1", 5432)),
        (Endpoint("2001:db8::1", 5432), Endpoint("2001:0db8:0:0::1", 5432)),
        (SOCKET, SERVER_SOCKETS),
        (Endpoint("", 5432, "/tmp/"), SERVER_SOCKETS),
        (Endpoint("", 5432, "/run/pg"), Endpoint("", 5432, '"/run/pg",@abstract')),
        (Endpoint("", 5432, "@abstract"), Endpoint("", 5432, "/run/pg, @abstract")),
    ],
)
def test_the_endpoint_libpq_dialed_proves_a_direct_session(
    dialed: Endpoint, seen: Endpoint
) -> None:
    """The server sees the address and port we dialed, or its socket directory and port:
    nothing stands between, so session limits are safe."""
    assert why_not_direct(dialed, seen) == ""


@pytest.mark.parametrize(
    ("dialed", "seen", "said"),
    [
        # pgBouncer on 6432 in front of PostgreSQL on 5432, on one host.
        (Endpoint("127.0.0.1", 6432), Endpoint("127.0.0.1", 5432), "port 5432"),
        # A pooler, NAT or Service IP on another address, same port.
        (Endpoint("10.96.0.10", 5432), TCP, "arrive at 10.0.0.5, it was made to 10.96.0.10"),
        # A pooler reached over TCP that talks to PostgreSQL over its Unix socket.
        (TCP, SERVER_SOCKETS, "arrive at a Unix socket"),
        (SOCKET, TCP, "it was made to a Unix socket"),
        # A pooler's own socket directory, with PostgreSQL's port number.
        (Endpoint("", 5432, "/run/pgbouncer"), SERVER_SOCKETS, "in /run/pgbouncer"),
        (Endpoint("", 6432, "/tmp"), SERVER_SOCKETS, "port 6432"),
        (SOCKET, Endpoint("", 5432, None), "grant pg_read_all_settings or pg_monitor"),
        (SOCKET, Endpoint("", 5432, ""), "not one of the server's unix_socket_directories"),
    ],
)
def test_anything_else_keeps_a_transaction_per_collector(
    dialed: Endpoint, seen: Endpoint, said: str
) -> None:
    """Another port, another address, the other kind of socket, another socket directory,
    or a directory list the role may not read: not proven direct, and the reason says why."""
    assert said in why_not_direct(dialed, seen)


def test_socket_directories_reads_the_settings_list() -> None:
    """Commas, spaces, double quotes and trailing slashes are the server's, not ours."""
    assert socket_directories(' /var/run/postgresql/ , "/tmp",@pg ') == frozenset(
        {"/var/run/postgresql", "/tmp", "@pg"}
    )
    assert socket_directories("") == frozenset()
