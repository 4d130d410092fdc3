"""Stela+ (`stela-plus`): Stela's plan, then a bounded hill climb on the fluid model (`simulate`).

Stela chooses with projections (ETP, (k+1)/k) and cannot see what the fluid model sees: a vertex fed
through `all` or `global` does not speed up by (k+1)/k, two bottlenecks in a row gain nothing from one
executor, and executors on a node share its CPU. Stela+ starts from Stela's schedule (scale-out: Algorithm
2's new executors; scale-in: ETPSum removal) and improves it by hill climbing on moves whose effect it
simulates, until no move raises predicted throughput by more than `min_gain` (relative) or a bound is
reached. The model is the one `make_plan` predicts with. Choices:

- **Search space.** Scale-out keeps Stela's space (and the exhaustive optimum's, `sim.optimum.optimal_scale_out`):
  existing executors never move (no migration, old nodes untouched), new executors go on the new nodes
  only, and there are at most as many as Stela's slot budget (`new_slot_count`); the search chooses which
  vertices get them and on which new node. Filling old nodes' spare slots or growing past the budget would
  spend resources Stela was not given, and results would not be comparable with the optimum. Scale-in keeps
  Stela's node choice and every vertex's parallelism and moves executors among the remaining nodes. Any
  executor may move (each one a migration); a move must pay at least `min_gain` of throughput.
- **Moves, in tiers.** Scale-out, first tier: *add* an executor of a target vertex while the slot budget is
  not used up; *retarget* one new executor from a donor vertex a to a target b on the same node (the
  budget stays spent); *relocate* a new executor to another new node or *swap* two. Second tier, only when
  no single move gains (two saturated vertices in a row: one executor for either alone moves the
  bottleneck to the other; or CPU that only two moves free): retarget the two least needed new executors
  to a pair of the first four targets. Third tier, the last resort: *remove* a new executor (an extra copy
  behind an `all` stream, or an executor whose CPU use slows a bottleneck on its node, can cost
  throughput); removal comes last because a freed slot is a trap for a greedy search (later additions
  rarely pay it back). Scale-in: relocate or swap executors between nodes.
- **Candidates, not every move.** A tier tries at most `candidates` moves, most promising first. Targets:
  the saturated vertices (processing what their executors can: `SimulationResult.capacity`; not those fed
  only through `global`, which another executor cannot help, as in Stela) by utilisation; then the
  vertices whose executors load a CPU-bound node that hosts a saturated executor (`global`-fed ones
  included), by the CPU they use there: another executor of theirs on a new node takes a share of their
  input off that node; then the vertices fed through `all` (the model counts each executor's copy).
  Donors: the vertices with new executors, least utilised first, giving up the one on their busiest node.
  Relocations and swaps run from the node using the most CPU (`node_cpu_used`) to those using least, the
  bottleneck's executors first. Without a node CPU limit placement cannot change the prediction, so no
  relocation is tried (and scale-in has nothing to search).
- **Best of a few.** A round takes the best move it tried, but stops trying `patience` moves after the
  first that gains: nearly as good as the best of the whole tier, for a fraction of the simulations.
- **Bounds.** At most `rounds` rounds, `simulations` simulations, and `work` units of simulation work: a
  simulation costs its fixed-point iterations × (executors + streams + vertices × executors / 200), about
  5 µs a unit on one core of the benchmark machine (`simulate` is linear in the network per iteration,
  plus a vertices × constraints pass). A candidate is simulated only when its estimated cost (with the
  last simulation's iteration count) still fits. So large topologies get few, well-chosen candidates
  (about six at 1,000 vertices), and a topology whose one simulation does not fit twice in the budget is
  not searched (the step says so). Everything is deterministic: candidates are ordered by value, then
  topological position and names, and the budget counts work, not time.
- **Never worse.** The search starts from Stela's schedule itself and accepts only improvements, so the
  predicted throughput is at least Stela's under the same model; when nothing improves, the plan is
  Stela's.

The last step of a plan reports the search: `{"iteration", "reason", "search": {"moves", "predicted":
[Stela's, final], "changes", "simulations", "rounds", "work", "stopped"}}`.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastream.core.metrics import Rates
from elastream.core.planner.stela import fed_only_by_global, stela_scale_in, stela_scale_out
from elastream.core.schedule import Schedule
from elastream.core.simulate import SimulationModel, SimulationResult, new_slot_count, simulate
from elastream.core.topology import Topology, executor_id, split_executor_id

#: a vertex processing at least this fraction of what its executors could process is saturated
SATURATED = 1.0 - 1e-6


@dataclass(frozen=True)
class SearchBudget:
    """Bounds of one search (see the module docstring)."""

    #: a move must raise predicted throughput by more than this fraction
    min_gain: float = 1e-3
    #: rounds of moves (one accepted move per round)
    rounds: int = 40
    #: simulations, the starting schedule's included
    simulations: int = 200
    #: units of simulation work (about 5 µs each on one core of the machine that benchmarks it): 100,000 ≈
    #: 0.5 s of simulations
    work: float = 100_000.0
    #: moves tried per round, most promising first
    candidates: int = 48
    #: once a move of the round gains, how many more are tried before the best so far is taken
    patience: int = 4


DEFAULT_BUDGET = SearchBudget()


def simulation_work(topology: Topology, schedule: Schedule, iterations: int) -> float:
    """Work units of one simulation of `schedule` that took `iterations` fixed-point iterations."""
    executors = len(schedule)
    edges: int = topology.graph.number_of_edges()
    size = executors + edges + len(topology.order) * executors / 200.0
    return max(iterations, 1) * size


def stela_plus_scale_out(
    topology: Topology,
    schedule: Schedule,
    rates: Rates,
    target_nodes: int,
    congestion_rate: float,
    model: SimulationModel,
    measured_source_input: frozenset[str] = frozenset(),
    budget: SearchBudget = DEFAULT_BUDGET,
) -> tuple[Schedule, list[dict[str, Any]]]:
    """Stela's scale-out (`stela_scale_out`), then the search over the new executors (module docstring)."""
    start, steps = stela_scale_out(topology, schedule, rates, target_nodes, congestion_rate, measured_source_input)
    search = _Search(topology, model, budget)
    old_nodes = set(schedule.nodes)
    new_nodes = tuple(n for n in start.nodes if n not in old_nodes)
    base = schedule.parallelism()
    limit = max(
        new_slot_count(schedule, len(new_nodes)), _OutState.of(schedule, new_nodes, base, start).new_executors()
    )

    def moves(result: SimulationResult, current: Schedule) -> list[Iterator[_Move]]:
        return _out_moves(search, _OutState.of(schedule, new_nodes, base, current), result, limit)

    best, step = search.run(start, moves)
    return best, [*steps, step.as_step(len(steps))]


