"""The Kubernetes examples in deploy/kubernetes/: they parse, and what they name runs.

No cluster runs here (kubectl cannot validate without an API server), so each
manifest's exporter container is run under podman as Kubernetes would run it: its
image, args and environment (secrets resolved to the test's target), its ConfigMap
and Secret volumes mounted where it mounts them, then its probe paths are asked while
the database is up and while it is unreachable. The fleet example is also probed
target by target, with the password its Secret's file gives.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from rigs.localpg import LocalCluster, free_port
from tests.fixtures.helpers import value
from tests.fixtures.polling import wait_for
from tests.packaging.conftest import IMAGE, REPO
from tests.packaging.containers import UID, Podman, Running, start

MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
FLEET = REPO / "deploy" / "kubernetes" / "fleet.yaml"
PORT = 9630
# What each example's readiness answers while the database is unreachable: the sidecar
# leaves the Pod's readiness to the postgres container, the Deployment follows the
# target, and the fleet's readiness follows no target (it would drop them all).
READY_WHEN_DOWN = {"sidecar.yaml": 200, "deployment.yaml": 503, "fleet.yaml": 200}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}
CONFIG_MAP_MODE = 0o644  # Kubernetes' defaultMode of a ConfigMap volume
SECRET_MODE = 0o644  # and of a Secret volume, unless the manifest says otherwise
# A role that must give its password (scram over TCP), for the fleet's Secret to matter.
MONITOR = "fleet_monitor"
Doc = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Login:
    """Where the test points a manifest: a URL without password, and the password."""

    url: str
    password: str = "unused"


def _documents(path: Path) -> list[Doc]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def _pod(docs: list[Doc]) -> Doc:
    """The Pod spec of the manifest's workload."""
    workloads = [doc for doc in docs if doc["kind"] in WORKLOADS]
    assert len(workloads) == 1, [doc["kind"] for doc in docs]
    pod: Doc = workloads[0]["spec"]["template"]["spec"]
    return pod


def _exporter(docs: list[Doc]) -> Doc:
    """The pg-exporter container of the manifest's workload."""
    found: list[Doc] = [c for c in _pod(docs)["containers"] if c["name"] == "pg-exporter"]
    assert len(found) == 1, found
    return found[0]


def _env(docs: list[Doc], container: Doc, url: str) -> dict[str, str]:
    """The container's environment; a secret's URL becomes ``url`` once the key is found."""
    secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
    env = {}
    for item in container.get("env", []):
        assert item["name"].startswith("PG_EXPORTER_"), item
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["key"] in secrets[ref["name"]], ref
            env[item["name"]] = url
    return env


def _targets_file(docs: list[Doc]) -> tuple[str, Doc]:
    """The path the fleet's container reads its targets file from, and the file, parsed
    from the ConfigMap mounted there."""
    container = _exporter(docs)
    path = _env(docs, container, "")["PG_EXPORTER_TARGETS_FILE"]
    for mount in container["volumeMounts"]:
        folder, _, key = path.rpartition("/")
        if folder == mount["mountPath"]:
            source = _volume(docs, mount["name"])["configMap"]["name"]
            data = _named(docs, "ConfigMap", source)["data"]
            parsed: Doc = yaml.safe_load(data[key])
            return path, parsed
    raise AssertionError(f"no volume of the container holds {path}")


def _volume(docs: list[Doc], name: str) -> Doc:
    found: list[Doc] = [v for v in _pod(docs).get("volumes", []) if v["name"] == name]
    assert len(found) == 1, name
    return found[0]


