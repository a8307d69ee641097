"""The collection pass against a real PostgreSQL: casting, caching, timeouts, fatal, discovery."""

from __future__ import annotations

import math
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.loading import load_definitions
from exporter.web.app import create_app
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import (
    COLLECTORS,
    exporter_backends,
    samples,
    settings_for,
    statement_calls,
    value,
    write_collectors,
)

Client = TestClient[web.Request, web.Application]


async def _client(
    aiohttp_client: AiohttpClient,
    cluster: LocalCluster,
    defs_text: str,
    tmp_path: Path,
    **overrides: object,
) -> Client:
    definitions = write_collectors(tmp_path, defs_text)
    # Only the main database unless a test asks for discovery: the session's clusters
    # hold other tests' databases, which must not change what these tests count.
    settings = settings_for(cluster, **{"auto_discovery": False, **overrides})
    app = create_app(settings, definitions)
    client: Client = await aiohttp_client(app)
    return client


async def _scrape(client: Client, **headers: str) -> str:
    response = await client.get("/metrics", headers=headers)
    assert response.status == 200, await response.text()
    return await response.text()


CASTING = """
cast:
  query: |
    SELECT 'a"b\\c' AS tag, NULL::text AS nothing, 42::bigint AS big, 1.5::numeric AS num,
           true AS flag, NULL::int AS missing_default, NULL::int AS missing_nan,
           '12.5'::text AS numeric_text, 'oops'::text AS bad_text,
           to_timestamp(1700000000) AS stamp, 3::int AS scaled
  ttl: 0
  timeout: 5
  metrics:
    - tag: {usage: LABEL, description: a label with characters to escape}
    - nothing: {usage: LABEL, description: a NULL label}
    - big: {usage: COUNTER, description: an integer}
    - num: {usage: GAUGE, description: a numeric}
    - flag: {usage: GAUGE, description: a boolean}
    - missing_default: {usage: GAUGE, default: 7, scale: 2, description: NULL with default}
    - missing_nan: {usage: GAUGE, description: NULL without default}
    - numeric_text: {usage: GAUGE, description: text holding a number}
    - bad_text: {usage: GAUGE, description: text that is no number}
    - stamp: {usage: GAUGE, scale: 1000, description: a timestamp, not scaled}
    - scaled: {usage: GAUGE, scale: 0.5, description: a scaled integer}
"""


async def test_values_are_cast_as_documented(
    aiohttp_client: AiohttpClient, pg: LocalCluster, tmp_path: Path
) -> None:
    """Numbers, booleans, NULLs, numeric text, timestamps and scale follow §3 on a real server."""
    client = await _client(aiohttp_client, pg, CASTING, tmp_path, disable_intro=True)
    body = await _scrape(client)
    labels = {"tag": 'a"b\\c', "nothing": ""}
    assert value(body, "cast_big", **labels) == 42
    assert value(body, "cast_num", **labels) == 1.5
    assert value(body, "cast_flag", **labels) == 1
    assert value(body, "cast_missing_default", **labels) == 14
    assert math.isnan(value(body, "cast_missing_nan", **labels))
    assert value(body, "cast_numeric_text", **labels) == 12.5
    assert math.isnan(value(body, "cast_bad_text", **labels))
    assert value(body, "cast_stamp", **labels) == 1700000000
    assert value(body, "cast_scaled", **labels) == 1.5
    assert "# TYPE cast_big counter\ncast_big{" in body  # counters keep their names


