"""The controller's scalings: the record of one (the resource's `status.lastScaling`), the event announcing
its plan, the autoscaler's evaluation that decides one, and the local event reporter.

`TopologyController.scale_to` (control.controller) fills a `ScalingRecord` step by step: the plan and the
numbers that justified it, the migration's report, the outcome; `to_status()` gives the status shape.
`autoscale` is the controller's evaluation once per period (the policy is `core.autoscaling.decision.recommend`).

An evaluation never takes the controller down: anything the analysis of the window or the policy raises
(a Redis error aside, which the tick notes as Redis away) is logged with the window in one line, counted
(`elastream_autoscaler_evaluation_errors`), and published as an evaluation that decided nothing, with the
error's one-line reason; the tick returns None and the topology keeps running. The scaling an evaluation
decides (`scale_to`) is not covered here: it has its own handling (a failed migration keeps the schedule).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import redis

from elastream.control.metrics import AUTOSCALER_EVALUATION_ERRORS
from elastream.control.topology_metrics import series
from elastream.core.autoscaling.decision import Recommendation, WindowInfo, recommend, undecided
from elastream.core.outcomes import Direction, Outcome
from elastream.core.planner import Plan
from elastream.core.status import EventReason

if TYPE_CHECKING:
    from elastream.control.controller import TopologyController
    from elastream.core.window_analysis import Analysis

log = logging.getLogger("elastream.control")

#: the longest error message an evaluation publishes in its reason (the log has it whole)
REASON_CHARS = 300


@dataclass
class ScalingRecord:
    direction: Direction
    from_nodes: int
    to_nodes: int
    strategy: str
    migration: str
    predicted_throughput: float | None
    throughput_before: float
    started_at: float
    finished_at: float | None = None
    outcome: Outcome = Outcome.PENDING
    reason: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    #: the migration report (`MigrationReport.to_status()`): phases, captured events, lost, replayed
    report: dict[str, Any] = field(default_factory=dict)
    #: which engine analysed the window the plan came from (spark | python)
    analysis_engine: str | None = None
    #: who asked: request (spec.nodes, `elastream scale`), autoscaler, spec (a vertex's parallelism)
    trigger: str = "request"

    def to_status(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        report = data["report"]
        return {
            "direction": data["direction"],
            "fromNodes": data["from_nodes"],
            "toNodes": data["to_nodes"],
            "strategy": data["strategy"],
            "migration": data["migration"],
            "predictedThroughput": data["predicted_throughput"],
            "throughputBefore": data["throughput_before"],
            "startedAt": data["started_at"],
            "finishedAt": data["finished_at"],
            "outcome": data["outcome"],
            "reason": data["reason"],
            "plan": data["plan"],
            "phases": report.get("phases", {}),
            "capturedEvents": report.get("capturedEvents"),
            "lost": report.get("lost"),
            "replayed": report.get("replayed"),
            "restoredFrom": report.get("restoredFrom"),
            "pauseMs": report.get("pauseMs"),
            "migrationScope": report.get("scope"),
            "pausedExecutors": report.get("pausedExecutors"),
            "executors": report.get("executors"),
            "analysisEngine": data["analysis_engine"],
            "trigger": data["trigger"],
            "prepareMs": report.get("prepareMs"),
            "catchUpMs": report.get("catchUpMs"),
            "stabilizationMs": report.get("stabilizationMs"),
        }


class PrintEvents:
    """An EventSink that prints one line per event (the local CLI's reporter)."""

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        print(f"{'WARNING ' if warning else ''}{reason}: {message}", flush=True)


def planned_message(plan: Plan, throughput: float) -> str:
    """The ScalingPlanned event's message: the move, its new executors and moves, the degrees it changes,
    the throughput now (`throughput`) and predicted."""
    predicted = "n/a" if plan.predicted_throughput is None else f"{plan.predicted_throughput:.0f}/s"
    changed = plan.parallelism_changes
    return (
        f"scale {plan.direction} {plan.from_nodes} -> {plan.to_nodes} nodes with {plan.strategy}: "
        f"{len(plan.new_executors)} new executors{_listed([e for e, _ in plan.new_executors])}, "
        f"{len(plan.moves)} moves, "
        + (f"parallelism {_listed([f'{v} {a}->{b}' for v, (a, b) in changed.items()])[2:-1]}, " if changed else "")
        + f"throughput {throughput:.0f}/s now, {predicted} predicted"
    )


def evaluation_failed(
    controller: TopologyController, now: float, exc: Exception, analysis: Analysis | None, nodes: int | None
) -> Recommendation:
    """An evaluation raised: log it with the window, count it, publish an evaluation that decided nothing
    with the error's one-line reason (and forget the scale-in votes, as an undecided window does)."""
    topology = controller.topology
    reason = one_line(exc)
    series(AUTOSCALER_EVALUATION_ERRORS, topology.namespace, topology.name, topology.scaling.auto.policy).inc()
    log.error(
        "autoscaler evaluation of %s raised, nothing decided; %s: %s",
        topology.name,
        window_line(analysis, topology.order),
        reason,
        exc_info=exc,
    )
    known = nodes if nodes is not None else topology.nodes
    recommendation = undecided(topology, known, now, f"the evaluation failed ({reason})")
    controller.autoscaler = replace(controller.autoscaler, scale_in_votes=0)
    controller.last_evaluation = recommendation
    controller.status.publish("autoscaler", recommendation.to_status())
    return recommendation


def one_line(exc: BaseException, limit: int = REASON_CHARS) -> str:
    """`Type: message` on one line, at most `limit` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def window_line(analysis: Analysis | None, order: Sequence[str]) -> str:
    """The analysed window in one line: its span, its samples, and per vertex its input, processing and
    true processing rates (tuples/s) and executors."""
    if analysis is None:
        return "window not analysed"
    vertices = analysis.snapshot.vertices
    rates = "; ".join(
        f"{v} in {_rate(m.input_rate)} proc {_rate(m.processing_rate)} cap {_rate(m.true_processing_rate)} "
        f"x{m.executors}"
        for v in order
        if (m := vertices.get(v)) is not None
    )
    return (
        f"window {analysis.window_start:.3f}..{analysis.window_end:.3f}, {analysis.samples_used} samples, "
        f"rates: {rates or 'none'}"
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _listed(items: list[str], limit: int = 6) -> str:
    if not items:
        return ""
    shown = ", ".join(items[:limit])
    return f" ({shown}{', ...' if len(items) > limit else ''})"


def autoscale(controller: TopologyController) -> ScalingRecord | None:
    """Once per evaluation period: analyse the window, let the spec's policy decide (`core.autoscaling.decision`),
    publish the evaluation as `autoscaler`, and carry out a scale-out/scale-in (unless `execute: false`,
    which only recommends). Returns the scaling's record when one ran."""
    now = controller.clock.now()
    period = controller.evaluation_period_s or 2 * controller.interval_s
    if controller.evaluated_at is not None and now - controller.evaluated_at < period:
        return None
    controller.evaluated_at = now
    window = controller.topology.scaling.window
    analysis: Analysis | None = None
    nodes: int | None = None
    try:
        analysis = controller.metrics.analyse(window)
        if analysis.samples_used == 0:
            return None
        schedule = controller.backend.current_schedule()
        nodes = len(schedule.nodes)
        span = WindowInfo(
            analysis.window_start,
            analysis.window_end,
            complete=analysis.window_end - analysis.window_start >= window * controller.interval_s - 1e-6,
        )
        recommendation, state = recommend(
            controller.topology,
            analysis.snapshot,
            span,
            schedule.parallelism(),
            nodes,
            controller.autoscaler,
            now,
            period_s=period,
            window_s=window * controller.interval_s,
        )
        published = recommendation.to_status()
    except redis.RedisError:
        raise  # Redis away: the tick notes it (a condition and one event) and the next one tries again
    except Exception as exc:  # a policy never takes the controller down
        evaluation_failed(controller, now, exc, analysis, nodes)
        return None
    controller.autoscaler = state
    controller.last_evaluation = recommendation
    controller.status.publish("autoscaler", published)
    if recommendation.action not in ("scale-out", "scale-in"):
        return None
    target = recommendation.target_nodes
    message = f"{recommendation.action} to {target} nodes: {recommendation.reason}"
    if not recommendation.execute:
        controller.events.emit(EventReason.AUTOSCALER_RECOMMENDS, f"{message} (execute: false, nothing changed)")
        return None
    controller.events.emit(EventReason.AUTOSCALER_DECIDED, message)
    # the plan reads the window just analysed: one analysis per evaluation, not two
    record = controller.scale_to(target, recommendation.parallelism, "autoscaler", analysis.snapshot)
    if (
        record.outcome == Outcome.SUCCEEDED
        and controller.on_nodes_changed is not None
        and record.to_nodes != record.from_nodes
    ):
        controller.on_nodes_changed(record.to_nodes)
    return record
