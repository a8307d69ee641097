"""The shipped systemd unit and env file, as text: what operators and systemd rely on."""

from __future__ import annotations

from exporter.config.flags import FLAGS
from tests.packaging.conftest import REPO, read_env_file

UNIT_TEXT = (REPO / "packaging" / "pg_exporter.service").read_text()
ENV_PATH = REPO / "packaging" / "pg_exporter.default"
# Variables the exporter reads besides those in the flag table, and the unit's own.
EXTRA_VARIABLES = {"PG_EXPORTER_URL", "PG_EXPORTER_URL_FILE", "PG_EXPORTER_OPTS"}


def _directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT_TEXT.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_env_file_sets_every_pg_exporter_variable() -> None:
    """Every PG_EXPORTER_* variable the flags read appears in the env file, and nothing else."""
    wanted = {flag.env for flag in FLAGS if flag.env} | EXTRA_VARIABLES
    assert set(read_env_file(ENV_PATH)) == wanted


def test_env_file_defaults_point_at_the_packaged_library() -> None:
    """Out of the box: the local socket as user prometheus, the /etc/pg_exporter library, :9630."""
    settings = read_env_file(ENV_PATH)
    assert settings["PG_EXPORTER_URL"] == "postgresql:///postgres"
    assert settings["PG_EXPORTER_CONFIG"] == "/etc/pg_exporter"
    assert "--web.listen-address=:9630" in settings["PG_EXPORTER_OPTS"].split()


def test_unit_runs_the_exporter_as_compatibility_promises() -> None:
    """User, env file, ExecStart, restart policy and ordering of compatibility.md §6."""
    unit = _directives()
    assert unit["User"] == ["prometheus"]
    assert unit["EnvironmentFile"] == ["-/etc/default/pg_exporter"]
    assert unit["ExecStart"] == ["/usr/bin/pg_exporter $PG_EXPORTER_OPTS"]
    assert unit["Restart"] == ["on-failure"]
    assert {"network-online.target", "postgresql.service"} <= set(unit["After"][0].split())
    assert unit["Wants"] == ["network-online.target"]


def test_unit_waits_for_readiness_and_watches_the_event_loop() -> None:
    """Type=notify (READY=1 once listening) with a watchdog the event loop must feed."""
    unit = _directives()
    assert unit["Type"] == ["notify"]
    assert unit["NotifyAccess"] == ["main"]  # the launcher execs Python: no wrapper process
    assert unit["WatchdogSec"][0].endswith("s")
    assert int(unit["WatchdogSec"][0].removesuffix("s")) >= 10


def test_unit_allows_only_the_sockets_the_exporter_uses() -> None:
    """Unix and IP sockets only, no capabilities, no privilege gain."""
    unit = _directives()
    assert unit["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert unit["CapabilityBoundingSet"] == [""]
    assert unit["NoNewPrivileges"] == ["yes"]
    assert unit["ProtectSystem"] == ["strict"]
