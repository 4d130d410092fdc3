"""Backend-agnostic scaling: collect metrics -> analyse -> plan -> apply, with every step reported.

`ScalingController.scale_to(n)` is what `kubectl patch ... nodes: n`, `elastream scale` and the autoscaler
all come down to. It reads a snapshot from the `MetricSource`, plans with the topology's strategy, reports
the plan, has the `Backend` apply the new schedule, and returns a `ScalingRecord` shaped like the
resource's `status.lastScaling`. The migration protocol (CCR) plugs in at the apply step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from elastream.core.planner import Plan, PlanningError, make_plan
from elastream.core.ports import Backend, Clock, EventSink, MetricSource, SystemClock
from elastream.core.topology import Topology


@dataclass
class ScalingRecord:
    direction: str
    from_nodes: int
    to_nodes: int
    strategy: str
    migration: str
    predicted_throughput: float | None
    throughput_before: float
    started_at: float
    finished_at: float | None = None
    outcome: str = "pending"  # succeeded | failed | unchanged
    reason: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    #: the migration report (`MigrationReport.to_status()`): phases, captured events, lost, replayed
    report: dict[str, Any] = field(default_factory=dict)

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
            "catchUpMs": report.get("catchUpMs"),
            "stabilizationMs": report.get("stabilizationMs"),
        }


class PrintEvents:
    """An EventSink that prints one line per event (the local CLI's reporter)."""

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        print(f"{'WARNING ' if warning else ''}{reason}: {message}", flush=True)


class ScalingController:
    def __init__(
        self,
        topology: Topology,
        backend: Backend,
        metrics: MetricSource,
        events: EventSink | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.topology = topology
        self.backend = backend
        self.metrics = metrics
        self.events = events or PrintEvents()
        self.clock = clock or SystemClock()

    def plan(self, nodes: int) -> tuple[Plan, float]:
        snapshot = self.metrics.snapshot(self.topology.scaling.window)
        throughput = sum(snapshot.vertices[s].processing_rate for s in self.topology.sinks)
        plan = make_plan(
            self.topology,
            self.backend.current_schedule(),
            snapshot,
            nodes,
            self.topology.scaling.strategy,
            self.topology.scaling.congestion_rate,
        )
        return plan, throughput

    def scale_to(self, nodes: int) -> ScalingRecord:
        started = self.clock.now()
        current = len(self.backend.current_schedule().nodes)
        scaling = self.topology.scaling
        record = ScalingRecord("none", current, nodes, scaling.strategy, scaling.migration, None, 0.0, started)
        try:
            plan, before = self.plan(nodes)
        except PlanningError as exc:
            record.outcome, record.reason, record.finished_at = "failed", str(exc), self.clock.now()
            self.events.emit("ScalingRejected", str(exc), warning=True)
            return record
        record.direction = plan.direction
        record.predicted_throughput = plan.predicted_throughput
        record.throughput_before = before
        record.plan = plan.to_dict()
        if plan.direction == "none":
            record.outcome, record.finished_at = "unchanged", self.clock.now()
            return record
        predicted = "n/a" if plan.predicted_throughput is None else f"{plan.predicted_throughput:.0f}/s"
        self.events.emit(
            "ScalingPlanned",
            f"scale {plan.direction} {plan.from_nodes} -> {plan.to_nodes} nodes with {plan.strategy}: "
            f"{len(plan.new_executors)} new executors{_listed([e for e, _ in plan.new_executors])}, "
            f"{len(plan.moves)} moves, "
            f"throughput {before:.0f}/s now, {predicted} predicted",
        )
        try:
            self.backend.apply(plan.new_schedule)
        except Exception as exc:  # any backend failure is reported, the topology keeps running
            record.outcome, record.reason, record.finished_at = "failed", str(exc), self.clock.now()
            record.report = dict(getattr(self.backend, "last_report", None) or {})
            self.events.emit("ScalingFailed", str(exc), warning=True)
            return record
        record.report = dict(getattr(self.backend, "last_report", None) or {})
        record.outcome, record.finished_at = "succeeded", self.clock.now()
        self.events.emit("Scaled", f"running on {plan.to_nodes} nodes ({record.finished_at - started:.1f} s)")
        return record


def _listed(items: list[str], limit: int = 6) -> str:
    if not items:
        return ""
    shown = ", ".join(items[:limit])
    return f" ({shown}{', ...' if len(items) > limit else ''})"
