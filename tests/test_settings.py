"""Settings: the frozen object every mode uses, and the target it reads from the URL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.config.settings import Settings
from exporter.errors import TargetError


def test_namespace_follows_pgbouncer_mode() -> None:
    """The self-metric namespace is pg, pgbouncer for pgBouncer targets, or the flag's value."""
    assert Settings().effective_namespace() == "pg"
    assert Settings(url="postgresql://h:6432/pgbouncer").effective_namespace() == "pgbouncer"
    assert Settings(namespace="x").effective_namespace() == "x"


def test_url_is_read_when_settings_are_made() -> None:
    """The target follows the URL, also through replace(); an unreadable URL is refused."""
    settings = Settings(url="postgresql://u:pw?x#1@h/db")
    assert settings.masked_url == "postgresql://u:xxxxx@h/db?sslmode=disable"
    assert replace(settings, url="host=h dbname=pgbouncer").is_pgbouncer
    with pytest.raises(TargetError):
        Settings(url="postgresql://u:50%off@h/db")


def test_repr_shows_no_password() -> None:
    """Printing the settings (a debugger, a failed assertion) shows the masked URL only."""
    text = repr(Settings(url="postgresql://u:Zq9secret@h/db?sslpassword=Zq9other"))
    assert "Zq9" not in text
    assert "postgresql://u:xxxxx@h/db?sslpassword=xxxxx&sslmode=disable" in text
