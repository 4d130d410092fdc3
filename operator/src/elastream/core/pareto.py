"""What-if planning: the throughput/cost Pareto front of configurations (ARiSto's static mechanism).

ARiSto (Gkolemis, Doka, Koziris; docs/papers.md, section 3) predicts a topology's throughput for
any configuration from per-component models and searches the configuration space for the near-optimal,
throughput/cost Pareto-optimal ones. Here the per-component models are the fluid model's per-vertex capacity
(`SimulationModel`: costMs, or rates measured in a metric snapshot), the throughput calculator is `simulate`,
and the search is a greedy instead of NSGA-II:

- A configuration is a node count and a parallelism per vertex; its cost is the node count (executors are
  reported alongside). Its throughput is `simulate` on Storm's round-robin placement of the executors over
  the nodes.
- For each node count, `best_configuration` starts every vertex at one executor (a vertex in
  `fixed_vertices` at its written parallelism) and adds executors one at a time, within nodes × slotsPerNode
  and each vertex's maxParallelism, to the vertex whose increment raises the simulated throughput most (by
  more than MIN_GAIN, 1%). Increments within 1% of the best tie: the vertex with the higher utilisation
  (processing / what its executors could process: the bottleneck) wins, then the earlier in topological
  order. When no single executor gains, two at a time are tried on the saturated vertices (two bottlenecks
  in a row: neither increment alone helps), then one on every saturated vertex with the needless ones taken
  back (three or more in a row); then a plateau walk: up to PLATEAU_STEPS executors, one at a time, each
  to the saturated vertex that keeps throughput highest, accepted up to the first point that gains (a keyed
  vertex whose slowest executor shares a CPU-bound node only gains once several executors each spread it and
  its consumer over more nodes); when none of that gains, the greedy stops.
- `pareto_plan` runs it for each node count, also continuing from the previous count's configuration (it
  fits: more slots) and keeping the better. `pareto_front` keeps the configurations no cheaper one matches:
  more throughput (by more than 1%) for more cost. The recommendation (`knee`) is the cheapest configuration
  on the front within 1% of the highest throughput.
- Throughput can never exceed `offered_throughput`, the sinks' rate if every vertex kept up with the
  sources' offered rate, nor `reachable_throughput`, that with every vertex at maxParallelism and a core
  per executor.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from elastream.core.schedule import executor_order, node_name, round_robin
from elastream.core.simulate import SimulationModel, SimulationResult, VertexModel, simulate
from elastream.core.topology import Topology

#: a step must raise throughput by more than this fraction to count as a gain: smaller differences (a few
#: tuples/s as another executor shifts a node's fair CPU shares) are not worth an executor
MIN_GAIN = 0.01
#: the recommended configuration reaches this fraction of the highest throughput found
KNEE_FRACTION = 0.99
#: the search stops after this many node counts in a row that raise throughput by no more than MIN_GAIN
PATIENCE = 2
#: a vertex processing at least this fraction of what its executors could process is saturated
SATURATED = 1.0 - 1e-6
#: the longest plateau walk (executors added without a gain) before the greedy gives up
PLATEAU_STEPS = 12

_Rank = TypeVar("_Rank", bound=tuple[object, ...])
_Choice = TypeVar("_Choice")


class ParetoError(ValueError):
    """No configuration can be evaluated (the message names the fix)."""


@dataclass(frozen=True)
class Configuration:
    """A node count, a parallelism per vertex (topological order) and the throughput the model predicts."""

    nodes: int
    parallelism: Mapping[str, int]
    throughput: float
    #: what stops more throughput at this node count: "offered rate", or some of "slots", "maxParallelism:
    #: v, ...", "fixed parallelism: v", "node CPU" (a node's CPU limit is used up), or else "no executor
    #: adds 1%"
    limit: str = ""

    @property
    def executors(self) -> int:
        return sum(self.parallelism.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "executors": self.executors,
            "throughput": self.throughput,
            "parallelism": dict(self.parallelism),
            "limit": self.limit,
        }


@dataclass(frozen=True)
class ParetoPlan:
    """One configuration per evaluated node count (ascending), which of them are on the front, the knee."""

    configurations: tuple[Configuration, ...]
    front: tuple[int, ...]  # node counts on the Pareto front
    recommended: int | None  # node count of the knee
    bound: float | None  # offered_throughput; None: some source has no rate
    ceiling: float  # reachable_throughput: at most the bound, less when maxParallelism caps a bottleneck
    fixed: tuple[str, ...]
    slots_per_node: int
    #: why the search stopped before the last node count asked for ("" when it did not)
    stopped: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "bound": self.bound,
            "ceiling": self.ceiling,
            "recommended": self.recommended,
            "fixed": list(self.fixed),
            "slots_per_node": self.slots_per_node,
            "stopped": self.stopped or None,
            "configurations": [
                {**c.to_dict(), "pareto": c.nodes in self.front, "recommended": c.nodes == self.recommended}
                for c in self.configurations
            ],
        }


def fixed_vertices(topology: Topology) -> tuple[str, ...]:
    """Vertices whose parallelism must stay as written: a `redis-stream` source (executor i of k reads every
    k-th entry, so k is part of its read position)."""
    return tuple(
        v
        for v in topology.order
        if topology.vertices[v].kind == "source" and topology.vertices[v].config.get("type") == "redis-stream"
    )


def offered_throughput(topology: Topology, model: SimulationModel) -> float | None:
    """The sinks' rate if every vertex kept up with the sources' offered rate (selectivities applied): no
    configuration can do better. None when a source has no rate (it emits as fast as it can). Evaluated at
    maxParallelism, so a vertex fed through `all` (every executor gets a copy) counts every copy."""
    if any(model.vertices[s].source_rate is None for s in topology.sources):
        return None
    unlimited = SimulationModel(
        {v: VertexModel(math.inf, 0.0, m.selectivity, m.source_rate) for v, m in model.vertices.items()}, None
    )
    return evaluate(topology, unlimited, 1, widest_parallelism(topology))[0]


def widest_parallelism(topology: Topology, fixed: Sequence[str] = ()) -> dict[str, int]:
    """Every vertex at maxParallelism, the vertices in `fixed` at their written parallelism."""
    return {
        v: topology.vertices[v].parallelism if v in fixed else topology.vertices[v].max_parallelism
        for v in topology.order
    }


def reachable_throughput(topology: Topology, model: SimulationModel, fixed: Sequence[str] = ()) -> float:
    """The most any node count can give: every vertex at maxParallelism (fixed ones as written), each
    executor with a core to itself (no node CPU limit), so only per-executor capacity and the offered rate
    bind. Raises ValueError (from `simulate`) when a source has neither a rate nor a cost."""
    unshared = SimulationModel(model.vertices, None)
    return evaluate(topology, unshared, 1, widest_parallelism(topology, fixed))[0]


def evaluate(
    topology: Topology, model: SimulationModel, nodes: int, parallelism: Mapping[str, int]
) -> tuple[float, SimulationResult]:
    """Simulated throughput of `parallelism` placed round-robin over `nodes` nodes (Storm's even scheduler;
    as many slots per node as the executors need, at least slotsPerNode)."""
    executors = executor_order(topology, parallelism)
    slots = max(topology.slots_per_node, -(-len(executors) // nodes))
    schedule = round_robin(executors, [node_name(i) for i in range(nodes)], slots)
    result = simulate(topology, schedule, model)
    return result.throughput, result


def _utilisation(result: SimulationResult, vertex: str) -> float:
    capacity = result.capacity.get(vertex)
    if capacity is None or capacity <= 0:
        return 0.0
    return result.vertices[vertex].processing_rate / capacity


def same_throughput(a: float, b: float) -> bool:
    """Within MIN_GAIN of each other: a difference not worth an executor."""
    return abs(a - b) <= MIN_GAIN * max(1.0, abs(a), abs(b))


def gains(new: float, old: float) -> bool:
    """`new` is more than MIN_GAIN above `old`: worth an executor."""
    return new > old and not same_throughput(new, old)


def _reaches(throughput: float, bound: float) -> bool:
    return throughput >= bound or same_throughput(throughput, bound)


def starting_parallelism(topology: Topology, fixed: Sequence[str] = ()) -> dict[str, int]:
    """One executor per vertex, the vertices in `fixed` at their written parallelism."""
    return {v: topology.vertices[v].parallelism if v in fixed else 1 for v in topology.order}


@dataclass(frozen=True)
class _Search:
    """One greedy search: the topology, its model, the node count and the vertices whose parallelism stays."""

    topology: Topology
    model: SimulationModel
    nodes: int
    fixed: Sequence[str]

    def evaluate(self, parallelism: Mapping[str, int]) -> tuple[float, SimulationResult]:
        return evaluate(self.topology, self.model, self.nodes, parallelism)


class _At(NamedTuple):
    """Where the greedy stands: the parallelism, its throughput and its simulation."""

    parallelism: Mapping[str, int]
    throughput: float
    result: SimulationResult


#: a greedy step: the executors added (a multiset of vertices), the new throughput and simulation
_Step = tuple[tuple[str, ...], float, SimulationResult]


def best_configuration(
    topology: Topology,
    model: SimulationModel,
    nodes: int,
    fixed: Sequence[str] = (),
    offered: float | None = None,
    ceiling: float | None = None,
    start: Mapping[str, int] | None = None,
) -> Configuration:
    """The greedy of the module docstring for `nodes` nodes, from `start` (default `starting_parallelism`);
    it stops early at `ceiling` (what no configuration can beat, `reachable_throughput`). `offered`
    (`offered_throughput`) only names the limit. Raises `ParetoError` when `start` does not fit nodes ×
    slotsPerNode."""
    budget = nodes * topology.slots_per_node
    parallelism = dict(start) if start is not None else starting_parallelism(topology, fixed)
    if sum(parallelism.values()) > budget:
        raise ParetoError(
            f"{sum(parallelism.values())} executors do not fit {nodes} nodes × {topology.slots_per_node} slots"
        )
    search = _Search(topology, model, nodes, fixed)
    throughput, result = search.evaluate(parallelism)
    while True:
        used = sum(parallelism.values())
        if used >= budget or (ceiling is not None and _reaches(throughput, ceiling)):
            break
        at = _At(parallelism, throughput, result)
        step = _best_step(search, at, 1)
        if step is None and used + 2 <= budget:
            step = _best_step(search, at, 2)
        if step is None:
            step = _cut_step(search, at, budget - used)
        if step is None:
            step = _plateau_step(search, at, budget - used)
        if step is None:
            break
        added, throughput, result = step
        for v in added:
            parallelism[v] += 1
    limit = _limit(search, _At(parallelism, throughput, result), budget, offered)
    return Configuration(nodes, parallelism, throughput, limit)


def _best_step(search: _Search, at: _At, size: int) -> _Step | None:
    """The `size` executors to add (a multiset of vertices) that raise throughput most, or None when no choice
    gains more than MIN_GAIN. Choices within MIN_GAIN of the best tie: the one with the most utilised vertex
    wins (the bottleneck in `result`), then the one earliest in topological order. Two at a time (after no
    single executor helped) are tried on saturated vertices only: two bottlenecks in a row."""
    topology, fixed, parallelism, throughput, result = search.topology, search.fixed, *at
    growable = (
        _saturated_growable(topology, parallelism, fixed, result)
        if size > 1
        else _growable(topology, parallelism, fixed)
    )
    trials: list[tuple[float, tuple[float, tuple[int, ...]], tuple[str, ...], SimulationResult]] = []
    for added in itertools.combinations_with_replacement(growable, size):
        candidate = dict(parallelism)
        for v in added:
            candidate[v] += 1
        if any(candidate[v] > topology.vertices[v].max_parallelism for v in added):
            continue
        t, r = search.evaluate(candidate)
        if gains(t, throughput):
            rank = (-max(_utilisation(result, v) for v in added), tuple(topology.position[v] for v in added))
            trials.append((t, rank, added, r))
    if not trials:
        return None
    t, added, r = _pick(trials)
    return added, t, r


def _growable(topology: Topology, parallelism: Mapping[str, int], fixed: Sequence[str]) -> list[str]:
    """The vertices that may take another executor (not fixed, below maxParallelism), in topological order."""
    return [v for v in topology.order if v not in fixed and parallelism[v] < topology.vertices[v].max_parallelism]


def _saturated_growable(
    topology: Topology, parallelism: Mapping[str, int], fixed: Sequence[str], result: SimulationResult
) -> list[str]:
    """The growable vertices processing what their executors can in `result`, in topological order."""
    return [v for v in _growable(topology, parallelism, fixed) if _utilisation(result, v) >= SATURATED]


def _pick(trials: Sequence[tuple[float, _Rank, _Choice, SimulationResult]]) -> tuple[float, _Choice, SimulationResult]:
    """The trial with the highest throughput; those within MIN_GAIN of it tie, and the lowest rank wins."""
    top = max(trial[0] for trial in trials)
    t, _, choice, r = min((trial for trial in trials if same_throughput(trial[0], top)), key=lambda trial: trial[1])
    return t, choice, r


def _cut_step(search: _Search, at: _At, room: int) -> _Step | None:
    """When neither one executor nor two help, the saturated vertices form a cut (three equal stages in a
    row): one executor for each (most utilised first, as many as `room` allows), then, latest vertex first,
    every one of them whose removal keeps the gain is dropped again. None when that gains nothing."""
    topology, fixed, parallelism, throughput, result = search.topology, search.fixed, *at
    saturated = _saturated_growable(topology, parallelism, fixed, result)
    saturated.sort(key=lambda v: (-_utilisation(result, v), topology.position[v]))
    added = sorted(saturated[:room], key=lambda v: topology.position[v])
    if len(added) < 3:
        return None  # one or two were tried already
    candidate = dict(parallelism)
    for v in added:
        candidate[v] += 1
    t, r = search.evaluate(candidate)
    if not gains(t, throughput):
        return None
    for v in reversed(list(added)):
        candidate[v] -= 1
        t2, r2 = search.evaluate(candidate)
        if same_throughput(t2, t) or t2 > t:
            added.remove(v)
            t, r = t2, r2
        else:
            candidate[v] += 1
    return tuple(added), t, r


def _plateau_step(search: _Search, at: _At, room: int) -> _Step | None:
    """When no step of one, two or a cut gains: add executors one at a time (at most PLATEAU_STEPS and `room`),
    each to the saturated vertex whose increment keeps throughput highest (ties: most utilised, then earliest),
    and return the walk up to the first point that gains more than MIN_GAIN over `throughput`; None when the
    walk loses throughput, runs out of saturated vertices or of steps first."""
    topology, fixed, parallelism, throughput, result = search.topology, search.fixed, *at
    candidate = dict(parallelism)
    added: list[str] = []
    current_t, current_r = throughput, result
    for _ in range(min(PLATEAU_STEPS, room)):
        trials: list[tuple[float, tuple[float, int], str, SimulationResult]] = []
        for v in _saturated_growable(topology, candidate, fixed, current_r):
            candidate[v] += 1
            t, r = search.evaluate(candidate)
            candidate[v] -= 1
            trials.append((t, (-_utilisation(current_r, v), topology.position[v]), v, r))
        if not trials:
            return None
        t, v, r = _pick(trials)
        if t < current_t and not same_throughput(t, current_t):
            return None  # the walk loses throughput: not a plateau
        candidate[v] += 1
        added.append(v)
        current_t, current_r = t, r
        if gains(t, throughput):
            return tuple(added), t, r
    return None


def _limit(search: _Search, at: _At, budget: int, bound: float | None) -> str:
    """What stops more throughput at `at` (`Configuration.limit`)."""
    topology, fixed, (parallelism, _, result) = search.topology, search.fixed, at
    if bound is not None and _reaches(result.throughput, bound):
        return "offered rate"
    saturated = [v for v in topology.order if _utilisation(result, v) >= SATURATED]
    at_max = [v for v in saturated if v not in fixed and parallelism[v] >= topology.vertices[v].max_parallelism]
    pinned = [v for v in saturated if v in fixed]
    reasons = ["slots"] if sum(parallelism.values()) >= budget else []
    if at_max:
        reasons.append("maxParallelism: " + ", ".join(at_max))
    if pinned:
        reasons.append("fixed parallelism: " + ", ".join(pinned))
    cpu = search.model.node_cpu
    if cpu is not None and any(used >= cpu * SATURATED for used in result.node_cpu_used.values()):
        reasons.append("node CPU")
    return "; ".join(reasons) or f"no executor adds {MIN_GAIN:.0%}"


def _better(a: Configuration, b: Configuration) -> bool:
    """`a` has more throughput than `b` (by more than MIN_GAIN), or as much with fewer executors."""
    if same_throughput(a.throughput, b.throughput):
        return a.executors < b.executors
    return a.throughput > b.throughput


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, throughput) points no other point dominates (cost ≤ and throughput ≥, one of
    them strictly), in ascending cost. Of equal points, the first is kept."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1], i))
    front: list[int] = []
    best = -math.inf
    for i in order:
        throughput = points[i][1]
        if throughput > best and not (front and same_throughput(throughput, best)):
            front.append(i)
            best = throughput
    return front


def knee(points: Sequence[tuple[float, float]], front: Sequence[int], fraction: float = KNEE_FRACTION) -> int | None:
    """Index of the cheapest point on `front` reaching `fraction` of the highest throughput (None: empty)."""
    if not front:
        return None
    top = max(points[i][1] for i in front)
    return min((i for i in front if points[i][1] >= fraction * top), key=lambda i: points[i][0])


def pareto_plan(
    topology: Topology,
    model: SimulationModel,
    max_nodes: int,
    fixed: Sequence[str] | None = None,
) -> ParetoPlan:
    """The best configuration for each node count from the fewest that fit one executor per vertex up to
    `max_nodes`, the Pareto front over them and the knee. From the second node count on, the greedy also
    continues from the previous count's configuration (it fits: more slots) and the better result is kept.
    The search stops early at the first node count that reaches `reachable_throughput` (within MIN_GAIN);
    without a node CPU limit, at the first the slots do not limit (more nodes then run the same executors no
    faster); and after PATIENCE node counts in a row that add no more than MIN_GAIN. Raises `ParetoError`."""
    if max_nodes < 1:
        raise ParetoError(f"max nodes {max_nodes} is below 1; ask for at least 1 node")
    pinned = fixed_vertices(topology) if fixed is None else tuple(fixed)
    needed = sum(starting_parallelism(topology, pinned).values())
    first = -(-needed // topology.slots_per_node)
    if first > max_nodes:
        raise ParetoError(
            f"{needed} executors (one per vertex, fixed ones as written) need {first} nodes × "
            f"{topology.slots_per_node} slots; allow at least {first} nodes or raise spec.slotsPerNode to "
            f"{-(-needed // max_nodes)}"
        )
    bound = offered_throughput(topology, model)
    ceiling = reachable_throughput(topology, model, pinned)
    configurations: list[Configuration] = []
    stopped = ""
    flat = 0  # node counts in a row that gained nothing
    for nodes in range(first, max_nodes + 1):
        configuration = best_configuration(topology, model, nodes, pinned, bound, ceiling)
        if configurations:
            # the previous count's configuration fits too (more slots): continue from it, keep the better
            warm = best_configuration(topology, model, nodes, pinned, bound, ceiling, configurations[-1].parallelism)
            if _better(warm, configuration):
                configuration = warm
        configurations.append(configuration)
        if nodes == max_nodes:
            break
        if _reaches(configuration.throughput, ceiling):
            what = "the offered rate" if configuration.limit == "offered rate" else "the maxParallelism ceiling"
            stopped = f"{nodes} nodes reach {what}; more nodes cannot raise throughput"
            break
        if model.node_cpu is None and "slots" not in configuration.limit:
            stopped = f"{nodes} nodes are not limited by slots and nodes have no CPU limit; more nodes cannot help"
            break
        before = max((c.throughput for c in configurations[:-1]), default=-math.inf)
        flat = 0 if gains(configuration.throughput, before) else flat + 1
        if flat >= PATIENCE:
            stopped = f"{nodes - PATIENCE + 1}..{nodes} nodes add less than {MIN_GAIN:.0%} over fewer nodes"
            break
    points = [(float(c.nodes), c.throughput) for c in configurations]
    front = pareto_front(points)
    chosen = knee(points, front)
    return ParetoPlan(
        configurations=tuple(configurations),
        front=tuple(configurations[i].nodes for i in front),
        recommended=None if chosen is None else configurations[chosen].nodes,
        bound=bound,
        ceiling=ceiling,
        fixed=pinned,
        slots_per_node=topology.slots_per_node,
        stopped=stopped,
    )
