"""elastream on a real Redis Cluster: three primaries with a replica each, redis-server processes on loopback
(`tests/redis_cluster.py`), named by `redis+cluster://`. Every key of a topology lands in its tag's slot,
topologies spread over the primaries, `elastream run` scales out and in exactly once, and a primary failing
over to its replica in the middle of a CCR migration loses nothing and repeats nothing."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import redis
import yaml

from elastream.control.migration import MigrationDriver
from elastream.core.migration_protocol import ActionKind
from elastream.core.planner import make_plan
from elastream.core.schedule import Schedule
from elastream.core.simulate import simulate, snapshot_from_simulation
from elastream.core.topology import topology_prefix
from elastream.crd import load_manifest
from elastream.store.checkpoint_store import (
    CheckpointScope,
    CheckpointStore,
    ExactlyOnceSink,
    ExecutorCheckpoint,
    open_transactions_key,
    transaction_keys,
)
from elastream.store.claim import OwnerLease
from elastream.store.cluster import is_cluster
from elastream.store.control import ControlChannel, pop_control
from elastream.store.registry import Registry, client_for, connect
from support.harness import (
    expected_copies,
    id_counts,
    read_log,
    run_scale,
    running,
    start_run,
    stop_run,
    with_audit,
    write_manifest,
)
from support.manifests import by_key, count, edge, manifest, src, work
from support.paths import EXAMPLES

pytestmark = pytest.mark.integration


def all_keys(cluster: Any) -> dict[str, int]:
    """Every key on every primary, with the port of the primary that holds it (asked of each node)."""
    found: dict[str, int] = {}
    for node in cluster.primaries():
        for key in node.client().scan_iter(count=1000):
            found[key.decode()] = node.port
    return found


def assert_in_one_slot(cluster: Any, keys: dict[str, int], prefix: str) -> int:
    """Every key under `prefix` hashes to one slot (the server says so) on the primary that serves it, and that
    slot holds the topology's keys only; returns the port of that primary.

    The topology may still be running (checkpoints every 2 s add and drop keys), so the slot's keys are read
    from the server as they are now and judged by name, not counted against the earlier scan: a count taken
    a moment after the scan differed by a checkpoint's keys on a busy machine (42 against 34)."""
    mine = {k: port for k, port in keys.items() if k.startswith(prefix)}
    assert mine, f"no key under {prefix}"
    asker = cluster.primaries()[0].client()
    slots = {int(asker.execute_command("CLUSTER", "KEYSLOT", k)) for k in mine}
    assert len(slots) == 1, f"{prefix}: keys in {len(slots)} slots"
    ports = set(mine.values())
    assert len(ports) == 1 and ports == {cluster.primary_of_key(prefix).port}
    holder = cluster.node(ports.pop())
    in_slot = [k.decode() for k in holder.client().execute_command("CLUSTER", "GETKEYSINSLOT", slots.pop(), 100_000)]
    assert in_slot and all(k.startswith(prefix) for k in in_slot), sorted(in_slot)[:10]
    return holder.port


def names_on_distinct_primaries(cluster: Any, count: int, stem: str) -> list[str]:
    """`count` topology names whose tags the cluster serves on `count` different primaries."""
    chosen: dict[int, str] = {}
    for i in range(1000):
        name = f"{stem}-{i}"
        port = cluster.primary_of_key(topology_prefix("default", name)).port
        chosen.setdefault(port, name)
        if len(chosen) == count:
            return sorted(chosen.values())
    raise AssertionError("no names on distinct primaries in 1000 tries")


def check_exactly_once(client: redis.Redis, topology: Any, events: int, timeout_s: float = 120.0) -> int:
    """Every sink holds exactly the multiset of ids a correct run delivers (waiting, bounded, for the last to
    arrive), and every stateful count's running values are 1..n per key. Returns the events checked."""
    truth = expected_copies(topology, range(events))
    checked = 0
    for sink, expected in truth.items():
        key = f"{topology.redis_prefix}sink:{sink}"
        total = sum(expected.values())
        deadline = time.monotonic() + timeout_s
        while int(client.xlen(key)) < total and time.monotonic() < deadline:
            time.sleep(0.25)
        time.sleep(0.5)  # a duplicate beyond the total has time to arrive too
        entries = [{k.decode(): v.decode() for k, v in f.items()} for _, f in client.xrange(key, "-", "+")]
        got = id_counts(entries)
        missing, extra = expected - got, got - expected
        assert not missing and not extra, (
            f"{sink}: {sum(missing.values())} lost (e.g. {sorted(missing)[:5]}), "
            f"{sum(extra.values())} twice (e.g. {sorted(extra)[:5]})"
        )
        if sink.startswith("audit-"):
            per_key: dict[str, list[int]] = {}
            for event in entries:
                per_key.setdefault(event["key"], []).append(int(event["value"]))
            for k, counts in per_key.items():
                assert sorted(counts) == list(range(1, len(counts) + 1)), f"{sink} key {k}"
        checked += total
    return checked


# ------------------------------------------------------------------------------------------------- stores


