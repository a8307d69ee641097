"""Command line and environment (compatibility §1) and the pg_exporter entry point."""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.cli import main, parse_settings
from exporter.config import settings as settings_module
from exporter.config.definitions import Definitions
from exporter.config.dryrun import render_definitions
from exporter.config.flags import FLAGS, Kind
from exporter.config.loading import load_definitions
from exporter.config.settings import ListenAddress, Settings
from exporter.errors import ConfigError, InfoRequested, Problem, UsageError

COLLECTOR = """\
pg_demo:
  desc: demo collector
  query: |
    SELECT datname, numbackends
      FROM pg_stat_database
  ttl: 10
  timeout: -1
  backoff_ceiling: 90
  tags: [cluster]
  predicate_queries:
    - {name: has_db, predicate_query: "SELECT true", ttl: 5}
  metrics:
    - datname: {usage: LABEL, rename: db}
    - numbackends: {usage: GAUGE, description: backends, default: 0, scale: 2}
    - latency: {usage: HISTOGRAM, bucket: [0.1, 1, 10]}
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No inherited PG_EXPORTER_* variables, an empty cwd, and the root logger restored."""
    for name in list(os.environ):
        if name.startswith("PG_EXPORTER_") or name == "PGURL":
            monkeypatch.delenv(name)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def config(tmp_path: Path) -> str:
    """A valid collector file."""
    path = tmp_path / "collectors.yml"
    path.write_text(COLLECTOR)
    return str(path)


def parse(config: str, *argv: str, **environ: str) -> Settings:
    """parse_settings with a config given, so tests focus on one other setting."""
    return parse_settings(["-c", config, *argv], environ)


# --- defaults, flags and environment --------------------------------------------------


def test_defaults(config: str) -> None:
    """With nothing but a config, every setting has its documented default."""
    assert parse(config) == Settings(config=config, config_origin="--config")
    settings = parse(config)
    assert settings.masked_url == "postgresql:///?sslmode=disable"
    assert settings.listen_addresses == (ListenAddress(None, 9630),)
    assert settings.exclude_databases == ("template0", "template1", "postgres")
    assert settings.connect_timeout == 0.1
    assert settings.max_series == 100_000
    assert settings.backoff_ceiling == 600.0
    assert settings.max_connections == 4
    assert (settings.server_max_connections, settings.effective_server_max_connections()) == (
        None,
        20,
    )
    assert settings.server_max_failed_logins == 60
    assert settings.max_total_series == 500_000
    assert settings.parallel_databases == 2
    assert settings.auto_discovery is True
    assert (settings.log_level, settings.log_format) == ("info", "logfmt")


VALUE_CASES = [
    (["--url", "postgres://h/db?sslmode=require"], "url", "postgres://h/db?sslmode=require"),
    (["-u", "postgres://h/db?sslmode=require"], "url", "postgres://h/db?sslmode=require"),
    (
        ["--web.listen-address=127.0.0.1:9999"],
        "listen_addresses",
        (ListenAddress("127.0.0.1", 9999),),
    ),
    (["--web.telemetry-path", "/m"], "telemetry_path", "/m"),
    (["-P", "/m"], "telemetry_path", "/m"),
    (["--label", "a=1,b=2"], "const_labels", (("a", "1"), ("b", "2"))),
    (["-l", "a=1"], "const_labels", (("a", "1"),)),
    (["--tag", "x,y"], "tags", ("x", "y")),
    (["-t", "x"], "tags", ("x",)),
    (["--exclude-database", "a,b"], "exclude_databases", ("a", "b")),
    (["-x", "a"], "exclude_databases", ("a",)),
    (["--include-database", "a,b"], "include_databases", ("a", "b")),
    (["-i", "a"], "include_databases", ("a",)),
    (["--namespace", "mine"], "namespace", "mine"),
    (["-n", "mine"], "namespace", "mine"),
    (["--connect-timeout", "2500"], "connect_timeout", 2.5),
    (["-T", "250"], "connect_timeout", 0.25),
    (["--max-series", "50"], "max_series", 50),
    (["--backoff-ceiling", "90"], "backoff_ceiling", 90.0),
    (["--backoff-ceiling=0"], "backoff_ceiling", 0.0),
    (["--server.time-budget", "50"], "server_time_budget", 50.0),
    (["--server.time-budget=0.5"], "server_time_budget", 0.5),
    (["--server.time-budget=0"], "server_time_budget", 0.0),
    (["--max-connections", "2"], "max_connections", 2),
    (["--server.max-connections", "2"], "server_max_connections", 2),
    (["--server.max-failed-logins=1"], "server_max_failed_logins", 1),
    (["--max-total-series", "0"], "max_total_series", 0),
    (["--parallel-databases", "1"], "parallel_databases", 1),
    (["--log.level", "debug"], "log_level", "debug"),
    (["--log.level=WARN"], "log_level", "warn"),
    (["--log.format", "json"], "log_format", "json"),
]


