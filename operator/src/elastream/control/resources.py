"""The Kubernetes side of the control plane, without kopf: one `TopologyController` per StreamTopology resource.

`ManagedTopologies` keeps a controller per resource (namespace/name) over the `KubernetesBackend`, one shared
analysis session (one Spark session for every topology the operator serves), one Redis connection, and the
resource itself as the place status goes (`CustomResourceStatus` patches the status subresource). The kopf
handlers (`elastream.handlers`) only parse what kopf gives them and call into here.

What the status shows is computed by `core.status` from `StatusFacts` this module keeps per topology
(started, scaling, recovering, the last failure); throughput and per-vertex rates come from the
controller's live view. Prometheus metrics of the operator: scalings and recoveries by outcome and their
durations.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from prometheus_client import Counter, Histogram

from elastream.control.backends.kubernetes import KubernetesBackend, WorkerPodSettings, selector_for
from elastream.control.controller import TopologyController
from elastream.control.scaling import ScalingRecord
from elastream.core.ports import BackendError, EventSink, ScaleRequest
from elastream.core.status import WORKERS_PENDING, StatusFacts, desired_conditions, merge_conditions, phase
from elastream.core.topology import API_VERSION, Topology, TopologyError, parse_manifest
from elastream.store.registry import Registry

log = logging.getLogger("elastream.operator")

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "streamtopologies"

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
class CustomResourceStatus:
    """A `StatusSink` writing into the resource's status subresource (merge patch)."""

    api: Any  # kubernetes.client.CustomObjectsApi
    namespace: str
    name: str

    def publish(self, field_name: str, status: dict[str, Any]) -> None:
        """Replace `status.<field_name>` as a whole (a merge patch would keep keys the new record lacks)."""
        from kubernetes.client.exceptions import ApiException

        operation = [{"op": "add", "path": f"/status/{field_name}", "value": _jsonable(status)}]
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                operation,
                _content_type="application/json-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return
            if exc.status != 422:  # 422: no status yet to add into; a merge patch creates it
                log.warning("status of %s/%s not patched: %s", self.namespace, self.name, exc.reason)
                return
            self.patch({field_name: _jsonable(status)})

    def set_nodes(self, nodes: int) -> None:
        """Write an automatic change to `spec.nodes`, as a HorizontalPodAutoscaler writes replicas: the spec
        stays the desired state (a later reconcile, or `kubectl get`, sees what runs)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name, {"spec": {"nodes": int(nodes)}}
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("spec.nodes of %s/%s not patched: %s", self.namespace, self.name, exc.reason)

    def patch(self, status: Mapping[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name, {"status": dict(status)}
            )
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report to
                log.warning("status of %s/%s not patched: %s", self.namespace, self.name, exc.reason)


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
class ManagedTopology:
    controller: TopologyController
    resource: CustomResourceStatus
    generation: int = 0
    facts: StatusFacts = field(default_factory=lambda: StatusFacts(0, 0))
    #: one operation at a time per topology (kopf runs handlers in a thread pool)
    lock: threading.Lock = field(default_factory=threading.Lock)
    conditions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def topology(self) -> Topology:
        return self.controller.topology

    @property
    def backend(self) -> KubernetesBackend:
        """The controller's backend as what `ManagedTopologies` built it: worker pods."""
        return cast(KubernetesBackend, self.controller.backend)

    def set(self, **changes: Any) -> None:
        self.facts = StatusFacts(**{**self.facts.__dict__, **changes})

    def status(self) -> dict[str, Any]:
        """The status subresource's content now (rates from the live view)."""
        controller, topology = self.controller, self.topology
        backend = self.backend
        try:
            schedule = backend.current_schedule()
        except BackendError:
            schedule = None
        ready = 0
        if schedule is not None:
            try:  # a pod that is scheduled but not started (or not placed at all) is not ready
                ready = len((set(schedule.nodes) & backend.ready_nodes()) - set(backend.failed_nodes()))
            except redis.RedisError:
                ready = self.facts.ready_nodes
        self.set(ready_nodes=ready, desired_nodes=topology.nodes)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.conditions = merge_conditions(self.conditions, desired_conditions(self.facts), now, self.generation)
        rates = controller.live.rates()
        parallelism = schedule.parallelism() if schedule is not None else {}
        status: dict[str, Any] = {
            "phase": phase(self.facts),
            "nodes": len(schedule.nodes) if schedule is not None else 0,
            "readyNodes": ready,
            "selector": selector_for(topology),
            "observedGeneration": self.generation,
            "conditions": self.conditions,
            "throughput": round(controller.live.throughput(), 1),
            "vertices": [
                {"name": v, "parallelism": parallelism.get(v, 0), "processingRate": round(rates.get(v, 0.0), 1)}
                for v in topology.order
            ],
        }
        record = controller.last_scaling
        if record is not None:
            status["lastScalingSummary"] = summary(record)
        return status


