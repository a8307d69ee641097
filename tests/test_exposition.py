"""Tests for exporter.expose.exposition: negotiation, value formatting, families and encoding."""

from __future__ import annotations

import gc
import math
import re

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.expose import exposition
from exporter.expose.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Family,
    Format,
    accepts_gzip,
    content_type,
    encode,
    format_value,
    label_block,
    make_family,
    negotiate,
)
from exporter.report.process import runtime_families
from tests.fixtures.promtool import unexpected_problems


def parse_openmetrics(text: str) -> list[Metric]:
    """client_python's strict OpenMetrics parser (untyped upstream)."""
    return list(text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, Format.TEXT),
        ("", Format.TEXT),
        ("*/*", Format.TEXT),
        ("text/plain;version=0.0.4", Format.TEXT),
        (PROMETHEUS_ACCEPT, Format.OPENMETRICS),
        ("application/openmetrics-text", Format.OPENMETRICS),
        ("Application/OpenMetrics-Text; Version=1.0.0", Format.OPENMETRICS),
        ("application/openmetrics-text;q=0", Format.TEXT),
        ("application/openmetrics-text;q=0.0, */*", Format.TEXT),
        ("text/plain, application/openmetrics-text;q=0.5", Format.TEXT),
        ("text/plain;q=0.5, application/openmetrics-text;q=0.9", Format.OPENMETRICS),
        ("application/openmetrics-text, text/plain", Format.OPENMETRICS),
        # The most specific text range decides: text/plain at 0.2 beats */* at 1.
        ("*/*, application/openmetrics-text;q=0.5, text/plain;q=0.2", Format.OPENMETRICS),
        ("application/openmetrics-text;q=abc", Format.TEXT),
        ("application/openmetrics-text;q=2", Format.TEXT),
        ("application/openmetrics-text;q=nan", Format.TEXT),
        ("application/openmetrics-text;q=-1", Format.TEXT),
        ("garbage;;;,,,=;q", Format.TEXT),
        ("\x00\xff, ;;", Format.TEXT),
        ("application/json", Format.TEXT),
        (
            "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6",
            Format.OPENMETRICS,
        ),
    ],
)
def test_negotiate(accept: str | None, expected: Format) -> None:
    """OpenMetrics is chosen only when asked for with q > 0 and not below text."""
    assert negotiate(accept) is expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, False), ("", False), ("gzip", True), ("GZip", True), ("gzip, deflate", True),
        ("deflate, br", False), ("gzip;q=0", False), ("gzip; q=0.0", False),
        ("gzip;q=0.5", True), ("*", True), ("*;q=0", False), ("*, gzip;q=0", False),
        ("gzip;q=0, *", False), ("x-gzip", True), ("gzip;q=abc", False), ("identity", False),
    ],
)  # fmt: skip
def test_accepts_gzip(header: str | None, expected: bool) -> None:
    """gzip only when Accept-Encoding allows it with a q above 0; q=0 means "not this"."""
    assert accepts_gzip(header) is expected


def test_content_types() -> None:
    """Each format has its own Content-Type header."""
    assert content_type(Format.TEXT) == TEXT_CONTENT_TYPE
    assert content_type(Format.OPENMETRICS) == OPENMETRICS_CONTENT_TYPE
    assert TEXT_CONTENT_TYPE.startswith("text/plain; version=0.0.4")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (42, "42"),
        (-7, "-7"),
        (2**63 - 1, "9223372036854775807"),
        (True, "1"),
        (False, "0"),
        (0.5, "0.5"),
        (3.0, "3.0"),
        (1e16, "1e+16"),
        (0.1 + 0.2, "0.30000000000000004"),
        (math.nan, "NaN"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
    ],
)
def test_format_value(value: float, text: str) -> None:
    """Ints print as ints, floats as their shortest repr, specials as Prometheus spells them."""
    assert format_value(value) == text


def test_label_block_escapes_values() -> None:
    """Backslash, double quote and newline in label values are escaped."""
    block = label_block([("a", 'x"y'), ("b", "c:\\d"), ("n", "1\n2")])
    assert block == '{a="x\\"y",b="c:\\\\d",n="1\\n2"}'
    assert label_block([]) == ""


def test_help_escaping_per_format() -> None:
    """HELP escapes backslash and newline; OpenMetrics also escapes double quotes."""
    family = make_family("m", "gauge", 'say "hi"\\now\nthen', [((), 1)])
    assert family.header(Format.TEXT) == b'# HELP m say "hi"\\\\now\\nthen\n# TYPE m gauge\n'
    assert family.header(Format.OPENMETRICS) == (
        b'# HELP m say \\"hi\\"\\\\now\\nthen\n# TYPE m gauge\n'
    )


def test_family_rejects_unknown_kind() -> None:
    """Only gauge, counter and untyped families exist."""
    with pytest.raises(ValueError, match="histogram"):
        Family("m", "histogram", "h", 0)