@pytest.mark.parametrize(("argv", "field", "expected"), VALUE_CASES)
def test_value_flags(config: str, argv: list[str], field: str, expected: object) -> None:
    """Every value flag, long and short, sets its Settings field."""
    assert getattr(parse(config, *argv), field) == expected


ENV_CASES = [
    ("PG_EXPORTER_TELEMETRY_PATH", "/m", "telemetry_path", "/m"),
    ("PG_EXPORTER_LABEL", "a=1", "const_labels", (("a", "1"),)),
    ("PG_EXPORTER_TAG", "x, y,", "tags", ("x", "y")),
    ("PG_EXPORTER_DISABLE_CACHE", "true", "disable_cache", True),
    ("PG_EXPORTER_DISABLE_INTRO", "1", "disable_intro", True),
    ("PG_EXPORTER_AUTO_DISCOVERY", "no", "auto_discovery", False),
    ("PG_EXPORTER_EXCLUDE_DATABASE", "a", "exclude_databases", ("a",)),
    ("PG_EXPORTER_INCLUDE_DATABASE", "a,b", "include_databases", ("a", "b")),
    ("PG_EXPORTER_NAMESPACE", "mine", "namespace", "mine"),
    ("PG_EXPORTER_FAIL_FAST", "YES", "fail_fast", True),
    ("PG_EXPORTER_CONNECT_TIMEOUT", "3000", "connect_timeout", 3.0),
    ("PG_EXPORTER_MAX_SERIES", "7", "max_series", 7),
    ("PG_EXPORTER_BACKOFF_CEILING", "2.5", "backoff_ceiling", 2.5),
    ("PG_EXPORTER_SERVER_TIME_BUDGET", " 25 ", "server_time_budget", 25.0),
    ("PG_EXPORTER_MAX_CONNECTIONS", "40", "max_connections", 40),
    ("PG_EXPORTER_SERVER_MAX_CONNECTIONS", "50", "server_max_connections", 50),
    ("PG_EXPORTER_SERVER_MAX_FAILED_LOGINS", "6", "server_max_failed_logins", 6),
    ("PG_EXPORTER_MAX_TOTAL_SERIES", "1000", "max_total_series", 1000),
    ("PG_EXPORTER_PARALLEL_DATABASES", "4", "parallel_databases", 4),
]


@pytest.mark.parametrize(("variable", "value", "field", "expected"), ENV_CASES)
def test_environment_variables(
    config: str, variable: str, value: str, field: str, expected: object
) -> None:
    """Every documented PG_EXPORTER_* variable sets its field when the flag is absent."""
    assert getattr(parse(config, **{variable: value}), field) == expected


def test_flag_beats_environment(config: str) -> None:
    """A flag on the command line wins over its environment variable."""
    settings = parse(config, "-n", "flag", "--no-fail-fast", PG_EXPORTER_NAMESPACE="env",
                     PG_EXPORTER_FAIL_FAST="true")  # fmt: skip
    assert (settings.namespace, settings.fail_fast) == ("flag", False)


def test_empty_environment_variable_counts_as_unset(config: str) -> None:
    """An empty variable (common in env files) leaves the default in place."""
    settings = parse(config, PG_EXPORTER_EXCLUDE_DATABASE="", PG_EXPORTER_AUTO_DISCOVERY="")
    assert settings.exclude_databases == ("template0", "template1", "postgres")
    assert settings.auto_discovery is True


def test_every_documented_flag_is_in_the_table() -> None:
    """The flag table holds exactly §1's flags plus our --max-series,
    --web.enable-openmetrics, --backoff-ceiling, --server.time-budget, --max-connections,
    --parallel-databases and --max-total-series, the fleet's --targets.file and
    --targets.max-concurrent, and the per-server bulkheads' --server.max-connections and
    --server.max-failed-logins, with their short forms."""
    table = {flag.name: (flag.short, flag.env) for flag in FLAGS}
    assert table == {
        "help": ("h", ""), "version": ("", ""), "url": ("u", ""),
        "config": ("c", "PG_EXPORTER_CONFIG"), "web.listen-address": ("", ""),
        "web.config.file": ("", ""), "web.systemd-socket": ("", ""),
        "web.enable-openmetrics": ("", "PG_EXPORTER_ENABLE_OPENMETRICS"),
        "web.telemetry-path": ("P", "PG_EXPORTER_TELEMETRY_PATH"),
        "label": ("l", "PG_EXPORTER_LABEL"), "tag": ("t", "PG_EXPORTER_TAG"),
        "disable-cache": ("C", "PG_EXPORTER_DISABLE_CACHE"),
        "disable-intro": ("m", "PG_EXPORTER_DISABLE_INTRO"),
        "auto-discovery": ("a", "PG_EXPORTER_AUTO_DISCOVERY"),
        "exclude-database": ("x", "PG_EXPORTER_EXCLUDE_DATABASE"),
        "include-database": ("i", "PG_EXPORTER_INCLUDE_DATABASE"),
        "namespace": ("n", "PG_EXPORTER_NAMESPACE"), "fail-fast": ("f", "PG_EXPORTER_FAIL_FAST"),
        "connect-timeout": ("T", "PG_EXPORTER_CONNECT_TIMEOUT"),
        "max-series": ("", "PG_EXPORTER_MAX_SERIES"), "dry-run": ("D", ""),
        "backoff-ceiling": ("", "PG_EXPORTER_BACKOFF_CEILING"),
        "server.time-budget": ("", "PG_EXPORTER_SERVER_TIME_BUDGET"),
        "max-connections": ("", "PG_EXPORTER_MAX_CONNECTIONS"),
        "max-total-series": ("", "PG_EXPORTER_MAX_TOTAL_SERIES"),
        "parallel-databases": ("", "PG_EXPORTER_PARALLEL_DATABASES"),
        "explain": ("E", ""), "log.level": ("", ""), "log.format": ("", ""),
        "targets.file": ("", "PG_EXPORTER_TARGETS_FILE"),
        "targets.max-concurrent": ("", "PG_EXPORTER_TARGETS_MAX_CONCURRENT"),
        "server.max-connections": ("", "PG_EXPORTER_SERVER_MAX_CONNECTIONS"),
        "server.max-failed-logins": ("", "PG_EXPORTER_SERVER_MAX_FAILED_LOGINS"),
    }  # fmt: skip