def stela_plus_scale_in(
    topology: Topology,
    schedule: Schedule,
    rates: Rates,
    target_nodes: int,
    congestion_rate: float,
    model: SimulationModel,
    budget: SearchBudget = DEFAULT_BUDGET,
) -> tuple[Schedule, list[dict[str, Any]]]:
    """Stela's scale-in (`stela_scale_in`), then the search over placements on the remaining nodes."""
    start, steps = stela_scale_in(topology, schedule, rates, target_nodes, congestion_rate)
    search = _Search(topology, model, budget)
    if model.node_cpu is None:
        step = _Outcome(stopped="no node CPU limit: placement cannot change the prediction")
        return start, [*steps, step.as_step(len(steps))]

    def moves(result: SimulationResult, current: Schedule) -> list[Iterator[_Move]]:
        return [_in_moves(search, current, result)]

    best, outcome = search.run(start, moves)
    return best, [*steps, outcome.as_step(len(steps))]


# ---- search -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Move:
    description: str
    schedule: Schedule


@dataclass
class _Outcome:
    before: float | None = None
    after: float | None = None
    changes: list[str] = field(default_factory=list)
    simulations: int = 0
    rounds: int = 0
    work: float = 0.0
    stopped: str = ""

    def as_step(self, iteration: int) -> dict[str, Any]:
        moves = len(self.changes)
        if self.before is None or self.after is None:
            reason = f"local search on the fluid model skipped: {self.stopped}"
        else:
            reason = (
                f"local search on the fluid model: {moves} move{'s' if moves != 1 else ''}, predicted "
                f"{self.before:.1f} -> {self.after:.1f} tuples/s ({self.stopped})"
            )
        return {
            "iteration": iteration,
            "target": None,
            "reason": reason,
            "search": {
                "moves": moves,
                "predicted": None if self.before is None else [self.before, self.after],
                "changes": list(self.changes),
                "simulations": self.simulations,
                "rounds": self.rounds,
                "work": round(self.work),
                "stopped": self.stopped,
            },
        }


