"""Graceful drains on real worker processes, a real Redis and the real controller of local mode (the same
`TopologyController.tick` the operator's reconcile loop calls).

A diamond of keyed counts with audit sinks and exactly-once `redis-stream` sinks runs on 3 nodes. One worker
gets SIGTERM from outside its backend (what an eviction or `kubectl delete pod` sends): it asks for a drain,
its executors move to the other workers by CCR, it exits with code 0, nothing is replayed and no recovery
runs; a fresh node then takes executors back (the node count again, degrees unchanged). Another worker is
killed without notice (SIGKILL): the topology rolls back to the last checkpoint, as before. The backend's own
stop (the end of the run) is no drain request. At the end every event arrived exactly once at every sink and
every keyed count is exactly 1..n per key.
"""

from __future__ import annotations

import json
import signal

import pytest
import redis
from test_control_faults import Events, check_exactly_once_at_end, manifest, ticking
from test_migration import load

from elastream.analysis import Analyzer
from elastream.control.backends.local import LocalCluster
from elastream.control.controller import TopologyController
from elastream.control.local_mode import local_controller, status_key
from elastream.core.topology import Topology
from elastream.crd import load_manifest
from elastream.store.drain_requests import MAX_PENDING, RedisDrainRequests, drains_key, request_drain
from support.harness import exactly_once, with_audit, write_manifest

pytestmark = pytest.mark.integration

RATE = 200
EVENTS = 6000


def draining(path: str, redis_url: str) -> tuple[Topology, Events, LocalCluster, TopologyController]:
    """The manifest at `path` under the controller of local mode, its workers given 30 s to drain."""
    topology = load_manifest(path)
    log = Events()
    cluster = LocalCluster(topology, path, redis_url, interval_s=0.5, drain_grace_s=30.0)
    return topology, log, cluster, local_controller(topology, cluster, Analyzer(engine="python"), events=log)


