"""Worker processes under faults, on real processes and a real Redis: Redis stopped for seconds and restarted
with its data (the workers live through it, log it once, and their sinks end with every event, exactly once),
an executor whose loop crashes (the worker takes its readiness back and exits with EXIT_INTERNAL_ERROR), and
a checkpoint save retried after a lost reply (applied once)."""

from __future__ import annotations

import time

import pytest
import redis

from elastream.control.checkpoint_driver import CheckpointDriver
from elastream.runtime.executor import TEST_CRASH_ENV
from elastream.runtime.worker_failures import EXIT_INTERNAL_ERROR
from elastream.store.checkpoint_store import CheckpointStore, ExecutorCheckpoint
from support.harness import id_counts, running, sink_events, sink_key, write_manifest
from support.manifests import edge, in_line, manifest, sink, src, work
from support.redis_servers import RedisServer

pytestmark = pytest.mark.integration

OUTAGE_S = 5.0


def read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def wait_until(condition, timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())


def test_workers_live_through_a_redis_restart_and_their_sinks_lose_and_repeat_nothing(
    tmp_path, restartable_redis: RedisServer
) -> None:
    events = 9000
    doc = manifest(
        [
            src("src", 2, rate=900, limit=events),
            work("w", 2),
            {"name": "alo", "sink": {"type": "redis-stream"}},  # at-least-once: written batch by batch
            {"name": "eo", "sink": {"type": "redis-stream", "delivery": "exactly-once"}},  # with checkpoints
        ],
        [edge("src", "w"), edge("w", "alo"), edge("w", "eo")],
        name="outage",
        nodes=2,
        slotsPerNode=3,
    )
    with running(write_manifest(str(tmp_path), doc), restartable_redis.url) as (cluster, topology):
        checkpoints = CheckpointDriver(topology, cluster, cluster.client)
        alo, eo = sink_key(topology, "alo"), sink_key(topology, "eo")
        assert wait_until(lambda: cluster.client.xlen(alo) > 0, 30.0), "nothing reached the sink"
        first = checkpoints.take()  # commits what the exactly-once sink held so far, before the outage
        assert first.outcome == "completed", first.reason
        before = int(cluster.client.xlen(alo))
        assert 0 < before < events and int(cluster.client.xlen(eo)) > 0  # mid-stream

        restartable_redis.stop()
        time.sleep(OUTAGE_S)
        assert cluster.running_nodes() == set(cluster.workers), "a worker died while Redis was away"
        restartable_redis.start()  # with its data: the append-only file

        assert wait_until(lambda: cluster.client.xlen(alo) >= events, 60.0), cluster.client.xlen(alo)
        # The source is done and everything it emitted is in `alo`; its barrier follows the last event on every
        # channel, so one checkpoint now commits all the rest of `eo` (retried if it happens to be refused).
        for _ in range(5):
            if checkpoints.take().outcome == "completed" and int(cluster.client.xlen(eo)) >= events:
                break
            time.sleep(0.5)
        time.sleep(0.5)  # a duplicate would have time to arrive too
        assert cluster.running_nodes() == set(cluster.workers)
        logs = {node: read(worker.log_path) for node, worker in cluster.workers.items()}
        for sink in ("alo", "eo"):
            counts = id_counts(sink_events(cluster.client, topology, sink))
            assert set(counts) == set(range(events)), f"{sink}: {events - len(counts)} events lost"
            assert max(counts.values()) == 1, f"{sink}: {sum(counts.values()) - events} duplicates"
    for node, text in logs.items():  # once when it began, once when it ended, not once per attempt
        assert text.count("Redis unreachable") == 1, f"{node}:\n{text[-3000:]}"
        assert text.count("Redis reachable again after") == 1, f"{node}:\n{text[-3000:]}"
        assert "Traceback" not in text, f"{node}:\n{text[-3000:]}"


@pytest.mark.parametrize("crashing", ["w#1", "src#0"])
def test_an_executor_whose_loop_crashes_takes_its_worker_down_not_ready(
    tmp_path, redis_url: str, crashing: str
) -> None:
    doc = in_line([src("src", 2, rate=1000), work("w", 2), sink("out")], name="crash", nodes=2, slotsPerNode=3)
    path = write_manifest(str(tmp_path), doc)
    with running(path, redis_url, extra_env={TEST_CRASH_ENV: f"{crashing}:300"}) as (cluster, _):
        node = cluster.current_schedule().node_of(crashing)
        victim = cluster.workers[node]
        assert wait_until(lambda: victim.process.poll() is not None, 30.0), "the worker did not exit"
        assert victim.process.returncode == EXIT_INTERNAL_ERROR
        text = read(victim.log_path)
        assert f"executor {crashing} died: InjectedCrash" in text
        assert "Traceback" in text and "raise InjectedCrash" in text
        assert f"executor {crashing} failed; not ready, exiting with code {EXIT_INTERNAL_ERROR}" in text
        assert node not in cluster.registry.ready_nodes(cluster.version)  # its readiness was taken back
        assert f"exited with code {EXIT_INTERNAL_ERROR}" in cluster.failed_nodes()[node]  # what recovery acts on
        others = set(cluster.workers) - {node}
        assert others and all(cluster.workers[n].process.poll() is None for n in others)


def test_a_checkpoint_save_retried_after_a_lost_reply_is_applied_once(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    store = CheckpointStore(client, "elastream:{default/save}:")
    checkpoint = ExecutorCheckpoint("count#0", "count", state={3: b"s"}, pending={"any": [b"e1", b"e2"]})
    store.save("ckpt-1", checkpoint, token="t1")
    store.save("ckpt-1", checkpoint, token="t1")  # the retry of a save whose reply was lost
    assert store.load_pending("ckpt-1", "count", [], 0, 1) == [b"e1", b"e2"]
    store.save("ckpt-1", ExecutorCheckpoint("count#1", "count", pending={"any": [b"e3"]}), token="t1")
    store.save("ckpt-1", checkpoint, token="t2")  # another save is another save
    assert store.load_pending("ckpt-1", "count", [], 0, 1) == [b"e1", b"e2", b"e3", b"e1", b"e2"]
    assert store.load_state("ckpt-1", "count", [3]) == {3: b"s"}
    assert store.delete_migration("ckpt-1") >= 3  # the tokens go with the checkpoint's other keys
    assert not list(client.scan_iter(match="elastream:{default/save}:mig:ckpt-1*"))
