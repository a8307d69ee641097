"""Fleet requests: which member a request names (``?target=NAME``), and the routes'
paths. Nothing in a request becomes a URL, host or credential: a request reaches a
member only by a declared name. The fleet itself is :mod:`exporter.fleet.members`.
"""

from __future__ import annotations

from aiohttp import web

from exporter.fleet.members import Fleet, Member
from exporter.fleet.state import State

TARGET_PARAMETER = "target"
FLEET_PAGE = "/targets"
SERVICE_DISCOVERY_PATH = "/sd"  # the declared names for Prometheus's http_sd_configs

FLEET = web.AppKey("fleet", Fleet)

_ONLY_TARGET = (
    "this exporter serves a fleet: name one declared target with ?target=NAME and nothing "
    f"else (the declared targets are listed at {FLEET_PAGE})\n"
)
_UNKNOWN = f"no target of that name is declared; the declared targets are listed at {FLEET_PAGE}\n"


def member_for(request: web.Request) -> Member:
    """The member a fleet request names; 400 when it names none, several, or passes any
    other parameter; 404 for a name that is not declared. The name is never echoed:
    it is the client's text and might be a URL with a password."""
    names = request.query.getall(TARGET_PARAMETER, [])
    if len(names) != 1 or len(request.query) != 1:
        raise web.HTTPBadRequest(text=_ONLY_TARGET)
    member = request.app[FLEET].member(names[0])
    if member is None:
        raise web.HTTPNotFound(text=_UNKNOWN)
    return member


def state_for(request: web.Request, default: web.AppKey[State]) -> State:
    """The state a request is about: the named member's in fleet mode, else the app's."""
    if FLEET in request.app:
        return member_for(request).state
    return request.app[default]
