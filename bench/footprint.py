"""What one role's sessions cost the server besides time (issue 31): JIT, temporary
blocks, parallel workers and backend memory, for ``bench.bigdb``.

- ``pg_stat_statements`` of the role (read with ``showtext`` false, so the giant texts
  are not read): calls, execution time, JIT time and functions (PostgreSQL 15+),
  temporary blocks, and on PostgreSQL 18 ``parallel_workers_launched``.
- Parallel workers on every version from the server log: the postmaster logs at DEBUG1
  each worker it starts, named ``parallel worker for PID <leader>``; the leaders that are
  the role's backends are those whose log lines carry ``<role>@`` (``log_connections``
  writes one for every backend).
- Backend memory from ``pg_log_backend_memory_contexts`` of each of the role's backends
  (as ``bench.plan_memory`` does): the ``Grand total`` line, and the plan cache's
  contexts (``CachedPlan*``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from bench.plan_memory import contexts
from rigs.localpg import LocalCluster

_WORKER = re.compile(r'starting background worker process "parallel worker for PID (\d+)"')
_GRAND_TOTAL = re.compile(r"\[(\d+)\].*Grand total: (\d+) bytes")
_JIT_TIMES = ("jit_generation_time", "jit_inlining_time", "jit_optimization_time",
              "jit_emission_time")  # fmt: skip


@dataclass(frozen=True, slots=True)
class RoleFigures:
    """Sums over the role's pg_stat_statements entries since its last reset."""

    calls: float
    exec_ms: float
    jit_ms: float
    jit_functions: float
    temp_read: float
    temp_written: float
    workers_launched: float | None  # PostgreSQL 18+; None before


@dataclass(frozen=True, slots=True)
class BackendMemory:
    """One backend's memory contexts, as it logged them."""

    pid: int
    datname: str
    total_bytes: int
    plan_bytes: int


class LogCursor:
    """Reads a server log from marks, so that each window sees only its own lines."""

    def __init__(self, cluster: LocalCluster) -> None:
        self._path = cluster.log_path

    def mark(self) -> int:
        """The log's length now."""
        try:
            return self._path.stat().st_size
        except FileNotFoundError:
            return 0

    def since(self, mark: int) -> str:
        """What the server logged after ``mark``."""
        with self._path.open("rb") as log:
            log.seek(mark)
            return log.read().decode("utf-8", errors="replace")


def reset(cluster: LocalCluster, role: str) -> None:
    """Forget the role's pg_stat_statements entries."""
    cluster.psql(f"SELECT pg_stat_statements_reset('{role}'::regrole)")


def role_figures(cluster: LocalCluster, role: str) -> RoleFigures:
    """The role's sums since its last reset."""
    jit = " + ".join((*_JIT_TIMES, "jit_deform_time") if cluster.version >= 170000 else _JIT_TIMES)
    workers = "sum(parallel_workers_launched)" if cluster.version >= 180000 else "NULL"
    text = cluster.psql(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0),"
        f" coalesce(sum({jit}), 0), coalesce(sum(jit_functions), 0),"
        " coalesce(sum(temp_blks_read), 0), coalesce(sum(temp_blks_written), 0),"
        f" coalesce({workers}, -1)"
        f" FROM pg_stat_statements(false) WHERE userid = '{role}'::regrole"
    )
    calls, ms, jit_ms, functions, read, written, launched = map(float, text.split("|"))
    return RoleFigures(calls, ms, jit_ms, functions, read, written,
                       None if launched < 0 else launched)  # fmt: skip


def role_pids(log: str, role: str) -> set[int]:
    """Pids of the backends whose log lines are the role's (``[pid] … role@database``)."""
    own = re.compile(rf"\[(\d+)\] \S+ {re.escape(role)}@")
    return {int(found[1]) for found in map(own.search, log.splitlines()) if found}


def parallel_workers(log: str, leaders: Iterable[int]) -> int:
    """Parallel workers the postmaster started for any of ``leaders``."""
    wanted = set(leaders)
    return sum(1 for found in _WORKER.finditer(log) if int(found[1]) in wanted)


def grand_totals(log: str) -> dict[int, int]:
    """Bytes per backend from the ``Grand total`` lines of logged memory contexts."""
    return {int(found[1]): int(found[2]) for found in map(_GRAND_TOTAL.search, log.splitlines())
            if found}  # fmt: skip


def backend_memory(cluster: LocalCluster, role: str, log: LogCursor) -> list[BackendMemory]:
    """Ask each client backend of the role to log its memory contexts; read them back."""
    rows = cluster.psql(
        "SELECT pid, datname FROM pg_stat_activity"
        f" WHERE usename = '{role}' AND backend_type = 'client backend'"
    )
    backends = dict(line.split("|", 1) for line in rows.splitlines() if line)
    mark = log.mark()
    asked = {int(pid) for pid in backends
             if cluster.psql(f"SELECT pg_log_backend_memory_contexts({pid})") == "t"}  # fmt: skip
    deadline = time.monotonic() + 15
    while not asked <= grand_totals(log.since(mark)).keys():
        if time.monotonic() > deadline:
            break  # a backend that exited meanwhile never answers: count those that did
        time.sleep(0.1)  # polling the log for the dumps' last lines, under a deadline
    text = log.since(mark)
    totals, named = grand_totals(text), contexts(text)
    return [
        BackendMemory(pid, backends[str(pid)], totals[pid],
                      sum(size for name, size in named.get(pid, {}).items()
                          if name.startswith("CachedPlan")))
        for pid in sorted(asked & totals.keys())
    ]  # fmt: skip
