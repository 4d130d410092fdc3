"""The fluid model against hand-computed steady states, and the exhaustive optimum."""

from __future__ import annotations

import pytest

from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.simulate import (
    SearchTooLarge,
    optimal_scale_in,
    optimal_scale_out,
    simulate,
    snapshot_from_simulation,
)
from elastream.core.topology import parse_manifest
from helpers import edge, manifest, sink, src, work


def linear(**spec):
    return parse_manifest(
        manifest(
            [
                src("s", 1, rate=1000),
                work("a", 2, costMs=4),
                work("b", 1, costMs=0.5, selectivity=0.5),
                sink("z"),
            ],
            [edge("s", "a"), edge("a", "b"), edge("b", "z")],
            **spec,
        )
    )


def test_bottleneck_limits_its_subtree() -> None:
    topology = linear()
    result = simulate(topology, initial_schedule(topology))
    # a: 2 executors × 250/s = 500/s of 1000 offered; b halves it.
    assert result.vertices["a"].processing_rate == pytest.approx(500.0)
    assert result.vertices["b"].input_rate == pytest.approx(500.0)
    assert result.throughput == pytest.approx(250.0)


def test_node_cpu_is_shared_max_min_fairly() -> None:
    topology = linear(nodes=1, resources={"limits": {"cpu": "1"}})
    result = simulate(topology, initial_schedule(topology))
    # One core for a#0, a#1 (each wants 1 core) and b (wants rate × 0.5 ms): a gets (1 - b's use) / 2 each.
    a = result.vertices["a"].processing_rate
    b_cpu = a * 0.0005
    assert a == pytest.approx((1.0 - b_cpu) / 2 / 0.004 * 2, rel=1e-6)
    assert result.node_cpu_used["node-0"] == pytest.approx(1.0, rel=1e-6)


def test_fields_grouping_follows_key_group_shares() -> None:
    topology = parse_manifest(
        manifest(
            [
                src("s", 1, rate=300),
                {
                    "name": "c",
                    "parallelism": 2,
                    "maxParallelism": 3,
                    "logic": {"builtin": "count", "costMs": 10},
                },
                sink("z"),
            ],
            [edge("s", "c", "fields", key="k"), edge("c", "z")],
        )
    )
    result = simulate(topology, initial_schedule(topology))
    # key groups 3 over 2 executors: 1 and 2 groups -> inputs 100 and 200, each capped at 100/s.
    assert result.executors["c#0"] == pytest.approx(100.0)
    assert result.executors["c#1"] == pytest.approx(100.0)
    assert result.throughput == pytest.approx(200.0)


def test_unbounded_source_is_refused() -> None:
    topology = parse_manifest(manifest([src("s"), sink("z")], [edge("s", "z")]))
    with pytest.raises(ValueError, match=r"source.rate"):
        simulate(topology, initial_schedule(topology))


def test_simulated_snapshot_reports_the_flows() -> None:
    topology = linear()
    schedule = initial_schedule(topology)
    snap = snapshot_from_simulation(topology, schedule, simulate(topology, schedule))
    assert snap.vertices["a"].processing_rate == pytest.approx(500.0)
    assert snap.vertices["s"].input_rate == pytest.approx(1000.0)
    assert snap.vertices["a"].input_rate is None  # derived from parents by the planner
    assert snap.placement == schedule.placement()


def test_optimum_scale_out_gives_the_bottleneck_the_slots() -> None:
    topology = linear()
    schedule = initial_schedule(topology)
    best, chosen = optimal_scale_out(topology, schedule, 3)
    new = [e for e in chosen.assignment if e not in schedule.assignment]
    assert len(new) == 3  # 5 executors on 2 nodes: 2.5 per node, rounded up
    assert all(chosen.node_of(e) == "node-2" for e in new)
    assert best >= simulate(topology, schedule).throughput
    assert sum(e.startswith("a#") for e in new) >= 2


def test_optimum_refuses_large_searches() -> None:
    topology = linear()
    with pytest.raises(SearchTooLarge):
        optimal_scale_out(topology, initial_schedule(topology), 6, limit=10)


def test_optimum_scale_in_picks_the_cheapest_node() -> None:
    topology = linear(nodes=3, resources={"limits": {"cpu": "1"}})
    schedule = Schedule.from_placement({"node-0": ["s#0", "a#0"], "node-1": ["a#1", "b#0"], "node-2": ["z#0"]}, 8)
    best, chosen = optimal_scale_in(topology, schedule, 2)
    assert "node-2" not in chosen.nodes  # removing the sink's node costs nothing
    assert best == pytest.approx(simulate(topology, schedule).throughput)
