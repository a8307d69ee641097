"""Command line and environment → :class:`Settings`.

A small table-driven parser rather than argparse: we need exit code 1 with a
one-line reason, ``--no-X`` and ``--X=true|false`` for every switch, short
flag clusters like ``-Cm``, and the environment variable of each flag, all
described by one table (:mod:`exporter.config.flags`) that also renders ``--help``.
A flag and its ``PG_EXPORTER_*`` variable take the same path: looked up by
:class:`_Source`, checked by the rules of :mod:`exporter.config.rules`, and named in
any error by where the value came from.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence

from exporter.config import rules
from exporter.config import settings as defaults
from exporter.config.definitions import MAX_SECONDS
from exporter.config.files import FileRefused, read_regular
from exporter.config.flags import BY_LONG, bool_text, scan
from exporter.config.logs import FORMATS, LEVELS
from exporter.config.settings import ListenAddress, Settings
from exporter.config.targetsfile import MAX_SECRET_BYTES
from exporter.errors import TargetError, UsageError, excerpt

_PORT_MAX = 65535

#: Why a telemetry path cannot be served (empty when it can): the app's route table knows.
PathProblems = Callable[[str], list[str]]


def read_settings(
    argv: Sequence[str],
    environ: Mapping[str, str],
    warnings: list[str],
    path_problems: PathProblems,
) -> Settings:
    """Settings from flags, then environment, then defaults; UsageError on anything wrong.

    What the Go exporter tolerates (a malformed ``--label`` item) is skipped and
    described in ``warnings`` instead, for the caller to log.
    """
    src = _Source(scan(argv), environ, warnings)
    url, url_origin = _url(src)
    try:
        return _settings(src, url, path_problems)
    except TargetError as exc:  # the URL is read when the settings are made
        raise UsageError(f"{url_origin}: {exc}") from None


def _settings(src: _Source, url: str, path_problems: PathProblems) -> Settings:
    config, config_origin = _config(src)
    return Settings(
        url=url,
        config=config,
        config_origin=config_origin,
        listen_addresses=tuple(_listen(a) for a in src.given.get("web.listen-address", []))
        or (defaults.DEFAULT_LISTEN,),
        systemd_socket=src.switch("web.systemd-socket", default=False),
        web_config_file=_existing_file(src, "web.config.file"),
        openmetrics=src.switch("web.enable-openmetrics", default=False),
        telemetry_path=_telemetry_path(src, path_problems),
        const_labels=_labels(src),
        tags=_names(src, "tag", ()),
        disable_cache=src.switch("disable-cache", default=False),
        disable_intro=src.switch("disable-intro", default=False),
        auto_discovery=src.switch("auto-discovery", default=True),
        exclude_databases=_names(src, "exclude-database", defaults.DEFAULT_EXCLUDE),
        include_databases=_names(src, "include-database", ()),
        namespace=_namespace(src),
        fail_fast=src.switch("fail-fast", default=False),
        connect_timeout=_connect_timeout(src),
        max_series=_whole(src, "max-series", defaults.DEFAULT_MAX_SERIES, rules.MAX_SERIES),
        backoff_ceiling=_backoff_ceiling(src),
        server_time_budget=_given_amount(src, "server.time-budget", rules.SERVER_TIME_BUDGET_MS),
        max_connections=_whole(
            src, "max-connections", defaults.DEFAULT_MAX_CONNECTIONS, rules.MAX_CONNECTIONS
        ),
        max_total_series=_whole(
            src, "max-total-series", defaults.DEFAULT_MAX_TOTAL_SERIES, rules.MAX_TOTAL_SERIES
        ),
        parallel_databases=_whole(
            src, "parallel-databases", defaults.DEFAULT_PARALLEL_DATABASES, rules.PARALLEL_DATABASES
        ),
        targets_file=_existing_file(src, "targets.file"),
        max_concurrent_targets=_whole(
            src,
            "targets.max-concurrent",
            defaults.DEFAULT_MAX_CONCURRENT_TARGETS,
            rules.MAX_CONCURRENT_TARGETS,
        ),
        server_max_connections=_optional_whole(
            src, "server.max-connections", rules.SERVER_MAX_CONNECTIONS
        ),
        server_max_failed_logins=_whole(
            src,
            "server.max-failed-logins",
            defaults.DEFAULT_SERVER_MAX_FAILED_LOGINS,
            rules.SERVER_MAX_FAILED_LOGINS,
        ),
        dry_run=src.switch("dry-run", default=False),
        explain=src.switch("explain", default=False),
        log_level=_choice(src, "log.level", tuple(LEVELS), "info"),
        log_format=_choice(src, "log.format", FORMATS, "logfmt"),
    )


# --- flags, then environment ------------------------------------------------------------


class _Source:
    """Looks a setting up on the command line first, then in the environment."""

    def __init__(
        self, given: dict[str, list[str]], environ: Mapping[str, str], warnings: list[str]
    ) -> None:
        self.given = given
        self.environ = environ
        self.warnings = warnings

    def lookup(self, name: str) -> tuple[str, str] | None:
        """(value, where it came from) or None; an empty variable counts as unset."""
        if name in self.given:
            return self.given[name][-1], f"--{name}"
        env = BY_LONG[name].env
        if env and self.environ.get(env):
            return self.environ[env], f"${env}"
        return None

    def switch(self, name: str, *, default: bool) -> bool:
        """A boolean setting."""
        found = self.lookup(name)
        return default if found is None else bool_text(*found) == "true"


def _url(src: _Source) -> tuple[str, str]:
    """(URL, origin): --url > $PG_EXPORTER_URL > $PGURL > $PG_EXPORTER_URL_FILE > default."""
    if "url" in src.given:
        return src.given["url"][-1], "--url"
    for variable in ("PG_EXPORTER_URL", "PGURL"):
        if src.environ.get(variable):
            return src.environ[variable], f"${variable}"
    path = src.environ.get("PG_EXPORTER_URL_FILE")
    if not path:
        return defaults.DEFAULT_URL, "the default URL"
    try:
        url = read_regular(path, MAX_SECRET_BYTES).strip()
    except FileRefused as exc:
        raise UsageError(f"cannot read $PG_EXPORTER_URL_FILE {path!r}: {exc}") from None
    if not url:
        raise UsageError(f"$PG_EXPORTER_URL_FILE {path!r} is empty; put the target URL in it")
    return url, f"$PG_EXPORTER_URL_FILE {path!r}"


def _config(src: _Source) -> tuple[str, str]:
    """(path, origin). A named path is checked when loading (exit 2, as the Go exporter)."""
    found = src.lookup("config")
    if found:
        return found
    for candidate in defaults.CONFIG_CANDIDATES:
        if os.path.exists(candidate):
            return candidate, "the default lookup"
    raise UsageError(
        f"no collector config found (looked for {', '.join(defaults.CONFIG_CANDIDATES)}); "
        "give one with --config or $PG_EXPORTER_CONFIG"
    )


def _existing_file(src: _Source, name: str) -> str | None:
    found = src.lookup(name)
    if found is None:
        return None
    path, origin = found
    if not (os.path.isfile(path) and os.access(path, os.R_OK)):
        raise UsageError(f"{origin} {path!r} is not a readable file")
    return path


def _listen(address: str) -> ListenAddress:
    """``[host]:port``; the host may be empty, a name, IPv4 or bracketed IPv6; port 0-65535
    (0: the system picks a free port, as with the Go exporter)."""
    host, colon, port = address.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    bad_host = (":" in host or "[" in host or "]" in host) and not bracketed
    if not colon or bad_host or not (port.isascii() and port.isdigit()):
        raise UsageError(
            f"--web.listen-address {address!r} is not [host]:port (e.g. :9630, [::1]:9630)"
        )
    if not 0 <= int(port) <= _PORT_MAX:
        raise UsageError(
            f"--web.listen-address {address!r} is not [host]:port: the port must be 0-{_PORT_MAX} "
            "(0 for any free port)"
        )
    return ListenAddress(host.removeprefix("[").removesuffix("]") or None, int(port))


def _telemetry_path(src: _Source, path_problems: PathProblems) -> str:
    """An absolute, canonical path that no fixed route of the exporter already serves."""
    found = src.lookup("web.telemetry-path")
    if found is None or not found[0]:
        return defaults.DEFAULT_TELEMETRY_PATH
    problems = path_problems(found[0])
    if problems:
        raise UsageError(f"{found[1]} {found[0]!r}: " + "; ".join(problems))
    return found[0]


def _names(src: _Source, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A comma list of names; given empty, it is empty (``--exclude-database=``)."""
    found = src.lookup(name)
    return default if found is None else rules.comma_list(found[0])


