"""What a user does, end to end, with the real kubectl and helm against a real API server and a real
kube-scheduler placing pods on three 4-CPU nodes: install the chart, apply the README's demo as shipped,
wait for it, scale it out with `kubectl patch` and in with `kubectl scale`, read its status and events, lose
a worker pod, restart the operator in the middle of a migration, delete it. Every event the sources emit
reaches the sinks exactly once across all of it (exactly-once sinks, checked in Redis through the bundled
Redis Service), invalid manifests are refused with the schema's or CEL's message, a topology that asks for
more CPU than the nodes have is reported Pending with the scheduler's reason, and `spreadOverNodes` and
`placement` reach the scheduler.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections import Counter
from typing import Any

import pytest
import redis
import yaml

from support.paths import REPO

from .conftest import RELEASE, SYSTEM, sleeper

pytestmark = pytest.mark.e2e

DEMO = os.path.join(REPO, "examples", "demo.yaml")
EVENTS = 9000  # 300 events/s: half a minute of input, long enough to scale twice mid-stream


def topology_manifest(name: str, nodes: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name},
        "spec": {
            "nodes": nodes,
            # room for Stela's new executors on the way back in (a scale-in that does not fit lowers parallelism,
            # which test_parallelism_rescale.py checks on real workers)
            "slotsPerNode": 6,
            "vertices": [
                {
                    "name": "clicks",
                    "source": {"type": "synthetic", "rate": 300, "keys": 50, "limit": EVENTS},
                    "parallelism": 1,
                    "maxParallelism": 8,
                },
                {"name": "parse", "logic": {"builtin": "work", "costMs": 4.0}, "parallelism": 1, "maxParallelism": 8},
                {
                    "name": "count",
                    "logic": {"builtin": "count", "key": "key"},
                    "stateful": True,
                    "parallelism": 2,
                    "maxParallelism": 8,
                },
                {"name": "out", "sink": {"type": "redis-stream", "delivery": "exactly-once"}, "maxParallelism": 8},
                {"name": "audit", "sink": {"type": "redis-stream", "delivery": "exactly-once"}, "maxParallelism": 8},
            ],
            "streams": [
                {"from": "clicks", "to": "parse", "grouping": "shuffle"},
                {"from": "parse", "to": "count", "grouping": "fields", "key": "key"},
                {"from": "parse", "to": "out", "grouping": "shuffle"},
                {"from": "count", "to": "audit", "grouping": "shuffle"},
            ],
            "scaling": {"strategy": "stela", "migration": "ccr", "checkpointIntervalSeconds": 2, "window": 5},
        },
    }


def status(kubectl, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl("get", "topo", name, "-n", namespace, "-o", "json", quiet=True)
    return json.loads(out.stdout).get("status") or {}


def wait_status(kubectl, namespace: str, name: str, predicate, timeout_s: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = status(kubectl, namespace, name)
        if predicate(last):
            print(f"  status: phase {last.get('phase')}, nodes {last.get('nodes')}, ready {last.get('readyNodes')}, "
                  f"throughput {last.get('throughput')}, last scaling {last.get('lastScalingSummary')}")  # fmt: skip
            return last
        time.sleep(1.0)
    pytest.fail(f"{what} not reached in {timeout_s:.0f} s; status: {json.dumps(last, indent=1)[:3000]}")


def pods_of(kubectl, namespace: str, name: str, terminating: bool = False) -> list[dict[str, Any]]:
    """The topology's worker pods (with those being deleted when `terminating`)."""
    out = kubectl(
        "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name},app.kubernetes.io/component=worker",
        "-o", "json", quiet=True,
    )  # fmt: skip
    return [p for p in json.loads(out.stdout)["items"] if terminating or not p["metadata"].get("deletionTimestamp")]


def worker_pods(kubectl, namespace: str, name: str) -> list[str]:
    """The names of the topology's worker pods, those being deleted included."""
    return sorted(p["metadata"]["name"] for p in pods_of(kubectl, namespace, name, terminating=True))


def sink_ids(client: redis.Redis, namespace: str, name: str, sink: str) -> Counter[int]:
    entries = client.xrange(f"elastream:{{{namespace}/{name}}}:sink:{sink}", "-", "+")
    return Counter(int(fields[b"id"]) for _, fields in entries)


