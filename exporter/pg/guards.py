"""What every session of ours runs under, written once as data (issue 36).

One table, :data:`GUARDS`, says for each setting we pin: its value (fixed, or read off
the server by the preflight), from which major it exists, whether a database's or
role's owner could set it for us otherwise, and why we pin it. Everything else is
derived from it: the libpq ``options`` a connection proven direct logs in with
(:func:`login_options`), the transaction-local ``set_config`` calls that stand for them
in a read-only transaction of our own through a pooler (``limits``), the preflight's
reading of what the server reports now (:func:`reading_sql`), ``/explain``, the table in
docs/database-safety.md and the tests.

:data:`NOT_PINNED` names every other setting an owner may set (``ALTER DATABASE`` or
``ALTER ROLE … SET``, context ``user``; a superuser owner also ``superuser``), alone or
by prefix, with why we leave it as the server has it; a test holds the two tables to
``pg_settings`` of every major we support, so a setting a new major adds is accounted
for before it ships.

Pure data and functions, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: Memory a sort or hash of ours may take before spilling (kB): PostgreSQL's own default,
#: pinned at login (issue 36), whatever the server, database or role set.
WORK_MEM_CAP_KB = 4096
#: Temporary disk one statement of ours may fill, at most (kB), where our role may set
#: ``temp_file_limit`` (a superuser, or granted SET on it from PostgreSQL 15).
TEMP_FILE_CAP_KB = 64 * 1024
#: Our statements before a collector's own limits (the preflight, the health probe's
#: statement): at most this long on the server (ms), however long a client waits.
LOGIN_STATEMENT_TIMEOUT_MS = 5000
#: A lock wait of ours, at most (ms): a small part of any statement limit (D3).
LOCK_TIMEOUT_MS = 1000
#: How a transaction of our own starts, whatever defaults an owner set: JIT goes off by a
#: SET that nothing plans before any statement that could be planned (issue 36).
BEGIN_GUARDED = "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY NOT DEFERRABLE; SET LOCAL jit = off"
#: The search_path at login: nothing a tenant writes (issue 36); the schemas of trusted
#: extensions are added per database (``searchpath``).
LOGIN_SEARCH_PATH = '"pg_catalog", "pg_temp"'


@dataclass(frozen=True, slots=True)
class Shape:
    """What a guard's value may depend on, as the preflight read it."""

    version: int  # server_version_num
    work_mem_kb: int = WORK_MEM_CAP_KB  # our cap, or the server's lower value
    temp_file_limit_kb: int | None = None  # None: our role may not set it


Value = Callable[[Shape], "str | None"]


def _fixed(text: str) -> Value:
    return lambda _shape: text


@dataclass(frozen=True, slots=True)
class Guard:
    """One setting our sessions pin."""

    name: str
    value: Value  # None for a server where it is not ours to set
    why: str
    since: int = 0  # first server_version_num that has it
    until: int = 0  # first that no longer has it (0: every later one)
    owner_sets: bool = True  # context user: a database's or role's owner may set it

    def applies(self, version: int) -> bool:
        """Whether the setting exists on a server of ``version``."""
        return version >= self.since and (not self.until or version < self.until)


def _kb(amount: int | None) -> str | None:
    return None if amount is None else f"{amount}kB"


