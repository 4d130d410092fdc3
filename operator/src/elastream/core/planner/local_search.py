"""Stela+'s local search: a bounded hill climb on the fluid model (`simulate`) and the moves it tries.

`stela_plus` climbs from Stela's plan (and again from its best CPU packing, `packing`); this module holds the
budget of both, the climb, and its neighbourhoods:

- **Search space.** Scale-out keeps Stela's space (and the exhaustive optimum's, `sim.optimum.optimal_scale_out`):
  existing executors never move, new executors go on the new nodes only, and there are at most as many as
  Stela's slot budget (`new_slot_count`); the search chooses which vertices get them and on which new node.
  (Existing executors move only in `stela_plus`'s rebalance, outside this space.) Scale-in keeps Stela's node
  choice and every vertex's parallelism and moves executors among the remaining nodes (each move a migration,
  within a bound the caller gives); a move must pay at least `min_gain` of throughput.
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
- **Bounded.** A simulation costs its fixed-point iterations × (executors + streams + vertices × executors /
  200) units (`simulation_work`), about 5 µs a unit on one core of the benchmark machine (`simulate` is
  linear in the network per iteration, plus a vertices × constraints pass); a candidate is simulated only
  when its estimated cost (with the last simulation's iteration count) still fits (`Search.affordable`).

Deterministic: candidates are ordered by value, then topological position and names, and the budget counts
work, not time.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastream.core.planner.stela import fed_only_by_global
from elastream.core.schedule import Schedule
from elastream.core.simulate import SimulationModel, SimulationResult, simulate
from elastream.core.topology import Topology, executor_id, split_executor_id

#: a vertex processing at least this fraction of what its executors could process is saturated
SATURATED = 1.0 - 1e-6


@dataclass(frozen=True)
class SearchBudget:
    """Bounds of one Stela+ plan: the climbs' (this module's docstring) and the rebalance's (`stela_plus`)."""

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
    #: existing executors a plan may move besides those on removed nodes; None: Stela's own count for the
    #: nodes added or removed (`new_slot_count`: average executors per node × nodes)
    moves: int | None = None
    #: bisection steps of the rebalance's rate search (packings per move cap, after trying 1 and the low end)
    bisections: int = 12
    #: units of work of the rebalance (its packings and their simulations), before and besides `work`
    rebalance_work: float = 25_000.0


DEFAULT_BUDGET = SearchBudget()


def simulation_work(topology: Topology, schedule: Schedule, iterations: int) -> float:
    """Work units of one simulation of `schedule` that took `iterations` fixed-point iterations."""
    executors = len(schedule)
    edges: int = topology.graph.number_of_edges()
    size = executors + edges + len(topology.order) * executors / 200.0
    return max(iterations, 1) * size


def moved(old: Schedule, new: Schedule) -> int:
    """Existing executors that run on another node in `new` (a removed node's included)."""
    return sum(1 for e, n in old.assignment.items() if e in new.assignment and new.assignment[e] != n)


@dataclass(frozen=True)
class Move:
    """One candidate of the climb: what it changes (for the step's `changes`) and the schedule it gives."""

    description: str
    schedule: Schedule


@dataclass
class Outcome:
    """What a climb did (and the plan's rebalance chose): the last step of a Stela+ plan (`as_step`)."""

    before: float | None = None
    after: float | None = None
    changes: list[str] = field(default_factory=list)
    simulations: int = 0
    rounds: int = 0
    work: float = 0.0
    stopped: str = ""
    #: what the rebalance tried and chose (`stela_plus`); None when it did not run
    rebalance: dict[str, Any] | None = None

    def as_step(self, iteration: int) -> dict[str, Any]:
        moves = len(self.changes)
        if self.before is None or self.after is None:
            reason = f"local search on the fluid model skipped: {self.stopped}"
        else:
            reason = (
                f"local search on the fluid model: {moves} move{'s' if moves != 1 else ''}, predicted "
                f"{self.before:.1f} -> {self.after:.1f} tuples/s ({self.stopped})"
            )
        if self.rebalance is not None and self.rebalance.get("chosen"):
            chosen = self.rebalance["chosen"]
            reason += f"; rebalanced by CPU: {chosen['label']}, {chosen['moves']} executors moved"
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
                "rebalance": self.rebalance,
            },
        }


