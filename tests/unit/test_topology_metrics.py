"""The operator's per-topology Prometheus metrics (`control.topology_metrics`): the pure mapping of a status to
gauges, the scrape-time collector over a real reconcile loop on in-memory fakes (`test_reconciler.World`),
the rescale and recovery counters and their removal when a topology is deleted, the checkpoint age on a fake
clock, and a Redis that does not answer. No Kubernetes, no Redis server."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import redis
from prometheus_client import REGISTRY, CollectorRegistry
from test_reconciler import World, _NoKeys

from elastream.control.checkpoint_driver import Checkpointer, CheckpointResult
from elastream.control.metric_series import forget_topology
from elastream.control.scaling import ScalingRecord
from elastream.control.topology_metrics import (
    FAMILIES,
    RedisMemory,
    Sample,
    TopologyCollector,
    TopologyReading,
    checkpoint_facts,
    count_recovery,
    count_rescale,
    managed_readings,
    memory_of,
    register_topology_metrics,
    topology_samples,
)
from elastream.core.outcomes import Direction, Outcome
from elastream.core.status import PHASES
from elastream.core.topology import parse_manifest
from support.fakes import ManualClock
from support.manifests import edge, manifest, sink, src
from support.ports import free_port

KEY = ("team-a", "pageload")
STATUS: dict[str, Any] = {
    "phase": "Running",
    "nodes": 3,
    "readyNodes": 2,
    "conditions": [
        {"type": "Available", "status": "False", "reason": "NodesNotReady", "message": "2 of 3 nodes ready"},
        {"type": "Progressing", "status": "False", "reason": "Stable", "message": "no scaling in progress"},
        {"type": "Reconciling", "status": "True", "reason": "NodesNotReady", "message": "..."},
        {"type": "Odd", "status": "Unknown", "reason": "NotYet", "message": "neither True nor False"},
    ],
    "vertices": [
        {"name": "kafka-in", "parallelism": 2, "processingRate": 10.0, "lag": 1500},
        {"name": "parse", "parallelism": 2, "processingRate": 10.0},
        {"name": "synthetic", "parallelism": 1, "processingRate": 10.0, "lag": 0},
    ],
}


def by_name(samples: list[Sample]) -> dict[str, dict[tuple[str, ...], float]]:
    found: dict[str, dict[tuple[str, ...], float]] = {}
    for sample in samples:
        assert sample.labels not in found.get(sample.name, {}), f"duplicate {sample}"
        found.setdefault(sample.name, {})[sample.labels] = sample.value
    return found


# ------------------------------------------------------------------------------------------- the mapping


def test_a_status_maps_to_one_sample_per_phase_condition_node_count_backlog_and_checkpoint_figure() -> None:
    reading = TopologyReading(
        *KEY,
        STATUS,
        desired_nodes=4,
        checkpoint_interval_s=10.0,
        checkpoint_completed_at=500.0,
        checkpoint_duration_s=0.25,
    )
    found = by_name(topology_samples(reading, now=512.5))
    assert found["elastream_topology_phase"] == {(*KEY, p): 1.0 if p == "Running" else 0.0 for p in PHASES}
    assert found["elastream_topology_condition"] == {
        (*KEY, "Available", "NodesNotReady"): 0.0,
        (*KEY, "Progressing", "Stable"): 0.0,
        (*KEY, "Reconciling", "NodesNotReady"): 1.0,
    }  # Unknown: no series
    assert found["elastream_topology_desired_nodes"] == {KEY: 4.0}
    assert found["elastream_topology_nodes"] == {KEY: 3.0}
    assert found["elastream_topology_ready_nodes"] == {KEY: 2.0}
    assert found["elastream_source_backlog_events"] == {(*KEY, "kafka-in"): 1500.0, (*KEY, "synthetic"): 0.0}
    assert found["elastream_checkpoint_age_seconds"] == {KEY: 12.5}
    assert found["elastream_checkpoint_duration_seconds"] == {KEY: 0.25}
    assert found["elastream_checkpoint_interval_seconds"] == {KEY: 10.0}
    assert set(found) == set(FAMILIES)
    for name, values in found.items():  # each sample has its family's labels, in order
        assert all(len(labels) == 2 + len(FAMILIES[name][1]) for labels in values)


def test_what_the_status_does_not_hold_yet_has_no_series() -> None:
    assert topology_samples(TopologyReading(*KEY, {}), now=0.0) == []
    # before the first completed checkpoint: the interval, not an age
    found = by_name(topology_samples(TopologyReading(*KEY, {"phase": "Pending"}, checkpoint_interval_s=10.0), 9.0))
    assert set(found) == {"elastream_topology_phase", "elastream_checkpoint_interval_seconds"}
    assert found["elastream_topology_phase"][(*KEY, "Pending")] == 1.0
    # a clock behind the completion (another host's): age 0, not negative
    late = TopologyReading(*KEY, {}, checkpoint_completed_at=100.0)
    assert by_name(topology_samples(late, 99.0))["elastream_checkpoint_age_seconds"] == {KEY: 0.0}


def test_a_phase_this_version_does_not_know_is_shown_beside_the_known_ones() -> None:
    found = by_name(topology_samples(TopologyReading(*KEY, {"phase": "Hibernating"}), 0.0))
    assert found["elastream_topology_phase"][(*KEY, "Hibernating")] == 1.0
    assert sum(found["elastream_topology_phase"].values()) == 1.0
    assert len(found["elastream_topology_phase"]) == len(PHASES) + 1


def test_malformed_status_fields_are_skipped_not_raised() -> None:
    status = {
        "phase": 3,
        "nodes": "three",
        "readyNodes": float("nan"),
        "conditions": ["Available", {"type": "Ready", "status": "True", "reason": "AsExpected"}],
        "vertices": "none",
    }
    found = by_name(topology_samples(TopologyReading(*KEY, status), 0.0))
    assert found == {"elastream_topology_condition": {(*KEY, "Ready", "AsExpected"): 1.0}}


# ----------------------------------------------------------------------------- the checkpointer's facts


class Driver:
    """What `Checkpointer.tick` asks of its driver: a round begun, and its result once the test gives one."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.round_open = False
        self.results: list[CheckpointResult] = []

    def begin(self) -> CheckpointResult | None:
        self.round_open = True
        return None

    def poll(self) -> CheckpointResult | None:
        if not self.results:
            return None
        self.round_open = False
        return self.results.pop(0)


