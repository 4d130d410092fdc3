"""The start, suspend and resume of a topology, a part of the reconcile pass (`Lifecycle`): a start (or the
adoption of the pods an earlier operator left, or a start from `spec.initialSavepoint`), failed attempts
retried with backoff, `spec.suspend` carried out (a last checkpoint, then the workers stop) and undone, the
topology's Redis user kept, and the restart from scratch a user annotates after StateLost.

It owns the `StartAttempt`, `ResumeAttempt` and `SuspendAttempt` of a topology and the facts of a start
(started, the start's errors) and of a suspend (suspending, suspended). What a suspend does, what its checkpoint
led to and how a failed start is reported are pure decisions (`suspend_step`, `suspend_outcome`,
`start_failure`) that the part carries out. It acts through the controller it builds (`ControllerFactory`) and
that controller's ports, and tells `Convergence` the degrees a started controller runs; it writes the status
only before a step that waits (the pods' start, the suspend's checkpoint, the resume): the pass writes it at
its end."""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from elastream.control.attempts import AttemptTarget, ResumeAttempt, StartAttempt, SuspendAttempt
from elastream.control.controller import TopologyController
from elastream.control.controller_factory import ControllerFactory
from elastream.control.convergence import Convergence
from elastream.control.managed import (
    ManagedTopology,
)
from elastream.control.pacing import Pacing
from elastream.control.pass_context import PassContext
from elastream.control.savepoint_actions import SavepointError, Savepoints
from elastream.core.ports import BackendError, Clock, NotOwned, StateLost
from elastream.core.savepoint_rules import SavepointMeta
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.status import (
    EventReason,
)
from elastream.core.topology import (
    Topology,
    glob_escape,
    topology_prefix,
)
from elastream.store.acl import AclRefused
from elastream.store.registry import Registry

log = logging.getLogger("elastream.operator")


#: the annotation that answers StateLost: start over from the sources' beginning
RESTART_FROM_SCRATCH = "elastream.dev/restart-from-scratch"

#: seconds between passes of a suspended topology (nothing runs; a change of the resource wakes it at once)
SUSPENDED_TICK_S = 30.0


@dataclass(frozen=True)
class StartFailure:
    """How a failed start or resume is reported: the fact it sets (a `StatusFacts` field and its text) and the
    Warning event that says it."""

    fact: str
    detail: str
    reason: str
    message: str


def start_failure(exc: Exception, target: AttemptTarget, delay: float) -> StartFailure:
    """How a start (or a resume: `target`) that failed with `exc`, retried in `delay` seconds, is reported
    (pure)."""
    if isinstance(exc, NotOwned):  # someone else's object in the way: untouched, said once
        return StartFailure("not_owned", str(exc), EventReason.OBJECT_NOT_OWNED, str(exc))
    if isinstance(exc, AclRefused):  # no worker starts without its user: the fix is the operator's
        return StartFailure("redis_user_refused", str(exc), EventReason.REDIS_USER_REFUSED, str(exc))
    what = "resuming" if isinstance(target, ResumeAttempt) else "starting"
    message = f"{what}: {exc}; retrying in {delay:.0f} s"
    if isinstance(exc, redis.RedisError):
        return StartFailure("redis_unavailable", f"{type(exc).__name__}: {exc}", EventReason.START_FAILED, message)
    return StartFailure("backend_error", str(exc), EventReason.START_FAILED, message)


@dataclass(frozen=True)
class KeepSuspended:
    """The workers are stopped already: the status keeps saying Suspended."""


@dataclass(frozen=True)
class WaitToSuspend:
    """The suspend's last checkpoint failed and backs off for `wait_s` more seconds."""

    wait_s: float


@dataclass(frozen=True)
class TakeLastCheckpoint:
    """Take the last checkpoint and stop the workers (`announce`: say Suspending first, the first try)."""

    announce: bool


#: what `Lifecycle.suspend` does while `spec.suspend` is true
SuspendStep = KeepSuspended | WaitToSuspend | TakeLastCheckpoint


def suspend_step(suspended: bool, backoff_s: float | None, suspending: str) -> SuspendStep:
    """What a suspend does this pass (pure): `backoff_s` is what a failed checkpoint still waits (None: none),
    `suspending` what the status says of a suspend in progress ("" none)."""
    if suspended:
        return KeepSuspended()
    if backoff_s is not None:
        return WaitToSuspend(backoff_s)
    return TakeLastCheckpoint(announce=not suspending)


class SuspendOutcome(enum.Enum):
    """What a suspend's checkpoint led to."""

    SUSPENDED = "suspended"
    #: no checkpoint over a lost state, and stopping would lose what the workers hold: they run on
    RUN_ON_LOST_STATE = "run on: the state is lost"
    BACK_OFF = "back off: the checkpoint failed"