class _Search:
    """Simulations within the budget, and the hill climb over the moves a neighbourhood function offers."""

    def __init__(self, topology: Topology, model: SimulationModel, budget: SearchBudget) -> None:
        self.topology = topology
        self.model = model
        self.budget = budget
        self.simulations = 0
        self.work = 0.0
        self.iterations = 1
        self.global_only = fed_only_by_global(topology)
        self.copying = frozenset(
            v for v in topology.order if any(topology.stream(p, v).grouping == "all" for p in topology.parents(v))
        )

    def affordable(self, schedule: Schedule) -> bool:
        estimate = simulation_work(self.topology, schedule, self.iterations)
        return self.simulations < self.budget.simulations and self.work + estimate <= self.budget.work

    def simulate(self, schedule: Schedule) -> SimulationResult:
        result = simulate(self.topology, schedule, self.model)
        self.simulations += 1
        self.iterations = result.iterations
        self.work += simulation_work(self.topology, schedule, result.iterations)
        return result

    def utilisation(self, result: SimulationResult, vertex: str) -> float:
        capacity = result.capacity.get(vertex)
        if capacity is None or capacity <= 0 or math.isinf(capacity):
            return 0.0
        return result.vertices[vertex].processing_rate / capacity

    def saturated(self, result: SimulationResult) -> list[str]:
        """Saturated vertices, most utilised first (those fed only through `global` included: another
        executor cannot help them, but CPU freed on executor 0's node can)."""
        found = [v for v in self.topology.order if self.utilisation(result, v) >= SATURATED]
        return sorted(found, key=lambda v: (-self.utilisation(result, v), self.topology.position[v]))

    def cpu_used(self, result: SimulationResult, executor: str) -> float:
        return result.executors.get(executor, 0.0) * self.model.vertices[split_executor_id(executor)[0]].cost_s

    def offloading(self, schedule: Schedule, result: SimulationResult, saturated: Sequence[str]) -> list[str]:
        """Vertices whose executors use the CPU of a node that a saturated vertex's executor shares, by the
        CPU they use there: another executor of theirs elsewhere takes a share of their input (shuffle,
        fields) off that node, and the saturated executor gets the CPU."""
        limit = self.model.node_cpu
        if limit is None:
            return []
        bound = set(saturated)
        weight: dict[str, float] = defaultdict(float)
        for node in schedule.nodes:
            executors = schedule.executors_on(node)
            if result.node_cpu_used.get(node, 0.0) < limit * SATURATED:
                continue
            if not any(split_executor_id(e)[0] in bound for e in executors):
                continue
            for e in executors:
                v = split_executor_id(e)[0]
                if v not in bound and v not in self.global_only:
                    weight[v] += self.cpu_used(result, e)
        return sorted((v for v in weight if weight[v] > 0), key=lambda v: (-weight[v], self.topology.position[v]))

    def run(
        self,
        start: Schedule,
        moves: Callable[[SimulationResult, Schedule], Sequence[Iterator[_Move]]],
    ) -> tuple[Schedule, _Outcome]:
        """Hill climb from `start`. `moves(result, schedule)` gives tiers of moves (iterators of `_Move`, most
        promising first); each round simulates up to `candidates` moves of a tier (`patience` more after the
        first that gains) and takes the best if it gains `min_gain`; the next tier is tried only when no
        move of the tier before gained."""
        outcome = _Outcome()
        budget = self.budget
        if 2 * simulation_work(self.topology, start, 1) > budget.work:
            outcome.stopped = "one simulation of this topology does not fit twice in the work budget"
            return start, outcome
        try:
            result = self.simulate(start)
        except ValueError as exc:
            outcome.stopped = f"the fluid model cannot evaluate it ({exc})"
            return start, outcome
        current, throughput = start, result.throughput
        outcome.before = throughput
        outcome.stopped = "no move gains"
        for _ in range(budget.rounds):
            outcome.rounds += 1
            best: tuple[float, _Move, SimulationResult] | None = None
            out_of_budget = False
            for tier in moves(result, current):
                since_gain: int | None = None
                for move in itertools.islice(tier, budget.candidates):
                    if since_gain is not None and since_gain >= budget.patience:
                        break
                    if not self.affordable(move.schedule):
                        out_of_budget = True
                        break
                    candidate = self.simulate(move.schedule)
                    if best is None or candidate.throughput > best[0]:
                        best = (candidate.throughput, move, candidate)
                    if since_gain is not None:
                        since_gain += 1
                    elif candidate.throughput > throughput * (1.0 + budget.min_gain):
                        since_gain = 0
                if out_of_budget or since_gain is not None:
                    break
            if best is None or best[0] <= throughput * (1.0 + budget.min_gain):
                if out_of_budget:
                    outcome.stopped = "budget spent"
                break
            throughput, move, result = best
            current = move.schedule
            outcome.changes.append(move.description)
            if out_of_budget:
                outcome.stopped = "budget spent"
                break
        else:
            outcome.stopped = "round limit"
        outcome.after = throughput
        outcome.simulations = self.simulations
        outcome.work = self.work
        return current, outcome


