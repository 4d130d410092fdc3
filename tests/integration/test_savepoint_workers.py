"""Savepoints on real worker processes, a real Redis and the real controller of local mode: the same
`take_savepoint` / `restore_initial_savepoint` the operator's reconcile loop calls.

A diamond of keyed counts with an audit sink after each stateful vertex and exactly-once sinks runs; a
savepoint is taken in the middle of its stream; it runs on (more checkpoints commit more output), then it is
stopped and its keys deleted (what `deletionPolicy: Delete` does) while the savepoint stays. A NEW topology
under another name, on another node count, starts from the savepoint: its keyed counts continue exactly from
the savepoint's (the audit sinks' counts of the first topology up to the savepoint and of the second one
together are exactly 1..n per key), and every event reaches the sinks exactly once across the two (the first
topology's output up to the savepoint's committed entry, then the second's). An incompatible topology and one
of another namespace without a grant are refused, naming the fix.
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict

import pytest
from test_control_faults import Events, ticking
from test_migration import differences, load

from elastream.analysis import Analyzer
from elastream.control.backends.local import LocalCluster
from elastream.control.lifecycle import delete_keys
from elastream.control.local_mode import local_controller
from elastream.control.savepoint_actions import SavepointError, restore_initial_savepoint, take_savepoint
from elastream.core.schedule import initial_schedule
from elastream.crd import load_manifest
from elastream.store.savepoint_store import SavepointStore
from support.harness import expected_copies, id_counts, sink_key, wait_for_sinks_idle, with_audit, write_manifest
from support.harness import ticking as ticking_in_background

pytestmark = pytest.mark.integration

RATE = 200
EVENTS = 5000


def manifest(name: str, nodes: int) -> dict:
    doc = with_audit(load("ccr-diamond"), EVENTS)
    doc["metadata"]["name"] = name
    for vertex in doc["spec"]["vertices"]:
        if "source" in vertex:
            vertex["source"]["rate"] = RATE
        if "sink" in vertex:
            vertex["sink"]["delivery"] = "exactly-once"
    doc["spec"]["nodes"] = nodes
    doc["spec"]["scaling"]["checkpointIntervalSeconds"] = 2
    return doc


def entries(cluster: LocalCluster, topology, sink: str, last: str = "+") -> list[dict[str, str]]:
    raw = cluster.client.xrange(sink_key(topology, sink), "-", last)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]


@pytest.mark.timeout(900)
def test_a_new_topology_started_from_a_savepoint_continues_the_keyed_counts_exactly(tmp_path, redis_url) -> None:
    analyzer = Analyzer(engine="python")
    first_doc = manifest("sp-first", nodes=3)
    first_path = write_manifest(str(tmp_path), first_doc)
    first = load_manifest(first_path)

    # ---- the first topology runs; a savepoint mid-stream; it runs on, then is deleted
    cluster = LocalCluster(first, first_path, redis_url, interval_s=0.5)
    controller = local_controller(first, cluster, analyzer, events=Events())
    with cluster, controller:
        controller.start()
        ticking(controller, 6.0)
        meta = take_savepoint(cluster.client, controller, "mid-stream", share_with=("team-b",))
        assert meta.checkpoint and set(meta.vertices) == set(first.order)
        assert set(meta.committed_output) == set(first.sinks)  # every sink is exactly-once here
        taken_at_output = {s: entries(cluster, first, s, meta.committed_output[s]) for s in first.sinks}
        assert sum(len(e) for e in taken_at_output.values()) > 0  # mid-stream: some output committed before it
        with pytest.raises(SavepointError, match="exists already"):
            take_savepoint(cluster.client, controller, "mid-stream")
        ticking(controller, 4.0)  # more checkpoints commit more output after the savepoint
        after = {s: len(entries(cluster, first, s)) for s in first.sinks}
        assert sum(after.values()) > sum(len(e) for e in taken_at_output.values())
    client = cluster.client
    delete_keys(client, first.redis_prefix)
    assert list(client.scan_iter(match="elastream:{default/sp-first}:*")) == []
    assert [m.name for m in SavepointStore(client, "default", "sp-first").list()] == ["mid-stream"]  # kept

    # ---- refused: another namespace without a grant, other key spaces
    stranger = copy.deepcopy(first_doc)
    stranger["metadata"].update(name="stranger", namespace="team-c")
    stranger["spec"]["initialSavepoint"] = {"name": "mid-stream", "topology": "sp-first", "namespace": "default"}
    with pytest.raises(SavepointError, match="not shared with namespace team-c") as refused:
        restore_initial_savepoint(client, load_manifest(write_manifest(str(tmp_path), stranger)))
    assert not refused.value.retry
    other = copy.deepcopy(first_doc)
    other["metadata"]["name"] = "other-keys"
    other["spec"]["initialSavepoint"] = {"name": "mid-stream", "topology": "sp-first"}
    next(v for v in other["spec"]["vertices"] if v["name"] == "t3")["maxParallelism"] = 8
    with pytest.raises(SavepointError, match="maxParallelism of t3 16 \\(here 8\\)"):
        restore_initial_savepoint(client, load_manifest(write_manifest(str(tmp_path), other)))
    missing = copy.deepcopy(other)
    missing["spec"]["initialSavepoint"] = {"name": "nope", "topology": "sp-first"}
    with pytest.raises(SavepointError, match="no savepoint nope") as absent:
        restore_initial_savepoint(client, load_manifest(write_manifest(str(tmp_path), missing)))
    assert absent.value.retry

    # ---- a NEW topology under another name and node count starts from it
    second_doc = manifest("sp-second", nodes=2)
    second_doc["spec"]["initialSavepoint"] = {"name": "mid-stream", "topology": "sp-first"}
    second_path = write_manifest(str(tmp_path), second_doc)
    second = load_manifest(second_path)
    used = restore_initial_savepoint(client, second)
    assert used is not None and used.name == "mid-stream"
    log = Events()
    cluster = LocalCluster(second, second_path, redis_url, interval_s=0.5)
    controller = local_controller(second, cluster, analyzer, events=log)
    with cluster, controller:
        controller.start(initial_schedule(second))
        assert "Recovered" in log.reasons()  # restored from the seeded checkpoint, not started empty
        assert restore_initial_savepoint(client, second) is None  # it has state of its own now
        with ticking_in_background(controller):
            wait_for_sinks_idle(cluster, second, quiet_s=10.0, timeout_s=600.0)
        truth = expected_copies(second, range(EVENTS))
        for sink in second.sinks:
            before, now = taken_at_output[sink], entries(cluster, second, sink)
            got = id_counts(before) + id_counts(now)
            assert got == truth[sink], f"{sink}: " + differences(truth[sink], got)
            if sink.startswith("audit-"):
                per_key: dict[str, list[int]] = defaultdict(list)
                for event in before + now:
                    per_key[event["key"]].append(int(event["value"]))
                for key, counts in per_key.items():
                    assert sorted(counts) == list(range(1, len(counts) + 1)), f"{sink} key {key}"
                # and the new topology really continued counts: its first count of a key is past 1
                continued = Counter(int(e["value"]) > 1 for e in now)
                assert continued[True] > 0

    # ---- the CLI lists and deletes a savepoint of a topology that is gone
    from elastream.cli import main

    assert main(["savepoint", "list", "--topology", "sp-first", "--redis", redis_url, "--json"]) == 0
    assert main(["savepoint", "delete", "mid-stream", "--topology", "sp-first", "--redis", redis_url]) == 0
    assert SavepointStore(client, "default", "sp-first").list() == []
    assert list(client.scan_iter(match="elastream:savepoint:{default/sp-first}:*")) == []  # nothing left behind
    assert main(["savepoint", "delete", "mid-stream", "--topology", "sp-first", "--redis", redis_url]) == 1


def test_a_copy_cut_short_is_never_listed_and_the_next_take_of_its_name_replaces_it(redis_url) -> None:
    import redis

    from elastream.core.savepoint_rules import SavepointMeta

    client = redis.Redis.from_url(redis_url)
    store = SavepointStore(client, "cut", "short")
    # what a copy interrupted before its meta leaves: state and positions, no meta, no index entry
    client.hset("elastream:savepoint:{cut/short}:sp:state:count", mapping={"3": b"stale"})
    client.hset("elastream:savepoint:{cut/short}:sp:position", mapping={"src#0": b"old"})
    assert store.list() == [] and store.load("sp") is None
    meta = SavepointMeta("sp", "cut", "short", "ckpt-9", "2026-01-01T00:00:00Z", {"count": 4, "src": 4})
    store.save(meta, {"count": {"1": b"one"}}, {"src#0": b"new"})
    loaded = store.load("sp")
    assert loaded is not None
    assert loaded == (meta, {"count": {"1": b"one"}}, {"src#0": b"new"})  # nothing of the stale copy
    assert [m.name for m in store.list()] == ["sp"]
    assert client.ttl("elastream:savepoint:{cut/short}:sp:state:count") == -1  # retained: no TTL
    assert store.delete("sp") and store.list() == []
    assert list(client.scan_iter(match="elastream:savepoint:{cut/short}:*")) == []
