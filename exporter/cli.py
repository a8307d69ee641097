"""The ``pg_exporter`` entry point: settings, logging, then serve, ``--dry-run`` or
``--explain``.

How the command line and the environment become :class:`Settings` is
:mod:`exporter.config.commandline`; this module decides what to run with them and the
process's exit code.

Importing it imports :mod:`exporter.signals` and the standard library only, and
:func:`main` takes the signals before it imports anything else: the console script
and the packaged launcher import this module first, and the exporter's layers cost
about 200 ms to import, during which SIGHUP once ended the process (issue 36).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from exporter.signals import SIGNALS

if TYPE_CHECKING:
    from exporter.config.settings import Settings
    from exporter.config.targetsfile import Declared

log = logging.getLogger(__name__)


def parse_settings(
    argv: Sequence[str], environ: Mapping[str, str], warnings: list[str] | None = None
) -> Settings:
    """Settings from flags, then environment, then defaults; UsageError on anything wrong.

    What the Go exporter tolerates (a malformed ``--label`` item) is skipped and
    described in ``warnings`` instead, for the caller to log.
    """
    from exporter.config.commandline import read_settings
    from exporter.web.routes import telemetry_path_problems  # the path is checked against them

    found = warnings if warnings is not None else []
    return read_settings(argv, environ, found, telemetry_path_problems)


#: libpq reads these behind the URL's back (a service file can name another server).
LIBPQ_OVERRIDES = ("PGSERVICE", "PGSERVICEFILE", "PGSYSCONFDIR", "PGLOCALEDIR", "PGREALM")


def main(argv: Sequence[str] | None = None) -> int:
    """Run pg_exporter; returns the process exit code.

    0 success; 1 bad usage, serving errors, or ``--dry-run`` on a config that does
    not load; 2 when the exporter cannot be created (config path missing or invalid,
    const-label conflict, ``--fail-fast`` with the target unreachable).
    """
    try:
        with SIGNALS.installed():  # before any file is read: signals work from the start
            return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:  # SIGINT or SIGTERM while starting
        return SIGNALS.exit_code()


def _main(argv: Sequence[str]) -> int:
    from exporter.config.logs import configure_logging
    from exporter.errors import ConfigError, InfoRequested, UsageError

    warnings: list[str] = []
    try:
        settings = parse_settings(argv, os.environ, warnings)
    except InfoRequested as info:  # --version also names the code paths in use (issue 37)
        from exporter.config.flags import version_text
        from exporter.report.implementations import version_lines

        print(f"{info.text}\n{version_lines()}" if info.text == version_text() else info.text)
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
    except Exception:
        log.exception("pg_exporter stopped on an unexpected error")
        return 1


def _clear_libpq_overrides() -> None:
    """Drop the libpq variables that could point the connection elsewhere than the URL."""
    for name in LIBPQ_OVERRIDES:
        if os.environ.pop(name, None) is not None:
            log.warning("cleared $%s: it could override the target URL", name)


def _run(settings: Settings) -> int:
    import exporter
    from exporter.config.dryrun import render_definitions
    from exporter.config.loading import load_for_settings
    from exporter.errors import UsageError

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
        from exporter.report import explain

        return explain.run(settings, definitions)
    from exporter.report.implementations import log_fallbacks

    log_fallbacks(log)
    from exporter import serve
    from exporter.web.webconfig import WebConfig, load_web_config

    path = settings.web_config_file
    web_config = load_web_config(path) if path else WebConfig()
    return serve.run(settings, definitions, web_config, declared)


def _declared_targets(settings: Settings) -> Declared | None:
    """The fleet's targets when a targets file is given (ConfigError lists its problems)."""
    from exporter.config.targetsfile import load_targets

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
