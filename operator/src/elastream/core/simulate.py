"""Fluid model: the steady-state throughput of a topology under a schedule. The yardstick for planners.

Model (the one Stela's ETP reasons in: a congested vertex limits its own subtree, queues absorb the rest,
there is no back-pressure to the sources):

- An executor of vertex v processes at most `capacity(v)` tuples/s (1000 / costMs: one thread) and uses
  `cost(v)` CPU-seconds per tuple. Executors on one node share its `node_cpu` cores (the worker pod's CPU
  limit) max-min fairly, as an OS scheduler shares cores among busy threads; without a limit, nodes are
  unconstrained and only per-executor capacity binds.
- A source vertex is offered `source_rate` tuples/s in total, split evenly over its executors; without a
  rate it emits as fast as its executors can.
- An executor processes min(its input, its capacity, its CPU share / cost) and emits processed × selectivity
  on every outgoing stream. Streams split a vertex's output over the child's executors by grouping:
  shuffle evenly, fields by each executor's share of key groups (keys uniform over key groups), all to every
  executor, global to executor 0.
- Throughput = the sum of the sinks' processing rates.

CPU shares depend on demands, which depend on upstream flows, which depend on shares: the steady state is
found by damped fixed-point iteration (to 1e-9 relative, or 500 rounds).

`optimal_scale_out` and `optimal_scale_in` search exhaustively (small cases) for the best schedule a planner
could have produced, so planners can be compared against the optimum.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elastream.core.metrics import MetricSnapshot, VertexMetrics
from elastream.core.schedule import Schedule, fresh_node_names, key_group_ranges
from elastream.core.topology import Topology, executor_id, split_executor_id

INF = math.inf


class SearchTooLarge(ValueError):
    """An exhaustive search would evaluate more schedules than its limit allows."""


@dataclass(frozen=True)
class VertexModel:
    capacity: float = INF  # tuples/s one executor can process
    cost_s: float = 0.0  # CPU-seconds one tuple takes
    selectivity: float = 1.0
    source_rate: float | None = None  # total offered rate of a source vertex, None: as fast as possible


@dataclass(frozen=True)
class SimulationModel:
    vertices: Mapping[str, VertexModel]
    node_cpu: float | None = None

    @staticmethod
    def from_topology(topology: Topology, snapshot: MetricSnapshot | None = None) -> SimulationModel:
        """Capacities and selectivities from the manifest (costMs, selectivity, rate); where the manifest
        states no cost, they are calibrated from the snapshot: a vertex's true processing rate (or, if it
        is congested, its processing rate) divided by its executors is taken as one executor's capacity."""
        models: dict[str, VertexModel] = {}
        for name, vertex in topology.vertices.items():
            cost_ms = vertex.cost_ms
            metrics = snapshot.vertices.get(name) if snapshot is not None else None
            capacity, cost_s = INF, 0.0
            if cost_ms is not None and cost_ms > 0:
                capacity, cost_s = 1000.0 / cost_ms, cost_ms / 1000.0
            elif cost_ms is None and metrics is not None:
                capacity = _calibrated_capacity(metrics)
                cost_s = 0.0 if math.isinf(capacity) or capacity <= 0 else 1.0 / capacity
            selectivity = vertex.selectivity
            if "selectivity" not in vertex.config and metrics is not None and metrics.processing_rate > 0:
                selectivity = metrics.emit_rate / metrics.processing_rate
            source_rate = vertex.source_rate
            if vertex.kind == "source" and source_rate is None and metrics is not None:
                source_rate = metrics.input_rate
            models[name] = VertexModel(capacity, cost_s, selectivity, source_rate)
        return SimulationModel(models, topology.node_cpu)


def _calibrated_capacity(metrics: VertexMetrics) -> float:
    rate = metrics.executor_rate
    if rate is not None and rate > 0:
        return rate
    if metrics.input_rate is not None and metrics.input_rate > metrics.processing_rate * 1.05:
        return metrics.processing_rate / max(metrics.executors, 1)
    return INF


@dataclass(frozen=True)
class VertexFlow:
    input_rate: float
    processing_rate: float
    emit_rate: float
    executors: int


@dataclass(frozen=True)
class SimulationResult:
    throughput: float
    vertices: Mapping[str, VertexFlow]
    #: vertex -> what its executors could process with unlimited input (None: unbounded)
    capacity: Mapping[str, float | None] = field(default_factory=dict)
    executors: Mapping[str, float] = field(default_factory=dict)  # executor -> processing rate
    node_cpu_used: Mapping[str, float] = field(default_factory=dict)
    iterations: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "throughput": self.throughput,
            "vertices": {
                v: {
                    "input_rate": f.input_rate,
                    "processing_rate": f.processing_rate,
                    "emit_rate": f.emit_rate,
                    "executors": f.executors,
                }
                for v, f in self.vertices.items()
            },
            "node_cpu_used": dict(self.node_cpu_used),
        }


