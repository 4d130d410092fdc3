"""Stela+ (`stela-plus`): Stela's plan, then a bounded hill climb on the fluid model (`simulate`).

Both are weighed against a rebalance by CPU that may move existing executors (cheap moves). Stela chooses
with projections (ETP, (k+1)/k) and cannot see what the fluid model sees: a vertex fed through `all` or
`global` does not speed up by (k+1)/k, two bottlenecks in a row gain nothing from one executor, a `fields`
vertex goes at the pace of its largest key-group share, and executors on a node share its CPU. Stela+
makes three kinds of plan with the model `make_plan` predicts with and keeps the best:

1. Stela's plan (scale-out: Algorithm 2's new executors on the new nodes; scale-in: ETPSum removal).
2. The hill climb from it (`local_search`): moves whose effect it simulates, until none raises predicted
   throughput by more than `min_gain` (relative) or a bound is reached.
3. The rebalance (its CPU packings and rate search: `packing`), where a node CPU limit makes placement
   matter: for the largest fraction of the offered rate it can carry, each vertex at the degree that rate
   needs, every executor's CPU demand fitted to the nodes, existing executors moved off nodes whose CPU they
   exceed (and, to make room for a larger executor, smaller ones moved). Stela never moves an existing
   executor, so its new executors share the new nodes while the crowded old nodes stay crowded: on the Page
   Load and Processing examples (7 -> 8, 8 -> 9) its plan predicts 1.02x and 1.19x Storm's round-robin, the
   rebalance 1.66x and 1.79x (4 and 3 moves, within 2 % of the nodes' CPU bound). Scale-out packs on Stela's
   nodes (old and new); scale-in packs on the nodes Stela keeps and on those kept when the nodes *using least
   CPU* are removed (ties: lowest ETPSum), so the nodes to remove are chosen by CPU as well as by ETPSum.

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

This module makes the plan (Stela's, the climbs, the rebalance's layouts and move caps, the choice);
`local_search` holds the climb, its moves and the budget, `packing` the CPU packing and the rate search.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastream.core.metrics import Rates
from elastream.core.pareto import fixed_vertices
from elastream.core.planner.etp import congested_vertices, etp_map, etp_sums
from elastream.core.planner.local_search import (
    DEFAULT_BUDGET,
    Move,
    Outcome,
    OutState,
    Search,
    SearchBudget,
    in_moves,
    moved,
    out_moves,
)
from elastream.core.planner.packing import RateModel, best_packing, packing_work
from elastream.core.planner.stela import stela_scale_in, stela_scale_out
from elastream.core.schedule import Schedule, node_index
from elastream.core.simulate import (
    SimulationModel,
    SimulationResult,
    new_slot_count,
)
from elastream.core.topology import Topology

__all__ = ["DEFAULT_BUDGET", "SearchBudget", "stela_plus_scale_in", "stela_plus_scale_out"]

#: the rebalance's rate search starts at this fraction of the offered rate, or at half the fraction the
#: sinks' measured rate is when that is lower
LOWEST_FRACTION = 0.01


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
    search = Search(topology, model, budget)
    old_nodes = set(schedule.nodes)
    new_nodes = tuple(n for n in start.nodes if n not in old_nodes)
    base = schedule.parallelism()
    limit = max(new_slot_count(schedule, len(new_nodes)), OutState.of(schedule, new_nodes, base, start).new_executors())

    def moves(result: SimulationResult, current: Schedule) -> list[Iterator[Move]]:
        return out_moves(search, OutState.of(schedule, new_nodes, base, current), result, limit)

    max_moves = budget.moves if budget.moves is not None else new_slot_count(schedule, len(new_nodes))
    packings, info = _packings(search, schedule, rates, [("", start.nodes)], max_moves, spread=True)
    best, outcome = _climb_and_choose(search, schedule, start, moves, (packings, info), max_moves)
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
    search = Search(topology, model, budget)
    if model.node_cpu is None:
        step = Outcome(stopped="no node CPU limit: placement cannot change the prediction")
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

    def moves(result: SimulationResult, current: Schedule) -> list[Iterator[Move]]:
        return [in_moves(search, schedule, current, result, forced + max_moves)]

    best, outcome = _climb_and_choose(search, schedule, start, moves, (packings, info), max_moves)
    return best, [*steps, outcome.as_step(len(steps))]


def _least_cpu(
    search: Search, schedule: Schedule, rates: Rates, congestion_rate: float, count: int
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
    search: Search,
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
        return _pack_layouts(search, old, measured, (layouts, max_moves, spread))
    finally:
        search.work_limit = search.work + search.budget.work


def _pack_layouts(
    search: Search, old: Schedule, measured: Rates, asked: tuple[Sequence[tuple[str, tuple[str, ...]]], int, bool]
) -> tuple[list[_Candidate], dict[str, Any]]:
    """`_packings` within its work budget: `asked` is (layouts, max_moves, spread)."""
    layouts, max_moves, spread = asked
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


def _climb_and_choose(
    search: Search,
    old: Schedule,
    start: Schedule,
    moves: Callable[[SimulationResult, Schedule], Sequence[Iterator[Move]]],
    rebalance: tuple[list[_Candidate], dict[str, Any]],
    max_moves: int,
) -> tuple[Schedule, Outcome]:
    """What both directions do once the rebalance has packed (`rebalance`: `_packings`' result): the climb
    from Stela's plan `start` with `moves` (none when a packing already carries the offered rate), the second
    climb from the best packing (`_polish`), and the choice among them (`_choose`)."""
    packings, info = rebalance
    best, outcome = search.run(start, moves, climb=not _carries_offered(packings, info))
    polished = _polish(search, old, packings, outcome, info, max_moves)
    return _choose(search, old, best, outcome, [*packings, *polished], info), outcome


def _polish(
    search: Search,
    old: Schedule,
    packings: Sequence[_Candidate],
    outcome: Outcome,
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

    def moves(result: SimulationResult, current: Schedule) -> list[Iterator[Move]]:
        return [in_moves(search, old, current, result, seed.forced + max_moves)]

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
    search: Search,
    old: Schedule,
    incumbent: Schedule,
    outcome: Outcome,
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
