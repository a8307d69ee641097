"""Each settings rule, once, and the three sources that ask it (flags, environment,
targets file) agreeing on what it decides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.cli import parse_settings
from exporter.config import rules
from exporter.config.settings import Settings
from exporter.config.targetsfile import load_targets
from exporter.errors import ConfigError, UsageError

# --- label names and the namespace ---------------------------------------------------


@pytest.mark.parametrize("name", ["a", "_", "env", "Cluster_2", "_x", "le"])
def test_label_names_prometheus_accepts(name: str) -> None:
    """Letters, digits and underscores, not starting with a digit."""
    assert rules.is_label_name(name)


@pytest.mark.parametrize("name", ["", "1a", "a-b", "a b", "a:b", "é", "__x", "__", 7, None])
def test_label_names_refused(name: object) -> None:
    """Anything else, the reserved __ names and non-strings are refused."""
    assert not rules.is_label_name(name)


@pytest.mark.parametrize(("name", "valid"), [("pg", True), ("my_app2", True), ("__x", True),
                                             ("pg-x", False), ("pg:x", False), ("", False),
                                             ("2pg", False), (None, False)])  # fmt: skip
def test_namespace_is_a_metric_name_prefix_without_colons(name: object, valid: bool) -> None:
    """A namespace prefixes metric names; the colon belongs to recording rules."""
    assert rules.is_namespace(name) is valid


def test_rule_texts_say_what_is_accepted() -> None:
    """The wording errors quote names the pattern and the reservation."""
    assert rules.LABEL_RULE == "[a-zA-Z_][a-zA-Z0-9_]*, not starting with __"
    assert rules.NAMESPACE_RULE == "a valid metric name prefix ([a-zA-Z_][a-zA-Z0-9_]*)"


# --- whole numbers ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [("0", 0), (" 12 ", 12), ("+3", 3), ("-5", -5),
                                             ("007", 7), ("2147483647", 2**31 - 1)])  # fmt: skip
def test_whole_numbers_are_read(text: str, value: int) -> None:
    """Signs, leading zeros and surrounding spaces are fine."""
    assert rules.whole_number(text) == value


@pytest.mark.parametrize("text", ["", " ", "1.5", "1e3", "0x10", "ten", "1 2", "--1"])
def test_what_is_not_a_whole_number(text: str) -> None:
    """Empty text, fractions, exponents, hex and words are not whole numbers."""
    assert rules.whole_number(text) is None


@pytest.mark.parametrize("sign", ["", "+", "-"])
def test_thousands_of_digits_read_as_out_of_range(sign: str) -> None:
    """Past 20 digits the value is one past the range, with its sign, for every rule."""
    value = rules.whole_number(sign + "9" * 5000)
    assert value == (-(rules.MAX_WHOLE + 1) if sign == "-" else rules.MAX_WHOLE + 1)
    assert value is not None
    assert not rules.CONNECT_TIMEOUT_MS.holds(value)


@pytest.mark.parametrize(
    ("rule", "minimum"),
    [
        (rules.CONNECT_TIMEOUT_MS, -rules.MAX_WHOLE),
        (rules.MAX_SERIES, 1),
        (rules.MAX_CONNECTIONS, 2),
        (rules.PARALLEL_DATABASES, 1),
        (rules.MAX_TOTAL_SERIES, 0),
        (rules.MAX_CONCURRENT_TARGETS, 1),
    ],
)
def test_each_range_holds_its_ends_and_nothing_past_them(rule: rules.Whole, minimum: int) -> None:
    """From the minimum to 2**31-1, both ends included."""
    assert rule.holds(minimum)
    assert rule.holds(rules.MAX_WHOLE)
    assert not rule.holds(minimum - 1)
    assert not rule.holds(rules.MAX_WHOLE + 1)
    assert str(rule).endswith(f"(a whole number from {minimum} to 2147483647)")


def test_max_connections_says_why_two() -> None:
    """The error explains the minimum: the probe needs a connection of its own."""
    assert str(rules.MAX_CONNECTIONS).startswith(
        "at least 2, the health probe's connection and one database's"
    )


# --- comma lists -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a,b", ("a", "b")),
        (" b , a ,b,, a ", ("b", "a")),
        ("", ()),
        (" , ,", ()),
        ("app_*,billing", ("app_*", "billing")),
    ],
)
def test_comma_lists_are_stripped_without_empties_or_repeats(
    text: str, expected: tuple[str, ...]
) -> None:
    """Order is the order first given; a repeat adds nothing."""
    assert rules.comma_list(text) == expected


def test_a_list_of_names_follows_the_same_rule() -> None:
    """The targets file's YAML list form gives what its comma form gives."""
    assert rules.names([" x", "y", "", "x "]) == rules.comma_list(" x,y,,x ") == ("x", "y")


