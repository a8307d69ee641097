"""Which databases discovery picks: names and shell-style patterns (issue 13)."""

from __future__ import annotations

from exporter.config.discovery import is_pattern, matches, select_databases

AVAILABLE = ("postgres", "app", "app_eu", "app_us", "App_old", "tenant_01", "tenant_02", "x[1]")


def test_a_plain_name_matches_only_itself() -> None:
    """Without wildcards a name is compared whole, as in the Go exporter."""
    assert matches("app", ["app"])
    assert not matches("app_eu", ["app"])
    assert not is_pattern("app")


def test_wildcards() -> None:
    """``*``, ``?``, ``[...]`` and ``[!...]`` as in a shell; case counts."""
    assert matches("app_eu", ["app_*"])
    assert not matches("App_old", ["app_*"])
    assert matches("tenant_01", ["tenant_0?"])
    assert matches("tenant_02", ["tenant_0[2-9]"])
    assert not matches("tenant_01", ["tenant_0[!1]"])


def test_include_then_exclude_and_never_the_main_database() -> None:
    """Included by name or pattern, less what an exclusion names or matches."""
    picked = select_databases(AVAILABLE, ["app*", "tenant_*"], ["*_us", "tenant_02"], "app")
    assert picked == {"app_eu", "tenant_01"}


def test_no_include_means_every_database_not_excluded() -> None:
    """An empty include list takes all; the default exclusions are plain names."""
    picked = select_databases(AVAILABLE, [], ["template0", "template1", "postgres"], "postgres")
    assert picked == set(AVAILABLE) - {"postgres"}


def test_a_name_with_brackets_still_matches_itself() -> None:
    """A database literally named like a pattern is matched by its exact name too."""
    assert matches("x[1]", ["x[1]"])
