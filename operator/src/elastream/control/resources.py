"""The Kubernetes side of the control plane, without kopf: a level-triggered reconcile loop per StreamTopology.

`ManagedTopologies.reconcile(resource)` is one pass of a topology's loop (the kopf daemon of each resource
calls it on a bounded thread pool, when woken by a change of the resource or every `tick_s`): it compares
what the resource asks for (its spec, read afresh each pass: the one place the desired state lives) with what
runs (the backend's schedule) and acts until they agree — start or adopt the worker pods, recover dead
workers, take due checkpoints, let the autoscaler decide, migrate to the spec's node count and degrees, or,
while `spec.suspend` is true, take a last checkpoint and stop the workers (and start them again from it when
it is false: no scaling, autoscaling or recovery meanwhile; a changed `spec.nodes` applies on resume). A
burst of patches settles (`settle_s`) before anything moves, so it migrates once, to the last value; a
scaling or start that fails leaves the old schedule running and is retried with backoff while it is still
wanted (a new value is tried at once). The savepoint annotations, `spec.initialSavepoint` and
`spec.deletionPolicy` are carried out through `control.savepoints` (`_savepoints`, `_start_point`, `remove`).

The status has one writer per topology (`control.status_writer`): one merge patch per change, the rates at
most every `volatile_every_s`. What it shows is computed by `core.status` from the `StatusFacts` kept here
(started, scaling, recovering, Redis away, the last failure). One shared analysis session (one Spark
session for every topology), one Redis connection. Prometheus metrics of the operator: scalings and
recoveries by outcome and their durations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from prometheus_client import Counter, Histogram

from elastream.control.backends.kubernetes import (
    KubernetesBackend,
    WorkerPodSettings,
    running_spec_of,
    selector_for,
)
from elastream.control.controller import SuspendResult, TopologyController
from elastream.control.savepoints import RedisSavepoints, SavepointError, SavepointRequests, Savepoints
from elastream.control.scaling import ScalingRecord
from elastream.control.status_writer import StatusWriter
from elastream.core.images import image_allowed, image_refusal
from elastream.core.outcomes import Outcome
from elastream.core.ports import BackendError, NotOwned, ScaleRequest, StateLost
from elastream.core.savepoints import SavepointMeta
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.status import (
    EventReason,
    StatusFacts,
    desired_conditions,
    merge_conditions,
    phase,
    stalled,
)
from elastream.core.topology import (
    API_VERSION,
    Topology,
    TopologyError,
    glob_escape,
    parse_manifest,
    topology_prefix,
)
from elastream.core.upgrade import SpecChange, spec_change
from elastream.store.acl import AclRefused, UserKeeper, delete_topology_user
from elastream.store.drains import RedisDrainRequests
from elastream.store.epoch import RedisEpoch
from elastream.store.registry import Registry

log = logging.getLogger("elastream.operator")

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "streamtopologies"
#: the annotation that answers StateLost: start over from the sources' beginning
RESTART_FROM_SCRATCH = "elastream.dev/restart-from-scratch"

SCALINGS = Counter("elastream_scalings", "scalings carried out, by direction and outcome", ["direction", "outcome"])
SCALING_SECONDS = Histogram(
    "elastream_scaling_duration_seconds",
    "request to migrated (analysis, plan, prepare, migration)",
    buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
PAUSE_SECONDS = Histogram(
    "elastream_migration_pause_seconds",
    "sources held during a migration (PREPARE sent to sources resumed)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)
#: `status.lastUpgrade.outcome`
UPGRADE_SUCCEEDED = "Upgraded"
UPGRADE_ROLLED_BACK = "RolledBack"
#: seconds between passes of a suspended topology (nothing runs; a change of the resource wakes it at once)
SUSPENDED_TICK_S = 30.0
RECOVERIES = Counter("elastream_recoveries", "rollbacks after a worker died, by outcome", ["outcome"])


def topology_from_resource(body: Mapping[str, Any]) -> Topology:
    """The resource as a `Topology` (raises `TopologyError` naming each field and fix)."""
    metadata = body.get("metadata") or {}
    document = {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", "StreamTopology"),
        "metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace", "default")},
        "spec": dict(body.get("spec") or {}),
    }
    return parse_manifest(document)


@dataclass
class ResourceApi:
    """One StreamTopology through the API: its status subresource (merge patches, the status writer's
    `send`) and `spec.nodes` (the autoscaler's writes)."""

    api: Any  # kubernetes.client.CustomObjectsApi
    namespace: str
    name: str
    #: seconds any one request may take (the API server away must not hold a reconcile for long)
    timeout_s: float = 10.0

    def patch_status(self, patch: dict[str, Any]) -> None:
        """Apply a merge patch to the status (a resource deleted meanwhile: nothing to report to)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                {"status": patch},
                _request_timeout=self.timeout_s,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def remove_annotation(self, key: str) -> None:
        try:
            self.api.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                {"metadata": {"annotations": {key: None}}},
                _request_timeout=self.timeout_s,
            )
        except Exception as exc:
            log.warning("annotation %s of %s/%s not removed: %s", key, self.namespace, self.name, exc)

    def set_nodes(self, nodes: int) -> int:
        """Write an automatic change to `spec.nodes`, as a HorizontalPodAutoscaler writes replicas: the spec
        stays the desired state. Returns the resource's new generation (0 if it could not be written)."""
        from kubernetes.client.exceptions import ApiException

        try:
            updated = self.api.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                {"spec": {"nodes": int(nodes)}},
                _request_timeout=self.timeout_s,
            )
        except Exception as exc:  # the next reconcile sees spec.nodes unchanged and moves back: say why
            if not (isinstance(exc, ApiException) and exc.status == 404):
                log.warning("spec.nodes of %s/%s not patched: %s", self.namespace, self.name, exc)
            return 0
        return int(((updated or {}).get("metadata") or {}).get("generation") or 0)


class KubernetesEvents:
    """An `EventSink` posting core/v1 Events on the resource (what `kubectl describe` shows). The same fact
    (reason and message) is not posted again within `repeat_s`; it is counted instead."""

    def __init__(self, core_api: Any, body: Mapping[str, Any], repeat_s: float = 300.0) -> None:
        metadata = body["metadata"]
        self.core_api = core_api
        self.namespace = metadata.get("namespace", "default")
        self.involved = {
            "apiVersion": body.get("apiVersion", API_VERSION),
            "kind": body.get("kind", "StreamTopology"),
            "name": metadata["name"],
            "namespace": self.namespace,
            "uid": metadata.get("uid"),
        }
        self.repeat_s = repeat_s
        self.recent: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self.recent.get((reason, message), -1e9) < self.repeat_s:
                return
            self.recent[(reason, message)] = now
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": f"{self.involved['name']}.", "namespace": self.namespace},
            "involvedObject": self.involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "elastream-operator"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        log.log(
            logging.WARNING if warning else logging.INFO,
            "%s/%s %s: %s",
            self.namespace,
            self.involved["name"],
            reason,
            message,
        )
        try:
            self.core_api.create_namespaced_event(self.namespace, event)
        except Exception as exc:  # an event that cannot be posted must not stop the operation it reports
            log.warning("event %s not posted: %s", reason, exc)


