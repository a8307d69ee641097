"""libpq's files, found as libpq finds them and handed over so that they cannot block
(issue 29): which files, what each becomes, and the bound on examining them. Real files
in a temporary directory; what libpq then does with them is in
tests/integration/test_secret_files.py."""

from __future__ import annotations

import asyncio
import gc
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.pg import libpqfiles
from exporter.pg.libpqfiles import (
    Handed,
    Kind,
    LibpqFileRefused,
    Wanted,
    absent,
    examine,
    plan,
    restore_paths,
)

HOME = "/home/monitor"
TLS = {"sslmode": "require"}


def _paths(params: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    return {w.keyword: w.path for w in plan(params, environ or {}, HOME)}


def _sources(params: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    return {w.keyword: w.source for w in plan(params, environ or {}, HOME)}


# --- which files libpq opens ---------------------------------------------------------------


def test_the_passfile_comes_from_the_url_then_the_environment_then_the_home() -> None:
    """passfile= in the URL wins over $PGPASSFILE, which wins over ~/.pgpass; an empty
    value means the default, as in libpq."""
    disabled = {"sslmode": "disable"}
    env = {"PGPASSFILE": "/etc/env.pgpass"}
    assert _sources({**disabled, "passfile": "/etc/url.pgpass"}, env) == {
        "passfile": "passfile= in the URL"
    }
    assert _paths(disabled, env) == {"passfile": "/etc/env.pgpass"}
    assert _sources(disabled, env) == {"passfile": "$PGPASSFILE"}
    assert _paths(disabled) == {"passfile": f"{HOME}/.pgpass"}
    assert _sources(disabled) == {"passfile": "the default ~/.pgpass"}
    assert _paths({**disabled, "passfile": ""}) == {"passfile": f"{HOME}/.pgpass"}


@pytest.mark.parametrize(
    ("params", "environ"),
    [({"password": "x"}, {}), ({}, {"PGPASSWORD": "x"})],
)
def test_no_passfile_is_read_when_a_password_is_given(
    params: dict[str, str], environ: dict[str, str]
) -> None:
    """libpq reads the passfile only when no password is given (nor $PGPASSWORD)."""
    assert _paths({"sslmode": "disable", "passfile": "/p", **params}, environ) == {}


def test_tls_files_only_when_tls_may_be_used() -> None:
    """With sslmode=disable no TLS file is opened; otherwise (libpq's default is prefer)
    the root certificate, revocation list, certificate and key default under the home."""
    assert set(_paths({"sslmode": "disable", "password": "x"})) == set()
    expected = {
        "sslrootcert": f"{HOME}/.postgresql/root.crt",
        "sslcrl": f"{HOME}/.postgresql/root.crl",
        "sslcert": f"{HOME}/.postgresql/postgresql.crt",
        "sslkey": f"{HOME}/.postgresql/postgresql.key",
    }
    assert _paths({"password": "x"}) == expected  # no sslmode: libpq prefers TLS
    assert _paths({"password": "x"}, {"PGSSLMODE": "disable"}) == {}
    given = {"password": "x", **TLS, "sslcert": "/c", "sslkeylogfile": "/k"}
    assert _paths(given, {"PGSSLKEY": "/key"}) == {
        **expected,
        "sslcert": "/c",
        "sslkey": "/key",
        "sslkeylogfile": "/k",
    }


@pytest.mark.parametrize(
    ("given", "left_out"),
    [
        ({"sslrootcert": "system"}, {"sslrootcert"}),  # OpenSSL's own store
        ({"sslcrldir": "/crls"}, {"sslcrl"}),  # a directory and no file: no default file
        ({"sslcertmode": "disable"}, {"sslcert", "sslkey"}),
        ({"sslkey": "engine:key-id"}, {"sslkey"}),  # an OpenSSL engine's key
    ],
)
def test_what_libpq_does_not_open_is_left_alone(given: dict[str, str], left_out: set[str]) -> None:
    """Values libpq does not read as a file are left as they are."""
    everything = {"sslrootcert", "sslcrl", "sslcert", "sslkey"} | set(given) - {"sslcertmode"}
    assert set(_paths({"password": "x", **TLS, **given})) == everything - left_out


def test_without_a_home_there_is_no_default() -> None:
    """No home directory (none in $HOME nor the user database): libpq has no default."""
    assert plan({"sslmode": "disable"}, {}, None) == []


# --- what libpq is handed ------------------------------------------------------------------


def _wanted(path: Path, kind: Kind = Kind.READ, keyword: str = "sslrootcert") -> Wanted:
    return Wanted(keyword, str(path), f"{keyword}= in the URL", kind)


def _read(handed: Handed) -> bytes:
    with open(handed.value, "rb") as f:
        return f.read()


def test_a_regular_file_is_handed_as_a_private_copy(tmp_path: Path) -> None:
    """A regular file becomes /proc/self/fd/N of an in-memory copy, mode 0600: what
    replaces the original afterwards (a FIFO) changes nothing libpq opens."""
    original = tmp_path / "pgpass"
    original.write_text("*:*:*:monitor:Zq9\n")
    original.chmod(0o600)
    handed = examine(_wanted(original, Kind.PASSFILE, "passfile"))
    assert handed.value.startswith("/proc/self/fd/")
    assert stat.S_IMODE(os.stat(handed.value).st_mode) == 0o600
    original.unlink()
    os.mkfifo(original)
    assert _read(handed) == b"*:*:*:monitor:Zq9\n"  # at once, from the copy


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (os.mkfifo, "it is a FIFO, not a regular file: libpq would wait on it"),
        (os.mkdir, "it is a directory, not a regular file"),
    ],
)
def test_what_is_not_a_regular_file_is_refused(tmp_path: Path, make: object, said: str) -> None:
    """A FIFO or a directory where libpq expects a file: refused, naming the parameter,
    where it was set and the path."""
    path = tmp_path / "thing"
    assert callable(make)
    make(path)
    with pytest.raises(LibpqFileRefused) as refused:
        examine(_wanted(path, Kind.PASSFILE, "passfile"))
    assert str(refused.value).startswith(f"libpq's passfile '{path}' (passfile= in the URL): ")
    assert said in str(refused.value)