def test_the_checkpoint_age_counts_from_the_last_round_that_completed() -> None:
    clock = ManualClock(1_000_000.0)
    driver = Driver(clock)
    checkpointer = Checkpointer(driver, interval_s=10.0, own_thread=False).start()  # type: ignore[arg-type]
    topology = parse_manifest(
        manifest([src("s"), sink("z")], [edge("s", "z")], scaling={"checkpointIntervalSeconds": 10})
    )
    controller = SimpleNamespace(topology=topology, background=[checkpointer])
    assert checkpoint_facts(controller) == (10.0, None, None)  # type: ignore[arg-type]
    clock.t += 10.0
    assert checkpointer.tick() is None  # begun
    driver.results.append(CheckpointResult("ckpt-1", "completed", 250.0, completed_at=clock.t + 0.25))
    clock.t += 1.0
    assert checkpointer.tick() is not None
    completed_at = clock.t - 0.75
    assert checkpoint_facts(controller) == (10.0, completed_at, 0.25)  # type: ignore[arg-type]
    clock.t += 9.0
    assert checkpointer.tick() is None  # the next round begun...
    driver.results.append(CheckpointResult("ckpt-2", "failed", reason="node-1 died"))
    clock.t += 30.0
    checkpointer.tick()  # ... failed: the age goes on from the last completed one
    assert checkpoint_facts(controller) == (10.0, completed_at, 0.25)  # type: ignore[arg-type]
    reading = TopologyReading(*KEY, {}, checkpoint_completed_at=completed_at)
    assert by_name(topology_samples(reading, clock.now()))["elastream_checkpoint_age_seconds"] == {KEY: 39.75}


# ------------------------------------------------------------------------- the collector over the loop