def simulate(topology: Topology, schedule: Schedule, model: SimulationModel | None = None) -> SimulationResult:
    """Steady-state flows of `topology` running under `schedule` (see the module docstring)."""
    model = model or SimulationModel.from_topology(topology)
    by_vertex: dict[str, list[str]] = defaultdict(list)
    for executor, _node in schedule:
        by_vertex[split_executor_id(executor)[0]].append(executor)
    for v in topology.order:
        if not by_vertex.get(v):
            raise ValueError(f"schedule has no executor of vertex {v}")
    for v in topology.sources:
        vm = model.vertices[v]
        if vm.source_rate is None and math.isinf(vm.capacity):
            raise ValueError(
                f"source {v} has neither a rate nor a costMs, so its output is unbounded; give it source.rate"
            )
    node_of = dict(schedule.assignment)
    shares = {v: input_shares(topology, v, len(by_vertex[v])) for v in topology.order}
    cpu_share: dict[str, float] = dict.fromkeys(node_of, INF)
    processed: dict[str, float] = {}
    previous = -1.0
    iterations = 0
    for iterations in range(1, 501):
        new_processed, demand, vertex_flows = _flows(topology, model, by_vertex, shares, cpu_share)
        if processed and iterations > 2:
            # Damping keeps the share <-> demand feedback from oscillating.
            new_processed = {e: 0.5 * (processed[e] + new_processed[e]) for e in new_processed}
        processed = new_processed
        if model.node_cpu is not None:
            cpu_share = fair_shares(demand, node_of, model.node_cpu, schedule.nodes)
        throughput = sum(vertex_flows[s].processing_rate for s in topology.sinks)
        if model.node_cpu is None or abs(throughput - previous) <= 1e-9 * max(1.0, throughput):
            break
        previous = throughput
    executor_rates, demand, vertex_flows = _flows(topology, model, by_vertex, shares, cpu_share)
    used: dict[str, float] = dict.fromkeys(schedule.nodes, 0.0)
    for executor, d in demand.items():
        used[node_of[executor]] += min(d, cpu_share[executor])
    capacity: dict[str, float | None] = {}
    for v in topology.order:
        vm = model.vertices[v]
        limits = [_executor_rate(vm, INF, cpu_share[e]) for e in by_vertex[v]]
        capacity[v] = None if any(math.isinf(x) for x in limits) else sum(limits)
    return SimulationResult(
        throughput=sum(vertex_flows[s].processing_rate for s in topology.sinks),
        capacity=capacity,
        vertices=vertex_flows,
        executors=executor_rates,
        node_cpu_used=used,
        iterations=iterations,
    )


def input_shares(topology: Topology, vertex: str, k: int) -> dict[str, list[float]]:
    """For each parent stream into `vertex`: the fraction of the parent's output each executor receives."""
    result: dict[str, list[float]] = {}
    for parent in topology.parents(vertex):
        grouping = topology.stream(parent, vertex).grouping
        if grouping == "shuffle":
            result[parent] = [1.0 / k] * k
        elif grouping == "fields":
            max_par = max(topology.vertices[vertex].max_parallelism, k)
            result[parent] = [len(r) / max_par for r in key_group_ranges(max_par, k)]
        elif grouping == "all":
            result[parent] = [1.0] * k
        else:  # global
            result[parent] = [1.0] + [0.0] * (k - 1)
    return result


def _executor_rate(vm: VertexModel, input_rate: float, cpu: float) -> float:
    limit = vm.capacity
    if vm.cost_s > 0 and not math.isinf(cpu):
        limit = min(limit, cpu / vm.cost_s)
    return min(input_rate, limit)


def _executor_inputs(
    topology: Topology,
    model: SimulationModel,
    vertex: str,
    executors: Sequence[str],
    shares: Mapping[str, list[float]],
    emit: Mapping[str, float],
) -> list[float]:
    k = len(executors)
    vm = model.vertices[vertex]
    if topology.graph.in_degree(vertex) == 0:
        if vm.source_rate is None:
            return [INF] * k
        return [vm.source_rate / k] * k
    inputs = [0.0] * k
    for parent, fractions in shares.items():
        for i in range(k):
            inputs[i] += emit[parent] * fractions[i]
    return inputs


