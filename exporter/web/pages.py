"""Pages for operators: /version, /explain, /stat and /reload.

``/explain`` and ``/stat`` are plain text, or a readable HTML page when a browser
asks for one. Reload validates the whole new config before anything changes.
"""

from __future__ import annotations

import html
import logging

from aiohttp import web

from exporter.config.flags import version_text
from exporter.report.explain import last_plans
from exporter.report.stat import stat_text
from exporter.web.appstate import STATE
from exporter.web.fleetrequests import state_for
from exporter.web.reloading import RELOADER

log = logging.getLogger(__name__)


async def version_handler(request: web.Request) -> web.Response:
    """Build and runtime version text, as ``--version`` prints it."""
    return web.Response(text=version_text() + "\n")


async def explain_handler(request: web.Request) -> web.Response:
    """Planned collectors with their SQL, and why the others were not planned, as the
    last pass planned them: it never waits for the collection lock nor sends SQL."""
    return text_or_html(request, "explain", last_plans(state_for(request, STATE).exporter))


async def stat_handler(request: web.Request) -> web.Response:
    """Per-collector statistics as a text table (of ``?target=NAME`` in fleet mode)."""
    return text_or_html(request, "stat", stat_text(state_for(request, STATE).exporter))


def text_or_html(request: web.Request, title: str, text: str) -> web.Response:
    """Plain text, or the same text as a page when a browser prefers HTML."""
    if "text/html" not in request.headers.get("Accept", ""):
        return web.Response(text=text)
    return web.Response(text=html_page(title, text), content_type="text/html")


def html_page(title: str, text: str) -> str:
    """``text`` as a readable HTML page titled ``title``."""
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>pg_exporter {title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{font-size:13px}</style></head>"
        f'<body><p><a href="/">pg_exporter</a> / {title}</p><pre>{html.escape(text)}</pre>'
        "</body></html>"
    )


async def reload_handler(request: web.Request) -> web.Response:
    """GET (as the Go exporter) or POST: load and check the config again; 500 keeps the
    running one. Requests during a reload share one (see :mod:`exporter.web.reloading`)."""
    if request.method not in ("GET", "POST"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
    outcome = await request.app[RELOADER].reload()
    return web.Response(status=200 if outcome.ok else 500, text=outcome.message + "\n")
