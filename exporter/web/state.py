"""What the web handlers of one target share: held on the aiohttp application (no
globals), or by each member of a fleet."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from exporter.admission import Admission
from exporter.collection import Exporter
from exporter.selfmetrics import SelfMetrics
from exporter.settings import Settings


@dataclass(slots=True)
class State:
    """Everything the handlers share, held on the application (no globals)."""

    settings: Settings
    exporter: Exporter
    admission: Admission
    selfmetrics: SelfMetrics


STATE = web.AppKey("state", State)