class Search:
    """Simulations within the budget, and the hill climb over the moves a neighbourhood function offers."""

    def __init__(self, topology: Topology, model: SimulationModel, budget: SearchBudget) -> None:
        self.topology = topology
        self.model = model
        self.budget = budget
        self.simulations = 0
        self.work = 0.0
        #: the work the current phase may reach: the rebalance's share first, then the climb's on top
        self.work_limit = budget.work
        self.iterations = 1
        self.global_only = fed_only_by_global(topology)
        self.copying = frozenset(
            v for v in topology.order if any(topology.stream(p, v).grouping == "all" for p in topology.parents(v))
        )

    def affordable(self, schedule: Schedule, reserve: int = 0) -> bool:
        """One more simulation of `schedule` fits, `reserve` simulations left over (the rebalance keeps one for
        Stela's plan, which the climb simulates first)."""
        estimate = simulation_work(self.topology, schedule, self.iterations)
        return self.simulations + reserve < self.budget.simulations and self.work + estimate <= self.work_limit

    def too_large(self, schedule: Schedule) -> bool:
        """One simulation of `schedule` does not fit twice in the climb's or the rebalance's work budget."""
        budget = self.budget
        return 2 * simulation_work(self.topology, schedule, 1) > min(budget.work, budget.rebalance_work)

    def charge(self, work: float) -> bool:
        """Spend `work` units on something other than a simulation (packings); False when it does not fit."""
        if self.work + work > self.work_limit:
            return False
        self.work += work
        return True

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
        moves: Callable[[SimulationResult, Schedule], Sequence[Iterator[Move]]],
        climb: bool = True,
        known: SimulationResult | None = None,
    ) -> tuple[Schedule, Outcome]:
        """Hill climb from `start`. `moves(result, schedule)` gives tiers of moves (iterators of `Move`, most
        promising first); each round simulates up to `candidates` moves of a tier (`patience` more after the
        first that gains) and takes the best if it gains `min_gain`; the next tier is tried only when no
        move of the tier before gained. `known` is `start`'s simulation when it was simulated already."""
        outcome = Outcome()
        budget = self.budget
        if 2 * simulation_work(self.topology, start, 1) > budget.work:
            outcome.stopped = "one simulation of this topology does not fit twice in the work budget"
            return start, outcome
        try:
            result = known or self.simulate(start)
        except ValueError as exc:
            outcome.stopped = f"the fluid model cannot evaluate it ({exc})"
            return start, outcome
        current, throughput = start, result.throughput
        outcome.before = throughput
        outcome.stopped = "no move gains" if climb else "a packing carries the offered rate: no climb"
        for _ in range(budget.rounds if climb else 0):
            outcome.rounds += 1
            best: tuple[float, Move, SimulationResult] | None = None
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
            if climb:
                outcome.stopped = "round limit"
        outcome.after = throughput
        outcome.simulations = self.simulations
        outcome.work = self.work
        return current, outcome


# ---- scale-out moves -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutState:
    """Old schedule (fixed) plus how many new executors of each vertex each new node holds."""

    old: Schedule
    new_nodes: tuple[str, ...]
    base: Mapping[str, int]
    counts: Mapping[str, Counter[str]]

    @staticmethod
    def of(old: Schedule, new_nodes: tuple[str, ...], base: Mapping[str, int], current: Schedule) -> OutState:
        counts: dict[str, Counter[str]] = {n: Counter() for n in new_nodes}
        for e, n in current.assignment.items():
            if e not in old.assignment:
                counts[n][split_executor_id(e)[0]] += 1
        return OutState(old, new_nodes, base, counts)

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