# --- switches --------------------------------------------------------------------------

SWITCHES = [
    ("disable-cache", "C", "disable_cache", False),
    ("disable-intro", "m", "disable_intro", False),
    ("auto-discovery", "a", "auto_discovery", True),
    ("fail-fast", "f", "fail_fast", False),
    ("dry-run", "D", "dry_run", False),
    ("explain", "E", "explain", False),
]


@pytest.mark.parametrize(("name", "short", "field", "default"), SWITCHES)
def test_switch_spellings(config: str, name: str, short: str, field: str, default: bool) -> None:
    """Each switch takes --X, -S, --no-X and --X=true|false|1|0|yes|no in any case."""
    assert getattr(parse(config), field) is default
    assert getattr(parse(config, f"--{name}"), field) is True
    assert getattr(parse(config, f"-{short}"), field) is True
    assert getattr(parse(config, f"--no-{name}"), field) is False
    for text, value in [("true", True), ("FALSE", False), ("1", True), ("0", False),
                        ("Yes", True), ("no", False)]:  # fmt: skip
        assert getattr(parse(config, f"--{name}={text}"), field) is value


@pytest.mark.parametrize(
    ("text", "value"),
    [("TRUE", True), ("false", False), ("1", True), ("0", False), ("yes", True), ("No", False),
     ("t", True), ("T", True), ("f", False), ("F", False), ("True", True), ("False", False)],
)  # fmt: skip
def test_switch_environment_spellings(config: str, text: str, value: bool) -> None:
    """Switch variables accept Go's spellings (1 t T TRUE true True, 0 f F FALSE false
    False) and yes/no, case-insensitive."""
    assert parse(config, PG_EXPORTER_DISABLE_CACHE=text).disable_cache is value


def test_short_switch_clusters(config: str) -> None:
    """Short switches combine (-Cm), and a value flag may end a cluster (-Cu URL, -uURL)."""
    settings = parse(config, "-Cmf", "-au", "postgres://h/x")
    assert (settings.disable_cache, settings.disable_intro, settings.fail_fast) == (
        True, True, True)  # fmt: skip
    assert settings.masked_url == "postgres://h/x?sslmode=disable"
    assert parse(config, "-npgx").namespace == "pgx"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--disable-cache=maybe"], {}, "--disable-cache must be true or false, not 'maybe'"),
        ([], {"PG_EXPORTER_FAIL_FAST": "on"}, "\\$PG_EXPORTER_FAIL_FAST must be true or false"),
        (["--no-fail-fast=true"], {}, "--no-fail-fast takes no value"),
        (["--no-url"], {}, "unknown flag --no-url"),
    ],
)
def test_bad_switch_values(config: str, argv: list[str], env: dict[str, str], message: str) -> None:
    """Unrecognised boolean spellings and misuse of --no-X are usage errors."""
    with pytest.raises(UsageError, match=message):
        parse(config, *argv, **env)


# --- values -----------------------------------------------------------------------------


def test_listen_address_is_repeatable(config: str) -> None:
    """--web.listen-address may be given several times; all are kept in order."""
    settings = parse(config, "--web.listen-address", ":1", "--web.listen-address=[::1]:2")
    assert settings.listen_addresses == (ListenAddress(None, 1), ListenAddress("::1", 2))
    assert [str(a) for a in settings.listen_addresses] == [":1", "[::1]:2"]