def sink_ids_when_complete(
    client: redis.Redis, namespace: str, name: str, sink: str, total: int, timeout_s: float, settle_s: float
) -> Counter[int]:
    """The sink's ids once it holds `total` entries (or `timeout_s` passed), read again `settle_s` later:
    anything beyond (a duplicate) would have arrived by then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sum(sink_ids(client, namespace, name, sink).values()) < total:
        time.sleep(2)
    time.sleep(settle_s)
    return sink_ids(client, namespace, name, sink)


def scaled(kubectl, namespace: str, name: str, nodes: int, timeout_s: float) -> dict[str, Any]:
    """The status once the topology runs on `nodes` nodes by a scaling that succeeded (after a patch or scale)."""
    out = wait_status(
        kubectl, namespace, name,
        lambda s: s.get("nodes") == nodes and (s.get("lastScaling") or {}).get("toNodes") == nodes, timeout_s,
        f"a scaling to {nodes} nodes",
    )  # fmt: skip
    assert out["lastScaling"]["outcome"] == "succeeded", out["lastScaling"]
    return out


def check_exactly_once_and_counts(client: redis.Redis, namespace: str, name: str) -> None:
    """Every event exactly once at `out` and every keyed count at `audit` exactly 1..n per key."""
    out_ids = sink_ids_when_complete(client, namespace, name, "out", EVENTS, 300, 5)
    assert out_ids == Counter(range(EVENTS)), f"{len(set(range(EVENTS)) - set(out_ids))} lost, " + (
        f"{sum((out_ids - Counter(range(EVENTS))).values())} twice"
    )
    audit = client.xrange(f"elastream:{{{namespace}/{name}}}:sink:audit", "-", "+")
    counts: dict[str, list[int]] = {}
    for _, fields in audit:
        counts.setdefault(fields[b"key"].decode(), []).append(int(fields[b"value"]))
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in counts.values())  # keyed counts exact
    assert sum(len(v) for v in counts.values()) == EVENTS


def test_invalid_manifests_are_refused_with_the_schema_or_cel_message(installed, kubectl, e2e_namespace, tmp_path):
    cases = {
        "grouping": ("streams", 0, "grouping", "hash", "Unsupported value"),
        "nodes": (None, None, "nodes", 0, "spec.nodes"),
        "unknown-vertex": ("streams", 0, "to", "nowhere", "every stream's to must name a vertex of spec.vertices"),
    }
    for label, (section, index, key, value, expected) in cases.items():
        doc = topology_manifest(f"bad-{label}")
        if section is None:
            doc["spec"][key] = value
        else:
            doc["spec"][section][index][key] = value
        path = tmp_path / f"{label}.yaml"
        path.write_text(yaml.safe_dump(doc))
        result = kubectl("apply", "-n", e2e_namespace, "-f", str(path), check=False)
        assert result.returncode != 0, label
        assert expected in result.stderr, (label, result.stderr)
    # what the API server cannot check (slots for the executors) becomes Degraded/InvalidSpec and an event
    # naming the field; deleting it is not held up by the finalizer
    doc = topology_manifest("too-small", nodes=1)
    doc["spec"]["slotsPerNode"] = 2
    path = tmp_path / "too-small.yaml"
    path.write_text(yaml.safe_dump(doc))
    kubectl("apply", "-n", e2e_namespace, "-f", str(path))
    kubectl("wait", "--for=condition=Degraded", "topo/too-small", "-n", e2e_namespace, "--timeout=60s")
    out = status(kubectl, e2e_namespace, "too-small")
    degraded = next(c for c in out["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "spec.slotsPerNode" in degraded["message"], degraded
    assert out["phase"] == "Failed"
    assert "InvalidSpec" in kubectl("describe", "topo", "too-small", "-n", e2e_namespace).stdout
    kubectl("delete", "topo", "too-small", "-n", e2e_namespace, "--timeout=60s")


def test_a_user_applies_scales_and_deletes_a_topology_exactly_once(installed, kubectl, e2e_namespace, tmp_path):
    client: redis.Redis = installed["redis"]
    doc = topology_manifest("clickstream")
    doc["spec"]["scaling"]["migrationScope"] = "moving"  # only what moves pauses (after the first checkpoint)
    name = apply_topology(kubectl, e2e_namespace, tmp_path, doc)
    kubectl("get", "topo", "-n", e2e_namespace)
    assert len(worker_pods(kubectl, e2e_namespace, name)) == 2
    time.sleep(6)  # a window of metrics before the first decision

    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"nodes":3}}')
    out = scaled(kubectl, e2e_namespace, name, 3, 240)
    assert out["lastScaling"]["direction"] == "out" and out["lastScaling"]["pauseMs"] is not None
    # Stela grows the congested parse: it moves, the source, the count and the sinks run on untouched
    last = out["lastScaling"]
    assert last["migrationScope"] == "moving" and 0 < last["pausedExecutors"] < last["executors"], last
    assert len(worker_pods(kubectl, e2e_namespace, name)) == 3
    kubectl("get", "topo", "-n", e2e_namespace)

    kubectl("scale", "topo", name, "-n", e2e_namespace, "--replicas=2")
    out = scaled(kubectl, e2e_namespace, name, 2, 240)
    removed = out["lastScaling"]["plan"]["removed_nodes"]
    pods = worker_pods(kubectl, e2e_namespace, name)
    deadline = time.monotonic() + 60
    while len(pods) != 2 and time.monotonic() < deadline:
        time.sleep(1)
        pods = worker_pods(kubectl, e2e_namespace, name)
    assert pods == sorted(f"{name}-{n}" for n in out["lastScaling"]["plan"]["schedule"]["nodes"])
    assert all(f"{name}-{node}" not in pods for node in removed)  # exactly the nodes ETPSum chose went
    described = kubectl("describe", "topo", name, "-n", e2e_namespace).stdout
    assert "ScalingPlanned" in described and "Scaled" in described

    check_exactly_once_and_counts(client, e2e_namespace, name)  # the sinks commit with each checkpoint

    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")
    deadline = time.monotonic() + 60
    while worker_pods(kubectl, e2e_namespace, name) and time.monotonic() < deadline:
        time.sleep(1)
    assert worker_pods(kubectl, e2e_namespace, name) == []
    assert list(client.scan_iter(match=f"elastream:{{{e2e_namespace}/{name}}}:*")) == []


def test_a_deleted_worker_pod_and_an_operator_restart_lose_nothing(installed, kubectl, e2e_namespace, tmp_path):
    client: redis.Redis = installed["redis"]
    name = apply_topology(kubectl, e2e_namespace, tmp_path, topology_manifest("resilient"))
    time.sleep(6)
    # killed without notice (a pod deleted with a grace period is drained instead: tests/e2e/test_operator_drains.py)
    kubectl("delete", "pod", f"{name}-node-1", "-n", e2e_namespace, "--grace-period=0", "--force", "--wait=false")
    out = wait_status(kubectl, e2e_namespace, name, lambda s: (s.get("lastRecovery") or {}).get("outcome"), 120,
                      "a recovery after the deleted pod")  # fmt: skip
    assert out["lastRecovery"]["outcome"] == "succeeded", out["lastRecovery"]
    assert out["lastRecovery"]["nodes"] == ["node-1"]
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=120s")

    # restart the operator while a scale-out is under way: the new one finishes or aborts it
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"nodes":3}}')
    time.sleep(1.0)
    kubectl("delete", "pod", "-n", SYSTEM, "-l", "app.kubernetes.io/component=operator", "--wait=false")
    wait_status(kubectl, e2e_namespace, name, lambda s: s.get("nodes") == 3 and s.get("readyNodes") == 3, 300,
                "three ready nodes after the operator restart")  # fmt: skip
    out_ids = sink_ids_when_complete(client, e2e_namespace, name, "out", EVENTS, 300, 5)
    assert set(out_ids) == set(range(EVENTS)), f"{len(set(range(EVENTS)) - set(out_ids))} lost"
    assert max(out_ids.values()) == 1, f"{sum((out_ids - Counter(range(EVENTS))).values())} delivered twice"


def test_the_autoscaler_recommends_then_scales_and_a_spec_parallelism_migrates(
    installed, kubectl, e2e_namespace, tmp_path
):
    client: redis.Redis = installed["redis"]
    name = "autoscaled"
    doc = topology_manifest(name)
    # parse does 250/s (4 ms) against 300/s offered: critical (LAL ≈ 1.2); recommend only at first. The
    # source runs until deleted (a limited one could finish before the operator's first Spark analysis)
    del doc["spec"]["vertices"][0]["source"]["limit"]
    doc["spec"]["scaling"]["auto"] = {"enabled": True, "maxNodes": 3, "stabilizationSeconds": 5, "execute": False}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    kubectl("apply", "-n", e2e_namespace, "-f", str(path))
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=240s")
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: (s.get("autoscaler") or {}).get("decision") == "scale-out", 180, "a recommended scale-out",
    )  # fmt: skip
    recommendation = out["autoscaler"]
    assert recommendation["execute"] is False and recommendation["vertices"]["parse"]["activity"] == "critical"
    assert recommendation["parallelism"]["parse"] >= 2
    assert "lastScaling" not in out  # nothing changed
    assert "AutoscalerRecommends" in kubectl("describe", "topo", name, "-n", e2e_namespace).stdout

    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge",
            "-p", '{"spec":{"scaling":{"auto":{"execute":true}}}}')  # fmt: skip
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: (s.get("lastScaling") or {}).get("trigger") == "autoscaler", 180, "an automatic scaling",
    )  # fmt: skip
    assert out["lastScaling"]["outcome"] == "succeeded", out["lastScaling"]
    parse = next(v for v in out["vertices"] if v["name"] == "parse")
    assert parse["parallelism"] >= 2
    spec_nodes = json.loads(kubectl("get", "topo", name, "-n", e2e_namespace, "-o", "json", quiet=True).stdout)
    assert spec_nodes["spec"]["nodes"] == out["nodes"]  # the autoscaler's node count is the desired state

    # a vertex's parallelism set in the spec: the operator migrates to it (stop the autoscaler first)
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge",
            "-p", '{"spec":{"scaling":{"auto":{"enabled":false}}}}')  # fmt: skip
    vertices = spec_nodes["spec"]["vertices"]
    index = next(i for i, v in enumerate(vertices) if v["name"] == "count")
    lower = [{"op": "replace", "path": f"/spec/vertices/{index}/parallelism", "value": 1}]
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "json", "-p", json.dumps(lower))
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: (s.get("lastScaling") or {}).get("trigger") == "spec", 180, "the spec's parallelism",
    )  # fmt: skip
    assert out["lastScaling"]["outcome"] == "succeeded", out["lastScaling"]
    assert next(v for v in out["vertices"] if v["name"] == "count")["parallelism"] == 1

    # through a recommendation, an automatic scale-out and a spec change: every event at most once at the
    # exactly-once sink, and the output goes on (the test above checks the exact total on a finite source)
    seen = sink_ids(client, e2e_namespace, name, "out")
    time.sleep(5)
    later = sink_ids(client, e2e_namespace, name, "out")
    assert sum(later.values()) > sum(seen.values()) > 0
    assert max(later.values()) == 1, f"{sum((later - Counter(set(later))).values())} events twice"
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def scheduled_by_the_scheduler(kubectl, namespace: str, pods: list[dict[str, Any]]) -> dict[str, str]:
    """pod -> its node, asserting that kube-scheduler bound it (a `Scheduled` event from default-scheduler)."""
    events = json.loads(
        kubectl(
            "get", "events", "-n", namespace, "--field-selector", "reason=Scheduled", "-o", "json", quiet=True
        ).stdout
    )["items"]
    by_scheduler = {
        e["involvedObject"]["name"]
        for e in events
        if "default-scheduler" in (e.get("reportingComponent"), (e.get("source") or {}).get("component"))
    }
    placed = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["status"] == "True", (name, scheduled)
        assert name in by_scheduler, f"{name}: no Scheduled event from default-scheduler"
        placed[name] = pod["spec"]["nodeName"]
    return placed


def test_the_readme_demo_as_shipped_fits_the_nodes_and_scales_out_and_in_exactly_once(
    installed, kubectl, e2e_namespace, tmp_path
):
    """examples/demo.yaml as the README applies it (4 nodes, each requesting 500m of a 2-CPU limit), on
    4-CPU nodes beside the chart's operator and Redis, scaled by the README's own commands. For the test
    only: an exactly-once sink fed by `parse`, and a finite source so that every event can be accounted for."""
    client: redis.Redis = installed["redis"]
    with open(DEMO, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    name = doc["metadata"]["name"]
    total = 150_000
    doc["spec"]["vertices"][0]["source"]["limit"] = total
    doc["spec"]["vertices"].append(
        {"name": "check", "sink": {"type": "redis-stream", "delivery": "exactly-once"}, "maxParallelism": 16}
    )
    doc["spec"]["streams"].append({"from": "parse", "to": "check", "grouping": "shuffle"})
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    kubectl("apply", "-n", e2e_namespace, "-f", str(path))
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=300s")
    kubectl("get", "topo,pods", "-n", e2e_namespace, "-o", "wide")
    placed = scheduled_by_the_scheduler(kubectl, e2e_namespace, pods_of(kubectl, e2e_namespace, name))
    assert len(placed) == 4
    print(f"  placed by kube-scheduler: {placed}")
    for pod in pods_of(kubectl, e2e_namespace, name):
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"]["cpu"] == "500m" and resources["limits"]["cpu"] == "2"
    time.sleep(10)  # a window of metrics before the first decision

    # README step 6 and 7, word for word but for the namespace
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"nodes":5}}')
    scaled(kubectl, e2e_namespace, name, 5, 300)
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=120s")
    placed = scheduled_by_the_scheduler(kubectl, e2e_namespace, pods_of(kubectl, e2e_namespace, name))
    assert len(placed) == 5
    kubectl("get", "pods", "-n", e2e_namespace, "-o", "wide")

    kubectl("scale", "topo", name, "-n", e2e_namespace, "--replicas=3")
    scaled(kubectl, e2e_namespace, name, 3, 300)
    deadline = time.monotonic() + 60
    while len(pods_of(kubectl, e2e_namespace, name)) != 3 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(pods_of(kubectl, e2e_namespace, name)) == 3
    kubectl("get", "topo", "-n", e2e_namespace)
    described = kubectl("describe", "topo", name, "-n", e2e_namespace).stdout
    assert "ScalingPlanned" in described and "Migrated" in described

    # 12 s: past the next checkpoint (10 s), so a duplicate would be committed by then
    ids = sink_ids_when_complete(client, e2e_namespace, name, "check", total, 420, 12)
    assert ids == Counter(range(total)), f"{len(set(range(total)) - set(ids))} lost, " + (
        f"{sum((ids - Counter(range(total))).values())} twice"
    )
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def test_a_topology_that_does_not_fit_is_reported_pending_then_starts_when_room_is_made(
    installed, kubectl, e2e_namespace, tmp_path
):
    # three pods hold 3 of each node's 4 CPUs; the operator and Redis hold 0.35 more somewhere
    hogs = [sleeper(f"hog-{i}", labels={"app": "hog"}, cpu="3") for i in range(3)]
    path = tmp_path / "hogs.yaml"
    path.write_text(yaml.safe_dump_all(hogs))
    kubectl("apply", "-n", e2e_namespace, "-f", str(path))
    kubectl("wait", "--for=condition=PodScheduled", "pod", "-l", "app=hog", "-n", e2e_namespace, "--timeout=60s")
    name = "too-big"
    doc = topology_manifest(name, nodes=2)
    doc["spec"]["resources"] = {"requests": {"cpu": "1500m"}, "limits": {"cpu": "2"}}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    kubectl("apply", "-n", e2e_namespace, "-f", str(path))
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: any(c["reason"] == "WorkersPending" for c in s.get("conditions") or []), 120, "WorkersPending",
    )  # fmt: skip
    available = next(c for c in out["conditions"] if c["type"] == "Available")
    assert available["status"] == "False" and "Insufficient cpu" in available["message"], available
    assert f"{name}-node-0" in available["message"]
    assert out["phase"] == "Pending" and out.get("readyNodes", 0) == 0
    described = kubectl("describe", "topo", name, "-n", e2e_namespace).stdout
    assert "WorkersPending" in described and "Insufficient cpu" in described
    kubectl("get", "topo,pods", "-n", e2e_namespace, "-o", "wide")

    # room is made: the scheduler places the waiting pods and the topology starts, no one touches it
    kubectl("delete", "pod", "hog-0", "hog-1", "-n", e2e_namespace, "--wait=false")
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=240s")
    out = status(kubectl, e2e_namespace, name)
    assert out["readyNodes"] == 2 and out["phase"] == "Running"
    assert not any(c["reason"] == "WorkersPending" for c in out["conditions"])
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def test_spread_over_nodes_and_placement_reach_the_scheduler(installed, kubectl, e2e_namespace, tmp_path):
    spread = topology_manifest("spread", nodes=3)
    spread["spec"]["spreadOverNodes"] = True
    pinned = topology_manifest("pinned", nodes=2)
    pinned["spec"]["placement"] = {"nodeSelector": {"topology.kubernetes.io/zone": "zone-c"}}
    for doc in (spread, pinned):
        path = tmp_path / f"{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        kubectl("apply", "-n", e2e_namespace, "-f", str(path))
    for name in ("spread", "pinned"):
        kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=240s")
    kubectl("get", "pods", "-n", e2e_namespace, "-o", "wide")
    spread_nodes = scheduled_by_the_scheduler(kubectl, e2e_namespace, pods_of(kubectl, e2e_namespace, "spread"))
    assert len(set(spread_nodes.values())) == 3, spread_nodes  # one worker per Kubernetes node
    pinned_nodes = scheduled_by_the_scheduler(kubectl, e2e_namespace, pods_of(kubectl, e2e_namespace, "pinned"))
    zones = {
        n["metadata"]["name"]: n["metadata"]["labels"].get("topology.kubernetes.io/zone")
        for n in json.loads(kubectl("get", "nodes", "-o", "json", quiet=True).stdout)["items"]
    }
    assert {zones[node] for node in pinned_nodes.values()} == {"zone-c"}, pinned_nodes
    for name in ("spread", "pinned"):
        kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


# ------------------------------------------------------------------------------------------------- issue 19


def apply_topology(kubectl, namespace: str, tmp_path, doc: dict[str, Any]) -> str:
    name = doc["metadata"]["name"]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    kubectl("apply", "-n", namespace, "-f", str(path))
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", namespace, "--timeout=240s")
    return name


def event_reasons(kubectl, namespace: str, name: str) -> list[str]:
    out = kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json", quiet=True
    )  # fmt: skip
    return [e["reason"] for e in json.loads(out.stdout)["items"]]


def events_of(kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    out = kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json", quiet=True
    )  # fmt: skip
    return json.loads(out.stdout)["items"]


def assert_exactly_once(client: redis.Redis, namespace: str, name: str, timeout_s: float = 300) -> None:
    out_ids = sink_ids_when_complete(client, namespace, name, "out", EVENTS, timeout_s, 5)
    assert out_ids == Counter(range(EVENTS)), f"{len(set(range(EVENTS)) - set(out_ids))} lost, " + (
        f"{sum((out_ids - Counter(range(EVENTS))).values())} twice"
    )
    counts: dict[str, list[int]] = {}
    for _, fields in client.xrange(f"elastream:{{{namespace}/{name}}}:sink:audit", "-", "+"):
        counts.setdefault(fields[b"key"].decode(), []).append(int(fields[b"value"]))
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in counts.values())  # keyed counts exact
    assert sum(len(v) for v in counts.values()) == EVENTS


def test_a_burst_of_four_patches_converges_on_the_last_value_exactly_once(installed, kubectl, e2e_namespace, tmp_path):
    client: redis.Redis = installed["redis"]
    name = apply_topology(kubectl, e2e_namespace, tmp_path, topology_manifest("burst", nodes=2))
    time.sleep(6)  # a window of metrics before the first decision
    for nodes in (3, 4, 2, 3):  # within about a second
        kubectl(
            "patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", json.dumps({"spec": {"nodes": nodes}})
        )
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: s.get("nodes") == 3 and s.get("readyNodes") == 3 and s.get("phase") == "Running", 240, "3 nodes",
    )  # fmt: skip
    assert out["lastScaling"]["fromNodes"] == 2 and out["lastScaling"]["toNodes"] == 3, out["lastScaling"]
    planned = [e for e in events_of(kubectl, e2e_namespace, name) if e["reason"] == "ScalingPlanned"]
    assert len(planned) == 1 and planned[0]["count"] == 1, [e["message"] for e in planned]  # never via 4 or 2
    assert len(worker_pods(kubectl, e2e_namespace, name)) == 3
    assert_exactly_once(client, e2e_namespace, name)
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def test_an_unschedulable_scale_out_leaves_the_old_schedule_running_and_leaks_no_pod(
    installed, kubectl, e2e_namespace, tmp_path
):
    # pinned to one 4-CPU node at 1.5 CPU a worker: two fit, a third cannot be placed anywhere it may go
    doc = topology_manifest("pinned-out", nodes=2)
    doc["spec"]["resources"] = {"requests": {"cpu": "1500m"}, "limits": {"cpu": "2"}}
    doc["spec"]["placement"] = {"nodeSelector": {"topology.kubernetes.io/zone": "zone-b"}}
    name = apply_topology(kubectl, e2e_namespace, tmp_path, doc)
    time.sleep(6)
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"nodes":3}}')
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: (s.get("lastScaling") or {}).get("outcome") == "failed", 240, "the scale-out to fail",
    )  # fmt: skip
    assert out["phase"] == "Running" and out["nodes"] == 2 and out["readyNodes"] == 2, out
    degraded = next(c for c in out["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ScalingFailed", degraded
    assert "not staged" in degraded["message"] and "nothing was paused" in out["lastScaling"]["reason"]
    warnings = {e["reason"]: e["message"] for e in events_of(kubectl, e2e_namespace, name) if e["type"] == "Warning"}
    assert "Insufficient cpu" in warnings.get("WorkersPending", ""), warnings
    assert "ScalingBackoff" in warnings
    deadline = time.monotonic() + 60  # the pod made for the third node is deleted, not left Pending
    while len(worker_pods(kubectl, e2e_namespace, name)) != 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert worker_pods(kubectl, e2e_namespace, name) == [f"{name}-node-0", f"{name}-node-1"]
    # the user takes the request back: nothing to retry, nothing degraded
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"nodes":2}}')
    wait_status(
        kubectl, e2e_namespace, name,
        lambda s: any(c["type"] == "Degraded" and c["status"] == "False" for c in s.get("conditions") or []),
        60, "Degraded cleared",
    )  # fmt: skip
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def test_the_bundled_redis_pod_deleted_loses_nothing(installed, kubectl, e2e_namespace, tmp_path):
    client: redis.Redis = installed["redis"]
    name = apply_topology(kubectl, e2e_namespace, tmp_path, topology_manifest("redis-restart", nodes=2))
    time.sleep(8)
    kubectl("delete", "pod", f"{RELEASE}-redis-0", "-n", SYSTEM, "--wait=false")
    time.sleep(3)
    kubectl("wait", "--for=condition=Ready", "pod", f"{RELEASE}-redis-0", "-n", SYSTEM, "--timeout=180s")
    # the StatefulSet's new pod mounts the same claim: the append-only file brings every key back
    wait_status(
        kubectl, e2e_namespace, name,
        lambda s: s.get("phase") == "Running" and s.get("readyNodes") == 2, 180, "Running again",
    )  # fmt: skip
    assert_exactly_once(client, e2e_namespace, name)
    reasons = event_reasons(kubectl, e2e_namespace, name)
    assert "StateLost" not in reasons
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def test_a_redis_emptied_under_a_running_topology_is_state_lost_not_duplicates(
    installed, kubectl, e2e_namespace, tmp_path
):
    client: redis.Redis = installed["redis"]
    name = apply_topology(kubectl, e2e_namespace, tmp_path, topology_manifest("emptied", nodes=2))
    time.sleep(8)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(kubectl, e2e_namespace, name)}
    epoch = status(kubectl, e2e_namespace, name)["stateEpoch"]
    for key in client.scan_iter(match=f"elastream:{{{e2e_namespace}/{name}}}:*"):
        client.delete(key)  # this topology's state gone (as FLUSHALL would, without touching other tests)
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: any(c["reason"] == "StateLost" for c in s.get("conditions") or []), 60, "StateLost",
    )  # fmt: skip
    assert out["phase"] == "Degraded"
    time.sleep(10)
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(kubectl, e2e_namespace, name)}
    assert after == before  # no worker restarted from the empty store
    assert 0 not in sink_ids(client, e2e_namespace, name, "out")  # no source started over from its first event
    assert event_reasons(kubectl, e2e_namespace, name).count("StateLost") == 1
    # the user's choice: start over from scratch
    kubectl("annotate", "topo", name, "-n", e2e_namespace, "elastream.dev/restart-from-scratch=true")
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: s.get("phase") == "Running" and s.get("stateEpoch") not in (None, epoch), 240, "a fresh start",
    )  # fmt: skip
    annotations = json.loads(kubectl("get", "topo", name, "-n", e2e_namespace, "-o", "json", quiet=True).stdout)
    assert "elastream.dev/restart-from-scratch" not in (annotations["metadata"].get("annotations") or {})
    assert "StateReset" in event_reasons(kubectl, e2e_namespace, name)
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def test_the_api_server_away_for_a_minute_stops_no_worker_and_the_operator_catches_up(
    installed, kubectl, e2e_namespace, tmp_path, control_plane
):
    client: redis.Redis = installed["redis"]
    doc = topology_manifest("api-away", nodes=2)
    doc["spec"]["vertices"][0]["source"]["limit"] = EVENTS * 3  # 90 s of input: it runs through the outage
    name = apply_topology(kubectl, e2e_namespace, tmp_path, doc)
    time.sleep(6)
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(kubectl, e2e_namespace, name)}
    samples = f"elastream:{{{e2e_namespace}/{name}}}:metrics"
    processed_before = _processed(client, samples)
    control_plane.apiserver_outage(60.0)
    # the workers never talk to the API server: they processed all along (their samples say so)
    assert _processed(client, samples) > processed_before + 300 * 30  # half the outage's input, at least
    # the operator catches up: the same pods, Running, and a scaling asked for after the outage happens
    try:
        wait_status(kubectl, e2e_namespace, name, lambda s: s.get("phase") == "Running", 240, "Running after")
        kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"nodes":3}}')
        wait_status(
            kubectl, e2e_namespace, name,
            lambda s: s.get("nodes") == 3 and s.get("readyNodes") == 3, 240, "3 nodes after the outage",
        )  # fmt: skip
    except BaseException:
        kubectl("get", "pods,lease", "-n", SYSTEM, "-o", "wide", check=False)
        for flag in ("--previous", "--timestamps"):
            kubectl("logs", "-n", SYSTEM, "-l", "app.kubernetes.io/component=operator", flag, "--tail=120",
                    check=False)  # fmt: skip
        raise
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(kubectl, e2e_namespace, name)}
    assert {n: after[n] for n in pods} == pods  # no worker replaced
    out_ids = sink_ids_when_complete(client, e2e_namespace, name, "out", EVENTS * 3, 300, 5)
    assert out_ids == Counter(range(EVENTS * 3)), f"{len(set(range(EVENTS * 3)) - set(out_ids))} lost, " + (
        f"{sum((out_ids - Counter(range(EVENTS * 3))).values())} twice"
    )
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def _processed(client: redis.Redis, stream: str) -> int:
    """Events processed by the topology's `out` sink so far, from the newest metric sample of each executor."""
    newest: dict[str, int] = {}
    for _, fields in client.xrevrange(stream, "+", "-", count=500):
        sample = {k.decode(): v.decode() for k, v in fields.items()}
        if sample.get("vertex") == "out":
            newest.setdefault(sample["executor"], int(float(sample.get("processed", 0))))
    return sum(newest.values())


