"""Planners: from a topology, its current schedule and a metric snapshot to a new schedule for N nodes.

`make_plan` is the one entry point; `strategy` picks Stela (`stela`), Stela+ (`stela-plus`: Stela's plan
improved by a bounded local search on the fluid model, `stela_plus`) or a baseline (`round-robin`,
`least-link-load`, `random`). Every plan carries the fluid simulator's predicted throughput of its new
schedule and the steps that justified it. Stela+ searches with the model the prediction uses (`model`, by
default calibrated from the snapshot), so its prediction is never below Stela's; with `parallelism` given,
every strategy resizes as Stela does (no search).
"""

from __future__ import annotations

from collections.abc import Mapping

from elastream.core.metrics import MetricSnapshot, Rates, rates_from_snapshot
from elastream.core.planner.baselines import least_link_load_plan, random_plan, round_robin_plan
from elastream.core.planner.etp import DEFAULT_CONGESTION_RATE, EtpTable, congested_vertices, etp_map, etp_table
from elastream.core.planner.parallelism import executor_need, fit_parallelism, resize
from elastream.core.planner.plan import Direction, Plan, PlanningError
from elastream.core.planner.stela import stela_scale_in, stela_scale_out
from elastream.core.planner.stela_plus import stela_plus_scale_in, stela_plus_scale_out
from elastream.core.schedule import Schedule, fresh_node_names
from elastream.core.simulate import SimulationModel, simulate
from elastream.core.topology import STRATEGIES, Topology

__all__ = ["STRATEGIES", "EtpTable", "Plan", "PlanningError", "etp_table", "make_plan", "plan_request"]


def make_plan(
    topology: Topology,
    schedule: Schedule,
    snapshot: MetricSnapshot,
    target_nodes: int,
    strategy: str = "stela",
    congestion_rate: float = DEFAULT_CONGESTION_RATE,
    seed: int = 0,
    model: SimulationModel | None = None,
    parallelism: Mapping[str, int] | None = None,
) -> Plan:
    """Plan the change from `schedule` to `target_nodes` nodes. Raises `PlanningError` with the fix.

    With `parallelism` (an autoscaler's or the spec's vertex degrees) the plan resizes the vertices to it
    and moves to `target_nodes` (Stela's ETPSum picks the nodes to remove, growth lands on the emptiest
    nodes); without it the strategy decides. A scale-in whose executors do not fit the nodes asked for
    first lowers the parallelism of the vertices that cost least throughput (`fit_parallelism`), and the
    plan's steps say which."""
    if strategy not in STRATEGIES:
        raise PlanningError(f"strategy {strategy!r} is unknown; use one of: {', '.join(STRATEGIES)}")
    if target_nodes < 1:
        raise PlanningError(f"nodes: {target_nodes} is below 1; ask for at least 1 node")
    current = len(schedule.nodes)
    rates = rates_from_snapshot(topology, snapshot)
    model = model or SimulationModel.from_topology(topology, snapshot)
    steps: list[dict[str, object]] = []
    if parallelism is not None:
        unknown = sorted(set(parallelism) - set(topology.vertices))
        if unknown:
            raise PlanningError(f"parallelism: {', '.join(unknown)} not in topology {topology.name}; remove them")
        for v, k in parallelism.items():
            if not 1 <= k <= topology.vertices[v].max_parallelism:
                raise PlanningError(
                    f"parallelism of {v}: {k} is outside [1, {topology.vertices[v].max_parallelism}] (maxParallelism)"
                )
        wanted = {**schedule.parallelism(), **parallelism}
        new_schedule, steps = _resize_to(topology, schedule, rates, wanted, target_nodes, congestion_rate)
    else:
        new_schedule, steps = _strategy_plan(
            topology, schedule, snapshot, rates, target_nodes, strategy, congestion_rate, seed, model
        )
    if new_schedule == schedule:
        direction = Direction.NONE
    elif target_nodes != current:
        direction = Direction.OUT if target_nodes > current else Direction.IN
    else:
        direction = Direction.OUT if len(new_schedule) > len(schedule) else Direction.IN
    try:
        predicted: float | None = simulate(topology, new_schedule, model).throughput
    except ValueError:
        predicted = None  # an unbounded source: no prediction, the plan itself stands
    return Plan(strategy, direction, schedule, new_schedule, predicted, steps)