# ---- scale-out --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _OutState:
    """Old schedule (fixed) plus how many new executors of each vertex each new node holds."""

    old: Schedule
    new_nodes: tuple[str, ...]
    base: Mapping[str, int]
    counts: Mapping[str, Counter[str]]

    @staticmethod
    def of(old: Schedule, new_nodes: tuple[str, ...], base: Mapping[str, int], current: Schedule) -> _OutState:
        counts: dict[str, Counter[str]] = {n: Counter() for n in new_nodes}
        for e, n in current.assignment.items():
            if e not in old.assignment:
                counts[n][split_executor_id(e)[0]] += 1
        return _OutState(old, new_nodes, base, counts)

    def new_executors(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())

    def parallelism(self, vertex: str) -> int:
        return self.base[vertex] + sum(c[vertex] for c in self.counts.values())

    def free(self, node: str) -> int:
        return self.old.slots_per_node - sum(self.counts[node].values())

    def changed(self, changes: Sequence[tuple[str, str, int]], order: Sequence[str]) -> Schedule:
        """The schedule after (node, vertex, +1/-1) changes: new executors numbered in node order."""
        counts = {n: Counter(c) for n, c in self.counts.items()}
        for node, vertex, delta in changes:
            counts[node][vertex] += delta
        assignment = dict(self.old.assignment)
        index = dict(self.base)
        for node in self.new_nodes:
            for v in order:
                for _ in range(counts[node][v]):
                    assignment[executor_id(v, index[v])] = node
                    index[v] += 1
        return Schedule(assignment, (*self.old.nodes, *self.new_nodes), self.old.slots_per_node)


def _out_moves(search: _Search, state: _OutState, result: SimulationResult, limit: int) -> list[Iterator[_Move]]:
    """Single moves first; two retargets at once only when no single move gains."""
    return [
        _out_single(search, state, result, limit),
        _out_pairs(search, state, result),
        _out_removals(search, state, result),
    ]


def _out_removals(search: _Search, state: _OutState, result: SimulationResult) -> Iterator[_Move]:
    """A new executor fewer: the last resort, when neither one nor two retargets gain (an extra copy behind
    an `all` stream, or an executor whose CPU use slows a bottleneck on its node, can cost throughput)."""
    for a, nodes in itertools.islice(_donors(search, state, result).items(), 8):
        yield _Move(f"remove {a} from {nodes[0]}", state.changed([(nodes[0], a, -1)], search.topology.order))


def _targets(search: _Search, state: _OutState, result: SimulationResult, extra: int = 1) -> list[str]:
    """Vertices another executor may help, most promising first: saturated ones by utilisation, then those
    whose executors load a CPU-bound node a saturated one shares, then those fed through `all`."""
    topology = search.topology

    def growable(v: str) -> bool:
        return state.parallelism(v) + extra <= topology.vertices[v].max_parallelism

    saturated = search.saturated(result)
    targets = [v for v in saturated if v not in search.global_only and growable(v)]
    targets += [v for v in search.offloading(state.old, result, saturated) if v not in targets and growable(v)]
    targets += [v for v in topology.order if v in search.copying and v not in targets and growable(v)]
    return targets


def _donors(search: _Search, state: _OutState, result: SimulationResult) -> dict[str, list[str]]:
    """Vertices with new executors, least utilised first, each with its new nodes, busiest (CPU) first: the
    executor to give up is the one on the first (freeing the scarcest CPU)."""
    cpu = result.node_cpu_used
    rank = {n: i for i, n in enumerate(state.new_nodes)}
    hosts: dict[str, list[str]] = {}
    for node in state.new_nodes:
        for v, c in state.counts[node].items():
            if c > 0:
                hosts.setdefault(v, []).append(node)
    position = search.topology.position
    ordered = sorted(hosts, key=lambda v: (search.utilisation(result, v), position[v]))
    return {v: sorted(hosts[v], key=lambda n: (-cpu.get(n, 0.0), rank[n])) for v in ordered}


def _out_pairs(search: _Search, state: _OutState, result: SimulationResult) -> Iterator[_Move]:
    """Two new executors retargeted at once (two bottlenecks in a row, or CPU that only two moves free): the
    two least needed new executors go to every pair of the first four targets."""
    order = search.topology.order
    donors = _donors(search, state, result)
    targets = _targets(search, state, result)[:4]
    twice = set(_targets(search, state, result, extra=2))
    for i, b1 in enumerate(targets):
        for b2 in targets[i:]:
            if b1 == b2 and b1 not in twice:
                continue
            taken: list[tuple[str, str]] = []
            for a, nodes in donors.items():
                if a in (b1, b2):
                    continue
                for node in nodes:
                    taken += [(node, a)] * min(state.counts[node][a], 2 - len(taken))
            if len(taken) < 2:
                return
            (n1, a1), (n2, a2) = taken
            changes = [(n1, a1, -1), (n2, a2, -1), (n1, b1, +1), (n2, b2, +1)]
            yield _Move(f"retarget {a1} -> {b1} on {n1} and {a2} -> {b2} on {n2}", state.changed(changes, order))


