"""Graceful drains, the controller's side: a worker told to stop (SIGTERM) asked for its node to be drained
(`store.drain_requests`); each tick, before dead workers are recovered, the oldest pending request is carried out.

A drain is a migration with the topology's protocol (CCR by default: nothing replayed) to the schedule
`core.drain_plan.drain_schedule` plans, without a metric analysis (it must fit in the worker's grace period):
the node's executors go to the remaining nodes, or to one fresh node when their slots cannot hold them (the
migration starts it before anything pauses). The drained worker leaves the schedule at the switch after
COMMIT and exits by itself, so its going is no loss: no recovery, nothing replayed. When the executors went
to the remaining nodes, a second migration (`refill_schedule`) starts a fresh node and moves executors back
onto it, so the topology has its node count again with the same degrees (after the last of several drains
waiting at once: the others' workers have only their grace period); if that one fails, the topology
runs one node short until the next scaling (on Kubernetes, the reconcile loop's convergence to spec.nodes).

Two workers told to stop at once (a PodDisruptionBudget keeps evictions to one, a `kubectl delete` does not)
are drained one after the other, and the first drain moves nothing onto the second's node.

A request for a node that is not in the schedule (already drained, removed by a scale-in), whose worker is
already dead, or past its deadline is dropped: a dead or departed worker is the recovery's (rollback to the
last checkpoint), as without drains. A drain that fails leaves its request, tried again on the next tick
while the worker's deadline allows. Each drain is recorded as `lastDrain` and said in a Drained or
DrainFailed event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis

from elastream.core.drain_plan import DrainPlan, drain_schedule, refill_schedule
from elastream.core.migration_protocol import MigrationReport
from elastream.core.outcomes import Outcome
from elastream.core.ports import BackendError, DrainRequest
from elastream.core.schedule import Schedule
from elastream.core.status import EventReason

if TYPE_CHECKING:
    from elastream.control.controller import TopologyController

log = logging.getLogger("elastream.control")


def take_drain(controller: TopologyController) -> dict[str, Any] | None:
    """Carry out the oldest pending drain request (one per tick), dropping the ones that cannot or need not
    be drained; returns the drain's record (also published as `lastDrain`), None when none ran."""
    requests = controller.drains
    if requests is None:
        return None
    pending = requests.pending()
    if not pending:
        # a refill deferred for a drain that never ran (its worker died): the next scaling sets the count
        controller.drain_target = None
        return None
    schedule = controller.backend.current_schedule()
    failed = controller.backend.failed_nodes()
    now = controller.clock.now()
    for request in sorted(pending.values(), key=lambda r: (r.requested_at, r.node)):
        node = request.node
        if node not in schedule.nodes:
            requests.done(node)  # drained already, or removed by a scaling meanwhile: nothing to move
        elif node in failed:
            requests.done(node)
            controller.events.emit(
                EventReason.DRAIN_FAILED,
                f"node {node}: its worker died before its drain; the recovery rolls back to the last checkpoint",
                warning=True,
            )
        elif now >= request.deadline:
            requests.done(node)
            controller.events.emit(
                EventReason.DRAIN_FAILED,
                f"node {node}: its drain request came too late (past its worker's deadline); when the worker "
                "exits, the recovery rolls back to the last checkpoint",
                warning=True,
            )
        else:
            # the others waiting for their drain receive nothing: their executors would only move twice
            others = frozenset(n for n in pending if n != node and n in schedule.nodes)
            return drain(controller, request, schedule, others)
    return None


