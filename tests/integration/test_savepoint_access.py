"""`spec.initialSavepoint` across namespaces, on a real Redis: who may read a savepoint is decided on its meta
alone, before any of its state is read; a savepoint that does not exist and one that is not shared give the
same answer (no existence oracle across namespaces); a seeded checkpoint never expires; a savepoint whose
state keys are gone is StateLost, never an empty start."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import elastream.store.savepoint_store as savepoint_store
from elastream.control.savepoint_actions import SavepointError, restore_initial_savepoint
from elastream.core.ports import StateLost
from elastream.core.savepoint_rules import SavepointMeta
from elastream.core.topology import parse_manifest
from elastream.store.checkpoint_store import CheckpointStore
from elastream.store.savepoint_store import SavepointStore

pytestmark = pytest.mark.integration


def manifest(namespace: str, name: str = "t", reference: dict[str, str] | None = None) -> Any:
    doc: dict[str, Any] = {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodes": 1,
            "slotsPerNode": 4,
            "vertices": [
                {"name": "src", "source": {"type": "synthetic", "rate": 10}, "maxParallelism": 4},
                {"name": "count", "logic": {"builtin": "count", "key": "key"}, "stateful": True, "maxParallelism": 4},
                {"name": "out", "sink": {"type": "redis-stream", "delivery": "exactly-once"}, "maxParallelism": 4},
            ],
            "streams": [
                {"from": "src", "to": "count", "grouping": "fields", "key": "key"},
                {"from": "count", "to": "out"},
            ],
        },
    }
    if reference is not None:
        doc["spec"]["initialSavepoint"] = reference
    return parse_manifest(doc)


@pytest.fixture
def client(redis_url: str):
    client = redis.Redis.from_url(redis_url)
    # team-a/owner's savepoint "sp", shared with team-b only
    meta = SavepointMeta("sp", "team-a", "owner", "ckpt-3", "2026-01-01T00:00:00Z", {"src": 4, "count": 4, "out": 4},
                         shared_with=("team-b",), state_bytes=2)  # fmt: skip
    SavepointStore(client, "team-a", "owner").save(meta, {"count": {"0": b"a", "3": b"b"}}, {"src#0": b"pos"})
    yield client
    client.close()


def refusal(client: redis.Redis, namespace: str, name: str) -> SavepointError:
    topology = manifest(namespace, reference={"name": name, "topology": "owner", "namespace": "team-a"})
    with pytest.raises(SavepointError) as refused:
        restore_initial_savepoint(client, topology)
    return refused.value


def test_missing_and_not_shared_are_one_answer_and_nothing_is_read_before_access(client, monkeypatch) -> None:
    def no_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a savepoint's state was read before its access was checked")

    monkeypatch.setattr(savepoint_store, "read_state_and_positions", no_read)
    not_shared = refusal(client, "team-c", "sp")
    SavepointStore(client, "team-a", "owner").delete("sp")
    missing = refusal(client, "team-c", "sp")
    assert str(not_shared) == str(missing)
    assert (not_shared.retry, missing.retry) == (False, False)  # the same condition (InvalidSpec) either way
    assert "does not exist or is not shared with namespace team-c" in str(missing)
    assert "elastream.dev/savepoint-share-with=team-c" in str(missing)  # names the fix
    assert list(client.scan_iter(match="elastream:{team-c/t}:*")) == []  # nothing seeded


def test_a_shared_savepoint_seeds_a_checkpoint_that_never_expires(client) -> None:
    topology = manifest("team-b", reference={"name": "sp", "topology": "owner", "namespace": "team-a"})
    used = restore_initial_savepoint(client, topology)
    assert used is not None and used.name == "sp"
    store = CheckpointStore(client, topology.redis_prefix)
    latest = store.latest_checkpoint()
    assert latest is not None and latest["contents"] == {"state": ["count"], "positions": 1, "pending": 0}
    keys = list(client.scan_iter(match=f"{topology.redis_prefix}mig:{latest['id']}:*"))
    assert keys and all(client.ttl(k) == -1 for k in keys)
    assert store.missing_state(latest, topology.order) is None


def test_a_savepoint_whose_state_is_gone_is_state_lost_not_an_empty_start(client) -> None:
    client.delete("elastream:savepoint:{team-a/owner}:sp:state:count")
    topology = manifest("team-b", reference={"name": "sp", "topology": "owner", "namespace": "team-a"})
    with pytest.raises(StateLost, match=r"savepoint sp of team-a/owner no longer holds .*the state of count is gone"):
        restore_initial_savepoint(client, topology)
    assert CheckpointStore(client, topology.redis_prefix).latest_checkpoint() is None  # nothing seeded


def test_the_own_namespace_still_says_missing_and_retries(client) -> None:
    topology = manifest("team-a", name="again", reference={"name": "nope", "topology": "owner"})
    with pytest.raises(SavepointError, match="no savepoint nope of team-a/owner") as absent:
        restore_initial_savepoint(client, topology)
    assert absent.value.retry