@pytest.mark.timeout(900)
def test_a_sigterm_drains_by_ccr_and_a_kill_rolls_back_exactly_once(tmp_path, redis_url: str) -> None:
    topology, log, cluster, controller = draining(manifest(tmp_path, EVENTS, RATE), redis_url)
    with cluster, controller:
        controller.start()
        ticking(controller, 5.0)  # a periodic checkpoint or two first
        before = cluster.current_schedule()
        drained = cluster.workers["node-1"]
        moving = set(before.executors_on("node-1"))

        # ---- SIGTERM from outside the backend: a drain by CCR, then the refill
        drained.process.send_signal(signal.SIGTERM)
        ticking(controller, 60.0, until=lambda: (controller.last_drain or {}).get("refill") is not None)
        record = controller.last_drain
        assert record is not None and record["node"] == "node-1", record
        assert record["outcome"] == "succeeded" and record["migration"] == "ccr", record
        assert record["replayed"] == 0 and record["lost"] == 0
        assert {m["executor"] for m in record["moves"]} == moving
        assert record["refill"]["outcome"] == "succeeded", record["refill"]
        assert drained.process.wait(30) == 0  # it exited by itself, cleanly, once drained
        assert "drain requested" in drained.log_tail(50)
        after = cluster.current_schedule()
        assert "node-1" not in after.nodes and len(after.nodes) == 3
        assert after.parallelism() == before.parallelism()
        assert controller.last_recovery is None and "WorkerLost" not in log.reasons()
        assert log.reasons().count("Drained") == 2
        stored = json.loads(cluster.client.get(status_key(topology, "lastDrain")))
        assert stored["node"] == "node-1" and stored["replayed"] == 0
        assert cluster.client.hlen(drains_key(topology.redis_prefix)) == 0  # taken
        ticking(controller, 4.0)  # the drained worker is gone for good: still no recovery
        assert controller.last_recovery is None

        # ---- killed without notice: a lost worker, rolled back to the last checkpoint
        victim = sorted(after.nodes)[0]
        cluster.kill(victim)
        ticking(controller, 60.0, until=lambda: controller.last_recovery is not None)
        recovery = controller.last_recovery
        assert recovery is not None and recovery["nodes"] == [victim], recovery
        assert recovery["outcome"] == "succeeded" and recovery["restoredFrom"], recovery
        assert "WorkerLost" in log.reasons()

        check_exactly_once_at_end(cluster, topology, EVENTS, controller)
        stopping = dict(cluster.workers)
    # the backend's own stop sent STOP first: no worker waited for a drain, and no request was left behind (a
    # SIGTERM handled in the instant before the STOP was takes its request back)
    for worker in stopping.values():
        with open(worker.log_path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        assert "stopped by its backend" in text and "not drained within" not in text, worker.node
    client = redis.Redis.from_url(redis_url)
    assert client.hlen(drains_key(topology.redis_prefix)) == 0
    client.close()


@pytest.mark.timeout(900)
def test_a_drain_the_other_workers_cannot_hold_goes_to_a_fresh_worker_exactly_once(tmp_path, redis_url: str) -> None:
    """The nodes full (11 executors on 3 × 4 slots): the drained worker's executors cannot all go to the other
    two, so a fresh worker is started for them and they move there by CCR; nothing replayed, no recovery."""
    doc = exactly_once(with_audit(load("ccr-diamond"), EVENTS), checkpoint_s=2, rate=RATE, nodes=3)
    doc["spec"]["slotsPerNode"] = 4
    topology, log, cluster, controller = draining(write_manifest(str(tmp_path), doc), redis_url)
    with cluster, controller:
        controller.start()
        ticking(controller, 5.0)
        before = cluster.current_schedule()
        executors = sum(len(before.executors_on(n)) for n in before.nodes)
        # the two other nodes' slots are fewer than all executors: node-1's cannot all move onto them
        assert 2 * topology.slots_per_node < executors, (topology.slots_per_node, executors)
        moving = set(before.executors_on("node-1"))
        drained = cluster.workers["node-1"]
        drained.process.send_signal(signal.SIGTERM)
        ticking(controller, 90.0, until=lambda: (controller.last_drain or {}).get("outcome") is not None)
        record = controller.last_drain
        assert record is not None and record["outcome"] == "succeeded", record
        assert record["replayed"] == 0 and record["lost"] == 0, record
        fresh = record.get("replacement")
        assert fresh is not None and fresh not in before.nodes, record
        assert {m["executor"] for m in record["moves"]} == moving
        assert all(m["from"] == "node-1" for m in record["moves"]) and fresh in {m["to"] for m in record["moves"]}
        assert drained.process.wait(30) == 0
        after = cluster.current_schedule()
        assert set(after.nodes) == (set(before.nodes) - {"node-1"}) | {fresh}
        assert after.parallelism() == before.parallelism()
        assert controller.last_recovery is None and "WorkerLost" not in log.reasons()
        check_exactly_once_at_end(cluster, topology, EVENTS, controller)
        assert controller.last_recovery is None


def test_drain_requests_read_back_and_a_flood_of_them_is_dropped_not_walked(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    prefix = "elastream:{default/flood}:"
    requests = RedisDrainRequests(client, prefix)
    request_drain(client, prefix, "node-1", 100.0, 130.0)
    client.hset(drains_key(prefix), "node-2", b"not json")
    pending = requests.pending()
    assert (pending["node-1"].requested_at, pending["node-1"].deadline) == (100.0, 130.0)
    assert pending["node-2"].deadline == 0.0  # unreadable: handled as one past its deadline
    requests.done("node-1")
    assert set(requests.pending()) == {"node-2"}
    # the workers run the author's code and can write here: more requests than nodes is no drain
    client.hset(drains_key(prefix), mapping={f"n{i}": "{}" for i in range(MAX_PENDING + 1)})
    assert requests.pending() == {} and not client.exists(drains_key(prefix))