async def test_cached_collector_runs_once_within_ttl(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """Two scrapes within the TTL cost one execution on the server (B6)."""
    marker = f"cached_probe_{uuid.uuid4().hex[:8]}"
    text = f"""
    cached:
      query: SELECT 1::int AS {marker}
      ttl: 300
      timeout: 5
      metrics:
        - {marker}: {{usage: GAUGE, description: probe}}
    """
    client = await _client(aiohttp_client, pg18, text, tmp_path)
    first = await _scrape(client)
    second = await _scrape(client)
    assert value(first, f"cached_{marker}") == 1
    assert value(second, f"cached_{marker}") == 1
    assert statement_calls(pg18, marker) == 1
    assert value(second, "pg_exporter_query_scrape_hit_count", query="cached") == 1


async def test_slow_collector_times_out_without_blanking_others(
    aiohttp_client: AiohttpClient, pg: LocalCluster, tmp_path: Path
) -> None:
    """A collector over its timeout publishes nothing, the others do, no backend stays busy,
    and the failure is cached rather than retried at once (B14, B15, D11)."""
    text = """
    fast:
      query: SELECT 1 AS one
      timeout: 5
      metrics:
        - one: {usage: GAUGE, description: one}
    slow:
      query: SELECT 2 AS two FROM pg_sleep(3)
      timeout: 0.3
      ttl: 60
      metrics:
        - two: {usage: GAUGE, description: two}
    """
    client = await _client(aiohttp_client, pg, text, tmp_path)
    body = await _scrape(client)
    assert value(body, "fast_one") == 1
    assert math.isnan(value(body, "slow_two"))
    assert value(body, "pg_up") == 1
    assert value(body, "pg_exporter_query_scrape_error_count", query="slow") == 1
    assert value(body, "pg_exporter_scrape_error_count") == 0
    assert exporter_backends(pg, "state IN ('active', 'idle in transaction')") == 0
    again = await _scrape(client)  # the failure is cached for its TTL (B14)
    assert value(again, "pg_exporter_query_scrape_error_count", query="slow") == 1
    assert value(again, "pg_exporter_query_scrape_hit_count", query="slow") == 1
    # Classified outcomes, as a counter and in /stat (D10).
    outcome = "pg_exporter_query_outcome_total"
    assert value(again, outcome, query="slow", outcome="timeout") == 1
    assert value(again, outcome, query="slow", outcome="cached") == 1
    assert value(again, outcome, query="fast", outcome="ok") == 2  # ttl 0: every pass
    stat = await (await client.get("/stat")).text()
    # Columns: datname query … outcomes branch
    rows = {line.split()[1]: line.split()[-2] for line in stat.splitlines()[1:]}
    assert rows["slow"] == "cached=1,timeout=1", stat


async def test_a_collector_failing_mid_stream_publishes_none_of_its_rows(
    aiohttp_client: AiohttpClient, pg: LocalCluster, tmp_path: Path
) -> None:
    """Rows already streamed (three batches) are dropped when the query then fails: no
    partial result, and the other collectors are unaffected (B15)."""
    text = """
    fast:
      query: SELECT 1 AS one
      timeout: 5
      metrics:
        - one: {usage: GAUGE, description: one}
    halfway:
      query: >-
        SELECT g::text AS item, CASE WHEN g < 3500 THEN g ELSE 1 / (g - g) END AS v
        FROM generate_series(1, 5000) AS g
      timeout: 5
      metrics:
        - item: {usage: LABEL, description: item}
        - v: {usage: GAUGE, description: fails after 3499 rows}
    """
    client = await _client(aiohttp_client, pg, text, tmp_path)
    body = await _scrape(client)
    assert value(body, "fast_one") == 1
    assert "halfway_v" not in body
    assert value(body, "pg_exporter_query_scrape_error_count", query="halfway") == 1


async def test_a_failed_refresh_never_serves_the_previous_result(
    aiohttp_client: AiohttpClient, pg: LocalCluster, tmp_path: Path
) -> None:
    """A collector that succeeded, then fails on its next refresh, is absent: the old
    value is not served as if it were fresh (B15)."""
    table = f"flag_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE TABLE {table} AS SELECT 1 AS n")
    text = f"""
    flaky:
      query: SELECT 10 / (SELECT n FROM {table}) AS v
      ttl: 0
      timeout: 5
      metrics:
        - v: {{usage: GAUGE, description: fails once n is 0}}
    """
    try:
        client = await _client(aiohttp_client, pg, text, tmp_path)
        assert value(await _scrape(client), "flaky_v") == 10
        pg.psql(f"UPDATE {table} SET n = 0")
        assert "flaky_v" not in await _scrape(client)
    finally:
        pg.psql(f"DROP TABLE {table}")


