"""Hostile input, property-based: everything that parses outside input answers or refuses.

Each property states what the exporter promises for ANY input: the collector file
loader gives Definitions or a ConfigError whose every problem names the file (never
another exception, which the CLI would print as a traceback and /reload as a bare
500); the scrape-timeout header gives a finite budget in (0, default]; URL helpers
never raise and never leak a password; ``--label`` gives valid labels or a
UsageError; any Accept header negotiates a format.

Examples are derandomized (the same ones on every run) and kept to ~200 per
property for CI; the known inputs that once broke a property are pinned with
``@example`` and in the parametrized regression tests.
"""

from __future__ import annotations

import contextlib
import math
import re
import string
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import parse_settings
from exporter.collect.budget import DEFAULT_BUDGET, budget_seconds
from exporter.config.definitions import Definitions
from exporter.config.loading import load_definitions
from exporter.config.target import MASK, Target, database_of, mask
from exporter.errors import ConfigError, TargetError, UsageError
from exporter.expose.exposition import Format, encode, negotiate
from exporter.report.process import runtime_families

CI = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


# --- the collector file loader ---------------------------------------------------------


@pytest.fixture(scope="module")
def collector_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file path, rewritten by every example (examples run one after another)."""
    return tmp_path_factory.mktemp("hostile") / "collectors.yml"


def load_or_refuse(path: Path, text: str) -> None:
    """The loader's promise for ``text``: Definitions (of no collectors only with a
    warning naming the file), or ConfigError naming the file."""
    path.write_text(text, encoding="utf-8")
    refused: ConfigError | None = None
    try:
        definitions = load_definitions(str(path))
    except ConfigError as exc:
        refused = exc
    if refused is None:
        assert isinstance(definitions, Definitions)
        # As in Go 1.4.1, a file of no collectors (empty, comments only) loads, and says
        # so in a warning that names it (issue 30).
        assert definitions.collectors or any(str(path) in w for w in definitions.warnings)
        return
    assert refused.problems, "a ConfigError must list its problems"
    for problem in refused.problems:
        assert problem.location.startswith(str(path)), f"{problem} does not name the file"
        assert problem.message.strip()


# Pieces of YAML syntax, collector fields and values PyYAML (and our loader) treats
# specially: tags, anchors, merges, directives, octal-looking versions, timestamps.
YAML_TOKENS = st.sampled_from(
    [
        "\n", "\n  ", "\n    ", "\n      ", "\t", " ", ": ", ":", "- ", "-", "? ", ",", "[", "]",
        "{", "}", "'", '"', "#", "&a ", "*a", "<<: ", "!!int ", "!!float ", "!!bool ",
        "!!str ", "!!binary ", "!!set ", "!!omap ", "!!timestamp ", "!!null ", "!!python/tuple ",
        "!custom ", "%YAML 1.1\n---\n", "---\n", "...\n", "|\n", ">-\n", "~", "null", "true",
        "no", "yes", "0", "-1", "090600", "0x1F", "0o17", "1e-6", ".inf", "-.inf", ".nan",
        "1_000", "2001-12-14", "2001-13-45", "12:30:45", "9" * 400, "query", "metrics",
        "usage", "GAUGE", "COUNTER", "LABEL", "HISTOGRAM", "DISCARD", "bucket", "ttl",
        "timeout", "priority", "min_version", "max_version", "tags", "cluster", "fatal",
        "skip", "scale", "default", "rename", "description", "name", "desc", "max_series",
        "predicate_queries", "predicate_query", "SELECT 1 AS v", "pg_x", "v", "\x00", "\\",
        "é", "😀", "\u2028", "\ufeff",
    ]
)  # fmt: skip
YAMLISH = st.lists(YAML_TOKENS, max_size=60).map("".join)


@CI
@given(text=st.one_of(YAMLISH, st.text(max_size=300)))
@example(text="x: 2001-13-45")  # an implicit timestamp PyYAML cannot build: ValueError
@example(text="x: !!int abc")
@example(text="x: !!bool maybe")
@example(text="x: !!set [1]")
@example(text="x: " + "[" * 3000)  # nesting deeper than the recursion limit
def test_loader_text_is_loaded_or_refused_naming_the_file(collector_file: Path, text: str) -> None:
    """Arbitrary text: Definitions, or ConfigError whose every problem names the file."""
    load_or_refuse(collector_file, text)


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**320),  # beyond a float
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["GAUGE", "counter", "LABEL", "HISTOGRAM", "DISCARD", "SELECT 1 AS v",
                     "cluster", "extension:", "090600", "1e-6", "", "  "]),
)  # fmt: skip
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers()), inner, max_size=4),
    ),
    max_leaves=25,
)
COLUMN_SPEC = st.fixed_dictionaries(
    {},
    optional={
        "usage": st.one_of(st.sampled_from(["GAUGE", "COUNTER", "LABEL", "HISTOGRAM", "gauge",
                                            "DISCARD", "BOGUS"]), SCALARS),
        "description": st.one_of(st.text(max_size=20), SCALARS),
        "scale": SCALARS,
        "default": SCALARS,
        "rename": st.one_of(st.sampled_from(["r", "bad name", "__r"]), SCALARS),
        "bucket": st.one_of(st.lists(st.one_of(st.floats(), st.integers()), max_size=4), SCALARS),
    },
)  # fmt: skip
COLUMN_NAMES = st.one_of(st.sampled_from(["v", "datname", "le", "w_total", "9x"]), SCALARS)
BRANCH = st.fixed_dictionaries(
    {},
    optional={
        "query": st.one_of(st.just("SELECT 1 AS v"), SCALARS),
        "metrics": st.one_of(
            st.lists(st.dictionaries(COLUMN_NAMES, st.one_of(COLUMN_SPEC, SCALARS),
                                     min_size=1, max_size=2), max_size=4),
            DOCUMENTS,
        ),
        "ttl": SCALARS,
        "timeout": SCALARS,
        "priority": SCALARS,
        "min_version": SCALARS,
        "max_version": SCALARS,
        "max_series": SCALARS,
        "fatal": SCALARS,
        "skip": SCALARS,
        "tags": st.one_of(st.lists(SCALARS, max_size=3), SCALARS),
        "name": SCALARS,
        "desc": SCALARS,
        "predicate_queries": st.one_of(
            st.lists(st.dictionaries(st.sampled_from(["name", "predicate_query", "ttl", "x"]),
                                     SCALARS, max_size=3), max_size=2),
            SCALARS,
        ),
        "extra_field": SCALARS,
    },
)  # fmt: skip
COLLECTOR_DOCUMENTS = st.dictionaries(
    st.one_of(st.sampled_from(["pg_a", "pg_b", "", "bad key"]), st.text(max_size=8)),
    st.one_of(BRANCH, DOCUMENTS),
    max_size=3,
)


@CI
@given(document=st.one_of(COLLECTOR_DOCUMENTS, DOCUMENTS))
@example(document={"pg_a": {"query": "SELECT 1 AS v", "ttl": 10**400,
                            "metrics": [{"v": {"usage": "GAUGE"}}]}})  # fmt: skip
@example(document={"pg_a": {"query": "SELECT 1 AS v",
                            "metrics": [{"v": {"usage": "GAUGE", "scale": 10**400}}]}})  # fmt: skip
def test_loader_documents_are_loaded_or_refused_naming_the_file(
    collector_file: Path, document: object
) -> None:
    """Structured documents of every shape, near-valid collectors included."""
    load_or_refuse(collector_file, yaml.safe_dump(document, allow_unicode=True))


VALID = "pg_x:\n  query: SELECT 1 AS v\n  metrics:\n    - v: {usage: GAUGE, description: d}\n"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("implicit timestamp out of range", "pg_x:\n  query: SELECT 1\n  desc: 2001-13-45\n"),
        ("explicit int tag on text", "pg_x:\n  query: SELECT 1\n  ttl: !!int abc\n"),
        ("explicit bool tag on text", "pg_x:\n  query: SELECT 1\n  fatal: !!bool maybe\n"),
        ("empty explicit int", "pg_x:\n  query: SELECT 1\n  ttl: !!int ''\n"),
        ("set tag on a sequence", "pg_x: !!set [1]\n"),
        ("nesting deeper than the recursion limit", "pg_x: " + "[" * 3000 + "]" * 3000 + "\n"),
        ("ttl beyond a float", VALID + "  ttl: " + "9" * 400 + "\n"),
        ("timeout beyond a float", VALID + "  timeout: " + "9" * 400 + "\n"),
        ("scale beyond a float", VALID.replace("GAUGE,", "GAUGE, scale: " + "9" * 400 + ",")),
    ],
)
def test_loader_refuses_what_pyyaml_or_float_cannot_read(
    collector_file: Path, name: str, text: str
) -> None:
    """Values PyYAML's constructors or float() cannot build are problems naming the file.

    These once escaped as ValueError, KeyError, TypeError, IndexError, RecursionError
    or OverflowError: the CLI then logged a traceback and exited 1 instead of 2, a
    directory lost every file instead of skipping the bad one, and /reload gave a bare 500.
    """
    with pytest.raises(ConfigError) as caught:
        load_definitions(_write(collector_file, text))
    assert all(p.location.startswith(str(collector_file)) for p in caught.value.problems), name


def test_bad_file_in_a_directory_is_skipped_not_fatal(tmp_path: Path) -> None:
    """Directory mode: a file PyYAML cannot build is skipped like any invalid file."""
    (tmp_path / "0100-good.yml").write_text(VALID)
    (tmp_path / "0200-bad.yml").write_text("pg_y:\n  query: SELECT 1\n  desc: 2001-13-45\n")
    definitions = load_definitions(str(tmp_path))
    assert [c.key for c in definitions.collectors] == ["pg_x"]
    assert definitions.skipped_files == (str(tmp_path / "0200-bad.yml"),)


def _write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- the scrape-timeout header ---------------------------------------------------------

NUMBERISH = st.one_of(
    st.floats().map(repr),
    st.floats().map(str),
    st.integers().map(str),
    st.decimals(allow_nan=True).map(str),
    st.from_regex(r"\A[ \t]*[-+]?[0-9_]{0,400}(\.[0-9]*)?([eE][-+]?[0-9]{1,5})?[ \t]*\Z"),
    st.sampled_from(["", " ", "nan", "NaN", "-nan", "inf", "-Infinity", "1e999", "-0", "0",
                     "0x10", "1,5", "١٢", "５", "1\x00", "\u00a05"]),
)  # fmt: skip


@CI
@given(header=st.one_of(st.none(), st.text(), NUMBERISH),
       default=st.floats(min_value=1e-3, max_value=1e6))  # fmt: skip
def test_budget_header_always_gives_a_usable_budget(header: str | None, default: float) -> None:
    """Never raises; finite, positive, at most the default; a valid shorter value is used."""
    seconds = budget_seconds(header, default)
    assert math.isfinite(seconds)
    assert 0 < seconds <= default
    if header is not None:
        try:
            wanted = float(header.strip())
        except ValueError:
            return
        if math.isfinite(wanted) and 0 < wanted < default:
            assert seconds == wanted


def test_budget_header_default_is_the_write_limit() -> None:
    """The default budget is the HTTP write limit: 30 s."""
    assert budget_seconds(None) == budget_seconds("abc") == DEFAULT_BUDGET == 30.0


# --- URLs ------------------------------------------------------------------------------

# A password that cannot occur in the rest of the URL (lower-case names, fixed words),
# with any character but NUL, which libpq cannot hold.
PASSWORDS = st.text(st.characters(exclude_characters="\0"), min_size=1, max_size=30).map(
    lambda text: "Zq9" + text
)
NAMES = st.text(string.ascii_lowercase, min_size=1, max_size=12)
PARAMS_IN_URL = ["sslmode=require", "application_name=x", "connect_timeout=3", "dbname=other"]
HOSTS = st.sampled_from(["localhost", "127.0.0.1", "[::1]", "db1:5432,db2:5433", ""])


@CI
@given(text=st.text())
def test_url_helpers_never_raise(text: str) -> None:
    """Arbitrary text: the helpers return strings; reading it refuses only with TargetError."""
    assert isinstance(mask(text), str)
    assert isinstance(database_of(text), str)
    with contextlib.suppress(TargetError):
        assert isinstance(Target.parse(text).masked, str)


@CI
@given(user=NAMES, password=PASSWORDS, host=HOSTS, db=NAMES,
       scheme=st.sampled_from(["postgresql", "postgres"]),
       params=st.lists(st.sampled_from(PARAMS_IN_URL), max_size=3))  # fmt: skip
def test_url_password_in_userinfo_is_masked(  # noqa: PLR0917 (one per strategy)
    user: str, password: str, host: str, db: str, scheme: str, params: list[str]
) -> None:
    """``scheme://user:password@host/db?…``: the (percent-encoded) password never shows."""
    encoded = quote(password, safe="")
    query = ("?" + "&".join(params)) if params else ""
    url = f"{scheme}://{user}:{encoded}@{host}/{db}{query}"
    for shown in (mask(url), Target.parse(url).masked):
        assert encoded not in shown
        assert MASK in shown
    assert database_of(url) == ("other" if "dbname=other" in params else db)


