"""Admission of telemetry requests (B1, B3, D12)."""

from __future__ import annotations

import pytest

from exporter.collect.admission import Admission
from exporter.collect.budget import Interruption
from exporter.expose.exposition import Format, encode
from exporter.report.selfmetrics import SelfMetrics


def test_third_request_is_rejected() -> None:
    """Two requests are admitted at once; a third is refused without queueing (B1)."""
    admission = Admission()
    with admission.slot() as first, admission.slot() as second, admission.slot() as third:
        assert (first, second, third) == (True, True, False)
        assert admission.active == 2
    assert admission.active == 0
    assert (admission.admitted, admission.rejected) == (2, 1)


def test_slot_released_on_exception() -> None:
    """An error inside the request gives its slot back (B3)."""
    admission = Admission()
    with pytest.raises(RuntimeError), admission.slot():
        raise RuntimeError("boom")
    assert admission.active == 0
    with admission.slot() as admitted:
        assert admitted


def test_interruptions_are_exported_by_their_label_value() -> None:
    """Interruptions are counted by reason, exported as the reason label's plain strings;
    budget and client are always there, write_timeout once it happened."""
    admission = Admission()
    admission.note_interrupted(Interruption.CLIENT)
    admission.note_interrupted(Interruption.WRITE_TIMEOUT)
    admission.note_interrupted(Interruption.WRITE_TIMEOUT)
    body = encode(SelfMetrics("pg", ()).requests(admission), Format.TEXT).decode()
    lines = [line for line in body.splitlines() if line.startswith("pg_exporter_requests_int")]
    assert lines == [
        'pg_exporter_requests_interrupted_total{reason="budget"} 0.0',
        'pg_exporter_requests_interrupted_total{reason="client"} 1.0',
        'pg_exporter_requests_interrupted_total{reason="write_timeout"} 2.0',
    ]


def test_writing_holds_no_slot_but_a_writer_place() -> None:
    """An answer being written counts as in flight and frees its slot for a scrape; past
    ``write_limit`` answers being written, a new request is refused (issue 25)."""
    admission = Admission(limit=2, write_limit=2)
    with admission.writer(), admission.writer():
        assert (admission.collecting, admission.writing, admission.active) == (0, 2, 2)
        with admission.slot() as admitted:
            assert not admitted  # two unread answers: the third request gets 503
    with admission.writer(), admission.slot() as first, admission.slot() as second:
        assert (first, second) == (True, True)  # a writer takes no slot
        assert admission.active == 3
    assert admission.active == 0