def out_moves(search: Search, state: OutState, result: SimulationResult, limit: int) -> list[Iterator[Move]]:
    """Single moves first; two retargets at once only when no single move gains."""
    return [
        _out_single(search, state, result, limit),
        _out_pairs(search, state, result),
        _out_removals(search, state, result),
    ]


def _out_removals(search: Search, state: OutState, result: SimulationResult) -> Iterator[Move]:
    """A new executor fewer: the last resort, when neither one nor two retargets gain (an extra copy behind
    an `all` stream, or an executor whose CPU use slows a bottleneck on its node, can cost throughput)."""
    for a, nodes in itertools.islice(_donors(search, state, result).items(), 8):
        yield Move(f"remove {a} from {nodes[0]}", state.changed([(nodes[0], a, -1)], search.topology.order))


def _targets(search: Search, state: OutState, result: SimulationResult, extra: int = 1) -> list[str]:
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


def _donors(search: Search, state: OutState, result: SimulationResult) -> dict[str, list[str]]:
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


def _out_pairs(search: Search, state: OutState, result: SimulationResult) -> Iterator[Move]:
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
            yield Move(f"retarget {a1} -> {b1} on {n1} and {a2} -> {b2} on {n2}", state.changed(changes, order))


def _out_single(search: Search, state: OutState, result: SimulationResult, limit: int) -> Iterator[Move]:
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
            yield Move(f"add {v} on {roomy[0]}", state.changed([(roomy[0], v, +1)], order))
    for b in targets[:8]:
        for a, nodes in itertools.islice(donors.items(), 8):
            if a != b:
                node = nodes[0]
                yield Move(f"retarget {a} -> {b} on {node}", state.changed([(node, a, -1), (node, b, +1)], order))
    if search.model.node_cpu is None or len(state.new_nodes) < 2:
        return  # without a node CPU limit, where a new executor runs does not change the prediction
    hot = min(state.new_nodes, key=lambda n: (-cpu.get(n, 0.0), rank[n]))
    movers = sorted(
        (v for v, c in state.counts[hot].items() if c > 0), key=lambda v: (-search.utilisation(result, v), position[v])
    )
    for cold in cool_first([n for n in state.new_nodes if n != hot]):
        for v in movers:
            if state.free(cold) > 0:
                yield Move(f"relocate {v} {hot} -> {cold}", state.changed([(hot, v, -1), (cold, v, +1)], order))
            for w in sorted(state.counts[cold], key=lambda w: (search.utilisation(result, w), position[w])):
                if w != v and state.counts[cold][w] > 0:
                    changes = [(hot, v, -1), (cold, v, +1), (cold, w, -1), (hot, w, +1)]
                    yield Move(f"swap {v} on {hot} with {w} on {cold}", state.changed(changes, order))


# ---- scale-in moves --------------------------------------------------------------------------------------


def in_moves(
    search: Search, original: Schedule, schedule: Schedule, result: SimulationResult, limit: int
) -> Iterator[Move]:
    """Moves and swaps from the two nodes using most CPU to the three using least, the saturated vertices'
    busiest executors first; none that leaves more than `limit` executors off their original node."""
    for move in _in_candidates(search, schedule, result):
        if moved(original, move.schedule) <= limit:
            yield move


def _in_candidates(search: Search, schedule: Schedule, result: SimulationResult) -> Iterator[Move]:
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
                    yield Move(
                        f"move {e} {hot} -> {cold}", Schedule(assignment, schedule.nodes, schedule.slots_per_node)
                    )
                partners = sorted(
                    (f for f in schedule.executors_on(cold) if split_executor_id(f)[0] != v),
                    key=lambda f: (split_executor_id(f)[0] in saturated, used(f), f),
                )
                if partners:
                    f = partners[0]
                    assignment = {**schedule.assignment, e: cold, f: hot}
                    yield Move(
                        f"swap {e} on {hot} with {f} on {cold}",
                        Schedule(assignment, schedule.nodes, schedule.slots_per_node),
                    )
