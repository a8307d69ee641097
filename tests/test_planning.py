"""Planning: which branches run on a server, in which order, and the reasons for the rest."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from exporter.collect.planning import REPEATS_MAIN, Plan, explain_text, make_plan
from exporter.config.definitions import Collector, Column, Definitions, Top, Usage
from exporter.pg.preflight import ServerFacts
from exporter.pg.searchpath import SearchPath

PRIMARY = ServerFacts(
    version=180006,
    in_recovery=False,
    datname="app",
    username="monitor",
    extensions=frozenset({"pg_stat_statements"}),
    schemas=frozenset({"public", "monitor"}),
)
REPLICA = replace(PRIMARY, in_recovery=True)
BOUNCER = ServerFacts(
    version=12201, in_recovery=False, datname="pgbouncer", username="stats", pgbouncer=True
)


def branch(key: str, **fields: Any) -> Collector:
    """A valid branch with one GAUGE column and the given field overrides."""
    base = Collector(key=key, name=key, query="SELECT 1 AS v", columns=(Column("v", Usage.GAUGE),))
    return replace(base, **fields)


def plan_one(
    collector: Collector, facts: ServerFacts = PRIMARY, tags: tuple[str, ...] = ()
) -> Plan:
    """The plan of a single branch."""
    return make_plan(Definitions((collector,)), facts, tags)


def reason(
    collector: Collector, facts: ServerFacts = PRIMARY, tags: tuple[str, ...] = ()
) -> str | None:
    """Why the branch is skipped, or None when it is planned."""
    plan = plan_one(collector, facts, tags)
    assert len(plan.planned) + len(plan.skipped) == 1
    return plan.skipped[0].reason if plan.skipped else None


def test_untagged_branch_is_planned() -> None:
    """A branch without conditions runs on PostgreSQL."""
    collector = branch("b")
    assert plan_one(collector).planned == (collector,)


def test_skip_flag() -> None:
    """``skip: true`` is never planned, whatever else matches."""
    assert reason(branch("b", skip=True)) == "skip is set"


def test_skip_is_checked_before_version() -> None:
    """The reason given is the first failing check in the documented order."""
    assert reason(branch("b", skip=True, min_version=190000)) == "skip is set"


@pytest.mark.parametrize(
    ("tags", "facts", "planned"),
    [
        ((), PRIMARY, True),
        (("pgbouncer",), PRIMARY, False),
        ((), BOUNCER, False),
        (("pgbouncer",), BOUNCER, True),
    ],
)
def test_pgbouncer_mode(tags: tuple[str, ...], facts: ServerFacts, planned: bool) -> None:
    """A branch runs iff it is tagged pgbouncer exactly when the target is pgBouncer."""
    assert (reason(branch("b", tags=tags), facts) is None) == planned


def test_pgbouncer_reasons_say_which_side() -> None:
    """Both pgBouncer mismatches explain themselves."""
    assert "target is pgBouncer" in str(reason(branch("b"), BOUNCER))
    assert "target is PostgreSQL" in str(reason(branch("b", tags=("pgbouncer",))))


@pytest.mark.parametrize(
    ("min_version", "max_version", "planned"),
    [
        (0, 0, True),
        (180006, 0, True),
        (180007, 0, False),
        (0, 180007, True),
        (0, 180006, False),
        (170000, 190000, True),
        (100000, 170000, False),
    ],
)
def test_version_range(min_version: int, max_version: int, planned: bool) -> None:
    """min_version is inclusive, max_version exclusive, 0 is open (server 180006)."""
    collector = branch("b", min_version=min_version, max_version=max_version)
    assert (reason(collector) is None) == planned


def test_version_reason_names_bound_and_server() -> None:
    """The version reason says which bound failed and the server's version."""
    assert reason(branch("b", max_version=140000)) == "needs PostgreSQL < 140000 (server is 180006)"
    too_old = reason(branch("b", tags=("pgbouncer",), min_version=12400), BOUNCER)
    assert too_old == "needs pgBouncer >= 12400 (server is 12201)"


def test_cluster_tag_only_on_main_database() -> None:
    """``cluster`` branches run on the URL's database, not on discovered ones."""
    collector = branch("b", tags=("cluster",))
    assert reason(collector) is None
    assert "main database" in str(reason(collector, replace(PRIMARY, is_main=False)))


DISCOVERED = replace(PRIMARY, is_main=False)


def test_branch_without_datname_runs_only_on_the_main_database() -> None:
    """An untagged branch whose series carry no ``datname`` label is skipped on a discovered
    database, saying why: it runs on the main one too, and its series would be served twice
    (issue 36, finding 6)."""
    collector = branch("b", columns=(Column("k", Usage.LABEL), Column("v", Usage.GAUGE)))
    assert reason(collector) is None
    assert reason(collector, DISCOVERED) == REPEATS_MAIN
    assert "datname LABEL column" in REPEATS_MAIN
    tagged = replace(collector, tags=("primary", "needs_me"))
    assert reason(tagged, DISCOVERED, ("needs_me",)) == REPEATS_MAIN


