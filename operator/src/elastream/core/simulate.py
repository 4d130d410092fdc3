"""Fluid model: the steady-state throughput of a topology under a schedule, as the runtime delivers it.

The yardstick for planners and the prediction `elastream plan` shows. Model (the runtime's data plane):

- An executor of vertex v processes at most `capacity(v)` tuples/s (1000 / costMs: one thread) and uses
  `cost(v)` CPU-seconds per tuple. Executors on one node share its `node_cpu` cores (the worker pod's CPU
  limit) max-min fairly, as an OS scheduler (and the runtime's emulated cores) share cores among busy
  threads; without a limit, nodes are unconstrained and only per-executor capacity binds.
- Back-pressure: channels are bounded, so in the steady state every vertex processes all it receives and a
  full channel holds its sender back, up to the sources. A source is offered `source_rate` tuples/s (split
  evenly over its executors; without a rate it emits as fast as it may) and emits what its downstream
  takes. A source feeding several branches therefore goes at its slowest branch's pace, and several
  sources held back by one bottleneck share it max-min fairly (progressive filling).
- What an executor receives depends on each input stream's grouping: load-aware shuffle (the default) pools
  the vertex's executors (each frame goes to the executor with room, so the vertex manages the sum of its
  executors' rates); round-robin shuffle gives each executor an equal share (k times the slowest
  executor); fields each executor's share of key groups (keys uniform over key groups); all the whole
  stream to every executor; global everything to executor 0.
- Throughput = the sum of the sinks' processing rates.

CPU shares depend on which executors are saturated, which depends on the flows, which depend on shares:
the steady state is found by damped fixed-point iteration (to 1e-9 relative, or 200 rounds). For given
shares the flows are exact: every vertex's rate is linear in the source rates, and the source rates are
the max-min fair solution of the executors' and vertices' linear capacity constraints.

The exhaustive optima planners are compared against (small cases) are `elastream.sim.optimum`'s.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elastream.core.metrics import MetricSnapshot, VertexMetrics
from elastream.core.schedule import Schedule, key_group_ranges
from elastream.core.topology import Topology, split_executor_id

INF = math.inf


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
    network = _Network.build(topology, model, by_vertex)
    cpu_share: dict[str, float] = dict.fromkeys(node_of, INF)
    flows = network.solve(cpu_share)
    iterations = 1
    if model.node_cpu is not None:
        previous = -1.0
        for iterations in range(2, 201):
            # What each executor would use with the node to itself: a saturated one (its CPU share binds)
            # wants a whole thread's worth, the others what their load needs. The node's cores go to these
            # demands max-min fairly, as the OS scheduler (and the runtime's emulated cores) share them.
            demand = {
                e: model.vertices[network.vertex_of[e]].cost_s
                * (network.thread_rate(e) if flows.saturated(e) else flows.load[e])
                for e in node_of
            }
            fresh = fair_shares(demand, node_of, model.node_cpu, schedule.nodes)
            if iterations > 3:  # damping keeps the share <-> saturation feedback from oscillating
                fresh = {e: _average(cpu_share[e], fresh[e]) for e in fresh}
            cpu_share = fresh
            flows = network.solve(cpu_share)
            if abs(flows.throughput - previous) <= 1e-9 * max(1.0, flows.throughput):
                break
            previous = flows.throughput
    used: dict[str, float] = dict.fromkeys(schedule.nodes, 0.0)
    for executor, node in node_of.items():
        cost_s = model.vertices[network.vertex_of[executor]].cost_s
        used[node] += min(flows.load[executor] * cost_s, cpu_share[executor])
    return SimulationResult(
        throughput=flows.throughput,
        capacity=flows.capacity,
        vertices=flows.vertices,
        executors=dict(flows.load),
        node_cpu_used=used,
        iterations=iterations,
    )


def _average(old: float, new: float) -> float:
    return new if math.isinf(old) or math.isinf(new) else 0.5 * (old + new)


@dataclass(frozen=True)
class _Flows:
    """One solution of the network for given executor rate limits."""

    load: Mapping[str, float]  # executor -> events/s it processes
    limit: Mapping[str, float]  # executor -> events/s it could process (thread and CPU share)
    vertices: Mapping[str, VertexFlow]
    capacity: Mapping[str, float | None]
    throughput: float

    def saturated(self, executor: str) -> bool:
        limit = self.limit[executor]
        return not math.isinf(limit) and self.load[executor] >= limit * (1.0 - 1e-6)


@dataclass
class _Network:
    """The topology as linear flows of its source rates, under back-pressure.

    Every vertex processes all of its input (blocked senders wait instead of queues growing), so each
    vertex's rate is a linear function of the sources' rates: `gain[v][s]` events/s at v per event/s that
    source s emits. What an executor receives depends on the grouping of each input stream: a fixed
    fraction of the stream (fields, all, global, round-robin shuffle: `fixed[e][s]`) or a share of the
    vertex's pooled input (load-aware shuffle: `pooled[v][s]`), which goes to whichever executors have
    room, as a load-aware sender sends each frame to the channel that drains fastest."""

    topology: Topology
    model: SimulationModel
    by_vertex: Mapping[str, list[str]]
    vertex_of: dict[str, str]
    gain: dict[str, dict[str, float]]
    fixed: dict[str, dict[str, float]]
    pooled: dict[str, dict[str, float]]

    @staticmethod
    def build(topology: Topology, model: SimulationModel, by_vertex: Mapping[str, list[str]]) -> _Network:
        vertex_of = {e: v for v, executors in by_vertex.items() for e in executors}
        sources = topology.sources
        gain: dict[str, dict[str, float]] = {}
        fixed: dict[str, dict[str, float]] = {}
        pooled: dict[str, dict[str, float]] = {}
        for v in topology.order:
            executors = by_vertex[v]
            k = len(executors)
            if v in sources:
                gain[v] = {v: 1.0}
                for e in executors:
                    fixed[e] = {v: 1.0 / k}  # each source executor generates its share of the offered rate
                continue
            total: dict[str, float] = defaultdict(float)
            pool: dict[str, float] = defaultdict(float)
            per_executor: list[dict[str, float]] = [defaultdict(float) for _ in executors]
            for parent in topology.parents(v):
                stream = topology.stream(parent, v)
                emitted = {s: g * model.vertices[parent].selectivity for s, g in gain[parent].items()}
                for s, g in emitted.items():
                    total[s] += g
                if stream.grouping == "shuffle" and stream.balance == "load-aware" and k > 1:
                    for s, g in emitted.items():
                        pool[s] += g
                    continue
                fractions = input_shares(topology, v, k)[parent]
                for i, fraction in enumerate(fractions):
                    if fraction > 0:
                        for s, g in emitted.items():
                            per_executor[i][s] += g * fraction
            gain[v] = dict(total)
            pooled[v] = dict(pool)
            for e, coefficients in zip(executors, per_executor, strict=True):
                fixed[e] = dict(coefficients)
        return _Network(topology, model, by_vertex, vertex_of, gain, fixed, pooled)

    def thread_rate(self, executor: str) -> float:
        """What the executor's one thread manages with a whole core: its vertex's capacity."""
        return self.model.vertices[self.vertex_of[executor]].capacity

    def constraints(self, limit: Mapping[str, float]) -> list[tuple[dict[str, float], float, str]]:
        """Linear constraints on the source rates, (coefficients, bound, vertex): every executor processes at
        most its limit of its fixed input; a vertex with pooled input processes at most its executors'
        summed limits of everything it receives."""
        result: list[tuple[dict[str, float], float, str]] = []
        for v in self.topology.order:
            executors = self.by_vertex[v]
            for e in executors:
                if self.fixed[e] and not math.isinf(limit[e]):
                    result.append((self.fixed[e], limit[e], v))
            if self.pooled.get(v):
                bound = sum(limit[e] for e in executors)
                if not math.isinf(bound):
                    result.append((self.gain[v], bound, v))
        return result

    def source_rates(self, constraints: list[tuple[dict[str, float], float, str]]) -> dict[str, float]:
        """Max-min fair source rates (progressive filling): every source not yet held grows at the same rate
        per executor until it reaches its offered rate or a constraint it feeds binds, which holds it."""
        sources = self.topology.sources
        offered = {s: self.model.vertices[s].source_rate for s in sources}
        x = dict.fromkeys(sources, 0.0)
        active = {s for s in sources if offered[s] is None or (offered[s] or 0.0) > 0}
        direction = {s: float(len(self.by_vertex[s])) for s in sources}
        while active:
            step = INF
            for coefficients, bound, _ in constraints:
                rise = sum(coefficients.get(s, 0.0) * direction[s] for s in active)
                if rise > 0:
                    used = sum(a * x[s] for s, a in coefficients.items())
                    step = min(step, max(0.0, bound - used) / rise)
            for s in active:
                rate = offered[s]
                if rate is not None:
                    step = min(step, (rate - x[s]) / direction[s])
            if math.isinf(step):
                raise ValueError(f"sources {', '.join(sorted(active))} are unbounded: give them source.rate")
            for s in active:
                x[s] += step * direction[s]
            held = set()
            for s in active:
                rate = offered[s]
                if rate is not None and x[s] >= rate * (1.0 - 1e-12):
                    held.add(s)
            for coefficients, bound, _ in constraints:
                used = sum(a * x[s] for s, a in coefficients.items())
                if used >= bound - 1e-9 * max(1.0, bound):
                    held.update(s for s in active if coefficients.get(s, 0.0) > 0)
            if not held:  # numerical corner: nothing bound although a step was taken; stop rather than loop
                break
            active -= held
        return x

    def solve(self, cpu_share: Mapping[str, float]) -> _Flows:
        model = self.model
        limit = {e: _executor_rate(model.vertices[self.vertex_of[e]], INF, cpu_share[e]) for e in self.vertex_of}
        constraints = self.constraints(limit)
        x = self.source_rates(constraints)
        load: dict[str, float] = {}
        vertices: dict[str, VertexFlow] = {}
        capacity: dict[str, float | None] = {}
        for v in self.topology.order:
            executors = self.by_vertex[v]
            vm = model.vertices[v]
            total = sum(g * x[s] for s, g in self.gain[v].items())
            for e in executors:
                load[e] = sum(a * x[s] for s, a in self.fixed[e].items())
            pool = sum(g * x[s] for s, g in self.pooled.get(v, {}).items())
            if pool > 0:
                self._spread(executors, pool, load, limit)
            offered = vm.source_rate if v in self.topology.sources else None
            input_rate = offered if offered is not None else total
            vertices[v] = VertexFlow(input_rate, total, total * vm.selectivity, len(executors))
            capacity[v] = self._capacity(v, total, x, limit, constraints)
        throughput = sum(vertices[s].processing_rate for s in self.topology.sinks)
        return _Flows(load, limit, vertices, capacity, throughput)

    @staticmethod
    def _spread(executors: Sequence[str], pool: float, load: dict[str, float], limit: Mapping[str, float]) -> None:
        """Deal a vertex's pooled input over its executors in proportion to their room (all to the unlimited
        ones, evenly, when some have no limit)."""
        unlimited = [e for e in executors if math.isinf(limit[e])]
        if unlimited:
            for e in unlimited:
                load[e] += pool / len(unlimited)
            return
        room = {e: max(0.0, limit[e] - load[e]) for e in executors}
        total_room = sum(room.values())
        for e in executors:
            share = room[e] / total_room if total_room > 0 else 1.0 / len(executors)
            load[e] += pool * share

    def _capacity(
        self,
        v: str,
        total: float,
        x: Mapping[str, float],
        limit: Mapping[str, float],
        constraints: list[tuple[dict[str, float], float, str]],
    ) -> float | None:
        """What the vertex could process with unlimited input of its current mix: its input scaled until one
        of its own constraints binds (None: nothing bounds it)."""
        if total <= 0:
            limits = [limit[e] for e in self.by_vertex[v]]
            return None if any(math.isinf(rate) for rate in limits) else sum(limits)
        scale = INF
        for coefficients, bound, vertex in constraints:
            if vertex == v:
                used = sum(a * x[s] for s, a in coefficients.items())
                if used > 0:
                    scale = min(scale, bound / used)
        return None if math.isinf(scale) else total * scale


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
# Moving executors: what the planners share


def new_slot_count(schedule: Schedule, added_nodes: int) -> int:
    """Stela's N_instances × added nodes: the average executors per node before scaling (rounded, at least 1,
    at most the slots of a node) for every added node. Halves round up: 5 executors on 2 nodes give 3."""
    per_node = math.floor(len(schedule) / max(len(schedule.nodes), 1) + 0.5)
    return added_nodes * min(max(per_node, 1), schedule.slots_per_node)


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
