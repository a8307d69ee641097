"""The target URL, read once by libpq: masking, sslmode, database, pgBouncer mode (§1, D14)."""

from __future__ import annotations

import os
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from exporter.config.target import MASK, SECRET_PARAMETERS, Target, mask
from exporter.errors import TargetError

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- what is shown, and what libpq gets --------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql:///postgres", "postgresql:///postgres?sslmode=disable"),
        (
            "postgresql://h:5432/db?application_name=x",
            "postgresql://h:5432/db?application_name=x&sslmode=disable",
        ),
        ("postgresql://h/db?sslmode=require", "postgresql://h/db?sslmode=require"),
        ("postgresql:///?sslmode=disable", "postgresql:///?sslmode=disable"),
        ("postgresql://h/db?", "postgresql://h/db?sslmode=disable"),
        ("host=h dbname=d", "host=h dbname=d sslmode=disable"),
        ("host=h sslmode=verify-full", "host=h sslmode=verify-full"),
        ("", "sslmode=disable"),
    ],
)
def test_sslmode_disable_added_only_when_absent(url: str, shown: str) -> None:
    """``sslmode=disable`` is added when the URL chooses none, in the URL's own form (§1)."""
    target = Target.parse(url)
    assert target.masked == shown
    assert conninfo_to_dict(target.conninfo)["sslmode"] == conninfo_to_dict(shown)["sslmode"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:secret@h:5/d", "postgresql://u:xxxxx@h:5/d?sslmode=disable"),
        (
            "postgres://u:p%40ss@[::1]:5/d?password=two&application_name=a",
            "postgres://u:xxxxx@[::1]:5/d?password=xxxxx&application_name=a&sslmode=disable",
        ),
        ("postgresql://u:pw?secret#1@host/db", "postgresql://u:xxxxx@host/db?sslmode=disable"),
        ("postgresql://u:a'b\"c<d>@h/db", "postgresql://u:xxxxx@h/db?sslmode=disable"),
        (
            "postgresql://h/db?sslpassword=secret&sslmode=require",
            "postgresql://h/db?sslpassword=xxxxx&sslmode=require",
        ),
        ("postgresql://u@h/d", "postgresql://u@h/d?sslmode=disable"),
        ("host=h password='a b' user=u", "host=h password=xxxxx user=u sslmode=disable"),
        ("host=h password=se\\ cret", "host=h password=xxxxx sslmode=disable"),
        ("host=h sslpassword=secret sslmode=require", "host=h sslpassword=xxxxx sslmode=require"),
    ],
)
def test_secrets_are_masked_where_libpq_reads_them(url: str, shown: str) -> None:
    """Each secret becomes xxxxx; the rest keeps the URL's form (§1, D14)."""
    target = Target.parse(url)
    assert target.masked == shown
    assert "secret" not in target.masked
    assert "secret" not in repr(target)


@pytest.mark.parametrize(
    ("url", "doubt"),
    [
        # libpq ends the authority at the first '/': host u, port Ab3, database Pw@host/db.
        ("postgresql://u:Ab3/Pw@host/db", "a port that is not a number"),
        ("postgresql://u:Ab3/Pw@host:5432/postgres?sslmode=disable", "a port that is not a number"),
        ("postgres://:Ab3/Pw@host/db", "a port that is not a number"),
        # A password starting with digits makes a plausible port: the '@' gives it away.
        ("postgresql://u:123/Pw@host/db", "an '@' in the database name"),
        ("postgresql://u:123/Pw@host", "an '@' in the database name"),
        # libpq ends the password at the first '@': the host would be "ss@h".
        ("postgresql://u:p@ss@h/db", "an '@' in the host"),
    ],
)
def test_url_misread_by_libpq_is_refused_quoting_none_of_it(url: str, doubt: str) -> None:
    """A password with an unencoded '/' or '@' is refused with the encoding advice (issue 25)."""
    with pytest.raises(TargetError) as caught:
        Target.parse(url)
    message = str(caught.value)
    assert doubt in message
    assert "/ as %2F" in message
    assert "@ as %40" in message
    for part in ("Ab3", "Pw", "ss@h", "123"):
        assert part not in message


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:Ab3%2FPw@host/db",
        "postgresql://u:p%40ss@h1:5432,h2:5433/db",
        "postgresql://u:p@h:/db",
        "postgresql://h/db?port=5433",
        "host=h port=5432 dbname=a@b",  # a keyword string is read without ambiguity
    ],
)
def test_plausible_urls_are_accepted(url: str) -> None:
    """Encoded passwords, host lists and empty ports read as they look: accepted."""
    assert "Ab3" not in Target.parse(url).masked