def test_port_zero_asks_for_a_free_port(config: str) -> None:
    """Port 0 is accepted, as the Go exporter does: the system picks a free port."""
    settings = parse(config, "--web.listen-address", "127.0.0.1:0", "--web.listen-address=[::1]:0")
    assert settings.listen_addresses == (ListenAddress("127.0.0.1", 0), ListenAddress("::1", 0))


@pytest.mark.parametrize(
    "address", ["9630", "host:", ":99999", "::1:80", "h:port", ":65536", "[]:80", "[::1:80"]
)
def test_bad_listen_address(config: str, address: str) -> None:
    """A listen address that is not [host]:port, or whose port is not 0-65535, is refused."""
    with pytest.raises(UsageError, match="is not \\[host\\]:port"):
        parse(config, "--web.listen-address", address)


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/version", "clashes with the fixed route /version"),
        ("/up", "clashes with the fixed route /up"),
        ("metrics", "must be an absolute path other than /"),
        ("/", "must be an absolute path other than /"),
        ("/a//b", "must be canonical"),
        ("/m?x", "must not contain '?'"),
    ],
)
def test_bad_telemetry_path(config: str, path: str, problem: str) -> None:
    """A telemetry path that a fixed route serves, or that cannot be routed as written, is
    refused when the settings are parsed, naming where it came from."""
    with pytest.raises(
        UsageError, match=f"^--web.telemetry-path '{re.escape(path)}': .*{re.escape(problem)}"
    ):
        parse(config, "--web.telemetry-path", path)
    with pytest.raises(UsageError, match=f"^\\$PG_EXPORTER_TELEMETRY_PATH .*{re.escape(problem)}"):
        parse(config, PG_EXPORTER_TELEMETRY_PATH=path)


def test_labels_are_stripped_and_keep_order(config: str) -> None:
    """Const labels keep their order; spaces around names and values are dropped."""
    settings = parse(config, "--label", " env = prod , dc=eu=1,")
    assert settings.const_labels == (("env", "prod"), ("dc", "eu=1"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("novalue", "skipping 'novalue': not name=value"),
        ("1abc=x", "skipping '1abc=x': not name=value"),
        ("a-b=x", "skipping 'a-b=x'"),
        ("__reserved=x", "not starting with __"),
        ("=x", "skipping '=x'"),
    ],
)
def test_bad_label_items_are_skipped_with_a_warning(config: str, text: str, message: str) -> None:
    """As in the Go exporter, a malformed item is skipped and named in a warning; the
    good items around it stay."""
    warnings: list[str] = []
    settings = parse_settings(["-c", config, "-l", f"env=prod,{text},dc=eu"], {}, warnings)
    assert settings.const_labels == (("env", "prod"), ("dc", "eu"))
    assert len(warnings) == 1
    assert message in warnings[0]
    assert warnings[0].startswith("--label: ")


def test_repeated_label_keeps_the_last_value(config: str) -> None:
    """A name given twice keeps its last value, with a warning."""
    warnings: list[str] = []
    settings = parse_settings(["-c", config], {"PG_EXPORTER_LABEL": "a=1,a=2"}, warnings)
    assert settings.const_labels == (("a", "2"),)
    assert warnings == ["$PG_EXPORTER_LABEL: label 'a' is given twice; the last value wins"]


