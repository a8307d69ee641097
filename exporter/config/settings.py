"""Settings: how the exporter runs (flags and environment), as one frozen object.

The command line and the environment are read by :mod:`exporter.config.commandline`, the
targets file by :mod:`exporter.config.targetsfile`, both under the rules of
:mod:`exporter.config.rules`;
the target URL is read by libpq into a :class:`~exporter.config.target.Target` when the
settings are made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from exporter.config.target import Target

DEFAULT_URL = "postgresql:///?sslmode=disable"
DEFAULT_TELEMETRY_PATH = "/metrics"
DEFAULT_EXCLUDE = ("template0", "template1", "postgres")
DEFAULT_CONNECT_TIMEOUT_MS = 100
DEFAULT_MAX_SERIES = 100_000
DEFAULT_BACKOFF_CEILING = 600.0  # seconds (D15): a collector's back-off ceiling
# Connections to the target at once, the health probe's included: the main database
# and the probe fit with room for a few discovered ones (issue 13).
DEFAULT_MAX_CONNECTIONS = 4
DEFAULT_PARALLEL_DATABASES = 2  # discovered databases walked at once, within the budget
DEFAULT_MAX_TOTAL_SERIES = 500_000  # over every collector and database; 0: no limit
DEFAULT_MAX_CONCURRENT_TARGETS = 8  # fleet mode: targets collected at once
# Backends at one PostgreSQL server at once, over every target, database and health probe
# naming it (issue 29): a fifth of PostgreSQL's default max_connections. A single target's
# own --max-connections, when larger, is the default instead: it is never cut.
DEFAULT_SERVER_MAX_CONNECTIONS = 20
DEFAULT_SERVER_MAX_FAILED_LOGINS = 60  # a minute at one server, after a first burst
# Milliseconds of server time per second the exporter's statements may take (issue 31):
# far above what the default library costs an ordinary database (docs/degradation.md).
DEFAULT_SERVER_TIME_BUDGET_MS = 200.0
CONFIG_CANDIDATES = ("./pg_exporter.yml", "/etc/pg_exporter.yml", "/etc/pg_exporter")


class ListenAddress(NamedTuple):
    """One ``--web.listen-address``, as :mod:`exporter.config.commandline` parsed it."""

    host: str | None  # None: every interface; an IPv6 address without its brackets
    port: int  # 0-65535; 0: a free port the system picks, logged at start

    def __str__(self) -> str:
        host = self.host or ""
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


DEFAULT_LISTEN = ListenAddress(None, 9630)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the command line and environment decide."""

    url: str = field(default=DEFAULT_URL, repr=False)  # as given: it may hold a password
    config: str | None = None  # resolved path of a collector file or directory
    config_origin: str = ""  # where the path came from (--config, $PG_EXPORTER_CONFIG), for errors
    listen_addresses: tuple[ListenAddress, ...] = (DEFAULT_LISTEN,)
    systemd_socket: bool = False  # serve the sockets systemd passes instead of listening
    web_config_file: str | None = None
    openmetrics: bool = False  # answer OpenMetrics when asked; the Go exporter never does
    telemetry_path: str = DEFAULT_TELEMETRY_PATH  # checked against the fixed routes
    const_labels: tuple[tuple[str, str], ...] = ()
    tags: tuple[str, ...] = ()
    disable_cache: bool = False
    disable_intro: bool = False
    auto_discovery: bool = True
    exclude_databases: tuple[str, ...] = DEFAULT_EXCLUDE
    include_databases: tuple[str, ...] = ()
    namespace: str | None = None  # None: "pg", or "pgbouncer" in pgBouncer mode
    fail_fast: bool = False
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_MS / 1000  # seconds
    max_series: int = DEFAULT_MAX_SERIES
    backoff_ceiling: float = DEFAULT_BACKOFF_CEILING  # seconds; 0: a failure waits its ttl only
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # to the target at once, the probe's included
    parallel_databases: int = DEFAULT_PARALLEL_DATABASES  # at most the databases' connections
    max_total_series: int = DEFAULT_MAX_TOTAL_SERIES  # one pass, every collector; 0: no limit
    # ms a second, 0: none; None: not given, so the default, or none under --disable-cache
    server_time_budget: float | None = None
    targets_file: str | None = None  # fleet mode: the declared targets (docs/fleet.md)
    max_concurrent_targets: int = DEFAULT_MAX_CONCURRENT_TARGETS  # fleet mode: passes at once
    server_max_connections: int | None = None  # per server; None: the default (see below)
    server_max_failed_logins: int = DEFAULT_SERVER_MAX_FAILED_LOGINS  # per server, a minute
    dry_run: bool = False
    explain: bool = False
    log_level: str = "info"  # debug, info, warn, error
    log_format: str = "logfmt"  # logfmt, json
    target: Target = field(init=False)  # url as libpq reads it, sslmode added

    def __post_init__(self) -> None:
        """Read the URL once, here: TargetError if libpq cannot."""
        object.__setattr__(self, "target", Target.parse(self.url))

    @property
    def masked_url(self) -> str:
        """The target URL safe to log or show."""
        return self.target.masked

    @property
    def is_pgbouncer(self) -> bool:
        """True when the target is pgBouncer's admin console (database ``pgbouncer``)."""
        return self.target.is_pgbouncer

    def effective_server_max_connections(self) -> int:
        """Backends at one server at once: the setting, else 20 or --max-connections."""
        if self.server_max_connections is not None:
            return self.server_max_connections
        return max(DEFAULT_SERVER_MAX_CONNECTIONS, self.max_connections)

    def effective_server_time_budget(self) -> float:
        """Milliseconds of server time a second (0: none): as given, else the default;
        under --disable-cache none unless given, which keeps the Go exporter's meaning of
        that flag (every collector at every pass) unless the operator asks for both."""
        if self.server_time_budget is not None:
            return self.server_time_budget
        return 0.0 if self.disable_cache else DEFAULT_SERVER_TIME_BUDGET_MS

    def effective_namespace(self) -> str:
        """Namespace of the self-metrics."""
        if self.namespace:
            return self.namespace
        return "pgbouncer" if self.is_pgbouncer else "pg"
