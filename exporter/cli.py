"""Command line and environment → :class:`Settings`, and the ``pg_exporter`` entry point.

A small table-driven parser rather than argparse: we need exit code 1 with a
one-line reason, ``--no-X`` and ``--X=true|false`` for every switch, short
flag clusters like ``-Cm``, and the environment variable of each flag, all
described by one table that also renders ``--help``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence

import exporter
from exporter import settings as defaults
from exporter.declared import MAX_SECRET_BYTES, Declared, load_targets
from exporter.definitions import MAX_SECONDS
from exporter.dryrun import render_definitions
from exporter.errors import ConfigError, InfoRequested, TargetError, UsageError, excerpt
from exporter.files import FileRefused, read_regular
from exporter.flags import BY_LONG, bool_text, scan
from exporter.logs import FORMATS, LEVELS, configure_logging
from exporter.settings import ListenAddress, Settings
from exporter.validation import LABEL_NAME

log = logging.getLogger(__name__)

_PORT_MAX = 65535


def parse_settings(
    argv: Sequence[str], environ: Mapping[str, str], warnings: list[str] | None = None
) -> Settings:
    """Settings from flags, then environment, then defaults; UsageError on anything wrong.

    What the Go exporter tolerates (a malformed ``--label`` item) is skipped and
    described in ``warnings`` instead, for the caller to log.
    """
    src = _Source(scan(argv), environ, warnings if warnings is not None else [])
    url, url_origin = _url(src)
    try:
        return _settings(src, url)
    except TargetError as exc:  # the URL is read when the settings are made
        raise UsageError(f"{url_origin}: {exc}") from None


def _settings(src: _Source, url: str) -> Settings:
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
        telemetry_path=_telemetry_path(src),
        const_labels=_labels(src),
        tags=tuple(dict.fromkeys(_words(src.text("tag") or ""))),
        disable_cache=src.switch("disable-cache", default=False),
        disable_intro=src.switch("disable-intro", default=False),
        auto_discovery=src.switch("auto-discovery", default=True),
        exclude_databases=_database_list(src, "exclude-database", defaults.DEFAULT_EXCLUDE),
        include_databases=_database_list(src, "include-database", ()),
        namespace=_namespace(src),
        fail_fast=src.switch("fail-fast", default=False),
        connect_timeout=_connect_timeout(src),
        max_series=_max_series(src),
        backoff_ceiling=_backoff_ceiling(src),
        max_connections=_max_connections(src),
        max_total_series=_max_total_series(src),
        parallel_databases=_parallel_databases(src),
        targets_file=_existing_file(src, "targets.file"),
        max_concurrent_targets=_at_least(
            src, "targets.max-concurrent", defaults.DEFAULT_MAX_CONCURRENT_TARGETS, 1, "at least 1"
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

    def text(self, name: str) -> str | None:
        """The value, wherever it came from."""
        found = self.lookup(name)
        return found[0] if found else None

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


def _telemetry_path(src: _Source) -> str:
    """An absolute, canonical path that no fixed route of the exporter already serves."""
    found = src.lookup("web.telemetry-path")
    if found is None or not found[0]:
        return defaults.DEFAULT_TELEMETRY_PATH
    from exporter.web.routes import telemetry_path_problems  # checked against the route table

    problems = telemetry_path_problems(found[0])
    if problems:
        raise UsageError(f"{found[1]} {found[0]!r}: " + "; ".join(problems))
    return found[0]


def _words(text: str) -> list[str]:
    return [word.strip() for word in text.split(",") if word.strip()]


def _database_list(src: _Source, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    found = src.lookup(name)
    return default if found is None else tuple(_words(found[0]))


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
    for item in _words(text):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not LABEL_NAME.fullmatch(key) or key.startswith("__"):
            src.warnings.append(
                f"{origin}: skipping {item!r}: not name=value with a valid label name "
                "([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"
            )
            continue
        if key in pairs:
            src.warnings.append(f"{origin}: label {key!r} is given twice; the last value wins")
        pairs[key] = value
    return tuple(pairs.items())


def _namespace(src: _Source) -> str | None:
    found = src.lookup("namespace")
    if found is None or not found[0]:
        return None
    if not LABEL_NAME.fullmatch(found[0]):
        raise UsageError(f"{found[1]} {found[0]!r} is not a valid metric name prefix")
    return found[0]


def _at_least(src: _Source, name: str, default: int, minimum: int, requirement: str) -> int:
    """A whole number from ``minimum`` to MAX_WHOLE; the error says ``requirement`` and
    the range, quoting at most an excerpt of what was given."""
    found = src.lookup(name)
    if found is None:
        return default
    text, origin = found
    digits = text.strip()
    if not _WHOLE.fullmatch(digits):
        raise UsageError(f"{origin} must be a whole number, not {excerpt(text)}")
    # The length first: int() of thousands of digits is refused, and slow (CVE-2020-10735).
    value = int(digits) if len(digits) <= _WHOLE_DIGITS else None
    if value is None or not minimum <= value <= defaults.MAX_WHOLE:
        raise UsageError(
            f"{origin} must be {requirement} (a whole number from {minimum} to "
            f"{defaults.MAX_WHOLE}), not {excerpt(text)}"
        )
    return value


def _connect_timeout(src: _Source) -> float:
    """Milliseconds on the command line, seconds in Settings; ≤ 0 falls back to 100 ms."""
    millis = _at_least(
        src,
        "connect-timeout",
        defaults.DEFAULT_CONNECT_TIMEOUT_MS,
        -defaults.MAX_WHOLE,
        f"milliseconds (0 or less: {defaults.DEFAULT_CONNECT_TIMEOUT_MS})",
    )
    return (millis if millis > 0 else defaults.DEFAULT_CONNECT_TIMEOUT_MS) / 1000


def _max_series(src: _Source) -> int:
    return _at_least(src, "max-series", defaults.DEFAULT_MAX_SERIES, 1, "greater than 0")


def _max_connections(src: _Source) -> int:
    """At least 2: the health probe's connection and at least one database's."""
    minimum = defaults.MIN_MAX_CONNECTIONS
    requirement = f"at least {minimum} (the health probe's connection and one database's)"
    return _at_least(src, "max-connections", defaults.DEFAULT_MAX_CONNECTIONS, minimum, requirement)


def _parallel_databases(src: _Source) -> int:
    """At least 1; the exporter caps it at the databases' share of the budget."""
    default = defaults.DEFAULT_PARALLEL_DATABASES
    return _at_least(src, "parallel-databases", default, 1, "at least 1")


