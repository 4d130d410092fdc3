"""Stateful upgrades, a part of the reconcile pass (`Upgrades`): a changed spec that does not apply in place
(`core.upgrade`) is carried out by a checkpoint of the running workers, their pods stopped, and a controller of
the new spec whose pods start from that checkpoint; new pods that do not start roll back to the previous spec
from the same checkpoint. Also what an operator restart finds of an upgrade in flight (the ConfigMap's record)
and a change of the scaling settings only (the controller rebuilt, the pods run on).

It owns the `UpgradeAttempt` of a topology, its upgrade facts (upgrading, upgrade_failed, upgrade_refused),
`status.lastUpgrade` and its record (`control.managed.UpgradeMemory`: the rolled-back generation, the refused
one reported). What a changed spec leads to is a pure decision (`spec_step`) that `apply_spec` carries out. It
builds controllers through `ControllerFactory`, starts one through `Lifecycle.start` (a rebuild), backs off
through `Lifecycle.not_yet`/`start_failed` and tells `Convergence` the degrees an upgrade's pods run; it writes
the status before each step that waits (the checkpoint, the new pods' start)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from elastream.control.attempts import ResumeAttempt, StartAttempt, UpgradeAttempt
from elastream.control.backends.worker_objects import (
    WorkerPodSettings,
    placement_problems,
    pod_template_problems,
    running_spec_of,
)
from elastream.control.controller import SuspendResult, TopologyController
from elastream.control.controller_factory import ControllerFactory
from elastream.control.convergence import Convergence
from elastream.control.lifecycle import Lifecycle
from elastream.control.managed import (
    UPGRADE_ROLLED_BACK,
    UPGRADE_SUCCEEDED,
    ManagedTopology,
    UpgradeMemory,
)
from elastream.control.pacing import Pacing
from elastream.control.pass_context import PassContext
from elastream.core.images import image_allowed
from elastream.core.ports import BackendError, Clock, CoreApi, StateLost
from elastream.core.status import (
    EventReason,
    utc_timestamp,
)
from elastream.core.topology import (
    Topology,
    TopologyError,
)
from elastream.core.upgrade import SpecChange, spec_change
from elastream.crd import check_manifest
from elastream.store.acl import AclRefused

log = logging.getLogger("elastream.operator")

#: the spec a topology's pods run and the one of an upgrade in flight (its ConfigMap's), None when none
RunningSpec = Callable[[Topology, Mapping[str, Any]], tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]]


@dataclass(frozen=True)
class RefuseChange:
    """No checkpoint can carry the change: the previous spec runs on (`report`: say so, once per generation)."""

    report: bool


@dataclass(frozen=True)
class ApplyInPlace:
    """Nothing to restart: the upgrade facts clear; `rebuild`: the controller is built again with the new
    scaling settings once the spec settled (`wait_s`: the seconds it still has to be still, None: now)."""

    rebuild: bool
    wait_s: float | None = None


@dataclass(frozen=True)
class KeepRolledBack:
    """This generation's upgrade was rolled back: not tried again until the spec changes."""


@dataclass(frozen=True)
class WaitToUpgrade:
    """An upgrade is due but not now: Redis away or the state lost (`wait_s` None: the pass goes on), the spec
    still settling, or a failed checkpoint backing off (the seconds until the next look)."""

    wait_s: float | None


@dataclass(frozen=True)
class StartUpgrade:
    """The stateful upgrade starts now (a checkpoint, the old pods stop, the new ones start from it)."""


#: what `Upgrades.apply_spec` does with a changed spec
SpecStep = RefuseChange | ApplyInPlace | KeepRolledBack | WaitToUpgrade | StartUpgrade