_COST = "an owner's value would change what our statements cost the server"
# fmt: off
GUARDS: tuple[Guard, ...] = (
    Guard("default_transaction_read_only", _fixed("on"), "our statements never write (D2)"),
    Guard("default_transaction_isolation", _fixed("read committed"),
          "serializable would wait for a safe snapshot, repeatable read hold one longer"),
    Guard("default_transaction_deferrable", _fixed("off"),
          "a deferrable serializable transaction waits for a safe snapshot"),
    Guard("statement_timeout", _fixed(str(LOGIN_STATEMENT_TIMEOUT_MS)),
          "bounds our statements before a collector's own limit (D1)"),
    Guard("lock_timeout", _fixed(str(LOCK_TIMEOUT_MS)),
          "we give up on a lock rather than queue behind it (D3)"),
    Guard("idle_in_transaction_session_timeout", _fixed(str(2 * LOGIN_STATEMENT_TIMEOUT_MS)),
          "a transaction of ours left open ends the session (D1)"),
    Guard("idle_session_timeout", _fixed("0"), since=140000,
          why="an owner's value would close our idle connection between scrapes"),
    Guard("transaction_timeout", _fixed(str(2 * LOGIN_STATEMENT_TIMEOUT_MS + 1000)),
          since=170000, why="a backstop after the statement limit (D1)"),
    Guard("jit", _fixed("off"), "compiling our short catalog queries costs more than it saves"),
    Guard("max_parallel_workers_per_gather", _fixed("0"), "no parallel workers for us"),
    Guard("debug_parallel_query", _fixed("off"), since=160000,
          why="forces a parallel worker even where the plan needs none"),
    Guard("force_parallel_mode", _fixed("off"), until=160000,
          why="forces a parallel worker even where the plan needs none"),
    Guard("work_mem", lambda s: f"{s.work_mem_kb}kB", "bounds each sort or hash of ours"),
    Guard("hash_mem_multiplier", _fixed("1"), "bounds each hash of ours to work_mem"),
    Guard("temp_file_limit", lambda s: _kb(s.temp_file_limit_kb), owner_sets=False,
          why="bounds the temporary disk one statement of ours may fill, where our role "
          "may set it"),
    Guard("plan_cache_mode", _fixed("auto"), _COST),
    Guard("stats_fetch_consistency", _fixed("cache"), since=150000,
          why="snapshot copies every statistic of the database for each statement"),
    Guard("client_min_messages", _fixed("notice"),
          "debug levels would send us a message per planner step"),
    Guard("search_path", _fixed(LOGIN_SEARCH_PATH),
          "no object an owner creates takes part in resolving our names"),
    Guard("DateStyle", _fixed("ISO, MDY"),
          "dates as the Go exporter's driver asks for them at login (issue 30)"),
    Guard("extra_float_digits", _fixed("2"),
          "floats as the Go exporter's driver asks for them at login (issue 30)"),
)
# fmt: on

# The planner's switches: an owner's "off" makes every plan of that kind cost 10^10 more
# and pushes ours to the slowest one; pinned to PostgreSQL's defaults (majors: since).
_ENABLE = {
    "bitmapscan": 0, "gathermerge": 0, "hashagg": 0, "hashjoin": 0, "incremental_sort": 0,
    "indexonlyscan": 0, "indexscan": 0, "material": 0, "mergejoin": 0, "nestloop": 0,
    "parallel_append": 0, "parallel_hash": 0, "partition_pruning": 0, "seqscan": 0,
    "sort": 0, "tidscan": 0, "async_append": 140000, "memoize": 140000,
    "presorted_aggregate": 160000, "group_by_reordering": 170000,
    "distinct_reordering": 180000, "self_join_elimination": 180000,
}  # fmt: skip
_ENABLE_OFF = ("partitionwise_aggregate", "partitionwise_join")  # off by default
GUARDS += tuple(
    Guard(f"enable_{name}", _fixed("on"), _COST, since=since) for name, since in _ENABLE.items()
) + tuple(Guard(f"enable_{name}", _fixed("off"), _COST) for name in _ENABLE_OFF)


