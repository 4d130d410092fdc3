"""Stela+ (`stela-plus`): Stela's plan, then a bounded hill climb on the fluid model (`simulate`).

Both are weighed against a rebalance by CPU that may move existing executors (cheap moves). Stela chooses
with projections (ETP, (k+1)/k) and cannot see what the fluid model sees: a vertex fed through `all` or
`global` does not speed up by (k+1)/k, two bottlenecks in a row gain nothing from one executor, a `fields`
vertex goes at the pace of its largest key-group share, and executors on a node share its CPU. Stela+
makes three kinds of plan with the model `make_plan` predicts with and keeps the best:

1. Stela's plan (scale-out: Algorithm 2's new executors on the new nodes; scale-in: ETPSum removal).
2. The hill climb from it (below): moves whose effect it simulates, until none raises predicted throughput
   by more than `min_gain` (relative) or a bound is reached.
3. The rebalance (the packing section below), where a node CPU limit makes placement matter: for the largest
   fraction of the offered rate it can carry, each vertex at the degree that rate needs, every executor's
   CPU demand fitted to the nodes, existing executors moved off nodes whose CPU they exceed (and, to make
   room for a larger executor, smaller ones moved). Stela never moves an existing executor, so its new
   executors share the new nodes while the crowded old nodes stay crowded: on the Page Load and Processing
   examples its plan predicts 1.02x and 1.21x Storm's round-robin, the rebalance their offered rates
   (1.53x and 1.31x, with 2 and 0 moves). Scale-out packs on Stela's nodes (old and new);
   scale-in packs on the nodes Stela keeps and on those kept when the nodes *using least CPU* are removed
   (ties: lowest ETPSum), so the nodes to remove are chosen by CPU as well as by ETPSum.

Moves cost a migration: under CCR about 0.1 s of pause per moved executor and its key groups' state. So:

- **At most M moves.** M = `new_slot_count(schedule, nodes added or removed)` (Stela's average executors
  per node × those nodes; `SearchBudget.moves` overrides it): on a scale-out at most M existing executors
  move, as many as Stela's own plan starts on the new nodes, so a migration touches at most about twice
  the executors Stela's does; on a scale-in the executors of the removed nodes move (they must) and at
  most M others, about as many again. The hill climb's scale-in moves keep within the same bound; on a
  scale-out the climb moves no existing executor.
- **Fewest moves that pay.** For each layout the rebalance packs with at most M extra moves, then with
  none, then bisects the cap between (at most 2 + ⌈log2(M + 1)⌉ packings, each simulated), and the plan
  with more moves wins only if it predicts more by `min_gain` per extra move.
- **New executors.** The rebalance grows a vertex only where an executor would receive more than its
  thread processes at the rate sought, to the smallest degree that keeps up (a `fields` vertex jumps to the
  degree that lowers its largest key-group share); if that does not pack, every vertex at the degree the
  offered rate needs (more executors spread a crowded node's load). Degrees never go down, a redis-stream
  source's never changes, and the executors fit the slots. This can exceed Stela's slot budget: the
  resource a scale gives is the nodes' CPU, which the packing accounts for.

The hill climb, in detail:

- **Search space.** Scale-out keeps Stela's space (and the exhaustive optimum's, `sim.optimum.optimal_scale_out`):
  existing executors never move, new executors go on the new nodes only, and there are at most as many as
  Stela's slot budget (`new_slot_count`); the search chooses which vertices get them and on which new node.
  Scale-in keeps Stela's node choice and every vertex's parallelism and moves executors among the remaining
  nodes (each move a migration, within the bound above); a move must pay at least `min_gain` of throughput.
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
- **Skipped** when a packing already predicts the offered rate's throughput (nothing can do better).

Bounds. The rebalance runs first, within `rebalance_work` units; the climb then gets `work` units on top of
what the rebalance spent, and both share `simulations`. A simulation costs its fixed-point iterations ×
(executors + streams + vertices × executors / 200) units, about 5 µs a unit on one core of the benchmark
machine (`simulate` is linear in the network per iteration, plus a vertices × constraints pass); a packing
costs executors × (1 + nodes / 8) units (`packing_work`), and a rate search `bisections` + 2 packings (twice
that where it also tries the offered rate's degrees). The climb runs at most `rounds` rounds; when the best
packing predicts more than Stela's plan and budget is left, a second climb of at most `rounds` rounds
(relocate or swap executors between any nodes, within the packing's move bound) starts from it, and its plan
is one more candidate. A candidate is simulated only when its estimated cost (with the last simulation's
iteration count) still fits. So large topologies get few, well-chosen candidates (about six at 1,000
vertices), and a topology whose one simulation does not fit twice in the budget is neither searched nor
rebalanced (the step says so). Everything is deterministic: candidates are ordered by value, then
topological position and names, and the budget counts work, not time.

**Never worse.** The climb starts from Stela's schedule itself and accepts only improvements, and a packing
replaces it only if it predicts more, so the predicted throughput is at least Stela's under the same model;
when nothing improves, the plan is Stela's.

The last step of a plan reports the search: `{"iteration", "reason", "search": {"moves", "predicted":
[Stela's, final], "changes", "simulations", "rounds", "work", "stopped", "rebalance": {"max_moves",
"offered", "candidates": [{"label", "fraction", "moves", "predicted"}], "polished": {"from", "changes",
"predicted"} (when the second climb moved something), "chosen", "stopped"}}}`; `changes` are the first
climb's, `chosen` is null when the climb's plan (or Stela's) stands.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastream.core.metrics import Rates
from elastream.core.pareto import fixed_vertices
from elastream.core.planner.etp import congested_vertices, etp_map, etp_sums
from elastream.core.planner.stela import fed_only_by_global, stela_scale_in, stela_scale_out
from elastream.core.schedule import Schedule, node_index
from elastream.core.simulate import (
    SimulationModel,
    SimulationResult,
    VertexModel,
    input_shares,
    new_slot_count,
    simulate,
)
from elastream.core.topology import Topology, executor_id, split_executor_id

#: a vertex processing at least this fraction of what its executors could process is saturated
SATURATED = 1.0 - 1e-6
#: the rebalance's rate search starts at this fraction of the offered rate, or at half the fraction the
#: sinks' measured rate is when that is lower
LOWEST_FRACTION = 0.01


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
    """Stela's scale-out (`stela_scale_out`), the search over the new executors, then the rebalance that
    may move existing executors (module docstring)."""
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

    max_moves = budget.moves if budget.moves is not None else new_slot_count(schedule, len(new_nodes))
    packings, info = _packings(search, schedule, rates, [("", start.nodes)], max_moves, spread=True)
    best, outcome = search.run(start, moves, climb=not _carries_offered(packings, info))
    polished = _polish(search, schedule, packings, outcome, info, max_moves)
    best = _choose(search, schedule, best, outcome, [*packings, *polished], info)
    return best, [*steps, outcome.as_step(len(steps))]


def stela_plus_scale_in(
    topology: Topology,
    schedule: Schedule,
    rates: Rates,
    target_nodes: int,
    congestion_rate: float,
    model: SimulationModel,
    budget: SearchBudget = DEFAULT_BUDGET,
) -> tuple[Schedule, list[dict[str, Any]]]:
    """Stela's scale-in (`stela_scale_in`) and the search over placements on the remaining nodes, then the
    rebalance of Stela's nodes and of the nodes using least CPU (module docstring)."""
    start, steps = stela_scale_in(topology, schedule, rates, target_nodes, congestion_rate)
    search = _Search(topology, model, budget)
    if model.node_cpu is None:
        step = _Outcome(stopped="no node CPU limit: placement cannot change the prediction")
        return start, [*steps, step.as_step(len(steps))]
    removed = len(schedule.nodes) - target_nodes
    max_moves = budget.moves if budget.moves is not None else new_slot_count(schedule, removed)
    stela_removed = [n for n in schedule.nodes if n not in set(start.nodes)]
    forced = sum(len(schedule.executors_on(n)) for n in stela_removed)

    layouts = [("Stela's nodes (ETPSum)", start.nodes)]
    search.work_limit = budget.rebalance_work
    by_cpu = _least_cpu(search, schedule, rates, congestion_rate, removed)
    if by_cpu is not None and set(by_cpu) != set(stela_removed):
        kept = tuple(n for n in schedule.nodes if n not in set(by_cpu))
        layouts.append((f"least CPU: {', '.join(by_cpu)} removed", kept))
    packings, info = _packings(search, schedule, rates, layouts, max_moves, spread=False)

    def moves(result: SimulationResult, current: Schedule) -> list[Iterator[_Move]]:
        return [_in_moves(search, schedule, current, result, forced + max_moves)]

    best, outcome = search.run(start, moves, climb=not _carries_offered(packings, info))
    polished = _polish(search, schedule, packings, outcome, info, max_moves)
    best = _choose(search, schedule, best, outcome, [*packings, *polished], info)
    return best, [*steps, outcome.as_step(len(steps))]


