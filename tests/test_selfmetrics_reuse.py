"""Self-metric families whose samples did not change are given back as they were rendered."""

from __future__ import annotations

from exporter.collect.admission import Admission
from exporter.collect.budget import Interruption
from exporter.expose.exposition import Format, encode
from exporter.report.selfmetrics import SelfMetrics


def _by_name(metrics: SelfMetrics, admission: Admission) -> dict[str, bytes]:
    return {f.name: f.text_samples for f in metrics.requests(admission)}


def test_an_unchanged_family_is_the_same_rendering() -> None:
    metrics, admission = SelfMetrics("pg", (("env", "prod"),)), Admission()
    first = {f.name: f for f in metrics.requests(admission)}
    second = {f.name: f for f in metrics.requests(admission)}
    assert all(second[name] is first[name] for name in first)


def test_a_changed_family_is_rendered_again_and_only_it() -> None:
    metrics, admission = SelfMetrics("pg", ()), Admission()
    first = {f.name: f for f in metrics.requests(admission)}
    admission.note_interrupted(Interruption.CLIENT)
    second = {f.name: f for f in metrics.requests(admission)}
    changed = [name for name in first if second[name] is not first[name]]
    assert changed == ["pg_exporter_requests_interrupted_total"]
    body = encode(second.values(), Format.TEXT).decode()
    assert 'pg_exporter_requests_interrupted_total{reason="client"} 1.0\n' in body


def test_values_that_come_back_render_as_they_are_now() -> None:
    """A value back to an older one after a change shows the current value, const labels
    included, never the rendering of a pass before."""
    metrics, admission = SelfMetrics("pg", (("env", "prod"),)), Admission()
    renders = []
    for reason in (None, Interruption.CLIENT, None):
        if reason is not None:
            admission.note_interrupted(reason)
        renders.append(_by_name(metrics, admission)["pg_exporter_requests_interrupted_total"])
    assert b'{reason="client",env="prod"} 0.0' in renders[0]
    assert b'{reason="client",env="prod"} 1.0' in renders[1]
    assert renders[2] == renders[1]


def test_two_namespaces_do_not_share_renderings() -> None:
    admission = Admission()
    a = SelfMetrics("pg", ()).requests(admission)
    b = SelfMetrics("pgbouncer", ()).requests(admission)
    assert a[0].name == "pg_exporter_requests_admitted_total"
    assert b[0].name == "pgbouncer_exporter_requests_admitted_total"