@pytest.mark.parametrize(
    "url", ["postgresql://h/db?service=prod", "service=prod dbname=db", "host=h service="]
)
def test_a_libpq_service_is_refused(url: str) -> None:
    """service= makes libpq read a service file behind the URL's back (issue 29): one that
    names another server, files of its own, or is a FIFO that would hold the connection.
    Refused, with what to write instead; an empty one too (libpq still reads the files)."""
    with pytest.raises(TargetError) as caught:
        Target.parse(url)
    message = str(caught.value)
    assert message.startswith("the target URL names a libpq service (service=")
    assert "write the service's host, port, user and database in the URL instead" in message
    assert "prod" not in message


def test_reading_libpq_secrets_at_import_opens_no_service_file(tmp_path: Path) -> None:
    """Which parameters are secret is asked of libpq without its defaults: with $PGSERVICE
    set, PQconndefaults read the service file at import, and a FIFO there (the variables
    are only cleared later) held the process before it did anything (issue 29)."""
    fifo = tmp_path / "pg_service.conf"
    os.mkfifo(fifo)
    env = {**os.environ, "PGSERVICE": "prod", "PGSERVICEFILE": str(fifo)}
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "--version"],
        cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "pg_exporter" in done.stdout


def test_password_reaches_libpq_unchanged() -> None:
    """A password holding ? and # is handed to libpq exactly (once mangled by sslmode)."""
    target = Target.parse("postgresql://u:pw?secret#1@host/db")
    params = conninfo_to_dict(target.conninfo)
    assert (params["password"], params["dbname"], params["host"]) == ("pw?secret#1", "db", "host")
    assert params["sslmode"] == "disable"


def test_every_secret_libpq_knows_is_masked() -> None:
    """Every parameter libpq hides (passwords, SCRAM keys, OAuth secrets) is masked."""
    hidden = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"}
    assert {"password", "sslpassword"} <= hidden <= SECRET_PARAMETERS
    for key in SECRET_PARAMETERS:
        assert "Zq9v" not in Target.parse(f"host=h {key}=Zq9v").masked
        assert "Zq9v" not in Target.parse(f"postgresql://h/?{key}=Zq9v").masked


@pytest.mark.parametrize(
    ("url", "dbname"),
    [
        ("postgresql://h/pgbouncer", "pgbouncer"),
        ("postgresql://h/%70g%62ouncer", "pgbouncer"),
        ("postgresql://h/app?dbname=pg%62ouncer", "pgbouncer"),
        ("host=h dbname='pgbouncer'", "pgbouncer"),
        ("postgresql://h/pgbouncer?dbname=app", "app"),
        ("postgresql:///", ""),
        ("host=h dbname=pgbouncer2", "pgbouncer2"),
    ],
)
def test_database_and_pgbouncer_mode_as_libpq_decodes(url: str, dbname: str) -> None:
    """The database is libpq's reading: percent-decoded, unquoted, the last one given."""
    target = Target.parse(url)
    assert target.dbname == dbname
    assert target.is_pgbouncer is (dbname == "pgbouncer")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:50%off-Zq9s@h/db",
        "host=h password=Zq9a Zq9b dbname=x",
        "host=h password='Zq9a Zq9b",
        "postgresql://u:Zq9a Zq9b@h/db",
        "postgresql://u:Zq9a@[::1/db",
        'postgresql://u:Zq9"a@[::1/db',
        "postgresql://h/db?password=Zq9a=Zq9b",
        "postgresql://h/db?password=Zq9a%00",
        "postgresql://u:Zq9a@h/db\0",
    ],
)
def test_unreadable_url_is_refused_without_its_secrets(url: str) -> None:
    """A URL libpq rejects is a TargetError naming the problem and quoting none of the URL."""
    with pytest.raises(TargetError, match=r"^libpq cannot read the target URL") as caught:
        Target.parse(url)
    assert "Zq9" not in str(caught.value)


