"""The Kubernetes examples in deploy/kubernetes/: they parse, and what they name runs.

No cluster runs here (kubectl cannot validate without an API server), so each
manifest's exporter container is run under podman as Kubernetes would run it: its
image, args and environment (secrets resolved to the test's target), then its probe
paths are asked while the database is up and while it is unreachable.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigs.localpg import LocalCluster, free_port
from tests.packaging.conftest import IMAGE, REPO
from tests.packaging.containers import UID, Podman, Running, start

MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
PORT = 9630
# What each example's readiness answers while the database is unreachable: the sidecar
# leaves the Pod's readiness to the postgres container, the Deployment follows the target.
READY_WHEN_DOWN = {"sidecar.yaml": 200, "deployment.yaml": 503}
Doc = dict[str, Any]


def _documents(path: Path) -> list[Doc]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def _exporter(docs: list[Doc]) -> Doc:
    """The pg-exporter container of the manifest's workload."""
    found: list[Doc] = [
        container
        for doc in docs
        if doc["kind"] in {"Deployment", "StatefulSet", "DaemonSet"}
        for container in doc["spec"]["template"]["spec"]["containers"]
        if container["name"] == "pg-exporter"
    ]
    assert len(found) == 1, found
    return found[0]


def _env(docs: list[Doc], container: Doc, url: str) -> dict[str, str]:
    """The container's environment; a secret's URL becomes ``url`` once the key is found."""
    secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
    env = {}
    for item in container["env"]:
        assert item["name"].startswith("PG_EXPORTER_"), item
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["key"] in secrets[ref["name"]], ref
            env[item["name"]] = url
    return env


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
    pod = next(d for d in docs if d["kind"] in {"Deployment", "StatefulSet"})["spec"]["template"]
    security = {**pod["spec"].get("securityContext", {}), **container["securityContext"]}
    assert security["runAsUser"] == UID
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True


def _run_manifest(podman: Podman, path: Path, url: str) -> Running:
    docs = _documents(path)
    container = _exporter(docs)
    args = [a for a in container["args"] if not a.startswith("--web.listen-address=")]
    return start(podman, IMAGE, _env(docs, container, url), *args)


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
    path: Path, podman: Podman, image: str, cluster: LocalCluster, stopped: list[Running]
) -> None:
    """With the manifest's args and env, /metrics says pg_up 1 and both probes answer 200."""
    running = _run_manifest(podman, path, cluster.dsn())
    stopped.append(running)
    container = _exporter(_documents(path))
    running.wait_for("/metrics")
    for probe in ("livenessProbe", "readinessProbe"):
        running.wait_for(container[probe]["httpGet"]["path"])


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_liveness_holds_while_the_database_is_unreachable(
    path: Path, podman: Podman, image: str, stopped: list[Running]
) -> None:
    """No database: liveness stays 200 (no restart); readiness answers as the example says."""
    running = _run_manifest(podman, path, f"postgresql://monitor@127.0.0.1:{free_port()}/postgres")
    stopped.append(running)
    container = _exporter(_documents(path))
    running.wait_for("/metrics")  # the exporter serves, reporting pg_up 0
    assert running.get(container["livenessProbe"]["httpGet"]["path"])[0] == 200
    ready = running.get(container["readinessProbe"]["httpGet"]["path"])[0]
    assert ready == READY_WHEN_DOWN[path.name]
