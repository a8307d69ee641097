"""A fleet scraped by real Prometheus servers with the configs users copy (issue 14).

Four declared targets: PostgreSQL 18, its streaming replica, PostgreSQL 15 and a
pgBouncer in front of the 18. Prometheus reads the names from the example file_sd file
``deploy/prometheus/targets.json`` and relabels them as ``deploy/prometheus/fleet.yml``
and ``fleet-sharded.yml`` say; the tests load those files and change only addresses,
paths, the interval and the external label, so the documented configs are the tested
ones. Everything is judged through Prometheus's HTTP API and the exporters' own
``/metrics``, never by probing a target ourselves (that would take one of its two
admission places from Prometheus).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import COLLECTORS, REPO, http_get, statement_calls, value
from tests.fixtures.polling import wait_for
from tests.fixtures.processes import fleet_exporter, prometheus

pytestmark = pytest.mark.concurrency  # timing-sensitive: repeat with --repeat N

DEPLOY = REPO / "deploy" / "prometheus"
# The addresses and path the shipped configs use, replaced by the test's.
EXPORTER = "pg-exporter:9630"
REPLICAS = ("pg-exporter-0:9630", "pg-exporter-1:9630")
SD_FILES = "/etc/prometheus/pg-targets/*.json"
JOB = "postgres"

# Scrapes every 2 s with a 2 s timeout: short, yet with room for a busy shared machine.
INTERVAL = 2
TTL = 4  # seconds, of the marker collector: two scrapes of each server per ttl
WINDOW = 12  # seconds the HA pair is measured over (three ttl windows)
MARKER = "fleet_ttl_marker"
PG_NAMES = ("orders-primary", "orders-replica", "billing-pg15")
BOUNCER = "pgbouncer-orders"
NAMES = (*PG_NAMES, BOUNCER)

# One cheap collector on every PostgreSQL target with a known ttl, its SQL marked so
# the statement log tells its runs apart; the library's pgBouncer collectors beside it.
_MARKER_COLLECTOR = f"""
fleet_marker:
  desc: a constant, to count how often the collector really runs
  query: SELECT 1 AS hits /* {MARKER} */
  ttl: {TTL}
  timeout: 1
  tags: [cluster]
  metrics:
    - hits: {{usage: GAUGE, description: always 1}}
