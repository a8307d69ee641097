"""Admission of telemetry requests (B1, B3, D12)."""

from __future__ import annotations

import pytest

from exporter.admission import Admission


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
