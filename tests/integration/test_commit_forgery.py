"""The checkpoint-commit forgery, end to end: topology A runs on real worker processes with an exactly-once
sink; its tenant writes, only under A's own prefix, a staging list naming B's source stream, A's next
checkpoint's transaction set listing that list and B's control list, and forged `txn:open` entries. A's next
checkpoint completes (the operator's commit, on its admin connection): B's stream is untouched, B's control
list is kept, and A's own staged output is committed exactly once. Before the fix the commit read the list
names from the set and the stream from each list: B got the forged events and lost its control list."""

from __future__ import annotations

import time

import pytest
from test_migration import EVENTS, check_exactly_once, load

from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
from elastream.core.topology import topology_prefix
from elastream.store.checkpoint_store import open_transactions_key
from support.harness import exactly_once, running, with_audit, write_manifest

pytestmark = pytest.mark.integration

B = topology_prefix("team-b", "victim")


@pytest.mark.timeout(300)
def test_a_tenant_cannot_steer_the_commit_into_another_topology(tmp_path, redis_url: str) -> None:
    doc = exactly_once(with_audit(load("ccr-linear"), EVENTS), checkpoint_s=0)
    path = write_manifest(str(tmp_path), doc)
    with running(path, redis_url) as (cluster, topology):
        client = cluster.client
        a = topology.redis_prefix
        # B: a source stream and a worker's control list
        b_entries = [client.xadd(f"{B}source:in", {"id": i}) for i in range(3)]
        client.rpush(f"{B}control:node-0", "a control message")
        time.sleep(1.5)  # mid-stream: A's sinks hold processed events for the next checkpoint

        # A's tenant, with writes under A's prefix only, aims at the checkpoint it will take next
        n = int(client.get(f"{a}ckpt:seq") or 0) + 1
        client.rpush(f"{a}staging:x", f"{B}source:in", *[v for i in range(3) for v in (900000 + i, "k", "v", "1.0")])
        client.sadd(f"{a}txn:ckpt-{n}", f"{a}staging:x", f"{B}control:node-0")
        client.zadd(open_transactions_key(a), {"forged": 0.0, f"ckpt-{n + 1000}": 0.1})
        client.sadd(f"{a}txn:forged", f"{a}staging:x", f"{B}control:node-0")
        client.sadd(f"{a}txn:ckpt-{n + 1000}", f"{a}staging:x", f"{B}control:node-0")

        driver = CheckpointDriver(topology, cluster, client)
        taken = driver.take()
        assert taken.outcome == "completed" and taken.checkpoint_id == f"ckpt-{n}", taken

        assert [e for e, _ in client.xrange(f"{B}source:in")] == b_entries  # B's stream untouched
        assert client.lrange(f"{B}control:node-0", 0, -1) == [b"a control message"]  # B's control list kept
        assert client.zscore(open_transactions_key(a), "forged") is None  # dropped, logged
        # A's own output: committed by this and later checkpoints, every event exactly once, nothing forged
        checkpointer = Checkpointer(driver, interval_s=0.3).start()
        try:
            check_exactly_once(cluster, topology)
        finally:
            checkpointer.stop()
        assert [e for e, _ in client.xrange(f"{B}source:in")] == b_entries
        assert client.lrange(f"{B}control:node-0", 0, -1) == [b"a control message"]
