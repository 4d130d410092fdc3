"""The rebalance by CPU Stela+ uses (`packing`: CPU packing and rate search): degrees a rate needs, few moves."""

from __future__ import annotations

import os

from elastream.core.planner.packing import RateModel, best_packing, pack
from elastream.core.schedule import Schedule, fresh_node_names, initial_schedule
from elastream.core.simulate import SimulationModel, simulate
from elastream.core.topology import parse_manifest
from elastream.crd import load_manifest
from support.manifests import edge, manifest, sink, src, work

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def test_a_keyed_vertex_grows_to_the_degree_that_lowers_its_largest_key_group_share() -> None:
    # Page Load's sessionize: 8 key groups, 2.4 ms a tuple (416.7/s a thread), 3,500/s offered. At 4
    # executors each owns 2 groups (1/4 of the input); 5, 6 or 7 leave some executor 2 groups, so the next
    # degree that helps is 8. At the whole offered rate none keeps up: the example offers more than any plan
    # processes (437.5/s an executor at 8, over a thread).
    topology = load_manifest(os.path.join(EXAMPLES, "pageload.yaml"))
    rates = RateModel.of(topology, initial_schedule(topology), SimulationModel.from_topology(topology), frozenset())
    assert rates.loads("sessionize", 6) == (875.0, 437.5, 437.5, 875.0, 437.5, 437.5)
    assert rates.degree("sessionize", 4, 0.4) == 4  # 350/s an executor
    assert rates.degree("sessionize", 4, 0.5) == 8  # 437.5/s at 4 to 7 executors: over a thread
    assert rates.degree("sessionize", 4, 1.0) is None  # 8 executors of 437.5/s: maxParallelism is 8
    assert rates.degree("parse", 4, 1.0) == 4
    assert rates.throughput == 3500.0


def test_best_packing_nears_page_loads_cpu_bound_with_the_moves_it_may_make() -> None:
    # 7 -> 8 nodes of 2 cores: a source tuple takes 5.8 ms of CPU, so no packing carries more than
    # 16 / 5.8 ms = 2,759/s, 0.788 of the offered 3,500/s. With 4 moves the rate search finds 0.77 of it.
    topology = load_manifest(os.path.join(EXAMPLES, "pageload.yaml"))
    schedule = initial_schedule(topology)
    model = SimulationModel.from_topology(topology)
    rates = RateModel.of(topology, schedule, model, frozenset())
    nodes = (*schedule.nodes, *fresh_node_names(schedule.nodes, 1))
    packing, tried = best_packing(topology, rates, schedule, nodes, schedule.parallelism(), 4, 0.01, 12)
    assert packing is not None and tried >= 1
    assert 0.77 < packing.fraction < 16 / 0.0058 / 3500 and packing.moves <= 4 and packing.forced == 0
    assert simulate(topology, packing.schedule, model).throughput >= packing.fraction * 3500 * (1 - 1e-9)
    demands = rates.demands(packing.schedule.parallelism(), packing.fraction)
    for node in packing.schedule.nodes:  # every node within its 2 cores at the rate found
        assert sum(demands[e] for e in packing.schedule.executors_on(node)) <= 2.0 + 1e-9
    # without moves the largest fraction is lower, and it is found by bisection
    fewer, _ = best_packing(topology, rates, schedule, nodes, schedule.parallelism(), 0, 0.01, 12)
    assert fewer is not None and fewer.moves == 0 and 0.6 < fewer.fraction < packing.fraction


def test_pack_keeps_executors_in_place_and_moves_the_smallest_that_relieves_a_node() -> None:
    topology = parse_manifest(
        manifest(
            [src("s", 1, rate=100), work("a", 2, costMs=5), work("b", 2, costMs=1), sink("z", 1)],
            [edge("s", "a"), edge("a", "b"), edge("b", "z")],
            nodes=3,
            slotsPerNode=4,
        )
    )
    old = Schedule.from_placement({"node-0": ["a#0", "a#1", "b#0", "b#1"], "node-1": ["s#0", "z#0"], "node-2": []}, 4)
    parallelism = old.parallelism()
    demand = {"s#0": 0.0, "z#0": 0.0, "a#0": 0.9, "a#1": 0.9, "b#0": 0.2, "b#1": 0.2}
    nodes = ("node-0", "node-1", "node-2")
    # node-0 needs 2.2 of 2 cores: one b leaves (0.2 suffices), for the node with the most CPU left
    packed = pack(topology, old, nodes, parallelism, demand, 2.0, max_moves=1)
    assert packed is not None
    schedule, moves, forced = packed
    assert (moves, forced) == (1, 0)
    assert sorted(schedule.executors_on("node-0")) == ["a#0", "a#1", "b#0"]
    assert schedule.node_of("b#1") == "node-2"
    assert pack(topology, old, nodes, parallelism, demand, 2.0, max_moves=0) is None
    # nothing over its CPU: nothing moves
    assert pack(topology, old, nodes, parallelism, demand, 2.5, max_moves=0) == (
        Schedule(dict(old.assignment), nodes, old.slots_per_node),
        0,
        0,
    )
