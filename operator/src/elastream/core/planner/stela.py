"""Stela scale-out (Algorithm 2) and scale-in (Algorithm 3), with projected ETP.

Scale-out fills `new_slot_count` slots on the new nodes (added nodes × average executors per node before),
one executor per iteration: to the congested vertex with the highest projected ETP (ties: topological
order), or to a source when nothing is congested; new nodes are used round-robin and existing executors
never move. After each choice the target's processing and emit rates are projected by (k+1)/k and its
children's input rates recomputed (section II-E). Choices the paper leaves open:

- A vertex already at `maxParallelism` cannot grow and is skipped; when no vertex can grow, the remaining
  slots stay empty and the step says so.
- A projected processing rate never exceeds the vertex's input rate (it cannot process what it does not
  receive), except for a source whose input rate was not measured (it emits as fast as it can).
- When the snapshot carries a vertex's true processing rate (processed / busy seconds, which the metric
  analysis computes), the projection uses it: the target's rate becomes min(input, true rate × (k+1)/k),
  and every vertex downstream is re-projected as min(its new input, its true rate), so a child with
  headroom absorbs the extra input instead of looking congested. Without true rates the paper's rule
  stands: children's processing rates are left as measured.
- The (k+1)/k projection assumes a new executor takes a 1/(k+1) share of the input, which holds for
  `shuffle` and (keys spread over key groups) `fields`. A vertex fed only through `global` streams sends
  everything to executor 0, so another executor gains nothing: such a vertex is never a target (the step
  lists it under `skipped`). A vertex fed through `all` gets a full copy of the stream in every executor:
  a new executor adds as much input as processing, so the vertex stays as congested as it was and its
  extra output is duplicates; the projection overstates it and Stela, like the paper, does not know.
  Mixed inputs are projected as if every stream were shuffled.

Scale-in removes one node at a time: the one with the lowest ETPSum, its executors dealt round-robin onto
the remaining nodes in increasing ETPSum order (skipping full nodes), ETPSums recomputed after every
removal. Where the paper is silent:

- ETPSum ties (common: every node of a round-robin schedule often hosts the same mix) go to node load, the
  sum of its executors' busy fractions (processing rate / true processing rate; each executor counts 1
  when the snapshot has no true rates): the least loaded node is removed, and among receivers with equal
  ETPSum the least loaded comes first. Remaining ties: the highest node number is removed first (like a
  StatefulSet scaling down).
- The removed node's executors are dealt heaviest first, so the busiest ones go to the first receivers
  rather than all landing where the order of their names puts them.
"""

from __future__ import annotations

from typing import Any

from elastream.core.metrics import Rates
from elastream.core.planner.etp import congested_vertices, etp_map, etp_sums
from elastream.core.planner.plan import PlanningError
from elastream.core.schedule import Schedule, fresh_node_names, node_index
from elastream.core.simulate import move_off_nodes, new_slot_count
from elastream.core.topology import Topology, executor_id, split_executor_id


def stela_scale_out(
    topology: Topology,
    schedule: Schedule,
    rates: Rates,
    target_nodes: int,
    congestion_rate: float,
    measured_source_input: frozenset[str] = frozenset(),
) -> tuple[Schedule, list[dict[str, Any]]]:
    added = target_nodes - len(schedule.nodes)
    new_nodes = fresh_node_names(schedule.nodes, added)
    slots = new_slot_count(schedule, added)
    inputs, processing, emit = dict(rates.input), dict(rates.processing), dict(rates.emit)
    capacity = dict(rates.capacity)
    parallelism = schedule.parallelism()
    free = dict.fromkeys(new_nodes, schedule.slots_per_node)
    assignment = dict(schedule.assignment)
    steps: list[dict[str, Any]] = []
    global_only = fed_only_by_global(topology)
    cursor = 0
    for iteration in range(slots):
        congested = congested_vertices(topology, inputs, processing, congestion_rate, capacity)
        etp = etp_map(topology, processing, congested)
        growable = [v for v in topology.order if parallelism[v] < topology.vertices[v].max_parallelism]
        candidates = [v for v in growable if v in congested and v not in global_only]
        skipped = sorted(congested & global_only, key=topology.position.__getitem__)
        reason = "highest ETP among congested vertices"
        if not candidates:
            candidates = [v for v in growable if v in topology.sources]
            reason = "no congested vertex can grow: a source gets the slot"
        if not candidates:
            steps.append({"iteration": iteration, "target": None, "reason": "every vertex is at maxParallelism"})
            break
        target = max(candidates, key=lambda v: (etp[v], -topology.position[v]))
        while free[new_nodes[cursor % added]] == 0:
            cursor += 1
        node = new_nodes[cursor % added]
        cursor += 1
        free[node] -= 1
        k = parallelism[target]
        assignment[executor_id(target, k)] = node
        parallelism[target] = k + 1
        before = processing[target]
        if target in capacity:
            capacity[target] *= (k + 1) / k
            projected = capacity[target]
        else:
            projected = before * (k + 1) / k
        is_unmeasured_source = target in topology.sources and target not in measured_source_input
        if not is_unmeasured_source:
            projected = min(projected, max(inputs[target], before))
        processing[target] = projected
        if is_unmeasured_source:
            inputs[target] = projected
        emit[target] = emit[target] * (projected / before) if before > 0 else emit[target]
        _propagate(topology, target, inputs, processing, emit, capacity)
        steps.append(
            {
                "iteration": iteration,
                "target": target,
                "node": node,
                "reason": reason,
                "congested": sorted(congested, key=topology.position.__getitem__),
                "etp": {v: round(etp[v], 6) for v in topology.order if v in congested or v == target},
                "projected_processing_rate": projected,
                "projected_throughput": sum(processing[s] for s in topology.sinks),
            }
        )
        if skipped:
            steps[-1]["skipped"] = {v: "fed only through global: another executor would get no input" for v in skipped}
    return Schedule(assignment, (*schedule.nodes, *new_nodes), schedule.slots_per_node), steps