"""


@dataclass(frozen=True)
class Fleet:
    """The four targets, their targets file and file_sd list, and the collectors."""

    home: Path
    targets: Path  # the exporter's targets file
    sd_file: Path  # Prometheus's file_sd list (the shipped example)
    collectors: Path
    servers: dict[str, LocalCluster]  # the PostgreSQL targets by name


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
    pg18: LocalCluster,
    pg18_replica: LocalCluster,
    pg15: LocalCluster,
    pgbouncer18: LocalPgBouncer,
) -> Fleet:
    home = tmp_path_factory.mktemp("fleet")
    collectors = home / "collectors"
    collectors.mkdir()
    (collectors / "0100-marker.yml").write_text(_MARKER_COLLECTOR)
    for library in sorted(COLLECTORS.glob("09*-pgbouncer-*.yml")):
        shutil.copy(library, collectors / library.name)
    urls = {
        "orders-primary": pg18.dsn(),
        "orders-replica": pg18_replica.dsn(),
        "billing-pg15": pg15.dsn(),
        BOUNCER: pgbouncer18.dsn(),
    }
    declared = {
        "defaults": {"auto_discovery": False},
        "targets": [{"name": name, "url": url} for name, url in urls.items()],
    }
    targets = home / "targets.yml"
    targets.write_text(yaml.safe_dump(declared))
    sd_file = home / "targets.json"
    shutil.copy(DEPLOY / "targets.json", sd_file)
    listed = {name for group in json.loads(sd_file.read_text()) for name in group["targets"]}
    assert listed == set(NAMES), "the example file_sd list names the four test targets"
    servers = {"orders-primary": pg18, "orders-replica": pg18_replica, "billing-pg15": pg15}
    return Fleet(home, targets, sd_file, collectors, servers)


@pytest.fixture(scope="module")
def exporter_port(fleet: Fleet) -> Iterator[int]:
    """One exporter in fleet mode for the four targets."""
    with fleet_exporter(fleet.targets, fleet.collectors, fleet.home / "exporter.log") as port:
        yield port


@pytest.fixture(scope="module")
def prom_a(fleet: Fleet, exporter_port: int) -> Iterator[str]:
    """Prometheus ``a`` with deploy/prometheus/fleet.yml, scraping every INTERVAL s."""
    home = fleet.home / "prometheus-a"
    home.mkdir()
    config = _config("fleet.yml", fleet, {EXPORTER: _local(exporter_port)}, "a")
    with prometheus(home, config) as api:
        yield api


# --- the tests ---------------------------------------------------------------------------


def test_every_target_is_scraped_under_its_name(
    fleet: Fleet, prom_a: str, exporter_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through fleet.yml's relabelling every declared target is scraped at
    /probe?target=NAME, `instance` is the name, `up` and `pg_up` are 1 at every scrape,
    and the pgBouncer target carries pgBouncer's series."""
    wait_for(lambda: _min(_by_instance(prom_a, f'count_over_time(up{{job="{JOB}"}}[1h])')) >= 5,
             "five scrapes of every target", within=60)  # fmt: skip
    targets = _api(prom_a, "targets", state="active")
    assert isinstance(targets, dict)
    probes = {
        t["labels"]["instance"]: t["scrapeUrl"]
        for t in targets["activeTargets"]
        if t["labels"]["job"] == JOB
    }
    assert set(probes) == set(NAMES)
    for name, url in probes.items():
        parsed = urllib.parse.urlsplit(url)
        assert parsed.netloc == _local(exporter_port)
        assert parsed.path == "/probe"
        assert urllib.parse.parse_qs(parsed.query) == {"target": [name]}
    _always_up(prom_a)
    # A pgBouncer target's self-metrics are in the pgbouncer namespace, as in single mode.
    pg_up = _by_instance(
        prom_a, f'min_over_time({{__name__=~"pg_up|pgbouncer_up",job="{JOB}"}}[1h])'
    )
    assert pg_up == dict.fromkeys(NAMES, 1.0)
    assert set(_by_instance(prom_a, "pgbouncer_up")) == {BOUNCER}
    bouncer = _api(prom_a, "series", **{"match[]": f'{{instance="{BOUNCER}"}}'})
    assert isinstance(bouncer, list)
    names = {s["__name__"] for s in bouncer}
    assert {"pgbouncer_list_items", "pgbouncer_database_pool_size"} <= names
    marker = _by_instance(prom_a, "fleet_marker_hits")
    assert set(marker) == set(PG_NAMES), "the marker runs on PostgreSQL, never on pgBouncer"
    in_recovery = _by_instance(prom_a, "pg_in_recovery")
    assert in_recovery == {**dict.fromkeys(PG_NAMES, 0.0), "orders-replica": 1.0}
    durations = _by_instance(prom_a, f'max_over_time(scrape_duration_seconds{{job="{JOB}"}}[1h])')
    with capsys.disabled():
        print("\nfleet, one Prometheus: longest scrape per target (s): "
              + ", ".join(f"{n} {d:.3f}" for n, d in sorted(durations.items())))  # fmt: skip