def test_counter_keeps_its_name_in_text_and_gains_total_in_openmetrics() -> None:
    """Text: TYPE and samples use the name as formed; OpenMetrics samples end in _total."""
    family = make_family("pg_x_calls", "counter", "calls", [((("q", "a"),), 3)])
    assert encode([family], Format.TEXT) == (
        b'# HELP pg_x_calls calls\n# TYPE pg_x_calls counter\npg_x_calls{q="a"} 3\n'
    )
    assert encode([family], Format.OPENMETRICS) == (
        b'# HELP pg_x_calls calls\n# TYPE pg_x_calls counter\npg_x_calls_total{q="a"} 3\n# EOF\n'
    )


def test_counter_already_ending_in_total() -> None:
    """OpenMetrics drops _total from the family name of such a counter; the sample keeps it."""
    family = make_family("req_total", "counter", "r", [((), 1)])
    assert encode([family], Format.TEXT) == b"# HELP req_total r\n# TYPE req_total counter\n" + (
        b"req_total 1\n"
    )
    assert encode([family], Format.OPENMETRICS) == (
        b"# HELP req r\n# TYPE req counter\nreq_total 1\n# EOF\n"
    )


def test_openmetrics_counter_rewrite_is_per_line() -> None:
    """Every sample of a multi-line counter gets _total, label values containing the name don't."""
    samples = [((("v", "c\nc"),), 1), ((("v", "c"),), 2), ((), 3)]
    family = make_family("c", "counter", "h", samples)
    body = family.body(Format.OPENMETRICS)
    assert body == b'c_total{v="c\\nc"} 1\nc_total{v="c"} 2\nc_total 3\n'
    assert family.body(Format.OPENMETRICS) is body  # memoised


def test_untyped_becomes_unknown_in_openmetrics() -> None:
    """OpenMetrics has no untyped: such families are typed unknown."""
    family = make_family("u", "untyped", "h", [((), 1.5)])
    assert b"# TYPE u untyped\n" in encode([family], Format.TEXT)
    assert b"# TYPE u unknown\n" in encode([family], Format.OPENMETRICS)


def test_encode_merges_same_name_under_first_header() -> None:
    """Families of one name from several sources share one HELP/TYPE; first help wins."""
    first = make_family("pg_db_size", "gauge", "first help", [((("datname", "a"),), 1)])
    other = make_family("pg_up", "gauge", "up", [((), 1)])
    second = make_family("pg_db_size", "gauge", "second help", [((("datname", "b"),), 2)])
    assert encode([first, other, second], Format.TEXT).decode() == (
        "# HELP pg_db_size first help\n# TYPE pg_db_size gauge\n"
        'pg_db_size{datname="a"} 1\npg_db_size{datname="b"} 2\n'
        "# HELP pg_up up\n# TYPE pg_up gauge\npg_up 1\n"
    )


def test_encode_drops_and_reports_a_kind_conflict() -> None:
    """A later same-name family of another kind is dropped and reported."""
    gauge = make_family("m", "gauge", "g", [((("s", "1"),), 1)])
    counter = make_family("m", "counter", "c", [((("s", "2"),), 2)])
    reports: list[str] = []
    output = encode([gauge, counter], Format.TEXT, reports.append)
    assert output == b'# HELP m g\n# TYPE m gauge\nm{s="1"} 1\n'
    assert len(reports) == 1
    assert "m" in reports[0]
    assert "counter" in reports[0]
    assert "dropped" in reports[0]


def test_encode_omits_empty_families_and_ends_openmetrics_with_eof() -> None:
    """Families without series produce nothing; OpenMetrics output always ends with # EOF."""
    empty = make_family("e", "gauge", "h", [])
    assert encode([empty], Format.TEXT) == b""
    assert encode([empty], Format.OPENMETRICS) == b"# EOF\n"


def _mixed_families() -> list[Family]:
    """A little of everything: labels needing escapes, specials, counters of both spellings."""
    return [
        make_family("g", "gauge", 'help "q"\\\n', [((("l", 'a"\\\nb'),), math.nan)]),
        make_family("c", "counter", "c", [((("l", "x"),), 1), ((("l", "y"),), 2)]),
        make_family("t_total", "counter", "t", [((), 5)]),
        make_family("u", "untyped", "u", [((), -math.inf), ((("k", "v"),), 1e-7)]),
        make_family("g", "gauge", "ignored", [((("l", "other"),), math.inf)]),
    ]


def test_text_round_trip() -> None:
    """client_python's text parser reads back every family, label and value."""
    parsed = {m.name: m for m in parse_text(encode(_mixed_families(), Format.TEXT).decode())}
    assert set(parsed) == {"g", "c", "t", "u"}  # the parser itself strips counters' _total
    g = parsed["g"]
    assert g.documentation == 'help "q"\\\n'
    assert [s.labels for s in g.samples] == [{"l": 'a"\\\nb'}, {"l": "other"}]
    assert math.isnan(g.samples[0].value)
    assert g.samples[1].value == math.inf
    assert [s.value for s in parsed["c"].samples] == [1, 2]
    assert parsed["u"].samples[1].value == 1e-7


