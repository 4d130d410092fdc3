"""Property tests on random DAGs (hypothesis): ETP bounds, sink shares, planner invariants.

The strategies draw the DAG itself (vertices, edges, groupings, parallelism, rates and costs), so a failing
case shrinks to a small DAG with plain settings rather than to another random seed.
"""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastream.core.planner import PlanningError, etp_table, make_plan
from elastream.core.planner.etp import etp_map
from elastream.core.schedule import initial_schedule
from elastream.core.simulate import simulate, snapshot_from_simulation
from elastream.core.topology import Grouping, parse_manifest
from support.manifests import edge, manifest, sink, src, work

GROUPINGS = get_args(Grouping)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOURCE_RATES = (500.0, 1000.0, 2000.0, 4000.0)
SELECTIVITIES = (1.0, 0.5, 1.5)


@st.composite
def dags(draw: st.DrawFn, max_vertices: int, nodes: int, slots_per_node: int | None = None) -> dict:
    """A StreamTopology document: vertices v0..v(n-1) in topological order, the first 1-3 of them sources;
    every other vertex has 1-3 parents before it (so diamonds and merges occur, and no cycle), a source
    no vertex chose as parent feeds one later vertex, and a vertex without children is a sink. Shrinking
    goes to fewer vertices, parents toward v0, shuffle groupings (GROUPINGS' first), parallelism 1, the
    lowest rate and cheapest costs."""
    n = draw(st.integers(2, max_vertices))
    n_sources = draw(st.integers(1, min(3, n - 1)))
    edges: set[tuple[int, int]] = set()
    for child in range(n_sources, n):
        parents = draw(st.lists(st.integers(0, child - 1), min_size=1, max_size=min(3, child), unique=True))
        edges.update((parent, child) for parent in parents)
    for source in range(n_sources):
        if not any(parent == source for parent, _ in edges):
            edges.add((source, draw(st.integers(n_sources, n - 1))))
    has_child = {parent for parent, _ in edges}
    vertices = []
    for i in range(n):
        name, parallelism = f"v{i}", draw(st.integers(1, 3))
        if i < n_sources:
            vertex = src(name, parallelism, rate=draw(st.sampled_from(SOURCE_RATES)))
        elif i in has_child:
            cost, selectivity = draw(st.floats(0.05, 3.0)), draw(st.sampled_from(SELECTIVITIES))
            vertex = work(name, parallelism, costMs=cost, selectivity=selectivity)
        else:
            vertex = sink(name, parallelism, costMs=draw(st.floats(0.05, 1.5)))
        vertices.append({**vertex, "maxParallelism": 16})
    streams = []
    for parent, child in sorted(edges):
        grouping = draw(st.sampled_from(GROUPINGS))
        streams.append(edge(f"v{parent}", f"v{child}", grouping, **({"key": "key"} if grouping == "fields" else {})))
    executors = sum(v["parallelism"] for v in vertices)
    slots = slots_per_node or max(4, -(-executors // nodes) + 2)
    return manifest(vertices, streams, nodes=nodes, slotsPerNode=slots, resources={"limits": {"cpu": "2"}})


def case(doc: dict):
    topology = parse_manifest(doc)
    schedule = initial_schedule(topology)
    return topology, schedule, snapshot_from_simulation(topology, schedule, simulate(topology, schedule))


@SETTINGS
@given(doc=dags(max_vertices=25, nodes=3), rate=st.floats(1.0, 3.0))
def test_etp_is_a_fraction_and_a_sink_has_its_share(doc: dict, rate: float) -> None:
    topology, _, snap = case(doc)
    table = etp_table(topology, snap, rate)
    for row in table.vertices.values():
        assert 0.0 <= row.etp <= 1.0 + 1e-12
    if table.throughput > 0:
        for sink in topology.sinks:
            assert table.vertices[sink].etp == snap.vertices[sink].processing_rate / table.throughput


@SETTINGS
@given(
    doc=dags(max_vertices=20, nodes=3),
    added=st.integers(1, 3),
    strategy=st.sampled_from(["stela", "random"]),
    seed=st.integers(0, 2**16),
)
def test_scale_out_never_moves_an_existing_executor(doc: dict, added: int, strategy: str, seed: int) -> None:
    topology, schedule, snap = case(doc)
    plan = make_plan(topology, schedule, snap, len(schedule.nodes) + added, strategy, seed=seed)
    assert plan.moves == []
    assert all(plan.new_schedule.node_of(e) == n for e, n in schedule)
    assert {n for _, n in plan.new_executors} <= set(plan.added_nodes)
    for vertex, k in plan.parallelism.items():
        assert k <= topology.vertices[vertex].max_parallelism


@SETTINGS
@given(
    doc=dags(max_vertices=20, nodes=4, slots_per_node=24),
    target=st.integers(1, 6),
    strategy=st.sampled_from(["stela", "round-robin", "least-link-load", "random"]),
    seed=st.integers(0, 2**16),
)
def test_plans_respect_slots_and_node_counts(doc: dict, target: int, strategy: str, seed: int) -> None:
    topology, schedule, snap = case(doc)
    slots = target * schedule.slots_per_node
    if slots < len(topology.order):
        with pytest.raises(PlanningError, match=r"need one executor each"):
            make_plan(topology, schedule, snap, target, strategy, seed=seed)
        return
    plan = make_plan(topology, schedule, snap, target, strategy, seed=seed)
    assert len(plan.new_schedule.nodes) == target
    assert len(plan.removed_nodes) <= max(0, len(schedule.nodes) - target)
    for node in plan.new_schedule.nodes:
        assert len(plan.new_schedule.executors_on(node)) <= schedule.slots_per_node
    if slots < len(schedule):
        # a scale-in that does not fit lowers parallelism: to exactly the slots, never below 1, and says so
        assert len(plan.new_schedule) == slots
        assert all(1 <= plan.parallelism[v] <= k for v, k in schedule.parallelism().items())
        assert any("lowered" in step for step in plan.steps)
        return
    # every vertex keeps at least its executors (nothing is dropped by a scale-in that fits)
    for vertex, k in schedule.parallelism().items():
        assert plan.parallelism[vertex] >= k


@st.composite
def diamond_ladders(draw: st.DrawFn) -> dict:
    """A ladder of diamonds: s -> (2-3 branches) -> join -> (branches) -> join ... -> out, some joins also
    feeding a side sink. Every rung doubles (or triples) the paths to everything below it, which is where
    summing over paths (Algorithm 1 as printed) exceeds 1."""
    rungs = draw(st.integers(1, 10))
    vertices = [src("s", draw(st.integers(1, 3)), rate=float(draw(st.sampled_from([500, 1000, 4000]))))]
    streams = []
    upstream = "s"
    for r in range(rungs):
        join = f"j{r}"
        for b in range(draw(st.integers(2, 3))):
            branch = f"r{r}b{b}"
            vertices.append(work(branch, draw(st.integers(1, 3)), costMs=draw(st.floats(0.05, 4.0))))
            streams += [
                edge(upstream, branch, draw(st.sampled_from(["shuffle", "shuffle", "all", "global"]))),
                edge(branch, join),
            ]
        vertices.append(work(join, draw(st.integers(1, 3)), costMs=draw(st.floats(0.05, 2.0))))
        if draw(st.booleans()):
            vertices.append(sink(f"x{r}", 1, costMs=draw(st.floats(0.01, 1.0))))
            streams.append(edge(join, f"x{r}"))
        upstream = join
    vertices.append(sink("out", 1, costMs=draw(st.floats(0.01, 1.0))))
    streams.append(edge(upstream, "out"))
    return manifest(vertices, streams, nodes=2, slotsPerNode=64, resources={"limits": {"cpu": "2"}})


@SETTINGS
@given(doc=diamond_ladders(), rate=st.floats(1.0, 3.0), data=st.data())
def test_etp_is_a_fraction_even_on_ladders_of_diamonds(doc: dict, rate: float, data: st.DataObject) -> None:
    topology = parse_manifest(doc)
    schedule = initial_schedule(topology)
    snap = snapshot_from_simulation(topology, schedule, simulate(topology, schedule))
    table = etp_table(topology, snap, rate)
    for row in table.vertices.values():
        assert 0.0 <= row.etp <= 1.0 + 1e-12
    # any congested set, any sink rates: still a fraction, and with nothing congested the source reaches
    # every sink exactly once (ETP 1) although it has 2^rungs paths to `out`
    rates = {v: data.draw(st.floats(0.0, 1e4)) for v in topology.order}
    congested = frozenset(data.draw(st.sets(st.sampled_from(topology.order))))
    for value in etp_map(topology, rates, congested).values():
        assert 0.0 <= value <= 1.0 + 1e-12
    if sum(rates[s] for s in topology.sinks) > 0:
        assert etp_map(topology, rates, frozenset())["s"] == pytest.approx(1.0)
