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

`DrainRunner` holds the ports a drain uses (the drain requests, the backend, the migrator, the clock) and
changes nothing of the controller: each step returns a `DrainOutcome` (the record to publish, the schedule
running now, the node count the drains bring back, the events to say, a Redis error met), which
`TopologyController` applies through its one path, settling on the new schedule there (`control.changes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from elastream.control.changes import Said
from elastream.core.drain_plan import drain_schedule, refill_schedule
from elastream.core.migration_protocol import MigrationReport
from elastream.core.outcomes import Outcome
from elastream.core.ports import Backend, BackendError, Clock, DrainRequest, DrainRequests, Migrator
from elastream.core.schedule import Schedule
from elastream.core.status import EventReason


@dataclass(frozen=True)
class DrainOutcome:
    """What one step of the drains changed, for the controller to apply."""

    #: the `lastDrain` record to publish (None: no drain ran)
    record: dict[str, Any] | None = None
    #: the schedule the topology runs now, when a migration moved it (the controller settles on it)
    running: Schedule | None = None
    #: the node count before the drains in progress, which their refill brings back (None when none is)
    target: int | None = None
    #: the node count a refill brings back next (`DrainRunner.refill`), None when none runs now
    refill_to: int | None = None
    #: the events to say, in order
    said: tuple[Said, ...] = ()
    #: why Redis could not be used ("" when it could), noted by the controller as Redis away
    store_error: str = ""


@dataclass
class DrainRunner:
    """Carries out the drain requests of one topology through its ports; returns what changed."""

    requests: DrainRequests
    backend: Backend
    migrator: Migrator
    clock: Clock

    def take(self, target: int | None) -> DrainOutcome | None:
        """Carry out the oldest pending drain request (one per tick), dropping the ones that cannot or need not
        be drained. `target`: the node count the drains in progress bring back (None when none is). None
        when nothing changed."""
        pending = self.requests.pending()
        if not pending:
            # a refill deferred for a drain that never ran (its worker died): the next scaling sets the count
            return None if target is None else DrainOutcome(target=None)
        schedule = self.backend.current_schedule()
        failed = self.backend.failed_nodes()
        now = self.clock.now()
        said: list[Said] = []
        for request in sorted(pending.values(), key=lambda r: (r.requested_at, r.node)):
            node = request.node
            if node not in schedule.nodes:
                self.requests.done(node)  # drained already, or removed by a scaling meanwhile: nothing to move
            elif node in failed:
                self.requests.done(node)
                said.append(
                    Said(
                        EventReason.DRAIN_FAILED,
                        f"node {node}: its worker died before its drain; the recovery rolls back to the last "
                        "checkpoint",
                        warning=True,
                    )
                )
            elif now >= request.deadline:
                self.requests.done(node)
                said.append(
                    Said(
                        EventReason.DRAIN_FAILED,
                        f"node {node}: its drain request came too late (past its worker's deadline); when the "
                        "worker exits, the recovery rolls back to the last checkpoint",
                        warning=True,
                    )
                )
            else:
                # the others waiting for their drain receive nothing: their executors would only move twice
                others = frozenset(n for n in pending if n != node and n in schedule.nodes)
                return self._drain(request, schedule, others, target, said)
        return DrainOutcome(target=target, said=tuple(said)) if said else None

    def _drain(
        self, request: DrainRequest, schedule: Schedule, avoid: frozenset[str], target: int | None, said: list[Said]
    ) -> DrainOutcome:
        node = request.node
        started = self.clock.now()
        plan = drain_schedule(schedule, node, avoid)
        record: dict[str, Any] = {
            "node": node,
            "requestedAt": request.requested_at,
            "startedAt": started,
            "moves": plan.moves(schedule),
        }
        if plan.replacement is not None:
            record["replacement"] = plan.replacement
        report, reason, store_error = self._migrate(plan.schedule)
        record["finishedAt"] = self.clock.now()
        if report is not None:
            record.update(_summary(report))
        if report is None or report.outcome != Outcome.SUCCEEDED:
            record["outcome"] = Outcome.FAILED
            record["reason"] = reason or (report.reason if report is not None else "") or "migration failed"
            left = request.deadline - self.clock.now()
            said.append(
                Said(
                    EventReason.DRAIN_FAILED,
                    f"node {node}: {record['reason']}; "
                    + (
                        f"tried again while its worker waits ({left:.0f} s left)"
                        if left > 0
                        else "its worker exits now"
                    )
                    + ", else the recovery rolls back to the last checkpoint",
                    warning=True,
                )
            )
            return DrainOutcome(record, target=target, said=tuple(said), store_error=store_error)
        self.requests.done(node)
        record["outcome"] = Outcome.SUCCEEDED
        onto = plan.replacement or ", ".join(sorted({m["to"] for m in record["moves"]}))
        pause = report.pause_ms
        said.append(
            Said(
                EventReason.DRAINED,
                f"node {node} drained by {report.protocol}: {len(record['moves'])} executors moved to {onto}, "
                f"{record['replayed']} events replayed"
                + (f", sources paused {pause:.0f} ms" if pause is not None else "")
                + "; its worker exits",
            )
        )
        if plan.replacement is not None:
            return DrainOutcome(record, plan.schedule, target, said=tuple(said))
        if target is None:
            target = len(schedule.nodes)
        if avoid:  # more workers wait for their drain (within their grace period): the refill comes after
            record["refill"] = {"outcome": "deferred", "reason": f"{', '.join(sorted(avoid))} drained first"}
            return DrainOutcome(record, plan.schedule, target, said=tuple(said))
        return DrainOutcome(record, plan.schedule, target, refill_to=target, said=tuple(said))

    def refill(self, drained: DrainOutcome) -> DrainOutcome:
        """After `drained` (whose `refill_to` is set): bring the node count back, fresh nodes taking executors
        from the fullest nodes (degrees unchanged). Its record is the drain's with the refill in it."""
        assert drained.record is not None and drained.refill_to is not None
        node = drained.record["node"]
        current = self.backend.current_schedule()
        refilled = refill_schedule(current, drained.refill_to)
        added = [n for n in refilled.nodes if n not in current.nodes]
        moves = [
            {"executor": e, "from": n, "to": refilled.assignment[e]} for e, n in current if refilled.assignment[e] != n
        ]
        report, reason, store_error = self._migrate(refilled)
        refill: dict[str, Any] = {"nodes": added, "moves": moves}
        if report is not None:
            refill.update(_summary(report))
        record = drained.record | {"refill": refill}
        if report is None or report.outcome != Outcome.SUCCEEDED:
            refill.update(outcome=Outcome.FAILED, reason=reason or (report.reason if report is not None else ""))
            failed = Said(
                EventReason.DRAIN_FAILED,
                f"node {node} was drained, but starting {', '.join(added)} in its place failed: {refill['reason']}; "
                f"the topology runs on {len(current.nodes)} nodes until the next scaling",
                warning=True,
            )
            return DrainOutcome(record, said=(failed,), store_error=store_error)
        refill["outcome"] = Outcome.SUCCEEDED
        drained_said = Said(
            EventReason.DRAINED,
            f"{', '.join(added)} started in place of {node}: {len(moves)} executors moved onto it, "
            f"{refill['replayed']} events replayed; {len(refilled.nodes)} nodes again",
        )
        return DrainOutcome(record, running=refilled, said=(drained_said,))

    def _migrate(self, target: Schedule) -> tuple[MigrationReport | None, str, str]:
        """The migration's report, or why there is none, and the Redis error met ("" when none)."""
        try:
            return self.migrator.migrate(target), "", ""
        except redis.RedisError as exc:
            return None, f"Redis: {exc}", f"{type(exc).__name__}: {exc}"
        except BackendError as exc:
            return None, str(exc), ""


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
