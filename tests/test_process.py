"""Tests for exporter.report.process: the process, interpreter and GC families, read without
prometheus_client, match what its collectors give for the same process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.expose.exposition import Format, encode
from exporter.report.process import runtime_families


def _client_python_text() -> str:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return generate_latest(registry).decode()


def _parsed(text: str) -> dict[str, tuple[str, str, dict[tuple[tuple[str, str], ...], float]]]:
    """name → (type, help, {sorted labels: value})."""
    return {
        m.name: (m.type, m.documentation,
                 {tuple(sorted(s.labels.items())): s.value for s in m.samples})
        for m in text_string_to_metric_families(text)
    }  # fmt: skip


def test_families_match_client_python() -> None:
    """Same names, kinds, HELP and labels; each value within what client_python's
    collectors read just before and just after ours (memory within 10 %)."""
    before = _parsed(_client_python_text())
    ours = _parsed(encode(runtime_families([]), Format.TEXT).decode())
    after = _parsed(_client_python_text())
    assert ours.keys() == before.keys()
    assert len(ours) == 10
    for name, (kind, help, samples) in before.items():
        assert ours[name][:2] == (kind, help), name
        assert ours[name][2].keys() == samples.keys(), name
        for labels, first in samples.items():
            low, high = sorted((first, after[name][2][labels]))
            slack = high * 0.1 if name.endswith("memory_bytes") else 1e-9
            mine = ours[name][2][labels]
            assert low - slack <= mine <= high + slack, (name, labels, low, mine, high)


def test_const_labels_follow_each_sample_s_own() -> None:
    """Const labels come after a sample's own labels, on every sample."""
    text = encode(runtime_families([("instance", "pg-1")]), Format.TEXT).decode()
    assert 'python_gc_collections_total{generation="0",instance="pg-1"} ' in text
    assert '\nprocess_open_fds{instance="pg-1"} ' in text
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) == 16
    assert all('instance="pg-1"}' in line for line in samples)