def suspend_outcome(done: bool, state_lost: str) -> SuspendOutcome:
    """The suspend's checkpoint was taken and the workers stopped (`done`), or why not (pure)."""
    if done:
        return SuspendOutcome.SUSPENDED
    return SuspendOutcome.RUN_ON_LOST_STATE if state_lost else SuspendOutcome.BACK_OFF


class Lifecycle:
    """The start, suspend and resume of each topology (see the module)."""

    def __init__(
        self,
        controllers: ControllerFactory,
        convergence: Convergence,
        pacing: Pacing,
        clock: Clock,
        warm_up: Callable[[Topology], object],
        savepoints: Callable[[], Savepoints],
        running_schedule: Callable[[Topology], Schedule | None],
        redis_client: redis.Redis,
    ) -> None:
        self.controllers = controllers
        #: told of the degrees a started controller runs (its record's)
        self.convergence = convergence
        self.pacing = pacing
        self.clock = clock
        #: the analysis session warms up for a topology about to start (on a thread of its own)
        self.warm_up = warm_up
        self.savepoints = savepoints
        self.running_schedule = running_schedule
        self.redis_client = redis_client

    def start(self, managed: ManagedTopology, context: PassContext, topology: Topology) -> float | None:
        """Build and start the controller of `topology` (or adopt the pods an earlier operator left); None when
        it runs, else the seconds until the next try (a failed start backs off)."""
        now = context.now
        wait = managed.waits(StartAttempt(), now)
        if wait is not None:
            return wait
        if not (managed.writer.written or {}).get("phase"):
            managed.write()  # a new topology: Pending / Starting, before the pods' start holds this pass
        controller = self.controllers.new(topology, context.metadata, managed)
        self.warm_up(topology)
        try:
            # after an operator restart the running schedule is in Redis: adopt it rather than start over
            schedule = self.running_schedule(topology)
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
            self.state_lost_event(managed, controller, exc)
            managed.set(state_lost=str(exc))
            return self.pacing.tick_s
        except SavepointError as exc:
            with contextlib.suppress(Exception):
                controller.close()
            if exc.retry:  # not there (yet): retried with backoff, StartFailed saying what is missing
                return self.start_failed(managed, StartAttempt(), exc, now)
            message = str(exc)  # the user's to fix: InvalidSpec naming spec.initialSavepoint
            managed.set(invalid_spec=message)
            # said at each try (every 30 s): the pass's record of the invalid spec it reported is its own
            managed.events.emit(EventReason.INVALID_SPEC, message, warning=True)
            return 30.0
        except (BackendError, redis.RedisError, AclRefused) as exc:
            delay = self.start_failed(managed, StartAttempt(), exc, now)
            with contextlib.suppress(Exception):  # what started of it goes; the next try starts afresh
                controller.close()
            return delay
        managed.controller = controller
        managed.attempt = None
        if restored is not None:
            managed.events.emit(
                EventReason.RESTORED_FROM_SAVEPOINT,
                f"started from savepoint {restored.name} of {restored.namespace}/{restored.topology} "
                f"(checkpoint {restored.checkpoint}, taken {restored.taken_at})",
            )
        self.convergence.started(managed, topology)
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

    def not_yet(self, managed: ManagedTopology, target: AttemptTarget, reason: str, event: str, what: str) -> float:
        """A checkpoint before stopping the workers (a suspend's, an upgrade's: `target`) was not taken, so
        nothing was stopped: backed off, said in a Warning `event` beginning with `what`. Returns the delay."""
        delay = self._failed(managed, target, reason, self.clock.monotonic())
        managed.events.emit(event, f"{what}; nothing was stopped, retrying in {delay:.0f} s", warning=True)
        return delay

    def start_failed(self, managed: ManagedTopology, target: AttemptTarget, exc: Exception, now: float) -> float:
        """A start (or a resume: `target`) failed: note why in the facts, say it in an event, back off.
        Returns the seconds until the next try."""
        delay = self._failed(managed, target, str(exc), now)
        report = start_failure(exc, target, delay)
        managed.set(**{report.fact: report.detail})
        managed.events.emit(report.reason, report.message, warning=True)
        return delay

    def _failed(self, managed: ManagedTopology, target: AttemptTarget, reason: str, now: float) -> float:
        """Another failure to reach `target`, backed off: the seconds until the next try."""
        return managed.failed(target, reason, now, self.pacing.retry_s, self.pacing.retry_cap_s).delay

    def suspend(self, managed: ManagedTopology, context: PassContext) -> float:
        """`spec.suspend` is true: take the last checkpoint and stop the workers (`TopologyController.suspend`),
        or, once done, keep the status saying Suspended. Nothing else of the pass runs: no recovery, no
        scaling, no autoscaler (a changed spec.nodes is kept in the spec and applies on resume). A
        checkpoint that fails stops nothing; it is retried with backoff, Reconciling (Suspending) saying
        why, Stalled (SuspendFailed) after `STALL_AFTER_FAILURES` in a row. The pass waits for nothing else:
        a scaling runs within a pass, so none is in flight here; one a dead controller left is finished or
        rolled back by the suspend first."""
        controller = managed.controller
        assert controller is not None
        step = suspend_step(
            controller.suspended, managed.waits(SuspendAttempt(), context.now), managed.facts.suspending
        )
        if isinstance(step, KeepSuspended):
            controller.check_state()
            managed.set(
                suspended=True,
                suspended_at=controller.resume_point or "",
                suspending="",
                state_lost=controller.state_lost,
            )
            return SUSPENDED_TICK_S
        if isinstance(step, WaitToSuspend):
            return step.wait_s
        if step.announce:
            managed.set(suspending="taking the last checkpoint before stopping the workers")
            managed.write()  # Suspending, before the checkpoint's barriers hold the pass
        result = controller.suspend()
        managed.note_store()
        managed.set(state_lost=controller.state_lost)
        outcome = suspend_outcome(result.done, controller.state_lost)
        if outcome is SuspendOutcome.RUN_ON_LOST_STATE:
            # no checkpoint can be written over a lost state, and stopping would lose what the workers hold:
            # the workers run on, Stalled (StateLost) says what the user must decide
            managed.set(suspending="the topology's state in Redis is lost: nothing is stopped")
            return self.pacing.tick_s
        if outcome is SuspendOutcome.BACK_OFF:
            delay = self.not_yet(
                managed, SuspendAttempt(), result.reason, EventReason.SUSPEND_BACKOFF, f"suspend: {result.reason}"
            )
            managed.set(suspending=f"{result.reason}; the workers run on, retrying in {delay:.0f} s")
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
        return SUSPENDED_TICK_S

    def not_suspending(self, managed: ManagedTopology) -> None:
        """`spec.suspend` is not (or no longer) asked for: a suspend's failed checkpoint is not retried (nothing
        was stopped), and the status stops saying Suspending."""
        if managed.attempt is not None and isinstance(managed.attempt.target, SuspendAttempt):
            managed.attempt = None
        managed.set(suspending="")

    def resume(self, managed: ManagedTopology, context: PassContext) -> float | None:
        """`spec.suspend` is false again: start the workers from the suspend's checkpoint
        (`TopologyController.resume`); None when they run (the pass then converges at once to the scaling
        asked meanwhile), else the seconds until the next try (a failed resume backs off as a failed start
        does; Redis away is RedisUnavailable, a lost state StateLost)."""
        controller = managed.controller
        assert controller is not None
        now = context.now
        wait = managed.waits(ResumeAttempt(), now)
        if wait is not None:
            return wait
        # not Suspended any more: Resuming until the workers run (a failed try stays so, saying why)
        managed.set(suspended=False, suspended_at="", resuming=True)
        managed.write()  # Resuming, before the restore waits for the pods
        try:
            controller.resume()
        except StateLost as exc:
            self.state_lost_event(managed, controller, exc)
            managed.set(state_lost=str(exc))
            return self.pacing.tick_s
        except (BackendError, redis.RedisError, AclRefused) as exc:
            return self.start_failed(managed, ResumeAttempt(), exc, now)
        managed.attempt = None
        managed.set(
            resuming=False,
            backend_error="",
            redis_unavailable="",
            state_lost="",
            not_owned="",
            redis_user_refused="",
        )
        return None

    @staticmethod
    def state_lost_event(managed: ManagedTopology, controller: TopologyController, exc: StateLost) -> None:
        """One StateLost event for a restore that found its checkpoint's (or savepoint's) keys gone; a lost
        epoch was announced by the controller already (`controller.state_lost`)."""
        if not controller.state_lost and managed.facts.state_lost != str(exc):
            managed.events.emit(EventReason.STATE_LOST, str(exc), warning=True)

    def check_redis_user(self, managed: ManagedTopology) -> None:
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

    def restart_from_scratch(self, managed: ManagedTopology) -> None:
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


def delete_keys_logged(client: redis.Redis, prefix: str, key: str) -> None:
    """`delete_keys`, a Redis error logged rather than raised."""
    try:
        delete_keys(client, prefix)
    except redis.RedisError as exc:
        log.warning("keys of %s not deleted (Redis: %s); they stay under %s", key, exc, prefix)


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


def registry_schedule(client: redis.Redis) -> Callable[[Topology], Schedule | None]:
    """The schedule the workers of a topology run, as Redis keeps it (after an operator restart: adopted)."""

    def read(topology: Topology) -> Schedule | None:
        found = Registry(client, topology.redis_prefix).schedule()
        return found[1] if found is not None else None

    return read
