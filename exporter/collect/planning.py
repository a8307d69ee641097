"""Planning: which collector branches run against one server, and why the others do not.

Pure functions over :class:`Definitions` and the facts gathered from a server;
the caller gathers the facts on every pass and plans again whenever any changed
(:meth:`exporter.collect.server.Server.prepare`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from exporter.config.definitions import Collector, Definitions
from exporter.pg.guards import TEMP_FILE_CAP_KB
from exporter.pg.guards import names as guard_names
from exporter.pg.preflight import ServerFacts
from exporter.pg.searchpath import quote_ident

PRIMARY_TAGS = frozenset({"primary", "master", "leader"})
REPLICA_TAGS = frozenset({"standby", "replica", "slave"})


@dataclass(frozen=True, slots=True)
class Skipped:
    """A branch that is not planned, with the reason in one sentence."""

    collector: Collector
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The branches to run against one server, in run order, and the ones left out."""

    facts: ServerFacts
    planned: tuple[Collector, ...]  # in (priority, key) order
    skipped: tuple[Skipped, ...]
    # Planned branches that may reach a schema others than superusers and us may write:
    # each runs in a read-only transaction of its own, rolled back (issue 36).
    fenced: frozenset[str] = frozenset()


def make_plan(definitions: Definitions, facts: ServerFacts, exporter_tags: Sequence[str]) -> Plan:
    """Check every branch against the server facts and the exporter's ``--tag`` list."""
    tags = frozenset(exporter_tags)
    planned: list[Collector] = []
    skipped: list[Skipped] = []
    reach = untrusted_reach(facts)
    fenced: set[str] = set()
    for collector in sorted(definitions.collectors, key=lambda c: (c.priority, c.key)):
        named: Collector | str | None = skip_reason(collector, facts, tags)
        if named is None:
            named = with_schemas(collector, facts)
        if isinstance(named, str):
            skipped.append(Skipped(collector, named))
            continue
        planned.append(named)
        if reach.search(_texts(collector)):
            fenced.add(collector.key)  # the text as written, before @extschema@ is named
    return Plan(facts, tuple(planned), tuple(skipped), frozenset(fenced))


_EXTSCHEMA = re.compile(r"@extschema:([A-Za-z0-9_]+)@")


def with_schemas(collector: Collector, facts: ServerFacts) -> Collector | str:
    """The collector with each ``@extschema:NAME@`` in its SQL replaced by the quoted
    schema extension NAME is installed in (as PostgreSQL's own extension scripts write
    it), or why it cannot run: the extension is not installed. Our library names an
    extension's objects so, wherever it is installed and whoever may write there."""
    texts = _each_text(collector)
    wanted = {name for text in texts for name in _EXTSCHEMA.findall(text)}
    if not wanted:
        return collector
    schemas = {name: facts.search_path.schema_of(name) for name in wanted}
    missing = sorted(name for name, schema in schemas.items() if schema is None)
    if missing:
        return f"needs extension {', '.join(missing)} (its SQL names @extschema:{missing[0]}@)"

    def name(text: str) -> str:
        return _EXTSCHEMA.sub(lambda m: quote_ident(str(schemas[m.group(1)])), text)

    predicates = tuple(replace(p, sql=name(p.sql)) for p in collector.predicates)
    top = collector.top
    if top is not None and top.probe is not None:
        top = replace(top, probe=name(top.probe))
    return replace(collector, query=name(collector.query), predicates=predicates, top=top)


def _each_text(collector: Collector) -> tuple[str, ...]:
    """Every SQL text the collector runs: its query, its predicates, its ``top`` probe."""
    probe = collector.top.probe if collector.top is not None else None
    return (collector.query, *(p.sql for p in collector.predicates), *((probe,) if probe else ()))


def _texts(collector: Collector) -> str:
    return "\n".join(_each_text(collector))