def _out_single(search: _Search, state: _OutState, result: SimulationResult, limit: int) -> Iterator[_Move]:
    """Add (while the slot budget has room), retarget, remove, then relocate or swap between new nodes."""
    order = search.topology.order
    position = search.topology.position
    cpu = result.node_cpu_used
    rank = {n: i for i, n in enumerate(state.new_nodes)}
    targets = _targets(search, state, result)
    donors = _donors(search, state, result)

    def cool_first(nodes: Sequence[str]) -> list[str]:
        return sorted(nodes, key=lambda n: (cpu.get(n, 0.0), -state.free(n), rank[n]))

    if state.new_executors() < limit:
        roomy = cool_first([n for n in state.new_nodes if state.free(n) > 0])
        for v in targets if roomy else []:
            yield _Move(f"add {v} on {roomy[0]}", state.changed([(roomy[0], v, +1)], order))
    for b in targets[:8]:
        for a, nodes in itertools.islice(donors.items(), 8):
            if a != b:
                node = nodes[0]
                yield _Move(f"retarget {a} -> {b} on {node}", state.changed([(node, a, -1), (node, b, +1)], order))
    if search.model.node_cpu is None or len(state.new_nodes) < 2:
        return  # without a node CPU limit, where a new executor runs does not change the prediction
    hot = min(state.new_nodes, key=lambda n: (-cpu.get(n, 0.0), rank[n]))
    movers = sorted(
        (v for v, c in state.counts[hot].items() if c > 0), key=lambda v: (-search.utilisation(result, v), position[v])
    )
    for cold in cool_first([n for n in state.new_nodes if n != hot]):
        for v in movers:
            if state.free(cold) > 0:
                yield _Move(f"relocate {v} {hot} -> {cold}", state.changed([(hot, v, -1), (cold, v, +1)], order))
            for w in sorted(state.counts[cold], key=lambda w: (search.utilisation(result, w), position[w])):
                if w != v and state.counts[cold][w] > 0:
                    changes = [(hot, v, -1), (cold, v, +1), (cold, w, -1), (hot, w, +1)]
                    yield _Move(f"swap {v} on {hot} with {w} on {cold}", state.changed(changes, order))


# ---- scale-in ---------------------------------------------------------------------------------------------


def _in_moves(search: _Search, schedule: Schedule, result: SimulationResult) -> Iterator[_Move]:
    cpu = result.node_cpu_used
    rank = {n: i for i, n in enumerate(schedule.nodes)}
    saturated = set(search.saturated(result))

    def used(e: str) -> float:
        return search.cpu_used(result, e)

    hot_first = sorted(schedule.nodes, key=lambda n: (-cpu.get(n, 0.0), rank[n]))
    for hot in hot_first[:2]:
        # one executor per vertex on the node: executors of one vertex on one node are interchangeable
        seen: set[str] = set()
        movers: list[str] = []
        for e in sorted(
            schedule.executors_on(hot), key=lambda e: (split_executor_id(e)[0] not in saturated, -used(e), e)
        ):
            v = split_executor_id(e)[0]
            if v not in seen:
                seen.add(v)
                movers.append(e)
        colds = sorted((n for n in schedule.nodes if n != hot), key=lambda n: (cpu.get(n, 0.0), rank[n]))[:3]
        for e in movers:
            v = split_executor_id(e)[0]
            for cold in colds:
                if schedule.free_slots(cold) > 0:
                    assignment = {**schedule.assignment, e: cold}
                    yield _Move(
                        f"move {e} {hot} -> {cold}", Schedule(assignment, schedule.nodes, schedule.slots_per_node)
                    )
                partners = sorted(
                    (f for f in schedule.executors_on(cold) if split_executor_id(f)[0] != v),
                    key=lambda f: (split_executor_id(f)[0] in saturated, used(f), f),
                )
                if partners:
                    f = partners[0]
                    assignment = {**schedule.assignment, e: cold, f: hot}
                    yield _Move(
                        f"swap {e} on {hot} with {f} on {cold}",
                        Schedule(assignment, schedule.nodes, schedule.slots_per_node),
                    )
