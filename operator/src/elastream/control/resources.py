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
`spec.deletionPolicy` are carried out through `control.savepoint_actions` (`_savepoints`, `_start_point`, `remove`).

The status has one writer per topology (`control.status_writer`): one merge patch per change, the rates at
most every `volatile_every_s`. What it shows is computed by `core.status` from the `StatusFacts` each
`ManagedTopology` keeps (started, scaling, recovering, Redis away, the last failure). One shared analysis
session (one Spark session for every topology), one Redis connection. Prometheus metrics of the operator
(`control.topology_metrics`): rescales and recoveries counted here as they happen, per topology (their
series removed when it is deleted), and every topology's phase, conditions and nodes read at scrape time.

One concern per module, each layer building on the one before: `control.resource_api` (the resource through
the API and its events), `control.managed` (what the loop keeps per topology), `control.reconciler_base`
(settings, wiring, savepoint annotations), `control.lifecycle` (start, suspend, resume, restart from scratch),
`control.upgrades` (stateful upgrades and their rollback), and this module: the pass itself (reconcile,
converge, scale) and the delete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from elastream.control.backends.worker_objects import placement_problems, pod_template_problems
from elastream.control.lifecycle import (
    RESTART_FROM_SCRATCH,
    delete_keys,
    delete_keys_logged,
)
from elastream.control.managed import (
    ManagedTopology,
    spec_parallelism,
)
from elastream.control.resource_api import (
    topology_from_resource,
)
from elastream.control.retrying import retry_within
from elastream.control.scaling import ScalingRecord
from elastream.control.topology_metrics import count_recovery, count_rescale, forget_topology
from elastream.control.upgrades import TopologyUpgrades
from elastream.core.images import image_allowed, image_refusal
from elastream.core.outcomes import Outcome
from elastream.core.status import (
    EventReason,
    stalled,
)
from elastream.core.topology import (
    Topology,
    TopologyError,
    topology_prefix,
)
from elastream.core.upgrade import spec_change
from elastream.store.acl import AclRefused, delete_topology_user
from elastream.store.retry import backoff

log = logging.getLogger("elastream.operator")


#: how long a delete waits for Redis to delete the topology's user and keys (the finalizer goes either way)
DELETE_REDIS_WAIT_S = 30.0


@dataclass
class ManagedTopologies(TopologyUpgrades):
    """Every topology this operator serves, each driven by `reconcile` (the level-triggered loop: the kopf
    daemon of each resource calls it with the resource as it is now, on a bounded pool of threads). Its
    settings and wiring are `ReconcilerBase`'s; the start, suspend and resume `TopologyLifecycle`'s; stateful
    upgrades `TopologyUpgrades`'s."""

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
                return self._reconcile(managed, body)
        except Exception as exc:  # a bug must not stop the loop of every later pass: say it, back off
            log.exception("reconcile of %s failed", managed.key)
            managed.set(backend_error=f"internal error: {type(exc).__name__}: {exc}")
            managed.write()
            return self.retry_s
        finally:
            managed.lock.release()

    def _reconcile(self, managed: ManagedTopology, body: Mapping[str, Any]) -> float:
        now = self.clock.monotonic()
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
            # likewise a placement outside the operator's policy (worker.placement): the control plane, another's nodes
            refused = placement_problems(wanted.spec.get("placement"), self.settings.placement, wanted.namespace)
            # and a podTemplate (or a connector's Secret) outside its policy (worker.podTemplate): hostPath, a
            # mount over the image's code, the operator's env or labels, a service account it did not allow
            refused += pod_template_problems(wanted.spec, self.settings)
            if refused:
                raise TopologyError(refused)
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
        controller = managed.running()
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
        controller = managed.running()
        self._apply_settings(managed, wanted)
        before, before_scaling = controller.last_recovery, controller.last_scaling
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
            count_recovery(controller.topology.namespace, controller.topology.name, recovery)
        if controller.last_scaling is not None and controller.last_scaling is not before_scaling:
            # the autoscaler's rescale, carried out by the tick (`scale` counts the ones the spec asks for)
            count_rescale(controller.topology.namespace, controller.topology.name, controller.last_scaling)
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

    def _apply_settings(self, managed: ManagedTopology, wanted: Topology) -> None:
        """What of a changed spec applies without moving executors: `scaling.auto` (the autoscaler's switch,
        bounds and thresholds), now, and the vertices' degrees into the running model (`_converge` migrates
        to them). The rest is `_apply_spec`'s."""
        controller = managed.running()
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

    def _converge(self, managed: ManagedTopology, wanted: Topology, now: float) -> float:
        """Move what runs towards the spec: its node count, and its vertices' degrees when the spec's changed.
        Returns the seconds until this needs another look."""
        controller = managed.running()
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
            failures, delay = self._back_off(managed, target, record.reason, self.clock.monotonic())
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
        """Analyse, plan, migrate to `nodes` (and `parallelism`); the status shows Scaling meanwhile. The
        record (held back by `publish`) goes out with the pass's write at its end, after this pass's events."""
        controller = managed.running()
        managed.set(scaling=True)
        managed.write()
        try:
            record = controller.scale_to(nodes, parallelism, trigger)
        finally:
            managed.set(scaling=False)
        self._note_store(managed)
        managed.set(scaling_failed="" if record.outcome != Outcome.FAILED else record.reason)
        count_rescale(controller.topology.namespace, controller.topology.name, record)
        return record

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

        def delete() -> None:
            if self.topology_users:
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


def invalid_spec_message(exc: TopologyError) -> str:
    return "; ".join(exc.problems)
