"""The fluid model against hand-computed steady states, and the exhaustive optimum."""

from __future__ import annotations

import pytest

from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.simulate import simulate, snapshot_from_simulation
from elastream.core.topology import parse_manifest
from elastream.sim.optimum import SearchTooLarge, optimal_scale_in, optimal_scale_out
from support.manifests import edge, manifest, sink, src, work


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
    # key groups 3 over 2 executors: one gets 2/3 of the input, the other 1/3, each manages 100/s; the one
    # with 2/3 blocks the source at 150/s (back-pressure), so the other processes 50/s.
    assert sorted(result.executors[e] for e in ("c#0", "c#1")) == pytest.approx([50.0, 100.0])
    assert result.vertices["s"].processing_rate == pytest.approx(150.0)
    assert result.vertices["s"].input_rate == pytest.approx(300.0)  # offered
    assert result.throughput == pytest.approx(150.0)
    assert result.capacity["c"] == pytest.approx(150.0)  # of this key mix


def test_a_source_feeding_two_branches_goes_at_the_slowest_branch_pace() -> None:
    topology = parse_manifest(
        manifest(
            [src("s", 1, rate=1000), work("fast", 1, costMs=0.1), work("slow", 1, costMs=4), sink("y"), sink("z")],
            [edge("s", "fast"), edge("s", "slow"), edge("fast", "y"), edge("slow", "z")],
        )
    )
    result = simulate(topology, initial_schedule(topology))
    # every tuple goes to both branches and a full channel blocks the source: 250/s for both
    assert result.vertices["s"].processing_rate == pytest.approx(250.0)
    assert result.vertices["fast"].processing_rate == pytest.approx(250.0)
    assert result.throughput == pytest.approx(500.0)


def _crowded(balance: str) -> float:
    """a#0 shares node-0's one core with h (half a core); a#1 has node-1's core to itself."""
    topology = parse_manifest(
        manifest(
            [
                src("s", 1, rate=10_000),
                work("a", 2, costMs=4),
                sink("z"),
                src("h", 1, rate=250, costMs=2),
                sink("hz"),
            ],
            [edge("s", "a", balance=balance), edge("a", "z"), edge("h", "hz")],
            nodes=2,
            resources={"limits": {"cpu": "1"}},
        )
    )
    nodes = ("node-0", "node-1")
    assignment = {"s#0": "node-1", "a#0": "node-0", "a#1": "node-1", "z#0": "node-1", "h#0": "node-0", "hz#0": "node-0"}
    return simulate(topology, Schedule(assignment, nodes, 8)).vertices["a"].processing_rate


def test_load_aware_shuffle_pools_the_executors_and_round_robin_waits_for_the_slowest() -> None:
    # a#0 gets half of node-0's core (125/s at 4 ms), a#1 a whole core (250/s)
    assert _crowded("load-aware") == pytest.approx(375.0, rel=1e-6)
    assert _crowded("round-robin") == pytest.approx(250.0, rel=1e-6)  # 2 x the slower one


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
