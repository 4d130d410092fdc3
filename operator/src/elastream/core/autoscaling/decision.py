"""The autoscaler's decision: a policy's verdict on one window, made safe, as a pure function of its inputs.

`recommend` runs the spec's policy (`autoscale_policy` for AUTOSCALE, `rules_policy` for ARiSto's rules) on
the analysed window and turns its verdict into a target (nodes, and parallelism per vertex where the
policy chose degrees), within the spec's bounds, or holds. What makes it safe, in the order it is checked:

1. **Stabilization**: no decision within `stabilizationSeconds` after a change finished (ARiSto's warm-up).
2. **No decision from a window that overlaps a rescale, no scale-in from one that overlaps its catch-up**:
   the window must be complete and start after the last change finished; a scale-in's must also start
   after the change settled (the controller marks it settled once catch-up and stabilization were
   measured, or their measurement timed out): Flink's most reported autoscaler problem is scaling down on
   the low rates of a catch-up. A scale-out is not held for the catch-up: a change too small to catch up
   never settles, and holding the next scale-out until the measurement times out (60 s) lets the queues
   grow for a minute (bench/autoscale.py measured 45 % of the events late on the 5-step stream).
3. **Cool-down against flapping**: a scale-in right after a scale-out waits twice the stabilization
   interval, and a scale-in must be recommended by `SCALE_IN_VOTES` evaluations in a row (a noisy input
   dipping once does not remove a node). Scale-outs act at once: congestion costs more than a spare node.
4. **Bounds**: nodes within [minNodes, maxNodes]; each vertex within [1, maxParallelism]. When the degrees
   a policy wants need more than maxNodes' slots, the smallest increases are dropped first.

Before any of that, a window no policy can decide on (`core.autoscaling.window_check.undecidable`: NaN,
infinite or negative rates, an empty window, no nodes, a vertex with no executors or no rates) decides
nothing: action "none", the current node count as target, and the reason "<why>: nothing decided". It is
not remembered for eq. 5's capacity trend, and it breaks a run of scale-in votes. `recommend` never
raises on the numbers of a window; the controller still catches anything that escapes
(`control.autoscaler.Autoscaler`), so an evaluation can never take it down.

The clock is an argument (`now`), the state (`AutoscalerState`) is returned anew, so tests drive it cell
by cell without processes or sleeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from elastream.core.autoscaling.autoscale_policy import AutoscaleSettings, Combine, evaluate
from elastream.core.autoscaling.rules_policy import RuleThresholds, evaluate_rules
from elastream.core.autoscaling.window_check import undecidable
from elastream.core.metrics import MetricSnapshot
from elastream.core.topology import AutoScalingSpec, Topology

Action = Literal["scale-out", "scale-in", "none", "hold"]

#: evaluations in a row that must recommend a scale-in before it happens
SCALE_IN_VOTES = 3
#: per-executor capacity points kept per vertex for eq. 5's ε
CAPACITY_HISTORY = 10


@dataclass(frozen=True)
class AutoscalerState:
    """What the autoscaler remembers between evaluations."""

    #: when the last change (any rescale, automatic or not) finished
    changed_at: float | None = None
    #: the direction of that change ("out" | "in")
    changed_direction: str | None = None
    #: when that change settled (catch-up measured); None while it is catching up
    settled_at: float | None = 0.0
    scale_in_votes: int = 0
    #: vertex -> [(time, per-executor capacity rate)] for eq. 5
    capacity_history: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    def changed(self, at: float, direction: str) -> AutoscalerState:
        """A rescale finished at `at`: the window and stabilization rules start again from it."""
        return replace(self, changed_at=at, changed_direction=direction, settled_at=None, scale_in_votes=0)

    def settled(self, at: float) -> AutoscalerState:
        return replace(self, settled_at=at)


@dataclass(frozen=True)
class WindowInfo:
    """The analysed window's span, and whether it holds as many intervals as the spec asks."""

    start: float
    end: float
    complete: bool


@dataclass(frozen=True)
class Recommendation:
    """One evaluation (the shape of `status.autoscaler`)."""

    at: float
    policy: str
    action: Action
    nodes: int
    target_nodes: int
    #: the new degree per vertex where the policy chose them (None: the planner's strategy fills new slots)
    parallelism: Mapping[str, int] | None
    reason: str
    vertices: Mapping[str, Mapping[str, Any]]
    next_allowed_at: float | None
    execute: bool

    def to_status(self) -> dict[str, Any]:
        return {
            "evaluatedAt": self.at,
            "policy": self.policy,
            "decision": self.action,
            "nodes": self.nodes,
            "targetNodes": self.target_nodes,
            "parallelism": None if self.parallelism is None else dict(self.parallelism),
            "reason": self.reason,
            "vertices": {v: dict(d) for v, d in self.vertices.items()},
            "nextChangeAllowedAt": self.next_allowed_at,
            "execute": self.execute,
        }


