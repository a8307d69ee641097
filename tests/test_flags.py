"""The flag table and the scanner: argv → flag name → values, and --help from the table."""

from __future__ import annotations

import pytest

from exporter.config.flags import (
    BY_LONG,
    FLAGS,
    NAMESPACES,
    Kind,
    bool_text,
    help_text,
    scan,
    version_text,
)
from exporter.errors import InfoRequested, UsageError


def test_long_flags_take_their_value_inline_or_next() -> None:
    """``--url URL`` and ``--config=PATH`` alike."""
    assert scan(["--url", "postgresql:///a", "--config=c.yml"]) == {
        "url": ["postgresql:///a"],
        "config": ["c.yml"],
    }


def test_an_inline_value_may_be_empty_or_hold_equals_signs() -> None:
    """``--exclude-database=`` is an empty list; ``--label a=1`` keeps its own ``=``."""
    assert scan(["--exclude-database=", "--label=a=1"]) == {
        "exclude-database": [""],
        "label": ["a=1"],
    }


@pytest.mark.parametrize(
    ("argv", "value"),
    [
        (["--disable-cache"], "true"),
        (["--no-disable-cache"], "false"),
        (["--disable-cache=false"], "false"),
        (["--disable-cache=YES"], "true"),
        (["--auto-discovery=0"], "false"),
    ],
)
def test_switches_read_as_true_or_false(argv: list[str], value: str) -> None:
    """--X, --no-X and --X=BOOL for every switch."""
    assert list(scan(argv).values()) == [[value]]


def test_short_flags_cluster_switches_then_one_value() -> None:
    """``-Cm``, ``-uURL``, ``-Cu URL`` and ``-n=x``."""
    assert scan(["-Cm", "-uURL"]) == {
        "disable-cache": ["true"],
        "disable-intro": ["true"],
        "url": ["URL"],
    }
    assert scan(["-Cu", "URL"]) == {"disable-cache": ["true"], "url": ["URL"]}
    assert scan(["-n=x"]) == {"namespace": ["x"]}


def test_a_list_flag_repeats_and_a_value_flag_does_not() -> None:
    """Only --web.listen-address may be given again; a second --url is a mistake."""
    given = scan(["--web.listen-address", ":1", "--web.listen-address=:2"])
    assert given == {"web.listen-address": [":1", ":2"]}
    with pytest.raises(UsageError, match=r"^--url is given more than once; give it once$"):
        scan(["--url", "a", "-u", "b"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--max-conections", "3"],
            "unknown flag --max-conections; did you mean --max-connections?",
        ),
        (["--zzzz"], "unknown flag --zzzz; see --help"),
        (["-Z"], "unknown flag -Z; see --help"),
        (["--no-url"], "unknown flag --no-url"),
        (["--no-disable-cache=true"], "--no-disable-cache takes no value"),
        (["--url"], "--url needs a value (URL)"),
        (["-u"], "--url needs a value (URL)"),
        (["stray"], "unexpected argument 'stray': pg_exporter takes only flags"),
        (["--fail-fast=maybe"], "--fail-fast must be true or false, not 'maybe'"),
    ],
)
def test_mistakes_are_usage_errors_saying_what_to_do(argv: list[str], message: str) -> None:
    """Unknown, misspelt or valueless flags and stray words: one line saying what to do."""
    with pytest.raises(UsageError) as caught:
        scan(argv)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["-c", "x", "--help", "--zzzz"]])
def test_help_stops_scanning_with_the_text_to_print(argv: list[str]) -> None:
    """--help wins over anything after it, a bad flag included."""
    with pytest.raises(InfoRequested) as caught:
        scan(argv)
    assert caught.value.text == help_text()


def test_version_names_the_program() -> None:
    """--version prints the program, Python and platform."""
    with pytest.raises(InfoRequested) as caught:
        scan(["--version"])
    assert caught.value.text == version_text()
    assert version_text().startswith("pg_exporter version ")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("t", "true"),
        (" TRUE ", "true"),
        ("no", "false"),
        ("F", "false"),
        ("1", "true"),
        ("0", "false"),
    ],
)
def test_boolean_spellings(text: str, value: str) -> None:
    """Go's strconv.ParseBool spellings, any case, plus yes and no."""
    assert bool_text(text, "--x") == value


def test_a_bad_boolean_names_where_it_came_from() -> None:
    """The error names the flag or variable the caller passes."""
    with pytest.raises(UsageError, match=r"^\$PG_EXPORTER_FAIL_FAST must be true or false"):
        bool_text("sometimes", "$PG_EXPORTER_FAIL_FAST")


def test_the_table_is_consistent() -> None:
    """Names, short letters and variables are unique; every variable is PG_EXPORTER_*."""
    shorts = [flag.short for flag in FLAGS if flag.short]
    envs = [flag.env for flag in FLAGS if flag.env]
    assert len(BY_LONG) == len(FLAGS) + sum(len(flag.aliases) for flag in FLAGS)
    assert len(set(shorts)) == len(shorts)
    assert len(set(envs)) == len(envs)
    assert all(env.startswith("PG_EXPORTER_") for env in envs)
    assert all(len(short) == 1 for short in shorts)


def test_help_shows_every_flag_with_its_variable_and_default() -> None:
    """--help is rendered from the table: every flag, its variable and its default."""
    text = help_text()
    for flag in FLAGS:
        synopsis = {Kind.SWITCH: f"--[no-]{flag.name}", Kind.ACTION: f"--{flag.name}"}
        assert synopsis.get(flag.kind, f"--{flag.name}={flag.metavar}") in text
    assert "[$PG_EXPORTER_MAX_CONNECTIONS] (default: 4)" in text.replace("\n      ", " ")


def test_our_flags_follow_one_naming_rule() -> None:
    """Issue 37: a dot only after a namespace (web., log., targets., server.), hyphens
    within a name; every older spelling still read as the flag it became."""
    for flag in FLAGS:
        namespace, dot, rest = flag.name.rpartition(".")
        if dot:
            assert namespace in NAMESPACES or namespace == "web.config", flag.name
        assert rest == rest.lower(), flag.name
        assert "_" not in rest, flag.name
        for alias in flag.aliases:
            assert BY_LONG[alias] is flag
    assert scan(["--server-time-budget", "50"]) == {"server.time-budget": ["50"]}  # alias
    assert scan(["--server.time-budget=50"]) == {"server.time-budget": ["50"]}
    assert "(also --server-time-budget)" in help_text()