@dataclass
class NoRequests:
    """On Kubernetes a request is a change of `spec.nodes`: the handler calls `scale_to` itself."""

    def take(self) -> ScaleRequest | None:
        return None


@dataclass
class Attempt:
    """A desired state the loop tried to reach and could not (a scaling, a start): retried with backoff while
    it stays the desired state; a new desired state is tried at once."""

    target: Any
    failures: int = 0
    due: float = 0.0
    reason: str = ""


def backoff_delay(failures: int, first_s: float, cap_s: float) -> float:
    """Seconds before retry number `failures` (1, 2, ...): `first_s` doubling up to `cap_s`."""
    return float(min(cap_s, first_s * 2 ** max(0, failures - 1)))


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
    #: the savepoint annotations and `status.savepoints` (`control.savepoints`), made by the first pass
    savepoints: SavepointRequests | None = None

    @property
    def topology(self) -> Topology:
        assert self.controller is not None
        return self.controller.topology

    @property
    def backend(self) -> KubernetesBackend:
        """The controller's backend as what `ManagedTopologies` built it: worker pods."""
        assert self.controller is not None
        return cast(KubernetesBackend, self.controller.backend)

    def set(self, **changes: Any) -> None:
        self.facts = dataclasses.replace(self.facts, **changes)

    def publish(self, field_name: str, status: dict[str, Any]) -> None:
        """The controller's `StatusSink`: a record (lastScaling, lastRecovery, autoscaler) goes into the
        status through the one writer, at once (it is news, not a rate)."""
        self.published[field_name] = dict(status)
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
            status.update(
                selector=selector_for(topology),
                throughput=round(controller.live.throughput(), 1),
                vertices=[
                    {"name": v, "parallelism": parallelism.get(v, 0), "processingRate": round(rates.get(v, 0.0), 1)}
                    for v in topology.order
                ],
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


@dataclass
class ManagedTopologies:
    """Every topology this operator serves, each driven by `reconcile` (the level-triggered loop: the kopf
    daemon of each resource calls it with the resource as it is now, on a bounded pool of threads)."""

    redis_client: redis.Redis
    #: never in a repr (a log line, a traceback's locals): it may hold a password
    redis_url: str = field(repr=False)
    core_api: Any
    custom_api: Any
    analyzer: Any
    settings: WorkerPodSettings = field(default_factory=WorkerPodSettings)
    #: the worker images a topology's spec.image may name (`core.images`); empty: any
    allowed_images: tuple[str, ...] = ()
    #: a `kubernetes.client.NetworkingV1Api`, for each topology's NetworkPolicy (`settings.network_policy`)
    networking_api: Any = None
    #: a `kubernetes.client.PolicyV1Api`, for each topology's PodDisruptionBudget (`settings.disruption_budget`)
    policy_api: Any = None
    #: give each topology's workers a Redis ACL user of its own (`store.acl`); off: the operator's URL
    topology_users: bool = True
    #: sets those users again within a tick when Redis lost them, for every topology on one thread (None: only
    #: the reconcile passes look)
    user_keeper: UserKeeper | None = None
    interval_s: float = 1.0
    #: how long worker pods may take to be scheduled, started and ready
    start_timeout_s: float = 180.0
    #: seconds between passes of an idle topology (dead workers, checkpoints, the autoscaler, rates)
    tick_s: float = 2.0
    #: a changed spec is acted on once it has been still this long (a burst of patches moves once)
    settle_s: float = 1.0
    #: seconds between status writes for the rates alone
    volatile_every_s: float = 15.0
    #: a failed scaling or start of the same desired state is retried after this, doubling up to the cap
    retry_s: float = 5.0
    retry_cap_s: float = 300.0
    #: how long a delete waits for a pass in progress (a migration) before it stops the workers anyway
    delete_wait_s: float = 60.0
    #: builds the controller of a topology (tests replace it with one over in-memory fakes)
    build: Callable[[ManagedTopologies, Topology, Mapping[str, Any], ManagedTopology], TopologyController] | None = None
    #: where savepoints are kept (None: in Redis, through `redis_client`)
    savepoint_service: Savepoints | None = None
    #: the schedule the workers of a topology run, from Redis (after an operator restart: adopted)
    running_schedule: Callable[[Topology], Schedule | None] | None = None
    #: the spec the pods of a topology run (its ConfigMap's), None when there are none (tests replace it)
    running_spec: (
        Callable[[Topology, Mapping[str, Any]], tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]] | None
    ) = None
    clock: Callable[[], float] = time.monotonic
    topologies: dict[str, ManagedTopology] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def key(self, namespace: str, name: str) -> str:
        return f"{namespace}/{name}"

    def get(self, namespace: str, name: str) -> ManagedTopology | None:
        return self.topologies.get(self.key(namespace, name))

    def entry(self, body: Mapping[str, Any]) -> ManagedTopology:
        """The topology of this resource (made on first sight, its writer primed with the status it has)."""
        metadata = body["metadata"]
        namespace, name = metadata.get("namespace", "default"), metadata["name"]
        key = self.key(namespace, name)
        with self._lock:
            managed = self.topologies.get(key)
            if managed is None:
                resource = ResourceApi(self.custom_api, namespace, name)
                writer = StatusWriter(resource.patch_status, volatile_every_s=self.volatile_every_s, clock=self.clock)
                writer.prime(body.get("status"))
                managed = ManagedTopology(key, writer, KubernetesEvents(self.core_api, body), resource)
                managed.conditions = list((body.get("status") or {}).get("conditions") or [])
                managed.state_epoch = (body.get("status") or {}).get("stateEpoch") or None
                applied = (body.get("status") or {}).get("appliedParallelism")
                if isinstance(applied, Mapping):
                    managed.applied_parallelism = {str(v): int(k) for v, k in applied.items()}
                observed = (body.get("status") or {}).get("observedGeneration")
                managed.observed_generation = observed if isinstance(observed, int) else 0
                upgrade = (body.get("status") or {}).get("lastUpgrade")
                if isinstance(upgrade, Mapping):  # a rolled-back generation is not tried again after a restart
                    managed.published["lastUpgrade"] = dict(upgrade)
                    if upgrade.get("outcome") == UPGRADE_ROLLED_BACK and isinstance(upgrade.get("generation"), int):
                        managed.rolled_back_generation = upgrade["generation"]
                self.topologies[key] = managed
        return managed

    # ------------------------------------------------------------------------------------------ the loop

    def reconcile(self, body: Mapping[str, Any]) -> float:
        """One pass of the loop for this resource (as it is now): start it if it does not run, recover dead
        workers, take due checkpoints, let the autoscaler decide, move to the spec's node count and degrees
        if they differ from what runs, write the status if it changed. Returns the seconds until the next
        pass is due (a change of the resource wakes it sooner). Never raises for a fault of Redis, the API
        server or a pod: those are conditions and events, and the next pass tries again."""
        managed = self.entry(body)
        if not managed.lock.acquire(timeout=1.0):
            return 1.0  # a delete (or a pass of another thread) holds it
        try:
            return self._reconcile(managed, body)
        except Exception as exc:  # a bug must not stop the loop of every later pass: say it, back off
            log.exception("reconcile of %s failed", managed.key)
            managed.set(backend_error=f"internal error: {type(exc).__name__}: {exc}")
            managed.write()
            return self.retry_s
        finally:
            managed.lock.release()

    def _reconcile(self, managed: ManagedTopology, body: Mapping[str, Any]) -> float:
        now = self.clock()
        metadata = body["metadata"]
        managed.generation = int(metadata.get("generation") or 0)
        spec = dict(body.get("spec") or {})
        try:
            # parsed before anything else walks the spec: a spec too deep or too big (an alias bomb) is one
            # InvalidSpec line, where comparing it with the last one would have ended in RecursionError
            wanted = topology_from_resource(body)
            image = str(wanted.spec.get("image") or "")
            if image and not image_allowed(image, self.allowed_images):
                # before anything is created: no pod of a refused image, no ConfigMap or Secret for it
                raise TopologyError([image_refusal(image, self.allowed_images)])
        except TopologyError as exc:
            message = invalid_spec_message(exc)
            managed.set(invalid_spec=message)
            if managed.invalid_reported != message:
                managed.invalid_reported = message
                managed.events.emit(EventReason.INVALID_SPEC, message, warning=True)
            managed.observed_generation = managed.generation  # judged: only a new spec moves it on
            managed.write()
            return 30.0  # nothing to do until the spec changes (which wakes the loop)
        if spec != managed.spec:
            managed.spec, managed.spec_changed_at = spec, now
        managed.set(invalid_spec="")
        managed.invalid_reported = ""
        if (metadata.get("annotations") or {}).get(RESTART_FROM_SCRATCH) == "true":
            self._restart_from_scratch(managed)
        if managed.controller is None:
            running, interrupted = self._running_topology(wanted, metadata)
            if interrupted is not None:
                delay = self._take_over_interrupted_upgrade(managed, body, interrupted, now)
            else:
                delay = self._start(managed, body, running, now)
            if delay is not None:
                return delay
        controller = managed.controller
        assert controller is not None
        self._savepoints(managed, metadata)
        if wanted.suspend:
            delay = self._suspend(managed, now)
            if managed.facts.suspended:  # suspended as asked: the rest of the spec applies on resume
                managed.observed_generation = managed.generation
                managed.write()
            return delay
        if managed.attempt is not None and managed.attempt.target == "suspend":
            managed.attempt = None  # the suspend is no longer asked for: nothing was stopped, nothing to retry
        managed.set(suspending="")
        self._check_redis_user(managed)  # before a resume too: the workers that start must find their user
        if controller.suspended and not self._upgrade_due(managed, controller.topology, wanted):
            delay = self._resume(managed, now)
            if delay is not None:
                return delay
        delay = self._apply_spec(managed, body, wanted, now)
        if delay is not None:
            return delay
        controller = managed.controller
        assert controller is not None
        self._apply_settings(managed, wanted)
        before = controller.last_recovery
        self.report_pending(managed, _look(managed.backend.pending_nodes, {}))
        failed = _look(managed.backend.failed_nodes, {})
        if failed:
            managed.set(worker_lost="; ".join(failed.values()), recovering=True)
            managed.write()
        controller.tick()
        self._note_store(managed)
        managed.set(state_lost=controller.state_lost, backend_error="")  # this pass went through
        recovery = controller.last_recovery
        if recovery is not None and recovery is not before:
            RECOVERIES.labels(str(recovery.get("outcome"))).inc()
        if not _look(managed.backend.failed_nodes, failed):
            managed.set(worker_lost="", recovering=False)
        converged = False
        delay = self._converge(managed, wanted, now)
        change = spec_change(controller.topology, wanted)
        if (
            managed.generation >= managed.expect_generation
            and not controller.state_lost
            and not (change.needs_restart or change.controller)  # an upgrade still to come (Redis away, settling)
        ):
            converged = wanted.nodes == len(controller.backend.current_schedule().nodes) and (
                wanted.scaling.auto.enabled or spec_parallelism(wanted) == managed.applied_parallelism
            )
        if converged or stalled(managed.facts) is not None:
            # applied, or only the user can move it on: either way this generation is what the status is about
            managed.observed_generation = managed.generation
        managed.write()
        return min(self.tick_s, delay)

    def _start(self, managed: ManagedTopology, body: Mapping[str, Any], topology: Topology, now: float) -> float | None:
        """Build and start the controller (or adopt the pods an earlier operator left); None when it runs,
        else the seconds until the next try (a failed start backs off)."""
        attempt = managed.attempt
        if attempt is not None and attempt.target == "start" and now < attempt.due:
            return attempt.due - now
        if not (managed.writer.written or {}).get("phase"):
            managed.write()  # a new topology: Pending / Starting, before the pods' start holds this pass
        build = self.build or ManagedTopologies._build
        controller = build(self, topology, body["metadata"], managed)
        self.analyzer.start_warm_up(topology)
        try:
            # after an operator restart the running schedule is in Redis: adopt it rather than start over
            schedule = (self.running_schedule or self._registry_schedule)(topology)
            schedule, restored = self._start_point(managed, controller, schedule)
            if topology.suspend:
                # no worker starts; those of an interrupted suspend are adopted, and the pass suspends them
                if controller.start_suspended(schedule):
                    managed.set(suspended=True, suspended_at=controller.resume_point or "")
            else:
                controller.start(schedule)
        except StateLost as exc:
            with contextlib.suppress(Exception):
                controller.close(stop_workers=False)  # the workers run on, in memory, until the user decides
            managed.set(state_lost=str(exc))
            managed.write()
            return self.tick_s
        except SavepointError as exc:
            with contextlib.suppress(Exception):
                controller.close()
            if exc.retry:  # not there (yet): retried with backoff, StartFailed saying what is missing
                delay = self._start_failed(managed, "start", exc, now)
                managed.write()
                return delay
            message = str(exc)  # the user's to fix: InvalidSpec naming spec.initialSavepoint
            managed.set(invalid_spec=message)
            if managed.invalid_reported != message:
                managed.invalid_reported = message
                managed.events.emit(EventReason.INVALID_SPEC, message, warning=True)
            managed.write()
            return 30.0
        except (BackendError, redis.RedisError, AclRefused) as exc:
            delay = self._start_failed(managed, "start", exc, now)
            with contextlib.suppress(Exception):  # what started of it goes; the next try starts afresh
                controller.close()
            managed.write()
            return delay
        managed.controller = controller
        managed.attempt = None
        if restored is not None:
            managed.events.emit(
                EventReason.RESTORED_FROM_SAVEPOINT,
                f"started from savepoint {restored.name} of {restored.namespace}/{restored.topology} "
                f"(checkpoint {restored.checkpoint}, taken {restored.taken_at})",
            )
        if managed.applied_parallelism is None:
            managed.applied_parallelism = spec_parallelism(topology)
        managed.set(
            started=True, backend_error="", redis_unavailable="", state_lost="", not_owned="", redis_user_refused=""
        )
        return None

    def _start_point(
        self, managed: ManagedTopology, controller: TopologyController, schedule: Schedule | None
    ) -> tuple[Schedule | None, SavepointMeta | None]:
        """Where a topology the controller does not run yet starts: with no state of its own, from its
        `spec.initialSavepoint` (seeded as its latest checkpoint: the start restores from it); a new resource
        over the state an earlier one of its name retained continues from that (said in an event). Returns
        the schedule to start (one whose workers are gone restores the latest checkpoint) and the savepoint
        used; raises `SavepointError` or `redis.RedisError`."""
        topology = controller.topology
        if managed.state_epoch is None and topology.initial_savepoint is None:
            found = controller.epochs.read() if controller.epochs is not None else None
            # the first try only: a failed start of this resource leaves an epoch of its own
            if found is not None and schedule is not None and managed.attempt is None:
                managed.events.emit(
                    EventReason.RETAINED_STATE_ADOPTED,
                    f"Redis holds the state of an earlier topology named {topology.name} (epoch {found}, kept by "
                    "deletionPolicy Retain): this one continues from it; to start empty, delete this topology with "
                    "deletionPolicy Delete and create it again",
                    warning=True,
                )
            return schedule, None
        if topology.initial_savepoint is None or schedule is not None:
            return schedule, None
        service = self.savepoints()
        used = service.restore(topology)
        if used is None and not service.has_checkpoint(topology):
            return None, None  # state of its own and no checkpoint yet: an ordinary start
        # seeded now, or by a start that stopped before its workers registered: restored from it
        return initial_schedule(topology), used

    def _back_off(self, managed: ManagedTopology, target: Any, reason: str, now: float) -> tuple[int, float]:
        """Another failure to reach `target` (a start, resume, suspend, upgrade or scaling): counted on from the
        attempt at the same target, else from 1, and due again after the backoff. Returns (failures, delay)."""
        attempt = managed.attempt
        failures = attempt.failures + 1 if attempt is not None and attempt.target == target else 1
        delay = backoff_delay(failures, self.retry_s, self.retry_cap_s)
        managed.attempt = Attempt(target, failures, now + delay, reason)
        return failures, delay

    def _start_failed(self, managed: ManagedTopology, target: str, exc: Exception, now: float) -> float:
        """A start (or a resume: `target`) failed: note why in the facts, say it in an event, back off.
        Returns the seconds until the next try."""
        _, delay = self._back_off(managed, target, str(exc), now)
        if isinstance(exc, redis.RedisError):
            managed.set(redis_unavailable=f"{type(exc).__name__}: {exc}")
        elif isinstance(exc, NotOwned):  # someone else's object in the way: untouched, said once
            managed.set(not_owned=str(exc))
        elif isinstance(exc, AclRefused):  # no worker starts without its user: the fix is the operator's
            managed.set(redis_user_refused=str(exc))
        else:
            managed.set(backend_error=str(exc))
        if isinstance(exc, NotOwned):
            managed.events.emit(EventReason.OBJECT_NOT_OWNED, str(exc), warning=True)
        elif isinstance(exc, AclRefused):
            managed.events.emit(EventReason.REDIS_USER_REFUSED, str(exc), warning=True)
        else:
            what = "resuming" if target == "resume" else "starting"
            managed.events.emit(EventReason.START_FAILED, f"{what}: {exc}; retrying in {delay:.0f} s", warning=True)
        return delay

    def _suspend(self, managed: ManagedTopology, now: float) -> float:
        """`spec.suspend` is true: take the last checkpoint and stop the workers (`TopologyController.suspend`),
        or, once done, keep the status saying Suspended. Nothing else of the pass runs: no recovery, no
        scaling, no autoscaler (a changed spec.nodes is kept in the spec and applies on resume). A
        checkpoint that fails stops nothing; it is retried with backoff, Reconciling (Suspending) saying
        why, Stalled (SuspendFailed) after `STALL_AFTER_FAILURES` in a row. The pass waits for nothing else:
        a scaling runs within a pass, so none is in flight here; one a dead controller left is finished or
        rolled back by the suspend first."""
        controller = managed.controller
        assert controller is not None
        if controller.suspended:
            controller.check_state()
            managed.set(
                suspended=True,
                suspended_at=controller.resume_point or "",
                suspending="",
                state_lost=controller.state_lost,
            )
            managed.write()
            return SUSPENDED_TICK_S
        attempt = managed.attempt
        if attempt is not None and attempt.target == "suspend" and now < attempt.due:
            managed.write()
            return attempt.due - now
        if not managed.facts.suspending:
            managed.set(suspending="taking the last checkpoint before stopping the workers")
            managed.write()
        result = controller.suspend()
        self._note_store(managed)
        managed.set(state_lost=controller.state_lost)
        if not result.done and controller.state_lost:
            # no checkpoint can be written over a lost state, and stopping would lose what the workers hold:
            # the workers run on, Stalled (StateLost) says what the user must decide
            managed.set(suspending="the topology's state in Redis is lost: nothing is stopped")
            managed.write()
            return self.tick_s
        if not result.done:
            _, delay = self._back_off(managed, "suspend", result.reason, self.clock())
            managed.set(suspending=f"{result.reason}; the workers run on, retrying in {delay:.0f} s")
            managed.events.emit(
                EventReason.SUSPEND_BACKOFF,
                f"suspend: {result.reason}; nothing was stopped, retrying in {delay:.0f} s",
                warning=True,
            )
            managed.write()
            return delay
        managed.attempt = None
        managed.set(
            suspended=True,
            suspended_at=result.checkpoint_id or "",
            suspending="",
            scaling_failed="",
            worker_lost="",
            recovering=False,
            pending="",
        )
        managed.write()
        return SUSPENDED_TICK_S

    def _resume(self, managed: ManagedTopology, now: float) -> float | None:
        """`spec.suspend` is false again: start the workers from the suspend's checkpoint
        (`TopologyController.resume`); None when they run, else the seconds until the next try (a failed
        resume backs off as a failed start does; Redis away is RedisUnavailable, a lost state StateLost)."""
        controller = managed.controller
        assert controller is not None
        attempt = managed.attempt
        if attempt is not None and attempt.target == "resume" and now < attempt.due:
            return attempt.due - now
        # not Suspended any more: Resuming until the workers run (a failed try stays so, saying why)
        managed.set(suspended=False, suspended_at="", resuming=True)
        managed.write()
        try:
            controller.resume()
        except StateLost as exc:
            managed.set(state_lost=str(exc))
            managed.write()
            return self.tick_s
        except (BackendError, redis.RedisError, AclRefused) as exc:
            delay = self._start_failed(managed, "resume", exc, now)
            managed.write()
            return delay
        managed.attempt = None
        # the scaling asked while suspended (spec.nodes, degrees) is converged to at once, with no settling
        managed.spec_changed_at = min(managed.spec_changed_at, now - self.settle_s)
        managed.set(
            resuming=False,
            backend_error="",
            redis_unavailable="",
            state_lost="",
            not_owned="",
            redis_user_refused="",
        )
        return None

    def _check_redis_user(self, managed: ManagedTopology) -> None:
        """The topology's Redis user is there (one ACL GETUSER per Redis node), set again when Redis lost it (a
        restart without an ACL file): before the pass ticks, so workers waiting out a refused password get back
        in. Redis away is the controller's tick's to note (RedisUnavailable); ACL commands refused are the
        RedisUserRefused condition and one event."""
        try:
            managed.backend.ensure_redis_user()
        except AclRefused as exc:
            if managed.facts.redis_user_refused != str(exc):
                managed.events.emit(EventReason.REDIS_USER_REFUSED, str(exc), warning=True)
            managed.set(redis_user_refused=str(exc))
            return
        except redis.RedisError as exc:
            log.debug("Redis user of %s not checked: %s", managed.key, exc)
            return
        managed.set(redis_user_refused="")

    def _restart_from_scratch(self, managed: ManagedTopology) -> None:
        """The user's answer to StateLost (the annotation): stop the workers, delete what is left of the
        topology's keys, forget its epoch; the pass goes on to start it anew, sources from their beginning.
        The annotation is removed. Without StateLost it is only removed (it must not wipe a healthy
        topology by accident)."""
        if managed.facts.state_lost:
            controller = managed.controller
            prefix = controller.topology.redis_prefix if controller is not None else None
            if controller is not None:
                with contextlib.suppress(Exception):
                    controller.close()
                managed.controller = None
            if prefix is None:
                namespace, name = managed.key.split("/", 1)
                prefix = topology_prefix(namespace, name)
            delete_keys(self.redis_client, prefix)
            managed.state_epoch = None
            managed.published.clear()
            managed.set(state_lost="", started=False)
            managed.events.emit(
                EventReason.STATE_RESET,
                "restarting from scratch as annotated: state and positions start empty",
                warning=True,
            )
        else:
            managed.events.emit(
                EventReason.STATE_RESET, f"{RESTART_FROM_SCRATCH} ignored: the topology's state is not lost"
            )
        managed.resource.remove_annotation(RESTART_FROM_SCRATCH)

    def _apply_settings(self, managed: ManagedTopology, wanted: Topology) -> None:
        """What of a changed spec applies without moving executors: `scaling.auto` (the autoscaler's switch,
        bounds and thresholds), now, and the vertices' degrees into the running model (`_converge` migrates
        to them). The rest is `_apply_spec`'s."""
        controller = managed.controller
        assert controller is not None
        running = controller.topology
        scaling = dataclasses.replace(running.scaling, auto=wanted.scaling.auto)
        same_shape = [_without_parallelism(v) for v in running.spec.get("vertices") or []] == [
            _without_parallelism(v) for v in wanted.spec.get("vertices") or []
        ]
        if scaling != running.scaling or (same_shape and running.vertices != wanted.vertices):
            controller.topology = dataclasses.replace(
                running,
                scaling=scaling,
                spec={**running.spec, "scaling": wanted.spec.get("scaling"), "vertices": wanted.spec.get("vertices")}
                if same_shape
                else {**running.spec, "scaling": wanted.spec.get("scaling")},
                vertices=wanted.vertices if same_shape else running.vertices,
            )

    # ---------------------------------------------------------------------------------- stateful upgrades

    def _running_topology(self, wanted: Topology, metadata: Mapping[str, Any]) -> tuple[Topology, Topology | None]:
        """When the operator takes a topology over: (what its pods run, the spec of an upgrade in flight started
        from, or None), from its ConfigMap (written with every start, upgrade and schedule), so a spec changed
        while no operator ran is applied by the upgrade path rather than assumed, and an interrupted upgrade
        can still go back. The wanted one when there is none (a new topology) or it cannot be read or parsed
        (then the start says what is wrong)."""
        read = self.running_spec or self._configmap_spec
        try:
            running_doc, previous_doc = read(wanted, metadata)
        except Exception as exc:  # the API server away: the start itself will wait and say so
            log.debug("running spec of %s/%s not read: %s", wanted.namespace, wanted.name, exc)
            return wanted, None

        def parsed(document: Mapping[str, Any] | None) -> Topology | None:
            if document is None:
                return None
            try:
                found = parse_manifest(
                    {**document, "metadata": {"name": wanted.name, "namespace": wanted.namespace}}, bounded=True
                )
            except TopologyError as exc:
                log.warning("%s/%s: a spec in its ConfigMap does not parse (%s)", wanted.namespace, wanted.name, exc)
                return None
            image = str(found.spec.get("image") or "")
            if image and not image_allowed(image, self.allowed_images):
                # the ConfigMap is in the tenant's namespace: it must not bring in what the spec may not
                log.warning(
                    "%s/%s: a spec in its ConfigMap names an image outside the allowed ones; ignored",
                    wanted.namespace,
                    wanted.name,
                )
                return None
            return dataclasses.replace(found, suspend=wanted.suspend)

        return parsed(running_doc) or wanted, parsed(previous_doc)

    def _configmap_spec(
        self, wanted: Topology, metadata: Mapping[str, Any]
    ) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
        return running_spec_of(self.core_api, wanted, {"name": metadata["name"], "uid": metadata.get("uid", "")})

    def _upgrade_due(self, managed: ManagedTopology, running: Topology, wanted: Topology) -> bool:
        """Whether the wanted spec is a stateful upgrade of `running` still to be tried."""
        change = spec_change(running, wanted)
        return change.needs_restart and not change.refused and managed.rolled_back_generation != managed.generation

    def _take_over_interrupted_upgrade(
        self, managed: ManagedTopology, body: Mapping[str, Any], previous: Topology, now: float
    ) -> float | None:
        """The ConfigMap says an upgrade from `previous` was in flight when the last operator stopped: its pods
        (new ones starting, or the previous spec's not stopped yet) are stopped, and a controller of the
        previous spec is taken over stopped, at the latest checkpoint. The pass then upgrades again from that
        checkpoint (rolling back to `previous` if that fails), or resumes `previous` if the spec went back."""
        build = self.build or ManagedTopologies._build
        controller = build(self, previous, body["metadata"], managed)
        try:
            controller.backend.stop_workers()
            controller.start_suspended(None)
        except StateLost as exc:
            managed.set(state_lost=str(exc))
            managed.write()
            return self.tick_s
        except (BackendError, redis.RedisError, AclRefused) as exc:
            with contextlib.suppress(Exception):
                controller.close(stop_workers=False)
            delay = self._start_failed(managed, "start", exc, now)
            managed.write()
            return delay
        controller.suspended = True  # whatever ran was stopped: the restore starts it
        managed.controller = controller
        managed.attempt = None
        managed.set(started=True, backend_error="", redis_unavailable="")
        managed.events.emit(
            EventReason.UPGRADE_STARTED,
            "an upgrade was in flight when the operator restarted: its pods were stopped, it starts again from "
            f"checkpoint {controller.resume_point or '(none)'}",
            warning=True,
        )
        return None

    def _apply_spec(
        self, managed: ManagedTopology, body: Mapping[str, Any], wanted: Topology, now: float
    ) -> float | None:
        """The changes of the spec that do not apply in place (`core.upgrade`): scaling settings rebuild the
        operator's side of the topology (its pods run on); the rest is a stateful upgrade. A change no
        checkpoint can carry is refused (Stalled, UpgradeRefused). Returns the seconds until the next pass
        when this one must end here, None to go on."""
        controller = managed.controller
        assert controller is not None
        change = spec_change(controller.topology, wanted)
        managed.set(upgrade_refused="; ".join(change.refused))
        if change.refused:
            if managed.refused_reported != managed.generation:
                managed.refused_reported = managed.generation
                managed.events.emit(
                    EventReason.UPGRADE_REFUSED,
                    f"generation {managed.generation} not applied, the previous spec runs on: "
                    + "; ".join(change.refused),
                    warning=True,
                )
            return None
        if not change.needs_restart:
            managed.rolled_back_generation = 0
            managed.set(upgrade_failed="")
            return self._rebuild(managed, body, wanted, change, now) if change.controller else None
        if managed.rolled_back_generation == managed.generation:
            last = managed.published.get("lastUpgrade") or {}
            managed.set(upgrade_failed=str(last.get("reason") or f"generation {managed.generation} was rolled back"))
            return None
        if controller.store_error or controller.state_lost:
            return None  # nothing can be checkpointed: the upgrade waits (RedisUnavailable / StateLost say why)
        settle = managed.spec_changed_at + self.settle_s - now
        if settle > 0:
            return settle
        attempt = managed.attempt
        if attempt is not None and attempt.target == "upgrade" and now < attempt.due:
            return attempt.due - now
        return self._upgrade(managed, body, wanted, change, now)

    def _rebuild(
        self, managed: ManagedTopology, body: Mapping[str, Any], wanted: Topology, change: SpecChange, now: float
    ) -> float | None:
        """Scaling settings (strategy, migration protocol, window, checkpoint interval) changed: the controller
        is built again with them and adopts the running pods, as after an operator restart."""
        settle = managed.spec_changed_at + self.settle_s - now
        if settle > 0:
            return settle
        old = managed.controller
        assert old is not None
        managed.state_epoch = old.epoch or managed.state_epoch
        old.close(stop_workers=False)
        managed.controller = None
        delay = self._start(managed, body, wanted, now)
        if delay is None:
            managed.events.emit(
                EventReason.UPGRADED,
                f"generation {managed.generation}: {', '.join(change.controller)} applied; the pods run on",
            )
        return delay

    def _upgrade(
        self, managed: ManagedTopology, body: Mapping[str, Any], wanted: Topology, change: SpecChange, now: float
    ) -> float | None:
        """A stateful upgrade: a checkpoint of the running workers (`TopologyController.suspend`), the old pods
        stopped, a controller of the wanted spec whose pods start from that checkpoint (the recovery's restore:
        kept vertices' key groups carry their state, exactly-once sinks' output staged after it discarded).
        A checkpoint that fails stops nothing and is retried with backoff. New pods that do not start within
        the worker start timeout are stopped and the previous spec's pods start again from the same checkpoint
        (`_roll_back`). Returns None when the pass may go on with the new controller."""
        old = managed.controller
        assert old is not None
        generation = managed.generation
        started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if not managed.facts.upgrading:
            managed.events.emit(
                EventReason.UPGRADE_STARTED,
                f"generation {generation}: {change.describe()}: a checkpoint, then the old pods stop and new ones "
                "start from it",
            )
        managed.set(upgrading=f"generation {generation}: taking a checkpoint of the running workers")
        managed.write()
        try:
            old.backend.record_upgrade(old.topology)  # type: ignore[attr-defined]
        except BackendError as exc:
            result = SuspendResult(False, reason=f"the upgrade could not be recorded: {exc}")
        else:
            result = old.suspend(announce=False)
        self._note_store(managed)
        if not result.done:
            _, delay = self._back_off(managed, "upgrade", result.reason, self.clock())
            managed.set(
                upgrading=f"generation {generation}: {result.reason}; the old pods run on, retrying in {delay:.0f} s"
            )
            managed.events.emit(
                EventReason.UPGRADE_BACKOFF,
                f"generation {generation}: {result.reason}; nothing was stopped, retrying in {delay:.0f} s",
                warning=True,
            )
            managed.write()
            return delay
        managed.attempt = None
        checkpoint = result.checkpoint_id
        managed.state_epoch = old.epoch or managed.state_epoch
        with contextlib.suppress(Exception):
            old.close(stop_workers=False)  # its workers are stopped: only the metric archive's last pass is left
        for vertex in change.removed:
            managed.events.emit(
                EventReason.STATE_DROPPED,
                f"vertex {vertex} is not in generation {generation}: its state in checkpoint {checkpoint} is dropped",
                warning=True,
            )
        managed.set(
            upgrading=f"generation {generation}: starting the new pods from checkpoint {checkpoint or '(none)'}"
        )
        managed.write()
        try:
            controller, report = self._restart_as(managed, body, wanted, f"upgrading to generation {generation}")
        except (BackendError, redis.RedisError, AclRefused, StateLost) as exc:
            return self._roll_back(managed, body, old.topology, change, str(exc), checkpoint, started_at)
        managed.controller = controller
        managed.applied_parallelism = spec_parallelism(wanted)
        replayed = report.replayed if report is not None else 0
        self._upgrade_done(controller)
        managed.set(upgrading="", upgrade_failed="", started=True, backend_error="", scaling_failed="", suspended=False)
        managed.published["lastUpgrade"] = {
            "generation": generation,
            "outcome": UPGRADE_SUCCEEDED,
            "changes": change.describe(),
            "checkpoint": checkpoint or "",
            "replayed": replayed,
            "startedAt": started_at,
            "finishedAt": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        managed.events.emit(
            EventReason.UPGRADED,
            f"generation {generation} runs: started from checkpoint {checkpoint or '(none: the sources beginning)'}, "
            f"{replayed} events replayed",
        )
        managed.write()
        return None

    @staticmethod
    def _upgrade_done(controller: TopologyController) -> None:
        """The ConfigMap's record of the upgrade goes (its pods run); a failure only leaves it for the next
        operator to find, which then restarts the upgrade from the latest checkpoint: logged, not raised."""
        try:
            controller.backend.record_upgrade(None)  # type: ignore[attr-defined]
        except BackendError as exc:
            log.warning("the record of a finished upgrade was not removed: %s", exc)

    def _restart_as(
        self, managed: ManagedTopology, body: Mapping[str, Any], topology: Topology, why: str
    ) -> tuple[TopologyController, Any]:
        """A controller of `topology` whose pods start from the latest checkpoint (none runs now). On failure its
        pods are stopped and the error raised."""
        build = self.build or ManagedTopologies._build
        controller = build(self, topology, body["metadata"], managed)
        self.analyzer.start_warm_up(topology)
        try:
            controller.start_suspended(None)
            report = controller.restart_from_checkpoint(why)
        except Exception:
            with contextlib.suppress(Exception):
                # first: a rollback must not finish this restore, it starts from the same checkpoint afresh
                controller.migrator.abandon_restore()
            with contextlib.suppress(Exception):
                controller.close()
            raise
        return controller, report

    def _roll_back(
        self,
        managed: ManagedTopology,
        body: Mapping[str, Any],
        previous: Topology,
        change: SpecChange,
        reason: str,
        checkpoint: str | None,
        started_at: str,
    ) -> float:
        """The upgrade's new pods did not start: the previous spec's pods start again from the upgrade's
        checkpoint (nothing ran after it). The generation is Stalled (UpgradeFailed) and not tried again until
        the spec changes. When even that restore fails, a suspended controller of the previous spec is kept:
        the resume path retries it with backoff."""
        generation = managed.generation
        managed.events.emit(
            EventReason.UPGRADE_FAILED,
            f"generation {generation}'s pods did not start: {reason}; rolling back to the previous spec",
            warning=True,
        )
        message = (
            f"the upgrade to generation {generation} ({change.describe()}) was rolled back: its pods did not "
            f"start ({reason}); the previous spec runs from checkpoint {checkpoint or '(none)'}. Fix the spec: a "
            "new generation is applied at once"
        )
        managed.rolled_back_generation = generation
        managed.published["lastUpgrade"] = {
            "generation": generation,
            "outcome": UPGRADE_ROLLED_BACK,
            "changes": change.describe(),
            "checkpoint": checkpoint or "",
            "reason": message,
            "startedAt": started_at,
            "finishedAt": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        try:
            controller, _ = self._restart_as(managed, body, previous, "rolling back a failed upgrade")
        except (BackendError, redis.RedisError, AclRefused, StateLost) as exc:
            build = self.build or ManagedTopologies._build
            controller = build(self, previous, body["metadata"], managed)
            with contextlib.suppress(Exception):
                controller.start_suspended(None)
            controller.suspended = True  # the next pass's resume starts it, with backoff
            managed.controller = controller
            delay = self._start_failed(managed, "resume", exc, self.clock())
            managed.set(upgrading="", upgrade_failed=message, resuming=True)
            managed.write()
            return delay
        managed.controller = controller
        self._upgrade_done(controller)
        managed.set(upgrading="", upgrade_failed=message, backend_error="", started=True, suspended=False)
        managed.events.emit(EventReason.UPGRADE_ROLLED_BACK, message, warning=True)
        managed.write()
        return self.tick_s

    def _converge(self, managed: ManagedTopology, wanted: Topology, now: float) -> float:
        """Move what runs towards the spec: its node count, and its vertices' degrees when the spec's changed.
        Returns the seconds until this needs another look."""
        controller = managed.controller
        assert controller is not None
        if managed.generation < managed.expect_generation or controller.store_error or controller.state_lost:
            # our own write of spec.nodes is not seen yet / Redis away / its state gone: nothing may move
            return self.tick_s
        schedule = controller.backend.current_schedule()
        degrees = spec_parallelism(wanted)
        parallelism = degrees if degrees != managed.applied_parallelism and not wanted.scaling.auto.enabled else None
        if wanted.nodes == len(schedule.nodes) and parallelism is None:
            if managed.attempt is not None and managed.attempt.target != "start":
                managed.attempt = None  # undone meanwhile: nothing to retry
                managed.set(scaling_failed="")
            return self.tick_s
        settle = managed.spec_changed_at + self.settle_s - now
        if settle > 0:
            return settle
        target = (wanted.nodes, tuple(sorted(parallelism.items())) if parallelism else None)
        attempt = managed.attempt
        if attempt is not None and attempt.target == target and now < attempt.due:
            return attempt.due - now
        trigger = "spec" if parallelism is not None and wanted.nodes == len(schedule.nodes) else "request"
        record = self.scale(managed, wanted.nodes, parallelism, trigger)
        if record.outcome == Outcome.FAILED:
            failures, delay = self._back_off(managed, target, record.reason, self.clock())
            managed.events.emit(
                EventReason.SCALING_BACKOFF,
                f"scaling to {wanted.nodes} nodes failed {failures} time(s); the old schedule runs on; "
                f"retrying in {delay:.0f} s (a new spec is tried at once)",
                warning=True,
            )
            return delay
        managed.attempt = None
        if parallelism is not None:
            managed.applied_parallelism = dict(parallelism)
        return self.tick_s

    def scale(
        self,
        managed: ManagedTopology,
        nodes: int,
        parallelism: Mapping[str, int] | None = None,
        trigger: str = "request",
    ) -> ScalingRecord:
        """Analyse, plan, migrate to `nodes` (and `parallelism`); the status shows Scaling meanwhile."""
        controller = managed.controller
        assert controller is not None
        managed.set(scaling=True)
        managed.write()
        try:
            record = controller.scale_to(nodes, parallelism, trigger)
        finally:
            managed.set(scaling=False)
        self._note_store(managed)
        managed.set(scaling_failed="" if record.outcome != Outcome.FAILED else record.reason)
        SCALINGS.labels(record.direction, record.outcome).inc()
        if record.finished_at is not None:
            SCALING_SECONDS.observe(record.finished_at - record.started_at)
        pause = record.report.get("pauseMs")
        if isinstance(pause, int | float):
            PAUSE_SECONDS.observe(pause / 1000.0)
        return record

    def _note_store(self, managed: ManagedTopology) -> None:
        controller = managed.controller
        if controller is None:
            return
        down_since = controller.store_down_since
        managed.set(
            redis_unavailable=controller.store_error,
            redis_down_s=0.0 if down_since is None else max(0.0, controller.clock.now() - down_since),
        )

    def _registry_schedule(self, topology: Topology) -> Schedule | None:
        found = Registry(self.redis_client, topology.redis_prefix).schedule()
        return found[1] if found is not None else None

    def _build(self, topology: Topology, metadata: Mapping[str, Any], managed: ManagedTopology) -> TopologyController:
        from elastream.control.checkpoints import CheckpointDriver, Checkpointer
        from elastream.control.metrics import StreamMetricSource
        from elastream.control.migration import MigrationDriver
        from elastream.store.metric_stream import MetricStream

        client = self.redis_client
        backend = KubernetesBackend(
            topology,
            client,
            self.core_api,
            {"name": metadata["name"], "uid": metadata["uid"]},
            self.redis_url,
            self.settings,
            self.start_timeout_s,
            networking=self.networking_api,
            policy=self.policy_api,
            topology_users=self.topology_users,
            user_keeper=self.user_keeper,
        )
        migrator = MigrationDriver(topology, backend, client, topology.scaling.migration, events=managed.events)  # type: ignore[arg-type]
        checkpoints = CheckpointDriver(topology, backend, client, identity=migrator.identity)
        controller = TopologyController(
            topology=topology,
            backend=backend,
            metrics=StreamMetricSource(client, topology, self.analyzer, self.interval_s),
            migrator=migrator,
            feed=MetricStream(client, topology.redis_prefix),
            requests=NoRequests(),
            status=managed,
            events=managed.events,
            background=[Checkpointer(checkpoints, float(topology.scaling.checkpoint_interval_s), own_thread=False)],
            checkpoints=checkpoints,
            interval_s=self.interval_s,
            on_nodes_changed=lambda nodes: self._autoscaled(managed, nodes),
            epochs=RedisEpoch(client, topology.redis_prefix),
            expected_epoch=managed.state_epoch,
            drains=RedisDrainRequests(client, topology.redis_prefix),
        )
        migrator.on_redis = controller.note_store
        backend.on_waiting = lambda pending: self.report_pending(managed, pending, write=True)
        return controller

    def savepoints(self) -> Savepoints:
        return self.savepoint_service or RedisSavepoints(self.redis_client)

    def _savepoints(self, managed: ManagedTopology, metadata: Mapping[str, Any]) -> None:
        """Carry out the savepoint annotations (`control.savepoints.SavepointRequests`) and keep
        `status.savepoints` (once there is one) as Redis lists them."""
        if managed.savepoints is None:
            managed.savepoints = SavepointRequests(
                self.savepoints(),
                managed.events,
                managed.resource.remove_annotation,
                retry_s=self.retry_s,
                retry_cap_s=self.retry_cap_s,
                clock=self.clock,
            )
        assert managed.controller is not None
        managed.savepoints.reconcile(managed.controller, metadata.get("annotations") or {})
        entries = managed.savepoints.entries
        if entries is not None and (entries or "savepoints" in managed.published):
            managed.published["savepoints"] = entries

    def _autoscaled(self, managed: ManagedTopology, nodes: int) -> None:
        """The autoscaler moved the topology: write its node count to spec.nodes, and remember the generation
        that write made (until the watch shows it, the resource seen still asks for the old count)."""
        generation = managed.resource.set_nodes(nodes)
        managed.expect_generation = generation or managed.generation + 1

    def report_pending(self, managed: ManagedTopology, pending: Mapping[str, str], write: bool = False) -> None:
        """Worker pods that cannot start (the scheduler's or the kubelet's reason) go into the Available
        condition and a Warning event; with `write`, the status is written at once (a start or migration
        waiting for them holds the pass that would write it)."""
        message = "; ".join(pending[n] for n in sorted(pending))
        changed = message != managed.facts.pending
        managed.set(pending=message)
        if message:
            managed.events.emit(EventReason.WORKERS_PENDING, message, warning=True)
        if write and changed:
            managed.write()

    def remove(self, namespace: str, name: str, retain: bool = False) -> None:
        """The resource is being deleted: stop a migration in flight (bounded), the controller and its pods,
        delete its Redis keys (not with `retain`: `spec.deletionPolicy: Retain` keeps its state and streams;
        its savepoints are kept either way, they are not under its prefix). Always returns (the finalizer
        must go): what could not be done is logged."""
        with self._lock:
            managed = self.topologies.pop(self.key(namespace, name), None)
        prefix = topology_prefix(namespace, name)
        if managed is not None and managed.controller is not None:
            controller = managed.controller
            cancelled = getattr(controller.migrator, "cancelled", None)
            if cancelled is not None:
                cancelled.set()
            held = managed.lock.acquire(timeout=self.delete_wait_s)
            if not held:
                log.warning(
                    "%s: a pass still runs after %.0f s; stopping the workers anyway", managed.key, self.delete_wait_s
                )
            try:
                controller.close()
            except Exception as exc:
                log.warning("%s: stopping the workers: %s", managed.key, exc)
            finally:
                if held:
                    managed.lock.release()
            prefix = controller.topology.redis_prefix
        deadline = self.clock() + 30.0
        while True:
            try:
                if self.topology_users:
                    # first: it also disconnects what is left of the workers' connections, which could still
                    # write after the keys are gone
                    delete_topology_user(self.redis_client, namespace, name)
                if retain:
                    log.info(
                        "%s/%s deleted with deletionPolicy Retain: its keys stay under %s", namespace, name, prefix
                    )
                else:
                    delete_keys(self.redis_client, prefix)
                return
            except AclRefused as exc:
                log.warning("Redis user of %s/%s not deleted: %s", namespace, name, exc)
                if not retain:
                    delete_keys_logged(self.redis_client, prefix, f"{namespace}/{name}")
                return
            except redis.RedisError as exc:
                if self.clock() > deadline:
                    log.warning(
                        "keys of %s/%s not deleted (Redis: %s); they stay under %s", namespace, name, exc, prefix
                    )
                    return
                time.sleep(1.0)


def delete_keys_logged(client: redis.Redis, prefix: str, key: str) -> None:
    """`delete_keys`, a Redis error logged rather than raised."""
    try:
        delete_keys(client, prefix)
    except redis.RedisError as exc:
        log.warning("keys of %s not deleted (Redis: %s); they stay under %s", key, exc, prefix)


def _look(read: Callable[[], dict[str, str]], default: dict[str, str]) -> dict[str, str]:
    """What `read` says about the pods, or `default` while the API server or Redis cannot answer (the
    controller's own tick notes that and retries)."""
    try:
        return read()
    except Exception as exc:
        log.debug("pods not read: %s", exc)
        return default


def _without_parallelism(vertex: Any) -> Any:
    return {k: v for k, v in vertex.items() if k != "parallelism"} if isinstance(vertex, Mapping) else vertex


def delete_keys(client: redis.Redis, prefix: str) -> int:
    """Delete every Redis key of a topology (its prefix), the sink streams included."""
    removed = 0
    batch: list[Any] = []
    for key in client.scan_iter(match=f"{glob_escape(prefix)}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            removed += int(client.unlink(*batch))
            batch = []
    if batch:
        removed += int(client.unlink(*batch))
    return removed


def invalid_spec_message(exc: TopologyError) -> str:
    return "; ".join(exc.problems)