def test_main_logs_skipped_label_items_and_starts(
    config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed --label item does not stop start-up: it is logged and skipped."""
    assert main(["--dry-run", "-c", config, "--label", "oops,cluster=main"]) == 0
    assert "level=warn msg=\"--label: skipping 'oops'" in capsys.readouterr().err


def test_tags_are_deduplicated(config: str) -> None:
    """Repeated tags collapse to one, in first-seen order."""
    assert parse(config, "-t", "b,a,b").tags == ("b", "a")


def test_empty_exclude_list_excludes_nothing(config: str) -> None:
    """An explicitly empty --exclude-database turns the default exclusion off."""
    assert parse(config, "--exclude-database=").exclude_databases == ()


@pytest.mark.parametrize(("millis", "seconds"), [("0", 0.1), ("-5", 0.1), ("1", 0.001)])
def test_connect_timeout_floor(config: str, millis: str, seconds: float) -> None:
    """A connect timeout of 0 ms or less means 100 ms; values are stored in seconds."""
    assert parse(config, f"--connect-timeout={millis}").connect_timeout == seconds


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-T", "fast"], "--connect-timeout must be a whole number, not 'fast'"),
        (["--max-series", "0"], "--max-series must be greater than 0"),
        (["--max-series", "-3"], "--max-series must be greater than 0"),
        (["--max-series", "1e3"], "--max-series must be a whole number"),
        (["--backoff-ceiling", "-1"], "--backoff-ceiling must be a number of seconds >= 0"),
        (["--backoff-ceiling", "soon"], "--backoff-ceiling must be a number of seconds >= 0"),
        (["--backoff-ceiling", "inf"], "--backoff-ceiling must be a number of seconds >= 0"),
        (
            ["--server.time-budget", "-1"],
            "--server.time-budget must be milliseconds of "
            "server time a second, 0 for none .a number from 0 to 1e.06.*, not '-1'",
        ),
        (["--server.time-budget", "nan"], "--server.time-budget must be milliseconds"),
        (["--server.time-budget", "1e400"], "--server.time-budget must be milliseconds"),
        (["--server.time-budget", "5_0"], "--server.time-budget must be milliseconds"),
        (["--server.time-budget", "2000000"], "--server.time-budget must be milliseconds"),
        (["--max-connections", "1"], "--max-connections must be at least 2"),
        (["--max-connections", "many"], "--max-connections must be a whole number"),
        (["--server.max-connections", "1"], "--server.max-connections must be at least 2"),
        (["--server.max-failed-logins", "0"], "--server.max-failed-logins must be failed"),
        (["--parallel-databases", "0"], "--parallel-databases must be at least 1"),
        (["--max-total-series", "-1"], "--max-total-series must be 0 .no limit. or more"),
        (["--log.level", "trace"], "--log.level must be one of debug, info, warn, error"),
        (["--log.format", "text"], "--log.format must be one of logfmt, json"),
        (["--namespace", "pg-x"], "'pg-x' is not a valid metric name prefix"),
        (["--web.config.file", "/nonexistent/web.yml"], "is not a readable file"),
    ],
)
def test_bad_values(config: str, argv: list[str], message: str) -> None:
    """Values of the wrong shape are usage errors that name the flag and the value."""
    with pytest.raises(UsageError, match=message):
        parse(config, *argv)


NINES = "9" * 400


@pytest.mark.parametrize(
    ("flag", "minimum"),
    [
        ("--connect-timeout", "-2147483647"),
        ("--max-series", "1"),
        ("--max-connections", "2"),
        ("--parallel-databases", "1"),
        ("--max-total-series", "0"),
        ("--targets.max-concurrent", "1"),
        ("--server.max-connections", "2"),
        ("--server.max-failed-logins", "1"),
    ],
)
@pytest.mark.parametrize("value", [NINES, f"-{NINES}", "2147483648", "9" * 5000])
def test_numbers_that_do_not_fit_are_refused_with_flag_and_range(
    config: str, flag: str, minimum: str, value: str
) -> None:
    """400 digits once gave an OverflowError traceback (issue 25): now a usage error naming
    the flag and its range, quoting an excerpt of the value only."""
    with pytest.raises(UsageError) as caught:
        parse(config, flag, value)
    message = str(caught.value)
    assert message.startswith(f"{flag} must be ")
    assert f"(a whole number from {minimum} to 2147483647)" in message
    assert len(message) < 400


def test_connect_timeout_of_400_digits_is_one_line_and_exit_1(
    config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's reproduction through main: one line on stderr, no traceback (issue 25)."""
    assert main(["-c", config, "--dry-run", "--connect-timeout", NINES]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("pg_exporter: --connect-timeout must be milliseconds")


@pytest.mark.parametrize("value", ["1e300", NINES, "nan", "-inf"])
def test_backoff_ceiling_that_does_not_fit_is_refused(config: str, value: str) -> None:
    """Seconds beyond the longest Go duration, or not finite: refused with the range."""
    with pytest.raises(
        UsageError, match=r"at most 9223372037 \(the longest Go duration\)"
    ) as caught:
        parse(config, "--backoff-ceiling", value)
    assert len(str(caught.value)) < 400


def test_bad_environment_value_names_the_variable(config: str) -> None:
    """An error from the environment names the variable, not a flag the user never typed."""
    with pytest.raises(UsageError, match=r"\$PG_EXPORTER_CONNECT_TIMEOUT must be a whole"):
        parse(config, PG_EXPORTER_CONNECT_TIMEOUT="1.5")
    with pytest.raises(UsageError, match=r"\$PG_EXPORTER_MAX_SERIES must be greater than 0"):
        parse(config, PG_EXPORTER_MAX_SERIES="0")


def test_empty_namespace_means_automatic(config: str) -> None:
    """An empty --namespace keeps the automatic choice (pg or pgbouncer)."""
    assert parse(config, "--namespace=").namespace is None


def test_web_config_file_kept(config: str, tmp_path: Path) -> None:
    """An existing --web.config.file is passed through."""
    web = tmp_path / "web.yml"
    web.write_text("{}\n")
    assert parse(config, "--web.config.file", str(web)).web_config_file == str(web)


# --- command-line syntax errors ----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--urll", "x"], "unknown flag --urll; did you mean --url\\?"),
        (["--zzz"], "unknown flag --zzz; see --help"),
        (["-Z"], "unknown flag -Z"),
        (["extra"], "unexpected argument 'extra'"),
        (["--url"], "--url needs a value"),
        (["-u"], "--url needs a value"),
        (["--url", "a", "--url", "b"], "--url is given more than once"),
        (["-C", "--disable-cache"], "--disable-cache is given more than once"),
    ],
)
def test_syntax_errors(config: str, argv: list[str], message: str) -> None:
    """Unknown flags, stray arguments, missing values and repeats are usage errors."""
    with pytest.raises(UsageError, match=message):
        parse(config, *argv)


