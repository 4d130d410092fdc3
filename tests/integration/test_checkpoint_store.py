"""The Redis checkpoint store against a real redis-server: layout, pending split, TTLs, cleanup."""

from __future__ import annotations

import pytest
import redis

from elastream.store.checkpoint_store import CheckpointStore, ExecutorCheckpoint

pytestmark = pytest.mark.integration
PREFIX = "elastream:{default/t}:"


@pytest.fixture
def store(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield CheckpointStore(client, PREFIX, ttl_s=600)
    client.close()


def test_one_migration_at_a_time_and_cleanup(store) -> None:
    assert store.begin("m1", {"protocol": "ccr", "phase": "preparing", "old": {"nodes": ["node-0"]}})
    assert not store.begin("m2", {"protocol": "ccr"})
    assert store.current() == "m1"
    assert store.record("m1")["protocol"] == "ccr"
    store.save("m1", ExecutorCheckpoint("c#0", "c", {0: b"s0"}, {"0": [b"e1"]}))
    assert store.delete_migration("m1") >= 3
    assert store.current() is None
    assert store.client.keys(f"{PREFIX}mig:*") == []
    assert store.begin("m2", {"protocol": "ccr"})


def test_state_and_pending_are_routed_to_new_owners_exactly_once(store) -> None:
    store.begin("m1", {})
    # two old executors of c captured events of key groups 0-3 and of a shuffle input
    store.save("m1", ExecutorCheckpoint("c#0", "c", {0: b"a", 1: b"b"}, {"0": [b"k0-1", b"k0-2"], "any": [b"x1"]}))
    store.save("m1", ExecutorCheckpoint("c#1", "c", {2: b"c", 3: b"d"}, {"3": [b"k3-1"], "any": [b"x2", b"x3"]}))
    # three new executors own [0,1], [2], [3]
    assert store.load_state("m1", "c", [0, 1]) == {0: b"a", 1: b"b"}
    assert store.load_state("m1", "c", [3]) == {3: b"d"}
    replays = [
        store.load_pending("m1", "c", [0, 1], 0, 3),
        store.load_pending("m1", "c", [2], 1, 3),
        store.load_pending("m1", "c", [3], 2, 3),
    ]
    assert replays[0][:2] == [b"k0-1", b"k0-2"]  # key-group order kept
    everything = sorted(e for r in replays for e in r)
    assert everything == sorted([b"k0-1", b"k0-2", b"k3-1", b"x1", b"x2", b"x3"])  # each event once
    assert store.pending_count("m1") == 6


def test_positions_acks_and_ttls(store) -> None:
    store.begin("m1", {})
    store.save("m1", ExecutorCheckpoint("s#0", "s", position=b"1234"))
    assert store.load_positions("m1") == {"s#0": b"1234"}
    store.ack("m1", "preparing", "s#0", {"captured": 3})
    assert store.acks("m1", "preparing") == {"s#0": {"captured": 3}}
    for key in store.client.keys(f"{PREFIX}mig:*"):
        assert 0 < store.client.ttl(key) <= 600


def test_checkpointing_2000_events_is_one_round_trip(store) -> None:
    store.begin("m1", {})
    events = [b"x" * 100 for _ in range(2000)]
    store.save("m1", ExecutorCheckpoint("c#0", "c", {g: b"s" for g in range(128)}, {"any": events}))
    assert store.pending_count("m1") == 2000
    assert len(store.load_state("m1", "c", range(128))) == 128