# --- masking free text (log lines) -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:xxxxx@h/db"),
        ("at postgresql://u:p@ss@h/db.", "at postgresql://u:xxxxx@h/db."),
        ("postgresql://u:p?w#d@h/db", "postgresql://u:xxxxx@h/db"),
        ("postgresql://u@h/db?password=pw&sslmode=disable",
         "postgresql://u@h/db?password=xxxxx&sslmode=disable"),
        ("postgresql://h/db?pass%77ord=pw", "postgresql://h/db?pass%77ord=xxxxx"),
        ("postgresql://h/db?sslpassword=pw", "postgresql://h/db?sslpassword=xxxxx"),
        ("host=h password=pw user=u", "host=h password=xxxxx user=u"),
        ("host=h password = 'p w\\'x' user=u", "host=h password = xxxxx user=u"),
        ("host=h password=p\\ w user=u", "host=h password=xxxxx user=u"),
        ("host=h sslpassword=pw", "host=h sslpassword=xxxxx"),
        ('PGPASSWORD="a b" next', "PGPASSWORD=xxxxx next"),
        ("POSTGRESQL://u:pw@h/db", "POSTGRESQL://u:xxxxx@h/db"),
        ("http://admin:pw@proxy:8080/x", "http://admin:xxxxx@proxy:8080/x"),
        ("'postgresql://u:pw@h/db' failed", "'postgresql://u:xxxxx@h/db' failed"),
        ("no secret at http://h:9630/metrics", "no secret at http://h:9630/metrics"),
        ("default postgresql:///?sslmode=disable", "default postgresql:///?sslmode=disable"),
        ("password authentication failed for user \"u\"",
         "password authentication failed for user \"u\""),
    ],
)  # fmt: skip
def test_mask_finds_every_password_spelling_in_text(text: str, expected: str) -> None:
    """URLs of any scheme, query parameters and keyword strings in text lose their secrets."""
    assert mask(text) == expected


def test_mask_takes_linear_time_on_long_text() -> None:
    """A long run of would-be URL schemes (a.a.a.…) is masked in linear time, not quadratic."""
    started = time.perf_counter()
    assert mask("a." * 100_000) == "a." * 100_000
    assert time.perf_counter() - started < 2.0  # ~0.1 s; unbounded schemes took minutes


# --- properties over generated passwords and URL shapes --------------------------------

# Any character libpq can hold (all but NUL), URL and keyword syntax often, behind a
# prefix no other part contains.
SYNTAX = "?#@:/%&='\"\\ \t<>[],"
PASSWORDS = st.lists(
    st.one_of(
        st.text(st.sampled_from(SYNTAX), min_size=1, max_size=3),
        st.text(st.characters(exclude_characters="\0"), min_size=1, max_size=3),
    ),
    max_size=8,
).map(lambda parts: "Zq9" + "".join(parts))
NAMES = st.text(string.ascii_lowercase, min_size=1, max_size=10)
DATABASES = st.one_of(NAMES, st.just("pgbouncer"))
EXTRA_PARAMETERS = ["", "application_name=x", "sslmode=require", "dbname=other"]
# (as written in a URL, as libpq reads it)
HOSTS = st.sampled_from(
    [("localhost", "localhost"), ("127.0.0.1", "127.0.0.1"), ("[::1]", "::1"),
     ("db1:5432,db2:5433", "db1,db2"), ("", None)]
)  # fmt: skip


def _percent(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode())


def _encoded(text: str, must: str, everything: bool) -> str:
    """``text`` percent-encoded: every character, or only those libpq would misread."""
    return "".join(
        _percent(c) if everything or c in must or c in " \t\n\v\f\r" else c for c in text
    )