def test_the_checkpoint_store_lease_and_control_channel_work_on_a_cluster(redis_cluster_url: str) -> None:
    client = connect(redis_cluster_url, wait_s=10.0)
    assert is_cluster(client)
    prefix = topology_prefix("default", "stores")
    store = CheckpointStore(client, prefix)
    assert store.begin("m1", {"protocol": "ccr"}) and not store.begin("m2", {})
    state = {g: f"s{g}".encode() for g in range(4)}
    saved = ExecutorCheckpoint("count#0", "count", state=state, pending={"2": [b"e1", b"e2"], "any": [b"x"]})
    store.save("m1", saved, token="t1")
    store.save("m1", saved, token="t1")  # a retry after a lost reply: WATCH/MULTI on the cluster applies it once
    assert store.load_state("m1", "count", range(4)) == state
    assert store.load_pending("m1", "count", [2], 0, 1) == [b"e1", b"e2", b"x"]
    assert store.pending_count("m1") == 3
    # an exactly-once sink's staging, committed by the checkpoint in one MULTI (EVAL of the commit script)
    staging, members = transaction_keys(prefix, "m1", "out#0")
    pipe = client.pipeline(transaction=True)
    pipe.rpush(staging, f"{prefix}sink:out", 7, "k", "v", "1.0")
    pipe.sadd(members, staging)
    pipe.zadd(open_transactions_key(prefix), {"m1": 1.0})
    pipe.execute()
    store.complete_checkpoint(
        "m1", {"completedAt": 1.0}, CheckpointScope(sinks=(ExactlyOnceSink("out", f"{prefix}sink:out", 1),))
    )
    assert [f[b"id"] for _, f in client.xrange(f"{prefix}sink:out")] == [b"7"]
    assert store.latest_checkpoint() == {
        "id": "m1",
        "completedAt": 1.0,
        "contents": {"state": [], "positions": 0, "pending": 2},
    }
    lease = OwnerLease(client, prefix, "me")
    assert lease.renew() and lease.holder() == "me"
    assert not OwnerLease(client, prefix, "other").renew()
    lease.release()
    assert lease.holder() is None
    channel = ControlChannel(client, prefix, Schedule({"a#0": "node-0"}, ("node-0",), 2))
    assert channel.send_many(["a#0"], {"type": "prepare"}) == 1
    assert pop_control(client, prefix, "node-0", timeout_s=1.0) == ("a#0", {"type": "prepare"})
    assert pop_control(client, prefix, "node-0", timeout_s=0.2) is None
    registry = Registry(client, prefix)
    version = registry.publish_schedule(Schedule({"a#0": "node-0"}, ("node-0",), 2))
    assert registry.schedule() == (version, Schedule({"a#0": "node-0"}, ("node-0",), 2))
    store.delete_migration("m1")
    keys = all_keys_of(client, prefix)
    assert f"{prefix}mig:m1" not in keys and f"{prefix}ckpt:latest" in keys
    client.close()


def all_keys_of(client: Any, prefix: str) -> set[str]:
    return {k.decode() for k in client.scan_iter(match=f"{prefix}*", count=1000)}


# ------------------------------------------------------------------------------------ elastream run, scaled


