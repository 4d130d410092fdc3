"""The checkpoint commit acts only on names the operator derived, the latest checkpoint never expires, and
durable commits wait for Redis: `store.checkpoint_store` against a real redis-server.

The commit (`CheckpointStore.complete_checkpoint`) runs on the operator's connection, so whatever the tenant's
workers can write under their own prefix must not steer it: a staging list naming another topology's stream,
a transaction set listing another topology's keys, a forged entry of `txn:open`. Only the staging lists the
spec names (`txn:<id>:<sink>#<i>`, i below maxParallelism) are read, their events go to the sink's own stream,
and nothing outside the prefix is touched. The workers end-to-end version is in test_commit_forgery.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from elastream.core.ports import StateLost
from elastream.core.topology import parse_manifest, topology_prefix
from elastream.store.checkpoint_store import (
    CheckpointScope,
    CheckpointStore,
    DurableCommits,
    ExactlyOnceSink,
    ExecutorCheckpoint,
    is_transaction_id,
    open_transactions_key,
    transaction_keys,
)
from support.redis_servers import RedisServer

pytestmark = pytest.mark.integration

A = topology_prefix("team-a", "a")
B = topology_prefix("team-b", "b")


def topology_doc(name: str = "a", namespace: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodes": 1,
            "slotsPerNode": 4,
            "vertices": [
                {"name": "src", "source": {"type": "synthetic", "rate": 10}},
                {"name": "count", "logic": {"builtin": "count", "key": "key"}, "stateful": True, "maxParallelism": 4},
                {"name": "out", "sink": {"type": "redis-stream", "delivery": "exactly-once"}, "maxParallelism": 4},
                {"name": "log", "sink": {"type": "redis-stream"}, "maxParallelism": 2},
            ],
            "streams": [
                {"from": "src", "to": "count", "grouping": "fields", "key": "key"},
                {"from": "count", "to": "out"},
                {"from": "count", "to": "log"},
            ],
        },
    }


@pytest.fixture
def client(redis_url: str):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def stage(client: redis.Redis, prefix: str, txn: str, writer: str, stream: str, ids: list[int]) -> None:
    """What `RedisStreamSink.pre_commit` writes: the stream name, then id, key, value, ts per event."""
    staging, members = transaction_keys(prefix, txn, writer)
    items: list[Any] = [stream]
    for i in ids:
        items += [i, f"k{i}", f"v{i}", "1.0"]
    pipe = client.pipeline(transaction=True)
    pipe.rpush(staging, *items)
    pipe.sadd(members, staging)
    pipe.zadd(open_transactions_key(prefix), {txn: time.time()}, nx=True)
    pipe.execute()


def ids_of(client: redis.Redis, stream: str) -> list[int]:
    return [int(fields[b"id"]) for _, fields in client.xrange(stream)]


def test_the_scope_is_derived_from_the_spec() -> None:
    scope = CheckpointScope.of(parse_manifest(topology_doc()))
    assert scope.vertices == ("src", "count", "out", "log")
    assert scope.sinks == (ExactlyOnceSink("out", f"{A}sink:out", 4),)  # the at-least-once sink stages nothing


def test_only_the_operators_transaction_id_shapes_are_taken() -> None:
    import uuid

    assert is_transaction_id("ckpt-1") and is_transaction_id("ckpt-123456")
    assert is_transaction_id(uuid.uuid4().hex[:12])  # what MigrationDriver.migrate makes
    for forged in ("ckpt-0", "ckpt-", "ckpt-1x", "x", "ABCDEF012345", "0123456789abc", "../ckpt-1", "ckpt-1 "):
        assert not is_transaction_id(forged), forged


def test_a_forged_staging_and_transaction_set_reach_nothing_of_another_topology(client: redis.Redis) -> None:
    scope = CheckpointScope.of(parse_manifest(topology_doc()))
    store = CheckpointStore(client, A, ttl_s=600)
    # B: a source stream with two entries and a worker's control list
    client.xadd(f"{B}source:in", {"id": 1})
    client.xadd(f"{B}source:in", {"id": 2})
    client.rpush(f"{B}control:node-0", "stop")
    # A's own, legitimate staging of ckpt-5, by out#0 and by out#3 (an executor a rescale removed since)
    stage(client, A, "ckpt-5", "out#0", f"{A}sink:out", [1, 2])
    stage(client, A, "ckpt-5", "out#3", f"{A}sink:out", [3])
    # what A's tenant can write under its own prefix: a list naming B's stream, the transaction set listing
    # it and B's control list, a staging list of the right name whose stream is B's, forged `txn:open` entries
    client.rpush(f"{A}staging:x", f"{B}source:in", 666, "k", "v", "1.0", 667, "k", "v", "1.0")
    client.sadd(f"{A}txn:ckpt-5", f"{A}staging:x", f"{B}control:node-0")
    client.rpush(f"{A}txn:ckpt-5:out#1", f"{B}source:in", 4, "k4", "v4", "1.0", 99, "incomplete")
    client.zadd(open_transactions_key(A), {"evil": 0.0, f"../../{B}x": 0.5, "ckpt-4": 0.7})
    client.sadd(f"{A}txn:evil", f"{A}staging:x")
    client.sadd(f"{A}txn:ckpt-4", f"{B}control:node-0")

    done = store.complete_checkpoint("ckpt-5", {"completedAt": 1.0}, scope)

    assert done.replaced is None and done.not_durable == ""
    assert ids_of(client, f"{B}source:in") == [1, 2]  # B's stream untouched
    assert client.lrange(f"{B}control:node-0", 0, -1) == [b"stop"]  # B's control list kept
    # A's staged output committed once, to A's own stream, whatever stream name a list began with; the
    # incomplete trailing event is skipped; the forged list is not A's staging and stays where it was
    assert sorted(ids_of(client, f"{A}sink:out")) == [1, 2, 3, 4]
    assert client.llen(f"{A}staging:x") == 9
    assert client.exists(f"{A}txn:ckpt-5", f"{A}txn:ckpt-5:out#0", f"{A}txn:ckpt-5:out#1") == 0
    assert client.zrange(open_transactions_key(A), 0, -1) == []  # forged members dropped, ckpt-4 committed (empty)
    # a second completion commits nothing again
    store.complete_checkpoint("ckpt-6", {"completedAt": 2.0}, scope)
    assert sorted(ids_of(client, f"{A}sink:out")) == [1, 2, 3, 4]
    assert ids_of(client, f"{B}source:in") == [1, 2]


def test_the_commit_script_refuses_keys_outside_the_prefix(client: redis.Redis) -> None:
    # a scope that named another topology's stream (the operator's own bug) is refused by the script itself
    store = CheckpointStore(client, A, ttl_s=600)
    stage(client, A, "ckpt-1", "out#0", f"{A}sink:out", [1])
    wrong = CheckpointScope(("out",), (ExactlyOnceSink("out", f"{B}source:in", 1),))
    store.complete_checkpoint("ckpt-1", {"completedAt": 1.0}, wrong)  # logged; the checkpoint completes
    assert client.exists(f"{B}source:in") == 0
    assert client.lrange(f"{A}txn:ckpt-1:out#0", 0, -1)  # nothing moved: A's staging stays (until it expires)


def test_the_latest_checkpoint_has_no_ttl_records_what_it_holds_and_replaces_the_previous(client: redis.Redis) -> None:
    topology = parse_manifest(topology_doc())
    scope = CheckpointScope.of(topology)
    store = CheckpointStore(client, A, ttl_s=600)
    for n in (1, 2):
        cid = f"ckpt-{n}"
        assert store.claim(cid, 120)
        store.save(cid, ExecutorCheckpoint("count#0", "count", state={0: b"s0", 3: b"s3"}), token="t")
        store.save(cid, ExecutorCheckpoint("src#0", "src", position=b"p"))
        store.ack(cid, "checkpointing", "src#0", {})
        stage(client, A, cid, "out#0", f"{A}sink:out", [n])
        assert all(0 < client.ttl(k) <= 600 for k in client.scan_iter(match=f"{A}mig:{cid}:*"))
        schedule = {"nodes": ["node-0"], "slotsPerNode": 4, "placement": {"node-0": ["src#0", "count#0", "out#0"]}}
        store.complete_checkpoint(cid, {"completedAt": float(n), "schedule": schedule}, scope)
        store.release(cid)
    keys = list(client.scan_iter(match=f"{A}mig:ckpt-2:*"))
    assert len(keys) == 4 and all(client.ttl(k) == -1 for k in keys), {k: client.ttl(k) for k in keys}
    assert client.ttl(store.latest_key) == -1
    assert list(client.scan_iter(match=f"{A}mig:ckpt-1*")) == []  # the replaced one is gone
    latest = store.latest_checkpoint()
    assert latest is not None and latest["contents"] == {"state": ["count"], "positions": 1, "pending": 0}
    assert store.missing_state(latest, topology.order) is None

    client.hdel(f"{A}mig:ckpt-2:position", "src#0")
    assert "1 of its 1 source positions are gone" in (store.missing_state(latest, topology.order) or "")
    client.delete(f"{A}mig:ckpt-2:state:count")
    with pytest.raises(StateLost, match="the state of count is gone"):
        store.ensure_restorable(latest, topology.order)


def test_a_checkpoint_recorded_before_its_contents_is_lost_only_when_nothing_is_left(client: redis.Redis) -> None:
    store = CheckpointStore(client, A, ttl_s=600)
    legacy = {"id": "ckpt-7", "completedAt": 1.0}
    client.hset(f"{A}mig:ckpt-7:acks:checkpointing", "src#0", "{}")
    assert store.missing_state(legacy, ["src", "count"]) is None
    client.delete(f"{A}mig:ckpt-7:acks:checkpointing")
    assert "none of its state" in (store.missing_state(legacy, ["src", "count"]) or "")


# ---------------------------------------------------------------------------------------- durable commits


def test_durable_commits_settings_are_read_from_the_environment() -> None:
    assert DurableCommits.from_env({}) == DurableCommits(False, 0, 1000)
    on = {"ELASTREAM_DURABLE_COMMITS": "on", "ELASTREAM_DURABLE_COMMITS_REPLICAS": "1"}
    assert DurableCommits.from_env({**on, "ELASTREAM_DURABLE_COMMITS_TIMEOUT_MS": "250"}) == DurableCommits(
        True, 1, 250
    )
    for bad in ({"ELASTREAM_DURABLE_COMMITS": "yes please"}, {"ELASTREAM_DURABLE_COMMITS_TIMEOUT_MS": "0"}):
        with pytest.raises(ValueError, match="ELASTREAM_DURABLE_COMMITS"):
            DurableCommits.from_env(bad)


def server_version(client: redis.Redis) -> tuple[int, ...]:
    return tuple(int(p) for p in str(client.info("server")["redis_version"]).split(".")[:2])


def test_a_durable_commit_that_nobody_confirms_is_reported_not_a_silent_success(client: redis.Redis) -> None:
    scope = CheckpointScope.of(parse_manifest(topology_doc()))
    store = CheckpointStore(client, A, ttl_s=600, durability=DurableCommits(True, 0, 100))
    stage(client, A, "ckpt-1", "out#0", f"{A}sink:out", [1])
    done = store.complete_checkpoint("ckpt-1", {"completedAt": 1.0}, scope)
    assert ids_of(client, f"{A}sink:out") == [1]  # committed all the same: only its durability is in doubt
    if server_version(client) >= (7, 2):
        # WAITAOF on a Redis without appendonly is refused: said, not ignored
        assert "WAITAOF" in done.not_durable, done
    else:
        # no WAITAOF before 7.2: WAIT for a replica, and this Redis has none
        assert store._waitaof is False
        assert "reached 0 of 1 replicas" in done.not_durable and "no WAITAOF" in done.not_durable, done


def test_a_durable_commit_waits_for_a_replica_when_redis_has_no_waitaof() -> None:
    primary = RedisServer("--appendonly", "yes").start()
    replica = RedisServer("--replicaof", "127.0.0.1", str(primary.port)).start()
    client = redis.Redis.from_url(primary.url)
    try:
        deadline = time.monotonic() + 20
        while client.info("replication").get("connected_slaves", 0) < 1 or (
            redis.Redis.from_url(replica.url).info("replication").get("master_link_status") != "up"
        ):
            assert time.monotonic() < deadline, "the replica did not connect"
            time.sleep(0.1)
        scope = CheckpointScope.of(parse_manifest(topology_doc()))
        store = CheckpointStore(client, A, ttl_s=600, durability=DurableCommits(True, 1, 5000))
        stage(client, A, "ckpt-1", "out#0", f"{A}sink:out", [1, 2])
        done = store.complete_checkpoint("ckpt-1", {"completedAt": 1.0}, scope)
        assert done.not_durable == "", done
        assert ids_of(redis.Redis.from_url(replica.url), f"{A}sink:out") == [1, 2]  # the replica has it
        assert store._waitaof is (server_version(client) >= (7, 2))
    finally:
        client.close()
        replica.remove()
        primary.remove()


def test_the_commit_and_its_durable_wait_work_on_a_redis_cluster(redis_cluster_url: str) -> None:
    from elastream.store.cluster import is_cluster
    from elastream.store.registry import connect

    client = connect(redis_cluster_url, wait_s=10.0)
    try:
        assert is_cluster(client)
        scope = CheckpointScope.of(parse_manifest(topology_doc()))
        # every primary has one replica: WAIT (or WAITAOF's replica count) on the primary of A's slot
        store = CheckpointStore(client, A, ttl_s=600, durability=DurableCommits(True, 1, 5000))
        stage(client, A, "ckpt-1", "out#2", f"{A}sink:out", [1, 2])
        client.zadd(open_transactions_key(A), {"forged": 0.0})
        done = store.complete_checkpoint("ckpt-1", {"completedAt": 1.0}, scope)
        assert done.not_durable == "", done
        assert ids_of(client, f"{A}sink:out") == [1, 2]
        assert client.zrange(open_transactions_key(A), 0, -1) == []
        assert client.ttl(store.latest_key) == -1
    finally:
        client.close()
