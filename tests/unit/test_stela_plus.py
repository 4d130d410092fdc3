"""Stela+ (`stela-plus`): Stela's plan improved by a bounded local search on the fluid model and by a
rebalance by CPU that may move existing executors."""

from __future__ import annotations

import dataclasses
import glob
import os
import random

import pytest

from elastream.core.metrics import rates_from_snapshot
from elastream.core.pareto import offered_throughput
from elastream.core.planner import make_plan
from elastream.core.planner.packing import RateModel
from elastream.core.planner.stela import stela_scale_out
from elastream.core.planner.stela_plus import DEFAULT_BUDGET, SearchBudget, stela_plus_scale_out
from elastream.core.schedule import Schedule, executor_order, initial_schedule, node_name
from elastream.core.simulate import SimulationModel, new_slot_count, simulate, snapshot_from_simulation
from elastream.core.topology import Topology, parse_manifest, split_executor_id
from elastream.crd import load_manifest
from elastream.sim.optimum import optimal_scale_out
from elastream.sim.workloads import MIXED_GROUPINGS, PARTITIONED_GROUPINGS, random_topology
from support.manifests import edge, manifest, sink, src, work

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def steady(topology: Topology) -> tuple[Schedule, object]:
    schedule = initial_schedule(topology)
    return schedule, snapshot_from_simulation(topology, schedule, simulate(topology, schedule))


