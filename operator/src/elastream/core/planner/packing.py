"""CPU packing and rate search: the parallelism and placement that carry a fraction of the offered rate.

Stela+'s rebalance (`stela_plus`) uses them where a node CPU limit makes placement matter, with few moves. For
a rate fraction f (every source offered f × its rate) the fluid model's flows are known without simulating a
schedule: with every vertex keeping up, a vertex's input is linear in f, and what each of its executors
receives follows from its input streams' groupings (`input_shares`). From that:

- **Parallelism** (`RateModel.parallelism`): each vertex keeps its degree unless an executor would receive
  more than its thread processes (its capacity); then it grows to the smallest degree at which none does
  (up to maxParallelism). For a `fields` input that is the next degree that lowers the largest key-group
  share (with 8 key groups, 4 -> 8: 5, 6 and 7 executors leave some executor 2 of the 8), which one
  executor at a time never finds. A vertex that more executors cannot help (fed through `global` or
  `all`) or whose degree is fixed makes the fraction infeasible. Degrees never go down.
- **Placement** (`pack`): every executor's CPU demand is its load × cost; a node's executors must fit its
  CPU limit (then the fluid model gives each what it needs) and its slots. Executors stay where they are
  unless their node is removed or over its CPU; an over-full node gives up the smallest executor whose
  leaving suffices (else its largest, and again). The executors to place (new ones, those moved off)
  go largest first to the node with the most CPU left (worst fit, so load spreads); when none has room,
  the node that needs the fewest evictions of smaller executors makes room (those go back in the queue).
  Each existing executor that changes node is one move, and a packing that needs more than `max_moves`
  moves (those a removed node forces not counted) fails.
- **Rate** (`best_packing`): the largest f (geometric bisection, `steps` packings) whose parallelism and
  placement fit; the schedule then goes to the simulator, which is the judge.

Pure and deterministic: ties go to topological order, executor index and node order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elastream.core.schedule import Schedule
from elastream.core.simulate import SimulationModel, VertexModel, input_shares, simulate
from elastream.core.topology import Topology, executor_id, split_executor_id

#: numerical slack of the fit tests (a node's CPU, an executor's thread)
EPSILON = 1e-9


@dataclass(frozen=True)
class RateModel:
    """Per vertex, what its executors receive at the offered rate (f = 1), from the fluid model's flows."""

    topology: Topology
    model: SimulationModel
    #: vertex -> what it emits at f = 1 with every vertex keeping up
    emit: Mapping[str, float]
    #: source -> its offered rate
    offered: Mapping[str, float]
    #: vertices whose degree stays as it is (a redis-stream source reads by executor index)
    fixed: frozenset[str]
    #: the sinks' rate at f = 1
    throughput: float
    _loads: dict[tuple[str, int], tuple[float, ...]] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def of(topology: Topology, schedule: Schedule, model: SimulationModel, fixed: frozenset[str]) -> RateModel:
        """Raises ValueError when some source has no offered rate (no reference to scale)."""
        offered: dict[str, float] = {}
        for s in topology.sources:
            rate = model.vertices[s].source_rate
            if rate is None:
                raise ValueError(f"source {s} has no offered rate")
            offered[s] = rate
        unlimited = SimulationModel(
            {v: VertexModel(math.inf, 0.0, m.selectivity, m.source_rate) for v, m in model.vertices.items()}, None
        )
        flows = simulate(topology, schedule, unlimited)
        emit = {v: flows.vertices[v].emit_rate for v in topology.order}
        return RateModel(topology, model, emit, offered, fixed, flows.throughput)

    def loads(self, vertex: str, k: int) -> tuple[float, ...]:
        """Tuples/s each of `k` executors of `vertex` processes at f = 1."""
        cached = self._loads.get((vertex, k))
        if cached is not None:
            return cached
        if vertex in self.offered:
            result = [self.offered[vertex] / k] * k
        else:
            result = [0.0] * k
            for parent, shares in input_shares(self.topology, vertex, k).items():
                for i, share in enumerate(shares):
                    result[i] += self.emit[parent] * share
        self._loads[(vertex, k)] = found = tuple(result)
        return found

    def degree(self, vertex: str, current: int, fraction: float) -> int | None:
        """The smallest degree ≥ `current` whose every executor keeps up at `fraction` (None: none does)."""
        vm = self.model.vertices[vertex]
        top = current if vertex in self.fixed else max(current, self.topology.vertices[vertex].max_parallelism)
        for k in range(current, top + 1):
            busiest = fraction * max(self.loads(vertex, k))
            cpu = self.model.node_cpu
            if busiest <= vm.capacity * (1.0 - EPSILON) and (cpu is None or busiest * vm.cost_s <= cpu):
                return k
        return None

    def parallelism(self, current: Mapping[str, int], fraction: float) -> dict[str, int] | None:
        """Every vertex at the smallest degree that keeps up at `fraction` (None: some vertex cannot)."""
        result: dict[str, int] = {}
        for v in self.topology.order:
            k = self.degree(v, current[v], fraction)
            if k is None:
                return None
            result[v] = k
        return result

    def spread(self, current: Mapping[str, int]) -> dict[str, int]:
        """Every vertex at the degree the offered rate needs (maxParallelism where none carries it): more
        executors than a lower fraction needs, so each takes less of a crowded node's CPU."""
        result: dict[str, int] = {}
        for v in self.topology.order:
            k = self.degree(v, current[v], 1.0)
            top = current[v] if v in self.fixed else max(current[v], self.topology.vertices[v].max_parallelism)
            result[v] = top if k is None else k
        return result

    def demands(self, parallelism: Mapping[str, int], fraction: float) -> dict[str, float]:
        """Executor -> CPU-seconds per second it uses at `fraction`."""
        result: dict[str, float] = {}
        for v in self.topology.order:
            cost = self.model.vertices[v].cost_s
            for i, load in enumerate(self.loads(v, parallelism[v])):
                result[executor_id(v, i)] = fraction * load * cost
        return result