def _flows(
    topology: Topology,
    model: SimulationModel,
    by_vertex: Mapping[str, list[str]],
    shares: Mapping[str, Mapping[str, list[float]]],
    cpu_share: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, float], dict[str, VertexFlow]]:
    processed: dict[str, float] = {}
    demand: dict[str, float] = {}
    emit: dict[str, float] = {}
    flows: dict[str, VertexFlow] = {}
    for v in topology.order:
        vm = model.vertices[v]
        executors = by_vertex[v]
        inputs = _executor_inputs(topology, model, v, executors, shares[v], emit)
        total_in = 0.0
        total_proc = 0.0
        for executor, inp in zip(executors, inputs, strict=True):
            rate = _executor_rate(vm, inp, cpu_share[executor])
            processed[executor] = rate
            # Demand is what the executor would use with the node to itself.
            demand[executor] = min(inp, vm.capacity) * vm.cost_s if vm.cost_s > 0 else 0.0
            total_in += inp
            total_proc += rate
        if math.isinf(total_in):
            total_in = total_proc
        emit[v] = total_proc * vm.selectivity
        flows[v] = VertexFlow(total_in, total_proc, emit[v], len(executors))
    return processed, demand, flows


def fair_shares(
    demand: Mapping[str, float], node_of: Mapping[str, str], cpu: float, nodes: Sequence[str]
) -> dict[str, float]:
    """Max-min fair (water-filling) split of each node's `cpu` among its executors' demands."""
    on_node: dict[str, list[str]] = {n: [] for n in nodes}
    for executor, node in node_of.items():
        on_node[node].append(executor)
    shares: dict[str, float] = {}
    for executors in on_node.values():
        remaining = cpu
        pending = sorted(executors, key=lambda e: demand[e])
        while pending:
            fair = remaining / len(pending)
            executor = pending[0]
            if demand[executor] <= fair:
                shares[executor] = INF if demand[executor] == 0 else max(demand[executor], fair)
                remaining -= demand[executor]
                pending.pop(0)
            else:
                for other in pending:
                    shares[other] = fair
                pending = []
    return shares


#: the true processing rate reported for a vertex without a cost that processes something: a real executor
#: that is almost never busy reports processed / busy seconds, a huge number, not "unknown"
UNBOUNDED_RATE = 1e9


def snapshot_from_simulation(topology: Topology, schedule: Schedule, result: SimulationResult) -> MetricSnapshot:
    """The metric snapshot a running deployment would report at the simulated steady state, including each
    vertex's true processing rate (what its executors could do with their current CPU shares; for a vertex
    without a cost, `UNBOUNDED_RATE`, so a planner sees its headroom instead of not knowing it)."""

    def true_rate(v: str, flow: VertexFlow) -> float | None:
        capacity = result.capacity.get(v)
        if capacity is None and flow.processing_rate > 0:
            return UNBOUNDED_RATE
        return capacity

    vertices = {
        v: VertexMetrics(
            processing_rate=f.processing_rate,
            emit_rate=f.emit_rate,
            executors=f.executors,
            input_rate=f.input_rate if topology.graph.in_degree(v) == 0 else None,
            true_processing_rate=true_rate(v, f),
        )
        for v, f in result.vertices.items()
    }
    return MetricSnapshot(vertices, schedule.placement())


# --------------------------------------------------------------------------------------------------------
# Exhaustive optimum for small cases


def new_slot_count(schedule: Schedule, added_nodes: int) -> int:
    """Stela's N_instances × added nodes: the average executors per node before scaling (rounded, at least 1,
    at most the slots of a node) for every added node. Halves round up: 5 executors on 2 nodes give 3."""
    per_node = math.floor(len(schedule) / max(len(schedule.nodes), 1) + 0.5)
    return added_nodes * min(max(per_node, 1), schedule.slots_per_node)


