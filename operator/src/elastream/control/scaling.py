"""The record of one scaling (the resource's `status.lastScaling`) and the local event reporter.

`TopologyController.scale_to` (control.controller) fills a `ScalingRecord` step by step: the plan and the
numbers that justified it, the migration's report, the outcome; `to_status()` gives the status shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from elastream.core.outcomes import Direction, Outcome


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
