"""Parallelism changes as schedules: lowering parallelism so executors fit fewer nodes, and resizing a
schedule to a parallelism vector.

`fit_parallelism` is what an on-demand scale-in does when the executors (after a Stela scale-out grew
them) no longer fit the nodes asked for: it removes executors one at a time from the vertex that costs
least throughput (lowest ETP; ties: the most executors above its need, then the latest in topological
order), never below 1 nor below the vertex's need (⌈input rate / true processing rate per executor⌉, what
the metrics show it must keep to keep up). Only when the need itself does not fit does it go below need,
and the step says so.

`resize` turns a parallelism vector into a schedule on given nodes: a vertex that shrinks loses its
highest-indexed executors (executor ids stay 0..k-1, so key groups and source lanes are re-dealt by the
same `key_group_ranges` the runtime uses), a vertex that grows gets executors on the node with the most
free slots (ties: node order), so new nodes fill first. Executors that stay never move.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from elastream.core.metrics import Rates
from elastream.core.planner.plan import PlanningError
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology, executor_id, split_executor_id


def executor_need(topology: Topology, rates: Rates) -> dict[str, int]:
    """Executors each vertex needs to keep up with its input: ⌈input / true rate per executor⌉ (≥ 1); 1
    where the true rate is unknown."""
    need: dict[str, int] = {}
    for v in topology.order:
        # the true processing rate is the vertex's (all its executors busy): one executor does 1/k of it
        total, executors = rates.capacity.get(v), rates.executors.get(v, 0)
        if total is None or total <= 0.0 or executors <= 0:
            need[v] = 1
            continue
        need[v] = max(1, math.ceil(round(rates.input[v] * executors / total, 9)))
    return need


def fit_parallelism(
    topology: Topology,
    parallelism: Mapping[str, int],
    etp: Mapping[str, float],
    need: Mapping[str, int],
    slots: int,
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Lower `parallelism` until its executors fit `slots`; returns it and one step per lowered vertex."""
    result = dict(parallelism)
    if len(topology.order) > slots:
        raise PlanningError(
            f"{len(topology.order)} vertices need one executor each but {slots} slots remain; "
            "ask for more nodes or raise spec.slotsPerNode"
        )
    position = topology.position
    below_need: set[str] = set()
    while sum(result.values()) > slots:
        above = [v for v in topology.order if result[v] > max(1, need[v])]
        if above:
            victim = min(above, key=lambda v: (etp[v], -(result[v] - need[v]), -position[v]))
        else:
            shrinkable = [v for v in topology.order if result[v] > 1]
            victim = min(shrinkable, key=lambda v: (etp[v], -result[v], -position[v]))
            below_need.add(victim)
        result[victim] -= 1
    steps: list[dict[str, Any]] = []
    for v in topology.order:
        if result[v] != parallelism[v]:
            step: dict[str, Any] = {
                "lowered": v,
                "from": parallelism[v],
                "to": result[v],
                "need": need[v],
                "etp": round(etp[v], 6),
                "reason": f"{sum(parallelism.values())} executors do not fit {slots} slots: lowest ETP first",
            }
            if v in below_need:
                step["warning"] = f"below the {need[v]} executors its input needs: expect it to congest"
            steps.append(step)
    return result, steps


def resize(schedule: Schedule, parallelism: Mapping[str, int], nodes: Sequence[str] | None = None) -> Schedule:
    """The schedule with `parallelism`, on `nodes` (default: the schedule's); executors kept stay put.
    Raises PlanningError when the executors do not fit or a kept executor's node is not in `nodes`."""
    node_list = tuple(nodes) if nodes is not None else schedule.nodes
    current = schedule.parallelism()
    assignment: dict[str, str] = {}
    for executor, node in schedule.assignment.items():
        vertex, index = split_executor_id(executor)
        if index < parallelism.get(vertex, 0):
            assignment[executor] = node
    missing = sorted({n for n in assignment.values() if n not in node_list})
    if missing:
        raise PlanningError(f"nodes {', '.join(missing)} still hold executors; move them off first")
    total = sum(parallelism.values())
    if total > len(node_list) * schedule.slots_per_node:
        raise PlanningError(
            f"{total} executors do not fit {len(node_list)} nodes × {schedule.slots_per_node} slots; "
            "ask for more nodes or lower a vertex's parallelism"
        )
    load = {n: 0 for n in node_list}
    for node in assignment.values():
        load[node] += 1
    for vertex, wanted in parallelism.items():
        for index in range(current.get(vertex, 0), wanted):
            node = min(node_list, key=lambda n: (load[n], node_list.index(n)))
            assignment[executor_id(vertex, index)] = node
            load[node] += 1
    return Schedule(assignment, node_list, schedule.slots_per_node)
