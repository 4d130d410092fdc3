"""The controller's scalings: the record of one (the resource's `status.lastScaling`), the event announcing
its plan, and the local event reporter.

`TopologyController.scale_to` (control.controller) fills a `ScalingRecord` step by step: the plan and the
numbers that justified it, the migration's report, the outcome; `to_status()` gives the status shape. The
autoscaler's evaluation that decides a scaling is `control.autoscaler`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from elastream.core.outcomes import Direction, Outcome
from elastream.core.planner import Plan


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
            # what catch-up and stabilization are measured against (before | newLevel) and the two levels
            # (`control.catch_up.recovery_fields`)
            "catchUpReference": report.get("catchUpReference"),
            "outputBefore": report.get("outputBefore"),
            "outputAfter": report.get("outputAfter"),
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


def _listed(items: list[str], limit: int = 6) -> str:
    if not items:
        return ""
    shown = ", ".join(items[:limit])
    return f" ({shown}{', ...' if len(items) > limit else ''})"