def untrusted_reach(facts: ServerFacts) -> re.Pattern[str]:
    """What in a collector's SQL names a schema that roles other than superusers and ours
    may write (``app.jobs``, ``"App".jobs``, in a string too), or spells a name in Unicode
    escapes, which a plain reading cannot see through. Schema names start ``pg_`` only
    for the system's: no role may create one.

    Such a collector may run code a tenant wrote (a view's functions, a row-security
    policy), so it runs in a transaction of its own, rolled back: whatever that code sets
    for the session is undone by the server (issue 36). Names on our search_path resolve
    only in trusted schemas (``searchpath``), so the others need no fence. A word read
    as a schema where it is an alias (``s.relname`` in a database with a schema ``s``)
    costs only the fence's two statements."""
    trusted = facts.search_path.trusted
    untrusted = sorted(s for s in facts.schemas if s not in trusted and not s.startswith("pg_"))
    if not untrusted and not facts.search_path.left_out:
        return _ESCAPES
    names = [*untrusted, *(schema for schema, _ in facts.search_path.left_out)]
    plain = [re.escape(n) for n in names if _PLAIN_NAME.fullmatch(n)]
    quoted = [re.escape('"' + n.replace('"', '""') + '"') for n in names]
    parts = [*(rf'(?<![\w$"])(?i:{p})' for p in plain), *quoted]
    return re.compile(rf"(?:{'|'.join(parts)})\s*\.|{_ESCAPES.pattern}")


_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_$]*")  # what an unquoted name folds to
_ESCAPES = re.compile(r"(?i:\bu&)")  # U&"..." names


def skip_reason(collector: Collector, facts: ServerFacts, tags: frozenset[str]) -> str | None:
    """Why the branch must not run on this server, or None when it should run."""
    for check in (_check_skip, _check_kind, _check_version):
        reason = check(collector, facts)
        if reason is not None:
            return reason
    for tag in collector.tags:
        reason = _check_tag(tag, facts, tags)
        if reason is not None:
            return reason
    return REPEATS_MAIN if repeats_main(collector, facts) else None


#: Why a branch without a ``datname`` label does not run on a discovered database.
REPEATS_MAIN = (
    "its series carry no datname label, so here they would repeat those the main database "
    "serves (a page with a series twice is refused): it runs on the main database only; to "
    "collect every database, add a datname LABEL column (current_database() AS datname)"
)

# Tags whose answer differs from one database of a cluster to another; every other
# condition (kind, version, recovery, user, the exporter's tags) is the same for all.
_PER_DATABASE_TAGS = frozenset({"dbname", "extension", "schema"})


def repeats_main(collector: Collector, facts: ServerFacts) -> bool:
    """Whether the branch, planned on this discovered database, would serve the very series
    the main database serves (issue 36, finding 6): its series carry no ``datname`` label
    and nothing in its tags depends on the database, so wherever it runs here it runs on
    the main database too. Go 1.4.1 runs it on both and its page is refused; a branch that
    may run on some databases only (``dbname:``, ``extension:``, ``schema:``) is checked
    when its series are rendered instead."""
    if facts.is_main or facts.pgbouncer:
        return False
    if any(column.output_name == "datname" for column in collector.label_columns):
        return False
    return not any(_per_database(tag) for tag in collector.tags)


def _per_database(tag: str) -> bool:
    kind, colon, _ = tag.partition(":")
    return bool(colon) and kind in _PER_DATABASE_TAGS


def _check_skip(collector: Collector, facts: ServerFacts) -> str | None:
    return "skip is set" if collector.skip else None


def _check_kind(collector: Collector, facts: ServerFacts) -> str | None:
    """pgBouncer branches (tagged ``pgbouncer``) run only on pgBouncer, the others never."""
    tagged = "pgbouncer" in collector.tags
    if facts.pgbouncer and not tagged:
        return "not tagged pgbouncer (the target is pgBouncer)"
    if tagged and not facts.pgbouncer:
        return "tagged pgbouncer (the target is PostgreSQL)"
    return None


