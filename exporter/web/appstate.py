"""Where the web handlers of a single-target exporter find the target's
:class:`~exporter.fleet.state.State`: on the aiohttp application (no globals)."""

from __future__ import annotations

from aiohttp import web

from exporter.fleet.state import State

STATE = web.AppKey("state", State)