def recommend(
    topology: Topology,
    snapshot: MetricSnapshot,
    window: WindowInfo,
    parallelism: Mapping[str, int],
    nodes: int,
    state: AutoscalerState,
    now: float,
    period_s: float,
    window_s: float,
) -> tuple[Recommendation, AutoscalerState]:
    """Evaluate the spec's policy on `snapshot` and decide, or hold; returns the new state too."""
    spec = topology.scaling.auto
    why = undecidable(topology, snapshot, window.start, window.end, parallelism, nodes, window_s, period_s)
    if why is not None:
        return undecided(topology, nodes, now, why), replace(state, scale_in_votes=0)
    state = _remember_capacity(topology, snapshot, state, now)
    if spec.policy == "rules":
        target_nodes, degrees, reason, vertices = _rules(topology, snapshot, parallelism, nodes, spec)
    else:
        target_nodes, degrees, reason, vertices = _autoscale(
            topology, snapshot, parallelism, nodes, spec, state, period_s, window_s
        )
    bounded = max(spec.min_nodes, min(spec.max_nodes, target_nodes))
    if bounded != target_nodes:
        reason += f"; bounded to {bounded} nodes by [minNodes {spec.min_nodes}, maxNodes {spec.max_nodes}]"
    target_nodes = bounded
    if degrees is not None:
        degrees = _fit_degrees(topology, parallelism, degrees, target_nodes * topology.slots_per_node)
        if degrees == dict(parallelism):
            degrees = None if target_nodes == nodes else degrees
    action = _action(parallelism, nodes, target_nodes, degrees)

    def verdict(act: Action, why: str, allowed: float | None = None) -> Recommendation:
        return Recommendation(now, spec.policy, act, nodes, target_nodes, degrees, why, vertices, allowed, spec.execute)

    if action == "none":
        return verdict("none", reason), replace(state, scale_in_votes=0)
    allowed = _next_allowed(spec, state, action)
    if allowed is not None and now < allowed:
        return verdict("hold", f"{action} wanted ({reason}), but stabilizing after the last change", allowed), state
    if not window.complete or (state.changed_at is not None and window.start < state.changed_at):
        return (
            verdict("hold", f"{action} wanted ({reason}), but the metric window overlaps the last rescale", allowed),
            state,
        )
    if action == "scale-in" and state.settled_at is None:
        return verdict("hold", f"scale-in wanted ({reason}), but the last change is still catching up"), state
    if action == "scale-in" and state.settled_at is not None and window.start < state.settled_at:
        return verdict("hold", f"scale-in wanted ({reason}), but the metric window overlaps the catch-up"), state
    if action == "scale-in":
        votes = state.scale_in_votes + 1
        state = replace(state, scale_in_votes=votes)
        if votes < SCALE_IN_VOTES:
            return verdict("hold", f"scale-in wanted ({reason}): {votes} of {SCALE_IN_VOTES} evaluations"), state
    else:
        state = replace(state, scale_in_votes=0)
    return verdict(action, reason), state


def undecided(topology: Topology, nodes: int, now: float, why: str) -> Recommendation:
    """An evaluation that decided nothing, and why (`why`, one line): action "none", the nodes kept."""
    spec = topology.scaling.auto
    return Recommendation(
        now, spec.policy, "none", nodes, nodes, None, f"{why}: nothing decided", {}, None, spec.execute
    )


def _next_allowed(spec: AutoScalingSpec, state: AutoscalerState, action: Action) -> float | None:
    if state.changed_at is None:
        return None
    wait = spec.stabilization_s
    if action == "scale-in" and state.changed_direction == "out":
        wait *= 2.0  # a scale-in right after a scale-out: the flapping pair
    return state.changed_at + wait


def _action(parallelism: Mapping[str, int], nodes: int, target_nodes: int, degrees: Mapping[str, int] | None) -> Action:
    if target_nodes > nodes:
        return "scale-out"
    if target_nodes < nodes:
        return "scale-in"
    if degrees is None:
        return "none"
    before, after = sum(parallelism.values()), sum(degrees.values())
    if any(degrees[v] > parallelism[v] for v in degrees):
        return "scale-out"  # any growth: act now (a mix of growth and shrink is decided as a scale-out)
    return "scale-in" if after < before else "none"


