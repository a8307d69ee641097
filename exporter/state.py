"""What serves one target: its settings, exporter, admission and self-metrics.

The single-target app holds one (:data:`exporter.web.state.STATE`); a fleet holds one per
member (:class:`~exporter.fleet.Member`). No HTTP here, so the fleet needs nothing from
:mod:`exporter.web`.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.admission import Admission
from exporter.collection import Exporter
from exporter.selfmetrics import SelfMetrics
from exporter.settings import Settings


@dataclass(slots=True)
class State:
    """Everything the handlers of one target share (no globals)."""

    settings: Settings
    exporter: Exporter
    admission: Admission
    selfmetrics: SelfMetrics
