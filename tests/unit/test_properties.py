"""Property tests on random DAGs (hypothesis): ETP bounds, sink shares, planner invariants."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastream.core.planner import PlanningError, etp_table, make_plan
from elastream.core.schedule import initial_schedule
from elastream.core.simulate import simulate, snapshot_from_simulation
from elastream.core.workloads import random_topology

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def case(seed: int, size: int):
    topology = random_topology(random.Random(seed), size, nodes=3)
    schedule = initial_schedule(topology)
    return topology, schedule, snapshot_from_simulation(topology, schedule, simulate(topology, schedule))


@SETTINGS
@given(seed=st.integers(0, 10**6), size=st.integers(3, 25), rate=st.floats(1.0, 3.0))
def test_etp_is_a_fraction_and_a_sink_has_its_share(seed: int, size: int, rate: float) -> None:
    topology, _, snap = case(seed, size)
    table = etp_table(topology, snap, rate)
    for row in table.vertices.values():
        assert 0.0 <= row.etp <= 1.0 + 1e-12
    if table.throughput > 0:
        for sink in topology.sinks:
            assert table.vertices[sink].etp == snap.vertices[sink].processing_rate / table.throughput


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    size=st.integers(3, 20),
    added=st.integers(1, 3),
    strategy=st.sampled_from(["stela", "random"]),
)
def test_scale_out_never_moves_an_existing_executor(seed: int, size: int, added: int, strategy: str) -> None:
    topology, schedule, snap = case(seed, size)
    plan = make_plan(topology, schedule, snap, len(schedule.nodes) + added, strategy, seed=seed)
    assert plan.moves == []
    assert all(plan.new_schedule.node_of(e) == n for e, n in schedule)
    assert {n for _, n in plan.new_executors} <= set(plan.added_nodes)
    for vertex, k in plan.parallelism.items():
        assert k <= topology.vertices[vertex].max_parallelism


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    size=st.integers(3, 20),
    target=st.integers(1, 6),
    strategy=st.sampled_from(["stela", "round-robin", "least-link-load", "random"]),
)
def test_plans_respect_slots_and_node_counts(seed: int, size: int, target: int, strategy: str) -> None:
    topology = random_topology(random.Random(seed), size, nodes=4, slots_per_node=24)
    schedule = initial_schedule(topology)
    snap = snapshot_from_simulation(topology, schedule, simulate(topology, schedule))
    if target * schedule.slots_per_node < len(schedule):
        with pytest.raises(PlanningError, match=r"raise spec.slotsPerNode"):
            make_plan(topology, schedule, snap, target, strategy, seed=seed)
        return
    plan = make_plan(topology, schedule, snap, target, strategy, seed=seed)
    assert len(plan.new_schedule.nodes) == target
    assert len(plan.removed_nodes) <= max(0, len(schedule.nodes) - target)
    for node in plan.new_schedule.nodes:
        assert len(plan.new_schedule.executors_on(node)) <= schedule.slots_per_node
    # every vertex keeps at least its executors (nothing is dropped by scale-in)
    for vertex, k in schedule.parallelism().items():
        assert plan.parallelism[vertex] >= k