def _fit_degrees(
    topology: Topology, current: Mapping[str, int], wanted: Mapping[str, int], slots: int
) -> dict[str, int]:
    """Drop the smallest increases first until the degrees fit `slots` (never below the current degree
    for a vertex that was to grow)."""
    result = dict(wanted)
    while sum(result.values()) > slots:
        growing = [v for v in topology.order if result[v] > current[v]]
        if not growing:
            break
        smallest = min(growing, key=lambda v: (result[v] - current[v], -topology.position[v]))
        result[smallest] -= 1
    return result


def _autoscale(
    topology: Topology,
    snapshot: MetricSnapshot,
    parallelism: Mapping[str, int],
    nodes: int,
    spec: AutoScalingSpec,
    state: AutoscalerState,
    period_s: float,
    window_s: float,
) -> tuple[int, dict[str, int] | None, str, dict[str, dict[str, Any]]]:
    combine: Combine = "min" if spec.combine == "min" else "max"
    settings = AutoscaleSettings(
        spec.theta_min, spec.theta_max, combine, period_s, rising_horizon_s=max(period_s, spec.stabilization_s)
    )
    evaluation = evaluate(topology, snapshot, parallelism, window_s, settings, state.capacity_history)
    degrees = evaluation.parallelism
    executors = sum(degrees.values())
    needed = max(1, math.ceil(executors / topology.slots_per_node))
    changes = evaluation.changes
    if changes:
        listed = ", ".join(f"{v} {a}->{b}" for v, (a, b) in changes.items())
        reason = f"AUTOSCALE: {listed}; {executors} executors need {needed} nodes"
    else:
        reason = f"AUTOSCALE: every vertex within [θmin {spec.theta_min:g}, θmax {spec.theta_max:g}] or steady"
    unknown = [e.reason for e in evaluation.vertices.values() if e.reason.endswith("nothing decided")]
    if unknown:
        reason += "; " + "; ".join(unknown)
    # nodes follow the executors: more when slots run out, fewer when whole nodes are spare, but not while a
    # vertex grows (a scale-out is urgent, a scale-in waits for its votes: they are not decided together)
    growing = any(degrees[v] > parallelism[v] for v in degrees)
    target = max(needed, nodes) if growing else needed
    vertices = {v: e.to_status() for v, e in evaluation.vertices.items()}
    return target, dict(degrees), reason, vertices


def _rules(
    topology: Topology,
    snapshot: MetricSnapshot,
    parallelism: Mapping[str, int],
    nodes: int,
    spec: AutoScalingSpec,
) -> tuple[int, dict[str, int] | None, str, dict[str, dict[str, Any]]]:
    thresholds = RuleThresholds(
        spec.capacity_threshold, spec.executors_per_node, spec.high_threshold, spec.low_threshold
    )
    verdict = evaluate_rules(topology, snapshot, parallelism, nodes, thresholds)
    vertices = {
        v: {
            "parallelism": parallelism[v],
            "target": verdict.parallelism[v],
            "busy": _finite(verdict.busy[v]),
            "decision": _direction(parallelism[v], verdict.parallelism[v]),
        }
        for v in topology.order
    }
    reason = f"rules: {verdict.rule}"
    degrees = dict(verdict.parallelism) if dict(verdict.parallelism) != dict(parallelism) else None
    return nodes + verdict.node_delta, degrees, reason, vertices


def _finite(value: float, digits: int = 4) -> float | None:
    """A number for the status: rounded, None where JSON has none (NaN, infinity)."""
    return round(value, digits) if math.isfinite(value) else None


def _direction(before: int, after: int) -> str:
    return "scale-out" if after > before else "scale-in" if after < before else "nothing"


def _remember_capacity(
    topology: Topology, snapshot: MetricSnapshot, state: AutoscalerState, now: float
) -> AutoscalerState:
    history = dict(state.capacity_history)
    for v in topology.order:
        rate = snapshot.vertices[v].executor_rate
        if rate is None or not math.isfinite(rate) or rate <= 0.0:
            continue  # unmeasured, or no number: eq. 5's trend must not learn from it
        point = (now, rate)
        history[v] = (*history.get(v, ())[-(CAPACITY_HISTORY - 1) :], point)
    return replace(state, capacity_history=history)