def drain(
    controller: TopologyController, request: DrainRequest, schedule: Schedule, avoid: frozenset[str] = frozenset()
) -> dict[str, Any]:
    node = request.node
    started = controller.clock.now()
    plan = drain_schedule(schedule, node, avoid)
    record: dict[str, Any] = {
        "node": node,
        "requestedAt": request.requested_at,
        "startedAt": started,
        "moves": plan.moves(schedule),
    }
    if plan.replacement is not None:
        record["replacement"] = plan.replacement
    report, reason = _migrate(controller, plan.schedule)
    record["finishedAt"] = controller.clock.now()
    if report is not None:
        record.update(_summary(report))
    if report is None or report.outcome != Outcome.SUCCEEDED:
        record["outcome"] = Outcome.FAILED
        record["reason"] = reason or (report.reason if report is not None else "") or "migration failed"
        left = request.deadline - controller.clock.now()
        controller.events.emit(
            EventReason.DRAIN_FAILED,
            f"node {node}: {record['reason']}; "
            + (f"tried again while its worker waits ({left:.0f} s left)" if left > 0 else "its worker exits now")
            + ", else the recovery rolls back to the last checkpoint",
            warning=True,
        )
        _publish(controller, record)
        return record
    controller.drains.done(node)  # type: ignore[union-attr]
    _settled(controller, plan.schedule)
    record["outcome"] = Outcome.SUCCEEDED
    onto = plan.replacement or ", ".join(sorted({m["to"] for m in record["moves"]}))
    pause = report.pause_ms
    controller.events.emit(
        EventReason.DRAINED,
        f"node {node} drained by {report.protocol}: {len(record['moves'])} executors moved to {onto}, "
        f"{record['replayed']} events replayed"
        + (f", sources paused {pause:.0f} ms" if pause is not None else "")
        + "; its worker exits",
    )
    _publish(controller, record)
    if plan.replacement is None:
        if controller.drain_target is None:
            controller.drain_target = len(schedule.nodes)
        if avoid:  # more workers wait for their drain (within their grace period): the refill comes after
            record["refill"] = {"outcome": "deferred", "reason": f"{', '.join(sorted(avoid))} drained first"}
        else:
            record["refill"] = _refill(controller, plan, controller.drain_target)
            controller.drain_target = None
        _publish(controller, record)
    return record


def _refill(controller: TopologyController, plan: DrainPlan, nodes: int) -> dict[str, Any]:
    """Bring the node count back: fresh nodes take executors from the fullest nodes (degrees unchanged)."""
    current = controller.backend.current_schedule()
    target = refill_schedule(current, nodes)
    added = [n for n in target.nodes if n not in current.nodes]
    moves = [{"executor": e, "from": n, "to": target.assignment[e]} for e, n in current if target.assignment[e] != n]
    report, reason = _migrate(controller, target)
    refill: dict[str, Any] = {"nodes": added, "moves": moves}
    if report is not None:
        refill.update(_summary(report))
    if report is None or report.outcome != Outcome.SUCCEEDED:
        refill.update(outcome=Outcome.FAILED, reason=reason or (report.reason if report is not None else ""))
        controller.events.emit(
            EventReason.DRAIN_FAILED,
            f"node {plan.node} was drained, but starting {', '.join(added)} in its place failed: {refill['reason']}; "
            f"the topology runs on {len(current.nodes)} nodes until the next scaling",
            warning=True,
        )
        return refill
    _settled(controller, target)
    refill["outcome"] = Outcome.SUCCEEDED
    controller.events.emit(
        EventReason.DRAINED,
        f"{', '.join(added)} started in place of {plan.node}: {len(moves)} executors moved onto it, "
        f"{refill['replayed']} events replayed; {len(target.nodes)} nodes again",
    )
    return refill


def _migrate(controller: TopologyController, target: Schedule) -> tuple[MigrationReport | None, str]:
    try:
        return controller.migrator.migrate(target), ""
    except redis.RedisError as exc:
        controller.note_store(f"{type(exc).__name__}: {exc}")
        return None, f"Redis: {exc}"
    except BackendError as exc:
        return None, str(exc)


def _summary(report: MigrationReport) -> dict[str, Any]:
    """The migration's numbers for `lastDrain`. `replayed` there means what a recovery's means: events the
    sources emit a second time (from a checkpoint: `restart` only). CCR's own count of that name is the
    captured in-flight events its new executors process at INIT, which were never processed before: those
    are `capturedDelivered`, beside `capturedEvents`."""
    status = report.to_status()
    keep = ("migration", "pauseMs", "prepareMs", "capturedEvents", "lost", "phases")
    summary = {"migrationId": report.migration_id} | {k: status[k] for k in keep if status.get(k) is not None}
    if report.protocol == "restart":
        summary["replayed"] = report.replayed
    else:
        summary.update(replayed=0, capturedDelivered=report.replayed)
    return summary


def _settled(controller: TopologyController, schedule: Schedule) -> None:
    """The topology runs `schedule` now: its node count, and the analysis skips the switch's samples."""
    from elastream.control.controller import SETTLE_INTERVALS

    if len(schedule.nodes) != controller.topology.nodes:
        controller.topology = controller.topology.with_nodes(len(schedule.nodes))
    controller.metrics.not_before = controller.clock.now() + SETTLE_INTERVALS * controller.interval_s


def _publish(controller: TopologyController, record: dict[str, Any]) -> None:
    controller.last_drain = record
    controller.status.publish("lastDrain", dict(record))
