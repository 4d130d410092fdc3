"""What the reconcile loop keeps of one StreamTopology between passes (`ManagedTopology`): its controller,
its one status writer and events, the facts the status is computed from, and the desired state it tried to
reach and could not (`control.attempts.Attempt`, retried after a backoff). The desired state itself is never
kept: it is the resource's spec, read afresh on every pass.

The status is written here only (`ManagedTopology.write`): what runs is read once (`read_status`: the
backend's schedule, ready pods, the live rates), the document is rendered by `core.status.render_status`
(pure) and sent by the one `control.status_writer.StatusWriter` as the difference from what it wrote last."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from elastream.control.attempts import Attempt, AttemptTarget, failure_counts, next_attempt
from elastream.control.backends.kubernetes import KubernetesBackend
from elastream.control.backends.worker_objects import selector_for
from elastream.control.connectors import status_lag
from elastream.control.controller import TopologyController
from elastream.control.resource_api import (
    KubernetesEvents,
    ResourceApi,
)
from elastream.control.savepoint_actions import SavepointRequests
from elastream.control.scaling import ScalingRecord
from elastream.control.status_writer import StatusWriter
from elastream.core.outcomes import Outcome
from elastream.core.ports import BackendError, Clock, SystemClock
from elastream.core.status import (
    EventReason,
    StatusFacts,
    StatusReading,
    VertexReading,
    WorkloadReading,
    render_status,
    utc_timestamp,
    with_failures,
)
from elastream.core.topology import (
    Topology,
)

log = logging.getLogger("elastream.operator")


#: `status.lastUpgrade.outcome`
UPGRADE_SUCCEEDED = "Upgraded"
UPGRADE_ROLLED_BACK = "RolledBack"


@dataclass
class UpgradeMemory:
    """What the upgrades of a topology leave for the next passes."""

    #: the generation whose upgrade was rolled back: not tried again until the spec changes
    rolled_back_generation: int = 0
    #: the generation whose refused change was reported (once per generation)
    refused_reported: int = 0


@dataclass
class SpecMemory:
    """What the reconcile pass remembers of the resource it observed (the pass alone writes it)."""

    #: the resource's generation as the last pass saw it
    generation: int = 0
    #: the spec last seen, and when it last changed (a burst of patches settles before anything moves)
    spec: dict[str, Any] | None = None
    changed_at: float = 0.0
    #: the invalid spec last reported (an InvalidSpec event once per message)
    invalid_reported: str = ""
    #: the last generation fully applied, or judged unappliable (status.observedGeneration: GitOps tools wait
    #: for it); it lags while a scaling or an upgrade of a newer one is in flight
    observed_generation: int = 0

    def settled(self, at: float) -> None:
        """The spec counts as still since `at` at the latest (a resume converges at once, with no settling)."""
        self.changed_at = min(self.changed_at, at)


@dataclass
class ConvergenceMemory:
    """What `control.convergence.Convergence` remembers of a topology (its part alone writes it)."""

    #: vertex degrees of the spec last applied (a Stela scale-out adds executors: the running degrees are not
    #: the spec's, so only a change of the spec's degrees asks for a migration to them)
    applied_parallelism: dict[str, int] | None = None


@dataclass
class ManagedTopology:
    """One StreamTopology resource: its controller (once started), its one status writer, its events and what
    the reconcile loop remembers between passes. The desired state is never kept here: it is the resource's
    spec, read afresh on every pass.

    Who writes what: the pass its record of the resource it observed (`seen`: generation, spec and when it
    changed, the invalid spec reported, the observed generation); `Lifecycle` the controller it starts or stops
    and the start, resume and suspend attempts; `Upgrades` the controller it replaces, its record (`upgrades`)
    and `published["lastUpgrade"]`; `Convergence` the scaling attempt and its record (`convergence`: the
    degrees applied); `autoscaled` `expect_generation`; `SavepointAnnotations` `savepoints` and
    `published["savepoints"]`; the controller (as the `StatusSink`) the rest of `published`. The attempt in
    progress is one for the whole topology (a new target replaces the old). Every part notes what it found in
    `facts`; only `write` renders them."""

    key: str
    writer: StatusWriter
    events: KubernetesEvents
    resource: ResourceApi
    controller: TopologyController | None = None
    #: what the pass remembers of the resource it observed (`SpecMemory`: the pass alone writes it)
    seen: SpecMemory = field(default_factory=lambda: SpecMemory())
    #: what the parts of the pass found out (started, scaling, Redis away, the last failure, ...)
    facts: StatusFacts = field(default_factory=lambda: StatusFacts(0, 0))
    #: the facts the last status write showed: `facts` with what it read (ready nodes) and the attempt's counts
    reported: StatusFacts = field(default_factory=lambda: StatusFacts(0, 0))
    #: one pass at a time per topology; a delete waits for it (bounded) before stopping the workers
    lock: threading.Lock = field(default_factory=threading.Lock)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    #: what `control.convergence.Convergence` remembers of this topology (its part alone writes it)
    convergence: ConvergenceMemory = field(default_factory=lambda: ConvergenceMemory())
    #: the generation the autoscaler's own write of spec.nodes produced: until the watch shows it, the
    #: resource seen is older than what runs and must not move it back
    expect_generation: int = 0
    #: the start, resume, suspend, upgrade or scaling that failed, retried with backoff while it is still wanted
    attempt: Attempt | None = None
    #: what `control.upgrades.Upgrades` remembers of this topology's upgrades (its part alone reads it)
    upgrades: UpgradeMemory = field(default_factory=lambda: UpgradeMemory())
    #: extra status fields (lastScaling, lastRecovery, autoscaler) as the controller published them
    published: dict[str, Any] = field(default_factory=dict)
    #: the epoch of the topology's state in Redis (`store.epoch`), kept in the status: outside Redis
    state_epoch: str | None = None
    #: the savepoint annotations and `status.savepoints` (`control.savepoint_actions`), made by the first pass
    savepoints: SavepointRequests | None = None
    #: the time a changed condition records (`Clock.now`)
    clock: Clock = field(default_factory=SystemClock)

    @staticmethod
    def of_resource(
        body: Mapping[str, Any],
        key: str,
        writer: StatusWriter,
        events: KubernetesEvents,
        resource: ResourceApi,
        clock: Clock,
    ) -> ManagedTopology:
        """A topology seen for the first time: what its status says of the loop's memory is taken back (its
        conditions, epoch, applied degrees, observed generation and last upgrade: a rolled-back generation is
        not tried again after an operator restart)."""
        status = body.get("status") or {}
        writer.prime(status)
        managed = ManagedTopology(key, writer, events, resource, clock=clock)
        managed.conditions = list(status.get("conditions") or [])
        managed.state_epoch = status.get("stateEpoch") or None
        applied = status.get("appliedParallelism")
        if isinstance(applied, Mapping):
            managed.convergence.applied_parallelism = {str(v): int(k) for v, k in applied.items()}
        observed = status.get("observedGeneration")
        managed.seen.observed_generation = observed if isinstance(observed, int) else 0
        upgrade = status.get("lastUpgrade")
        if isinstance(upgrade, Mapping):
            managed.published["lastUpgrade"] = dict(upgrade)
            if upgrade.get("outcome") == UPGRADE_ROLLED_BACK and isinstance(upgrade.get("generation"), int):
                managed.upgrades.rolled_back_generation = upgrade["generation"]
        return managed

    @property
    def spec(self) -> dict[str, Any] | None:
        """The spec the last pass saw (`seen.spec`)."""
        return self.seen.spec

    @property
    def topology(self) -> Topology:
        assert self.controller is not None
        return self.controller.topology

    def running(self) -> TopologyController:
        """The controller, once started (a pass past its start)."""
        assert self.controller is not None
        return self.controller

    @property
    def backend(self) -> KubernetesBackend:
        """The controller's backend as the loop built it: worker pods."""
        assert self.controller is not None
        return cast(KubernetesBackend, self.controller.backend)

    def set(self, **changes: Any) -> None:
        self.facts = dataclasses.replace(self.facts, **changes)

    def failed(self, target: AttemptTarget, reason: str, now: float, retry_s: float, retry_cap_s: float) -> Attempt:
        """Another failure to reach `target`: the attempt in progress, due again after its backoff."""
        self.attempt = next_attempt(self.attempt, target, reason, now, retry_s, retry_cap_s)
        return self.attempt

    def waits(self, target: AttemptTarget, now: float) -> float | None:
        """Seconds until `target`, which failed, may be tried again (None: now)."""
        return self.attempt.waits(target, now) if self.attempt is not None else None

    def facts_to_report(self) -> StatusFacts:
        """The facts with the failure counts of the attempt in progress, as the next write shows them."""
        return with_failures(self.facts, failure_counts(self.attempt))

    def note_store(self) -> None:
        """What the controller knows of Redis (away since when) into the facts."""
        controller = self.controller
        if controller is None:
            return
        down_since = controller.store_down_since
        self.set(
            redis_unavailable=controller.store_error,
            redis_down_s=0.0 if down_since is None else max(0.0, controller.clock.now() - down_since),
        )

    def autoscaled(self, nodes: int) -> None:
        """The autoscaler moved the topology: write its node count to spec.nodes, and remember the generation
        that write made (until the watch shows it, the resource seen still asks for the old count)."""
        generation = self.resource.patch_spec_nodes(nodes)
        self.expect_generation = generation or self.seen.generation + 1

    def report_pending(self, pending: Mapping[str, str], write: bool = False) -> None:
        """Worker pods that cannot start (the scheduler's or the kubelet's reason) go into the Available
        condition and a Warning event; with `write`, the status is written at once (a start or migration
        waiting for them holds the pass that would write it)."""
        message = "; ".join(pending[n] for n in sorted(pending))
        changed = message != self.facts.pending
        self.set(pending=message)
        if message:
            self.events.emit(EventReason.WORKERS_PENDING, message, warning=True)
        if write and changed:
            self.write()

    def publish(self, field_name: str, status: dict[str, Any]) -> None:
        """The controller's `StatusSink`: a record (lastScaling, lastRecovery, autoscaler) goes into the
        status through the one writer, at once (it is news, not a rate). Within a scaling the reconciler
        holds (`facts.scaling`) it waits for the write that ends the scaling instead: the record, the phase
        and the conditions then change together, so no reader sees a finished scaling still in phase
        Scaling, or a failed one not yet Degraded."""
        self.published[field_name] = dict(status)
        if not self.facts.scaling:
            self.write()

    def flush(self) -> None:
        """Nothing to do: the writer sends the whole difference with the next write of the pass."""

    def write(self, volatile: bool = False) -> bool:
        """Write the status as it is now: what runs read once, the document rendered from the facts."""
        controller = self.controller
        reading = read_status(controller, self.facts, self.key)
        if controller is not None:
            self.state_epoch = controller.epoch or self.state_epoch
        extra: dict[str, Any] = {}
        applied = self.convergence.applied_parallelism
        if controller is not None and applied is not None:
            extra["appliedParallelism"] = dict(applied)
        if self.state_epoch:
            extra["stateEpoch"] = self.state_epoch
        extra.update(self.published)
        # the counts the last write read stand for a write that cannot read them (Redis or the API server away)
        last = self.reported
        rendered = render_status(
            dataclasses.replace(self.facts, ready_nodes=last.ready_nodes, desired_nodes=last.desired_nodes),
            reading,
            failure_counts(self.attempt),
            self.conditions,
            self.seen.observed_generation,
            utc_timestamp(self.clock.now()),
            extra,
        )
        self.conditions, self.reported = rendered.conditions, rendered.facts
        return self.writer.write(rendered.status, volatile=volatile)