def _least_cpu(
    search: _Search, schedule: Schedule, rates: Rates, congestion_rate: float, count: int
) -> list[str] | None:
    """The `count` nodes using least CPU in the model (ties: lowest ETPSum, then the highest number), or
    None when the model cannot evaluate the schedule or the budget has no simulation left for it."""
    topology = search.topology
    if search.too_large(schedule) or not search.affordable(schedule, reserve=1):
        return None
    try:
        used = search.simulate(schedule).node_cpu_used
    except ValueError:
        return None
    congested = congested_vertices(topology, rates.input, rates.processing, congestion_rate, rates.capacity)
    sums = etp_sums(etp_map(topology, rates.processing, congested), schedule.placement())
    ranked = sorted(schedule.nodes, key=lambda n: (round(used.get(n, 0.0), 9), round(sums[n], 9), -node_index(n), n))
    return ranked[:count]


def moved(old: Schedule, new: Schedule) -> int:
    """Existing executors that run on another node in `new` (a removed node's included)."""
    return sum(1 for e, n in old.assignment.items() if e in new.assignment and new.assignment[e] != n)


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
    #: what the rebalance tried and chose (`_packings`, `_choose`); None when it did not run
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


class _Search:
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
        moves: Callable[[SimulationResult, Schedule], Sequence[Iterator[_Move]]],
        climb: bool = True,
        known: SimulationResult | None = None,
    ) -> tuple[Schedule, _Outcome]:
        """Hill climb from `start`. `moves(result, schedule)` gives tiers of moves (iterators of `_Move`, most
        promising first); each round simulates up to `candidates` moves of a tier (`patience` more after the
        first that gains) and takes the best if it gains `min_gain`; the next tier is tried only when no
        move of the tier before gained. `known` is `start`'s simulation when it was simulated already."""
        outcome = _Outcome()
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
            if climb:
                outcome.stopped = "round limit"
        outcome.after = throughput
        outcome.simulations = self.simulations
        outcome.work = self.work
        return current, outcome