def test_text_type_lines_name_the_samples() -> None:
    """In the text format every sample line starts with the name its TYPE line declares."""
    text = encode(_mixed_families(), Format.TEXT).decode()
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            current = line.split()[2]
        elif not line.startswith("#"):
            assert re.match(rf"{current}[{{ ]", line), line


def test_openmetrics_round_trip() -> None:
    """client_python's strict OpenMetrics parser accepts the output and reads it back."""
    output = encode(_mixed_families(), Format.OPENMETRICS).decode()
    parsed = {m.name: m for m in parse_openmetrics(output)}
    assert {n: m.type for n, m in parsed.items()} == {
        "g": "gauge",
        "c": "counter",
        "t": "counter",
        "u": "unknown",
    }
    assert parsed["g"].documentation == 'help "q"\\\n'
    assert [s.name for s in parsed["c"].samples] == ["c_total", "c_total"]
    assert [s.name for s in parsed["t"].samples] == ["t_total"]


def test_runtime_families_names_and_labels() -> None:
    """Process, platform and GC metrics carry client_python's text names and the const labels."""
    families = runtime_families([("instance", "pg-1")])
    kinds = {f.name: f.kind for f in families}
    assert kinds["process_cpu_seconds_total"] == "counter"
    assert kinds["process_resident_memory_bytes"] == "gauge"
    assert kinds["process_start_time_seconds"] == "gauge"
    assert kinds["process_open_fds"] == "gauge"
    assert kinds["python_info"] == "gauge"
    assert kinds["python_gc_objects_collected_total"] == "counter"
    assert kinds["python_gc_collections_total"] == "counter"
    text = encode(families, Format.TEXT).decode()
    assert "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total{" in text
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples
    assert all('instance="pg-1"}' in line for line in samples)
    parsed = {m.name: m for m in parse_openmetrics(encode(families, Format.OPENMETRICS).decode())}
    assert parsed["process_cpu_seconds"].samples[0].name == "process_cpu_seconds_total"


def test_runtime_families_are_fresh_each_call() -> None:
    """Each call samples the process again: a full collection shows up at once."""

    def generation_2_collections() -> float:
        family = next(f for f in runtime_families([]) if f.name == "python_gc_collections_total")
        samples = parse_text(
            family.header(Format.TEXT).decode() + family.body(Format.TEXT).decode()
        )
        return next(s.value for m in samples for s in m.samples if s.labels["generation"] == "2")

    gc.disable()  # no automatic collection may blur the count
    try:
        before = generation_2_collections()
        gc.collect()
        assert generation_2_collections() == before + 1
    finally:
        gc.enable()


def test_promtool_accepts_text_output(promtool: str) -> None:
    """promtool parses the text output; its only complaints are the naming rules we keep."""
    families = [*_mixed_families(), *runtime_families([("instance", "x")])]
    assert unexpected_problems(promtool, encode(families, Format.TEXT)) == []


def test_openmetrics_leaves_out_counter_samples_no_counter_may_have() -> None:
    """A NaN or negative counter sample (pg_receive_lsn on a primary) is left out of
    OpenMetrics, which a strict parser otherwise rejects whole; the text format keeps it."""
    lsn = make_family(
        "pg_receive_lsn", "counter", "lsn",
        [((("s", "a"),), math.nan), ((("s", "b"),), -1), ((("s", "c"),), 7), ((("s", "d"),), -0.0)],
    )  # fmt: skip
    total = make_family("t_total", "counter", "t", [((), math.nan), ((("k", "v -1"),), 2)])
    output = encode([lsn, total], Format.OPENMETRICS).decode()
    parsed = {m.name: m for m in parse_openmetrics(output)}
    assert [(s.labels, s.value) for s in parsed["pg_receive_lsn"].samples] == [
        ({"s": "c"}, 7),
        ({"s": "d"}, 0),
    ]
    assert [(s.labels, s.value) for s in parsed["t"].samples] == [({"k": "v -1"}, 2)]
    text = encode([lsn], Format.TEXT).decode()
    assert 'pg_receive_lsn{s="a"} NaN\n' in text
    assert 'pg_receive_lsn{s="b"} -1\n' in text


def test_make_family_label_blocks_are_remembered_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Self-metrics render each (database, collector) label block once, not once per
    family; the table of blocks stays under its bound, and lists of pairs still work."""
    monkeypatch.setattr(exposition, "_LABEL_BLOCKS", {})
    monkeypatch.setattr(exposition, "LABEL_BLOCKS_MAX", 4)
    pairs = [((("datname", f"d{n}"), ("query", 'q"x')), float(n)) for n in range(10)]
    for _ in range(3):
        family = make_family("m", "gauge", "h", pairs)
        assert family.text_samples.decode().splitlines()[9] == 'm{datname="d9",query="q\\"x"} 9.0'
        assert len(exposition._LABEL_BLOCKS) <= 4
    listed = make_family("m", "gauge", "h", [([("a", "b")], 1)])
    assert listed.text_samples == b'm{a="b"} 1\n'
    assert make_family("m", "gauge", "h", []).text_samples == b""
