"""The flag table and the command-line scanner behind :mod:`exporter.cli`.

One table describes every flag: its long and short names, kind, environment
variable, default and help. The scanner turns argv into flag → values and the
same table renders ``--help``.
"""

from __future__ import annotations

import enum
import platform
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import exporter
from exporter.config import settings as defaults
from exporter.config.logs import FORMATS, LEVELS
from exporter.errors import InfoRequested, UsageError

# Go's strconv.ParseBool spellings (compared lower-cased), plus yes/no.
TRUE = ("true", "t", "1", "yes")
FALSE = ("false", "f", "0", "no")


class Kind(enum.Enum):
    """How a flag consumes the command line."""

    VALUE = "value"  # one value, given at most once
    LIST = "list"  # one value per occurrence, repeatable
    SWITCH = "switch"  # boolean: --X, --no-X, --X=true|false
    ACTION = "action"  # --help, --version


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag and the environment variable that stands in for it."""

    name: str  # long form without the leading dashes
    short: str
    env: str
    kind: Kind
    metavar: str
    default: str  # as shown by --help
    help: str
    aliases: tuple[str, ...] = ()  # older spellings, still read


#: How our own flags are named (issue 37), as the Go exporter's kingpin flags are: a dot
#: follows a namespace of what the flag bounds or serves (``web.``, ``log.``,
#: ``targets.`` a fleet, ``server.`` what we take of a PostgreSQL server: connections,
#: failed logins, time), hyphens join the words of a name; a flag outside any namespace
#: is a plain name (``--max-series``). An older spelling stays an alias.
NAMESPACES = ("web", "log", "targets", "server")


_V, _L, _S, _A = Kind.VALUE, Kind.LIST, Kind.SWITCH, Kind.ACTION
_ENV = "PG_EXPORTER_"
FLAGS = (
    #    long name             short env                     kind  metavar   default
    Flag("help",                "h", "",                     _A, "",         "",
         "Show this help and exit."),
    Flag("version",             "",  "",                     _A, "",         "",
         "Show the version, Python and platform, then exit."),
    Flag("url",                 "u", "",                     _V, "URL",      defaults.DEFAULT_URL,
         "Target URL or keyword DSN: PostgreSQL, or pgBouncer's admin database 'pgbouncer'. "
         "Without it: $PG_EXPORTER_URL, $PGURL, then the contents of the file named by "
         "$PG_EXPORTER_URL_FILE. sslmode=disable is added when no sslmode is set."),
    Flag("config",              "c", _ENV + "CONFIG",        _V, "PATH",     "",
         "Collector file, or directory of *.yml files. Without it, the first that exists of "
         + ", ".join(defaults.CONFIG_CANDIDATES) + "."),
    Flag("web.listen-address",  "",  "",                     _L, "[HOST]:PORT",
         str(defaults.DEFAULT_LISTEN), "Address to serve on; repeat the flag for several."),
    Flag("web.systemd-socket",  "",  "",                     _S, "",         "false",
         "Serve on the sockets systemd passes (socket activation) instead of "
         "--web.listen-address."),
    Flag("web.config.file",     "",  "",                     _V, "PATH",     "",
         "TLS and basic-auth settings, in the exporter-toolkit web config format."),
    Flag("web.enable-openmetrics", "", _ENV + "ENABLE_OPENMETRICS", _S, "", "false",
         "Answer in OpenMetrics when the scraper asks for it. Off by default, as in the Go "
         "exporter: OpenMetrics requires counters to end in _total, so Prometheus would "
         "store every counter under a new name."),
    Flag("web.telemetry-path",  "P", _ENV + "TELEMETRY_PATH", _V, "PATH",
         defaults.DEFAULT_TELEMETRY_PATH, "Path of the metrics page."),
    Flag("label",               "l", _ENV + "LABEL",         _V, "K=V,...",  "",
         "Constant labels added to every series."),
    Flag("tag",                 "t", _ENV + "TAG",           _V, "TAG,...",  "",
         "Tags of this server, matched against the tags of collectors."),
    Flag("disable-cache",       "C", _ENV + "DISABLE_CACHE", _S, "",         "false",
         "Run every collector on every scrape, ignoring ttl."),
    Flag("disable-intro",       "m", _ENV + "DISABLE_INTRO", _S, "",         "false",
         "Do not export the exporter's own metrics, pg_up included."),
    Flag("auto-discovery",      "a", _ENV + "AUTO_DISCOVERY", _S, "",        "true",
         "Also scrape the other databases of the cluster."),
    Flag("exclude-database",    "x", _ENV + "EXCLUDE_DATABASE", _V, "DB,...",
         ",".join(defaults.DEFAULT_EXCLUDE),
         "Databases auto-discovery leaves out: names, or shell patterns with *, ? and [...]."),
    Flag("include-database",    "i", _ENV + "INCLUDE_DATABASE", _V, "DB,...", "",
         "When set, auto-discovery scrapes only these databases: names, or shell patterns "
         "with *, ? and [...]."),
    Flag("namespace",           "n", _ENV + "NAMESPACE",     _V, "NAME",
         "pg, or pgbouncer for pgBouncer", "Prefix of the exporter's own metrics."),
    Flag("fail-fast",           "f", _ENV + "FAIL_FAST",     _S, "",         "false",
         "Exit at start-up when the target cannot be reached."),
    Flag("connect-timeout",     "T", _ENV + "CONNECT_TIMEOUT", _V, "MS",
         str(defaults.DEFAULT_CONNECT_TIMEOUT_MS), "Connect timeout in ms; 0 or less means 100."),
    Flag("max-series",          "",  _ENV + "MAX_SERIES",    _V, "N",
         str(defaults.DEFAULT_MAX_SERIES),
         "Most series one collector may produce; above it the collector fails and publishes "
         "nothing. A collector's own max_series overrides it."),
    Flag("backoff-ceiling",     "",  _ENV + "BACKOFF_CEILING", _V, "SECONDS",
         f"{defaults.DEFAULT_BACKOFF_CEILING:g}",
         "Longest wait before a collector that keeps failing runs again: the wait starts at "
         "its ttl and doubles with each failure in a row, with jitter. 0 waits the ttl only. "
         "A collector's own backoff_ceiling overrides it."),
    Flag("server.time-budget",  "",  _ENV + "SERVER_TIME_BUDGET", _V, "MS",
         f"{defaults.DEFAULT_SERVER_TIME_BUDGET_MS:g}",
         "Most milliseconds of server time a second the exporter's statements may take, "
         "averaged over 5 minutes: over it, the costliest of the least important collectors "
         "are refreshed less often, never beyond their back-off ceiling, never a fatal one. "
         "0: no budget. With --disable-cache there is none unless this is given.",
         aliases=("server-time-budget",)),
    Flag("max-connections",     "",  _ENV + "MAX_CONNECTIONS", _V, "N",
         str(defaults.DEFAULT_MAX_CONNECTIONS),
         "Most connections the exporter holds to its target at once, the health probe's "
         "included (at least 2). With more databases than that, the least recently used "
         "connection is closed to open another."),
    Flag("parallel-databases",  "",  _ENV + "PARALLEL_DATABASES", _V, "N",
         str(defaults.DEFAULT_PARALLEL_DATABASES),
         "Databases scraped at once within a pass, the main one included (at least 1); "
         "never more than --max-connections leaves them, the health probe's connection "
         "aside."),
    Flag("max-total-series",    "",  _ENV + "MAX_TOTAL_SERIES", _V, "N",
         str(defaults.DEFAULT_MAX_TOTAL_SERIES),
         "Most series one scrape publishes over every collector and database; above it "
         "whole collectors are left out, the least important first. 0: no limit."),
    Flag("targets.file",        "",  _ENV + "TARGETS_FILE",  _V, "PATH",     "",
         "YAML file declaring the targets of a fleet: each is served at /probe?target=NAME "
         "(see docs/fleet.md). Without it the exporter watches the one target of --url."),
    Flag("targets.max-concurrent", "", _ENV + "TARGETS_MAX_CONCURRENT", _V, "N",
         str(defaults.DEFAULT_MAX_CONCURRENT_TARGETS),
         "Fleet mode: most targets collected at once (at least 1); a probe over it waits "
         "within its budget, then gets 503."),
    Flag("server.max-connections", "", _ENV + "SERVER_MAX_CONNECTIONS", _V, "N",
         f"{defaults.DEFAULT_SERVER_MAX_CONNECTIONS}, or --max-connections if larger",
         "Most connections the exporter holds at one PostgreSQL server at once (its address "
         "as resolved), over every target, database and health probe naming it (at least "
         "2); health probes take at most half. Over it, idle connections are closed, passes "
         "wait within their budget and health probes answer 503."),
    Flag("server.max-failed-logins", "", _ENV + "SERVER_MAX_FAILED_LOGINS", _V, "PER_MINUTE",
         str(defaults.DEFAULT_SERVER_MAX_FAILED_LOGINS),
         "Most logins one PostgreSQL server may refuse the exporter a minute, after a first "
         "burst of --server.max-connections (at least 1); past it no login is tried there."),
    Flag("dry-run",             "D", "",                     _S, "",         "false",
         "Print the collector definitions as loaded, then exit; no database needed."),
    Flag("explain",             "E", "",                     _S, "",         "false",
         "Connect, print which collectors are planned and why, then exit."),
    Flag("log.level",           "",  "",                     _V, "LEVEL",    "info",
         "Log level: " + ", ".join(LEVELS) + "."),
    Flag("log.format",          "",  "",                     _V, "FORMAT",   "logfmt",
         "Log format on stderr: " + ", ".join(FORMATS) + "."),
)  # fmt: skip
BY_LONG = {name: flag for flag in FLAGS for name in (flag.name, *flag.aliases)}
_BY_SHORT = {flag.short: flag for flag in FLAGS if flag.short}


# --- scanning the command line ---------------------------------------------------------


def scan(argv: Sequence[str]) -> dict[str, list[str]]:
    """Flag name → values given on the command line (switches as 'true'/'false')."""
    given: dict[str, list[str]] = {}
    tokens = iter(argv)
    for token in tokens:
        if token.startswith("--") and len(token) > 2:
            _long(token[2:], tokens, given)
        elif token.startswith("-") and len(token) > 1:
            _shorts(token[1:], tokens, given)
        else:
            raise UsageError(f"unexpected argument {token!r}: pg_exporter takes only flags")
    return given


def _long(body: str, tokens: Iterator[str], given: dict[str, list[str]]) -> None:
    name, has_value, inline = body.partition("=")
    flag = BY_LONG.get(name)
    negated = BY_LONG.get(name.removeprefix("no-")) if name.startswith("no-") else None
    if flag is None and negated is not None and negated.kind is Kind.SWITCH:
        if has_value:
            raise UsageError(f"--{name} takes no value")
        _record(negated, "false", given)
    elif flag is None:
        import difflib  # only for a mistyped flag: 0.2 MiB when imported (issue 31)

        close = difflib.get_close_matches(name, list(BY_LONG), n=1)
        hint = f"; did you mean --{close[0]}?" if close else "; see --help"
        raise UsageError(f"unknown flag --{name}{hint}")
    elif flag.kind is Kind.SWITCH:
        _record(flag, bool_text(inline, f"--{name}") if has_value else "true", given)
    else:
        _take(flag, inline if has_value else next(tokens, None), given)


def _shorts(cluster: str, tokens: Iterator[str], given: dict[str, list[str]]) -> None:
    """``-C``, ``-Cm``, ``-u URL``, ``-uURL``, ``-Cu URL``: switches, then one value flag."""
    for index, letter in enumerate(cluster):
        flag = _BY_SHORT.get(letter)
        if flag is None:
            raise UsageError(f"unknown flag -{letter}; see --help")
        if flag.kind is Kind.SWITCH:
            _record(flag, "true", given)
            continue
        rest = cluster[index + 1 :].removeprefix("=")
        _take(flag, rest or next(tokens, None), given)
        return


def _take(flag: Flag, value: str | None, given: dict[str, list[str]]) -> None:
    if flag.kind is Kind.ACTION:
        raise InfoRequested(help_text() if flag.name == "help" else version_text())
    if value is None:
        raise UsageError(f"--{flag.name} needs a value ({flag.metavar})")
    _record(flag, value, given)


def _record(flag: Flag, value: str, given: dict[str, list[str]]) -> None:
    values = given.setdefault(flag.name, [])
    if values and flag.kind is not Kind.LIST:
        raise UsageError(f"--{flag.name} is given more than once; give it once")
    values.append(value)


def bool_text(text: str, origin: str) -> str:
    """Normalise a boolean spelling to 'true' or 'false'."""
    lowered = text.strip().lower()
    if lowered in TRUE:
        return "true"
    if lowered in FALSE:
        return "false"
    raise UsageError(f"{origin} must be true or false, not {text!r}")


# --- help and version --------------------------------------------------------------------


def help_text() -> str:
    lines = [
        "usage: pg_exporter [flags]",
        "",
        "Prometheus exporter for PostgreSQL and pgBouncer.",
        "",
        "Flags:",
    ]
    for flag in FLAGS:
        lines.append(f"  {_flag_synopsis(flag)}")
        notes = [flag.help]
        if flag.env:
            notes.append(f"[${flag.env}]")
        if flag.default:
            notes.append(f"(default: {flag.default})")
        if flag.aliases:
            notes.append("(also " + ", ".join(f"--{a}" for a in flag.aliases) + ")")
        lines.extend(
            textwrap.wrap(" ".join(notes), 88, initial_indent=" " * 6, subsequent_indent=" " * 6)
        )
    return "\n".join(lines)


def _flag_synopsis(flag: Flag) -> str:
    short = f"-{flag.short}, " if flag.short else ""
    if flag.kind is Kind.SWITCH:
        return f"{short}--[no-]{flag.name}"
    if flag.kind is Kind.ACTION:
        return f"{short}--{flag.name}"
    return f"{short}--{flag.name}={flag.metavar}"


def version_text() -> str:
    return (
        f"pg_exporter version {exporter.__version__}\n"
        f"python: {platform.python_implementation()} {platform.python_version()}\n"
        f"platform: {sys.platform}/{platform.machine()}"
    )