def test_branch_with_datname_runs_on_every_database() -> None:
    """A ``datname`` LABEL column, named so or renamed so, tells the databases' series apart."""
    for label in (Column("datname", Usage.LABEL), Column("db", Usage.LABEL, rename="datname")):
        collector = branch("b", columns=(label, Column("v", Usage.GAUGE)))
        assert reason(collector, DISCOVERED) is None


@pytest.mark.parametrize("tag", ["dbname:app", "extension:pg_stat_statements", "schema:monitor"])
def test_branch_without_datname_may_run_where_only_some_databases_qualify(tag: str) -> None:
    """A tag that depends on the database may hold on one of them only, as in Go: such a
    branch is planned, and the rendering keeps any series it repeats out of the page."""
    assert reason(branch("b", tags=(tag,)), DISCOVERED) is None


def test_other_reasons_come_before_the_datname_one() -> None:
    """The first failing condition is the reason shown: ``cluster`` says cluster-level."""
    assert "cluster-level" in str(reason(branch("b", tags=("cluster",)), DISCOVERED))
    assert "needs a primary" in str(
        reason(branch("b", tags=("primary",)), replace(DISCOVERED, in_recovery=True))
    )


@pytest.mark.parametrize("tag", ["primary", "master", "leader"])
def test_primary_tags(tag: str) -> None:
    """Primary synonyms run only when the server is not in recovery."""
    assert reason(branch("b", tags=(tag,))) is None
    assert "needs a primary" in str(reason(branch("b", tags=(tag,)), REPLICA))


@pytest.mark.parametrize("tag", ["standby", "replica", "slave"])
def test_replica_tags(tag: str) -> None:
    """Replica synonyms run only when the server is in recovery."""
    assert reason(branch("b", tags=(tag,)), REPLICA) is None
    assert "needs a replica" in str(reason(branch("b", tags=(tag,))))


@pytest.mark.parametrize(
    ("present", "absent", "expected"),
    [
        ("extension:pg_stat_statements", "extension:citus", "needs extension citus"),
        ("schema:monitor", "schema:pgbouncer", "needs schema pgbouncer"),
        ("dbname:app", "dbname:postgres", "needs database postgres"),
        ("username:monitor", "username:postgres", "needs user postgres"),
    ],
)
def test_fact_tags(present: str, absent: str, expected: str) -> None:
    """extension:, schema:, dbname: and username: compare with the server facts."""
    assert reason(branch("b", tags=(present,))) is None
    assert expected in str(reason(branch("b", tags=(absent,))))


def test_not_tag() -> None:
    """``not:X`` runs unless the exporter is tagged X."""
    collector = branch("b", tags=("not:cloud",))
    assert reason(collector, tags=("onprem",)) is None
    assert reason(collector, tags=("cloud", "onprem")) == "excluded by exporter tag 'cloud'"


def test_plain_word_needs_exporter_tag() -> None:
    """Any other word must be among the exporter's --tag values."""
    collector = branch("b", tags=("citus",))
    assert reason(collector, tags=("citus",)) is None
    assert "needs exporter tag 'citus'" in str(reason(collector, tags=("other",)))


def test_all_tags_must_hold() -> None:
    """Tags combine with AND: one failing tag skips the branch."""
    collector = branch("b", tags=("cluster", "primary", "extension:pg_stat_statements"))
    assert reason(collector) is None
    assert "needs a primary" in str(reason(collector, REPLICA))


def test_planned_in_priority_then_key_order() -> None:
    """Planned branches run by ascending priority, ties broken by key."""
    collectors = (branch("c", priority=5), branch("b", priority=100), branch("a", priority=100))
    plan = make_plan(Definitions(collectors), PRIMARY, ())
    assert [c.key for c in plan.planned] == ["c", "a", "b"]


def test_branches_sharing_a_name_may_all_be_planned() -> None:
    """Variants with one name are all planned when they all match."""
    first = branch("pg_x_a", name="pg_x")
    second = branch("pg_x_b", name="pg_x")
    plan = make_plan(Definitions((first, second)), PRIMARY, ())
    assert plan.planned == (first, second)


def test_explain_text_shows_plan_and_reasons() -> None:
    """Explain lists server facts, each planned branch's settings and SQL, and skip reasons."""
    planned = branch(
        "pg_db_main",
        name="pg_db",
        query="SELECT datname,\n       1 AS v\nFROM pg_database",
        ttl=10.0,
        timeout=None,
        priority=3,
        tags=("cluster", "primary"),
        fatal=True,
    )
    variant = branch("pg_db_other", name="pg_db", timeout=0.1)
    skipped = branch("pg_replica_only", tags=("replica",))
    text = explain_text(make_plan(Definitions((planned, variant, skipped)), PRIMARY, ()))
    assert "datname=app" in text
    assert "version=180006" in text
    assert "not in recovery" in text
    assert (
        "pg_db_main (name pg_db): priority 3, ttl 10s, timeout unbounded, fatal true, "
        "tags [cluster, primary]"
    ) in text
    assert "      SELECT datname,\n             1 AS v\n      FROM pg_database\n" in text
    assert "pg_db_other (name pg_db): priority 100, ttl 0s, timeout 0.1s" in text
    assert "branches pg_db_main, pg_db_other all produce metrics named pg_db_*" in text
    assert "pg_replica_only (name pg_replica_only): needs a replica" in text
    assert text.index("pg_db_main") < text.index("pg_replica_only")