def _check_version(collector: Collector, facts: ServerFacts) -> str | None:
    """min_version is inclusive, max_version exclusive, 0 leaves a side open."""
    low, high, version = collector.min_version, collector.max_version, facts.version
    if low and version < low:
        return f"needs {facts.product} >= {low} (server is {version})"
    if high and version >= high:
        return f"needs {facts.product} < {high} (server is {version})"
    return None


def _check_tag(tag: str, facts: ServerFacts, exporter_tags: frozenset[str]) -> str | None:
    """One planning tag; an unknown word must be among the exporter's own tags."""
    if tag in _WORD_CHECKS:
        return _WORD_CHECKS[tag](facts)
    kind, colon, argument = tag.partition(":")
    if colon and kind in _ARGUMENT_CHECKS:
        return _ARGUMENT_CHECKS[kind](argument, facts, exporter_tags)
    if tag in exporter_tags:
        return None
    return f"needs exporter tag {tag!r} (--tag / PG_EXPORTER_TAG)"


def _needs_main(facts: ServerFacts) -> str | None:
    return None if facts.is_main else "cluster-level, runs only on the main database"


def _needs_primary(facts: ServerFacts) -> str | None:
    return "needs a primary (server is in recovery)" if facts.in_recovery else None


def _needs_replica(facts: ServerFacts) -> str | None:
    return None if facts.in_recovery else "needs a replica (server is not in recovery)"


def _decided_by_kind(facts: ServerFacts) -> str | None:
    return None  # the pgbouncer tag is checked by _check_kind before any tag


_WORD_CHECKS: dict[str, Callable[[ServerFacts], str | None]] = {
    "pgbouncer": _decided_by_kind,
    "cluster": _needs_main,
    **dict.fromkeys(PRIMARY_TAGS, _needs_primary),
    **dict.fromkeys(REPLICA_TAGS, _needs_replica),
}


def _needs_extension(name: str, facts: ServerFacts, _: frozenset[str]) -> str | None:
    if name in facts.extensions:
        return None
    return f"needs extension {name} (not installed in {facts.datname})"


def _needs_schema(name: str, facts: ServerFacts, _: frozenset[str]) -> str | None:
    return None if name in facts.schemas else f"needs schema {name} (absent in {facts.datname})"


def _needs_dbname(name: str, facts: ServerFacts, _: frozenset[str]) -> str | None:
    return None if facts.datname == name else f"needs database {name} (this is {facts.datname})"


def _needs_username(name: str, facts: ServerFacts, _: frozenset[str]) -> str | None:
    if facts.username == name:
        return None
    return f"needs user {name} (connected as {facts.username})"


def _needs_not(name: str, facts: ServerFacts, exporter_tags: frozenset[str]) -> str | None:
    return f"excluded by exporter tag {name!r}" if name in exporter_tags else None


_ARGUMENT_CHECKS: dict[str, Callable[[str, ServerFacts, frozenset[str]], str | None]] = {
    "extension": _needs_extension,
    "schema": _needs_schema,
    "dbname": _needs_dbname,
    "username": _needs_username,
    "not": _needs_not,
}


def explain_text(plan: Plan) -> str:
    """Readable text for ``/explain`` and ``--explain``: the plan and every skip reason."""
    lines = [_header(plan.facts), ""]
    lines.append(f"planned ({len(plan.planned)}, in run order):")
    for collector in plan.planned:
        lines.extend(_describe(collector, fenced=collector.key in plan.fenced))
    lines.extend(_shared_names(plan.planned))
    lines.append("")
    lines.append(f"skipped ({len(plan.skipped)}):")
    for skipped in plan.skipped:
        collector = skipped.collector
        lines.append(f"  {collector.key} (name {collector.name}): {skipped.reason}")
    return "\n".join(lines) + "\n"