def test_a_device_is_refused() -> None:
    """A character device (/dev/zero never ends) is refused like a FIFO."""
    with pytest.raises(LibpqFileRefused, match="it is a character device, not a regular file"):
        examine(_wanted(Path("/dev/zero")))


def test_a_missing_file_becomes_a_path_that_cannot_exist(tmp_path: Path) -> None:
    """Missing stays missing: libpq gets a path under /proc/self/fd nothing can create."""
    handed = examine(_wanted(tmp_path / "none", Kind.PASSFILE, "passfile"))
    assert handed == absent(handed.wanted)
    assert handed.value == "/proc/self/fd/absent-passfile"
    assert not os.path.exists(handed.value)


def test_a_passfile_others_may_read_is_ignored_with_a_warning(tmp_path: Path) -> None:
    """libpq ignores a passfile group or others may read; so does the copy (0600
    whatever the original), with a warning that says why."""
    path = tmp_path / "pgpass"
    path.write_text("*:*:*:*:x\n")
    path.chmod(0o644)
    handed = examine(_wanted(path, Kind.PASSFILE, "passfile"))
    assert handed.value == "/proc/self/fd/absent-passfile"
    assert "group or others may read it (mode 0644); chmod 0600 it" in handed.warning


def test_a_key_others_may_read_is_refused(tmp_path: Path) -> None:
    """libpq refuses a key file group or others may read (0640 only when root owns it)."""
    key = tmp_path / "key"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    key.chmod(0o644)
    with pytest.raises(LibpqFileRefused, match=r"group or others may read it \(mode 0644\)"):
        examine(_wanted(key, Kind.KEY, "sslkey"))
    key.chmod(0o600)
    assert examine(_wanted(key, Kind.KEY, "sslkey")).value.startswith("/proc/self/fd/")


def test_one_file_is_copied_once_and_a_changed_one_again(tmp_path: Path) -> None:
    """Connections to one unchanged file share its copy; a new version gets its own."""
    path = tmp_path / "root.crt"
    path.write_text("one\n")
    first, second = examine(_wanted(path)), examine(_wanted(path))
    assert first.held is second.held
    path.write_text("two, longer\n")
    third = examine(_wanted(path))
    assert third.held is not first.held
    assert _read(third) == b"two, longer\n"
    assert _read(first) == b"one\n"


def test_a_copy_is_closed_once_nothing_holds_it(tmp_path: Path) -> None:
    """The descriptor lives as long as something (a connection) holds what was handed."""
    path = tmp_path / "root.crt"
    path.write_text("x\n")
    handed = examine(_wanted(path))
    assert handed.held is not None
    fd = handed.held.fd
    del handed
    gc.collect()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)