@dataclass(frozen=True)
class Packing:
    schedule: Schedule
    fraction: float
    #: existing executors that change node, those a removed node forces included
    moves: int
    forced: int


def pack(
    topology: Topology,
    old: Schedule,
    nodes: Sequence[str],
    parallelism: Mapping[str, int],
    demand: Mapping[str, float],
    cpu: float,
    max_moves: int,
) -> tuple[Schedule, int, int] | None:
    """Place `parallelism`'s executors on `nodes` within `cpu` per node (module docstring: Placement);
    returns the schedule, its moves and the moves removed nodes forced, or None when it does not fit."""
    slots = old.slots_per_node
    position = topology.position
    rank = {n: i for i, n in enumerate(nodes)}
    kept = set(nodes)

    def order(e: str) -> tuple[float, int, int]:
        v, i = split_executor_id(e)
        return (-demand[e], position[v], i)

    on: dict[str, set[str]] = {n: set() for n in nodes}
    load = dict.fromkeys(nodes, 0.0)
    queue: list[tuple[tuple[float, int, int], str]] = []
    forced = 0
    for v in topology.order:
        for i in range(parallelism[v]):
            e = executor_id(v, i)
            node = old.assignment.get(e)
            if node is not None and node in kept:
                on[node].add(e)
                load[node] += demand[e]
            else:
                forced += node is not None
                heapq.heappush(queue, (order(e), e))
    evicted: set[str] = set()  # existing executors taken off a node they still had

    def evict(node: str, e: str) -> None:
        on[node].discard(e)
        load[node] -= demand[e]
        if old.assignment.get(e) == node:
            evicted.add(e)
        heapq.heappush(queue, (order(e), e))

    for node in nodes:
        while load[node] > cpu * (1.0 + EPSILON):
            here = sorted(on[node], key=order)  # largest first
            enough = [e for e in here if demand[e] >= load[node] - cpu * (1.0 + EPSILON)]
            evict(node, enough[-1] if enough else here[0])
            if len(evicted) > max_moves:
                return None
    budget = 4 * (len(old) + sum(parallelism.values()))  # evictions only go to smaller executors; a guard
    while queue:
        budget -= 1
        if budget < 0:
            return None
        _, e = heapq.heappop(queue)
        d = demand[e]
        fits = [n for n in nodes if len(on[n]) < slots and load[n] + d <= cpu * (1.0 + EPSILON)]
        if fits:
            node = min(fits, key=lambda n: (load[n], len(on[n]), rank[n]))
        else:
            made = _make_room(on, load, nodes, d, cpu, slots, demand, rank)
            if made is None:
                return None
            node, victims = made
            for victim in victims:
                evict(node, victim)
            if len(evicted) > max_moves:  # at most: one placed back where it was is no move after all
                return None
        on[node].add(e)
        load[node] += d
    assignment = {e: n for n in nodes for e in sorted(on[n], key=order)}
    moves = sum(1 for e, n in assignment.items() if e in old.assignment and old.assignment[e] != n)
    if moves - forced > max_moves:
        return None
    return Schedule(assignment, tuple(nodes), slots), moves, forced


