"""Exhaustive optima for small cases: the yardsticks the planners and the Pareto greedy are checked against.

`optimal_scale_out` and `optimal_scale_in` search every schedule a scale-out (new executors on the new
nodes, the existing ones kept in place: the space Stela searches greedily) or a scale-in (every choice of
nodes to remove) can produce; `exhaustive_configuration` every parallelism vector for a node count (the
space `core.pareto.best_configuration` searches greedily). Tests and bench/planners.py use them; the
operator does not (they grow exponentially: each raises `SearchTooLarge` past its `limit`).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

from elastream.core.pareto import Configuration, ParetoError, evaluate, gains, same_throughput, starting_parallelism
from elastream.core.schedule import Schedule, fresh_node_names
from elastream.core.simulate import SimulationModel, move_off_nodes, new_slot_count, simulate
from elastream.core.topology import Topology, executor_id

#: the best throughput found and the schedule that reaches it
_Best = tuple[float, Schedule]


class SearchTooLarge(ValueError):
    """An exhaustive search would evaluate more schedules than its limit allows."""


def optimal_scale_out(topology: Topology, schedule: Schedule, target_nodes: int, limit: int = 50_000) -> _Best:
    """The best throughput any choice of new executors on the new nodes can reach, existing executors kept
    in place (the space Stela searches greedily): every multiset of vertices for the new slots, split over
    the (identical, empty) new nodes in every distinct way. Raises `SearchTooLarge` past `limit` schedules."""
    model = SimulationModel.from_topology(topology)
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


def optimal_scale_in(topology: Topology, schedule: Schedule, target_nodes: int, limit: int = 50_000) -> _Best:
    """The best throughput over every choice of nodes to remove, their executors dealt round-robin onto the
    remaining nodes (the move rule Stela and random removal share), so only the choice of nodes differs."""
    model = SimulationModel.from_topology(topology)
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


def exhaustive_configuration(
    topology: Topology,
    model: SimulationModel,
    nodes: int,
    fixed: Sequence[str] = (),
    limit: int = 20_000,
) -> Configuration:
    """The best parallelism for `nodes` nodes over every vector within the slots and [1, maxParallelism]
    (ties: fewer executors, then the first in lexicographic order), for checking the greedy on small cases.
    Raises `SearchTooLarge` past `limit` vectors."""
    budget = nodes * topology.slots_per_node
    start = starting_parallelism(topology, fixed)
    ranges = [
        range(start[v], start[v] + 1) if v in fixed else range(1, topology.vertices[v].max_parallelism + 1)
        for v in topology.order
    ]
    if math.prod(len(r) for r in ranges) > limit:
        raise SearchTooLarge(f"more than {limit} parallelism vectors to evaluate; use a smaller case")
    best: Configuration | None = None
    for vector in itertools.product(*ranges):
        if sum(vector) > budget:
            continue
        parallelism = dict(zip(topology.order, vector, strict=True))
        throughput, _ = evaluate(topology, model, nodes, parallelism)
        if (
            best is None
            or gains(throughput, best.throughput)
            or (same_throughput(throughput, best.throughput) and sum(vector) < best.executors)
        ):
            best = Configuration(nodes, parallelism, throughput)
    if best is None:
        raise ParetoError(f"no parallelism fits {nodes} nodes × {topology.slots_per_node} slots")
    return best