def _labels(src: _Source) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` → pairs, with label names checked the way Prometheus checks them.

    As in the Go exporter, a malformed item is skipped (with a warning) rather than
    stopping start-up, and a repeated name keeps its last value.
    """
    found = src.lookup("label")
    if found is None:
        return ()
    text, origin = found
    pairs: dict[str, str] = {}
    for item in rules.items(text):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not rules.is_label_name(key):
            src.warnings.append(
                f"{origin}: skipping {item!r}: not name=value with a valid label name "
                f"({rules.LABEL_RULE})"
            )
            continue
        if key in pairs:
            src.warnings.append(f"{origin}: label {key!r} is given twice; the last value wins")
        pairs[key] = value
    return tuple(pairs.items())


def _namespace(src: _Source) -> str | None:
    """Empty means automatic (pg, or pgbouncer in pgBouncer mode)."""
    found = src.lookup("namespace")
    if found is None or not found[0]:
        return None
    if not rules.is_namespace(found[0]):
        raise UsageError(f"{found[1]} {found[0]!r} is not {rules.NAMESPACE_RULE}")
    return found[0]


def _whole(src: _Source, name: str, default: int, rule: rules.Whole) -> int:
    """A whole number in ``rule``'s range; the error names the flag or variable and the
    range, quoting at most an excerpt of what was given."""
    found = src.lookup(name)
    if found is None:
        return default
    text, origin = found
    value = rules.whole_number(text)
    if value is None:
        raise UsageError(f"{origin} must be a whole number, not {excerpt(text)}")
    if not rule.holds(value):
        raise UsageError(f"{origin} must be {rule}, not {excerpt(text)}")
    return value


def _optional_whole(src: _Source, name: str, rule: rules.Whole) -> int | None:
    """A whole number in ``rule``'s range, or None when not given (a derived default)."""
    return _whole(src, name, 0, rule) if src.lookup(name) is not None else None


def _given_amount(src: _Source, name: str, rule: rules.Amount) -> float | None:
    """A number in ``rule``'s range, None when neither flag nor variable gives one; the
    error names the flag or variable and the range."""
    found = src.lookup(name)
    if found is None:
        return None
    text, origin = found
    value = rules.number(text)
    if value is None or not rule.holds(value):
        raise UsageError(f"{origin} must be {rule}, not {excerpt(text)}")
    return value


def _connect_timeout(src: _Source) -> float:
    """Milliseconds on the command line, seconds in Settings; ≤ 0 falls back to 100 ms."""
    default = defaults.DEFAULT_CONNECT_TIMEOUT_MS
    millis = _whole(src, "connect-timeout", default, rules.CONNECT_TIMEOUT_MS)
    return (millis if millis > 0 else default) / 1000


def _backoff_ceiling(src: _Source) -> float:
    """Seconds, finite and >= 0 (D15)."""
    found = src.lookup("backoff-ceiling")
    if found is None:
        return defaults.DEFAULT_BACKOFF_CEILING
    try:
        seconds = float(found[0].strip())
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
        raise UsageError(
            f"{found[1]} must be a number of seconds >= 0 and at most {MAX_SECONDS:.0f} "
            f"(the longest Go duration), not {excerpt(found[0])}"
        )
    return seconds


def _choice(src: _Source, name: str, allowed: tuple[str, ...], default: str) -> str:
    found = src.lookup(name)
    if found is None:
        return default
    if found[0].lower() not in allowed:
        raise UsageError(f"{found[1]} must be one of {', '.join(allowed)}, not {found[0]!r}")
    return found[0].lower()