def tail(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()[-3000:]


def scale(path: str, url: str, nodes: int) -> dict[str, Any]:
    done, status = run_scale(path, url, "--nodes", str(nodes), "--timeout", "150")
    assert done.returncode == 0 and status is not None, done.stdout + done.stderr
    return status


def test_elastream_run_scales_out_and_in_exactly_once_on_a_cluster(
    tmp_path: Any, redis_cluster: Any, redis_cluster_url: str
) -> None:
    events = 9000  # 30 s at 300/s: both migrations happen mid-stream
    doc = manifest(
        [
            src("src", 1, rate=300, keys=32, limit=events),
            work("w", 1, costMs=1.0),
            count(),
            {"name": "out", "sink": {"type": "redis-stream"}},
            {"name": "committed", "sink": {"type": "redis-stream"}},
        ],
        [
            edge("src", "w"),
            by_key("w", "count"),
            edge("count", "out"),
            edge("w", "committed"),
        ],
        name="cluster-run",
        nodes=2,
        slotsPerNode=3,
        scaling={"checkpointIntervalSeconds": 2},
    )
    doc = with_audit(doc, events)
    # a two-phase-commit sink: its output is committed by the checkpoints' and migrations' MULTI/EXEC
    next(v for v in doc["spec"]["vertices"] if v["name"] == "committed")["sink"]["delivery"] = "exactly-once"
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    run, log_path = start_run(str(tmp_path), path, redis_cluster_url, duration_s=150)
    client = client_for(redis_cluster_url)
    try:
        deadline = time.monotonic() + 60
        while not client.exists(f"{topology.redis_prefix}metrics") and time.monotonic() < deadline:
            assert run.poll() is None, tail(log_path)
            time.sleep(0.5)
        time.sleep(4.0)  # a metric window before the request
        out = scale(path, redis_cluster_url, 3)
        assert out["outcome"] == "succeeded" and out["toNodes"] == 3 and out["migration"] == "ccr", out
        back = scale(path, redis_cluster_url, 2)
        assert back["outcome"] == "succeeded" and back["toNodes"] == 2, back
        assert out["lost"] == 0 and back["lost"] == 0
        assert check_exactly_once(client, topology, events) >= events
        keys = all_keys(redis_cluster)
        assert_in_one_slot(redis_cluster, keys, topology.redis_prefix)
        assert all(k.startswith(topology.redis_prefix) for k in keys), sorted(keys)[:10]  # nothing outside
    finally:
        stop_run(run)
        client.close()
    output = read_log(log_path)
    assert "ScalingPlanned: scale out 2 -> 3 nodes" in output and "scale in 3 -> 2 nodes" in output


# ------------------------------------------------------------------------------------- spread over shards


def test_topologies_spread_over_the_primaries_and_each_keeps_to_one_slot(
    tmp_path: Any, redis_cluster: Any, redis_cluster_url: str
) -> None:
    names = names_on_distinct_primaries(redis_cluster, 2, "spread")
    events = 600
    topologies = []
    paths = [write_manifest(str(tmp_path), tiny(name, events)) for name in names]
    with running(paths[0], redis_cluster_url) as (one, first), running(paths[1], redis_cluster_url) as (two, second):
        topologies = [first, second]
        check_exactly_once(one.client, first, events)
        check_exactly_once(two.client, second, events)
        keys = all_keys(redis_cluster)
    ports = [assert_in_one_slot(redis_cluster, keys, t.redis_prefix) for t in topologies]
    assert ports[0] != ports[1]  # two shards carry the two topologies
    assert all(any(k.startswith(t.redis_prefix) for t in topologies) for k in keys), "a key outside both tags"


def tiny(name: str, events: int) -> dict[str, Any]:
    doc = manifest(
        [
            src("src", 1, rate=300, keys=8, limit=events),
            count(),
            {"name": "out", "sink": {"type": "redis-stream"}},
        ],
        [by_key("src", "count"), edge("count", "out")],
        name=name,
        nodes=1,
        slotsPerNode=4,
    )
    return doc


# ------------------------------------------------------------------------------ failover during a migration


@pytest.mark.parametrize("how", ["manual", "crash"])
def test_a_primary_failing_over_during_a_migration_loses_nothing_and_repeats_nothing(
    how: str, tmp_path: Any, redis_cluster: Any, redis_cluster_url: str
) -> None:
    """`manual`: CLUSTER FAILOVER on the replica (it catches up with the primary first, as in an upgrade).
    `crash`: the primary's process is killed (SIGKILL) and the replica is elected after the node timeout;
    what the primary acknowledged had reached its replica over loopback (a killed process's sockets still
    deliver what it wrote; a lost machine or network may not: Redis replicates asynchronously)."""
    with open(os.path.join(EXAMPLES, "ccr-diamond.yaml"), encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    events = 3000
    doc = with_audit(doc, events)
    doc["metadata"]["name"] = f"failover-{how}"
    doc["spec"]["nodes"] = 2
    path = write_manifest(str(tmp_path), doc)
    failovers: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    phases: list[str] = []

    with running(path, redis_cluster_url) as (cluster, topology):
        old = cluster.current_schedule()
        primary = redis_cluster.primary_of_key(topology.redis_prefix)

        def fail_over() -> None:
            try:
                new_primary = (redis_cluster.failover if how == "manual" else redis_cluster.crash)(primary)
                failovers.append((primary.port, new_primary.port))
            except BaseException as exc:  # reported by the test, not lost in the thread
                errors.append(exc)

        thread = threading.Thread(target=fail_over, name="failover")

        def during_capture(action: Any, coordinator: Any) -> None:
            # PREPARE is acked, every executor captures: the failover starts as COMMIT makes every executor
            # save its state and captured events (WATCH/MULTI, retried against the new primary), and it is
            # over before INIT, so the new executors load all of it from the new primary
            if action.kind == ActionKind.START_COMMIT and not thread.is_alive() and not failovers:
                phases.append("failover started")
                thread.start()
            if action.kind == ActionKind.BROADCAST_INIT and thread.ident is not None:
                thread.join(timeout=90)
                phases.append("failover over before INIT")

        snapshot = snapshot_from_simulation(topology, old, simulate(topology, old))
        plan = make_plan(topology, old, snapshot, len(old.nodes) + 1, "stela")
        time.sleep(1.5)  # mid-stream
        driver = MigrationDriver(topology, cluster, cluster.client, "ccr", before_action=during_capture)
        report = driver.migrate(plan.new_schedule)
        thread.join(timeout=90)
        assert not errors, errors
        assert failovers and failovers[0][0] != failovers[0][1], "the failover did not happen"
        assert phases == ["failover started", "failover over before INIT"]  # within the migration
        assert report.outcome == "succeeded", report.reason
        assert cluster.current_schedule() == plan.new_schedule
        assert redis_cluster.primary_of_key(topology.redis_prefix).port == failovers[0][1]
        check_exactly_once(cluster.client, topology, events)
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None