# --- URL ----------------------------------------------------------------------------------


def test_url_precedence(config: str, tmp_path: Path) -> None:
    """--url > $PG_EXPORTER_URL > $PGURL > $PG_EXPORTER_URL_FILE > default."""
    url_file = tmp_path / "url"
    url_file.write_text("  postgres://file/db\n")
    env = {"PG_EXPORTER_URL": "postgres://env/db", "PGURL": "postgres://pgurl/db",
           "PG_EXPORTER_URL_FILE": str(url_file)}  # fmt: skip
    assert parse(config, "-u", "postgres://flag/db", **env).url == "postgres://flag/db"
    assert parse(config, **env).url == "postgres://env/db"
    del env["PG_EXPORTER_URL"]
    assert parse(config, **env).url == "postgres://pgurl/db"
    del env["PGURL"]
    assert parse(config, **env).masked_url == "postgres://file/db?sslmode=disable"
    assert parse(config).masked_url == "postgresql:///?sslmode=disable"


@pytest.mark.parametrize(
    ("argv", "env", "origin"),
    [
        (["-u", "postgresql://u:50%off-Zq9@h/db"], {}, "--url"),
        ([], {"PG_EXPORTER_URL": "host=h password=Zq9a Zq9b"}, "$PG_EXPORTER_URL"),
        ([], {"PGURL": "postgresql://u:Zq9 x@h/db"}, "$PGURL"),
    ],
)
def test_unreadable_url_is_a_usage_error_naming_its_origin(
    config: str, argv: list[str], env: dict[str, str], origin: str
) -> None:
    """A URL libpq rejects is refused at start, naming where it came from, quoting no secret."""
    with pytest.raises(UsageError, match=f"^{re.escape(origin)}: libpq cannot read") as caught:
        parse(config, *argv, **env)
    assert "Zq9" not in str(caught.value)