def test_explain_text_says_what_a_ranked_branch_names() -> None:
    """A branch with ``top`` says how many keys it names, by what, and how the rest is
    published (issue 38)."""
    columns = (Column("datname", Usage.LABEL), Column("query", Usage.LABEL),
               Column("calls", Usage.COUNTER))  # fmt: skip
    ranked = branch("q", columns=columns, top=Top("calls", 100, 200, keep=("datname",)))
    text = explain_text(plan_one(ranked))
    assert (
        "names at most 100 query by the rate of calls, the rest summed as other per datname" in text
    )


def test_explain_text_of_replica() -> None:
    """The header says when the server is in recovery."""
    text = explain_text(plan_one(branch("b"), REPLICA))
    assert text.splitlines()[0].count("in recovery") == 1
    assert "not in recovery" not in text


# A database with a tenant's schema "app", a trusted one holding an extension, and
# pg_stat_statements in "public", which the database's owner may write (issue 36).
TENANT = replace(
    PRIMARY,
    schemas=frozenset({"pg_catalog", "public", "app", "ext", "Mixed"}),
    search_path=SearchPath.of(["pg_stat_statements\tpublic", "hstore\text"], ["pg_catalog", "ext"]),
)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) AS v FROM app.jobs",
        "SELECT count(*) AS v FROM APP . jobs",
        'SELECT count(*) AS v FROM "app".jobs',
        'SELECT count(*) AS v FROM "Mixed".t',
        "SELECT count(*) AS v FROM public.pg_stat_statements",
        "SELECT query_to_xml('select app.f()', true, true, '') AS v",
        'SELECT U&"\\0061pp".f() AS v',
    ],
)
def test_a_branch_naming_a_schema_others_may_write_is_fenced(sql: str) -> None:
    """A schema-qualified name of an untrusted schema, in any case or quoting, in a string
    too, or a name in Unicode escapes: the branch runs in a rolled-back transaction of
    its own (issue 36)."""
    assert plan_one(branch("b", query=sql), TENANT).fenced == frozenset({"b"})


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT s.relname AS v FROM pg_stat_user_tables s",
        "SELECT count(*) AS v FROM ext.thing",
        "SELECT count(*) AS v FROM pg_catalog.pg_class",
        'SELECT count(*) AS v FROM "mixed".t',  # not the schema "Mixed"
        "SELECT 1 AS v FROM @extschema:pg_stat_statements@.pg_stat_statements(false)",
    ],
)
def test_a_branch_reaching_only_trusted_schemas_is_not_fenced(sql: str) -> None:
    """Aliases, trusted schemas, pg_catalog and an extension named by @extschema@ keep the
    one round trip of session limits."""
    assert plan_one(branch("b", query=sql), TENANT).fenced == frozenset()


def test_extschema_names_the_extension_schema_and_skips_without_it() -> None:
    """@extschema:NAME@ becomes the quoted schema NAME is installed in; a branch naming
    an extension the database lacks is skipped, saying which."""
    sql = "SELECT calls AS v FROM @extschema:pg_stat_statements@.pg_stat_statements(false)"
    plan = plan_one(branch("b", query=sql), TENANT)
    assert plan.planned[0].query == 'SELECT calls AS v FROM "public".pg_stat_statements(false)'
    lacking = plan_one(branch("b", query=sql.replace("pg_stat_statements@", "pg_trgm@")), TENANT)
    assert lacking.planned == ()
    assert lacking.skipped[0].reason.startswith("needs extension pg_trgm")


def test_explain_names_the_fenced_branches() -> None:
    """/explain says which branches run fenced, and why."""
    plan = make_plan(Definitions((branch("a"), branch("t", query="SELECT 1 AS v FROM app.t"))),
                     TENANT, ())  # fmt: skip
    text = explain_text(plan)
    line = next(x for x in text.splitlines() if x.startswith("  t "))
    assert "runs in a read-only transaction of its own, rolled back" in line
    assert "rolled back" not in next(x for x in text.splitlines() if x.startswith("  a "))


def test_explain_says_how_the_limits_are_put_in_force() -> None:
    """Session settings on a direct connection; a transaction per collector, with the
    reason, otherwise; none on pgBouncer's console."""
    direct = explain_text(plan_one(branch("b")))
    assert "limits: the guards given at login" in direct.splitlines()[1]
    pooled = replace(PRIMARY, own_transaction="the server listens on port 5432, ...")
    line = explain_text(plan_one(branch("b"), pooled)).splitlines()[1]
    assert line == (
        "limits: every guard and limit local to a read-only transaction per collector, "
        "rolled back, because the server listens on port 5432, ..."
    )
    assert "none sent" in explain_text(plan_one(branch("b", tags=("pgbouncer",)), BOUNCER))