# ---- rebalance --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    label: str
    schedule: Schedule
    throughput: float
    #: existing executors moved, those on removed nodes included
    moves: int
    #: the executors on the nodes it removes
    forced: int = 0
    result: SimulationResult | None = None


def _packings(
    search: _Search,
    old: Schedule,
    measured: Rates,
    layouts: Sequence[tuple[str, tuple[str, ...]]],
    max_moves: int,
    spread: bool,
) -> tuple[list[_Candidate], dict[str, Any]]:
    """CPU packings of each layout (label, nodes kept), each simulated: with at most `max_moves` moves
    beyond a removed node's executors, then none, then a bisection of the cap for the fewest extra moves
    whose packing the first does not beat by `min_gain` per move. Returns them and what the rebalance
    reports. Spends at most `rebalance_work` (with what the caller spent before); the climb then gets
    `work` on top of what this spent."""
    search.work_limit = search.budget.rebalance_work
    try:
        return _pack_layouts(search, old, measured, layouts, max_moves, spread)
    finally:
        search.work_limit = search.work + search.budget.work


def _pack_layouts(
    search: _Search,
    old: Schedule,
    measured: Rates,
    layouts: Sequence[tuple[str, tuple[str, ...]]],
    max_moves: int,
    spread: bool,
) -> tuple[list[_Candidate], dict[str, Any]]:
    topology, budget = search.topology, search.budget
    info: dict[str, Any] = {"max_moves": max_moves, "candidates": [], "chosen": None, "stopped": ""}
    candidates: list[_Candidate] = []
    if search.model.node_cpu is None:
        info["stopped"] = "no node CPU limit: moves cannot relieve a node"
        return candidates, info
    if search.too_large(old):
        info["stopped"] = "one simulation of this topology does not fit twice in the work budget"
        return candidates, info
    try:
        rates = RateModel.of(topology, old, search.model, frozenset(fixed_vertices(topology)))
    except ValueError as exc:
        info["stopped"] = f"no offered rate to rebalance for ({exc})"
        return candidates, info
    current = old.parallelism()
    now = sum(measured.processing[v] for v in topology.sinks) / rates.throughput if rates.throughput > 0 else 0.0
    low = min(LOWEST_FRACTION, 0.5 * now) if now > 0 else LOWEST_FRACTION
    info["stopped"] = "done"
    info["offered"] = rates.throughput
    seen: dict[frozenset[tuple[str, str]], _Candidate] = {}
    for label, nodes in layouts:
        forced = sum(len(old.executors_on(n)) for n in old.nodes if n not in set(nodes))

        def at(cap: int, label: str = label, nodes: tuple[str, ...] = nodes, forced: int = forced) -> _Candidate | None:
            """The packing with at most `cap` extra moves, simulated (None: none packs, or no budget)."""
            if not search.charge((budget.bisections + 2) * (1 + spread) * packing_work(old, nodes)):
                raise _OutOfBudget
            packing, _ = best_packing(topology, rates, old, nodes, current, cap, low, budget.bisections, spread)
            if packing is None:
                return None
            key = frozenset(packing.schedule.assignment.items())
            if key in seen:
                return seen[key]
            if not search.affordable(packing.schedule, reserve=1):
                raise _OutOfBudget
            name = f"{label + ', ' if label else ''}at most {cap} extra moves"
            result = search.simulate(packing.schedule)
            found = _Candidate(name, packing.schedule, result.throughput, packing.moves, forced, result)
            seen[key] = found
            candidates.append(found)
            info["candidates"].append(
                {
                    "label": name,
                    "fraction": round(packing.fraction, 6),
                    "moves": found.moves,
                    "predicted": found.throughput,
                }
            )
            return found

        def beaten(c: _Candidate | None, by: _Candidate) -> bool:
            return c is None or by.throughput > c.throughput * (1.0 + budget.min_gain * max(1, by.moves - c.moves))

        try:
            top = at(max_moves)
            if top is None:
                continue
            # the fewest extra moves whose packing the widest one does not beat: 0, then bisection
            lo, hi = -1, top.moves - forced
            if hi > 0 and beaten(at(0), top):
                lo = 0
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if beaten(at(mid), top):
                        lo = mid
                    else:
                        hi = mid
        except _OutOfBudget:
            info["stopped"] = "budget spent"
            break
    return candidates, info