def _header(facts: ServerFacts) -> str:
    recovery = "in recovery" if facts.in_recovery else "not in recovery"
    scope = "main database" if facts.is_main else "discovered database"
    return (
        f"server: datname={facts.datname} {facts.product} version={facts.version} "
        f"{recovery}, {scope}, user={facts.username}\n{_limits_line(facts)}"
    )


def _limits_line(facts: ServerFacts) -> str:
    """How the collectors' limits are put in force on this server (D1, issue 22), and what
    every statement of ours runs under (issues 29, 31)."""
    if facts.pgbouncer:
        return "limits: none sent (pgBouncer's console has no settings, D4)"
    if facts.own_transaction:
        how = (
            "limits: every guard and limit local to a read-only transaction per collector, "
            f"rolled back, because {facts.own_transaction}"
        )
    else:
        how = (
            "limits: the guards given at login (direct connection); a collector's own limits "
            "as session settings, sent when the next collector's differ"
        )
    return "\n".join((how, facts.search_path.describe(), guards_line(facts), reported_line(facts)))


def reported_line(facts: ServerFacts) -> str:
    """Each guard as the server reported it at the last preflight, not as we sent it."""
    pairs = zip(guard_names(facts.version), facts.reported, strict=False)
    shown = ", ".join(f"{name}={value}" for name, value in pairs)
    return f"guards as the server reports them: {shown or 'not read'}"


def guards_line(facts: ServerFacts) -> str:
    """The resource bounds of our statements, and how to get the one we may not set."""
    guards = facts.guards
    text = f"resources: jit off, no parallel workers, work_mem {guards.work_mem_kb}kB, "
    if guards.temp_file_limit_kb is not None:
        return text + f"temp_file_limit {guards.temp_file_limit_kb}kB"
    return text + (
        "temp_file_limit the server's (only a superuser may set it; to bound it: "
        f"ALTER ROLE {facts.username} SET temp_file_limit = '{TEMP_FILE_CAP_KB}kB', "
        f"or from PostgreSQL 15 GRANT SET ON PARAMETER temp_file_limit TO {facts.username})"
    )


def _describe(collector: Collector, *, fenced: bool = False) -> list[str]:
    """One planned branch: its settings on one line, then its SQL indented."""
    timeout = "unbounded" if collector.timeout is None else f"{collector.timeout:g}s"
    tags = ", ".join(collector.tags) or "-"
    head = (
        f"  {collector.key} (name {collector.name}): priority {collector.priority}, "
        f"ttl {collector.ttl:g}s, timeout {timeout}, fatal {str(collector.fatal).lower()}, "
        f"tags [{tags}]"
    )
    sql = [f"      {line}".rstrip() for line in collector.query.strip().splitlines()]
    if (top := collector.top) is not None:
        labels = [c.name for c in collector.label_columns if c.name not in top.keep]
        kept = f" per {', '.join(top.keep)}" if top.keep else ""
        head += (
            f"; names at most {top.limit} {'/'.join(labels)} by the rate of {top.by}, "
            f"the rest summed as {top.other}{kept} (top)"
        )
        if top.probe is not None:
            head += f"; a probe lists every key first, the query reads the named ones by {top.id}"
            probe = [f"      {line}".rstrip() for line in top.probe.strip().splitlines()]
            sql += ["    probe:", *probe]
    if fenced:
        head += (
            "; it names a schema others may write: it runs in a read-only transaction of "
            "its own, rolled back"
        )
    return [head, *sql]


def _shared_names(planned: Sequence[Collector]) -> list[str]:
    """A note for each metric prefix that several planned branches produce."""
    keys_by_name: defaultdict[str, list[str]] = defaultdict(list)
    for collector in planned:
        keys_by_name[collector.name].append(collector.key)
    return [
        f"  note: branches {', '.join(keys)} all produce metrics named {name}_*"
        for name, keys in keys_by_name.items()
        if len(keys) > 1
    ]