def _named(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_parses_and_names_the_image_port_and_user(path: Path) -> None:
    """Every document has a kind and a name; the exporter runs the image as uid 9630,
    read-only, listening on the port its probes use."""
    docs = _documents(path)
    assert all(doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"] for doc in docs)
    container = _exporter(docs)
    assert container["image"] == IMAGE
    assert f"--web.listen-address=:{PORT}" in container["args"]
    assert container["ports"] == [{"name": "metrics", "containerPort": PORT, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"
    assert container["livenessProbe"]["httpGet"]["path"] == "/alive"
    security = {**_pod(docs).get("securityContext", {}), **container["securityContext"]}
    assert security["runAsUser"] == UID
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True


def test_fleet_manifest_declares_its_targets_passwords_and_replicas() -> None:
    """The fleet example: the targets file is the ConfigMap's, every password_file it
    names is a key of the Secret mounted there, no URL holds a password, and two
    StatefulSet replicas get stable names from a headless Service for hashmod."""
    docs = _documents(FLEET)
    path, targets = _targets_file(docs)
    assert path.endswith(".yml")
    container = _exporter(docs)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert all(m.get("readOnly") for m in mounts.values())
    entries = [{**targets.get("defaults", {}), **t} for t in targets["targets"]]
    assert len({t["name"] for t in entries}) == len(entries) >= 2
    for entry in entries:
        assert urllib.parse.urlsplit(entry["url"]).password is None, entry["name"]
        folder, _, key = entry["password_file"].rpartition("/")
        secret = _volume(docs, mounts[folder]["name"])["secret"]["secretName"]
        assert key in _named(docs, "Secret", secret)["stringData"], entry["name"]
    workload = next(d for d in docs if d["kind"] == "StatefulSet")
    service = _named(docs, "Service", workload["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert workload["spec"]["replicas"] == 2
    assert container["readinessProbe"]["httpGet"]["path"] == "/alive"


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder the container's user can read through (pytest's tmp_path is root's, 0700),
    for the volumes' files."""
    folder = Path(tempfile.mkdtemp(prefix="pgx-k8s-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _write(path: Path, text: str, mode: int, group: int) -> None:
    path.write_text(text)
    os.chown(path, 0, group)
    path.chmod(mode)


def _pointed_at(text: str, url: str) -> str:
    """A targets file whose every target is ``url``, its other fields kept."""
    targets = yaml.safe_load(text)
    for entry in targets["targets"]:
        for key in ("url", "url_env", "url_file"):
            entry.pop(key, None)
        entry["url"] = url
    return yaml.safe_dump(targets)


def _volume_flags(docs: list[Doc], container: Doc, login: Login, scratch: Path) -> list[str]:
    """``podman run`` flags mounting the container's volumes as Kubernetes would: the
    ConfigMap's keys as files (its targets file pointed at the test's server), the
    Secret's keys as files holding the test's password, owned by the pod's fsGroup."""
    targets_path = _env(docs, container, login.url).get("PG_EXPORTER_TARGETS_FILE")
    group = _pod(docs).get("securityContext", {}).get("fsGroup", 0)
    flags = []
    for mount in container.get("volumeMounts", []):
        volume = _volume(docs, mount["name"])
        folder = scratch / mount["name"]
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
        if "configMap" in volume:
            data = _named(docs, "ConfigMap", volume["configMap"]["name"])["data"]
            for key, text in data.items():
                is_targets = f"{mount['mountPath']}/{key}" == targets_path
                mode = volume["configMap"].get("defaultMode", CONFIG_MAP_MODE)
                _write(
                    folder / key, _pointed_at(text, login.url) if is_targets else text, mode, group
                )
        else:
            secret = volume["secret"]
            keys = _named(docs, "Secret", secret["secretName"])["stringData"]
            for key in keys:
                _write(
                    folder / key,
                    login.password + "\n",
                    secret.get("defaultMode", SECRET_MODE),
                    group,
                )
        flags += ["--volume", f"{folder}:{mount['mountPath']}:ro"]
    return flags


def _run_manifest(podman: Podman, path: Path, login: Login, scratch: Path) -> Running:
    docs = _documents(path)
    container = _exporter(docs)
    args = [a for a in container["args"] if not a.startswith("--web.listen-address=")]
    volumes = _volume_flags(docs, container, login, scratch)
    mounting = dataclasses.replace(podman, run_flags=(*podman.run_flags, *volumes))
    return start(mounting, IMAGE, _env(docs, container, login.url), *args)


@pytest.fixture
def stopped() -> Iterator[list[Running]]:
    """Containers a test started; each must exit 0 on SIGTERM at the end."""
    started: list[Running] = []
    yield started
    for running in started:
        if running.process.poll() is None:
            assert running.stop()[0] == 0, running.output()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_probes_answer_while_the_database_is_up(
    path: Path, podman: Podman, cluster: LocalCluster, stopped: list[Running], scratch: Path
) -> None:
    """With the manifest's args, env and volumes, the exporter serves and both probes
    answer 200."""
    running = _run_manifest(podman, path, Login(cluster.dsn()), scratch)
    stopped.append(running)
    container = _exporter(_documents(path))
    running.wait_for("/metrics")
    for probe in ("livenessProbe", "readinessProbe"):
        running.wait_for(container[probe]["httpGet"]["path"])


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_liveness_holds_while_the_database_is_unreachable(
    path: Path, podman: Podman, image: str, stopped: list[Running], scratch: Path
) -> None:
    """No database: liveness stays 200 (no restart); readiness answers as the example says."""
    nowhere = Login(f"postgresql://monitor@127.0.0.1:{free_port()}/postgres")
    running = _run_manifest(podman, path, nowhere, scratch)
    stopped.append(running)
    container = _exporter(_documents(path))
    running.wait_for("/metrics")  # the exporter serves, reporting pg_up 0
    assert running.get(container["livenessProbe"]["httpGet"]["path"])[0] == 200
    ready = running.get(container["readinessProbe"]["httpGet"]["path"])[0]
    assert ready == READY_WHEN_DOWN[path.name]


@pytest.fixture
def monitor(cluster: LocalCluster) -> Iterator[Login]:
    """A pg_monitor role of the test's server that logs in over TCP only with its
    password (scram-sha-256), removed afterwards."""
    password = f"pw-{os.urandom(6).hex()}"
    hba = cluster.data_dir / "pg_hba.conf"
    before = hba.read_text()
    rule = f"host all {MONITOR} 127.0.0.1/32 scram-sha-256\n"
    cluster.psql(
        f"SET password_encryption = 'scram-sha-256'; "
        f"CREATE ROLE {MONITOR} LOGIN PASSWORD '{password}' IN ROLE pg_monitor"
    )
    hba.write_text(rule + before)  # first match wins: before the trust rules
    cluster.psql("SELECT pg_reload_conf()")
    try:
        yield Login(cluster.dsn(user=MONITOR), password)
    finally:
        hba.write_text(before)
        cluster.psql("SELECT pg_reload_conf()")
        cluster.psql(f"DROP ROLE IF EXISTS {MONITOR}")


def _serves(running: Running, name: str) -> bool:
    """``/probe?target=name`` answers pg_up 1 (the target logged in and was collected)."""
    status, body = running.get(f"/probe?target={name}")
    return status == 200 and value(body, "pg_up") == 1


def _primary(running: Running, name: str) -> bool:
    """The target's health probe logged in and reads a primary."""
    return running.get(f"/readiness?target={name}") == (200, "primary")


def test_fleet_probes_each_declared_target_with_the_secrets_password(
    podman: Podman, image: str, monitor: Login, stopped: list[Running], scratch: Path
) -> None:
    """The fleet example with its ConfigMap's targets file (every URL pointed at the test's
    server, as a role that must give a password) and its Secret's password files: each
    declared name's /probe says pg_up 1, an undeclared name gets 404, /targets lists
    every name, and no page or log line shows the password."""
    with pytest.raises(psycopg.OperationalError):  # the premise: no password, no login
        psycopg.connect(monitor.url, connect_timeout=5).close()
    docs = _documents(FLEET)
    names = [t["name"] for t in _targets_file(docs)[1]["targets"]]
    running = _run_manifest(podman, FLEET, monitor, scratch)
    stopped.append(running)
    running.wait_for("/alive")
    for name in names:
        wait_for(functools.partial(_serves, running, name), f"{name}'s pg_up 1", 30)
        wait_for(functools.partial(_primary, running, name), f"{name}'s health probe", 30)
    assert running.get("/probe?target=undeclared")[0] == 404
    status, page = running.get("/targets")
    assert status == 200
    assert all(name in page for name in names), page
    metrics = running.get("/metrics")[1]
    assert value(metrics, "pg_exporter_fleet_targets") == len(names)
    for text in (page, metrics, running.get(f"/stat?target={names[0]}")[1]):
        assert monitor.password not in text
    code, _ = running.stop()
    log = running.output()
    assert code == 0, log
    assert monitor.password not in log
    assert "Traceback" not in log
