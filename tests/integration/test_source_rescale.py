"""A `redis-stream` source whose parallelism changes: CCR migrations take it 2 -> 3 -> 1 executors mid-stream
while entries keep arriving, on real worker processes and a real Redis, and every entry of the input stream
reaches the sink exactly once (the source's lanes and their positions move to the new executors)."""

from __future__ import annotations

import time

import pytest
import redis as redis_client

from elastream.control.migration import MigrationDriver
from elastream.core.schedule import Schedule
from elastream.core.topology import split_executor_id, stream_key, topology_prefix
from support.harness import running, sink_events, wait_for_sink, write_manifest
from support.manifests import edge, manifest, work

pytestmark = pytest.mark.integration


#: the key of the source `orders` of the topology default/source-rescale
ORDERS = stream_key(topology_prefix("default", "source-rescale"), "source", "orders")


def append(client: redis_client.Redis, start: int, count: int) -> None:
    pipe = client.pipeline()
    for i in range(start, start + count):
        pipe.xadd(ORDERS, {"key": f"c{i % 7}", "value": str(i)})
    pipe.execute()


def with_source_parallelism(old: Schedule, parallelism: int) -> Schedule:
    """`old` with `orders#0..orders#<parallelism-1>`, the executors it adds round-robin over the nodes."""
    assignment = {e: n for e, n in old.assignment.items() if split_executor_id(e)[0] != "orders"}
    load = {node: sum(1 for n in assignment.values() if n == node) for node in old.nodes}
    for index in range(parallelism):
        executor = f"orders#{index}"
        node = old.assignment.get(executor) or min(old.nodes, key=lambda n: (load[n], n))
        assignment[executor] = node
        load[node] += 1
    return Schedule(assignment, old.nodes, old.slots_per_node)


def test_a_redis_stream_source_rescaled_mid_stream_delivers_every_entry_exactly_once(tmp_path, redis_url: str) -> None:
    client = redis_client.Redis.from_url(redis_url)
    append(client, 0, 2000)
    doc = manifest(
        [
            {"name": "orders", "parallelism": 2, "source": {"type": "redis-stream", "stream": "orders"}},
            work("w", 1, costMs=1.0),  # ~1,000 events/s: holds the sources back, mid-stream at each rescale
            {"name": "out", "sink": {"type": "redis-stream"}},
        ],
        [edge("orders", "w"), edge("w", "out")],
        name="source-rescale",
        nodes=2,
        slotsPerNode=4,
    )
    total = 2000
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        for parallelism, more in ((3, 1500), (1, 1000)):
            time.sleep(1.0)
            delivered = int(client.xlen(f"{topology.redis_prefix}sink:out"))
            assert 0 < delivered < total, "the rescale must happen mid-stream"
            new = with_source_parallelism(cluster.current_schedule(), parallelism)
            report = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(new)
            assert report.outcome == "succeeded", report.reason
            assert cluster.current_schedule().parallelism()["orders"] == parallelism
            append(client, total, more)  # entries keep arriving after the rescale
            total += more
        assert wait_for_sink(cluster, topology, "out", total, timeout_s=90) == total
        values = sorted(int(e["value"]) for e in sink_events(cluster.client, topology, "out"))
    client.close()
    assert values == list(range(total))
