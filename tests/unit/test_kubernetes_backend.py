"""The Kubernetes backend against an in-memory CoreV1Api: the objects it creates, which pods count as failed,
and that a pod of a node it removed on purpose is not a failure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from elastream.control.backends.kubernetes import KubernetesBackend
from elastream.core.schedule import initial_schedule
from elastream.core.topology import parse_manifest
from helpers import edge, manifest, sink, src


class FakeCore:
    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.config_maps: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, dict[str, Any]] = {}
        self.phase: dict[str, str] = {}

    def _missing(self, store: dict[str, Any], name: str) -> None:
        from kubernetes.client.exceptions import ApiException as Real

        if name not in store:
            raise Real(status=404)

    def patch_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self._missing(self.config_maps, name)
        self.config_maps[name]["data"] = body["data"]

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        self.config_maps[body["metadata"]["name"]] = body

    def patch_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self._missing(self.secrets, name)

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any]) -> None:
        self.secrets[body["metadata"]["name"]] = body

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        self.pods[body["metadata"]["name"]] = body
        self.phase[body["metadata"]["name"]] = "Running"

    def delete_namespaced_pod(self, name: str, namespace: str, grace_period_seconds: int = 0) -> None:
        self.pods.pop(name, None)

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        wanted = dict(pair.split("=") for pair in label_selector.split(","))
        items = []
        for name, pod in self.pods.items():
            labels = pod["metadata"]["labels"]
            if all(labels.get(k) == v for k, v in wanted.items()):
                terminated = SimpleNamespace(exit_code=137, reason="OOMKilled")
                state = SimpleNamespace(terminated=terminated if self.phase[name] == "Failed" else None)
                items.append(
                    SimpleNamespace(
                        metadata=SimpleNamespace(name=name, labels=labels, deletion_timestamp=None),
                        status=SimpleNamespace(
                            phase=self.phase[name], conditions=[], container_statuses=[SimpleNamespace(state=state)]
                        ),
                    )
                )
        return SimpleNamespace(items=items)


def backend():
    topology = parse_manifest(manifest([src("s", 2), sink("z", 2)], [edge("s", "z")], name="web", nodes=2))
    core = FakeCore()
    kube = KubernetesBackend(topology, None, core, {"name": "web", "uid": "u"}, "redis://:pw@r:6379/0")  # type: ignore[arg-type]
    kube.schedule = initial_schedule(topology)
    return kube, core


def test_config_map_and_secret_hold_the_topology_and_the_url() -> None:
    kube, core = backend()
    kube.ensure_config()
    assert "kind: StreamTopology" in core.config_maps["web-topology"]["data"]["topology.yaml"]
    assert '"version"' in core.config_maps["web-topology"]["data"]["schedule.json"]
    assert core.secrets["web-redis"]["stringData"]["url"] == "redis://:pw@r:6379/0"
    assert core.secrets["web-redis"]["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_missing_and_failed_pods_are_failures_and_removed_nodes_are_not() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    kube.spawn("node-1")
    assert kube.running_nodes() == {"node-0", "node-1"}
    assert kube.failed_nodes() == {}
    core.phase["web-node-1"] = "Failed"
    kube._pods_at = 0.0
    failed = kube.failed_nodes()
    assert list(failed) == ["node-1"] and "exit code 137 (OOMKilled)" in failed["node-1"]
    del core.pods["web-node-0"]
    kube._pods_at = 0.0
    assert "is gone" in kube.failed_nodes()["node-0"]
    kube.stop_nodes(["node-0", "node-1"])  # removed on purpose: not failures
    assert kube.failed_nodes() == {}
    kube.spawn("node-1")  # started again: watched again
    core.phase["web-node-1"] = "Failed"
    kube._pods_at = 0.0
    assert list(kube.failed_nodes()) == ["node-1"]


def test_stop_workers_deletes_every_pod_of_the_topology() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    kube.spawn("node-1")
    core.create_namespaced_pod("default", {"metadata": {"name": "other", "labels": {"app": "x"}}})
    kube.stop_workers()
    assert list(core.pods) == ["other"]