def fed_only_by_global(topology: Topology) -> frozenset[str]:
    """Vertices whose every input stream is `global`: all their input goes to executor 0."""
    return frozenset(
        v
        for v in topology.order
        if topology.graph.in_degree(v) > 0
        and all(topology.stream(p, v).grouping == "global" for p in topology.parents(v))
    )


def _propagate(
    topology: Topology,
    target: str,
    inputs: dict[str, float],
    processing: dict[str, float],
    emit: dict[str, float],
    capacity: dict[str, float],
) -> None:
    """Update input rates below `target`; re-project processing where the true rate is known."""
    frontier = set(topology.children(target))
    while frontier:
        child = min(frontier, key=topology.position.__getitem__)
        frontier.discard(child)
        inputs[child] = sum(emit[p] for p in topology.parents(child))
        if child not in capacity:
            continue  # the paper's rule: a child's processing rate is left as measured
        new_rate = min(inputs[child], capacity[child])
        if new_rate != processing[child]:
            old = processing[child]
            emit[child] = emit[child] * new_rate / old if old > 0 else emit[child]
            processing[child] = new_rate
            frontier.update(topology.children(child))


def executor_load(topology: Topology, rates: Rates) -> dict[str, float]:
    """Per vertex, how busy one of its executors is: its processing rate over its true processing rate (the
    busy fraction, in threads), where the snapshot has true rates; without any, every executor counts 1."""
    if not rates.capacity:
        return dict.fromkeys(topology.order, 1.0)
    return {
        v: min(1.0, rates.processing[v] / rates.capacity[v]) if rates.capacity.get(v, 0.0) > 0 else 0.0
        for v in topology.order
    }


def stela_scale_in(
    topology: Topology,
    schedule: Schedule,
    rates: Rates,
    target_nodes: int,
    congestion_rate: float,
) -> tuple[Schedule, list[dict[str, Any]]]:
    congested = congested_vertices(topology, rates.input, rates.processing, congestion_rate, rates.capacity)
    etp = etp_map(topology, rates.processing, congested)
    busy = executor_load(topology, rates)
    steps: list[dict[str, Any]] = []
    current = schedule
    iteration = 0
    while len(current.nodes) > target_nodes:
        sums = etp_sums(etp, current.placement())
        load = {n: sum(busy[split_executor_id(e)[0]] for e in current.executors_on(n)) for n in current.nodes}
        ranked = sorted(current.nodes, key=lambda n: (round(sums[n], 9), round(load[n], 9), -node_index(n), n))
        victim, receivers = ranked[0], ranked[1:]
        weight = {e: busy[split_executor_id(e)[0]] for e in current.executors_on(victim)}
        try:
            current = move_off_nodes(current, [victim], receivers, weight)
        except ValueError as exc:
            raise PlanningError(str(exc)) from None
        steps.append(
            {
                "iteration": iteration,
                "removed": victim,
                "etp_sum": {n: round(sums[n], 6) for n in ranked},
                "load": {n: round(load[n], 3) for n in ranked},
                "receivers": receivers,
            }
        )
        iteration += 1
    return current, steps