def read_status(controller: TopologyController | None, facts: StatusFacts, key: str) -> StatusReading:
    """What a status write reads of the topology's workers, once: the schedule they run, how many of its pods
    are ready (not while Redis is away: the last count stands), the live rates and lags."""
    if controller is None:
        return StatusReading()
    try:
        schedule = controller.backend.current_schedule()
    except BackendError:
        schedule = None
    ready = None
    if schedule is not None and not facts.redis_unavailable:
        backend = cast(KubernetesBackend, controller.backend)
        try:  # a pod that is scheduled but not started (or not placed at all) is not ready
            ready = len((set(schedule.nodes) & backend.ready_nodes()) - set(backend.failed_nodes()))
        except Exception as exc:  # Redis or the API server away: the last count stands
            log.debug("ready nodes of %s not read: %s", key, exc)
    topology = controller.topology
    rates = controller.live.rates()
    backlog = controller.live.source_backlog()
    record = controller.last_scaling
    workload = WorkloadReading(
        selector=selector_for(topology),
        throughput=controller.live.throughput(),
        vertices=tuple(
            VertexReading(
                v,
                rates.get(v, 0.0),
                lag=backlog.get(v),
                partition_lag=status_lag(controller.partition_lag[v]) if v in controller.partition_lag else None,
            )
            for v in topology.order
        ),
        last_scaling=summary(record) if record is not None else None,
    )
    return StatusReading(
        schedule_nodes=len(schedule.nodes) if schedule is not None else None,
        parallelism=schedule.parallelism() if schedule is not None else {},
        ready=ready,
        workload=workload,
        connector_error=controller.connectors.error,
    )


def summary(record: ScalingRecord) -> str:
    """One line for the `Last scaling` printer column."""
    if record.outcome == Outcome.SUCCEEDED:
        pause = record.report.get("pauseMs")
        return f"{record.direction} {record.from_nodes}->{record.to_nodes}" + (
            f" ({pause:.0f} ms pause)" if isinstance(pause, int | float) else ""
        )
    return f"{record.direction} {record.from_nodes}->{record.to_nodes} {record.outcome}"


def spec_parallelism(topology: Topology) -> dict[str, int]:
    return {v: topology.vertices[v].parallelism for v in topology.order}