def summary(record: ScalingRecord) -> str:
    """One line for the `Last scaling` printer column."""
    if record.outcome == "succeeded":
        pause = record.report.get("pauseMs")
        return f"{record.direction} {record.from_nodes}->{record.to_nodes}" + (
            f" ({pause:.0f} ms pause)" if isinstance(pause, int | float) else ""
        )
    return f"{record.direction} {record.from_nodes}->{record.to_nodes} {record.outcome}"


@dataclass
class ManagedTopologies:
    """Every topology this operator serves."""

    redis_client: redis.Redis
    redis_url: str
    core_api: Any
    custom_api: Any
    analyzer: Any
    settings: WorkerPodSettings = field(default_factory=WorkerPodSettings)
    interval_s: float = 1.0
    #: how long worker pods may take to be scheduled, started and ready
    start_timeout_s: float = 180.0
    topologies: dict[str, ManagedTopology] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def events_for(self, body: Mapping[str, Any]) -> KubernetesEvents:
        return KubernetesEvents(self.core_api, body)

    def key(self, namespace: str, name: str) -> str:
        return f"{namespace}/{name}"

    def get(self, namespace: str, name: str) -> ManagedTopology | None:
        return self.topologies.get(self.key(namespace, name))

    def ensure(self, body: Mapping[str, Any], events: EventSink) -> ManagedTopology:
        """The controller of this resource, built and started when new (raises `TopologyError` for a spec
        the API server let through but that cannot run)."""
        metadata = body["metadata"]
        key = self.key(metadata.get("namespace", "default"), metadata["name"])
        with self._lock:
            managed = self.topologies.get(key)
            if managed is not None:
                managed.controller.events = events
                return managed
            topology = topology_from_resource(body)
            managed = self._build(topology, metadata, events)
            self.topologies[key] = managed
        managed.generation = int(metadata.get("generation", 0))
        with managed.lock:
            self.analyzer.start_warm_up(topology)
            # after an operator restart the running schedule is in Redis: adopt it rather than start over
            running = Registry(self.redis_client, topology.redis_prefix).schedule()
            try:
                managed.controller.start(running[1] if running is not None else None)
            except BaseException:
                with self._lock:
                    self.topologies.pop(key, None)
                raise
            managed.set(started=True)
        return managed

    def _build(self, topology: Topology, metadata: Mapping[str, Any], events: EventSink) -> ManagedTopology:
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
        )
        status = CustomResourceStatus(self.custom_api, topology.namespace, topology.name)
        controller = TopologyController(
            topology=topology,
            backend=backend,
            metrics=StreamMetricSource(client, topology, self.analyzer, self.interval_s),
            migrator=MigrationDriver(topology, backend, client, topology.scaling.migration, events=events),  # type: ignore[arg-type]
            feed=MetricStream(client, topology.redis_prefix),
            requests=NoRequests(),
            status=status,
            events=events,
            background=[
                Checkpointer(CheckpointDriver(topology, backend, client), float(topology.scaling.checkpoint_interval_s))
            ],
            interval_s=self.interval_s,
            on_nodes_changed=status.set_nodes,
        )
        managed = ManagedTopology(controller, status)
        backend.on_waiting = lambda pending: self.report_pending(managed, pending, write=True)
        return managed

    def report_pending(self, managed: ManagedTopology, pending: Mapping[str, str], write: bool = False) -> None:
        """Worker pods that cannot start (the scheduler's or the kubelet's reason) go into the Available
        condition and a Warning event; with `write`, the status is written at once (a start or migration
        waiting for them holds the handler that would write it)."""
        message = "; ".join(pending[n] for n in sorted(pending))
        changed = message != managed.facts.pending
        managed.set(pending=message)
        if message:
            managed.controller.events.emit(WORKERS_PENDING, message, warning=True)
        if write and changed:
            managed.resource.patch(managed.status())

    def scale(
        self,
        managed: ManagedTopology,
        nodes: int,
        generation: int,
        events: EventSink,
        parallelism: Mapping[str, int] | None = None,
        trigger: str = "request",
    ) -> ScalingRecord:
        """`spec.nodes` (or, with `parallelism`, vertices' degrees) changed: analyse, plan, migrate; the
        status shows Scaling meanwhile."""
        with managed.lock:
            managed.controller.events = events
            managed.generation = generation
            managed.controller.topology = managed.controller.topology.with_nodes(nodes)
            managed.set(scaling=True)
            managed.resource.patch(managed.status())
            try:
                record = managed.controller.scale_to(nodes, parallelism, trigger)
            finally:
                managed.set(scaling=False)
            managed.set(scaling_failed="" if record.outcome != "failed" else record.reason)
            SCALINGS.labels(record.direction, record.outcome).inc()
            if record.finished_at is not None:
                SCALING_SECONDS.observe(record.finished_at - record.started_at)
            pause = record.report.get("pauseMs")
            if isinstance(pause, int | float):
                PAUSE_SECONDS.observe(pause / 1000.0)
            managed.resource.patch(managed.status())
            return record

    def apply_spec(self, managed: ManagedTopology, body: Mapping[str, Any], events: EventSink) -> list[str]:
        """Apply what of a changed spec can change on a running topology: `scaling.auto` (the autoscaler's
        switch, bounds and thresholds) at once, and vertices' `parallelism` by a migration to those degrees.
        Returns the changes it could not apply (anything else: delete and re-create to change it)."""
        new = topology_from_resource(body)
        with managed.lock:
            controller = managed.controller
            running = controller.topology
            ignored = [
                f"spec.{name}"
                for name in ("slotsPerNode", "streams", "resources", "image")
                if (running.spec.get(name) != new.spec.get(name))
            ]
            scaling = dataclasses.replace(running.scaling, auto=new.scaling.auto)
            if scaling != new.scaling:
                ignored.append("spec.scaling (other than auto)")
            same_shape = [_without_parallelism(v) for v in running.spec.get("vertices") or []] == [
                _without_parallelism(v) for v in new.spec.get("vertices") or []
            ]
            if not same_shape:
                ignored.append("spec.vertices (other than parallelism)")
            controller.topology = dataclasses.replace(
                running,
                scaling=scaling,
                spec={**running.spec, "scaling": new.spec.get("scaling"), "vertices": new.spec.get("vertices")}
                if same_shape
                else running.spec,
                vertices=new.vertices if same_shape else running.vertices,
            )
            managed.generation = int(body["metadata"].get("generation", 0))
        if not same_shape:
            return ignored
        schedule = controller.backend.current_schedule()
        wanted = {v: new.vertices[v].parallelism for v in new.order}
        if wanted != schedule.parallelism():
            self.scale(managed, len(schedule.nodes), managed.generation, events, wanted, trigger="spec")
        return ignored

    def tick(self, managed: ManagedTopology, events: EventSink) -> dict[str, Any] | None:
        """The periodic refresh: recover dead workers, live rates, recovery follow-ups; returns the status
        to write (None when a scaling holds the topology: it writes its own)."""
        if not managed.lock.acquire(blocking=False):
            return None
        try:
            managed.controller.events = events
            self.report_pending(managed, managed.backend.pending_nodes())
            failed = managed.controller.backend.failed_nodes()
            if failed:
                managed.set(worker_lost="; ".join(failed.values()), recovering=True)
                managed.resource.patch(managed.status())
            before = managed.controller.last_recovery
            try:
                managed.controller.tick()
                managed.set(backend_error="")
            except (BackendError, redis.RedisError) as exc:
                managed.set(backend_error=str(exc))
            recovery = managed.controller.last_recovery
            if recovery is not None and recovery is not before:
                RECOVERIES.labels(str(recovery.get("outcome"))).inc()
                if recovery.get("outcome") == "succeeded":
                    managed.set(worker_lost="", recovering=False)
            elif not failed:
                managed.set(worker_lost="", recovering=False)
            return managed.status()
        finally:
            managed.lock.release()

    def remove(self, namespace: str, name: str) -> None:
        """The resource is being deleted: stop the controller and its pods, delete its Redis keys."""
        with self._lock:
            managed = self.topologies.pop(self.key(namespace, name), None)
        if managed is None:
            prefix = f"elastream:{namespace}/{name}:"
        else:
            with managed.lock:
                managed.controller.close()
            prefix = managed.topology.redis_prefix
        delete_keys(self.redis_client, prefix)


def _without_parallelism(vertex: Any) -> Any:
    return {k: v for k, v in vertex.items() if k != "parallelism"} if isinstance(vertex, Mapping) else vertex


def delete_keys(client: redis.Redis, prefix: str) -> int:
    """Delete every Redis key of a topology (its prefix), the sink streams included."""
    removed = 0
    batch: list[Any] = []
    for key in client.scan_iter(match=f"{_glob_escape(prefix)}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            removed += int(client.unlink(*batch))
            batch = []
    if batch:
        removed += int(client.unlink(*batch))
    return removed


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def invalid_spec_message(exc: TopologyError) -> str:
    return "; ".join(exc.problems)


def _jsonable(value: Any) -> Any:
    """Status values as JSON types (floats rounded; None kept)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return round(value, 3)
    return value