def _keyword_value(text: str, quoted: bool) -> str:
    """A keyword-string value: quoted, or bare with backslash escapes."""
    escaped = "".join("\\" + c if c in "'\\" or (c.isspace() and not quoted) else c for c in text)
    return f"'{escaped}'" if quoted or not text else escaped


def _check(target: Target, password: str, spellings: list[str]) -> dict[str, str]:
    """The promises for any target: nothing of the password shown, exact for libpq."""
    for spelling in spellings:
        assert spelling not in target.masked
    assert MASK in target.masked
    given = conninfo_to_dict(target.conninfo)
    assert given["password"] == password
    assert "sslmode" in given
    shown = conninfo_to_dict(target.masked)
    assert shown == {k: MASK if k in SECRET_PARAMETERS else v for k, v in given.items()}
    return {key: str(value) for key, value in given.items()}


@PROPERTY
@given(user=NAMES, password=PASSWORDS, host=HOSTS, db=DATABASES,
       scheme=st.sampled_from(["postgresql", "postgres"]), in_query=st.booleans(),
       encode_all=st.booleans(), extra=st.sampled_from(EXTRA_PARAMETERS))  # fmt: skip
def test_url_passwords_never_shown_and_reach_libpq_exactly(  # noqa: PLR0917 (one per strategy)
    user: str, password: str, host: tuple[str, str | None], db: str, scheme: str,
    in_query: bool, encode_all: bool, extra: str,
) -> None:  # fmt: skip
    """URL shapes: the password (userinfo or ?password=) never shows and libpq gets it exactly."""
    written = _encoded(password, "%&=" if in_query else "%@/", encode_all)
    path = _encoded(db, "%?", encode_all)
    params = [p for p in (f"password={written}" if in_query else "", extra) if p]
    userinfo = f"{user}@" if in_query else f"{user}:{written}@"
    url = f"{scheme}://{userinfo}{host[0]}/{path}" + ("?" + "&".join(params) if params else "")
    target = Target.parse(url)
    given = _check(target, password, [password, written])
    dbname = "other" if extra == "dbname=other" else db
    assert (given["user"], given["dbname"], given.get("host")) == (user, dbname, host[1])
    assert target.is_pgbouncer is (dbname == "pgbouncer") is (given["dbname"] == "pgbouncer")
    assert target.masked.startswith(f"{scheme}://")  # the user's own form is kept


@PROPERTY
@given(password=PASSWORDS, secret=st.sampled_from(["password", "sslpassword"]), db=DATABASES,
       quoted=st.booleans(), spaces=st.sampled_from(["", " ", "\t "]),
       position=st.integers(0, 2))  # fmt: skip
def test_keyword_passwords_never_shown_and_reach_libpq_exactly(  # noqa: PLR0917 (one per strategy)
    password: str, secret: str, db: str, quoted: bool, spaces: str, position: int
) -> None:
    """Keyword strings: the secret (bare with escapes or quoted) never shows, reaches libpq."""
    value = _keyword_value(password, quoted)
    parts = [f"host=localhost dbname={_keyword_value(db, quoted)}", "user=u"]
    parts.insert(position, f"{secret}{spaces}={spaces}{value}")
    if secret != "password":
        parts.append("password=Zq9")
    target = Target.parse(" ".join(parts))
    given = _check(target, password if secret == "password" else "Zq9", [password, value])
    assert given[secret] == password
    assert target.is_pgbouncer is (db == "pgbouncer") is (given["dbname"] == "pgbouncer")


@PROPERTY
@given(password=PASSWORDS, stray=NAMES.map(lambda w: "Zq8" + w), bad=st.sampled_from(["%", "%g"]))
def test_unreadable_url_never_quotes_its_password(password: str, stray: str, bad: str) -> None:
    """URLs libpq rejects (a bad % escape, a stray word after password=) quote no secret."""
    for url in (
        f"postgresql://u:{_encoded(password, '%@/', False)}{bad}@h/db",
        f"host=h password={_keyword_value(password, False)} {stray} dbname=db",
    ):
        with pytest.raises(TargetError) as caught:
            Target.parse(url)
        for fragment in (password, stray, password[:6], stray[:6]):
            assert fragment not in str(caught.value)