# ------------------------------------------------------------------------------------------------- issue 21

ATTACK_SCRIPT = os.path.join(os.path.dirname(__file__), "tenant_attack.py")


def refused_handshakes(kubectl, namespace: str, name: str) -> float:
    """The topology's workers' `elastream_data_plane_refused_handshakes_total`, summed (scraped on their pod IPs)."""
    import urllib.request

    total = 0.0
    for pod in pods_of(kubectl, namespace, name):
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9100/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("elastream_data_plane_refused_handshakes_total{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def start_attacker(kubectl, tmp_path, attacker: tuple[str, str], victim: tuple[str, str], endpoint: str) -> str:
    """A pod in the attacker's namespace with exactly its worker's credentials (the topology's Secret and the Redis CA
    of its ConfigMap) and image, running tests/e2e/tenant_attack.py against the victim."""
    (namespace, name), (victim_ns, victim_name) = attacker, victim
    image = pods_of(kubectl, namespace, name)[0]["spec"]["containers"][0]["image"]
    with open(ATTACK_SCRIPT) as file:
        script = file.read()
    secret = f"{name}-redis"
    docs = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "attack"}, "data": {"attack.py": script}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "attacker"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                "containers": [
                    {
                        "name": "attack",
                        "image": image,
                        "command": ["python", "/attack/attack.py"],
                        "env": [
                            {
                                "name": "ELASTREAM_REDIS_URL",
                                "valueFrom": {"secretKeyRef": {"name": secret, "key": "url"}},
                            },
                            *(
                                {
                                    "name": f"ELASTREAM_DATA_PLANE_{k.upper()}_KEY",
                                    "valueFrom": {"secretKeyRef": {"name": secret, "key": f"dataPlane{k}Key"}},
                                }
                                for k in ("Server", "Client")
                            ),
                            {"name": "OWN_PREFIX", "value": f"elastream:{{{namespace}/{name}}}:"},
                            {"name": "VICTIM_PREFIX", "value": f"elastream:{{{victim_ns}/{victim_name}}}:"},
                            {"name": "VICTIM_ENDPOINT", "value": endpoint},
                        ],
                        "volumeMounts": [
                            {"name": "attack", "mountPath": "/attack"},
                            {"name": "ca", "mountPath": "/etc/elastream"},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "attack", "configMap": {"name": "attack"}},
                    {
                        "name": "ca",
                        "configMap": {
                            "name": f"{name}-topology",
                            "items": [{"key": "redis-ca.crt", "path": "redis-ca.crt"}],
                        },
                    },
                ],
            },
        },
    ]
    path = tmp_path / f"attacker-{namespace}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    kubectl("apply", "-n", namespace, "-f", str(path))
    return namespace


