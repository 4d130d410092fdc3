"""Planners: from a topology, its current schedule and a metric snapshot to a new schedule for N nodes.

`make_plan` is the one entry point; `strategy` picks Stela (`stela`) or a baseline (`round-robin`,
`least-link-load`, `random`). Every plan carries the fluid simulator's predicted throughput of its new
schedule and the steps that justified it.
"""

from __future__ import annotations

from elastream.core.metrics import MetricSnapshot, rates_from_snapshot
from elastream.core.planner.baselines import least_link_load_plan, random_plan, round_robin_plan
from elastream.core.planner.etp import DEFAULT_CONGESTION_RATE, EtpTable, etp_table
from elastream.core.planner.plan import Direction, Plan, PlanningError
from elastream.core.planner.stela import stela_scale_in, stela_scale_out
from elastream.core.schedule import Schedule
from elastream.core.simulate import SimulationModel, simulate
from elastream.core.topology import STRATEGIES, Topology

__all__ = ["STRATEGIES", "EtpTable", "Plan", "PlanningError", "etp_table", "make_plan"]


def make_plan(
    topology: Topology,
    schedule: Schedule,
    snapshot: MetricSnapshot,
    target_nodes: int,
    strategy: str = "stela",
    congestion_rate: float = DEFAULT_CONGESTION_RATE,
    seed: int = 0,
    model: SimulationModel | None = None,
) -> Plan:
    """Plan the change from `schedule` to `target_nodes` nodes. Raises `PlanningError` with the fix."""
    if strategy not in STRATEGIES:
        raise PlanningError(f"strategy {strategy!r} is unknown; use one of: {', '.join(STRATEGIES)}")
    if target_nodes < 1:
        raise PlanningError(f"nodes: {target_nodes} is below 1; ask for at least 1 node")
    current = len(schedule.nodes)
    direction: Direction = "out" if target_nodes > current else "in" if target_nodes < current else "none"
    total = len(schedule)
    if target_nodes * schedule.slots_per_node < total:
        need = -(-total // target_nodes)
        raise PlanningError(
            f"{total} executors do not fit {target_nodes} nodes × {schedule.slots_per_node} slots; "
            f"raise spec.slotsPerNode to {need} or ask for more nodes"
        )
    rates = rates_from_snapshot(topology, snapshot)
    steps: list[dict[str, object]] = []
    if direction == "none":
        new_schedule = schedule
    elif strategy == "round-robin":
        new_schedule = round_robin_plan(topology, schedule, target_nodes)
    elif strategy == "least-link-load":
        new_schedule = least_link_load_plan(topology, schedule, rates, target_nodes)
    elif strategy == "random":
        new_schedule, steps = random_plan(topology, schedule, target_nodes, seed)
    elif direction == "out":
        measured = frozenset(v for v in topology.sources if snapshot.vertices[v].input_rate is not None)
        new_schedule, steps = stela_scale_out(topology, schedule, rates, target_nodes, congestion_rate, measured)
    else:
        new_schedule, steps = stela_scale_in(topology, schedule, rates, target_nodes, congestion_rate)
    model = model or SimulationModel.from_topology(topology, snapshot)
    try:
        predicted: float | None = simulate(topology, new_schedule, model).throughput
    except ValueError:
        predicted = None  # an unbounded source: no prediction, the plan itself stands
    return Plan(strategy, direction, schedule, new_schedule, predicted, steps)
