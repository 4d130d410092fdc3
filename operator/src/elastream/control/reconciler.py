"""The Kubernetes side of the control plane, without kopf: a level-triggered reconcile loop per StreamTopology.

`TopologyReconciler.reconcile(resource)` is one pass of a topology's loop (the kopf daemon of each resource
calls it on a bounded thread pool, when woken by a change of the resource or every `tick_s`): it compares what
the resource asks for (its spec, read afresh each pass: the one place the desired state lives) with what runs
(the backend's schedule) and acts until they agree — start or adopt the worker pods, recover dead workers,
take due checkpoints, let the autoscaler decide, migrate to the spec's node count and degrees, or, while
`spec.suspend` is true, take a last checkpoint and stop the workers (and start them again from it when it is
false: no scaling, autoscaling or recovery meanwhile; a changed `spec.nodes` applies on resume). A burst of
patches settles (`settle_s`) before anything moves, so it migrates once, to the last value; a scaling or start
that fails leaves the old schedule running and is retried with backoff while it is still wanted (a new value
is tried at once).

A pass is composed of parts, each an object with its own state and a narrow interface, none inheriting from
another: the resource observed once (`control.pass_context`: the wanted topology, or why it is invalid), handed
to each part with the pass's `now` and what runs as one `PassContext`, then
`Lifecycle` (start, resume, suspend, restart from scratch), `SavepointAnnotations`, `Upgrades` (stateful
upgrades, their rollback, a rebuilt controller), `ControllerTick` (pods, recovery, checkpoints, drains, the
autoscaler through the controller's tick) and `Convergence` (scaling to the spec). The controllers are built
by `ControllerFactory`. What a pass keeps of a topology is its `ManagedTopology`, whose one writer writes the
status at the end of the pass (rendered by `core.status.render_status`), and before a step that waits.

One shared analysis session (one Spark session for every topology), one Redis connection. Prometheus metrics
of the operator (`control.topology_metrics`): rescales and recoveries counted as they happen, per topology
(their series removed when it is deleted), and every topology's phase, conditions and nodes read at scrape
time. The delete (`remove`) carries out `spec.deletionPolicy`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from elastream.analysis import Analyzer
from elastream.control.backends.worker_objects import WorkerPodSettings
from elastream.control.controller import TopologyController
from elastream.control.controller_factory import BuildController, ControllerFactory
from elastream.control.controller_tick import ControllerTick
from elastream.control.convergence import Convergence
from elastream.control.lifecycle import (
    RESTART_FROM_SCRATCH,
    Lifecycle,
    delete_keys,
    delete_keys_logged,
    registry_schedule,
)
from elastream.control.managed import ManagedTopology
from elastream.control.metric_series import forget_topology
from elastream.control.pacing import LoopSettings
from elastream.control.pass_context import PassContext, observe
from elastream.control.reconcile_slots import ReconcileSlots
from elastream.control.resource_api import (
    KubernetesEvents,
    ResourceApi,
)
from elastream.control.retrying import retry_within
from elastream.control.savepoint_actions import RedisSavepoints, Savepoints
from elastream.control.savepoint_annotations import SavepointAnnotations
from elastream.control.status_writer import StatusWriter
from elastream.control.upgrades import RunningSpec, Upgrades
from elastream.core.ports import Clock, CoreApi, CustomObjectsApi, NetworkingApi, PolicyApi, SystemClock
from elastream.core.schedule import Schedule
from elastream.core.status import EventReason, stalled
from elastream.core.topology import Topology, topology_prefix
from elastream.store.acl import AclRefused, UserKeeper, delete_topology_user
from elastream.store.retry import backoff

log = logging.getLogger("elastream.operator")


#: how long a delete waits for Redis to delete the topology's user and keys (the finalizer goes either way)
DELETE_REDIS_WAIT_S = 30.0


@dataclass
class TopologyReconciler:
    """Every topology this operator serves, each driven by `reconcile` (the level-triggered loop: the kopf
    daemon of each resource calls it with the resource as it is now, on a bounded pool of threads). Its
    fields are the operator's settings and wiring; the parts of a pass are built from them (see the module)."""

    redis_client: redis.Redis
    #: never in a repr (a log line, a traceback's locals): it may hold a password
    redis_url: str = field(repr=False)
    core_api: CoreApi
    custom_api: CustomObjectsApi
    #: the one analysis session (Spark) of every topology: warmed up at a start, analyses each window
    analyzer: Analyzer
    settings: WorkerPodSettings = field(default_factory=WorkerPodSettings)
    #: the worker images a topology's spec.image may name (`core.images`); empty: any
    allowed_images: tuple[str, ...] = ()
    #: a `kubernetes.client.NetworkingV1Api`, for each topology's NetworkPolicy (`settings.network_policy`)
    networking_api: NetworkingApi | None = None
    #: a `kubernetes.client.PolicyV1Api`, for each topology's PodDisruptionBudget (`settings.disruption_budget`)
    policy_api: PolicyApi | None = None
    #: sets the topologies' Redis users (`loop.topology_users`) again within a tick when Redis lost them, for
    #: every topology on one thread (None: only the reconcile passes look)
    user_keeper: UserKeeper | None = None
    #: the loop's settings (its pacing, timeouts, intervals, Redis users per topology), handed whole to the
    #: controller factory and the parts
    loop: LoopSettings = field(default_factory=LoopSettings)
    #: builds the controller of a topology (tests replace it with one over in-memory fakes)
    build: BuildController | None = None
    #: where savepoints are kept (None: in Redis, through `redis_client`)
    savepoint_service: Savepoints | None = None
    #: the schedule the workers of a topology run, from Redis (after an operator restart: adopted)
    running_schedule: Callable[[Topology], Schedule | None] | None = None
    #: the spec the pods of a topology run (its ConfigMap's), None when there are none (tests replace it)
    running_spec: RunningSpec | None = None
    #: every deadline, backoff, settling and wait of the loop and of the controllers it builds (tests: fake)
    clock: Clock = field(default_factory=SystemClock)
    #: how many passes do work at once (`control.reconcile_slots`); a pass that waits gives its slot back
    #: (None: as many as call `reconcile`, e.g. tests that drive one topology)
    slots: ReconcileSlots | None = None
    topologies: dict[str, ManagedTopology] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.slots is not None:
            # every wait of a pass goes through this clock (the controllers and backends it builds get it):
            # waiting, a pass gives its slot back to the passes of other topologies
            self.clock = self.slots.clock(self.clock)
        self._wire()

    def _wire(self) -> None:
        """The parts of a pass, built once from the settings (they keep no topology's state: that is each
        `ManagedTopology`'s). A reconciler with other settings is another reconciler (`dataclasses.replace`)."""
        self.pacing = self.loop.pacing
        self.controllers = ControllerFactory(
            self.redis_client,
            self.redis_url,
            self.core_api,
            self.analyzer,
            self.settings,
            networking_api=self.networking_api,
            policy_api=self.policy_api,
            user_keeper=self.user_keeper,
            loop=self.loop,
            clock=self.clock,
            hook=self._built,
        )
        self.convergence = Convergence(self.pacing, self.clock)
        self.lifecycle = Lifecycle(
            self.controllers,
            self.convergence,
            self.pacing,
            self.clock,
            self._warm_up,
            self.savepoints,
            self.running_schedule or registry_schedule(self.redis_client),
            self.redis_client,
        )
        self.upgrades = Upgrades(
            self.controllers,
            self.lifecycle,
            self.convergence,
            self.pacing,
            self.clock,
            self._warm_up,
            self.core_api,
            self.settings,
            self.allowed_images,
            self.running_spec,
        )
        self.savepoint_annotations = SavepointAnnotations(self.savepoints, self.pacing, self.clock)
        self.ticks = ControllerTick()

    def _warm_up(self, topology: Topology) -> None:
        self.analyzer.start_warm_up(topology)

    def _built(
        self, topology: Topology, metadata: Mapping[str, Any], managed: ManagedTopology
    ) -> TopologyController | None:
        return self.build(self, topology, metadata, managed) if self.build is not None else None

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
                writer = StatusWriter(
                    resource.patch_status, volatile_every_s=self.loop.volatile_every_s, clock=self.clock.monotonic
                )
                events = KubernetesEvents(self.core_api, body, clock=self.clock)
                managed = ManagedTopology.of_resource(body, key, writer, events, resource, self.clock)
                self.topologies[key] = managed
        return managed

    def savepoints(self) -> Savepoints:
        return self.savepoint_service or RedisSavepoints(self.redis_client, self.clock)

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
            # one of the slots every topology shares (its waits give it back)
            with self.slots.running() if self.slots is not None else contextlib.nullcontext():
                delay = self._pass(managed, body)
                managed.write()  # the one write of the pass: what every part found out
                return delay
        except Exception as exc:  # a bug must not stop the loop of every later pass: say it, back off
            log.exception("reconcile of %s failed", managed.key)
            managed.set(backend_error=f"internal error: {type(exc).__name__}: {exc}")
            managed.write()
            return self.pacing.retry_s
        finally:
            managed.lock.release()

    def _pass(self, managed: ManagedTopology, body: Mapping[str, Any]) -> float:
        """The parts of one pass in order, over what it observed once (`PassContext`: the resource, `now`, and
        what runs, read again only after a step that changes it); each part returns the seconds until the next
        pass when the pass must end with it. The status is written by the caller."""
        now = self.clock.monotonic()
        seen = observe(body, self.allowed_images, self.settings)
        memory = managed.seen
        memory.generation = seen.generation
        if seen.wanted is None:
            managed.set(invalid_spec=seen.invalid)
            if memory.invalid_reported != seen.invalid:
                memory.invalid_reported = seen.invalid
                managed.events.emit(EventReason.INVALID_SPEC, seen.invalid, warning=True)
            memory.observed_generation = seen.generation  # judged: only a new spec moves it on
            return 30.0  # nothing to do until the spec changes (which wakes the loop)
        if seen.spec != memory.spec:
            memory.spec, memory.changed_at = seen.spec, now
        managed.set(invalid_spec="")
        memory.invalid_reported = ""
        context = PassContext(seen, now)
        if seen.annotations.get(RESTART_FROM_SCRATCH) == "true":
            self.lifecycle.restart_from_scratch(managed)
        if managed.controller is None:
            running, interrupted = self.upgrades.running_topology(context)
            if interrupted is not None:
                delay = self.upgrades.take_over_interrupted(managed, context, interrupted)
            else:
                delay = self.lifecycle.start(managed, context, running)
            if delay is not None:
                return delay
        controller = managed.running()
        self.savepoint_annotations.reconcile(managed, context)
        if context.wanted.suspend:
            delay = self.lifecycle.suspend(managed, context)
            if managed.facts.suspended:  # suspended as asked: the rest of the spec applies on resume
                memory.observed_generation = seen.generation
            return delay
        self.lifecycle.not_suspending(managed)
        self.lifecycle.check_redis_user(managed)  # before a resume too: the workers that start must find their user
        if controller.suspended and not self.upgrades.upgrade_due(managed, context, controller.topology):
            delay = self.lifecycle.resume(managed, context)
            if delay is not None:
                return delay
            # the scaling asked while suspended (spec.nodes, degrees) is converged to at once, with no settling
            memory.settled(now - self.pacing.settle_s)
        delay = self.upgrades.apply_spec(managed, context.reading(managed.running()))
        if delay is not None:
            return delay
        self.convergence.apply_settings(managed, context)
        self.ticks.tick(managed)
        delay = self.convergence.converge(managed, context.reading(managed.running()))
        converged = self.convergence.converged(managed, context.reading(managed.running()))
        # the facts as the pass's write will show them (with the attempt's failures): Stalled is judged on those
        if converged or stalled(managed.facts_to_report()) is not None:
            # applied, or only the user can move it on: either way this generation is what the status is about
            memory.observed_generation = seen.generation
        return min(self.pacing.tick_s, delay)

    def remove(self, namespace: str, name: str, retain: bool = False) -> None:
        """The resource is being deleted: stop a migration in flight (bounded), the controller and its pods,
        delete its Redis keys (not with `retain`: `spec.deletionPolicy: Retain` keeps its state and streams;
        its savepoints are kept either way, they are not under its prefix). Always returns (the finalizer
        must go): what could not be done is logged."""
        with self._lock:
            managed = self.topologies.pop(self.key(namespace, name), None)
        forget_topology(namespace, name)  # its rescales and recoveries: a deleted topology's series go
        prefix = topology_prefix(namespace, name)
        if managed is not None and managed.controller is not None:
            controller = managed.controller
            cancelled = getattr(controller.migrator, "cancelled", None)
            if cancelled is not None:
                cancelled.set()
            held = managed.lock.acquire(timeout=self.loop.delete_wait_s)
            if not held:
                log.warning(
                    "%s: a pass still runs after %.0f s; stopping the workers anyway",
                    managed.key,
                    self.loop.delete_wait_s,
                )
            try:
                controller.close()
            except Exception as exc:
                log.warning("%s: stopping the workers: %s", managed.key, exc)
            finally:
                if held:
                    managed.lock.release()
            prefix = controller.topology.redis_prefix

        def delete() -> None:
            if self.loop.topology_users:
                # first: it also disconnects what is left of the workers' connections, which could still
                # write after the keys are gone
                delete_topology_user(self.redis_client, namespace, name)
            if retain:
                log.info("%s/%s deleted with deletionPolicy Retain: its keys stay under %s", namespace, name, prefix)
            else:
                delete_keys(self.redis_client, prefix)

        try:
            retry_within(
                delete,
                transient=lambda exc: isinstance(exc, redis.RedisError),
                within_s=DELETE_REDIS_WAIT_S,
                clock=self.clock,
                delays=backoff(1.0, 1.0, 1.0),
            )
        except AclRefused as exc:
            log.warning("Redis user of %s/%s not deleted: %s", namespace, name, exc)
            if not retain:
                delete_keys_logged(self.redis_client, prefix, f"{namespace}/{name}")
        except redis.RedisError as exc:
            log.warning("keys of %s/%s not deleted (Redis: %s); they stay under %s", namespace, name, exc, prefix)