class _OutOfBudget(Exception):
    """The work or simulation budget has no room for the next packing."""


def _polish(
    search: _Search,
    old: Schedule,
    packings: Sequence[_Candidate],
    outcome: _Outcome,
    info: dict[str, Any],
    max_moves: int,
) -> list[_Candidate]:
    """A second climb, with the scale-in climb's moves (relocate, swap an executor between any two nodes),
    from the best packing when it predicts more than Stela's plan and the first climb left budget: a
    packing is a heuristic, and a few moves often take it further. Within the packing's move bound (its
    removed nodes' executors and `max_moves`)."""
    if outcome.before is None or not packings or outcome.stopped == "budget spent":
        return []
    seed = max(packings, key=lambda c: c.throughput)
    if seed.throughput <= outcome.before or _carries_offered(packings, info):
        return []

    def moves(result: SimulationResult, current: Schedule) -> list[Iterator[_Move]]:
        return [_in_moves(search, old, current, result, seed.forced + max_moves)]

    best, polished = search.run(seed.schedule, moves, known=seed.result)
    if polished.after is None or not polished.changes:
        return []
    info["polished"] = {"from": seed.label, "changes": polished.changes, "predicted": polished.after}
    return [
        _Candidate(f"{seed.label}, then {len(polished.changes)} climb moves", best, polished.after, moved(old, best))
    ]


def _carries_offered(packings: Sequence[_Candidate], info: Mapping[str, Any]) -> bool:
    """Some packing's prediction reaches the offered rate's throughput: no placement can do better."""
    offered = info.get("offered")
    return isinstance(offered, float) and any(c.throughput >= offered * (1.0 - 1e-9) for c in packings)