def plan_request(
    topology: Topology,
    schedule: Schedule,
    snapshot: MetricSnapshot,
    nodes: int,
    parallelism: Mapping[str, int] | None = None,
    *,
    strategy: str | None = None,
    congestion_rate: float | None = None,
    seed: int = 0,
) -> tuple[Plan, float]:
    """The plan a scale request to `nodes` makes from the analysed window `snapshot` (the spec's strategy and
    congestion rate unless given), and the sinks' throughput in that window: what the controller carries out
    and what `elastream plan --live` shows, one call for both."""
    plan = make_plan(
        topology,
        schedule,
        snapshot,
        nodes,
        strategy or topology.scaling.strategy,
        topology.scaling.congestion_rate if congestion_rate is None else congestion_rate,
        seed=seed,
        parallelism=parallelism,
    )
    return plan, sum(snapshot.vertices[s].processing_rate for s in topology.sinks)


def _strategy_plan(
    topology: Topology,
    schedule: Schedule,
    snapshot: MetricSnapshot,
    rates: Rates,
    target_nodes: int,
    strategy: str,
    congestion_rate: float,
    seed: int,
    model: SimulationModel,
) -> tuple[Schedule, list[dict[str, object]]]:
    current = len(schedule.nodes)
    steps: list[dict[str, object]] = []
    if target_nodes == current:
        return schedule, steps
    if target_nodes < current and target_nodes * schedule.slots_per_node < len(schedule):
        fitted, steps = _fit(topology, schedule, rates, target_nodes, congestion_rate)
        schedule = resize(schedule, fitted)
    if strategy == "round-robin":
        return round_robin_plan(topology, schedule, target_nodes), steps
    if strategy == "least-link-load":
        return least_link_load_plan(topology, schedule, rates, target_nodes), steps
    if strategy == "random":
        new_schedule, random_steps = random_plan(topology, schedule, target_nodes, seed)
        return new_schedule, steps + list(random_steps)
    plus = strategy == "stela-plus"
    if target_nodes > current:
        measured = frozenset(v for v in topology.sources if snapshot.vertices[v].input_rate is not None)
        if plus:
            new_schedule, out_steps = stela_plus_scale_out(
                topology, schedule, rates, target_nodes, congestion_rate, model, measured
            )
        else:
            new_schedule, out_steps = stela_scale_out(
                topology, schedule, rates, target_nodes, congestion_rate, measured
            )
        return new_schedule, steps + out_steps
    if plus:
        new_schedule, in_steps = stela_plus_scale_in(topology, schedule, rates, target_nodes, congestion_rate, model)
    else:
        new_schedule, in_steps = stela_scale_in(topology, schedule, rates, target_nodes, congestion_rate)
    return new_schedule, steps + in_steps


def _fit(
    topology: Topology, schedule: Schedule, rates: Rates, target_nodes: int, congestion_rate: float
) -> tuple[dict[str, int], list[dict[str, object]]]:
    congested = congested_vertices(topology, rates.input, rates.processing, congestion_rate, rates.capacity)
    etp = etp_map(topology, rates.processing, congested)
    fitted, steps = fit_parallelism(
        topology, schedule.parallelism(), etp, executor_need(topology, rates), target_nodes * schedule.slots_per_node
    )
    return fitted, list(steps)


def _resize_to(
    topology: Topology,
    schedule: Schedule,
    rates: Rates,
    parallelism: Mapping[str, int],
    target_nodes: int,
    congestion_rate: float,
) -> tuple[Schedule, list[dict[str, object]]]:
    """Shrink vertices, change the node count (ETPSum removes, fresh names add), then grow vertices."""
    steps: list[dict[str, object]] = []
    current = schedule.parallelism()
    shrunk = resize(schedule, {v: min(k, parallelism[v]) for v, k in current.items()})
    if target_nodes < len(shrunk.nodes):
        if sum(parallelism.values()) > target_nodes * schedule.slots_per_node:
            raise PlanningError(
                f"{sum(parallelism.values())} executors do not fit {target_nodes} nodes × "
                f"{schedule.slots_per_node} slots; ask for more nodes or lower a vertex's parallelism"
            )
        shrunk, steps = stela_scale_in(topology, shrunk, rates, target_nodes, congestion_rate)
    nodes = list(shrunk.nodes)
    if target_nodes > len(nodes):
        nodes += fresh_node_names(nodes, target_nodes - len(nodes))
    new_schedule = resize(shrunk, parallelism, nodes)
    changes = {v: [current[v], parallelism[v]] for v in topology.order if current[v] != parallelism[v]}
    if changes:
        steps.append({"parallelism": changes, "reason": "requested degrees"})
    return new_schedule, steps