def roomy(topology: Topology, target: int) -> Topology:
    need = -(-topology.executors // target)
    return dataclasses.replace(topology, slots_per_node=max(topology.slots_per_node, need))


def mixed_case() -> Topology:
    """A random DAG with `all` and `global` streams where Stela reaches 0.83 of the optimum: the bottleneck
    v4 takes everything v3 emits through `global` on executor 0, so another v4 does nothing; the sink v7's
    fields shares on the CPU-bound old nodes are what another executor relieves."""
    vertices = [
        src("v0", 3, rate=500.0),
        work("v1", 3, costMs=1.222),
        work("v2", 3, costMs=0.282, selectivity=0.5),
        work("v3", 2, costMs=1.229),
        work("v4", 1, costMs=2.009),
        work("v5", 2, costMs=0.116, selectivity=0.5),
        work("v6", 3, costMs=1.058),
        sink("v7", 3, costMs=0.81),
    ]
    streams = [
        edge("v0", "v1"),
        edge("v0", "v2", "all"),
        edge("v0", "v3"),
        edge("v0", "v6"),
        edge("v0", "v7"),
        edge("v1", "v6"),
        edge("v2", "v4"),
        edge("v2", "v6", "global"),
        edge("v3", "v4", "global"),
        edge("v3", "v5", "fields", key="key"),
        edge("v3", "v6", "fields", key="key"),
        edge("v4", "v7"),
        edge("v5", "v7", "fields", key="key"),
        edge("v6", "v7", "fields", key="key"),
    ]
    return parse_manifest(manifest(vertices, streams, nodes=4, slotsPerNode=7, resources={"limits": {"cpu": "2"}}))


def plans(topology: Topology, target: int):
    schedule, snap = steady(topology)
    stela = make_plan(topology, schedule, snap, target, "stela")
    plus = make_plan(topology, schedule, snap, target, "stela-plus")
    return schedule, stela, plus


def assert_valid(topology: Topology, old: Schedule, new: Schedule, target: int) -> None:
    assert len(new.nodes) == target
    for node in new.nodes:
        assert len(new.executors_on(node)) <= new.slots_per_node
    parallelism = new.parallelism()
    for v, k in parallelism.items():
        assert 1 <= k <= topology.vertices[v].max_parallelism
        indices = sorted(split_executor_id(e)[1] for e in new.assignment if split_executor_id(e)[0] == v)
        assert indices == list(range(k))  # executor ids stay contiguous
    assert set(parallelism) == set(topology.order)
    # at most M = new_slot_count(old, nodes changed) existing executors move besides a removed node's
    removed = [n for n in old.nodes if n not in new.nodes]
    forced = sum(len(old.executors_on(n)) for n in removed)
    moved = sum(1 for e, n in old.assignment.items() if e in new.assignment and new.assignment[e] != n)
    assert moved - forced <= new_slot_count(old, abs(target - len(old.nodes)))
    if target > len(old.nodes):
        assert set(old.nodes) <= set(new.nodes) and not removed
        assert all(e in new.assignment for e in old.assignment)  # a scale-out removes no executor
    else:
        assert all(parallelism[v] >= k for v, k in old.parallelism().items())  # degrees never go down


def example_topologies() -> list[tuple[str, Topology]]:
    found = []
    for path in sorted(glob.glob(os.path.join(EXAMPLES, "*.yaml"))):
        topology = load_manifest(path)
        try:
            simulate(topology, initial_schedule(topology))
        except ValueError:
            continue  # a vertex the fluid model cannot bound: no prediction to improve
        found.append((os.path.basename(path), topology))
    return found


@pytest.mark.parametrize("direction", ["out", "in"])
def test_never_below_stela_on_the_examples(direction: str) -> None:
    for name, topology in example_topologies():
        target = topology.nodes + 1 if direction == "out" else -(-topology.nodes // 2)
        if direction == "in":
            topology = roomy(topology, target)
        schedule, stela, plus = plans(topology, target)
        assert plus.predicted_throughput >= stela.predicted_throughput * (1 - 1e-9), name
        assert_valid(topology, schedule, plus.new_schedule, target)
        assert "search" in plus.steps[-1]


@pytest.mark.parametrize("groupings", [PARTITIONED_GROUPINGS, MIXED_GROUPINGS])
def test_never_below_stela_on_random_dags(groupings: tuple[str, ...]) -> None:
    for seed in range(8):
        rng = random.Random(seed)
        topology = random_topology(rng, rng.randint(4, 12), nodes=rng.randint(2, 4), groupings=groupings)
        for target in (topology.nodes + 1, -(-topology.nodes // 2)):
            case = roomy(topology, target) if target < topology.nodes else topology
            schedule, stela, plus = plans(case, target)
            assert plus.predicted_throughput >= stela.predicted_throughput * (1 - 1e-9), (seed, target)
            assert_valid(case, schedule, plus.new_schedule, target)


def test_reaches_the_optimum_where_stela_falls_short_with_all_and_global() -> None:
    topology = mixed_case()
    schedule, stela, plus = plans(topology, 5)
    optimum, _ = optimal_scale_out(topology, schedule, 5)
    assert stela.predicted_throughput < 0.9 * optimum
    assert plus.predicted_throughput >= 0.98 * optimum
    search = plus.steps[-1]["search"]
    assert search["predicted"][1] > search["predicted"][0]
    assert_valid(topology, schedule, plus.new_schedule, 5)


def test_improves_the_diamond_example() -> None:
    topology = load_manifest(os.path.join(EXAMPLES, "diamond.yaml"))
    schedule, stela, plus = plans(topology, topology.nodes + 1)
    optimum, _ = optimal_scale_out(topology, schedule, topology.nodes + 1)
    assert stela.predicted_throughput < 0.95 * optimum
    assert plus.predicted_throughput >= 0.98 * optimum


def test_scale_in_moves_executors_off_cpu_bound_nodes() -> None:
    # pageload's ETPSum removal leaves a CPU-bound node; moving executors among the remaining nodes pays.
    topology = load_manifest(os.path.join(EXAMPLES, "pageload.yaml"))
    target = -(-topology.nodes // 2)
    topology = roomy(topology, target)
    schedule, stela, plus = plans(topology, target)
    assert plus.predicted_throughput > stela.predicted_throughput * 1.05
    assert plus.removed_nodes == stela.removed_nodes  # Stela's choice of nodes stands
    assert_valid(topology, schedule, plus.new_schedule, target)


def test_deterministic() -> None:
    topology = mixed_case()
    schedule, snap = steady(topology)
    first = make_plan(topology, schedule, snap, 5, "stela-plus")
    second = make_plan(topology, schedule, snap, 5, "stela-plus")
    assert first.new_schedule == second.new_schedule and first.steps == second.steps


def test_simulations_stay_within_the_budget() -> None:
    topology = mixed_case()
    schedule, snap = steady(topology)
    rates = rates_from_snapshot(topology, snap)
    model = SimulationModel.from_topology(topology, snap)
    for budget in (SearchBudget(simulations=3), SearchBudget(rounds=1), SearchBudget(work=3_000.0), DEFAULT_BUDGET):
        new, steps = stela_plus_scale_out(topology, schedule, rates, 5, 1.2, model, budget=budget)
        search = steps[-1]["search"]
        assert search["simulations"] <= budget.simulations
        assert search["rounds"] <= budget.rounds
        assert simulate(topology, new, model).throughput == pytest.approx(search["predicted"][1])
    # one simulation that does not fit twice in the work budget: no search, Stela's plan
    new, steps = stela_plus_scale_out(topology, schedule, rates, 5, 1.2, model, budget=SearchBudget(work=10.0))
    assert steps[-1]["search"]["simulations"] == 0 and steps[-1]["search"]["predicted"] is None
    assert new == stela_scale_out(topology, schedule, rates, 5, 1.2)[0]


def slow_b(nodes: int) -> Topology:
    """s -> a -> b (4 ms an event, the bottleneck) -> z on `nodes` nodes, no CPU limit."""
    return parse_manifest(
        manifest(
            [src("s", 2, rate=2000), work("a", 2, costMs=0.2), work("b", 4, costMs=4), sink("z", 2, costMs=0.1)],
            [edge("s", "a"), edge("a", "b"), edge("b", "z")],
            nodes=nodes,
        )
    )


def test_scale_in_without_a_cpu_limit_is_stelas_plan() -> None:
    topology = slow_b(4)
    _, stela, plus = plans(topology, 2)
    assert plus.new_schedule == stela.new_schedule
    assert plus.steps[-1]["search"]["simulations"] == 0
    assert "placement cannot change" in plus.steps[-1]["reason"]


# ---- cheap moves: the rebalance by CPU ---------------------------------------------------------------------


def example(name: str) -> Topology:
    return load_manifest(os.path.join(EXAMPLES, f"{name}.yaml"))


def cpu_bound(topology: Topology, schedule: Schedule, nodes: int) -> float:
    """The most any plan on `nodes` nodes can process (the sinks' tuples/s): a source tuple costs the same CPU
    wherever its executors run (no `all` stream here), and a node has `node_cpu` cores."""
    model = SimulationModel.from_topology(topology)
    assert model.node_cpu is not None
    rates = RateModel.of(topology, schedule, model, frozenset())
    cpu_per_second = sum(rates.demands(schedule.parallelism(), 1.0).values())  # at the offered rate
    return rates.throughput * nodes * model.node_cpu / cpu_per_second


@pytest.mark.parametrize("name", ["pageload", "processing"])
def test_keyed_yahoo_shapes_scale_out_at_least_60_percent_over_round_robin(name: str) -> None:
    """The issue's target for `make bench-paper`: Page Load (7 -> 8) and Processing (8 -> 9) scale out at least
    +60 % over Storm's default (round-robin), at saturation: the examples offer more than the new node count
    can process (test_examples), so the plan sets the throughput. Stela's new executors share the new node
    while the old keyed executors stay on crowded nodes (Page Load's fields vertices only gain at 8 executors
    of 8 key groups); moving at most M existing executors and growing the keyed vertices comes within 2 % of
    the CPU bound: Page Load 2,712/s, 1.66x round-robin's 1,633/s (the bound, 2,759/s, is 1.69x);
    Processing 5,722/s, 1.79x its 3,200/s (the bound, 5,740/s, is 1.79x)."""
    topology = example(name)
    target = topology.nodes + 1
    schedule, stela, plus = plans(topology, target)
    _, snap = steady(topology)
    round_robin = make_plan(topology, schedule, snap, target, "round-robin")
    offered = offered_throughput(topology, SimulationModel.from_topology(topology))
    bound = cpu_bound(topology, schedule, target)
    assert offered is not None and offered > bound
    assert stela.predicted_throughput < 1.25 * round_robin.predicted_throughput
    assert plus.predicted_throughput >= 1.6 * round_robin.predicted_throughput
    assert plus.predicted_throughput >= stela.predicted_throughput
    assert 0.98 * bound <= plus.predicted_throughput <= bound * (1 + 1e-9)
    assert len(plus.moves) <= new_slot_count(schedule, 1)
    assert_valid(topology, schedule, plus.new_schedule, target)
    rebalance = plus.steps[-1]["search"]["rebalance"]
    assert rebalance["chosen"] is not None and rebalance["offered"] == pytest.approx(offered)


def test_page_load_grows_its_keyed_vertices_to_the_next_useful_degree() -> None:
    # 8 key groups: 5, 6 or 7 executors still leave one executor 2 of them, so sessionize and join gain only
    # at 8; Stela's one executor at a time stops at 6.
    topology = example("pageload")
    _, stela, plus = plans(topology, topology.nodes + 1)
    assert stela.parallelism["sessionize"] < 8 or stela.parallelism["join"] < 8
    assert plus.parallelism["sessionize"] == plus.parallelism["join"] == 8


def test_moves_stay_within_the_budget_and_each_cap_predicts_at_least_the_one_below() -> None:
    # Page Load 7 -> 8: M = 4 (Stela's 4 new executors). Without moves the grown keyed vertices' executors
    # crowd some node (2,424/s, 0.88 of the CPU bound); each move allowed relieves one, up to 2,712/s at 4.
    topology = example("pageload")
    schedule, snap = steady(topology)
    rates = rates_from_snapshot(topology, snap)
    model = SimulationModel.from_topology(topology, snap)
    stela = simulate(topology, stela_scale_out(topology, schedule, rates, 8, 1.2)[0], model).throughput
    bound = cpu_bound(topology, schedule, 8)
    predictions = []
    for moves in range(new_slot_count(schedule, 1) + 1):
        new, steps = stela_plus_scale_out(topology, schedule, rates, 8, 1.2, model, budget=SearchBudget(moves=moves))
        moved = [e for e, n in schedule.assignment.items() if new.assignment[e] != n]
        assert len(moved) <= moves
        predicted = simulate(topology, new, model).throughput
        assert predicted == pytest.approx(steps[-1]["search"]["predicted"][1])
        assert predicted >= stela
        predictions.append(predicted)
    assert predictions == sorted(predictions)
    assert predictions[0] < 0.9 * bound
    assert predictions[-1] >= 0.98 * bound


def page_load_packed(nodes: int) -> tuple[Topology, Schedule]:
    """Page Load on `nodes` nodes, its executors in topological order in contiguous blocks (each node holds
    executors of at most 2 operators: the paper's initial allocation for its scale-in; bench/stela.py)."""
    topology = dataclasses.replace(example("pageload"), nodes=nodes)
    executors = executor_order(topology)
    names = [node_name(i) for i in range(nodes)]
    per_node, extra = divmod(len(executors), nodes)
    placement: dict[str, list[str]] = {}
    for i, node in enumerate(names):
        start = i * per_node + min(i, extra)
        placement[node] = executors[start : start + per_node + (1 if i < extra else 0)]
    return topology, Schedule.from_placement(placement, topology.slots_per_node, names)


def test_page_load_scale_in_weighs_the_nodes_using_least_cpu_and_nears_the_cpu_bound() -> None:
    """From 8 packed nodes to 4 (the paper's Page Load Scaling): Stela's ETPSum removes beacons, parse,
    sessionize and geo (upstream of the congested sessionize, ETP 0) and deals their executors round-robin,
    so the CPU-heavy sessionize and join executors crowd some nodes. stela-plus also packs the layout that
    removes the four nodes using least CPU (beacons', parse's and the two tail nodes) and keeps what predicts
    most for its moves; either way 8 cores carry at most 8 / 5.8 ms = 1,379 tuples/s, and it comes within 2 %
    of that (1,367/s), 1.7x Stela's 796/s.

    The paper has Stela 2-5x above random removal; the model forbids 2x both random groups here: random
    group 1 (seed 1) keeps 1,040/s, 75 % of the CPU bound, so 2x it (2,080/s) is above what any plan on 4
    nodes of 2 cores can process. What the model allows, and stela-plus reaches: 1.3x group 1, 2x group 2
    (661/s)."""
    topology, schedule = page_load_packed(8)
    snap = snapshot_from_simulation(topology, schedule, simulate(topology, schedule))
    stela = make_plan(topology, schedule, snap, 4, "stela")
    plus = make_plan(topology, schedule, snap, 4, "stela-plus")
    random_plans = [make_plan(topology, schedule, snap, 4, "random", seed=seed) for seed in (1, 2)]
    assert stela.removed_nodes == ["node-0", "node-1", "node-2", "node-3"]
    rebalance = plus.steps[-1]["search"]["rebalance"]
    labels = [c["label"] for c in rebalance["candidates"]]
    assert any(label.startswith("least CPU: node-7, node-0, node-6, node-1 removed") for label in labels)
    assert sorted(plus.removed_nodes) in (stela.removed_nodes, ["node-0", "node-1", "node-6", "node-7"])
    assert plus.predicted_throughput >= max(c["predicted"] for c in rebalance["candidates"]) * (1 - 1e-9)
    model = SimulationModel.from_topology(topology, snap)
    rates = RateModel.of(topology, schedule, model, frozenset())
    cpu_per_second = sum(rates.demands(schedule.parallelism(), 1.0).values())  # at the offered 3,500/s
    bound = rates.throughput * 4 * 2.0 / cpu_per_second
    assert bound == pytest.approx(8 / 0.0058, rel=1e-3)
    assert bound == pytest.approx(cpu_bound(topology, schedule, 4))
    assert 2.0 * random_plans[0].predicted_throughput > bound  # 2x random group 1: more than 4 nodes can do
    assert plus.predicted_throughput >= 0.98 * bound
    assert plus.predicted_throughput >= 1.3 * random_plans[0].predicted_throughput
    assert plus.predicted_throughput >= 2.0 * random_plans[1].predicted_throughput
    assert plus.predicted_throughput >= 1.7 * stela.predicted_throughput
    assert_valid(topology, schedule, plus.new_schedule, 4)


def test_rebalance_needs_a_node_cpu_limit() -> None:
    topology = slow_b(2)
    _, _, plus = plans(topology, 3)
    rebalance = plus.steps[-1]["search"]["rebalance"]
    assert rebalance["candidates"] == [] and rebalance["chosen"] is None
    assert "no node CPU limit" in rebalance["stopped"]
    assert plus.moves == []


def test_rebalance_stays_within_its_work_budget() -> None:
    topology = example("pageload")
    schedule, snap = steady(topology)
    rates = rates_from_snapshot(topology, snap)
    model = SimulationModel.from_topology(topology, snap)
    new, steps = stela_plus_scale_out(topology, schedule, rates, 8, 1.2, model, budget=SearchBudget(rebalance_work=500))
    search = steps[-1]["search"]
    assert search["rebalance"]["stopped"] == "budget spent" and search["rebalance"]["candidates"] == []
    assert all(new.assignment[e] == n for e, n in schedule.assignment.items())  # the climb's plan: no moves
