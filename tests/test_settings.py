"""URL helpers shared by settings, logging and the execution layer (§1, D14)."""

from __future__ import annotations

import pytest

from exporter.settings import Settings, database_of, mask_url, with_sslmode


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql:///postgres", "postgresql:///postgres?sslmode=disable"),
        (
            "postgresql://h:5432/db?application_name=x",
            "postgresql://h:5432/db?application_name=x&sslmode=disable",
        ),
        ("postgresql://h/db?sslmode=require", "postgresql://h/db?sslmode=require"),
        ("postgresql:///?sslmode=disable", "postgresql:///?sslmode=disable"),
        ("host=h dbname=d", "host=h dbname=d sslmode=disable"),
        ("host=h sslmode=verify-full", "host=h sslmode=verify-full"),
    ],
)
def test_sslmode_disable_added_only_when_absent(url: str, expected: str) -> None:
    """``sslmode=disable`` is injected when the URL chooses no sslmode, keeping its form (§1)."""
    assert with_sslmode(url) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:secret@h:5/d", "postgresql://u:xxxxx@h:5/d"),
        (
            "postgres://u:p%40ss@[::1]:5/d?password=two&a=1",
            "postgres://u:xxxxx@[::1]:5/d?password=xxxxx&a=1",
        ),
        ("postgresql:///db?password=secret", "postgresql:///db?password=xxxxx"),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("host=h password='a b' user=u", "host=h password=xxxxx user=u"),
        ("host=h password=secret", "host=h password=xxxxx"),
    ],
)
def test_passwords_are_masked(url: str, expected: str) -> None:
    """Every password form is replaced by xxxxx and the rest is kept (§1, D14)."""
    assert mask_url(url) == expected
    assert "secret" not in mask_url(url)


@pytest.mark.parametrize(
    ("url", "dbname"),
    [
        ("postgresql://h/pgbouncer", "pgbouncer"),
        ("postgresql://h/app?dbname=other", "other"),
        ("postgresql:///", ""),
        ("host=h dbname=pgbouncer", "pgbouncer"),
    ],
)
def test_database_of(url: str, dbname: str) -> None:
    """The target database is read from URLs and keyword DSNs alike."""
    assert database_of(url) == dbname


def test_namespace_follows_pgbouncer_mode() -> None:
    """The self-metric namespace is pg, pgbouncer for pgBouncer targets, or the flag's value."""
    assert Settings().effective_namespace() == "pg"
    assert Settings(url="postgresql://h:6432/pgbouncer").effective_namespace() == "pgbouncer"
    assert Settings(namespace="x").effective_namespace() == "x"
