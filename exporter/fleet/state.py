"""What serves one target: its settings, exporter, admission and self-metrics.

The single-target app holds one (:data:`exporter.web.appstate.STATE`); a fleet holds one per
member (:class:`~exporter.fleet.members.Member`). No HTTP here, so the fleet needs nothing from
:mod:`exporter.web`.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.collect.admission import Admission
from exporter.collect.exporter import Exporter
from exporter.config.settings import Settings
from exporter.report.selfmetrics import SelfMetrics


@dataclass(slots=True)
class State:
    """Everything the handlers of one target share (no globals)."""

    settings: Settings
    exporter: Exporter
    admission: Admission
    selfmetrics: SelfMetrics