def _max_total_series(src: _Source) -> int:
    """0 or more; 0 turns the exposition-wide budget off."""
    default = defaults.DEFAULT_MAX_TOTAL_SERIES
    return _at_least(src, "max-total-series", default, 0, "0 (no limit) or more")


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


_WHOLE = re.compile(r"[-+]?[0-9]+")
_WHOLE_DIGITS = 20  # more digits than any value in range: refused without int()

#: libpq reads these behind the URL's back (a service file can name another server).
LIBPQ_OVERRIDES = ("PGSERVICE", "PGSERVICEFILE", "PGSYSCONFDIR", "PGLOCALEDIR", "PGREALM")


def main(argv: Sequence[str] | None = None) -> int:
    """Run pg_exporter; returns the process exit code.

    0 success; 1 bad usage, serving errors, or ``--dry-run`` on a config that does
    not load; 2 when the exporter cannot be created (config path missing or invalid,
    const-label conflict, ``--fail-fast`` with the target unreachable).
    """
    warnings: list[str] = []
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ, warnings)
    except InfoRequested as info:
        print(info.text)
        return 0
    except UsageError as exc:
        print(f"pg_exporter: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings.log_level, settings.log_format)
    for warning in warnings:
        log.warning(warning)
    _clear_libpq_overrides()
    try:
        return _run(settings)
    except (ConfigError, UsageError) as exc:  # UsageError here: e.g. a bad --web.config.file
        print(f"pg_exporter: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) and not settings.dry_run else 1
    except KeyboardInterrupt:
        return 130
    except Exception:
        log.exception("pg_exporter stopped on an unexpected error")
        return 1


def _clear_libpq_overrides() -> None:
    """Drop the libpq variables that could point the connection elsewhere than the URL."""
    for name in LIBPQ_OVERRIDES:
        if os.environ.pop(name, None) is not None:
            log.warning("cleared $%s: it could override the target URL", name)


def _run(settings: Settings) -> int:
    from exporter.loading import load_for_settings

    where = (
        {"targets": settings.targets_file}
        if settings.targets_file
        else {"url": settings.masked_url}
    )
    log.info(
        "pg_exporter starting",
        extra={"version": exporter.__version__, **where, "config": settings.config},
    )
    definitions = load_for_settings(settings)
    for warning in definitions.warnings:
        log.warning(warning, extra={"config": settings.config})
    declared = _declared_targets(settings)
    if settings.dry_run:
        print(render_definitions(definitions), end="")
        return 0
    if settings.explain:
        if declared is not None:
            raise UsageError(
                "--explain reads the one target of --url; in fleet mode read "
                "/explain?target=NAME of the running exporter"
            )
        from exporter import explain

        return explain.run(settings, definitions)
    from exporter import serve
    from exporter.web.config import WebConfig, load_web_config

    path = settings.web_config_file
    web_config = load_web_config(path) if path else WebConfig()
    return serve.run(settings, definitions, web_config, declared)


def _declared_targets(settings: Settings) -> Declared | None:
    """The fleet's targets when a targets file is given (ConfigError lists its problems)."""
    if settings.targets_file is None:
        return None
    declared = load_targets(settings.targets_file, settings)
    for warning in declared.warnings:
        log.warning(warning, extra={"targets": settings.targets_file})
    log.info(
        "targets file read: each declared target is served at /probe?target=NAME",
        extra={"targets": settings.targets_file, "count": len(declared.targets),
               "names": ",".join(declared.names())},
    )  # fmt: skip
    return declared