def test_items_keep_repeats() -> None:
    """``--label`` items: a repeated name is the label rule's business (last one wins)."""
    assert rules.items(" a=1 ,, a=2,") == ["a=1", "a=2"]


# --- the sources agree -----------------------------------------------------------------

LIST_FLAGS = [
    ("tag", "PG_EXPORTER_TAG", "tags"),
    ("include-database", "PG_EXPORTER_INCLUDE_DATABASE", "include_databases"),
    ("exclude-database", "PG_EXPORTER_EXCLUDE_DATABASE", "exclude_databases"),
]


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "collectors.yml"
    path.write_text("c:\n  query: SELECT 1 AS v\n  metrics:\n    - v: {usage: GAUGE}\n")
    return str(path)


def _target(tmp_path: Path, option: str) -> Settings:
    path = tmp_path / "targets.yml"
    path.write_text(f"targets:\n  - name: a\n    url: postgresql:///x\n    {option}\n")
    return load_targets(str(path), Settings(config="c"), {}).targets[0].settings


@pytest.mark.parametrize(("flag", "variable", "field"), LIST_FLAGS)
def test_every_comma_list_drops_repeats_from_every_source(
    config: str, tmp_path: Path, flag: str, variable: str, field: str
) -> None:
    """--exclude-database once kept repeats that --tag and the targets file dropped."""
    text = "b, a,b,,a"
    from_flag = parse_settings(["-c", config, f"--{flag}", text], {})
    from_env = parse_settings(["-c", config], {variable: text})
    from_file = _target(tmp_path, f"{field}: '{text}'")
    from_yaml_list = _target(tmp_path, f"{field}: [b, ' a', b, a]")
    for settings in (from_flag, from_env, from_file, from_yaml_list):
        assert getattr(settings, field) == ("b", "a")


@pytest.mark.parametrize(
    ("flag", "field", "rule"),
    [
        ("max-connections", "max_connections", rules.MAX_CONNECTIONS),
        ("parallel-databases", "parallel_databases", rules.PARALLEL_DATABASES),
    ],
)
def test_the_flag_and_the_targets_file_share_a_minimum(
    config: str, tmp_path: Path, flag: str, field: str, rule: rules.Whole
) -> None:
    """The minimum holds on both; one below it is refused by both, in the same words."""
    low = rule.minimum
    assert getattr(parse_settings(["-c", config, f"--{flag}", str(low)], {}), field) == low
    assert getattr(_target(tmp_path, f"{field}: {low}"), field) == low
    with pytest.raises(UsageError, match=f"^--{flag} must be {re.escape(str(rule))}"):
        parse_settings(["-c", config, f"--{flag}", str(low - 1)], {})
    with pytest.raises(ConfigError, match=f"{field}: must be {re.escape(str(rule))}"):
        _target(tmp_path, f"{field}: {low - 1}")


@pytest.mark.parametrize(("namespace", "valid"), [("mine", True), ("pg-x", False)])
def test_the_flag_and_the_targets_file_share_the_namespace_rule(
    config: str, tmp_path: Path, namespace: str, valid: bool
) -> None:
    """A prefix the flag accepts the file accepts; one the flag refuses the file refuses."""
    if valid:
        assert parse_settings(["-c", config, "-n", namespace], {}).namespace == namespace
        assert _target(tmp_path, f"namespace: {namespace}").namespace == namespace
        return
    with pytest.raises(UsageError, match=r"is not a valid metric name prefix \(\["):
        parse_settings(["-c", config, "-n", namespace], {})
    with pytest.raises(ConfigError, match=r"namespace: must be a valid metric name prefix \(\["):
        _target(tmp_path, f"namespace: {namespace}")


def test_the_flag_and_the_targets_file_share_the_label_name_rule(
    config: str, tmp_path: Path
) -> None:
    """__x is reserved for both: the flag skips it with a warning, the file refuses it."""
    warnings: list[str] = []
    settings = parse_settings(["-c", config, "-l", "__x=1,ok=2"], {}, warnings)
    assert settings.const_labels == (("ok", "2"),)
    assert rules.LABEL_RULE in warnings[0]
    refused = f"labels.__x: not a valid label name \\({re.escape(rules.LABEL_RULE)}\\)"
    with pytest.raises(ConfigError, match=refused):
        _target(tmp_path, "labels: {__x: y}")