def test_unreadable_url_file_exits_1_without_password(
    config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """main with an unreadable URL in $PG_EXPORTER_URL_FILE: one line, exit 1, no secret."""
    url_file = tmp_path / "url"
    url_file.write_text("postgresql://u:Zq9?#50%off@h/db\n")
    monkeypatch.setenv("PG_EXPORTER_URL_FILE", str(url_file))
    assert main(["-c", config]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"pg_exporter: $PG_EXPORTER_URL_FILE '{url_file}': libpq cannot read")
    assert "Zq9" not in line


def test_unreadable_url_file_names_the_file(config: str, tmp_path: Path) -> None:
    """A URL file that cannot be read is a usage error naming the file."""
    missing = tmp_path / "nope"
    with pytest.raises(UsageError, match=f"cannot read \\$PG_EXPORTER_URL_FILE '{missing}'"):
        parse(config, PG_EXPORTER_URL_FILE=str(missing))


def test_empty_url_file_is_refused(config: str, tmp_path: Path) -> None:
    """An empty URL file is a mistake, not a request for the default target."""
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(UsageError, match="is empty"):
        parse(config, PG_EXPORTER_URL_FILE=str(empty))


# --- config lookup --------------------------------------------------------------------------


def test_config_flag_beats_environment(config: str, tmp_path: Path) -> None:
    """--config wins over $PG_EXPORTER_CONFIG, which wins over the candidates."""
    other = tmp_path / "other.yml"
    other.write_text(COLLECTOR)
    Path("pg_exporter.yml").write_text(COLLECTOR)
    env = {"PG_EXPORTER_CONFIG": str(other)}
    assert parse_settings(["--config", config], env).config == config
    assert parse_settings([], env).config == str(other)
    assert parse_settings([], {}).config == "./pg_exporter.yml"


def test_config_candidates_in_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without a config setting, the first existing candidate is used, file or directory."""
    first, second, third = tmp_path / "a.yml", tmp_path / "b.yml", tmp_path / "dir"
    monkeypatch.setattr(settings_module, "CONFIG_CANDIDATES", (str(first), str(second),
                                                               str(third)))  # fmt: skip
    third.mkdir()
    assert parse_settings([], {}).config == str(third)
    second.write_text(COLLECTOR)
    assert parse_settings([], {}).config == str(second)
    first.write_text(COLLECTOR)
    assert parse_settings([], {}).config == str(first)


def test_no_config_found_says_what_was_looked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no config anywhere, the error lists the candidates and how to give one."""
    monkeypatch.setattr(settings_module, "CONFIG_CANDIDATES", ("/nonexistent/x.yml",))
    with pytest.raises(UsageError, match=r"looked for /nonexistent/x.yml.*--config"):
        parse_settings([], {})


@pytest.mark.parametrize(
    ("argv", "env", "origin"),
    [(["-c", "/nonexistent.yml"], {}, "--config"),
     ([], {"PG_EXPORTER_CONFIG": "/nonexistent.yml"}, "\\$PG_EXPORTER_CONFIG")],
)  # fmt: skip
def test_missing_config_path(
    argv: list[str],
    env: dict[str, str],
    origin: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A config path that does not exist exits 2 (the exporter cannot be created), naming
    the path and where it came from; with --dry-run it is a config that does not load: 1."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    message = f"'/nonexistent.yml' (from {origin.replace(chr(92), '')}) does not exist"
    assert message in capsys.readouterr().err
    assert main([*argv, "--dry-run"]) == 1


# --- main ------------------------------------------------------------------------------------


def test_help_and_version_are_requests(config: str) -> None:
    """--help and --version stop parsing with the text to print, even beside other flags."""
    with pytest.raises(InfoRequested, match="usage: pg_exporter"):
        parse(config, "-C", "-h")
    with pytest.raises(InfoRequested, match="pg_exporter version"):
        parse_settings(["--version"], {})


def test_main_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """main --help prints every long flag, short form and variable, and exits 0."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in FLAGS:
        assert f"--{'[no-]' if flag.kind is Kind.SWITCH else ''}{flag.name}" in out
        assert not flag.short or f"-{flag.short}, " in out
        assert f"[${flag.env}]" in out if flag.env else True
    assert "PG_EXPORTER_URL_FILE" in out


def test_main_version(capsys: pytest.CaptureFixture[str]) -> None:
    """main --version prints our version, the Python version and the platform, exit 0."""
    import exporter

    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert f"pg_exporter version {exporter.__version__}" in out
    assert platform.python_version() in out
    assert sys.platform in out


@pytest.mark.parametrize("argv", [["--bogus"], ["--log.level=loud"], ["stray"]])
def test_main_usage_error_is_one_line_exit_1(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input exits 1 with one 'pg_exporter: reason' line on stderr and no traceback."""
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("pg_exporter: ")


@pytest.mark.parametrize("mode", [[], ["--dry-run"], ["--explain"]])
@pytest.mark.parametrize(
    "bad",
    [["--web.listen-address", ":65536"], ["--web.listen-address=[::1]:x"], ["-P", "/version"]],
)
def test_every_mode_refuses_bad_web_settings_alike(
    config: str,
    mode: list[str],
    bad: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Serving, --dry-run and --explain refuse a listen address or telemetry path that
    cannot be served the same way: exit 1, one line, before the config is loaded."""
    _fake_module(monkeypatch, "exporter.serve", run=lambda *a: pytest.fail("served"))
    _fake_module(monkeypatch, "exporter.report.explain", run=lambda *a: pytest.fail("explained"))
    monkeypatch.setattr(
        "exporter.config.loading.load_for_settings", lambda *a: pytest.fail("loaded")
    )
    assert main([*mode, "-c", config, *bad]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("pg_exporter: ")
    assert bad[-1].rpartition("=")[2] in line


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attributes: object) -> None:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    # `from exporter import serve` reads the package attribute once the real module
    # was imported by another test, so replace that too.
    package, _, attribute = name.rpartition(".")
    monkeypatch.setattr(sys.modules[package], attribute, module, raising=False)


def test_main_serves_with_masked_url_logged(
    config: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """By default main hands settings and definitions to serve.run and returns its exit code."""
    calls: list[tuple[Settings, Definitions]] = []

    def run(
        settings: Settings,
        definitions: Definitions,
        web_config: object = None,
        declared: object = None,
    ) -> int:
        calls.append((settings, definitions))
        return 7

    _fake_module(monkeypatch, "exporter.serve", run=run)
    assert main(["-c", config, "-u", "postgres://u:s3?cr#t@h/db", "-T", "5"]) == 7
    ((settings, definitions),) = calls
    assert settings.connect_timeout == 0.005
    assert [c.key for c in definitions.collectors] == ["pg_demo"]
    err = capsys.readouterr().err
    assert "s3" not in err
    assert "cr#t" not in err
    assert 'url="postgres://u:xxxxx@h/db?sslmode=disable"' in err


def test_main_explain_runs_explain_main(config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """--explain runs explain.run and returns its code."""

    def run(settings: Settings, definitions: Definitions) -> int:
        return 3 if settings.explain and definitions.collectors else 4

    _fake_module(monkeypatch, "exporter.report.explain", run=run)
    assert main(["-c", config, "--explain"]) == 3


def test_main_dry_run_prints_collectors(
    config: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--dry-run prints the loaded collectors as YAML, exits 0 and touches no database."""
    _fake_module(monkeypatch, "exporter.serve")  # no run(): serving would fail the test
    assert main(["--dry-run", "-c", config, "--log.format=json"]) == 0
    out = capsys.readouterr().out
    assert "pg_demo:" in out
    assert "SELECT datname, numbackends" in out
    assert f"# from {config}" in out


@pytest.mark.parametrize("label", ["db=x", "datname=x"])
def test_main_const_label_conflict_exits_2(
    config: str, label: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --label clashing with a collector's or self-metric's label exits 2 naming it (§1);
    --dry-run reports the same and exits 1."""
    _fake_module(monkeypatch, "exporter.serve", run=lambda *a: pytest.fail("served"))
    assert main(["-c", config, "--label", label]) == 2
    err = capsys.readouterr().err
    assert label.split("=", maxsplit=1)[0] in err
    assert "conflict" in err
    assert main(["--dry-run", "-c", config, "--label", label]) == 1


def test_main_const_label_without_conflict_is_fine(config: str) -> None:
    """A const label no collector uses is accepted."""
    assert main(["--dry-run", "-c", config, "--label", "cluster=main"]) == 0


def test_main_invalid_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An invalid collector file exits 2 with its problems on stderr (1 with --dry-run)."""
    bad = tmp_path / "bad.yml"
    bad.write_text("pg_bad:\n  metrics: []\n")
    _fake_module(monkeypatch, "exporter.serve", run=lambda *a: pytest.fail("served"))
    assert main(["-c", str(bad)]) == 2
    capsys.readouterr()
    assert main(["--dry-run", "-c", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "pg_exporter: " in captured.err
    assert "pg_bad" in captured.err


def test_main_config_error_while_serving_exits_2(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ConfigError raised after loading (e.g. a const-label clash) also exits 2."""

    def run(
        settings: Settings,
        definitions: Definitions,
        web_config: object = None,
        declared: object = None,
    ) -> int:
        raise ConfigError([Problem("--label", "clashes with a collector label")])

    _fake_module(monkeypatch, "exporter.serve", run=run)
    assert main(["-c", config]) == 2


def test_main_unexpected_error_is_logged_exit_1(
    config: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unexpected exception is logged on one line (never a bare traceback) and exits 1."""

    def run(
        settings: Settings,
        definitions: Definitions,
        web_config: object = None,
        declared: object = None,
    ) -> int:
        raise RuntimeError("wires crossed at postgres://u:pw@h/db")

    _fake_module(monkeypatch, "exporter.serve", run=run)
    assert main(["-c", config]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert "level=error" in lines[-1]
    assert "RuntimeError: wires crossed at postgres://u:xxxxx@h/db" in lines[-1]
    assert all(line.startswith("ts=") for line in lines)


# --- dry-run rendering -------------------------------------------------------------------------


def test_dry_run_output_loads_back_to_the_same_collectors(config: str, tmp_path: Path) -> None:
    """The dry-run YAML is itself a valid collector file describing the same collectors."""
    _assert_round_trip(config, tmp_path)


def test_dry_run_round_trips_the_shipped_collectors(tmp_path: Path) -> None:
    """Every shipped collector survives dry-run rendering field for field."""
    shipped = Path(__file__).resolve().parents[1] / "collectors"
    _assert_round_trip(str(shipped), tmp_path)


def _assert_round_trip(path: str, tmp_path: Path) -> None:
    original = load_definitions(path)
    again = tmp_path / "again.yml"
    again.write_text(render_definitions(original))
    reloaded = load_definitions(str(again))
    assert len(original.collectors) > 0
    assert [dataclasses.replace(c, source="") for c in reloaded.collectors] == [
        dataclasses.replace(c, source="") for c in original.collectors
    ]


def test_main_invalid_web_config_exits_1(
    config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An invalid --web.config.file stops start-up with exit 1 and a one-line reason."""
    # Serving despite the bad file returns 0 here (and fails the test) instead of listening.
    _fake_module(monkeypatch, "exporter.serve", run=lambda *args, **kwargs: 0)
    web_config = tmp_path / "web.yml"
    web_config.write_text("basic_auth_users:\n  admin: not-a-bcrypt-hash\n")
    assert main(["-c", config, "--web.config.file", str(web_config)]) == 1
    err = capsys.readouterr().err
    reasons = [line for line in err.splitlines() if line.startswith("pg_exporter: ")]
    assert len(reasons) == 1
    assert "web.yml" in reasons[0]
    assert "not-a-bcrypt-hash" not in err


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_url_file_that_is_not_a_regular_file_is_refused_at_once(
    config: str, tmp_path: Path, kind: str
) -> None:
    """$PG_EXPORTER_URL_FILE a FIFO (would wait for a writer) or /dev/zero (would never
    end): a usage error at once (issue 25)."""
    path = tmp_path / "fifo"
    if kind == "fifo":
        os.mkfifo(path)
    named = str(path) if kind == "fifo" else kind
    with pytest.raises(UsageError, match=r"it is a (FIFO|character device), not a regular file"):
        _within_seconds(lambda: parse(config, PG_EXPORTER_URL_FILE=named))


def _within_seconds(call: Callable[[], object], seconds: float = 10) -> None:
    """Run ``call`` in a thread; fail if it has not returned or raised within ``seconds``."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # re-raised below, in the test's thread
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still reading after {seconds}s"
    if outcome:
        raise outcome[0]