def _choose(
    search: _Search,
    old: Schedule,
    incumbent: Schedule,
    outcome: _Outcome,
    packings: Sequence[_Candidate],
    info: dict[str, Any],
) -> Schedule:
    """The search's plan or a packing (`_cheapest`); records the choice in `outcome`."""
    outcome.rebalance = info
    outcome.simulations = search.simulations
    outcome.work = search.work
    if outcome.after is None:
        return incumbent  # the model cannot evaluate Stela's plan: nothing to compare with
    candidates = [_Candidate("the search's plan", incumbent, outcome.after, moved(old, incumbent)), *packings]
    chosen = _cheapest(candidates, search.budget.min_gain)
    if chosen is not candidates[0]:
        info["chosen"] = {"label": chosen.label, "moves": chosen.moves, "predicted": chosen.throughput}
        outcome.after = chosen.throughput
    return chosen.schedule


def _cheapest(candidates: Sequence[_Candidate], min_gain: float) -> _Candidate:
    """From the fewest moves up (the first candidate, the incumbent, before others with as many), a candidate
    replaces the one chosen so far only if it predicts more by `min_gain` per extra move (at least one)."""
    ordered = sorted(enumerate(candidates), key=lambda item: (item[1].moves, item[0] > 0, -item[1].throughput, item[0]))
    chosen = ordered[0][1]
    for _, c in ordered[1:]:
        if c.throughput > chosen.throughput * (1.0 + min_gain * max(1, c.moves - chosen.moves)):
            chosen = c
    return chosen


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


def _in_moves(
    search: _Search, original: Schedule, schedule: Schedule, result: SimulationResult, limit: int
) -> Iterator[_Move]:
    """Moves and swaps from the two nodes using most CPU to the three using least, the saturated vertices'
    busiest executors first; none that leaves more than `limit` executors off their original node."""
    for move in _in_candidates(search, schedule, result):
        if moved(original, move.schedule) <= limit:
            yield move


def _in_candidates(search: _Search, schedule: Schedule, result: SimulationResult) -> Iterator[_Move]:
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


# ---- packing: the rebalance's rate model and CPU packing ---------------------------------------------------
#
# The parallelism and placement that carry a fraction of the offered rate, with few moves; the rebalance
# uses them where a node CPU limit makes placement matter. For a rate fraction f (every
# source offered f × its rate) the fluid model's flows are known without simulating a schedule: with every
# vertex keeping up, a vertex's input is linear in f, and what each of its executors receives follows from
# its input streams' groupings (`input_shares`). From that:
#
# - **Parallelism** (`RateModel.parallelism`): each vertex keeps its degree unless an executor would receive
#   more than its thread processes (its capacity); then it grows to the smallest degree at which none does
#   (up to maxParallelism). For a `fields` input that is the next degree that lowers the largest key-group
#   share (with 8 key groups, 4 -> 8: 5, 6 and 7 executors leave some executor 2 of the 8), which one
#   executor at a time never finds. A vertex that more executors cannot help (fed through `global` or
#   `all`) or whose degree is fixed makes the fraction infeasible. Degrees never go down.
# - **Placement** (`pack`): every executor's CPU demand is its load × cost; a node's executors must fit its
#   CPU limit (then the fluid model gives each what it needs) and its slots. Executors stay where they are
#   unless their node is removed or over its CPU; an over-full node gives up the smallest executor whose
#   leaving suffices (else its largest, and again). The executors to place (new ones, those moved off)
#   go largest first to the node with the most CPU left (worst fit, so load spreads); when none has room,
#   the node that needs the fewest evictions of smaller executors makes room (those go back in the queue).
#   Each existing executor that changes node is one move, and a packing that needs more than `max_moves`
#   moves (those a removed node forces not counted) fails.
# - **Rate** (`best_packing`): the largest f (geometric bisection, `steps` packings) whose parallelism and placement
#   fit; the schedule then goes to the simulator, which is the judge.
#
# Pure and deterministic: ties go to topological order, executor index and node order.


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
    """Place `parallelism`'s executors on `nodes` within `cpu` per node (module docstring); returns the
    schedule, its moves and the moves removed nodes forced, or None when it does not fit."""
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
    """Work units (`simulation_work`'s) of one packing: each executor placed looks at every node."""
    return len(old) * (1.0 + len(nodes) / 8.0)