def test_a_file_too_large_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond MOST_BYTES a file is refused rather than copied."""
    monkeypatch.setattr(libpqfiles, "MOST_BYTES", 8)
    path = tmp_path / "root.crl"
    path.write_text("123456789")
    with pytest.raises(LibpqFileRefused, match="it holds more than 8 bytes"):
        examine(_wanted(path, keyword="sslcrl"))


def test_a_revocation_directory_is_held_and_its_entries_checked(tmp_path: Path) -> None:
    """sslcrldir: the directory is handed by descriptor; an entry OpenSSL would open
    that is a FIFO is refused, naming it; other names are not OpenSSL's business."""
    crls = tmp_path / "crls"
    crls.mkdir()
    (crls / "0a1b2c3d.r0").write_text("crl\n")
    os.mkfifo(crls / "README")
    handed = examine(_wanted(crls, Kind.DIRECTORY, "sslcrldir"))
    assert sorted(os.listdir(handed.value)) == ["0a1b2c3d.r0", "README"]
    os.mkfifo(crls / "0a1b2c3d.r1")
    with pytest.raises(LibpqFileRefused, match=r"its entry '0a1b2c3d\.r1' is a FIFO"):
        examine(_wanted(crls, Kind.DIRECTORY, "sslcrldir"))
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(LibpqFileRefused, match="it is a regular file, not a directory"):
        examine(_wanted(file, Kind.DIRECTORY, "sslcrldir"))


def test_the_key_log_is_the_file_itself_created_when_missing(tmp_path: Path) -> None:
    """sslkeylogfile is written by libpq: the file itself is held (created 0600 when
    missing), and a FIFO there is refused."""
    log = tmp_path / "keys.log"
    handed = examine(_wanted(log, Kind.APPEND, "sslkeylogfile"))
    with open(handed.value, "a") as f:
        f.write("CLIENT_RANDOM x y\n")
    assert log.read_text() == "CLIENT_RANDOM x y\n"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    log.unlink()
    os.mkfifo(log)
    threading.Thread(target=lambda: open(log).close(), daemon=True).start()  # a reader
    with pytest.raises(LibpqFileRefused, match="it is a FIFO"):
        examine(_wanted(log, Kind.APPEND, "sslkeylogfile"))


def test_libpq_messages_name_the_operators_paths() -> None:
    """A path handed over, in libpq's message, is put back as the operator wrote it."""
    copy = Handed(_wanted(Path("/etc/pg/pgpass"), Kind.PASSFILE, "passfile"), "/proc/self/fd/12")
    gone = absent(_wanted(Path("/etc/pg/root.crt")))
    exc = Exception(
        'password retrieved from file "/proc/self/fd/12"; '
        'root certificate file "/proc/self/fd/absent-sslrootcert" does not exist; '
        "/proc/self/fd/1 stays"
    )
    restore_paths(exc, [copy, gone])
    assert str(exc) == (
        'password retrieved from file "/etc/pg/pgpass"; '
        'root certificate file "/etc/pg/root.crt" does not exist; /proc/self/fd/1 stays'
    )


# --- the bound on examining ----------------------------------------------------------------


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Examinations that wait (as a stat on a dead network mount) until released."""
    release = threading.Event()

    def stuck(params: object, environ: object, watch: libpqfiles.Watch) -> list[libpqfiles.Handed]:
        watch.now = _wanted(Path("/mnt/nfs/pgpass"), Kind.PASSFILE, "passfile")
        release.wait(30)
        return []

    monkeypatch.setattr(libpqfiles, "examine_all", stuck)
    monkeypatch.setattr(libpqfiles, "CHECK_LIMIT", 0.2)
    yield release
    release.set()


async def test_an_examination_that_does_not_return_refuses_the_connection(
    hung: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that does not answer within CHECK_LIMIT refuses the connection, naming it;
    once MOST_RUNNING examinations are stuck none is started, and the loop kept turning."""
    monkeypatch.setattr(libpqfiles, "MOST_RUNNING", 2)
    params = {"sslmode": "disable"}
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(2):
        with pytest.raises(LibpqFileRefused, match=r"libpq's passfile '/mnt/nfs/pgpass' \("):
            await libpqfiles.handed_for(params)
    assert loop.time() - started < 5  # two bounds of 0.2 s, with a wide margin
    with pytest.raises(LibpqFileRefused, match="2 examinations of libpq's files have not"):
        await libpqfiles.handed_for(params)
    hung.set()
    for thread in threading.enumerate():
        if thread.name == "libpq files":
            await asyncio.to_thread(thread.join, 10)
    assert await libpqfiles.handed_for(params) == []  # free again
