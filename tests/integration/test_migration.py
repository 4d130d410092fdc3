"""Exactly-once across rescaling, checked: the CCR paper's five DAGs on real worker processes and a real Redis,
scaled out and in with CCR and DCR. Every sink must receive exactly the multiset of ids a correct run
delivers, and every stateful count's running values must be exactly 1..n per key (nothing lost, nothing
counted twice, every key on one executor)."""

from __future__ import annotations

import os
from collections import Counter, defaultdict

import pytest
import yaml

from elastream.control.migration import MigrationDriver
from elastream.core.planner import make_plan
from elastream.core.schedule import Schedule
from elastream.core.simulate import simulate, snapshot_from_simulation
from elastream.core.topology import stream_key, topology_prefix
from support.harness import expected_copies, id_counts, running, sink_events, wait_for_sink, with_audit, write_manifest
from support.paths import EXAMPLES

pytestmark = pytest.mark.integration

DAGS = ["ccr-linear", "ccr-diamond", "ccr-star", "ccr-grid", "ccr-traffic"]
EVENTS = 2400


def load(name: str) -> dict:
    with open(os.path.join(EXAMPLES, f"{name}.yaml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def check_exactly_once(cluster, topology, events: int = EVENTS) -> int:
    """Wait for every sink, then compare it with the truth (`events` from every source); returns the events
    checked."""
    truth = expected_copies(topology, range(events))
    checked = 0
    for sink, expected in truth.items():
        total = sum(expected.values())
        wait_for_sink(cluster, topology, sink, total, timeout_s=90)
        got = id_counts(sink_events(cluster.client, topology, sink))
        assert got == expected, f"{sink}: {sum(got.values())} of {total} copies; " + differences(expected, got)
        checked += total
        if sink.startswith("audit-"):
            per_key: dict[str, list[int]] = defaultdict(list)
            for event in sink_events(cluster.client, topology, sink):
                per_key[event["key"]].append(int(event["value"]))
            for key, counts in per_key.items():
                assert sorted(counts) == list(range(1, len(counts) + 1)), f"{sink} key {key}"
    return checked


def differences(expected: Counter[int], got: Counter[int]) -> str:
    """What a failed exactly-once check needs to be diagnosed: which ids are missing or extra, by range."""
    missing, extra = sorted((expected - got).elements()), sorted((got - expected).elements())

    def summary(ids: list[int]) -> str:
        if not ids:
            return "none"
        residues = Counter(i % 16 for i in ids)
        return f"{len(ids)} (ids {ids[0]}..{ids[-1]}, first {ids[:8]}, by id % 16: {dict(sorted(residues.items()))})"

    return f"missing {summary(missing)}; extra {summary(extra)}"


def check_nothing_lost(cluster, topology, timeout_s: float = 90.0) -> int:
    """At-least-once, checked: every sink receives at least the truth's copies of every id, and every
    stateful count ends at the true count per key (running values 1..n with repeats, n = the copies of the
    key's events a correct run counts): state rolled back and replayed, never lost or counted twice.
    Returns the duplicates seen."""
    import time

    truth = expected_copies(topology, range(EVENTS))
    duplicates = 0
    for sink, expected in truth.items():
        deadline = time.monotonic() + timeout_s
        while True:
            got = id_counts(sink_events(cluster.client, topology, sink))
            missing = expected - got
            if not missing or time.monotonic() > deadline:
                break
            cluster.check_alive()
            time.sleep(0.5)
        assert not missing, f"{sink}: {sum(missing.values())} lost, e.g. {sorted(missing)[:5]}"
        assert set(got) == set(expected), f"{sink}: ids no correct run delivers: {sorted(set(got) - set(expected))[:5]}"
        duplicates += sum((got - expected).values())
        if sink.startswith("audit-"):
            values: dict[str, set[int]] = defaultdict(set)
            ids: dict[str, set[int]] = defaultdict(set)
            for event in sink_events(cluster.client, topology, sink):
                values[event["key"]].add(int(event["value"]))
                ids[event["key"]].add(int(event["id"]))
            for key in values:
                n = sum(expected[i] for i in ids[key])
                assert values[key] == set(range(1, n + 1)), f"{sink} key {key}"
    return duplicates


@pytest.mark.parametrize("protocol", ["ccr", "dcr"])
@pytest.mark.parametrize("direction", ["out", "in"])
@pytest.mark.parametrize("name", DAGS)
def test_migration_is_exactly_once(name: str, direction: str, protocol: str, tmp_path, redis_url: str) -> None:
    doc = with_audit(load(name), EVENTS)
    doc["spec"]["nodes"] = {"ccr-grid": 4, "ccr-traffic": 3}.get(name, 2)
    if direction == "in":
        doc["spec"]["nodes"] += 1
    path = write_manifest(str(tmp_path), doc)
    with running(path, redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        target = len(old.nodes) + 1 if direction == "out" else len(old.nodes) - 1
        snapshot = snapshot_from_simulation(topology, old, simulate(topology, old))
        plan = make_plan(topology, old, snapshot, target, "stela")
        import time

        time.sleep(1.5)  # mid-stream: sources are still emitting (2,400 events at 100-400 events/s)
        report = MigrationDriver(topology, cluster, cluster.client, protocol).migrate(plan.new_schedule)
        assert report.outcome == "succeeded", report.reason
        assert cluster.current_schedule() == plan.new_schedule
        assert set(report.phases_ms) == {"captureMs", "commitMs", "rebalanceMs", "restoreMs"}
        if protocol == "dcr":
            assert report.captured_events == 0  # DCR drains instead of capturing
        check_exactly_once(cluster, topology)
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None  # cleaned up


def test_a_redis_stream_source_resumes_from_its_position_after_a_migration(tmp_path, redis_url: str) -> None:
    import time

    import redis as redis_client

    from support.manifests import edge, manifest, work

    client = redis_client.Redis.from_url(redis_url)
    pipe = client.pipeline()
    for i in range(3000):
        pipe.xadd(
            stream_key(topology_prefix("default", "from-redis-migrating"), "source", "orders"),
            {"key": f"c{i % 7}", "value": str(i)},
        )
    pipe.execute()
    doc = manifest(
        [
            {"name": "orders", "parallelism": 1, "source": {"type": "redis-stream", "stream": "orders"}},
            work("w", 1, costMs=1.0),
            {"name": "out", "sink": {"type": "redis-stream"}},
        ],
        [edge("orders", "w"), edge("w", "out")],
        name="from-redis-migrating",
        nodes=1,
        slotsPerNode=3,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        time.sleep(1.0)  # the slow vertex holds the source back mid-stream
        old = cluster.current_schedule()
        moved = {**old.assignment, "orders#0": "node-1", "w#0": "node-1"}
        new = Schedule(moved, ("node-0", "node-1"), old.slots_per_node)
        report = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(new)
        assert report.outcome == "succeeded", report.reason
        assert wait_for_sink(cluster, topology, "out", 3000, timeout_s=60) == 3000
        values = sorted(int(e["value"]) for e in sink_events(cluster.client, topology, "out"))
    assert values == list(range(3000))