def optimal_scale_out(
    topology: Topology,
    schedule: Schedule,
    target_nodes: int,
    model: SimulationModel | None = None,
    limit: int = 50_000,
) -> tuple[float, Schedule]:
    """The best throughput any choice of new executors on the new nodes can reach, existing executors kept
    in place (the space Stela searches greedily): every multiset of vertices for the new slots, split over
    the (identical, empty) new nodes in every distinct way. Raises `SearchTooLarge` past `limit` schedules."""
    model = model or SimulationModel.from_topology(topology)
    added = target_nodes - len(schedule.nodes)
    if added < 1:
        raise ValueError("optimal_scale_out needs target_nodes above the current node count")
    new_nodes = fresh_node_names(schedule.nodes, added)
    slots = new_slot_count(schedule, added)
    parallelism = schedule.parallelism()
    growable = [v for v in topology.order if parallelism[v] < topology.vertices[v].max_parallelism]
    per_node = [slots // added + (1 if i < slots % added else 0) for i in range(added)]
    best: tuple[float, Schedule] | None = None
    evaluated = 0
    for combo in itertools.combinations_with_replacement(growable, slots):
        counts = Counter(combo)
        if any(parallelism[v] + c > topology.vertices[v].max_parallelism for v, c in counts.items()):
            continue
        for bins in _distinct_splits(list(combo), per_node):
            evaluated += 1
            if evaluated > limit:
                raise SearchTooLarge(f"more than {limit} schedules to evaluate; use a smaller case")
            assignment = dict(schedule.assignment)
            next_index = dict(parallelism)
            for node, members in zip(new_nodes, bins, strict=True):
                for v in members:
                    assignment[executor_id(v, next_index[v])] = node
                    next_index[v] += 1
            candidate = Schedule(assignment, (*schedule.nodes, *new_nodes), schedule.slots_per_node)
            throughput = simulate(topology, candidate, model).throughput
            if best is None or throughput > best[0] + 1e-9:
                best = (throughput, candidate)
    if best is None:
        return simulate(topology, schedule, model).throughput, schedule
    return best


def _distinct_splits(items: list[str], sizes: list[int]) -> list[tuple[tuple[str, ...], ...]]:
    """Distinct ways to deal `items` into bins of the given sizes, bins of equal size being interchangeable."""
    results: set[tuple[tuple[str, ...], ...]] = set()

    def deal(rest: list[str], index: int, acc: tuple[tuple[str, ...], ...]) -> None:
        if index == len(sizes):
            key = tuple(sorted(acc)) if len(set(sizes)) == 1 else acc
            results.add(key)
            return
        for chosen in set(itertools.combinations(rest, sizes[index])):
            remaining = list(rest)
            for item in chosen:
                remaining.remove(item)
            deal(remaining, index + 1, (*acc, tuple(sorted(chosen))))

    deal(sorted(items), 0, ())
    return sorted(results)


def optimal_scale_in(
    topology: Topology,
    schedule: Schedule,
    target_nodes: int,
    model: SimulationModel | None = None,
    limit: int = 50_000,
) -> tuple[float, Schedule]:
    """The best throughput over every choice of nodes to remove, their executors dealt round-robin onto the
    remaining nodes (the move rule Stela and random removal share), so only the choice of nodes differs."""
    model = model or SimulationModel.from_topology(topology)
    remove = len(schedule.nodes) - target_nodes
    if remove < 1 or target_nodes < 1:
        raise ValueError("optimal_scale_in needs 1 <= target_nodes < current node count")
    if math.comb(len(schedule.nodes), remove) > limit:
        raise SearchTooLarge(f"more than {limit} node sets to evaluate; use a smaller case")
    best: tuple[float, Schedule] | None = None
    for removed in itertools.combinations(schedule.nodes, remove):
        candidate = move_off_nodes(schedule, removed, [n for n in schedule.nodes if n not in removed])
        throughput = simulate(topology, candidate, model).throughput
        if best is None or throughput > best[0] + 1e-9:
            best = (throughput, candidate)
    assert best is not None
    return best


def move_off_nodes(
    schedule: Schedule,
    removed: Sequence[str],
    receivers: Sequence[str],
    weight: Mapping[str, float] | None = None,
) -> Schedule:
    """Remove `removed` and deal their executors round-robin onto `receivers` in the given order, skipping
    full nodes; with `weight` (executor -> load) the heaviest executors are dealt first, so they land on
    the first receivers. Raises ValueError when the receivers' free slots cannot hold them."""
    remaining = [n for n in schedule.nodes if n not in set(removed)]
    moving = [e for n in removed for e in schedule.executors_on(n)]
    if weight is not None:
        moving.sort(key=lambda e: -weight.get(e, 0.0))
    free = {n: schedule.free_slots(n) for n in receivers}
    if sum(free.values()) < len(moving):
        total = len(schedule)
        need = -(-total // len(remaining))
        raise ValueError(
            f"{total} executors do not fit {len(remaining)} nodes × {schedule.slots_per_node} slots; "
            f"raise spec.slotsPerNode to {need} or keep more nodes"
        )
    assignment = dict(schedule.assignment)
    cursor = 0
    for executor in moving:
        while free[receivers[cursor % len(receivers)]] == 0:
            cursor += 1
        node = receivers[cursor % len(receivers)]
        assignment[executor] = node
        free[node] -= 1
        cursor += 1
    return Schedule(assignment, tuple(remaining), schedule.slots_per_node)
