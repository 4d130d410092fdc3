"""Baseline planners Stela is compared with.

- `round-robin`: Storm's default rebalance: unassign every executor and deal them round-robin over the new
  node set; parallelism unchanged.
- `least-link-load` (Aniello et al., the "Least Link Load" strategy of Stela section III-C): parallelism
  unchanged; executor pairs sorted by the traffic on the link between them (from the snapshot's emit rates
  and the groupings), heaviest first; an unplaced executor goes to the node (with room) holding the most traffic
  with it, so heavily communicating executors are co-located; each node takes at most ceil(executors / nodes).
- `random`: scale-in removes randomly chosen nodes (their executors dealt round-robin onto the rest, the
  move rule Stela uses, so only the choice differs); scale-out gives each new slot to a random vertex.

On scale-in, `round-robin` and `least-link-load` keep the lowest-numbered nodes (a StatefulSet's order).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from elastream.core.metrics import Rates
from elastream.core.schedule import (
    Schedule,
    executor_order,
    fresh_node_names,
    key_group_ranges,
    node_index,
    round_robin,
)
from elastream.core.simulate import move_off_nodes, new_slot_count
from elastream.core.topology import Topology, executor_id


def target_node_list(schedule: Schedule, target_nodes: int) -> list[str]:
    """The node set after scaling when the strategy does not choose it: new names appended, or the
    highest-numbered nodes dropped."""
    nodes = sorted(schedule.nodes, key=lambda n: (node_index(n), n))
    if target_nodes >= len(nodes):
        return [*nodes, *fresh_node_names(nodes, target_nodes - len(nodes))]
    return nodes[:target_nodes]


def round_robin_plan(topology: Topology, schedule: Schedule, target_nodes: int) -> Schedule:
    executors = executor_order(topology, schedule.parallelism())
    return round_robin(executors, target_node_list(schedule, target_nodes), schedule.slots_per_node)


def link_traffic(topology: Topology, rates: Rates, parallelism: Mapping[str, int]) -> dict[tuple[str, str], float]:
    """Tuples/s on each (upstream executor, downstream executor) link implied by the groupings."""
    traffic: dict[tuple[str, str], float] = {}
    for stream in topology.streams:
        kp, kc = parallelism[stream.src], parallelism[stream.dst]
        per_sender = rates.emit[stream.src] / kp
        if stream.grouping == "shuffle":
            fractions = [1.0 / kc] * kc
        elif stream.grouping == "fields":
            max_par = max(topology.vertices[stream.dst].max_parallelism, kc)
            fractions = [len(r) / max_par for r in key_group_ranges(max_par, kc)]
        elif stream.grouping == "all":
            fractions = [1.0] * kc
        else:
            fractions = [1.0] + [0.0] * (kc - 1)
        for i in range(kp):
            for j in range(kc):
                if fractions[j] > 0:
                    traffic[(executor_id(stream.src, i), executor_id(stream.dst, j))] = per_sender * fractions[j]
    return traffic


def least_link_load_plan(topology: Topology, schedule: Schedule, rates: Rates, target_nodes: int) -> Schedule:
    nodes = target_node_list(schedule, target_nodes)
    parallelism = schedule.parallelism()
    executors = executor_order(topology, parallelism)
    cap = min(schedule.slots_per_node, -(-len(executors) // len(nodes)))
    load = dict.fromkeys(nodes, 0)
    placed: dict[str, str] = {}

    def least_loaded(room: int) -> str | None:
        options = [n for n in nodes if cap - load[n] >= room]
        return min(options, key=lambda n: (load[n], nodes.index(n))) if options else None

    def put(executor: str, node: str) -> None:
        placed[executor] = node
        load[node] += 1

    traffic = link_traffic(topology, rates, parallelism)
    neighbours: dict[str, dict[str, float]] = {e: {} for e in executors}
    for (a, b), rate in traffic.items():
        neighbours[a][b] = neighbours[a].get(b, 0.0) + rate
        neighbours[b][a] = neighbours[b].get(a, 0.0) + rate

    def best_home(executor: str) -> str:
        """The node with room holding the most traffic with `executor` (ties: least loaded, lowest)."""
        options = [n for n in nodes if load[n] < cap]
        local = {n: 0.0 for n in options}
        for other, rate in neighbours[executor].items():
            if placed.get(other) in local:
                local[placed[other]] += rate
        return max(options, key=lambda n: (local[n], -load[n], -nodes.index(n)))

    for (a, b), _ in sorted(traffic.items(), key=lambda item: (-item[1], item[0])):
        if a not in placed and b not in placed:
            node = least_loaded(2)
            if node is not None:
                put(a, node)
                put(b, node)
                continue
        for executor in (a, b):
            if executor not in placed:
                put(executor, best_home(executor))
    for executor in executors:
        if executor not in placed:
            node = least_loaded(1)
            assert node is not None
            put(executor, node)
    return Schedule(placed, tuple(nodes), schedule.slots_per_node)


def random_plan(
    topology: Topology, schedule: Schedule, target_nodes: int, seed: int
) -> tuple[Schedule, list[dict[str, Any]]]:
    rng = random.Random(seed)
    if target_nodes < len(schedule.nodes):
        removed = rng.sample(list(schedule.nodes), len(schedule.nodes) - target_nodes)
        receivers = [n for n in schedule.nodes if n not in removed]
        return move_off_nodes(schedule, removed, receivers), [{"removed": sorted(removed), "seed": seed}]
    added = target_nodes - len(schedule.nodes)
    new_nodes = fresh_node_names(schedule.nodes, added)
    parallelism = schedule.parallelism()
    assignment = dict(schedule.assignment)
    steps: list[dict[str, Any]] = []
    for slot in range(new_slot_count(schedule, added)):
        growable = [v for v in topology.order if parallelism[v] < topology.vertices[v].max_parallelism]
        if not growable:
            break
        vertex = rng.choice(growable)
        node = new_nodes[slot % added]
        assignment[executor_id(vertex, parallelism[vertex])] = node
        parallelism[vertex] += 1
        steps.append({"iteration": slot, "target": vertex, "node": node})
    return Schedule(assignment, (*schedule.nodes, *new_nodes), schedule.slots_per_node), steps