def spec_step(
    change: SpecChange,
    memory: UpgradeMemory,
    generation: int,
    redis_ok: bool,
    settle_s: float,
    backoff_s: float | None,
) -> SpecStep:
    """What to do with the spec's change from what runs (pure): `settle_s` is how long the spec has still to be
    still (<= 0: settled), `backoff_s` the seconds a failed upgrade checkpoint still backs off (None: none)."""
    if change.refused:
        return RefuseChange(report=memory.refused_reported != generation)
    if not change.needs_restart:
        rebuild = bool(change.controller)
        return ApplyInPlace(rebuild, wait_s=settle_s if rebuild and settle_s > 0 else None)
    if memory.rolled_back_generation == generation:
        return KeepRolledBack()
    if not redis_ok:
        return WaitToUpgrade(None)  # nothing can be checkpointed (RedisUnavailable / StateLost say why)
    if settle_s > 0:
        return WaitToUpgrade(settle_s)
    if backoff_s is not None:
        return WaitToUpgrade(backoff_s)
    return StartUpgrade()


class Upgrades:
    """Stateful upgrades of each topology (see the module)."""

    def __init__(
        self,
        controllers: ControllerFactory,
        lifecycle: Lifecycle,
        convergence: Convergence,
        pacing: Pacing,
        clock: Clock,
        warm_up: Callable[[Topology], object],
        core_api: CoreApi,
        settings: WorkerPodSettings,
        allowed_images: tuple[str, ...],
        running_spec: RunningSpec | None = None,
    ) -> None:
        self.controllers = controllers
        self.lifecycle = lifecycle
        #: told of the degrees an upgrade's pods run (its record's)
        self.convergence = convergence
        self.pacing = pacing
        self.clock = clock
        #: the analysis session warms up for a topology about to start (on a thread of its own)
        self.warm_up = warm_up
        self.core_api = core_api
        self.settings = settings
        self.allowed_images = allowed_images
        self.running_spec = running_spec or self._configmap_spec

    def running_topology(self, context: PassContext) -> tuple[Topology, Topology | None]:
        """When the operator takes a topology over: (what its pods run, the spec of an upgrade in flight started
        from, or None), from its ConfigMap (written with every start, upgrade and schedule), so a spec changed
        while no operator ran is applied by the upgrade path rather than assumed, and an interrupted upgrade
        can still go back. The wanted one when there is none (a new topology) or it cannot be read or parsed
        (then the start says what is wrong)."""
        wanted, read = context.wanted, self.running_spec
        try:
            running_doc, previous_doc = read(wanted, context.metadata)
        except Exception as exc:  # the API server away: the start itself will wait and say so
            log.debug("running spec of %s/%s not read: %s", wanted.namespace, wanted.name, exc)
            return wanted, None

        def parsed(document: Mapping[str, Any] | None) -> Topology | None:
            if document is None:
                return None
            try:
                # the ConfigMap is the tenant's to write: checked as the API server would check the spec
                found = check_manifest({**document, "metadata": {"name": wanted.name, "namespace": wanted.namespace}})
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
            if placement_problems(found.spec.get("placement"), self.settings.placement, wanted.namespace):
                # nor a placement the operator's policy refuses (worker.placement)
                log.warning(
                    "%s/%s: a spec in its ConfigMap asks for a placement the operator does not allow; ignored",
                    wanted.namespace,
                    wanted.name,
                )
                return None
            if pod_template_problems(found.spec, self.settings):
                # nor a podTemplate (or a connector's Secret) its policy refuses (worker.podTemplate)
                log.warning(
                    "%s/%s: a spec in its ConfigMap asks for a pod template the operator does not allow; ignored",
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

    def upgrade_due(self, managed: ManagedTopology, context: PassContext, running: Topology) -> bool:
        """Whether the wanted spec is a stateful upgrade of `running` still to be tried."""
        change = spec_change(running, context.wanted)
        rolled_back = managed.upgrades.rolled_back_generation == context.generation
        return change.needs_restart and not change.refused and not rolled_back

    def take_over_interrupted(self, managed: ManagedTopology, context: PassContext, previous: Topology) -> float | None:
        """The ConfigMap says an upgrade from `previous` was in flight when the last operator stopped: its pods
        (new ones starting, or the previous spec's not stopped yet) are stopped, and a controller of the
        previous spec is taken over stopped, at the latest checkpoint. The pass then upgrades again from that
        checkpoint (rolling back to `previous` if that fails), or resumes `previous` if the spec went back."""
        controller = self.controllers.new(previous, context.metadata, managed)
        try:
            controller.backend.stop_workers()
            controller.start_suspended(None)
        except StateLost as exc:
            managed.set(state_lost=str(exc))
            return self.pacing.tick_s
        except (BackendError, redis.RedisError, AclRefused) as exc:
            with contextlib.suppress(Exception):
                controller.close(stop_workers=False)
            return self.lifecycle.start_failed(managed, StartAttempt(), exc, context.now)
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

    def apply_spec(self, managed: ManagedTopology, context: PassContext) -> float | None:
        """The changes of the spec that do not apply in place (`core.upgrade`): scaling settings rebuild the
        operator's side of the topology (its pods run on); the rest is a stateful upgrade. A change no
        checkpoint can carry is refused (Stalled, UpgradeRefused). What to do is `spec_step`'s decision; this
        carries it out. Returns the seconds until the next pass when this one must end here, None to go on."""
        controller = managed.controller
        assert controller is not None
        change = spec_change(controller.topology, context.wanted)
        managed.set(upgrade_refused="; ".join(change.refused))
        step = spec_step(
            change,
            managed.upgrades,
            context.generation,
            redis_ok=not (context.store_error or context.state_lost),
            settle_s=managed.seen.changed_at + self.pacing.settle_s - context.now,
            backoff_s=managed.waits(UpgradeAttempt(), context.now),
        )
        if isinstance(step, RefuseChange):
            if step.report:
                managed.upgrades.refused_reported = context.generation
                managed.events.emit(
                    EventReason.UPGRADE_REFUSED,
                    f"generation {context.generation} not applied, the previous spec runs on: "
                    + "; ".join(change.refused),
                    warning=True,
                )
            return None
        if isinstance(step, ApplyInPlace):
            managed.upgrades.rolled_back_generation = 0
            managed.set(upgrade_failed="")
            if not step.rebuild:
                return None
            return step.wait_s if step.wait_s is not None else self._rebuild(managed, context, change)
        if isinstance(step, KeepRolledBack):
            last = managed.published.get("lastUpgrade") or {}
            managed.set(upgrade_failed=str(last.get("reason") or f"generation {context.generation} was rolled back"))
            return None
        if isinstance(step, WaitToUpgrade):
            return step.wait_s
        return self._upgrade(managed, context, change)

    def _rebuild(self, managed: ManagedTopology, context: PassContext, change: SpecChange) -> float | None:
        """Scaling settings (strategy, migration protocol, window, checkpoint interval) changed, and the spec
        settled: the controller is built again with them and adopts the running pods, as after an operator
        restart."""
        old = managed.controller
        assert old is not None
        managed.state_epoch = old.epoch or managed.state_epoch
        old.close(stop_workers=False)
        managed.controller = None
        delay = self.lifecycle.start(managed, context, context.wanted)
        if delay is None:
            managed.events.emit(
                EventReason.UPGRADED,
                f"generation {context.generation}: {', '.join(change.controller)} applied; the pods run on",
            )
        return delay

    def _upgrade(self, managed: ManagedTopology, context: PassContext, change: SpecChange) -> float | None:
        """A stateful upgrade: a checkpoint of the running workers (`TopologyController.suspend`), the old pods
        stopped, a controller of the wanted spec whose pods start from that checkpoint (the recovery's restore:
        kept vertices' key groups carry their state, exactly-once sinks' output staged after it discarded).
        A checkpoint that fails stops nothing and is retried with backoff. New pods that do not start within
        the worker start timeout are stopped and the previous spec's pods start again from the same checkpoint
        (`_roll_back`). Returns None when the pass may go on with the new controller."""
        old = managed.controller
        assert old is not None
        wanted, metadata, generation = context.wanted, context.metadata, context.generation
        started_at = utc_timestamp(self.clock.now())
        if not managed.facts.upgrading:
            managed.events.emit(
                EventReason.UPGRADE_STARTED,
                f"generation {generation}: {change.describe()}: a checkpoint, then the old pods stop and new ones "
                "start from it",
            )
        managed.set(upgrading=f"generation {generation}: taking a checkpoint of the running workers")
        managed.write()  # Upgrading, before the checkpoint's barriers hold the pass
        try:
            managed.backend.record_upgrade(old.topology)  # `old` is still the managed controller
        except BackendError as exc:
            result = SuspendResult(False, reason=f"the upgrade could not be recorded: {exc}")
        else:
            result = old.suspend(announce=False)
        managed.note_store()
        if not result.done:
            what = f"generation {generation}: {result.reason}"
            delay = self.lifecycle.not_yet(managed, UpgradeAttempt(), result.reason, EventReason.UPGRADE_BACKOFF, what)
            managed.set(upgrading=f"{what}; the old pods run on, retrying in {delay:.0f} s")
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
        managed.write()  # before the new pods' start holds the pass
        try:
            controller, report = self._restart_as(managed, metadata, wanted, f"upgrading to generation {generation}")
        except (BackendError, redis.RedisError, AclRefused, StateLost) as exc:
            return self._roll_back(managed, context, old.topology, change, str(exc), checkpoint, started_at)
        managed.controller = controller
        self.convergence.upgraded(managed, wanted)
        replayed = report.replayed if report is not None else 0
        self._upgrade_done(managed)
        managed.set(upgrading="", upgrade_failed="", started=True, backend_error="", scaling_failed="", suspended=False)
        managed.published["lastUpgrade"] = {
            "generation": generation,
            "outcome": UPGRADE_SUCCEEDED,
            "changes": change.describe(),
            "checkpoint": checkpoint or "",
            "replayed": replayed,
            "startedAt": started_at,
            "finishedAt": utc_timestamp(self.clock.now()),
        }
        managed.events.emit(
            EventReason.UPGRADED,
            f"generation {generation} runs: started from checkpoint {checkpoint or '(none: the sources beginning)'}, "
            f"{replayed} events replayed",
        )
        managed.write()  # the new generation runs: said before the rest of the pass (a tick, a scaling) holds it
        return None

    @staticmethod
    def _upgrade_done(managed: ManagedTopology) -> None:
        """The ConfigMap's record of the upgrade goes (its pods run); a failure only leaves it for the next
        operator to find, which then restarts the upgrade from the latest checkpoint: logged, not raised."""
        try:
            managed.backend.record_upgrade(None)
        except BackendError as exc:
            log.warning("the record of a finished upgrade was not removed: %s", exc)

    def _restart_as(
        self, managed: ManagedTopology, metadata: Mapping[str, Any], topology: Topology, why: str
    ) -> tuple[TopologyController, Any]:
        """A controller of `topology` whose pods start from the latest checkpoint (none runs now). On failure its
        pods are stopped and the error raised."""
        controller = self.controllers.new(topology, metadata, managed)
        self.warm_up(topology)
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
        context: PassContext,
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
        generation, metadata = context.generation, context.metadata
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
        managed.upgrades.rolled_back_generation = generation
        managed.published["lastUpgrade"] = {
            "generation": generation,
            "outcome": UPGRADE_ROLLED_BACK,
            "changes": change.describe(),
            "checkpoint": checkpoint or "",
            "reason": message,
            "startedAt": started_at,
            "finishedAt": utc_timestamp(self.clock.now()),
        }
        try:
            controller, _ = self._restart_as(managed, metadata, previous, "rolling back a failed upgrade")
        except (BackendError, redis.RedisError, AclRefused, StateLost) as exc:
            controller = self.controllers.new(previous, metadata, managed)
            with contextlib.suppress(Exception):
                controller.start_suspended(None)
            controller.suspended = True  # the next pass's resume starts it, with backoff
            managed.controller = controller
            delay = self.lifecycle.start_failed(managed, ResumeAttempt(), exc, self.clock.monotonic())
            managed.set(upgrading="", upgrade_failed=message, resuming=True)
            return delay
        managed.controller = controller
        self._upgrade_done(managed)
        managed.set(upgrading="", upgrade_failed=message, backend_error="", started=True, suspended=False)
        managed.events.emit(EventReason.UPGRADE_ROLLED_BACK, message, warning=True)
        return self.pacing.tick_s
