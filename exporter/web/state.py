"""What the web handlers share, held on the aiohttp application (no globals)."""

from __future__ import annotations

import ssl
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
    # The listener's TLS context, whose certificate and key a reload re-reads.
    tls_context: ssl.SSLContext | None = None


STATE = web.AppKey("state", State)
