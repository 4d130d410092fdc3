"""Driving a migration from one schedule to another: the pure `MigrationCoordinator` decides, this carries it
out over the control channel (Redis lists to the workers), the Redis checkpoint store (record, acks) and the
`Backend`.

CCR and DCR never restart a worker that stays: before anything is paused the backend `prepare`s the new
schedule (nodes it adds start and become ready, idle; staying workers bind their new executors' inboxes);
after COMMIT it `apply`s it in place (each worker stops the executors it loses and starts the ones it gains,
waiting for INIT; removed nodes exit). A new schedule that cannot be prepared fails the migration before
PREPARE, with nothing paused.

The record in Redis (`<prefix>mig:<id>`, phase preparing -> committing -> rebalancing -> initializing) lets a
new controller finish a migration whose controller died: before COMMIT completed it aborts (executors
replay their captured events, sources resume), after it goes forward (the state is in Redis). If the new
schedule cannot be applied after COMMIT, the old one is applied again and initialised from the same
state, so nothing is lost either way.

With `scope="moving"` (CCR only) only what moves pauses (`core.migration_scope`): PREPARE and COMMIT go to
the executors that move and to the kept ones that send to them (they hold what is addressed to the moving
ones, COMMIT in-band into them); everything else runs on, the workers switch only the moving executors,
INIT goes to their new instances, RESUME to the moving sources. Its checkpoint holds only the moving
executors, not a consistent cut: it is deleted after INIT, and the last periodic checkpoint stays the one a
failure rolls back to, which is the answer to anything going wrong after COMMIT (a kept executor's state is
only in its process: the old schedule cannot be put back); without one, the migration takes scope `all`.

`restart` (Storm's and Flink's default, the baseline) stops every worker and starts the new schedule from
the last periodic checkpoint (`control.checkpoint_driver`); the sources replay what they emitted after it and
the report counts those events. A rollback (`MigrationDriver.roll_back`) is the same restore done in place,
for recovery: the surviving workers reload the schedule from the checkpoint without a process restart and
dead ones are started again. A worker that dies before COMMIT completes aborts a CCR or DCR migration and the
topology rolls back to the last periodic checkpoint, so what the dead process held is replayed, not lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import redis

from elastream.control.batched_migration import BatchedRun, direction
from elastream.control.checkpoint_driver import abandon_checkpoint
from elastream.control.retrying import retry_within
from elastream.core.checkpoint_protocol import replayed_events
from elastream.core.keygroup_batches import BatchBudget, Load
from elastream.core.migration_protocol import (
    SENDER,
    Ack,
    Action,
    ActionKind,
    ControlType,
    MigrationCoordinator,
    MigrationReport,
    MigrationStalled,
    Phase,
    PhaseTimes,
    Timeouts,
    first_few,
)
from elastream.core.migration_scope import MigrationParts, migration_parts
from elastream.core.outcomes import Outcome
from elastream.core.ports import Backend, BackendError, Clock, EventSink, SystemClock
from elastream.core.schedule import Schedule
from elastream.core.status import EventReason
from elastream.core.topology import Topology, split_executor_id
from elastream.core.topology.limits import MigrationProtocol, MigrationScope
from elastream.store.checkpoint_store import CheckpointScope, CheckpointStore, DurableCommits
from elastream.store.claim import OWNER_TTL_S, OwnerLease, controller_identity
from elastream.store.codec import unpack
from elastream.store.control import ControlChannel
from elastream.store.retry import backoff

log = logging.getLogger("elastream.migration")

ACK_PHASES = {Phase.PREPARING: "preparing", Phase.COMMITTING: "committing", Phase.INITIALIZING: "initializing"}


class MigrationError(BackendError):
    """A migration cannot start (another one is in progress) or cannot finish; the message says why."""


class MigrationInterrupted(MigrationError):
    """A migration in flight had to stop waiting (Redis away too long, a stalled phase, the topology being
    deleted): its record stays in Redis and `resume` finishes or aborts it."""


class _Quiet:
    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        (log.warning if warning else log.info)("%s: %s", reason, message)


@dataclass
class MigrationDriver:
    topology: Topology
    backend: Backend
    client: redis.Redis
    protocol: MigrationProtocol = "ccr"
    #: `restart` only: reload surviving workers in place instead of stopping them (recovery from a failure)
    in_place: bool = False
    timeouts: Timeouts = field(default_factory=Timeouts)
    clock: Clock = field(default_factory=SystemClock)
    events: EventSink = field(default_factory=_Quiet)
    #: how often acks are read while a migration runs (its phases wait on them: this is pause time)
    poll_s: float = 0.005
    #: called before each action is carried out (fault tests kill a worker or the controller here)
    before_action: Callable[[Action, MigrationCoordinator], None] | None = None
    #: `keyGroups`: called before each step's FLIP with its number (the same, for a batched migration)
    before_step: Callable[[int], None] | None = None
    #: this controller as the owner of its migrations (`store.claim`), and how long its lease lasts unrenewed
    identity: str = field(default_factory=controller_identity)
    owner_ttl_s: int = OWNER_TTL_S
    #: how long a migration in flight waits for Redis to come back before it is left for `resume`
    redis_wait_s: float = 120.0
    #: set to make a migration in flight stop waiting (the topology is being deleted)
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: told when Redis goes away (with why) and comes back (""), while a migration waits for it
    on_redis: Callable[[str], None] | None = None
    #: called before a migration (a rescale, a drain, a recovery's rollback) claims the topology: this
    #: controller's own checkpoint round, which spans reconcile passes, gives way (`CheckpointDriver.abandon_open`)
    before_claim: Callable[[str], object] | None = None
    #: the id of this controller's own checkpoint round in progress (`CheckpointDriver.open_round`): driven, so
    #: never "unfinished" (a round spans reconcile passes and holds the topology's claim meanwhile)
    own_round: Callable[[], str | None] | None = None
    #: CCR: pause every executor (`all`), only those that move (`moving`), or nothing but key groups in flight
    #: (`keyGroups`, `control.batched_migration`); see the module
    scope: MigrationScope = "all"
    #: `keyGroups`: what a batch may cost
    batch_budget: BatchBudget = field(default_factory=BatchBudget)
    #: whether a completed migration (the latest checkpoint then) waits for its commit to be on disk
    durability: DurableCommits = field(default_factory=DurableCommits.from_env)
    #: the topology's own Redis user's connection, which a completion runs on (`CheckpointStore.commit_as`)
    commit_as: Callable[[], redis.Redis | None] | None = None

    def __post_init__(self) -> None:
        self.store = CheckpointStore(
            self.client, self.topology.redis_prefix, durability=self.durability, commit_as=self.commit_as
        )
        self.owner = OwnerLease(self.client, self.topology.redis_prefix, self.identity, self.owner_ttl_s)

    def redis_step(self, step: Callable[[], Any], what: str) -> Any:
        """Run `step` (which talks to Redis), retrying while Redis is away for up to `redis_wait_s`; then
        raise `MigrationInterrupted` (the record stays for `resume`)."""
        down_since: float | None = None

        def attempt() -> Any:
            if self.cancelled.is_set():
                raise MigrationInterrupted(f"{what}: stopped, the topology is being deleted")
            return step()

        def failed(exc: Exception) -> None:
            nonlocal down_since
            if down_since is None:
                down_since = self.clock.monotonic()
                log.warning("%s: Redis unavailable (%s); waiting up to %.0f s", what, exc, self.redis_wait_s)
                if self.on_redis is not None:
                    self.on_redis(f"{type(exc).__name__}: {exc}")

        try:
            result = retry_within(
                attempt,
                transient=lambda exc: isinstance(exc, redis.RedisError),
                within_s=self.redis_wait_s,
                clock=self.clock,
                delays=backoff(0.1, 2.0, 2.0),
                on_failure=failed,
            )
        except redis.RedisError as exc:
            down = self.clock.monotonic() - (down_since if down_since is not None else self.clock.monotonic())
            raise MigrationInterrupted(
                f"{what}: Redis unavailable for {down:.0f} s ({exc}); the migration's record "
                "stays in Redis and is finished or rolled back when Redis is back"
            ) from None
        if down_since is not None:
            log.warning("%s: Redis is back after %.1f s", what, self.clock.monotonic() - down_since)
            if self.on_redis is not None:
                self.on_redis("")
        return result

    def unfinished(self) -> str | None:
        """The id of a migration or checkpoint that holds the topology with no live owner driving it (its
        controller died, or gave up waiting for Redis): `resume` finishes or abandons it. None otherwise, and
        for this controller's own checkpoint round in progress (`own_round`)."""
        current = self.store.current()
        if current is None or (self.own_round is not None and current == self.own_round()):
            return None
        if self.owner.held_by_another() is not None:
            return None
        return current

    def _control(self) -> ControlChannel:
        return ControlChannel(self.client, self.topology.redis_prefix, self.backend.current_schedule())

    # ------------------------------------------------------------------------------------------ entry points

    def migrate(self, new: Schedule, load: Load | None = None) -> MigrationReport:
        """Move the running topology to `new` with the driver's protocol; returns the report. `load`: each
        vertex's state and input rate, which a key-group migration sizes its batches from (none: the largest
        batches the budget allows)."""
        old = self.backend.current_schedule()
        mid = uuid.uuid4().hex[:12]
        if self.before_claim is not None:
            # the claim loop below waits only for a round of another thread; this controller's own round would
            # not end while it waits (it is followed by the same pass), so it is given up first
            self.before_claim(f"{self.protocol} migration {mid} claims the topology")
        scope = self.scope_for()
        prepare_ms = None
        if self.protocol != "restart":
            # added nodes start and every worker binds its new inboxes now, while everything still runs
            started = self.clock.now()
            try:
                self.backend.prepare(new, scope=scope)
            except BackendError as exc:
                return self._not_started(mid, old, new, f"the new schedule could not be prepared: {exc}")
            prepare_ms = (self.clock.now() - started) * 1000.0
        record = {
            "id": mid,
            "protocol": self.protocol,
            "phase": Phase.PREPARING.value,
            "old": json.dumps(old.to_dict()),
            "new": json.dumps(new.to_dict()),
            "startedAt": self.clock.now(),
            "scope": scope,
        }
        if self.protocol == "restart":
            latest = self.store.latest_checkpoint()
            record["restoreFrom"] = latest["id"] if latest else ""
            if latest:
                # its state and positions must all be there: restored missing, they would be empty state and
                # sources from their beginning, with nothing said (StateLost instead, before anything stops)
                self.store.ensure_restorable(latest, self.topology.order)
        deadline = self.clock.now() + self.timeouts.prepare_s
        while not self._begin(mid, record, new):
            current = self.store.current()
            if self.clock.now() < deadline and (current is None or current.startswith("ckpt-")):
                # a periodic checkpoint is being taken: it takes a moment (None: it ended since `begin`)
                if current is not None:
                    self.clock.sleep(self.poll_s)
                continue
            self.backend.discard(new)
            raise MigrationError(
                f"migration {current} of {self.topology.name} is in progress; wait for it to finish "
                "(or let a restarted controller resume it)"
            )
        if scope == "keyGroups":
            self.events.emit(
                EventReason.MIGRATION_STARTED,
                f"key-group migration {mid}: {len(old.nodes)} -> {len(new.nodes)} nodes",
            )
            batched = BatchedRun(
                self,
                mid,
                old,
                new,
                migration_parts(self.topology, old, new, "moving"),
                budget=self.batch_budget,
                load=load or {},
                prepare_ms=prepare_ms,
            )
            return batched.go()
        parts = migration_parts(self.topology, old, new, scope)
        coordinator = MigrationCoordinator(mid, self.protocol, parts.participants, parts.moving_new, self.timeouts)
        run = _Run(self, coordinator, old, new, self._control(), parts, restore_from=str(record.get("restoreFrom", "")))
        run.prepare_ms = prepare_ms
        self.events.emit(
            EventReason.MIGRATION_STARTED,
            f"{self.protocol} migration {mid}: {len(old.nodes)} -> {len(new.nodes)} nodes",
        )
        return run.go(coordinator.start(self.clock.now()))

    def scope_for(self) -> MigrationScope:
        """The scope this migration takes: `moving` or `keyGroups` only for CCR, and only with a periodic
        checkpoint to roll back to should anything go wrong once state has moved (see the module)."""
        if self.scope == "all" or self.protocol != "ccr":
            return "all"
        if self.store.latest_checkpoint() is None:
            log.info("%s: no periodic checkpoint yet: this migration pauses every executor", self.topology.name)
            return "all"
        return self.scope

    def _begin(self, mid: str, record: dict[str, Any], new: Schedule) -> bool:
        """Claim the topology for `mid` and take the owner lease; Redis away: nothing was paused yet, so the
        prepared schedule is discarded and the migration fails cleanly."""
        try:
            if not self.owner.renew():
                return False  # another live controller drives this topology's migrations
            return self.store.begin(mid, record)
        except redis.RedisError as exc:
            try:
                self.backend.discard(new)
            except (BackendError, redis.RedisError) as again:
                log.warning("discarding the prepared schedule: %s", again)
            raise MigrationError(f"Redis unavailable, the migration did not start: {exc}") from None

    def _not_started(self, mid: str, old: Schedule, new: Schedule, reason: str) -> MigrationReport:
        self.events.emit(
            EventReason.MIGRATION_FAILED, f"{self.protocol} migration {mid} not started: {reason}", warning=True
        )
        return MigrationReport(
            migration_id=mid,
            protocol=self.protocol,
            direction=direction(old, new),
            from_nodes=len(old.nodes),
            to_nodes=len(old.nodes),
            phases_ms=PhaseTimes().durations_ms(),  # every phase None: none of them ran
            captured_events=0,
            lost=0,
            replayed=0,
            outcome=Outcome.FAILED,
            reason=reason + "; nothing was paused, the old schedule runs on",
        )

    def interrupted_target(self) -> Schedule | None:
        mid = self.store.current()
        if mid is None or mid.startswith("ckpt-"):
            return None
        record = self.store.record(mid)
        if record.get("phase") in (Phase.REBALANCING.value, Phase.INITIALIZING.value) and record.get("new"):
            return Schedule.from_dict(json.loads(record["new"]))
        return None

    def recover(self, failed: dict[str, str]) -> MigrationReport | None:
        """Workers died (`failed`: node -> why). With a periodic checkpoint, roll the whole topology back to it
        in place (`roll_back`): dead nodes start again, survivors reload their executors from it, sources replay
        what came after it (counted as `replayed`), so nothing is lost. Without one, restart the dead workers
        empty and say what was lost (returns None)."""
        if self.store.latest_checkpoint() is not None:
            return self.roll_back()
        nodes = sorted(failed)
        self.backend.restart_nodes(nodes)
        self.events.emit(
            EventReason.WORKERS_RESTARTED,
            f"restarted {', '.join(nodes)} empty ({'; '.join(failed.values())}); no periodic checkpoint to roll "
            "back to, so the events and state the dead workers held are lost",
            True,
        )
        return None

    def roll_back(self) -> MigrationReport:
        """Roll the whole topology back to the last periodic checkpoint in place: a `restart` migration to the
        running schedule that reloads the surviving workers instead of stopping them, with state from the
        checkpoint and the sources replaying what came after it. What a dead worker, an aborted migration that
        lost one, and a partial migration that failed after COMMIT come to."""
        return replace(self, protocol="restart", in_place=True, before_action=None, before_step=None).migrate(
            self.backend.current_schedule()
        )

    def abandon_restore(self) -> str | None:
        mid = self.store.current()
        if mid is None or mid.startswith("ckpt-") or self.store.record(mid).get("protocol") != "restart":
            return None  # a CCR/DCR migration or a checkpoint round is `resume`'s to finish or abort
        # nothing of a restore commits before it completes (the exactly-once sinks commit with checkpoints)
        self.store.delete_migration(mid)
        return mid

    def resume(self) -> MigrationReport | None:
        """Finish (or abort) the migration a previous controller left in Redis; None when there is none."""
        mid = self.store.current()
        if mid is None:
            return None
        holder = self.owner.held_by_another()
        if holder is not None:
            log.info("%s is driven by %s, a live controller: not taken over", mid, holder)
            return None
        self.owner.renew()
        if mid.startswith("ckpt-"):
            # a periodic checkpoint whose controller died: abandon it, the previous one stays the latest
            abandon_checkpoint(self._control(), self.store, self.backend.current_schedule().assignment, mid)
            return None
        record = self.store.record(mid)
        old = Schedule.from_dict(json.loads(record["old"]))
        new = Schedule.from_dict(json.loads(record["new"]))
        if record.get("scope") == "keyGroups":
            # the state that moved lives only in the processes: roll back to the last periodic checkpoint
            self.events.emit(
                EventReason.MIGRATION_RESUMED,
                f"key-group migration {mid} found unfinished; rolling back to the last periodic checkpoint",
                warning=True,
            )
            with contextlib.suppress(BackendError, redis.RedisError):
                self.backend.discard(new)
            self.store.delete_migration(mid)
            return self.roll_back()
        protocol: MigrationProtocol = record.get("protocol", "ccr")  # type: ignore[assignment]
        scope: MigrationScope = "moving" if record.get("scope") == "moving" else "all"
        parts = migration_parts(self.topology, old, new, scope)
        coordinator = MigrationCoordinator(mid, protocol, parts.participants, parts.moving_new, self.timeouts)
        run = _Run(self, coordinator, old, new, self._control(), parts, restore_from=record.get("restoreFrom", ""))
        now = self.clock.now()
        coordinator.times.started_at = float(record.get("startedAt", now))
        phase = record.get("phase", Phase.PREPARING.value)
        self.events.emit(EventReason.MIGRATION_RESUMED, f"migration {mid} found in phase {phase}", warning=True)
        if phase in (Phase.PREPARING.value, Phase.COMMITTING.value):
            coordinator.phase = Phase.COMMITTING
            return run.go(coordinator.on_failure("the controller restarted before COMMIT completed", now))
        coordinator.phase = Phase.REBALANCING
        coordinator.phase_started = now
        if self.backend.current_schedule() != new:
            return run.go([Action(ActionKind.APPLY_SCHEDULE, reason="resume")])
        return run.go(coordinator.on_rebalanced(now))