async def test_fatal_collector_failure_sets_pg_up_zero(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """A failing fatal collector aborts the pass, reports pg_up 0 and counts an error (B19)."""
    text = """
    broken:
      query: SELECT 1/0 AS boom
      fatal: true
      timeout: 5
      metrics:
        - boom: {usage: GAUGE, description: never produced}
    after:
      query: SELECT 1 AS one
      priority: 200
      timeout: 5
      metrics:
        - one: {usage: GAUGE, description: one}
    """
    client = await _client(aiohttp_client, pg18, text, tmp_path)
    body = await _scrape(client)
    assert value(body, "pg_up") == 0
    assert math.isnan(value(body, "after_one"))
    assert value(body, "pg_exporter_scrape_error_count") == 1


async def test_predicates_gate_the_main_query(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """A false or NULL predicate skips the collector; all true runs it; errors are errors."""
    text = """
    gated_yes:
      query: SELECT 1 AS one
      timeout: 5
      predicate_queries:
        - {name: always, predicate_query: SELECT true}
        - {name: current, predicate_query: "SELECT current_setting('server_version_num')::int > 0"}
      metrics:
        - one: {usage: GAUGE, description: one}
    gated_no:
      query: SELECT 1 AS one
      timeout: 5
      predicate_queries:
        - {name: never, predicate_query: SELECT NULL::bool}
      metrics:
        - one: {usage: GAUGE, description: one}
    gated_bad:
      query: SELECT 1 AS one
      timeout: 5
      predicate_queries:
        - {name: two_columns, predicate_query: "SELECT true, true"}
      metrics:
        - one: {usage: GAUGE, description: one}
    """
    client = await _client(aiohttp_client, pg18, text, tmp_path)
    body = await _scrape(client)
    assert value(body, "gated_yes_one") == 1
    assert math.isnan(value(body, "gated_no_one"))
    assert value(body, "pg_exporter_query_scrape_predicate_skip_count", query="gated_no") == 1
    assert value(body, "pg_exporter_query_scrape_error_count", query="gated_bad") == 1


async def test_missing_label_column_fails_only_that_collector(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """A LABEL column absent from the result fails the collector; a missing gauge is omitted."""
    text = """
    nolabel:
      query: SELECT 1 AS v
      timeout: 5
      metrics:
        - who: {usage: LABEL, description: absent}
        - v: {usage: GAUGE, description: value}
    nogauge:
      query: SELECT 1 AS v
      timeout: 5
      metrics:
        - v: {usage: GAUGE, description: value}
        - w: {usage: GAUGE, description: absent}
    """
    client = await _client(aiohttp_client, pg18, text, tmp_path)
    body = await _scrape(client)
    assert value(body, "pg_exporter_query_scrape_error_count", query="nolabel") == 1
    assert value(body, "nogauge_v") == 1
    assert value(body, "pg_exporter_query_scrape_error_count", query="nogauge") == 0


async def test_writing_collector_is_refused(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """A collector that tries to write fails inside its read-only transaction (D2)."""
    table = f"t_{uuid.uuid4().hex[:8]}"
    pg18.psql(f"CREATE TABLE {table} (x int)")
    text = f"""
    writer:
      query: INSERT INTO {table} VALUES (1) RETURNING x
      timeout: 5
      metrics:
        - x: {{usage: GAUGE, description: x}}
    """
    client = await _client(aiohttp_client, pg18, text, tmp_path)
    body = await _scrape(client)
    assert value(body, "pg_exporter_query_scrape_error_count", query="writer") == 1
    assert pg18.psql(f"SELECT count(*) FROM {table}").strip() == "0"


async def test_discovery_adds_and_drops_databases(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """A database created while the exporter runs is scraped from the next pass on, without
    cluster branches, and dropped from the pass when it is gone."""
    dbname = f"disc_{uuid.uuid4().hex[:8]}"
    text = """
    perdb:
      query: SELECT current_database() AS datname, 1 AS one
      timeout: 5
      metrics:
        - datname: {usage: LABEL, description: database}
        - one: {usage: GAUGE, description: one}
    clusterwide:
      query: SELECT 1 AS one
      timeout: 5
      tags: [cluster]
      metrics:
        - one: {usage: GAUGE, description: one}
    """
    client = await _client(
        aiohttp_client,
        pg18,
        text,
        tmp_path,
        auto_discovery=True,
        exclude_databases=("template0", "template1"),
        include_databases=("postgres", dbname),
    )
    assert math.isnan(value(await _scrape(client), "perdb_one", datname=dbname))
    pg18.psql(f"CREATE DATABASE {dbname}")
    body = await _scrape(client)
    assert value(body, "perdb_one", datname=dbname) == 1
    assert value(body, "perdb_one", datname="postgres") == 1
    assert value(body, "clusterwide_one") == 1  # once, from the main database only
    exporter = client.app[STATE].exporter
    await exporter.discovered[dbname].disconnect()
    pg18.psql(f"DROP DATABASE {dbname}")
    body = await _scrape(client)
    assert math.isnan(value(body, "perdb_one", datname=dbname))
    assert dbname not in exporter.discovered


async def test_lost_connection_is_replaced_on_next_pass(
    aiohttp_client: AiohttpClient, pg: LocalCluster, tmp_path: Path
) -> None:
    """After pg_terminate_backend the next passes reconnect and pg_up returns to 1 (D8)."""
    text = """
    simple:
      query: SELECT 1 AS one
      timeout: 5
      metrics:
        - one: {usage: GAUGE, description: one}
    """
    client = await _client(aiohttp_client, pg, text, tmp_path)
    assert value(await _scrape(client), "pg_up") == 1
    killed = pg.psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'pg_exporter'"
    )
    assert int(killed) >= 1, "nothing was terminated: the test would prove nothing"
    bodies = [await _scrape(client) for _ in range(2)]
    assert value(bodies[-1], "pg_up") == 1
    assert value(bodies[-1], "simple_one") == 1


_COUNTER_TEXT = """
om:
  query: SELECT 5::bigint AS events
  timeout: 5
  metrics:
    - events: {usage: COUNTER, description: events seen}
"""
_PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


async def test_text_format_whatever_the_scraper_asks(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """Prometheus's default Accept (OpenMetrics first) still gets text 0.0.4: counters keep
    their names, as the Go exporter serves them; gzip still applies."""
    client = await _client(aiohttp_client, pg18, _COUNTER_TEXT, tmp_path)
    response = await client.get(
        "/metrics", headers={"Accept": _PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    )
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert response.headers["Content-Encoding"] == "gzip"
    body = await response.text()
    assert "# TYPE om_events counter\nom_events 5\n" in body
    assert "om_events_total" not in body
    assert "# EOF" not in body


async def test_openmetrics_and_gzip_are_negotiated_when_enabled(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """With --web.enable-openmetrics: OpenMetrics when asked (counters end in _total,
    # EOF), gzip when accepted (B22)."""
    client = await _client(aiohttp_client, pg18, _COUNTER_TEXT, tmp_path, openmetrics=True)
    response = await client.get(
        "/metrics",
        headers={
            "Accept": "application/openmetrics-text; version=1.0.0",
            "Accept-Encoding": "gzip",
        },
    )
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.headers["Content-Encoding"] == "gzip"
    body = await response.text()  # aiohttp decompresses transparently
    assert "# TYPE om_events counter\nom_events_total 5" in body
    assert body.endswith("# EOF\n")


async def test_replica_plans_replica_branches(
    aiohttp_client: AiohttpClient, pg18_replica: LocalCluster, tmp_path: Path
) -> None:
    """On a streaming replica only branches for standbys are planned."""
    text = """
    role_primary:
      name: role
      query: SELECT 1 AS primary_side
      timeout: 5
      tags: [primary]
      metrics:
        - primary_side: {usage: GAUGE, description: primary}
    role_replica:
      name: role
      query: SELECT 1 AS replica_side
      timeout: 5
      tags: [replica]
      metrics:
        - replica_side: {usage: GAUGE, description: replica}
    """
    client = await _client(aiohttp_client, pg18_replica, text, tmp_path)
    body = await _scrape(client)
    assert value(body, "pg_in_recovery") == 1
    assert value(body, "role_replica_side") == 1
    assert math.isnan(value(body, "role_primary_side"))
    explain = await (await client.get("/explain")).text()
    assert "role_primary" in explain
    assert "recovery" in explain.lower()


async def test_unreachable_target_reports_pg_up_zero(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """With the target unreachable the scrape still answers, with pg_up 0 and an error count."""
    text = """
    simple:
      query: SELECT 1 AS one
      timeout: 5
      metrics:
        - one: {usage: GAUGE, description: one}
    """
    definitions = write_collectors(tmp_path, text)
    settings = replace(
        settings_for(pg18),
        url="postgresql://postgres@127.0.0.1:1/postgres?sslmode=disable",
        connect_timeout=1.0,
    )
    client: Client = await aiohttp_client(create_app(settings, definitions))
    body = await _scrape(client)
    assert value(body, "pg_up") == 0
    assert value(body, "pg_exporter_scrape_error_count") == 1
    assert value(body, "pg_exporter_server_scrape_error_count", datname="postgres") == 1


async def test_predicate_result_is_cached_for_its_own_ttl(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """A predicate with a TTL runs once across passes while the main query runs every pass."""
    marker = f"pred_{uuid.uuid4().hex[:8]}"
    text = f"""
    gated:
      query: SELECT 1 AS main_{marker}
      ttl: 0
      timeout: 5
      predicate_queries:
        - {{name: p, predicate_query: "SELECT true AS check_{marker}", ttl: 300}}
      metrics:
        - main_{marker}: {{usage: GAUGE, description: one}}
    """
    client = await _client(aiohttp_client, pg18, text, tmp_path)
    for _ in range(3):
        assert value(await _scrape(client), f"gated_main_{marker}") == 1
    assert statement_calls(pg18, f"check_{marker}") == 1
    assert statement_calls(pg18, f"AS main_{marker}") == 3


async def test_disable_cache_refreshes_every_pass(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """--disable-cache runs a long-TTL collector on every pass (B16)."""
    marker = f"nocache_{uuid.uuid4().hex[:8]}"
    text = f"""
    cached:
      query: SELECT 1 AS {marker}
      ttl: 300
      timeout: 5
      metrics:
        - {marker}: {{usage: GAUGE, description: probe}}
    """
    client = await _client(aiohttp_client, pg18, text, tmp_path, disable_cache=True)
    for _ in range(2):
        await _scrape(client)
    assert statement_calls(pg18, marker) == 2


async def test_histogram_from_rows(
    aiohttp_client: AiohttpClient, pg15: LocalCluster, tmp_path: Path
) -> None:
    """A HISTOGRAM column builds cumulative buckets, count and sum per label tuple."""
    text = """
    lat:
      query: >-
        SELECT g AS grp, v FROM
        (VALUES ('a', 0.05), ('a', 0.3), ('a', 2.0), ('b', 0.2)) t (g, v)
      timeout: 5
      metrics:
        - grp: {usage: LABEL, description: group}
        - v: {usage: HISTOGRAM, bucket: [0.1, 0.5, 1], description: observed seconds}
    """
    client = await _client(aiohttp_client, pg15, text, tmp_path, disable_intro=True)
    body = await _scrape(client)
    buckets = {
        le: value(body, "lat_v_bucket", grp="a", le=le) for le in ("0.1", "0.5", "1", "+Inf")
    }
    assert buckets == {"0.1": 1, "0.5": 2, "1": 2, "+Inf": 3}
    assert value(body, "lat_v_count", grp="a") == 3
    assert value(body, "lat_v_sum", grp="a") == pytest.approx(2.35)
    assert value(body, "lat_v_count", grp="b") == 1
    assert "# TYPE lat_v_bucket gauge" in body


SELF_METRICS = {
    "pg_up": ("gauge", set()),
    "pg_version": ("gauge", set()),
    "pg_in_recovery": ("gauge", set()),
    "pg_exporter_build_info": (
        "gauge", {"version", "revision", "branch", "builddate", "goversion", "goos", "goarch",
                  "pyversion", "os", "arch"}),
    "pg_exporter_up": ("gauge", set()),
    "pg_exporter_uptime": ("gauge", set()),
    "pg_exporter_last_scrape_time": ("gauge", set()),
    "pg_exporter_scrape_duration": ("gauge", set()),
    "pg_exporter_scrape_total_count": ("counter", set()),
    "pg_exporter_scrape_error_count": ("counter", set()),
    **{f"pg_exporter_server_scrape_{s}": ("gauge", {"datname"})
       for s in ("duration", "total_seconds", "total_count", "error_count")},
    **{f"pg_exporter_query_{s}": ("gauge", {"datname", "query"})
       for s in ("cache_ttl", "scrape_total_count", "scrape_hit_count", "scrape_error_count",
                 "scrape_predicate_skip_count", "scrape_duration", "scrape_metric_count")},
}  # fmt: skip


async def test_every_self_metric_with_type_labels_and_const_labels(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """Every §5 self-metric appears with its type and labels (B22); const labels are on every
    series."""
    text = """
    simple:
      query: SELECT 1 AS one
      timeout: 5
      metrics:
        - one: {usage: GAUGE, description: one}
    """
    const = (("cls", "main"), ("env", "test"))
    client = await _client(aiohttp_client, pg18, text, tmp_path, const_labels=const)
    body = await _scrape(client)
    found = samples(body)
    for name, (kind, labels) in SELF_METRICS.items():
        assert f"# TYPE {name} {kind}\n" in body, name
        keys = [dict(lbls) for n, lbls in found if n == name]
        assert keys, f"{name} has no sample"
        assert all(set(k) == labels | {"cls", "env"} for k in keys), (name, keys)
    assert all(dict(lbls).get("cls") == "main" for _, lbls in found)
    assert value(body, "process_resident_memory_bytes") > 0


async def test_query_label_and_stat_use_the_collector_name(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """The ``query`` label of every ``…_query_*`` self-metric and the /stat key are the
    collector's name (``verbranch``), as in the Go exporter and its dashboards, never the
    branch key; two planned branches of one name add up instead of colliding."""
    text = """
    verbranch_18:
      name: verbranch
      query: SELECT 1 AS a
      timeout: 5
      min_version: 180000
      metrics:
        - a: {usage: GAUGE, description: a}
    verbranch_15:
      name: verbranch
      query: SELECT 1 AS a
      timeout: 5
      max_version: 160000
      metrics:
        - a: {usage: GAUGE, description: a}
    twice_a:
      name: twice
      query: SELECT 1 AS a
      timeout: 5
      metrics:
        - a: {usage: GAUGE, description: a}
    twice_b:
      name: twice
      query: SELECT 2 AS b
      timeout: 5
      metrics:
        - b: {usage: GAUGE, description: b}
    """
    client = await _client(aiohttp_client, pg18, text, tmp_path)
    await _scrape(client)
    body = await _scrape(client)
    queries = {dict(labels).get("query") for name, labels in samples(body)
               if name.startswith("pg_exporter_query_")}  # fmt: skip
    assert queries == {"verbranch", "twice"}
    assert value(body, "pg_exporter_query_scrape_total_count", query="verbranch") == 2
    assert value(body, "pg_exporter_query_scrape_total_count", query="twice") == 4
    assert value(body, "pg_exporter_query_scrape_metric_count", query="twice") == 2
    assert value(body, "pg_exporter_query_outcome_total", query="twice", outcome="ok") == 4
    stat = (await (await client.get("/stat")).text()).splitlines()
    keys = [line.split()[1] for line in stat[1:]]
    assert sorted(keys) == ["twice", "verbranch"]
    assert stat[0].split()[-1] == "branch"
    assert any(line.endswith("twice_a,twice_b") for line in stat)
    assert any(line.endswith(" verbranch_18") for line in stat)


async def test_openmetrics_of_the_whole_library_passes_a_strict_parser(
    aiohttp_client: AiohttpClient, pg18: LocalCluster
) -> None:
    """On a primary the library's receive LSN is a NaN counter: the text format keeps it, as
    Go does, and OpenMetrics leaves it out, so a strict parser takes the exposition (issue 25)."""
    settings = settings_for(pg18, auto_discovery=False, openmetrics=True)
    client: Client = await aiohttp_client(create_app(settings, load_definitions(str(COLLECTORS))))
    text = await _scrape(client)
    assert "\npg_receive_lsn NaN\n" in text
    response = await client.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    body = await response.text()
    assert "\n# TYPE pg_receive_lsn counter\n" in body
    assert "pg_receive_lsn_total NaN" not in body
    families = {f.name for f in text_string_to_metric_families(body)}  # type: ignore[no-untyped-call]
    assert {"pg_up", "pg_lsn", "pg_receive_lsn"} <= families
