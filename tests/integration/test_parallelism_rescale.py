"""Parallelism changes as rescales, on real worker processes and a real Redis: a scale-in whose executors no
longer fit lowers the parallelism of the cheapest vertices, and vertex degrees set directly (a source's lanes,
a stateful count's key groups) move with CCR; both with exactly-once delivery and exact keyed counts."""

from __future__ import annotations

import time

import pytest
from test_migration import EVENTS, check_exactly_once, load

from elastream.control.migration import MigrationDriver
from elastream.core.planner import make_plan
from elastream.core.simulate import simulate, snapshot_from_simulation
from support.harness import running, with_audit, write_manifest

pytestmark = pytest.mark.integration


def plan(topology, schedule, nodes: int, parallelism=None):
    snapshot = snapshot_from_simulation(topology, schedule, simulate(topology, schedule))
    return make_plan(topology, schedule, snapshot, nodes, "stela", parallelism=parallelism)


def test_a_scale_in_that_no_longer_fits_lowers_parallelism_exactly_once(tmp_path, redis_url: str) -> None:
    path = write_manifest(str(tmp_path), with_audit(load("ccr-diamond"), EVENTS))
    with running(path, redis_url) as (cluster, topology):
        time.sleep(1.5)
        out = plan(topology, cluster.current_schedule(), topology.nodes + 2)
        grown = len(out.new_schedule)
        assert grown > len(cluster.current_schedule())  # Stela's scale-out added executors
        report = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(out.new_schedule)
        assert report.outcome == "succeeded", report.reason
        time.sleep(1.0)
        slots = topology.slots_per_node
        target = max(n for n in range(1, topology.nodes + 2) if n * slots < grown)
        assert target * slots >= len(topology.order)
        scale_in = plan(topology, cluster.current_schedule(), target)
        lowered = [step for step in scale_in.steps if "lowered" in step]
        assert lowered, scale_in.steps  # the plan says which vertices lost executors
        assert len(scale_in.new_schedule) <= target * slots
        assert any(scale_in.parallelism[v] < k for v, k in cluster.current_schedule().parallelism().items())
        report = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(scale_in.new_schedule)
        assert report.outcome == "succeeded", report.reason
        assert cluster.current_schedule() == scale_in.new_schedule
        assert report.lost == 0  # (CCR "replayed" counts captured in-flight events handed to new executors)
        check_exactly_once(cluster, topology)


def test_vertex_degrees_set_directly_move_lanes_and_key_groups_exactly_once(tmp_path, redis_url: str) -> None:
    path = write_manifest(str(tmp_path), with_audit(load("ccr-diamond"), EVENTS))
    with running(path, redis_url) as (cluster, topology):
        time.sleep(1.5)
        up = plan(topology, cluster.current_schedule(), topology.nodes, {"source": 3, "t3": 4, "t4": 1})
        assert up.parallelism_changes == {"source": (1, 3), "t3": (2, 4), "t4": (2, 1)}
        report = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(up.new_schedule)
        assert report.outcome == "succeeded", report.reason
        time.sleep(1.0)
        down = plan(topology, cluster.current_schedule(), topology.nodes - 1, {"source": 2, "t3": 1})
        report = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(down.new_schedule)
        assert report.outcome == "succeeded", report.reason
        assert cluster.current_schedule().parallelism()["t3"] == 1
        check_exactly_once(cluster, topology)