#: Settings an owner may set that we leave as the server has them, by exact name or by
#: prefix (ending in ``_`` or ``.``), with why.
NOT_PINNED: dict[str, str] = {
    # Costs the planner weighs plans by: they choose among plans, they bound nothing.
    **dict.fromkeys(
        (
            "random_page_cost",
            "seq_page_cost",
            "cpu_",
            "effective_cache_size",
            "parallel_",
            "min_parallel_",
            "from_collapse_limit",
            "join_collapse_limit",
            "geqo",
            "geqo_",
            "cursor_tuple_fraction",
            "constraint_exclusion",
            "recursive_worktable_factor",
            "jit_",
            "effective_io_concurrency",
            "io_combine_limit",
            "max_parallel_workers",
            "synchronize_seqscans",
            "default_statistics_target",
            "max_stack_depth",
        ),
        "weighs one plan against another or sizes I/O; the plans of our catalog queries "
        "were measured under the server's own values, and the statement, lock and memory "
        "limits bound whatever plan is chosen (a DBA's tuning for the storage stays)",
    ),
    # Text of values, read as the Go exporter reads it.
    **dict.fromkeys(
        (
            "IntervalStyle",
            "TimeZone",
            "timezone_abbreviations",
            "lc_",
            "bytea_output",
            "xmlbinary",
            "xmloption",
            "standard_conforming_strings",
            "backslash_quote",
            "escape_string_warning",
            "array_nulls",
            "transform_null_equals",
            "quote_all_identifiers",
            "operator_precedence_warning",
            "client_encoding",
            "default_text_search_config",
            "icu_validation_level",
        ),
        "how text is read or written; the Go exporter's driver leaves them as the server "
        "has them, so labels read the same from both",
    ),
    # Writing, maintenance and what only a writer or a superuser's tools use.
    **dict.fromkeys(
        (
            "vacuum_",
            "maintenance_",
            "gin_",
            "default_toast_compression",
            "default_tablespace",
            "temp_tablespaces",
            "default_table_access_method",
            "temp_buffers",
            "synchronous_commit",
            "commit_",
            "session_replication_role",
            "check_function_bodies",
            "createrole_self_grant",
            "password_encryption",
            "scram_iterations",
            "lo_compat_privileges",
            "logical_decoding_work_mem",
            "max_parallel_maintenance_workers",
            "wal_",
            "backend_flush_after",
            "vacuum_buffer_usage_limit",
            "file_copy_method",
            "default_transaction_",
            "transaction_",
            "row_security",
            "event_triggers",
            "restrict_nonsystem_relation_kind",
            "allow_",
            "zero_damaged_pages",
            "ignore_checksum_failure",
            "exit_on_error",
            "md5_password_warnings",
        ),
        "applies to writes, maintenance, DDL or other sessions' work, none of which a "
        "read-only statement of ours does; where it can refuse our statement it fails it "
        "with an error we report, it never makes it costlier",
    ),
    # What the server logs, tracks and reports: the DBA's, not a cost of ours.
    **dict.fromkeys(
        (
            "log_",
            "track_",
            "debug_",
            "trace_",
            "compute_query_id",
            "pg_stat_statements.",
            "update_process_title",
            "backtrace_functions",
            "application_name",
            "deadlock_timeout",
            "stats_temp_directory",
        ),
        "what the server logs or counts about sessions, ours included; the DBA's choice",
    ),
    # The connection: keep-alives, and libraries loaded at login (before any statement).
    **dict.fromkeys(
        (
            "tcp_",
            "client_connection_check_interval",
            "local_preload_libraries",
            "session_preload_libraries",
            "dynamic_library_path",
            "extension_",
            "output_plugin_",
        ),
        "acts on the connection or at login, before a guard could: only a superuser "
        "installs what can be loaded, and a keep-alive costs nothing",
    ),
}


def accounted(name: str, version: int) -> bool:
    """Whether setting ``name`` is pinned on a server of ``version`` or named as not."""
    if any(g.name == name and g.applies(version) for g in GUARDS):
        return True
    return any(
        name == key or (key.endswith(("_", ".")) and name.startswith(key)) for key in NOT_PINNED
    )


def settings(shape: Shape) -> tuple[tuple[str, str], ...]:
    """(name, value) of every guard in force on a server of ``shape``."""
    pairs = ((g.name, g.value(shape)) for g in GUARDS if g.applies(shape.version))
    return tuple((name, value) for name, value in pairs if value is not None)


_OPTION_ESCAPE = re.compile(r"([\\ ])")


