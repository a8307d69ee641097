"""Fleet mode: every declared target watched as a single-target exporter would watch it.

Each member has what a single-target exporter has: its own exporter (passes one at
a time, caches, plans, connection budget, breaker), admission (two scrapes), self-
metrics and health probe. What they share is the process, the fleet's ceiling on
targets collected at once (:class:`~exporter.collect.gate.Gate`), its ceilings on health
probes (:class:`~exporter.health.probeslots.ProbeSlots`) and the per-server bulkheads
(:class:`~exporter.pg.bulkheads.Bulkheads`) that bound what all the targets naming one
server hold there.

No HTTP here: :mod:`exporter.web.fleetrequests` finds the member a request names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from exporter.collect.admission import Admission
from exporter.collect.exporter import Exporter
from exporter.collect.gate import Gate
from exporter.config.definitions import Definitions
from exporter.config.logs import TARGET
from exporter.config.settings import Settings
from exporter.config.targetsfile import Declared, DeclaredTarget
from exporter.fleet.state import State
from exporter.health.probe import HealthProbe, HealthSnapshot
from exporter.health.probeslots import DEFAULT_MAX_PROBES, YIELD_AFTER, CeilingReached, ProbeSlots
from exporter.pg.bulkheads import Bulkheads
from exporter.report.selfmetrics import SelfMetrics

log = logging.getLogger(__name__)

# A target's health probe runs while load balancers ask about it: it starts with the
# first health request naming the target and stops, closing its connection, once none
# has come for this long. A fleet nobody routes by costs no probe connections at all.
HEALTH_IDLE = 300.0  # seconds
# A target no pass has collected for this long gives its connections back (say, it
# moved to another replica's shard); the next probe of it connects again.
CONNECTIONS_IDLE = 300.0  # seconds
JANITOR_PERIOD = 60.0  # seconds between two looks for idle connections
APPLY_CHUNK = 25  # members built or closed by a reload between two turns of the loop
FIRST_PROBE_MARGIN = 0.05  # seconds, beyond the connect timeout, for a probe's first answer
CEILING_LOG_PERIOD = 60.0  # seconds between two warnings that the probe ceiling refused one


@dataclass(slots=True)
class Member:
    """One declared target and everything that serves it."""

    declared: DeclaredTarget
    state: State
    probe: HealthProbe
    slots: ProbeSlots  # the fleet's probe places; this target's is given back on idling out
    asked_at: float = 0.0  # the event loop's time of the last health request
    _probing: asyncio.Task[None] | None = field(default=None, repr=False)
    _stopping: asyncio.Task[None] | None = field(default=None, repr=False)  # displaced
    _closed: bool = field(default=False, repr=False)  # removed by a reload, or shut down

    def __post_init__(self) -> None:
        self.state.exporter.recovery_seen = self.probe.recovery_seen
        # One login back-off (issue 25), within the fleet's per-server bulkheads (issue 29).
        self.probe.logins = self.state.exporter.connections.logins

    @property
    def name(self) -> str:
        """The declared name: what ``?target=`` asks for."""
        return self.declared.name

    @property
    def probing(self) -> bool:
        """True while the health probe runs (health requests came recently)."""
        return self._probing is not None and not self._probing.done()

    async def health(self) -> HealthProbe:
        """The health probe, started by the first health request in a while (the target
        holds a probe place: :meth:`Fleet.health` saw to it).

        Requests that come before its first answer wait for it, at most the connect
        timeout (which also bounds the probe), so they do not answer ``unknown``
        needlessly; later ones never wait.
        """
        loop = asyncio.get_running_loop()
        self.asked_at = loop.time()
        if self._stopping is not None:  # displaced a moment ago: let it close its connection
            await asyncio.wait({self._stopping})
            self._stopping = None
        if not self.probing and not self._closed:  # a reload may have removed it meanwhile
            token = TARGET.set(self.name)  # the probe task copies the context it starts in
            try:
                self.probe.probed.clear()
                self._probing = asyncio.create_task(
                    self._probe_while_asked(), name=f"health probe {self.name}"
                )
            finally:
                TARGET.reset(token)
        if self.probing and not self.probe.probed.is_set():  # a closed one never answers
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.probe.connect_timeout + FIRST_PROBE_MARGIN):
                    await self.probe.probed.wait()
        return self.probe

    async def _probe_while_asked(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await self.probe.run(until=lambda: loop.time() - self.asked_at > HEALTH_IDLE)
            self.slots.leave(self.name)  # before anything else runs: the place is free
            log.info("health probe stopped: no health request for %gs", HEALTH_IDLE)
        finally:
            await self.probe.close()

    def displace(self) -> None:
        """Stop the probe, whose place went to another target's (nobody asked about this
        one for a while); its connection closes as it ends."""
        if self._probing is not None and self.probing:
            self._probing.cancel()
            self._stopping, self._probing = self._probing, None
            log.info("health probe stopped: its place went to another target's",
                     extra={"target": self.name})  # fmt: skip

    async def close(self) -> None:
        """Stop the probe, let a pass in flight end, close every connection."""
        self._closed = True
        for task in (self._probing, self._stopping):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.probe.close()
        await self.state.exporter.close()


class Fleet:
    """The declared targets by name, sharing one ceiling on passes at once."""

    def __init__(self, settings: Settings, declared: Declared, definitions: Definitions) -> None:
        self.settings = settings
        self.declared = declared
        self.definitions = definitions
        self.gate = Gate(settings.max_concurrent_targets)
        self.probes = ProbeSlots(DEFAULT_MAX_PROBES, idle=YIELD_AFTER)
        self.servers = Bulkheads.for_settings(settings)  # every member's, by server (issue 29)
        self.members: dict[str, Member] = {}
        self._janitor: asyncio.Task[None] | None = None
        self._ceiling_logged = float("-inf")

    def member(self, name: str) -> Member | None:
        """The member declared as ``name``, or None."""
        return self.members.get(name)

    async def health(self, member: Member) -> HealthSnapshot | None:
        """What a routing request for ``member`` answers from: its probe's snapshot, the
        probe started if need be within the fleet's probe ceilings; None when every place
        is held by a target asked about recently (the request is answered "not probed",
        and no other target's probe is touched)."""
        now = asyncio.get_running_loop().time()
        try:
            displaced = self.probes.ask(member.name, now)
        except CeilingReached:
            self._ceiling_reached(now)
            return None
        if displaced is not None and (other := self.members.get(displaced)) is not None:
            other.displace()
        return (await member.health()).current()

    def _ceiling_reached(self, now: float) -> None:
        if now - self._ceiling_logged < CEILING_LOG_PERIOD:
            return
        self._ceiling_logged = now
        log.warning(
            "health probe ceiling reached: %d targets are probed, each asked about within "
            '%gs; health requests for other targets are answered 503 "not probed"',
            self.probes.limit,
            self.probes.idle,
            extra={"refused": self.probes.refused},
        )

    def start(self) -> None:
        """Create every declared member (none connects until it is asked about), and
        start the janitor that gives idle targets' connections back."""
        for target in self.declared.targets:
            self._add(target)
        self._janitor = asyncio.create_task(self._release_idle(), name="fleet janitor")

    def _add(self, target: DeclaredTarget) -> None:
        self.members[target.name] = self._member(target)

    def _member(self, target: DeclaredTarget) -> Member:
        settings = target.settings
        state = State(
            settings=settings,
            exporter=Exporter(settings, self.definitions, gate=self.gate, servers=self.servers),
            admission=Admission(),
            selfmetrics=SelfMetrics(settings.effective_namespace(), settings.const_labels),
        )
        probe = HealthProbe(
            settings.target.conninfo,
            settings.connect_timeout,
            pgbouncer=settings.is_pgbouncer,
            connecting=self.probes.connecting,
        )
        return Member(target, state, probe, self.probes)

    async def _release_idle(self) -> None:
        """Every JANITOR_PERIOD, close the connections of targets no pass has collected
        for CONNECTIONS_IDLE seconds (a pass in flight is never touched)."""
        while True:
            await asyncio.sleep(JANITOR_PERIOD)
            now = time.time()
            for member in list(self.members.values()):
                exporter = member.state.exporter
                # Never collected counts from the member's start: --fail-fast connects
                # every target at start, even those no scrape ever comes for.
                last = exporter.stats.last_scrape_time or exporter.stats.started_at
                if now - last <= CONNECTIONS_IDLE:
                    continue
                try:
                    released = await exporter.release()
                except Exception:  # one target's trouble must not stop the janitor
                    log.exception("closing an idle target's connections failed",
                                  extra={"target": member.name})  # fmt: skip
                    continue
                if released:
                    log.info(
                        "closed the connections of a target not collected for %gs",
                        CONNECTIONS_IDLE,
                        extra={"target": member.name},
                    )

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
        added = await self._build(t for n, t in wanted.items() if self._changed(n, t))
        for member in gone:
            del self.members[member.name]
            if member.name not in wanted:
                self.probes.leave(member.name)
        self.members.update((member.name, member) for member in added)
        self.declared = declared
        for start in range(0, len(gone), APPLY_CHUNK):  # the event loop runs in between
            await asyncio.gather(*(member.close() for member in gone[start : start + APPLY_CHUNK]))
        changed = sum(1 for m in gone if m.name in wanted)
        removed, new = len(gone) - changed, len(added) - changed
        return f"targets: {new} added, {changed} changed, {removed} removed, {len(wanted)} in all"

    def _changed(self, name: str, target: DeclaredTarget) -> bool:
        member = self.members.get(name)
        return member is None or member.declared != target

    async def _build(self, targets: Iterable[DeclaredTarget]) -> list[Member]:
        """New members, built a chunk at a time (a thousand take about a second), then
        swapped in at once by :meth:`apply`: the running ones serve meanwhile (issue 25)."""
        built: list[Member] = []
        for count, target in enumerate(targets, 1):
            built.append(self._member(target))
            if count % APPLY_CHUNK == 0:
                await asyncio.sleep(0)
        return built

    async def close(self) -> None:
        """Close every member (shutdown)."""
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        members, self.members = list(self.members.values()), {}
        await asyncio.gather(*(member.close() for member in members))
