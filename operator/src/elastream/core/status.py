"""The StreamTopology's status from what the controller knows: phase and the Available / Progressing / Degraded
conditions, with constant reasons (kubebuilder's convention), pure so the rules are unit-tested.

Beside them, the conditions GitOps tools read (kstatus, sigs.k8s.io/cli-utils, as Flux and Argo CD use it):

- `Ready` (always present, normal-true): True only when running as specified (Available, not Progressing, not
  Degraded); False otherwise, with the reason and message of what is wrong.
- `Reconciling` (abnormal-true, present only while True): the operator is still working towards the spec
  (starting, scaling, upgrading, recovering, waiting for Redis or for pods, retrying a failed scaling). kstatus:
  InProgress.
- `Stalled` (abnormal-true, present only while True): the operator cannot get on without a change by the user
  (InvalidSpec, ObjectNotOwned, RedisUserRefused, StateLost, UpgradeFailed (rolled back), UpgradeRefused, a
  scaling or start that failed `STALL_AFTER_FAILURES` times in a row). kstatus: Failed.

Whenever Ready is False exactly one of Reconciling and Stalled is True, and never both: kstatus (upstream)
takes a custom resource with neither as Current, and takes whichever of the two it meets first in the list.
A topology suspended as its spec asks (`spec.suspend: true`, phase `Suspended`) is Ready True with reason
Suspended: the spec is reached, and kstatus (which reads Ready False as InProgress) reports it Current, as it
reports a Deployment scaled to zero or a suspended CronJob; Argo CD's check reads the reason and shows its own
Suspended health. While the suspend still waits for its last checkpoint, Reconciling says so (reason
Suspending).
That one of them is absent rather than False follows fluxcd/pkg's condition checks (only one of Reconciling
and Stalled present at a time; neither True while Ready is True).

A condition keeps its `lastTransitionTime` while its status stays the same, as metav1.Condition requires.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

AVAILABLE = "Available"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"

# reasons (CamelCase, constant: alerts and scripts match on them)
ALL_NODES_READY = "AllNodesReady"
NODES_NOT_READY = "NodesNotReady"
WORKERS_PENDING = "WorkersPending"
STARTING = "Starting"
SCALING = "Scaling"
RECOVERING = "Recovering"
STABLE = "Stable"
INVALID_SPEC = "InvalidSpec"
SCALING_FAILED = "ScalingFailed"
WORKER_LOST = "WorkerLost"
BACKEND_ERROR = "BackendError"
REDIS_UNAVAILABLE = "RedisUnavailable"
#: Redis answers BUSY: a script or function holds the server (only SCRIPT KILL or SHUTDOWN NOSAVE ends it)
REDIS_BUSY = "RedisBusy"
#: Redis answers OOM: its used memory is over `maxmemory` (noeviction), so every write is refused
REDIS_OUT_OF_MEMORY = "RedisOutOfMemory"
STATE_LOST = "StateLost"
OBJECT_NOT_OWNED = "ObjectNotOwned"
REDIS_USER_REFUSED = "RedisUserRefused"
AS_EXPECTED = "AsExpected"
START_FAILED = "StartFailed"
SUSPENDED = "Suspended"
SUSPENDING = "Suspending"
RESUMING = "Resuming"
SUSPEND_FAILED = "SuspendFailed"
UPGRADING = "Upgrading"
UPGRADE_FAILED = "UpgradeFailed"
UPGRADE_REFUSED = "UpgradeRefused"
#: a source or sink cannot reach its system (a Kafka topic missing or not authorised, its brokers away)
CONNECTOR_ERROR = "ConnectorError"


class EventReason(enum.StrEnum):
    """The reasons of the Kubernetes Events a topology gets (and of `elastream run`'s event lines): constant,
    as alerts and scripts match them. Those that are also condition reasons are the same strings."""

    SCALING_PLANNED = "ScalingPlanned"
    SCALED = "Scaled"
    SCALING_REJECTED = "ScalingRejected"
    SCALING_FAILED = SCALING_FAILED
    SCALING_BACKOFF = "ScalingBackoff"
    MIGRATION_STARTED = "MigrationStarted"
    MIGRATED = "Migrated"
    MIGRATION_FAILED = "MigrationFailed"
    MIGRATION_ABORTED = "MigrationAborted"
    MIGRATION_ROLLING_BACK = "MigrationRollingBack"
    MIGRATION_RESUMED = "MigrationResumed"
    WORKER_LOST = WORKER_LOST
    WORKERS_PENDING = WORKERS_PENDING
    WORKERS_RESTARTED = "WorkersRestarted"
    RECOVERED = "Recovered"
    RECOVERY_FAILED = "RecoveryFailed"
    RECOVERY_BACKOFF = "RecoveryBackoff"
    CATCH_UP_MEASURED = "CatchUpMeasured"
    REDIS_UNAVAILABLE = REDIS_UNAVAILABLE
    REDIS_AVAILABLE = "RedisAvailable"
    REDIS_BUSY = REDIS_BUSY
    REDIS_OUT_OF_MEMORY = REDIS_OUT_OF_MEMORY
    STATE_LOST = STATE_LOST
    STATE_RESTORED = "StateRestored"
    STATE_RESET = "StateReset"
    START_FAILED = START_FAILED
    INVALID_SPEC = INVALID_SPEC
    OBJECT_NOT_OWNED = OBJECT_NOT_OWNED
    REDIS_USER_REFUSED = REDIS_USER_REFUSED
    AUTOSCALER_DECIDED = "AutoscalerDecided"
    AUTOSCALER_RECOMMENDS = "AutoscalerRecommends"
    SUSPENDED = SUSPENDED
    SUSPEND_BACKOFF = "SuspendBackoff"
    RESUMED = "Resumed"
    UPGRADE_STARTED = "UpgradeStarted"
    UPGRADED = "Upgraded"
    UPGRADE_BACKOFF = "UpgradeBackoff"
    UPGRADE_FAILED = UPGRADE_FAILED
    UPGRADE_REFUSED = UPGRADE_REFUSED
    UPGRADE_ROLLED_BACK = "UpgradeRolledBack"
    STATE_DROPPED = "StateDropped"
    DRAINED = "Drained"
    DRAIN_FAILED = "DrainFailed"
    SAVEPOINT_TAKEN = "SavepointTaken"
    SAVEPOINT_REFUSED = "SavepointRefused"
    SAVEPOINT_BACKOFF = "SavepointBackoff"
    SAVEPOINT_FAILED = "SavepointFailed"
    SAVEPOINT_DELETED = "SavepointDeleted"
    RESTORED_FROM_SAVEPOINT = "RestoredFromSavepoint"
    RETAINED_STATE_ADOPTED = "RetainedStateAdopted"
    #: the controller skipped malformed or oversized entries of the topology's metric stream (rate-limited)
    METRIC_SAMPLES_SKIPPED = "MetricSamplesSkipped"
    CONNECTOR_ERROR = CONNECTOR_ERROR
    CONNECTOR_RECOVERED = "ConnectorRecovered"


def redis_reason(error: str) -> str:
    """The reason for a Redis error as the control plane notes it (`"<exception type>: <message>"`):
    REDIS_BUSY for a BUSY reply, REDIS_OUT_OF_MEMORY for an OOM reply (redis-py's OutOfMemoryError), either
    of them for `store.retry`'s exceptions of those names, REDIS_UNAVAILABLE for anything else."""
    kind, _, message = error.partition(": ")
    first = message.split(maxsplit=1)[0] if message.strip() else ""
    if kind == REDIS_BUSY or first == "BUSY":
        return REDIS_BUSY
    if kind in (REDIS_OUT_OF_MEMORY, "OutOfMemoryError") or first == "OOM":
        return REDIS_OUT_OF_MEMORY
    return REDIS_UNAVAILABLE


#: Redis away this long (seconds) makes the topology Degraded; shorter, it only shows in Progressing
REDIS_GRACE_S = 60.0

#: a scaling to the same target (or the start) that failed this many times in a row is Stalled: retried on with
#: backoff, but the user is the one who can change it (kstatus then says Failed, and Flux stops waiting)
STALL_AFTER_FAILURES = 3

PHASES = ("Pending", "Running", "Scaling", "Upgrading", "Degraded", "Failed", "Suspended")


@dataclass(frozen=True)
class StatusFacts:
    """What the controller knows about one topology at one moment."""

    desired_nodes: int
    ready_nodes: int
    started: bool = False
    scaling: bool = False
    recovering: bool = False
    #: the spec cannot run (graph or slot checks the API server cannot make): the message names the field
    invalid_spec: str = ""
    #: the last scaling failed (the old schedule runs on): its reason
    scaling_failed: str = ""
    #: the backend or Redis cannot be used now
    backend_error: str = ""
    #: workers died and their recovery has not finished
    worker_lost: str = ""
    #: worker pods that cannot start for now (no cluster node can take them, an image is missing): why
    pending: str = ""
    #: Redis cannot be reached (why), and for how long so far
    redis_unavailable: str = ""
    redis_down_s: float = 0.0
    #: the topology's state in Redis is gone (emptied, a new volume, a wrong URL): why
    state_lost: str = ""
    #: an object the topology needs (a worker pod, its ConfigMap or Secret) is someone else's: which, and the fix
    not_owned: str = ""
    #: Redis refuses the ACL commands that give the topology its own Redis user: what it said, and the fix
    redis_user_refused: str = ""
    #: failures in a row of the scaling to the same target (`scaling_failed` has the last one's reason)
    scaling_failures: int = 0
    #: failures in a row of the start (retried with backoff; the error is in `backend_error`)
    start_failures: int = 0
    #: `spec.suspend` is done: the last checkpoint taken, no worker runs (`suspended_at` names the checkpoint
    #: the topology resumes from; "" when it never completed one and resumes from the sources' beginning)
    suspended: bool = False
    suspended_at: str = ""
    #: `spec.suspend` asked and not done yet: what it waits for (the last checkpoint, a failed one retried)
    suspending: str = ""
    #: failures in a row of the suspend's last checkpoint (the workers run on meanwhile)
    suspend_failures: int = 0
    #: failures in a row of the checkpoint that begins a stateful upgrade (the old pods run on meanwhile)
    upgrade_failures: int = 0
    #: the workers are starting again from the checkpoint of a suspend
    resuming: bool = False
    #: a stateful upgrade is in flight (checkpoint, old pods stopped, new ones starting from it): what it does
    upgrading: str = ""
    #: the last upgrade's new pods did not become ready: it was rolled back to the previous spec (why); the
    #: generation is not tried again until the spec changes
    upgrade_failed: str = ""
    #: the spec asks for a change no checkpoint can carry (a kept stateful vertex's key groups): the field, the fix
    upgrade_refused: str = ""
    #: what a source or sink reports it cannot do (a topic missing or not authorised, the brokers away): the
    #: executor and its words; the topology waits (sources) or retries (sinks), nothing is lost
    connector_error: str = ""


def phase(facts: StatusFacts) -> str:
    if facts.invalid_spec:
        return "Failed"
    if facts.suspended and stalled(facts) is None:
        return "Suspended"
    if facts.scaling:
        return "Scaling"
    if facts.upgrading:
        return "Upgrading"
    if facts.state_lost or facts.not_owned or facts.redis_user_refused or facts.upgrade_failed or facts.upgrade_refused:
        return "Degraded"
    if not facts.started or facts.resuming:
        return "Pending"
    if (
        facts.state_lost
        or facts.backend_error
        or facts.worker_lost
        or facts.recovering
        or facts.ready_nodes < facts.desired_nodes
        or (facts.redis_unavailable and facts.redis_down_s >= REDIS_GRACE_S)
    ):
        return "Degraded"
    return "Running"


#: the CRD's maxLength of a condition's message (metav1.Condition's, 32768); measured here in UTF-8 bytes,
#: which is never less than the characters the API server counts
CONDITION_MESSAGE_MAX_BYTES = 32_768
TRUNCATED = " … (truncated)"


def fit_message(message: str, limit: int = CONDITION_MESSAGE_MAX_BYTES) -> str:
    """`message` within `limit` UTF-8 bytes: as it is when it fits, else cut at a character boundary and
    ended with TRUNCATED, so the status patch is never refused for a long message."""
    data = message.encode("utf-8")
    if len(data) <= limit:
        return message
    keep = limit - len(TRUNCATED.encode("utf-8"))
    return data[:keep].decode("utf-8", errors="ignore") + TRUNCATED


def _condition(kind: str, status: bool, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": fit_message(message)}


def desired_conditions(facts: StatusFacts) -> list[dict[str, str]]:
    """The conditions (type, status, reason, message) for `facts`: Available, Progressing, Degraded, Ready, and
    Reconciling or Stalled when one of them is True (see the module's doc)."""
    if facts.suspended and stalled(facts) is None:
        return _suspended_conditions(facts)
    available, progressing, degraded = _workload_conditions(facts)
    return [available, progressing, degraded, *_gitops_conditions(facts, available, progressing, degraded)]


def _suspended_conditions(facts: StatusFacts) -> list[dict[str, str]]:
    """A topology suspended as asked: nothing runs and nothing is wrong. Ready True (the desired state,
    `suspend: true`, is reached: kstatus Current) with reason Suspended, Available False (no worker serves)."""
    point = (
        f"resumes from checkpoint {facts.suspended_at}"
        if facts.suspended_at
        else "no checkpoint was ever completed: resumes from the sources' beginning"
    )
    message = f"suspended by spec.suspend: no worker runs, the state is kept in Redis; {point}"
    return [
        _condition(AVAILABLE, False, SUSPENDED, message),
        _condition(PROGRESSING, False, SUSPENDED, "suspended: nothing to do until spec.suspend is false"),
        _condition(DEGRADED, False, SUSPENDED, message),
        _condition(READY, True, SUSPENDED, message),
    ]


def stalled(facts: StatusFacts) -> tuple[str, str] | None:
    """(reason, message) when the operator cannot get on without a change by the user, else None."""
    if facts.invalid_spec:
        return INVALID_SPEC, facts.invalid_spec
    if facts.not_owned:
        return OBJECT_NOT_OWNED, facts.not_owned
    if facts.redis_user_refused:
        return REDIS_USER_REFUSED, facts.redis_user_refused
    if facts.state_lost:
        return STATE_LOST, facts.state_lost
    if facts.upgrade_refused and not facts.upgrading:
        return UPGRADE_REFUSED, facts.upgrade_refused
    if facts.upgrade_failed and not facts.upgrading:
        return UPGRADE_FAILED, facts.upgrade_failed
    if facts.scaling_failed and not facts.scaling and facts.scaling_failures >= STALL_AFTER_FAILURES:
        return (
            SCALING_FAILED,
            f"scaling failed {facts.scaling_failures} times in a row, the old schedule runs on (retried with "
            f"backoff; change spec.nodes to try another value): {facts.scaling_failed}",
        )
    if facts.suspending and facts.suspend_failures >= STALL_AFTER_FAILURES:
        return (
            SUSPEND_FAILED,
            f"the last checkpoint before suspending failed {facts.suspend_failures} times in a row; the workers "
            f"run on, nothing was stopped (retried with backoff; set spec.suspend: false to give up): "
            f"{facts.suspending}",
        )
    if (
        not facts.started
        and facts.backend_error
        and not facts.redis_unavailable  # Redis away is waited for (Reconciling), not the user's to fix
        and facts.start_failures >= STALL_AFTER_FAILURES
    ):
        return (
            START_FAILED,
            f"starting failed {facts.start_failures} times in a row (retried with backoff): {facts.backend_error}",
        )
    return None


def _gitops_conditions(
    facts: StatusFacts, available: Mapping[str, str], progressing: Mapping[str, str], degraded: Mapping[str, str]
) -> list[dict[str, str]]:
    """Ready, and Reconciling or Stalled (present only when True), from the three workload conditions."""
    stall = stalled(facts)
    if stall is not None:
        reason, message = stall
        return [_condition(READY, False, reason, message), _condition(STALLED, True, reason, message)]
    if available["status"] == "True" and progressing["status"] == "False" and degraded["status"] == "False":
        return [_condition(READY, True, AS_EXPECTED, f"running as specified: {available['message']}")]
    # not ready: what is wrong (Degraded first), and what the operator is doing about it (Progressing first)
    wrong = next(c for c in (degraded, available, progressing) if _abnormal(c))
    doing: Mapping[str, str] = next(c for c in (progressing, degraded, available) if _abnormal(c))
    if not facts.started and facts.start_failures and facts.backend_error and not facts.redis_unavailable:
        doing = {
            "reason": START_FAILED,
            "message": f"retrying the start with backoff ({facts.start_failures} failure(s) so far): "
            f"{facts.backend_error}",
        }
    elif facts.scaling_failed and not facts.scaling and doing is degraded and degraded["reason"] == SCALING_FAILED:
        doing = {
            "reason": SCALING_FAILED,
            "message": f"retrying a failed scaling with backoff ({facts.scaling_failures} failure(s) so far): "
            f"{facts.scaling_failed}",
        }
    return [
        _condition(READY, False, wrong["reason"], wrong["message"]),
        _condition(RECONCILING, True, doing["reason"], doing["message"]),
    ]


def _abnormal(condition: Mapping[str, str]) -> bool:
    """Available is normal when True, Progressing and Degraded when False."""
    return condition["status"] == ("False" if condition["type"] == AVAILABLE else "True")


def _workload_conditions(facts: StatusFacts) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Available, Progressing and Degraded for `facts`."""
    if facts.invalid_spec:
        available = _condition(AVAILABLE, False, INVALID_SPEC, facts.invalid_spec)
    elif facts.started and facts.ready_nodes >= facts.desired_nodes and not facts.worker_lost:
        available = _condition(
            AVAILABLE, True, ALL_NODES_READY, f"{facts.ready_nodes} of {facts.desired_nodes} nodes ready"
        )
    elif facts.pending:
        available = _condition(
            AVAILABLE,
            False,
            WORKERS_PENDING,
            f"{facts.ready_nodes} of {facts.desired_nodes} nodes ready; {facts.pending}",
        )
    else:
        available = _condition(
            AVAILABLE, False, NODES_NOT_READY, f"{facts.ready_nodes} of {facts.desired_nodes} nodes ready"
        )
    if facts.scaling:
        progressing = _condition(PROGRESSING, True, SCALING, "a migration is moving executors")
    elif facts.upgrading:
        progressing = _condition(PROGRESSING, True, UPGRADING, f"upgrading: {facts.upgrading}")
    elif facts.redis_unavailable:
        progressing = _condition(
            PROGRESSING, True, redis_reason(facts.redis_unavailable), f"waiting for Redis: {facts.redis_unavailable}"
        )
    elif facts.suspending:
        progressing = _condition(PROGRESSING, True, SUSPENDING, f"suspending: {facts.suspending}")
    elif facts.resuming:
        progressing = _condition(
            PROGRESSING, True, RESUMING, "resuming: starting the workers from the checkpoint of the suspend"
        )
    elif facts.recovering:
        progressing = _condition(PROGRESSING, True, RECOVERING, "rolling back to the last checkpoint")
    elif not facts.started and not facts.invalid_spec:
        progressing = _condition(PROGRESSING, True, STARTING, "starting the worker pods")
    else:
        progressing = _condition(PROGRESSING, False, STABLE, "no scaling in progress")
    redis_away = facts.redis_unavailable and facts.redis_down_s >= REDIS_GRACE_S
    # the first cause that holds is the one Degraded names (the order is the user's: what to fix first)
    causes = (
        (INVALID_SPEC, facts.invalid_spec),
        (STATE_LOST, facts.state_lost),
        (OBJECT_NOT_OWNED, facts.not_owned),
        (REDIS_USER_REFUSED, facts.redis_user_refused),
        (UPGRADE_REFUSED, "" if facts.upgrading else facts.upgrade_refused),
        (UPGRADE_FAILED, "" if facts.upgrading else facts.upgrade_failed),
        (
            redis_reason(facts.redis_unavailable),
            f"Redis unreachable for over {REDIS_GRACE_S:.0f} s: {facts.redis_unavailable}" if redis_away else "",
        ),
        (WORKER_LOST, facts.worker_lost),
        (CONNECTOR_ERROR, facts.connector_error),
        (BACKEND_ERROR, facts.backend_error),
        (SCALING_FAILED, facts.scaling_failed),
    )
    reason, message = next(((r, m) for r, m in causes if m), (AS_EXPECTED, "running as specified"))
    degraded = _condition(DEGRADED, reason != AS_EXPECTED, reason, message)
    return available, progressing, degraded


def merge_conditions(
    previous: Sequence[Mapping[str, Any]] | None, desired: Sequence[Mapping[str, str]], now: str, generation: int
) -> list[dict[str, Any]]:
    """`desired` as metav1.Conditions: `lastTransitionTime` is `now` only where the status changed."""
    before = {str(c.get("type")): c for c in previous or []}
    merged = []
    for condition in desired:
        old = before.get(condition["type"])
        changed = old is None or old.get("status") != condition["status"]
        merged.append(
            {
                **condition,
                "lastTransitionTime": now if changed or old is None else str(old.get("lastTransitionTime", now)),
                "observedGeneration": generation,
            }
        )
    return merged


# ------------------------------------------------------------------------------- the status document


def utc_timestamp(seconds: float) -> str:
    """`seconds` since the epoch (a `Clock.now()`) as the status and its conditions write times down."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class VertexReading:
    """One vertex as a status write reads it from the running topology."""

    name: str
    processing_rate: float = 0.0
    #: the source's backlog, when it has one
    lag: Any = None
    #: the source's lag per partition (`control.connectors.status_lag`), when it has one
    partition_lag: Any = None


@dataclass(frozen=True)
class WorkloadReading:
    """What runs, as a status write reads it from the topology's controller."""

    selector: str
    throughput: float
    vertices: tuple[VertexReading, ...] = ()
    #: the `Last scaling` printer column's line, once there was a scaling
    last_scaling: str | None = None


@dataclass(frozen=True)
class StatusReading:
    """What one status write reads (once) of the topology's workers: the rest of the status is the facts the
    reconcile loop keeps."""

    #: nodes of the schedule the workers run (None: no schedule known)
    schedule_nodes: int | None = None
    #: the executors per vertex of that schedule
    parallelism: Mapping[str, int] = field(default_factory=dict)
    #: nodes of that schedule ready now (None: not read, the last count stands)
    ready: int | None = None
    #: None: no controller yet
    workload: WorkloadReading | None = None
    connector_error: str = ""


@dataclass(frozen=True)
class FailureCounts:
    """Failures in a row of what the reconcile loop retries, each kind its own (`StatusFacts`' counters)."""

    start: int = 0
    suspend: int = 0
    upgrade: int = 0
    scaling: int = 0


def with_failures(facts: StatusFacts, failures: FailureCounts) -> StatusFacts:
    return dataclasses.replace(
        facts,
        start_failures=failures.start,
        suspend_failures=failures.suspend,
        upgrade_failures=failures.upgrade,
        scaling_failures=failures.scaling,
    )


@dataclass(frozen=True)
class RenderedStatus:
    """`render_status`'s answer: the status subresource's content, the facts it was computed from (with what
    the reading and the attempt in progress added) and the conditions to keep for the next write."""

    status: dict[str, Any]
    facts: StatusFacts
    conditions: list[dict[str, Any]]


def render_status(
    facts: StatusFacts,
    reading: StatusReading,
    failures: FailureCounts,
    conditions: Sequence[Mapping[str, Any]],
    observed_generation: int,
    now: str,
    extra: Mapping[str, Any] | None = None,
) -> RenderedStatus:
    """The status of a topology from its facts and what was read of its workers: phase, node counts and
    conditions (a failed scaling leaves the old schedule Running, not Degraded: what must be ready is what
    runs; a suspended topology shows no node), the workload's figures, then `extra` (appliedParallelism,
    stateEpoch, the records the controller published) as given. `failures`: the attempt in progress's
    counters (`control.attempts.failure_counts`); `now`: the time a changed condition records."""
    running = reading.schedule_nodes
    ready = facts.ready_nodes if reading.ready is None else reading.ready
    parallelism: Mapping[str, int] = reading.parallelism
    if facts.suspended:  # no worker runs (the scale subresource reads 0 replicas, as when scaled to 0)
        running, ready, parallelism = None, 0, {}
    facts = dataclasses.replace(
        with_failures(facts, failures),
        ready_nodes=ready,
        desired_nodes=running if running is not None else facts.desired_nodes,
        connector_error=reading.connector_error,
    )
    merged = merge_conditions(conditions, desired_conditions(facts), now, observed_generation)
    status: dict[str, Any] = {
        "phase": phase(facts),
        "nodes": running or 0,
        "readyNodes": ready,
        "observedGeneration": observed_generation,
        "conditions": merged,
    }
    workload = reading.workload
    if workload is not None:
        vertices: list[dict[str, Any]] = []
        for vertex in workload.vertices:
            entry: dict[str, Any] = {
                "name": vertex.name,
                "parallelism": parallelism.get(vertex.name, 0),
                "processingRate": round(vertex.processing_rate, 1),
            }
            if vertex.lag is not None:
                entry["lag"] = vertex.lag
            if vertex.partition_lag is not None:
                entry["partitionLag"] = vertex.partition_lag
            vertices.append(entry)
        status.update(selector=workload.selector, throughput=round(workload.throughput, 1), vertices=vertices)
        if workload.last_scaling is not None:
            status["lastScalingSummary"] = workload.last_scaling
    status.update(extra or {})
    return RenderedStatus(status, facts, merged)
