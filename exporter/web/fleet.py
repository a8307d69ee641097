"""Fleet mode: every declared target watched as a single-target exporter would watch it.

Each member has what a single-target exporter has: its own exporter (passes one at
a time, caches, plans, connection budget, breaker), admission (two scrapes), self-
metrics and health probe. What they share is the process and the fleet's ceiling on
targets collected at once (:class:`~exporter.gate.Gate`).

A request reaches a member only by a declared name (``?target=NAME``); nothing in a
request becomes a URL, host or credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass, field

from aiohttp import web

from exporter.admission import Admission
from exporter.collection import Exporter
from exporter.declared import Declared, DeclaredTarget
from exporter.definitions import Definitions
from exporter.gate import Gate
from exporter.logs import TARGET
from exporter.selfmetrics import SelfMetrics
from exporter.settings import Settings
from exporter.web.probe import HealthProbe
from exporter.web.state import State

log = logging.getLogger(__name__)

TARGET_PARAMETER = "target"
FLEET_PAGE = "/targets"
SERVICE_DISCOVERY_PATH = "/sd"  # the declared names for Prometheus's http_sd_configs
# Health probes start spread over their first interval, and over longer for a large
# fleet (at most PROBE_STARTS_PER_SECOND), so that hundreds of targets are not all
# connected to in the same instant.
PROBE_SPREAD = 1.0  # seconds
PROBE_STARTS_PER_SECOND = 100


@dataclass(slots=True)
class Member:
    """One declared target and everything that serves it."""

    declared: DeclaredTarget
    state: State
    probe: HealthProbe
    _probing: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """The declared name: what ``?target=`` asks for."""
        return self.declared.name

    def start(self, delay: float) -> None:
        """Run the health probe (after ``delay`` seconds), its log lines naming the target."""
        self.state.exporter.recovery_seen = self.probe.recovery_seen
        token = TARGET.set(self.name)  # the probe task copies the context it starts in
        try:
            self._probing = asyncio.create_task(
                _probe_after(self.probe, delay), name=f"health probe {self.name}"
            )
        finally:
            TARGET.reset(token)

    async def close(self) -> None:
        """Stop the probe, let a pass in flight end, close every connection."""
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probing
        await self.probe.close()
        await self.state.exporter.close()


async def _probe_after(probe: HealthProbe, delay: float) -> None:
    await asyncio.sleep(delay)
    await probe.run()


class Fleet:
    """The declared targets by name, sharing one ceiling on passes at once."""

    def __init__(self, settings: Settings, declared: Declared, definitions: Definitions) -> None:
        self.settings = settings
        self.declared = declared
        self.definitions = definitions
        self.gate = Gate(settings.max_concurrent_targets)
        self.members: dict[str, Member] = {}

    def member(self, name: str) -> Member | None:
        """The member declared as ``name``, or None."""
        return self.members.get(name)

    def start(self) -> None:
        """Create and start every declared member."""
        for target in self.declared.targets:
            self._add(target)

    def _add(self, target: DeclaredTarget) -> None:
        settings = target.settings
        state = State(
            settings=settings,
            exporter=Exporter(settings, self.definitions, gate=self.gate),
            admission=Admission(),
            selfmetrics=SelfMetrics(settings.effective_namespace(), settings.const_labels),
        )
        probe = HealthProbe(
            settings.target.conninfo, settings.connect_timeout, pgbouncer=settings.is_pgbouncer
        )
        member = Member(target, state, probe)
        self.members[target.name] = member
        spread = max(PROBE_SPREAD, len(self.declared.targets) / PROBE_STARTS_PER_SECOND)
        member.start(delay=random.uniform(0.0, spread))

    async def apply(self, declared: Declared, definitions: Definitions | None) -> str:
        """Take a reloaded targets file (and collector definitions, when they changed).

        A target whose settings did not change keeps its caches, plans, connections and
        statistics; a changed one starts afresh; a removed one is closed once its pass in
        flight ends. Returns a summary for the log and ``/reload``.
        """
        if definitions is not None:
            self.definitions = definitions
            for member in self.members.values():
                member.state.exporter.schedule(definitions)
        wanted = {target.name: target for target in declared.targets}
        gone = [m for name, m in self.members.items() if wanted.get(name) != m.declared]
        for member in gone:
            del self.members[member.name]
        added = [t for name, t in wanted.items() if name not in self.members]
        for target in added:
            self._add(target)
        self.declared = declared
        await asyncio.gather(*(member.close() for member in gone))
        changed = sum(1 for m in gone if m.name in wanted)
        removed, new = len(gone) - changed, len(added) - changed
        return f"targets: {new} added, {changed} changed, {removed} removed, {len(wanted)} in all"

    async def close(self) -> None:
        """Close every member (shutdown)."""
        members, self.members = list(self.members.values()), {}
        await asyncio.gather(*(member.close() for member in members))


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