@dataclass
class _Run:
    driver: MigrationDriver
    coordinator: MigrationCoordinator
    old: Schedule
    new: Schedule
    control: ControlChannel
    #: who takes part (`core.migration_scope`; scope `all`: everyone)
    parts: MigrationParts
    #: `restart`: the periodic checkpoint the new schedule starts from ("" when there is none yet)
    restore_from: str = ""
    target: Schedule | None = None
    rolled_back: str | None = None
    #: `restart`: events the sources emit again (from their latest positions back to the checkpoint's)
    replayed: int = 0
    #: after an abort that lost a worker: the restart that rolled the topology back to the last checkpoint
    rollback: MigrationReport | None = None
    prepare_ms: float | None = None
    #: when RESUME went to the sources (the end of the pause)
    resumed_at: float | None = None
    #: a partial migration that failed after COMMIT: why (the topology rolls back to the last checkpoint)
    fell_back: str | None = None

    @property
    def partial(self) -> bool:
        return bool(self.parts.kept)

    def go(self, actions: list[Action]) -> MigrationReport:
        """Carry out the coordinator's actions and feed it acks until it is done or aborted. Every step that
        talks to Redis is retried while Redis is away (`redis_step`); past that, or when a phase after COMMIT
        stalls, `MigrationInterrupted` leaves the record for `resume`."""
        driver, coordinator = self.driver, self.coordinator
        mid = coordinator.migration_id
        self.target = self.new
        heartbeat = 0.0
        try:
            while True:
                queue = list(actions)
                while queue:
                    action = queue.pop(0)
                    if action.kind == ActionKind.APPLY_SCHEDULE:
                        # from here on the migration only goes forward: a new controller must finish it
                        driver.redis_step(
                            lambda: driver.store.update_record(mid, {"phase": Phase.REBALANCING.value}),
                            f"migration {mid}",
                        )
                    if driver.before_action is not None:
                        driver.before_action(action, coordinator)
                    queue.extend(driver.redis_step(partial(self.do, action), f"migration {mid} {action.kind.value}"))
                if coordinator.phase in (Phase.DONE, Phase.ABORTED):
                    break
                driver.clock.sleep(driver.poll_s)
                if driver.clock.now() - heartbeat >= 2.0:
                    heartbeat = driver.clock.now()
                    driver.redis_step(driver.owner.renew, f"migration {mid}")
                actions = driver.redis_step(self.poll, f"migration {mid} {coordinator.phase.value}")
        except MigrationStalled as exc:
            raise MigrationInterrupted(f"{exc}; its state stays in Redis and it is resumed later") from None
        if coordinator.phase == Phase.ABORTED:
            driver.redis_step(lambda: driver.backend.discard(self.new), f"migration {mid} discard")
            failed = driver.backend.failed_nodes()
            if failed:
                self.rollback = driver.recover(failed)
            elif self.fell_back is not None:  # no worker died: the schedule did not come up
                self.rollback = driver.roll_back()
        with contextlib.suppress(redis.RedisError):  # the lease runs out by itself
            driver.owner.release()
        return self.report()

    def poll(self) -> list[Action]:
        driver, coordinator = self.driver, self.coordinator
        now = driver.clock.now()
        actions: list[Action] = []
        if coordinator.phase in (Phase.PREPARING, Phase.COMMITTING) or self.partial:
            try:
                driver.backend.check_alive()
            except BackendError as exc:
                reason = f"a worker failed during {coordinator.phase.value}: {exc}"
                if coordinator.phase == Phase.INITIALIZING:
                    return self.fall_back(reason)
                return coordinator.on_failure(reason, now)
        ack_phase = ACK_PHASES.get(coordinator.phase)
        if ack_phase is not None:
            phase = coordinator.phase
            for executor, info in driver.store.acks(coordinator.migration_id, ack_phase).items():
                ack = Ack(
                    coordinator.migration_id,
                    phase,
                    executor,
                    captured=int(info.get("captured", 0)),
                    state_bytes=int(info.get("state_bytes", 0)),
                    replayed=int(info.get("replayed", 0)),
                )
                actions += coordinator.on_ack(ack, now)
                if coordinator.phase != phase:
                    break
        return actions + coordinator.on_tick(now)

    # ------------------------------------------------------------------------------------------- actions

    def broadcast(self, executors: Any, message: dict[str, Any]) -> None:
        self.control.send_many(executors, message)

    def sources(self, schedule: Schedule) -> list[str]:
        return [e for e in schedule.assignment if split_executor_id(e)[0] in self.driver.topology.sources]

    def do(self, action: Action) -> list[Action]:
        driver, coordinator = self.driver, self.coordinator
        mid = coordinator.migration_id
        kind = action.kind
        if kind == ActionKind.BROADCAST_PREPARE:
            self.control.send_each(self.prepare_messages(action.executors))
        elif kind == ActionKind.START_COMMIT:
            driver.store.update_record(mid, {"phase": Phase.COMMITTING.value})
            self.control.send_each(self.commit_messages())
        elif kind == ActionKind.RESEND_COMMIT:
            log.info("migration %s: COMMIT again to %s (no ack yet)", mid, first_few(action.executors))
            self.control.send_each(self.commit_resends(action.executors))
        elif kind == ActionKind.APPLY_SCHEDULE:
            return self.apply()
        elif kind == ActionKind.BROADCAST_INIT:
            driver.store.update_record(mid, {"phase": Phase.INITIALIZING.value})
            self.broadcast(action.executors, self.init_message())
        elif kind == ActionKind.RESUME_SOURCES:
            aborted = coordinator.phase == Phase.ABORTED
            running = self.old if aborted else (self.target or self.new)
            paused = self.parts.moving_old if aborted else coordinator.new_executors
            resumed = [e for e in self.sources(running) if e in paused]
            self.broadcast(resumed, {"type": ControlType.RESUME, "mid": mid})
            self.resumed_at = driver.clock.now()
        elif kind == ActionKind.ABORT:
            self.broadcast(action.executors, {"type": ControlType.ABORT, "mid": mid})
            driver.events.emit(EventReason.MIGRATION_ABORTED, f"migration {mid}: {action.reason}", warning=True)
        elif kind == ActionKind.CLEANUP:
            if coordinator.phase == Phase.DONE and coordinator.protocol != "restart" and not self.partial:
                # its state, captured events and positions are a consistent cut: the latest checkpoint now,
                # committed with the exactly-once sinks' output staged at COMMIT
                info = {"completedAt": driver.clock.now(), "schedule": (self.target or self.new).to_dict()}
                done = driver.store.complete_checkpoint(mid, info, CheckpointScope.of(driver.topology))
                driver.store.release(mid)
                if done.not_durable:  # the migration is done all the same: only its durability is in doubt
                    log.warning("migration %s: %s", mid, done.not_durable)
            else:
                driver.store.delete_migration(mid)
        return []

    def prepare_messages(self, executors: Sequence[str]) -> dict[str, dict[str, Any]]:
        """PREPARE for each executor that moves (DCR: to the sources, which forward it in-band) and, in a
        partial migration, PREPARE as a sender, with what to hold, for each kept executor sending to them."""
        coordinator, parts = self.coordinator, self.parts
        mid = coordinator.migration_id
        message: dict[str, Any] = {"type": ControlType.PREPARE, "mid": mid, "protocol": coordinator.protocol}
        if self.partial:
            message["scope"] = "moving"
        targets = self.sources(self.old) if coordinator.protocol == "dcr" else executors
        messages = {e: message for e in targets if e in parts.moving_old}
        for sender, holds in parts.senders.items():
            messages[sender] = {"type": ControlType.PREPARE, "mid": mid, "role": SENDER, "hold": dict(holds)}
        return messages

    def commit_messages(self) -> dict[str, dict[str, Any]]:
        """COMMIT for the sources that move (they forward it in-band) and for the senders of a partial one."""
        commit: dict[str, Any] = {"type": ControlType.COMMIT, "mid": self.coordinator.migration_id}
        messages = {e: commit for e in self.sources(self.old) if e in self.parts.moving_old}
        for sender in self.parts.senders:
            messages[sender] = {**commit, "role": SENDER}
        return messages

    def commit_resends(self, executors: Sequence[str]) -> dict[str, dict[str, Any]]:
        """COMMIT again for `executors`, which have not acked it: each gets what `commit_messages` gave it (a
        sender its role), marked `resend`, and one that got nothing (it commits on COMMIT in-band) the plain
        COMMIT: it saves again and acks again if it has committed, and waits for its upstream otherwise."""
        first = self.commit_messages()
        plain: dict[str, Any] = {"type": ControlType.COMMIT, "mid": self.coordinator.migration_id}
        return {e: {**first.get(e, plain), "resend": True} for e in executors}

    def init_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": ControlType.INIT, "mid": self.coordinator.migration_id}
        if self.restore_from:
            message["from"] = self.restore_from
        if self.parts.partly_moving:  # their new executors share what the moving ones captured
            message["partlyMoving"] = {v: list(indices) for v, indices in self.parts.partly_moving.items()}
        return message

    def apply(self) -> list[Action]:
        """Switch to the target schedule in place (`restart`: stop every worker first); if it cannot be
        applied, apply the old one again: either way every executor is initialised from the state in Redis."""
        driver, coordinator = self.driver, self.coordinator
        target = self.target or self.new
        mid = coordinator.migration_id
        if coordinator.protocol == "restart" and not driver.in_place:
            driver.backend.stop_workers()
        try:
            driver.backend.apply(target, mid, scope="moving" if self.partial else "all")
        except BackendError as exc:
            if self.partial:
                return self.fall_back(f"the new schedule did not come up: {exc}")
            if self.rolled_back is not None:
                raise MigrationError(
                    f"migration {mid}: the new schedule failed ({self.rolled_back}) and so did the old one "
                    f"({exc}); the state is kept in Redis for `resume`"
                ) from None
            self.rolled_back = f"the new schedule did not come up: {exc}"
            driver.events.emit(EventReason.MIGRATION_ROLLING_BACK, self.rolled_back, warning=True)
            self.target = self.old
            coordinator.new_executors = coordinator.old_executors
            driver.backend.apply(self.old, mid)
        if coordinator.protocol == "restart":
            self.replayed = self.count_replay()
            # every executor restarts from the checkpoint: what sinks staged after it is replayed, not committed
            driver.store.discard_transactions()
        self.control.update(driver.backend.current_schedule())
        return coordinator.on_rebalanced(driver.clock.now())

    def fall_back(self, reason: str) -> list[Action]:
        """A partial migration failed after COMMIT: the kept executors' state is only in their processes, so
        the old schedule cannot be put back from the migration's checkpoint. The migration ends (its record
        and checkpoint go) and `go` rolls the topology back to the last periodic checkpoint."""
        coordinator = self.coordinator
        self.fell_back = reason
        coordinator.failure = reason
        coordinator.phase = Phase.ABORTED
        self.driver.events.emit(
            EventReason.MIGRATION_ROLLING_BACK,
            f"migration {coordinator.migration_id}: {reason}; rolling back to the last periodic checkpoint",
            warning=True,
        )
        return [Action(ActionKind.CLEANUP)]

    def count_replay(self) -> int:
        """What the sources will replay: from the positions they reached (published every interval and by
        each worker as it stops its executors) back to the checkpoint's, or to nothing without one."""
        store = self.driver.store
        latest = [unpack(blob) for blob in store.source_positions().values()]
        saved = store.load_positions(self.restore_from) if self.restore_from else {}
        checkpointed = [unpack(blob) for blob in saved.values()]
        store.clear_source_positions()  # the new sources publish theirs from the checkpoint on
        return replayed_events(checkpointed, latest)

    def report(self) -> MigrationReport:
        coordinator = self.coordinator
        if coordinator.phase == Phase.ABORTED:
            outcome, reason = Outcome.ABORTED, coordinator.failure or ""
            if self.rollback is not None:
                rollback = self.rollback
                reason += (
                    f"; rolled back to checkpoint {rollback.restored_from}: {rollback.replayed} events replayed"
                    if self.rollback.outcome == Outcome.SUCCEEDED
                    else f"; the rollback to the last checkpoint failed too: {rollback.reason}"
                )
        elif self.rolled_back is not None:
            outcome, reason = Outcome.ABORTED, f"rolled back to the old schedule: {self.rolled_back}"
        else:
            outcome, reason = Outcome.SUCCEEDED, ""
        if coordinator.protocol == "restart" and not self.restore_from and outcome == Outcome.SUCCEEDED:
            reason = "no periodic checkpoint yet: state started empty and the sources from their beginning"
        to_nodes = len((self.target or self.new).nodes) if outcome == Outcome.SUCCEEDED else len(self.old.nodes)
        report = MigrationReport(
            migration_id=coordinator.migration_id,
            protocol=coordinator.protocol,
            direction=direction(self.old, self.new),
            from_nodes=len(self.old.nodes),
            to_nodes=to_nodes,
            phases_ms=coordinator.times.durations_ms(),
            captured_events=coordinator.captured,
            lost=0,
            replayed=self.replayed if coordinator.protocol == "restart" else coordinator.replayed,
            outcome=outcome,
            reason=reason,
            restored_from=self.restore_from or None,
            scope="moving" if self.partial else "all",
            paused_executors=len(self.parts.moving_old),
            executors=len(self.old.assignment),
            pause_ms=None
            if self.resumed_at is None or coordinator.times.started_at is None
            else (self.resumed_at - coordinator.times.started_at) * 1000.0,
            prepare_ms=self.prepare_ms,
        )
        self.driver.events.emit(
            EventReason.MIGRATED if outcome == Outcome.SUCCEEDED else EventReason.MIGRATION_FAILED,
            f"{coordinator.protocol} migration {coordinator.migration_id} {outcome}: "
            + ", ".join(f"{k} {v:.0f}" for k, v in report.phases_ms.items() if v is not None)
            + f", {report.captured_events} events captured{'; ' + reason if reason else ''}",
            warning=outcome != Outcome.SUCCEEDED,
        )
        return report