def test_ha_pair_runs_each_target_once_per_ttl(
    fleet: Fleet,
    prom_a: str,
    exporter_port: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A second Prometheus with the same fleet.yml (another external label) scrapes the
    same exporter: per target, the marker collector still runs at most once per ttl for
    both together (self-metrics and the statement log agree), the other scrapes are
    answered from the cache, and `up` stays 1 on both servers."""
    config = _config("fleet.yml", fleet, {EXPORTER: _local(exporter_port)}, "b")
    with prometheus(tmp_path, config) as prom_b:
        wait_for(lambda: _min(_by_instance(prom_b, f'up{{job="{JOB}"}}')) == 1.0,
                 "prometheus b to scrape every target", within=60)  # fmt: skip
        start = time.time()
        calls_before = {name: statement_calls(c, MARKER) for name, c in fleet.servers.items()}
        end = start + WINDOW
        wait_for(lambda: _scraped_after(prom_a, end) and _scraped_after(prom_b, end),
                 "both servers to scrape past the window", within=WINDOW + 30)  # fmt: skip
        calls = {
            name: statement_calls(c, MARKER) - calls_before[name]
            for name, c in fleet.servers.items()
        }
        _always_up(prom_b)
        scrapes_b = _by_instance(prom_b, f'count_over_time(up{{job="{JOB}"}}[{WINDOW}s])', end)
    _always_up(prom_a)
    scrapes_a = _by_instance(prom_a, f'count_over_time(up{{job="{JOB}"}}[{WINDOW}s])', end)

    def delta(query: str) -> dict[str, float]:
        before, after = _by_instance(prom_a, query, start), _by_instance(prom_a, query, end)
        return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in NAMES}

    def outcomes(namespace: str, query_name: str, outcome: str) -> dict[str, float]:
        return delta(
            f"sum by (instance) ({namespace}_exporter_query_outcome_total"
            f'{{job="{JOB}",query="{query_name}",outcome="{outcome}"}})'
        )

    executed = outcomes("pg", "fleet_marker", "ok")
    cached = outcomes("pg", "fleet_marker", "cached")
    bouncer_ttl = _ttl("0910-pgbouncer-list.yml", "pgbouncer_list")
    bouncer_ok = outcomes("pgbouncer", "pgbouncer_list", "ok")[BOUNCER]
    # Counter samples are as of the last scrape before each end of the window, so the
    # span measured is up to a scrape interval longer: one more run may fall in it.
    bound = WINDOW // TTL + 2
    figures = [
        f"{n}: scrapes a {scrapes_a[n]:.0f} + b {scrapes_b[n]:.0f}, executed "
        f"{executed[n]:.0f} (statement log {calls[n]}), cached {cached[n]:.0f}"
        for n in PG_NAMES
    ]
    figures.append(f"{BOUNCER}: pgbouncer_list (ttl {bouncer_ttl}s) executed {bouncer_ok:.0f}")
    with capsys.disabled():
        print(f"\nHA pair over {WINDOW}s, marker ttl {TTL}s, bound {bound}; " + "; ".join(figures))
    for name in PG_NAMES:
        pair = scrapes_a[name] + scrapes_b[name]
        assert scrapes_b[name] >= WINDOW / INTERVAL / 2, f"{name}: prometheus b hardly scraped"
        assert 1 <= executed[name] <= bound, f"{name}: {executed[name]} runs in {WINDOW}s"
        assert 1 <= calls[name] <= bound + 1, f"{name}: {calls[name]} statements in {WINDOW}s"
        assert cached[name] >= pair / 2 - executed[name], f"{name}: few cache hits"
    assert bouncer_ok <= WINDOW // bouncer_ttl + 2


def test_hashmod_gives_each_target_to_one_replica(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two exporters with the same targets file behind deploy/prometheus/fleet-sharded.yml:
    every target is scraped with `up` 1, each by exactly the replica its name hashes to,
    and the other replica never collects it."""
    with (
        fleet_exporter(fleet.targets, fleet.collectors, tmp_path / "exporter-0.log") as port0,
        fleet_exporter(fleet.targets, fleet.collectors, tmp_path / "exporter-1.log") as port1,
    ):
        ports = (port0, port1)
        addresses = dict(zip(REPLICAS, (_local(p) for p in ports), strict=True))
        config = _config("fleet-sharded.yml", fleet, addresses, "a")
        with prometheus(tmp_path, config) as api:
            count = f'count_over_time(up{{job="{JOB}"}}[1h])'
            wait_for(lambda: _min(_by_instance(api, count)) >= 3,
                     "three scrapes of every target", within=60)  # fmt: skip
            _always_up(api)
            assert set(_by_instance(api, count)) == set(NAMES)
            passes = [_passes(port) for port in ports]
    expected = {name: _hashmod(name, len(REPLICAS)) for name in NAMES}
    with capsys.disabled():
        print("\nsharded: passes per target on replica 0 / 1: "
              + ", ".join(f"{n} {passes[0][n]:.0f}/{passes[1][n]:.0f}" for n in NAMES))  # fmt: skip
    for name, shard in expected.items():
        assert passes[shard][name] >= 3, f"{name} not collected by replica {shard}"
        assert passes[1 - shard][name] == 0, f"{name} also collected by replica {1 - shard}"
    assert sorted(expected.values()) == [0, 0, 1, 1], "the example names split two and two"


# --- helpers -----------------------------------------------------------------------------


def _local(port: int) -> str:
    return f"127.0.0.1:{port}"


def _config(file: str, fleet: Fleet, addresses: dict[str, str], replica: str) -> str:
    """A shipped Prometheus config with the test's addresses, file_sd path, interval and
    external label; nothing else changed."""
    config = yaml.safe_load((DEPLOY / file).read_text())
    config = _substituted(config, {**addresses, SD_FILES: str(fleet.sd_file)})
    config["global"].update(scrape_interval=f"{INTERVAL}s", scrape_timeout=f"{INTERVAL}s")
    config["global"]["external_labels"]["replica"] = replica
    text = yaml.safe_dump(config)
    for old in (EXPORTER, *REPLICAS, SD_FILES):
        assert old not in text, f"{old} left in {file}"
    return text


def _substituted(node: Any, mapping: dict[str, str]) -> Any:
    """``node`` (loaded YAML) with every string that is a key of ``mapping`` replaced."""
    if isinstance(node, dict):
        return {key: _substituted(item, mapping) for key, item in node.items()}
    if isinstance(node, list):
        return [_substituted(item, mapping) for item in node]
    if isinstance(node, str):
        return mapping.get(node, node)
    return node


def _ttl(file: str, branch: str) -> int:
    ttl = yaml.safe_load((COLLECTORS / file).read_text())[branch]["ttl"]
    assert isinstance(ttl, int)
    return ttl


def _hashmod(name: str, modulus: int) -> int:
    """Prometheus's hashmod: the last 8 bytes of the MD5 of the value, big-endian."""
    return int.from_bytes(hashlib.md5(name.encode()).digest()[8:], "big") % modulus


def _api(base: str, path: str, **params: str) -> object:
    status, text = http_get(f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}")
    assert status == 200, text
    return json.loads(text)["data"]


def _by_instance(base: str, query: str, at: float | None = None) -> dict[str, float]:
    """An instant vector keyed by `instance` (one series per instance expected)."""
    params = {"query": query} if at is None else {"query": query, "time": f"{at:.3f}"}
    data = _api(base, "query", **params)
    assert isinstance(data, dict)
    out: dict[str, float] = {}
    for row in data["result"]:
        instance = row["metric"].get("instance", "")
        assert instance not in out, f"{query}: several series for {instance}"
        out[instance] = float(row["value"][1])
    return out


def _min(values: dict[str, float]) -> float:
    """The smallest value over all four targets; 0 while one is missing."""
    return min(values.get(name, 0.0) for name in NAMES)


def _always_up(base: str) -> None:
    """Every stored `up` sample of every target is 1, since the server started."""
    lowest = _by_instance(base, f'min_over_time(up{{job="{JOB}"}}[1h])')
    assert lowest == dict.fromkeys(NAMES, 1.0), f"some scrape failed: {lowest}"


def _scraped_after(base: str, moment: float) -> bool:
    """True once the server's latest scrape of every target is later than ``moment``."""
    return _min(_by_instance(base, f'timestamp(up{{job="{JOB}"}})')) > moment


def _passes(port: int) -> dict[str, float]:
    """Collection passes per target, from the exporter's own /metrics."""
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return {
        name: value(body, "pg_exporter_fleet_target_scrapes_total", target=name) for name in NAMES
    }