def scrape(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def series_of(registry: CollectorRegistry, namespace: str, topology: str) -> set[str]:
    """The names of the samples of that topology in `registry`."""
    return {
        sample.name
        for family in registry.collect()
        for sample in family.samples
        if sample.labels.get("namespace") == namespace and sample.labels.get("topology") == topology
    }


def test_the_collector_reads_every_managed_topology_and_a_deleted_one_vanishes() -> None:
    forget_topology("default", "t")  # what other tests of this session counted for a topology of that name
    world = World(nodes=3)
    world.run_for(3.0)
    registry = CollectorRegistry()
    register_topology_metrics(world.topologies, _refused_client(), registry=registry, clock=world.clock)
    labels = {"namespace": "default", "topology": "t"}
    assert world.status["phase"] == "Running"
    for phase in PHASES:
        assert scrape(registry, "elastream_topology_phase", **labels, phase=phase) == (phase == "Running")
    assert scrape(registry, "elastream_topology_desired_nodes", **labels) == 3.0
    assert scrape(registry, "elastream_topology_nodes", **labels) == 3.0
    assert scrape(registry, "elastream_topology_ready_nodes", **labels) == 3.0
    condition = world.condition("Available")
    assert scrape(registry, "elastream_topology_condition", **labels, type="Available", reason=condition["reason"]) == 1
    assert scrape(registry, "elastream_topology_condition", **labels, type="Degraded", reason="AsExpected") == 0.0
    assert scrape(registry, "elastream_checkpoint_interval_seconds", **labels) == 10.0
    assert scrape(registry, "elastream_checkpoint_age_seconds", **labels) is None  # no checkpointer here

    # what the status says, as written: a worker lost is Degraded until its recovery's pass
    world.backend.dead = {"node-1": "worker pod t-node-1 is gone"}
    world.patch_spec(nodes=4)
    world.run_for(3.0)
    assert scrape(registry, "elastream_topology_desired_nodes", **labels) == 4.0
    assert scrape(registry, "elastream_topology_nodes", **labels) == 4.0
    assert scrape(registry, "elastream_topology_phase", **labels, phase="Running") == 1.0

    # the scale-out and the recovery were counted, by trigger and outcome
    rescale = {**labels, "direction": "out", "outcome": "succeeded", "trigger": "request"}
    assert REGISTRY.get_sample_value("elastream_rescales_total", rescale) == 1.0
    assert REGISTRY.get_sample_value("elastream_rescale_duration_seconds_count", labels) == 1.0
    assert REGISTRY.get_sample_value("elastream_rescale_pause_seconds_sum", labels) == 0.042
    assert REGISTRY.get_sample_value("elastream_last_rescale_pause_seconds", labels) == 0.042
    assert REGISTRY.get_sample_value("elastream_recoveries_total", {**labels, "outcome": "succeeded"}) == 1.0

    world.rewire(redis_client=_NoKeys())
    world.topologies.remove("default", "t")
    assert series_of(registry, "default", "t") == set()
    assert series_of(REGISTRY, "default", "t") == set()  # the counters' series too


def test_the_autoscalers_rescales_are_counted_with_their_trigger() -> None:
    name = "autoscaled"
    topology = parse_manifest(manifest([src("s"), sink("z")], [edge("s", "z")], name=name))
    record = ScalingRecord(Direction.IN, 3, 2, "stela", "ccr", None, 0.0, 100.0, 101.5, Outcome.FAILED)
    record.trigger = "autoscaler"
    labels = {"namespace": "default", "topology": name}
    count_rescale(topology.namespace, name, record)
    count_rescale(topology.namespace, name, record)
    failed = {**labels, "direction": "in", "outcome": "failed", "trigger": "autoscaler"}
    assert REGISTRY.get_sample_value("elastream_rescales_total", failed) == 2.0
    assert REGISTRY.get_sample_value("elastream_rescale_duration_seconds_sum", labels) == 3.0
    assert REGISTRY.get_sample_value("elastream_last_rescale_pause_seconds", labels) is None  # never migrated
    count_recovery("other-ns", name, {"outcome": "restarted"})
    forget_topology("default", name)
    assert series_of(REGISTRY, "default", name) == set()
    other = {"namespace": "other-ns", "topology": name, "outcome": "restarted"}
    assert REGISTRY.get_sample_value("elastream_recoveries_total", other) == 1.0  # another namespace's stays
    forget_topology("other-ns", name)
    forget_topology("other-ns", name)  # twice: nothing left to remove, no error


class BrokenWriter:
    @property
    def written(self) -> dict[str, Any]:
        raise RuntimeError("half-built")


def test_a_topology_whose_reading_fails_is_skipped_and_a_failing_registry_gives_no_series() -> None:
    good = SimpleNamespace(key="ns/good", writer=SimpleNamespace(written={"phase": "Running"}), spec={"nodes": 2})
    bad = SimpleNamespace(key="ns/bad", writer=BrokenWriter(), spec=None, controller=None)
    good.controller = None
    registry = SimpleNamespace(topologies={"ns/bad": bad, "ns/good": good})
    readings = managed_readings(registry)  # type: ignore[arg-type]
    assert [(r.namespace, r.name) for r in readings] == [("ns", "good")]

    def broken() -> list[TopologyReading]:
        raise RuntimeError("the registry is being rebuilt")

    families = list(TopologyCollector(broken, ManualClock(1_000_000.0)).collect())
    assert {f.name for f in families} == set(FAMILIES) and all(not f.samples for f in families)


# ----------------------------------------------------------------------------------------------- Redis


def _refused_client() -> redis.Redis:
    """A real client of a port nothing listens on: Redis away."""
    return redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5)


def test_a_redis_that_does_not_answer_gives_no_memory_series() -> None:
    memory = RedisMemory(_refused_client(), ManualClock(1_000_000.0))
    assert memory.read() is None
    families = {f.name: f for f in TopologyCollector(list, ManualClock(1_000_000.0), memory).collect()}
    assert families["elastream_redis_memory_used_bytes"].samples == []
    assert families["elastream_redis_memory_limit_bytes"].samples == []


def test_info_memory_replies_map_to_used_and_limit() -> None:
    assert memory_of({"used_memory": 1_048_576, "maxmemory": 0, "maxmemory_policy": "noeviction"}) == (1048576.0, 0.0)
    assert memory_of({"used_memory": 10, "maxmemory": 100}) == (10.0, 100.0)
    # a Redis Cluster client's reply: one per node, summed
    nodes = {"127.0.0.1:7000": {"used_memory": 10, "maxmemory": 100}, "127.0.0.1:7001": {"used_memory": 5}}
    assert memory_of(nodes) == (15.0, 100.0)
    assert memory_of({"loading": 0}) is None and memory_of(None) is None
