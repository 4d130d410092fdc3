"""Savepoints and the deletion policy end to end, with the real kubectl and helm against a real API server: a
user annotates a running topology to take a savepoint shared with another namespace, deletes the topology
(deletionPolicy Delete: its keys go, the savepoint stays), and starts a NEW topology under another name in
that other namespace from the savepoint. Its keyed counts continue exactly from the savepoint's and every
event reaches the sinks exactly once across the two topologies (exactly-once sinks: the first topology's
output up to the entries the savepoint says were committed with it, then the second's). A third namespace,
not granted, is refused with InvalidSpec naming the fix; the second topology, deletionPolicy Retain, leaves
its keys when deleted.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest
import redis

from support.waiting import wait_until

from .test_operator import (
    EVENTS,
    apply_topology,
    event_reasons,
    topology_manifest,
    wait_status,
    worker_pods,
)

pytestmark = pytest.mark.e2e

RATE = 150  # 9000 events in a minute: the savepoint lands mid-stream


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    doc = topology_manifest(name, nodes=2)
    doc["spec"]["vertices"][0]["source"]["rate"] = RATE
    doc["spec"].update(spec)
    return doc


def entries(client: redis.Redis, namespace: str, name: str, sink: str, last: str = "+") -> list[dict[str, str]]:
    raw = client.xrange(f"elastream:{{{namespace}/{name}}}:sink:{sink}", "-", last)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]


def keys_of(client: redis.Redis, namespace: str, name: str) -> list[bytes]:
    return list(client.scan_iter(match=f"elastream:{{{namespace}/{name}}}:*", count=1000))


def test_a_savepoint_outlives_its_topology_and_a_new_one_continues_the_counts_exactly(
    installed, kubectl, e2e_namespace, tmp_path
):
    client: redis.Redis = installed["redis"]
    ns_a, ns_b, ns_c = e2e_namespace, f"{e2e_namespace}-b", f"{e2e_namespace}-c"
    for extra in (ns_b, ns_c):
        kubectl("create", "namespace", extra)
    try:
        # ---- the first topology runs; a savepoint mid-stream, shared with ns_b
        first = apply_topology(kubectl, ns_a, tmp_path, manifest("orders"))
        time.sleep(8)
        kubectl("annotate", "topo", first, "-n", ns_a,
                "elastream.dev/savepoint=mid-stream", f"elastream.dev/savepoint-share-with={ns_b}")  # fmt: skip
        out = wait_status(kubectl, ns_a, first, lambda s: s.get("savepoints"), 120, "status.savepoints")
        (taken,) = out["savepoints"]
        assert taken["name"] == "mid-stream" and taken["sharedWith"] == [ns_b] and taken["checkpoint"]
        committed = taken["committedOutput"]
        assert set(committed) == {"out", "audit"}
        body = json.loads(kubectl("get", "topo", first, "-n", ns_a, "-o", "json", quiet=True).stdout)
        assert "elastream.dev/savepoint" not in body["metadata"].get("annotations", {})  # done: removed
        assert "SavepointTaken" in event_reasons(kubectl, ns_a, first)
        # what the first topology committed up to the savepoint (read before its keys go with it)
        before = {sink: entries(client, ns_a, first, sink, committed[sink]) for sink in ("out", "audit")}
        assert 0 < len(before["out"]) < EVENTS, "the savepoint should land mid-stream"
        time.sleep(4)  # it runs on: more output committed after the savepoint, which the new one must not repeat

        # ---- deleted with the default deletionPolicy (Delete): its keys go, the savepoint stays
        kubectl("delete", "topo", first, "-n", ns_a, "--timeout=120s")
        wait_until(lambda: worker_pods(kubectl, ns_a, first) == [], 60, "the first topology's pods gone", poll_s=1.0)
        assert keys_of(client, ns_a, first) == []
        assert client.exists(f"elastream:savepoint:{{{ns_a}/{first}}}:mid-stream:meta") == 1

        # ---- a namespace the savepoint was not shared with is refused, naming the fix; nothing starts
        reference = {"name": "mid-stream", "topology": first, "namespace": ns_a}
        path = tmp_path / "stranger.yaml"
        path.write_text(json.dumps(manifest("stranger", initialSavepoint=reference)))
        kubectl("apply", "-n", ns_c, "-f", str(path))
        refused = wait_status(
            kubectl, ns_c, "stranger",
            lambda s: any(c["type"] == "Stalled" and c["status"] == "True" for c in s.get("conditions", [])),
            120, "Stalled (InvalidSpec)",
        )  # fmt: skip
        stalled = next(c for c in refused["conditions"] if c["type"] == "Stalled")
        assert stalled["reason"] == "InvalidSpec", stalled
        assert f"not shared with namespace {ns_c}" in stalled["message"]
        assert f"elastream.dev/savepoint-share-with={ns_c}" in stalled["message"]
        assert worker_pods(kubectl, ns_c, "stranger") == []

        # ---- a NEW topology under another name, in ns_b, from the savepoint; deletionPolicy Retain
        second = apply_topology(
            kubectl, ns_b, tmp_path, manifest("orders-v2", initialSavepoint=reference, deletionPolicy="Retain")
        )
        assert "RestoredFromSavepoint" in event_reasons(kubectl, ns_b, second)
        wait_until(
            lambda: len(before["out"]) + len(entries(client, ns_b, second, "out")) >= EVENTS,
            300,
            "the second topology's sinks complete",
            poll_s=1.0,
        )
        time.sleep(6)  # anything beyond (a duplicate) would have arrived by now
        after = {sink: entries(client, ns_b, second, sink) for sink in ("out", "audit")}
        ids = Counter(int(e["id"]) for e in before["out"] + after["out"])
        assert ids == Counter(range(EVENTS)), (
            f"{len(set(range(EVENTS)) - set(ids))} lost, {sum((ids - Counter(range(EVENTS))).values())} twice"
        )
        counts: dict[str, list[int]] = {}
        for event in before["audit"] + after["audit"]:
            counts.setdefault(event["key"], []).append(int(event["value"]))
        assert all(sorted(v) == list(range(1, len(v) + 1)) for v in counts.values())  # keyed counts exact
        assert sum(len(v) for v in counts.values()) == EVENTS
        # the second topology's counts continue the first's: none of them starts again at 1 for a key counted
        counted_before = {e["key"] for e in before["audit"]}
        assert all(int(e["value"]) > 1 for e in after["audit"] if e["key"] in counted_before)

        # ---- deleted with deletionPolicy Retain: its pods go, its keys stay
        kubectl("delete", "topo", second, "-n", ns_b, "--timeout=120s")
        wait_until(lambda: worker_pods(kubectl, ns_b, second) == [], 60, "the second topology's pods gone", poll_s=1.0)
        kept = keys_of(client, ns_b, second)
        assert any(k.endswith(b":sink:out") for k in kept) and any(k.endswith(b":ckpt:latest") for k in kept)
    finally:
        for namespace, name in ((ns_b, "orders-v2"), (ns_a, "orders")):
            for key in keys_of(client, namespace, name):
                client.unlink(key)
        for key in client.scan_iter(match=f"elastream:savepoint:{{{ns_a}/orders}}:*"):
            client.unlink(key)
        for extra in (ns_b, ns_c):
            kubectl("delete", "namespace", extra, "--wait=false", check=False)