def _make_room(
    on: Mapping[str, set[str]],
    load: Mapping[str, float],
    nodes: Sequence[str],
    d: float,
    cpu: float,
    slots: int,
    demand: Mapping[str, float],
    rank: Mapping[str, int],
) -> tuple[str, list[str]] | None:
    """The node where evicting the fewest (then the least CPU of) executors smaller than `d` makes room
    for `d` and a slot."""
    best: tuple[tuple[int, float, int], str, list[str]] | None = None
    for node in nodes:
        smaller = sorted((e for e in on[node] if demand[e] < d), key=lambda e: (-demand[e], e))
        room = cpu - load[node]
        victims: list[str] = []
        for e in smaller:
            if room >= d * (1.0 - EPSILON) and len(on[node]) - len(victims) < slots:
                break
            victims.append(e)
            room += demand[e]
        if room < d * (1.0 - EPSILON) or len(on[node]) - len(victims) >= slots:
            continue
        if victims:
            # the last victim taken may be larger than needed: the smallest that still suffices replaces it
            rest = room - demand[victims[-1]]
            spare = [e for e in smaller if e not in victims[:-1] and rest + demand[e] >= d * (1.0 - EPSILON)]
            if spare:
                victims[-1] = min(spare, key=lambda e: (demand[e], e))
        key = (len(victims), sum(demand[e] for e in victims), rank[node])
        if best is None or key < best[0]:
            best = (key, node, victims)
    return None if best is None else (best[1], best[2])


def best_packing(
    topology: Topology,
    rates: RateModel,
    old: Schedule,
    nodes: Sequence[str],
    current: Mapping[str, int],
    max_moves: int,
    low: float,
    steps: int,
    spread: bool = True,
) -> tuple[Packing | None, int]:
    """The largest fraction in [low, 1] that packs (geometric bisection over `steps` packings after trying
    1 and `low`); returns it (None: not even `low`) and the packings tried."""
    cpu = rates.model.node_cpu
    if cpu is None:
        return None, 0
    tried = 0

    def attempt(fraction: float) -> Packing | None:
        nonlocal tried
        least = rates.parallelism(current, fraction)
        if least is None:
            return None
        for parallelism in (least,) if wide is None or wide == least else (least, wide):
            if any(parallelism[v] < least[v] for v in least):
                continue
            if sum(parallelism.values()) > len(nodes) * old.slots_per_node:
                continue
            tried += 1
            demand = rates.demands(parallelism, fraction)
            packed = pack(topology, old, nodes, parallelism, demand, cpu, max_moves)
            if packed is not None:
                return Packing(packed[0], fraction, packed[1], packed[2])
        return None

    wide = rates.spread(current) if spread else None
    best = attempt(1.0)
    if best is not None:
        return best, tried
    best = attempt(low)
    if best is None:
        return None, tried
    lo, hi = low, 1.0
    for _ in range(steps):
        mid = math.sqrt(lo * hi)  # geometric: the same relative precision at any rate
        found = attempt(mid)
        if found is None:
            hi = mid
        else:
            lo, best = mid, found
    return best, tried


def packing_work(old: Schedule, nodes: Sequence[str]) -> float:
    """Work units (`local_search.simulation_work`'s) of one packing: each executor placed looks at every node."""
    return len(old) * (1.0 + len(nodes) / 8.0)
