"""Graceful drains end to end, with the real kubectl and helm against a real API server: the chart as installed
by default keeps a PodDisruptionBudget per topology, which the API server's Eviction API honours (one worker
evicted, a second at once refused); the evicted worker pod (deleted with its grace period, as `kubectl drain`
does) is drained by CCR (its executors moved to the other workers, nothing replayed, no
recovery) and the topology gets its node count back on a fresh pod; a worker pod killed without notice
(`--grace-period=0 --force`) is a lost worker, rolled back to the last checkpoint. Every event reaches the
exactly-once sink once across both.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import redis

from support.waiting import wait_until

from .test_operator import (
    EVENTS,
    apply_topology,
    event_reasons,
    pods_of,
    sink_ids_when_complete,
    status,
    topology_manifest,
    wait_status,
)

pytestmark = pytest.mark.e2e


def test_a_deleted_worker_pod_is_drained_by_ccr_and_a_killed_one_rolled_back(
    installed, kubectl, e2e_namespace, tmp_path
):
    client: redis.Redis = installed["redis"]
    name = apply_topology(kubectl, e2e_namespace, tmp_path, topology_manifest("drained", nodes=3))

    # the topology's PodDisruptionBudget: one of its worker pods at a time, owned by it
    pdb = disruption_budget(kubectl, e2e_namespace, name)
    assert pdb["spec"]["maxUnavailable"] == 1, pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == name
    assert [o["kind"] for o in pdb["metadata"]["ownerReferences"]] == ["StreamTopology"]
    worker = next(p for p in pods_of(kubectl, e2e_namespace, name) if p["metadata"]["name"] == f"{name}-node-1")
    assert worker["spec"]["terminationGracePeriodSeconds"] == 30
    time.sleep(6)  # periodic checkpoints (every 2 s): a rollback would have one to go back to

    # evicted as `kubectl drain` does (the Eviction API, which the budget guards; the pod's grace period, which
    # the kubelet stand-in caps at 10 s): drained, not lost. The budget lets one worker go, not a second at once.
    wait_until(
        lambda: (disruption_budget(kubectl, e2e_namespace, name).get("status") or {}).get("disruptionsAllowed") == 1,
        120,
        "the disruption controller allowing one disruption",
        poll_s=1.0,
    )
    assert evict(kubectl, e2e_namespace, f"{name}-node-1").returncode == 0
    refused = evict(kubectl, e2e_namespace, f"{name}-node-2")
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr
    out = wait_status(
        kubectl, e2e_namespace, name,
        lambda s: ((s.get("lastDrain") or {}).get("refill") or {}).get("outcome"), 180, "a drain and its refill",
    )  # fmt: skip
    drain = out["lastDrain"]
    print(f"  lastDrain: {json.dumps(drain)[:1500]}")
    assert drain["node"] == "node-1" and drain["outcome"] == "succeeded", drain
    assert drain["migration"] == "ccr" and drain["replayed"] == 0 and drain["lost"] == 0, drain
    assert drain["moves"] and all(m["from"] == "node-1" and m["to"] != "node-1" for m in drain["moves"])
    assert drain["refill"]["outcome"] == "succeeded", drain["refill"]
    assert "lastRecovery" not in out, out["lastRecovery"]
    out = wait_status(kubectl, e2e_namespace, name, lambda s: s.get("nodes") == 3 and s.get("readyNodes") == 3, 180,
                      "three ready nodes after the drain")  # fmt: skip
    assert "lastRecovery" not in out
    pods = sorted(p["metadata"]["name"] for p in pods_of(kubectl, e2e_namespace, name, terminating=True))
    assert f"{name}-node-1" not in pods and len(pods) == 3, pods
    seen = event_reasons(kubectl, e2e_namespace, name)
    assert "Drained" in seen and "WorkerLost" not in seen and "Recovered" not in seen, Counter(seen)

    # killed without notice: a lost worker, rolled back to the last checkpoint
    kubectl("delete", "pod", f"{name}-node-0", "-n", e2e_namespace, "--grace-period=0", "--force", "--wait=false")
    out = wait_status(kubectl, e2e_namespace, name, lambda s: (s.get("lastRecovery") or {}).get("outcome"), 180,
                      "a recovery after the killed pod")  # fmt: skip
    recovery = out["lastRecovery"]
    assert recovery["outcome"] == "succeeded" and recovery["nodes"] == ["node-0"], recovery
    assert recovery.get("restoredFrom"), recovery
    assert "WorkerLost" in event_reasons(kubectl, e2e_namespace, name)
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=180s")

    out_ids = sink_ids_when_complete(client, e2e_namespace, name, "out", EVENTS, 300, 5)
    assert set(out_ids) == set(range(EVENTS)), f"{len(set(range(EVENTS)) - set(out_ids))} lost"
    assert max(out_ids.values()) == 1, f"{sum((out_ids - Counter(range(EVENTS))).values())} delivered twice"
    assert status(kubectl, e2e_namespace, name)["lastDrain"]["node"] == "node-1"
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")


def disruption_budget(kubectl, namespace: str, name: str) -> dict:
    return json.loads(kubectl("get", "pdb", f"{name}-workers", "-n", namespace, "-o", "json", quiet=True).stdout)


def evict(kubectl, namespace: str, pod: str):
    """An Eviction of `pod` through the API (what `kubectl drain` sends for each pod): refused with 429 while it
    would break a PodDisruptionBudget."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    return kubectl("create", "--raw", path, "-f", "-", input=json.dumps(eviction), check=False)
