"""Settings: how the exporter runs (flags and environment), as one frozen object.

Parsing and validation live in :mod:`exporter.cli`; this module only holds
the resulting type and pure helpers on URLs that several modules need.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

DEFAULT_URL = "postgresql:///?sslmode=disable"
DEFAULT_LISTEN = ":9630"
DEFAULT_TELEMETRY_PATH = "/metrics"
DEFAULT_EXCLUDE = ("template0", "template1", "postgres")
DEFAULT_CONNECT_TIMEOUT_MS = 100
DEFAULT_MAX_SERIES = 100_000
CONFIG_CANDIDATES = ("./pg_exporter.yml", "/etc/pg_exporter.yml", "/etc/pg_exporter")
MASK = "xxxxx"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the command line and environment decide."""

    url: str = DEFAULT_URL  # sslmode already injected
    config: str | None = None  # resolved path of a collector file or directory
    config_origin: str = ""  # where the path came from (--config, $PG_EXPORTER_CONFIG), for errors
    listen_addresses: tuple[str, ...] = (DEFAULT_LISTEN,)
    systemd_socket: bool = False  # serve the sockets systemd passes instead of listening
    web_config_file: str | None = None
    openmetrics: bool = False  # answer OpenMetrics when asked; the Go exporter never does
    telemetry_path: str = DEFAULT_TELEMETRY_PATH
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
    dry_run: bool = False
    explain: bool = False
    log_level: str = "info"  # debug, info, warn, error
    log_format: str = "logfmt"  # logfmt, json

    @property
    def masked_url(self) -> str:
        """The target URL safe to log or show."""
        return mask_url(self.url)

    @property
    def is_pgbouncer(self) -> bool:
        """True when the target is pgBouncer's admin console (database ``pgbouncer``)."""
        return database_of(self.url) == "pgbouncer"

    def effective_namespace(self) -> str:
        """Namespace of the self-metrics."""
        if self.namespace:
            return self.namespace
        return "pgbouncer" if self.is_pgbouncer else "pg"


def with_sslmode(url: str) -> str:
    """Add ``sslmode=disable`` when the URL does not choose an sslmode."""
    if _is_keyword_dsn(url):
        return url if re.search(r"(^|\s)sslmode\s*=", url) else f"{url} sslmode=disable".strip()
    query = urlsplit(url).query
    if any(k == "sslmode" for k, _ in parse_qsl(query, keep_blank_values=True)):
        return url
    # Append rather than re-serialise, which would drop the '//' of postgresql:///db.
    base, _, fragment = url.partition("#")
    joiner = "&" if query else ("" if base.endswith("?") else "?")
    return f"{base}{joiner}sslmode=disable" + (f"#{fragment}" if fragment else "")


_ANY_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_URL_USERINFO_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^/?#@:]*:)[^/?#]*@", re.IGNORECASE)
_URL_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def mask_url(url: str) -> str:
    """Replace every password in a URL (any scheme) or keyword DSN by ``xxxxx`` (D14).

    The one masking rule: the logs use it for every URL they find in a message.
    """
    if not _ANY_URL.match(url):
        return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)", rf"\g<1>{MASK}", url)
    # Substitute in place rather than re-serialising: urlunsplit would drop the '//'
    # of a hostless URL such as postgresql:///db.
    url = _URL_USERINFO_PASSWORD.sub(rf"\g<1>{MASK}@", url)
    return _URL_QUERY_PASSWORD.sub(rf"\g<1>{MASK}", url)


def database_of(url: str) -> str:
    """The database named by a URL or DSN ('' when it relies on defaults)."""
    if _is_keyword_dsn(url):
        match = re.search(r"(?:^|\s)dbname\s*=\s*(\S+)", url)
        return match.group(1).strip("'") if match else ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    for key, value in parse_qsl(parts.query):
        if key == "dbname":
            return value
    return parts.path.lstrip("/")


def _is_keyword_dsn(url: str) -> bool:
    return not re.match(r"^postgres(ql)?://", url)