def login_options(shape: Shape) -> str:
    """libpq's ``options`` that put every guard in force at login."""
    return _options(settings(shape))


def _options(pairs: Iterable[tuple[str, str]]) -> str:
    """``-c name=value`` each, blanks and backslashes escaped as libpq wants them."""
    return " ".join(f"-c {name}={_escape(value)}" for name, value in pairs)


def _escape(value: str) -> str:
    return _OPTION_ESCAPE.sub(r"\\\1", value)


#: The oldest major we support: the guards every one of them has go in at a first login,
#: before the server's version is known (a name the server lacks would refuse it).
OLDEST = 130000


def first_login_options() -> str:
    """The guards every supported major has, with our own caps: what a first login to a
    server carries (the rest come with the next login, once its version is known)."""
    every = (g for g in GUARDS if g.since <= OLDEST and not g.until)
    pairs = ((g.name, g.value(Shape(OLDEST))) for g in every)
    return _options((name, value) for name, value in pairs if value is not None)


def names(version: int) -> tuple[str, ...]:
    """The guards' names on a server of ``version``, in the table's order."""
    return tuple(g.name for g in GUARDS if g.applies(version))


def reading_sql(version: int) -> str:
    """An array of what the server reports now for each guard of ``version``, in
    :func:`names` order (``current_setting`` of each, qualified)."""
    calls = ", ".join(f"pg_catalog.current_setting('{name}')" for name in names(version))
    return f"ARRAY[{calls}]::pg_catalog.text[]"


#: Guards each collector sets anew for itself (``limits``): read, not compared.
PER_COLLECTOR = frozenset(
    ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
     "transaction_timeout", "search_path")
)  # fmt: skip


def differences(
    shape: Shape, reported: object, login: frozenset[str]
) -> tuple[tuple[str, str, str], ...]:
    """(name, wanted, reported) for each guard the login set (``login``: their names)
    that the server reports otherwise, those a collector sets for itself aside (units and
    case as ``current_setting`` prints them are normalised)."""
    if not isinstance(reported, list):
        return ()
    wanted = dict(settings(shape))
    found = []
    for name, value in zip(names(shape.version), reported, strict=False):
        want = None if name in PER_COLLECTOR or name not in login else wanted.get(name)
        if want is not None and not same(want, str(value)):
            found.append((name, want, str(value)))
    return tuple(found)


_AMOUNT = re.compile(r"^\s*(-?\d+)\s*(kb|mb|gb|tb|ms|s|min|h|d)?\s*$", re.IGNORECASE)
_FACTORS = {"kb": 1, "mb": 1024, "gb": 1024**2, "tb": 1024**3,
            "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}  # fmt: skip


def same(wanted: str, reported: str) -> bool:
    """Whether ``reported`` (as ``current_setting`` prints it) is the value ``wanted``."""
    if wanted.lower() == reported.lower():
        return True
    amount = parse_amount(wanted)
    return amount is not None and amount == parse_amount(reported)


def parse_amount(text: str) -> int | None:
    """A memory or time setting as ``current_setting`` prints it (``4MB``, ``5s``, ``-1``)
    in its base unit (kB, ms); None when it is not one."""
    found = _AMOUNT.match(text)
    if found is None:
        return None
    return int(found.group(1)) * _FACTORS[(found.group(2) or "kb").lower()]


def markdown_table() -> str:
    """The guards as the table in docs/database-safety.md (a test holds the two equal)."""
    rows = ["| setting | value | majors | an owner may set it | why |", "|---|---|---|---|---|"]
    for g in GUARDS:
        value = g.value(Shape(180000, WORK_MEM_CAP_KB, TEMP_FILE_CAP_KB))
        majors = f"{g.since // 10000}+" if g.since else "all"
        majors = f"before {g.until // 10000}" if g.until else majors
        owner = "yes" if g.owner_sets else "superuser only"
        rows.append(f"| `{g.name}` | `{value}` | {majors} | {owner} | {g.why} |")
    return "\n".join(rows)