def attack_report(kubectl, namespace: str) -> dict[str, Any]:
    kubectl(
        "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/attacker", "-n", namespace, "--timeout=180s"
    )  # fmt: skip
    lines = [ln for ln in kubectl("logs", "-n", namespace, "attacker").stdout.splitlines() if ln.startswith("{")]
    assert lines, "the attacker printed no report"
    return json.loads(lines[-1])


def test_two_tenants_cannot_reach_each_others_keys_or_sockets(installed, kubectl, e2e_namespace, tmp_path):
    """Two tenants, two namespaces, the chart's defaults (per-topology ACL users, Redis over TLS only, CURVE,
    NetworkPolicies). Each tenant's worker credentials and image try the other's Redis keys, control lists, metric
    stream and data-plane sockets; every attempt is refused, and both topologies run exactly once meanwhile."""
    client: redis.Redis = installed["redis"]
    tenant_b = f"{e2e_namespace[:50]}-b"
    kubectl("create", "namespace", tenant_b)
    try:
        tenants = [(e2e_namespace, "alpha"), (tenant_b, "beta")]
        for namespace, name in tenants:
            apply_topology(kubectl, namespace, tmp_path, topology_manifest(name, nodes=2))
        # what the chart's defaults put in place
        users = " ".join(u.decode() if isinstance(u, bytes) else str(u) for u in client.acl_users())
        for namespace, name in tenants:
            url = kubectl("get", "secret", f"{name}-redis", "-n", namespace, "-o", "jsonpath={.data.url}", quiet=True)
            worker_url = base64.b64decode(url.stdout).decode()
            assert worker_url.startswith("rediss://") and installed["password"] not in worker_url
            assert namespace in users and name in users, users  # one ACL user per topology
            kubectl("get", "networkpolicy", f"{name}-workers", "-n", namespace)
        kubectl("get", "networkpolicy", f"{RELEASE}-redis", "-n", SYSTEM)
        plain = redis.Redis(host=installed["host"], port=6379, password=installed["password"], socket_timeout=5)
        with pytest.raises(redis.ConnectionError):
            plain.ping()  # no plain-text port: TLS only
        before = {t: refused_handshakes(kubectl, *t) for t in tenants}
        started = []
        for attacker, victim in ((tenants[0], tenants[1]), (tenants[1], tenants[0])):
            prefix = f"elastream:{{{victim[0]}/{victim[1]}}}:"
            version = json.loads(client.get(f"{prefix}schedule"))["version"]
            endpoint = client.hget(f"{prefix}endpoints:{version}", "count#0").decode()
            started.append((start_attacker(kubectl, tmp_path, attacker, victim, endpoint), attacker, victim))
        for namespace, attacker, victim in started:
            report = attack_report(kubectl, namespace)
            print(f"  {attacker} -> {victim}: {json.dumps(report)}")
            tried = dict(report["redis"])
            assert tried.pop("own SET") == "allowed", report  # its credentials work: the refusals are ACLs
            assert all(outcome == "NOPERM" for outcome in tried.values()), tried
            assert attacker[0] in report["whoami"] and attacker[1] in report["whoami"], report
            assert refused_handshakes(kubectl, *victim) > before[victim], "the victim counted no refused handshake"
        for namespace, name in tenants:
            assert_exactly_once(client, namespace, name)
            prefix = f"elastream:{{{namespace}/{name}}}:"
            assert client.get(f"{prefix}attack") is None  # nothing written across
    finally:
        kubectl("delete", "namespace", tenant_b, "--wait=false", check=False)
