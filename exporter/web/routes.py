"""The exporter's fixed routes, written once: the app, the landing page and the
telemetry-path check all read :data:`ROUTES`.

The telemetry path (``/metrics`` unless ``--web.telemetry-path`` says otherwise)
is added before them, and the landing page answers every other path.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from exporter import __version__
from exporter.web.fleetpages import (
    fleet_metrics_handler,
    probe_handler,
    service_discovery_handler,
    targets_handler,
)
from exporter.web.fleetrequests import FLEET_PAGE, SERVICE_DISCOVERY_PATH
from exporter.web.healthpages import (
    ALIVE_PATH,
    PRIMARY_PATHS,
    REPLICA_PATHS,
    UP_PATHS,
    alive_handler,
    health_handler,
)
from exporter.web.healthpages import ROUTES as HEALTH_ROUTES
from exporter.web.metrics import metrics_handler
from exporter.web.pages import explain_handler, reload_handler, stat_handler, version_handler

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Route:
    """One fixed path, what serves it, and whether the landing page links it."""

    path: str
    handler: Handler
    method: str = "GET"  # "*": every method
    linked: bool = True


_LINKED_HEALTH = (UP_PATHS[0], PRIMARY_PATHS[0], REPLICA_PATHS[0])

ROUTES: tuple[Route, ...] = (
    Route("/explain", explain_handler),
    Route("/stat", stat_handler),
    Route("/version", version_handler),
    # Every method: load balancers check with OPTIONS, HEAD, GET or POST (HAProxy's
    # httpchk sends OPTIONS), and a method routed to the landing page would get its
    # 200, passing a replica as a primary. The landing page links one path of each kind.
    *(
        Route(path, health_handler(want), "*", linked=path in _LINKED_HEALTH)
        for path, want in HEALTH_ROUTES.items()
    ),
    # The exporter itself, never the database: a container's liveness probe.
    Route(ALIVE_PATH, alive_handler, "*"),
    Route("/reload", reload_handler, "*"),  # GET as in the Go exporter, or POST
)


# Fleet mode only: without a targets file these paths reach the landing page, as before.
FLEET_ROUTES: tuple[Route, ...] = (
    Route("/probe", probe_handler, linked=False),  # needs ?target=NAME
    Route(FLEET_PAGE, targets_handler),
    Route(SERVICE_DISCOVERY_PATH, service_discovery_handler),  # Prometheus http_sd_configs
)
LANDING = web.AppKey("landing", tuple[str, ...])  # the paths the landing page links


def add_routes(app: web.Application, telemetry_path: str, *, fleet: bool = False) -> None:
    """The exposition at ``telemetry_path`` (in fleet mode: the exporter's own metrics),
    every fixed route, the fleet's routes in fleet mode, then the landing page for any
    other path."""
    app.router.add_get(telemetry_path, fleet_metrics_handler if fleet else metrics_handler)
    routes = (*ROUTES, *FLEET_ROUTES) if fleet else ROUTES
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
    app.router.add_route("*", "/{tail:.*}", landing_handler)
    app[LANDING] = (telemetry_path, *(r.path for r in routes if r.linked))


def telemetry_path_problems(path: str) -> list[str]:
    """Why ``path`` cannot serve the exposition unambiguously (empty when it can)."""
    problems = []
    if not path.startswith("/") or path == "/":
        problems.append("must be an absolute path other than /")
    if any(ch in path for ch in "?#{}") or any(ch.isspace() for ch in path):
        problems.append("must not contain '?', '#', braces or spaces")
    if "//" in path or "/./" in path or "/../" in path or path.endswith(("/.", "/..")):
        problems.append("must be canonical (no //, /./ or /../)")
    if any(route.path == path for route in (*ROUTES, *FLEET_ROUTES)):
        problems.append(f"clashes with the fixed route {path}")
    return problems


async def landing_handler(request: web.Request) -> web.Response:
    """A small page linking everything the exporter serves (unknown paths show it too)."""
    paths = request.app[LANDING]
    items = "".join(f'<li><a href="{html.escape(p)}">{html.escape(p)}</a></li>' for p in paths)
    page = (
        "<!doctype html><html><head><title>pg_exporter</title></head><body>"
        f"<h1>pg_exporter {html.escape(__version__)}</h1><ul>{items}</ul></body></html>"
    )
    return web.Response(text=page, content_type="text/html")