@CI
@given(password=PASSWORDS, db=NAMES, before=st.sampled_from(["", "sslmode=disable&"]),
       after=st.sampled_from(["", "&application_name=x"]))  # fmt: skip
def test_url_password_parameter_is_masked(password: str, db: str, before: str, after: str) -> None:
    """``?password=…`` in the query string never shows."""
    encoded = quote(password, safe="")
    url = f"postgresql://localhost/{db}?{before}password={encoded}{after}"
    for shown in (mask(url), Target.parse(url).masked):
        assert encoded not in shown
        assert MASK in shown


def _dsn_value(text: str) -> str:
    """A libpq keyword value: bare when it can be, else single-quoted with escapes."""
    if text and not any(ch.isspace() or ch in "'\\" for ch in text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@CI
@given(password=PASSWORDS, db=NAMES, spaces=st.sampled_from(["", " ", "  "]),
       position=st.integers(0, 2))  # fmt: skip
def test_keyword_dsn_password_is_masked(password: str, db: str, spaces: str, position: int) -> None:
    """``password=…`` (bare or quoted, with spaces around ``=``) never shows."""
    parts = [f"host=localhost dbname={db}", "user=u"]
    parts.insert(position, f"password{spaces}={spaces}{_dsn_value(password)}")
    dsn = " ".join(parts)
    for shown in (mask(dsn), Target.parse(dsn).masked):
        assert password not in shown
        assert MASK in shown
    assert database_of(dsn) == db


# --- const labels ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("labels") / "c.yml"
    path.write_text(VALID)
    return str(path)


def _labels(config_path: str, text: str) -> tuple[tuple[str, str], ...] | None:
    """The const labels ``--label text`` gives, or None on a UsageError."""
    try:
        found = parse_settings(["-c", config_path, "--label", text], {})
    except UsageError as exc:
        message = str(exc)
    else:
        return found.const_labels
    assert message.strip()
    return None


@CI
@given(text=st.one_of(st.text(), st.lists(st.text(max_size=8).map(lambda t: f"{t}={t}"),
                                          max_size=4).map(",".join)))  # fmt: skip
def test_label_flag_gives_valid_labels_or_usage_error(config_path: str, text: str) -> None:
    """Arbitrary ``--label``: UsageError, or distinct Prometheus label names."""
    labels = _labels(config_path, text)
    if labels is None:
        return
    names = [name for name, _ in labels]
    assert len(set(names)) == len(names)
    for name in names:
        assert LABEL_NAME.fullmatch(name)
        assert not name.startswith("__")


LABEL_VALUES = st.text(st.characters(blacklist_characters=",", blacklist_categories=["Cs"]),
                       max_size=15).map(str.strip)  # fmt: skip


@CI
@given(pairs=st.dictionaries(st.from_regex(r"\A[a-zA-Z][a-zA-Z0-9_]{0,8}\Z"), LABEL_VALUES,
                             min_size=1, max_size=4))  # fmt: skip
def test_label_values_survive_the_exposition(config_path: str, pairs: dict[str, str]) -> None:
    """Valid pairs parse as given, and any value (quotes, backslashes, newlines) is
    escaped so that a Prometheus parser reads it back unchanged."""
    text = ",".join(f"{k}={v}" for k, v in pairs.items())
    labels = _labels(config_path, text)
    assert labels == tuple(pairs.items())
    body = encode(runtime_families(labels), Format.TEXT).decode()
    seen = [
        sample.labels
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    ]
    assert seen
    for sample_labels in seen:
        assert {k: sample_labels[k] for k in pairs} == pairs


# --- the Accept header -----------------------------------------------------------------

MEDIA = st.sampled_from(["application/openmetrics-text", "text/plain", "text/*", "*/*",
                         "application/json", "bogus", "", "/", "a/b/c"])  # fmt: skip
PARAMS = st.lists(
    st.one_of(st.builds("q={}".format, NUMBERISH), st.sampled_from(["version=1.0.0", "q", "=",
                                                                   "charset=utf-8", "q=="])),
    max_size=3,
)  # fmt: skip
ACCEPT = st.lists(st.builds(lambda m, p: ";".join([m, *p]), MEDIA, PARAMS), max_size=5).map(
    ",".join
)


@CI
@given(accept=st.one_of(st.none(), st.text(), ACCEPT))
def test_accept_header_always_negotiates(accept: str | None) -> None:
    """Any Accept header (or none) gives a format; never an exception."""
    assert negotiate(accept) in (Format.TEXT, Format.OPENMETRICS)


def test_accept_header_asking_for_openmetrics_gets_it() -> None:
    """A sanity check that the property above runs the real negotiation."""
    assert negotiate("application/openmetrics-text; version=1.0.0") is Format.OPENMETRICS
    assert negotiate("application/openmetrics-text;q=0.5,text/plain;q=0.9") is Format.TEXT
