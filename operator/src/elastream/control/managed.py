"""What the reconcile loop keeps of one StreamTopology between passes (`ManagedTopology`): its controller,
its one status writer and events, the facts the status is computed from, and the desired state it tried to
reach and could not (`Attempt`, retried after `control.retrying.backoff_delay`). The desired state itself is
never kept: it is the resource's spec, read afresh on every pass."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, cast

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
from elastream.core.ports import BackendError
from elastream.core.status import (
    StatusFacts,
    desired_conditions,
    merge_conditions,
    phase,
)
from elastream.core.topology import (
    Topology,
)

log = logging.getLogger("elastream.operator")


#: `status.lastUpgrade.outcome`
UPGRADE_SUCCEEDED = "Upgraded"
UPGRADE_ROLLED_BACK = "RolledBack"


@dataclass
class Attempt:
    """A desired state the loop tried to reach and could not (a scaling, a start): retried with backoff while
    it stays the desired state; a new desired state is tried at once."""

    target: Any
    failures: int = 0
    due: float = 0.0
    reason: str = ""


@dataclass
class ManagedTopology:
    """One StreamTopology resource: its controller (once started), its one status writer, its events and what
    the reconcile loop remembers between passes. The desired state is never kept here: it is the resource's
    spec, read afresh on every pass."""

    key: str
    writer: StatusWriter
    events: KubernetesEvents
    resource: ResourceApi
    controller: TopologyController | None = None
    generation: int = 0
    facts: StatusFacts = field(default_factory=lambda: StatusFacts(0, 0))
    #: one pass at a time per topology; a delete waits for it (bounded) before stopping the workers
    lock: threading.Lock = field(default_factory=threading.Lock)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    #: the spec last seen, and when it last changed (a burst of patches settles before anything moves)
    spec: dict[str, Any] | None = None
    spec_changed_at: float = 0.0
    #: vertex degrees of the spec last applied (a Stela scale-out adds executors: the running degrees are not
    #: the spec's, so only a change of the spec's degrees asks for a migration to them)
    applied_parallelism: dict[str, int] | None = None
    #: the generation the autoscaler's own write of spec.nodes produced: until the watch shows it, the
    #: resource seen is older than what runs and must not move it back
    expect_generation: int = 0
    #: the scaling or start that failed, retried with backoff while it is still wanted
    attempt: Attempt | None = None
    #: the last generation fully applied, or judged unappliable (status.observedGeneration: GitOps tools wait
    #: for it); it lags while a scaling or an upgrade of a newer one is in flight
    observed_generation: int = 0
    #: the generation whose upgrade was rolled back: not tried again until the spec changes
    rolled_back_generation: int = 0
    #: the generation whose refused change was reported (once per generation)
    refused_reported: int = 0
    invalid_reported: str = ""
    #: extra status fields (lastScaling, lastRecovery, autoscaler) as the controller published them
    published: dict[str, Any] = field(default_factory=dict)
    #: the epoch of the topology's state in Redis (`store.epoch`), kept in the status: outside Redis
    state_epoch: str | None = None
    #: the savepoint annotations and `status.savepoints` (`control.savepoint_actions`), made by the first pass
    savepoints: SavepointRequests | None = None

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
        """The controller's backend as what `ManagedTopologies` built it: worker pods."""
        assert self.controller is not None
        return cast(KubernetesBackend, self.controller.backend)

    def set(self, **changes: Any) -> None:
        self.facts = dataclasses.replace(self.facts, **changes)

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
        return self.writer.write(self.status(), volatile=volatile)

    def status(self) -> dict[str, Any]:
        """The status subresource's content now (rates from the live view)."""
        controller = self.controller
        schedule = None
        if controller is not None:
            try:
                schedule = controller.backend.current_schedule()
            except BackendError:
                schedule = None
        ready = self.facts.ready_nodes
        if schedule is not None and not self.facts.redis_unavailable:
            try:  # a pod that is scheduled but not started (or not placed at all) is not ready
                ready = len((set(schedule.nodes) & self.backend.ready_nodes()) - set(self.backend.failed_nodes()))
            except Exception as exc:  # Redis or the API server away: the last count stands
                log.debug("ready nodes of %s not read: %s", self.key, exc)
        running = len(schedule.nodes) if schedule is not None else 0
        if self.facts.suspended:  # no worker runs (the scale subresource reads 0 replicas, as when scaled to 0)
            schedule, running, ready = None, 0, 0
        # what must be ready is what runs: a failed scaling leaves the old schedule Running, not Degraded
        self.set(ready_nodes=ready, desired_nodes=running if schedule is not None else self.facts.desired_nodes)
        attempt = self.attempt  # failures in a row of what is retried: enough of them and the topology is Stalled
        target = attempt.target if attempt is not None else None
        failures = attempt.failures if attempt is not None else 0
        self.set(
            start_failures=failures if target in ("start", "resume") else 0,
            suspend_failures=failures if target == "suspend" else 0,
            scaling_failures=failures if target not in (None, "start", "resume", "suspend") else 0,
        )
        self.set(connector_error=controller.connectors.error if controller is not None else "")
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.conditions = merge_conditions(
            self.conditions, desired_conditions(self.facts), now, self.observed_generation
        )
        status: dict[str, Any] = {
            "phase": phase(self.facts),
            "nodes": running,
            "readyNodes": ready,
            "observedGeneration": self.observed_generation,
            "conditions": self.conditions,
        }
        if controller is not None:
            topology = controller.topology
            rates = controller.live.rates()
            parallelism = schedule.parallelism() if schedule is not None else {}
            backlog = controller.live.source_backlog()
            vertices: list[dict[str, Any]] = []
            for v in topology.order:
                entry: dict[str, Any] = {
                    "name": v,
                    "parallelism": parallelism.get(v, 0),
                    "processingRate": round(rates.get(v, 0.0), 1),
                }
                if v in backlog:
                    entry["lag"] = backlog[v]
                if v in controller.partition_lag:
                    entry["partitionLag"] = status_lag(controller.partition_lag[v])
                vertices.append(entry)
            status.update(
                selector=selector_for(topology), throughput=round(controller.live.throughput(), 1), vertices=vertices
            )
            if self.applied_parallelism is not None:
                status["appliedParallelism"] = dict(self.applied_parallelism)
            self.state_epoch = controller.epoch or self.state_epoch
            record = controller.last_scaling
            if record is not None:
                status["lastScalingSummary"] = summary(record)
        if self.state_epoch:
            status["stateEpoch"] = self.state_epoch
        status.update(self.published)
        return status


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
