"""Driving a migration of scope `keyGroups` (`core.keygroup_batches`): key groups move a few at a time, in band,
and nothing pauses but a source that changes node, for its hand-over.

`MigrationDriver.migrate` has prepared the new schedule (the nodes it adds are up, every worker has bound the
inboxes of the executors that move, `core.migration_scope` with scope `moving`) and claimed the topology.
Then:
1. OVERLAP: every node of the new schedule starts its new executor instances beside the old ones; each
   awaits the key groups it will own. The nodes ack with the staged version, whose endpoints are read once.
   WARM: the nodes of the steps' senders open their channels to the recipients and wait (bounded) for their
   handshakes, so no FLIP opens a channel on the data's path.
2. Steps, as `BatchCoordinator` opens them (downstream vertices first, a bounded number at once): FLIP to the
   senders of the step's vertex (the old schedule's executors of its parents), which send MARKER in band and
   route the step's key groups to their recipients; each donor ships the state in band once it has every
   MARKER; each recipient acks its batch in Redis when installed. One controller round trip per step: it
   lengthens the migration, not any event's wait.
3. A source that moves hands over: HANDOFF to the old instance (it pauses and saves its position) and, in
   the same round trip, INIT and RESUME to the new one, which starts there as soon as the position is saved.
4. SWITCH (`Backend.apply` with scope `keyGroups`): the old instances, idle now, stop; kept executors get the
   new schedule's outputs; removed nodes exit.
Failure before the first FLIP moves nothing: the staged schedule is discarded (the new instances stop) and
the old one runs on. After it, the migration rolls the topology back to the last periodic checkpoint (state
that moved lives only in processes), as a dead worker's recovery does; `migrate` takes this scope only when
there is one. A controller that dies meanwhile leaves the record; the next one rolls back the same way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from elastream.core.keygroup_batches import (
    WARM_WAIT_S,
    BatchAction,
    BatchActionKind,
    BatchBudget,
    BatchCoordinator,
    Load,
    Step,
    batch_size,
    moves,
    plan_batches,
    plan_steps,
    senders_of,
    whole_vertices,
)
from elastream.core.migration_protocol import ControlType, MigrationReport, PhaseTimes, Timeouts
from elastream.core.migration_scope import MigrationParts
from elastream.core.outcomes import Direction, Outcome
from elastream.core.ports import Backend, BackendError, Clock, EventSink
from elastream.core.schedule import Schedule
from elastream.core.status import EventReason
from elastream.core.topology import Topology, split_executor_id
from elastream.store.checkpoint_store import CheckpointStore
from elastream.store.claim import OwnerLease
from elastream.store.control import ControlChannel
from elastream.store.registry import Registry

log = logging.getLogger("elastream.migration")


class Driver(Protocol):
    """What a batched migration uses of its `control.migration.MigrationDriver` (which imports this module:
    hence a port)."""

    topology: Topology
    backend: Backend
    client: redis.Redis
    clock: Clock
    events: EventSink
    poll_s: float
    timeouts: Timeouts
    store: CheckpointStore
    owner: OwnerLease
    #: called before each FLIP with the step's number (fault tests kill a worker or stop Redis here)
    before_step: Callable[[int], None] | None

    def redis_step(self, step: Callable[[], Any], what: str) -> Any: ...

    def roll_back(self) -> MigrationReport: ...


class BatchFailed(Exception):
    """The batched migration cannot go on (a worker died, a step stalled, the new schedule did not come up)."""


@dataclass
class BatchedRun:
    driver: Driver
    migration_id: str
    old: Schedule
    new: Schedule
    parts: MigrationParts
    budget: BatchBudget = field(default_factory=BatchBudget)
    load: Load = field(default_factory=dict)
    prepare_ms: float | None = None
    #: set once a FLIP went out: from then on a failure rolls back to the last periodic checkpoint
    flipped: bool = False
    times: PhaseTimes = field(default_factory=PhaseTimes)
    coordinator: BatchCoordinator | None = None
    handoff_ms: float | None = None
    rollback: MigrationReport | None = None

    @property
    def prefix(self) -> str:
        return self.driver.topology.redis_prefix

    def go(self) -> MigrationReport:
        """Carry the migration out (see the module); a Redis outage longer than the driver waits raises
        `MigrationInterrupted` from `redis_step`, leaving the record for the next controller."""
        driver, mid = self.driver, self.migration_id
        self.times.started_at = driver.clock.now()
        reason = ""
        try:
            version = self.overlap()
            self.times.prepare_done = driver.clock.now()
            endpoints: dict[str, str] = driver.redis_step(
                lambda: Registry(driver.client, self.prefix).endpoints(version), f"migration {mid} endpoints"
            )
            steps = self.plan()
            self.warm_channels(steps, endpoints)
            self.run_steps(steps, endpoints)
            self.times.commit_done = driver.clock.now()
            self.hand_over_sources()
            self.times.rebalance_done = driver.clock.now()
            try:
                driver.backend.apply(self.new, mid, scope="keyGroups")
            except BackendError as exc:
                raise BatchFailed(f"the new schedule did not come up: {exc}") from None
            self.times.init_done = driver.clock.now()
        except (BatchFailed, BackendError) as exc:
            reason = str(exc)
        if reason:
            self.fail(reason)
        else:
            driver.redis_step(lambda: driver.store.delete_migration(mid), f"migration {mid} cleanup")
        with contextlib.suppress(redis.RedisError):  # the lease runs out by itself
            driver.owner.release()
        return self.report(reason)

    # ------------------------------------------------------------------------------------------------ steps

    def overlap(self) -> int:
        """OVERLAP to every node of the new schedule; the staged version once all have acked."""
        driver, mid = self.driver, self.migration_id
        control = ControlChannel(driver.client, self.prefix, self.new)
        driver.redis_step(
            lambda: control.send_nodes(self.new.nodes, {"type": ControlType.OVERLAP, "mid": mid}), f"migration {mid}"
        )
        acks = self.wait_acks("overlap", set(self.new.nodes), driver.timeouts.prepare_s)
        versions = {int(info.get("version", 0)) for info in acks.values()}
        if len(versions) != 1:
            raise BatchFailed(f"the nodes staged different schedule versions {sorted(versions)}")
        return versions.pop()

    def plan(self) -> tuple[Step, ...]:
        """The migration's steps: its key groups' moves in batches (`core.keygroup_batches`)."""
        topology = self.driver.topology
        all_moves = moves(topology, self.old, self.new, self.parts.kept)
        sizes = {
            vertex: batch_size(
                *self.load.get(vertex, (0.0, 0.0)), topology.vertices[vertex].max_parallelism, self.budget
            )
            for vertex in {m.vertex for m in all_moves}
        }
        return plan_steps(plan_batches(all_moves, sizes), topology)

    def warm_channels(self, steps: tuple[Step, ...], endpoints: Mapping[str, str]) -> None:
        """WARM to the nodes of the steps' senders: each opens its senders' channels to the recipients now and
        waits for their handshakes, so no FLIP opens one on the data's path (with CURVE, a handshake waits
        for the receiving worker's ZAP thread: events sent behind a FLIP waited tens of ms for it). Waited
        for at most `WARM_WAIT_S` and a second; a node that does not ack in time only makes its first frames
        slower, so the migration goes on."""
        driver, mid = self.driver, self.migration_id
        wanted: list[list[str]] = []
        for step in steps:
            message = self.flip_message(step, endpoints)
            receivers = [(str(r), str(e)) for r, e in message.get("channels") or []] or [
                (str(b["recipient"]), str(b["endpoint"])) for b in message["batches"]
            ]
            wanted += [[s, r, e] for s in senders_of(driver.topology, self.old, step.vertex) for r, e in receivers]
        nodes = {self.old.assignment[s] for s, _, _ in wanted}
        if not nodes:
            return
        control = ControlChannel(driver.client, self.prefix, self.old)
        warm = {"type": ControlType.WARM, "mid": mid, "channels": wanted}
        driver.redis_step(lambda: control.send_nodes(sorted(nodes), warm), f"migration {mid} warm")
        try:
            self.wait_acks("warmed", nodes, WARM_WAIT_S + 1.0)
        except BatchFailed as exc:
            log.info("migration %s: %s; the steps start anyway", mid, exc)

    def run_steps(self, steps: tuple[Step, ...], endpoints: Mapping[str, str]) -> None:
        """FLIP the steps as the coordinator opens them, feeding it the recipients' acks, until all are in."""
        driver, mid = self.driver, self.migration_id
        coordinator = self.coordinator = BatchCoordinator(steps, self.budget)
        control = ControlChannel(driver.client, self.prefix, self.old)
        actions = coordinator.start(driver.clock.now())
        seen: set[int] = set()
        heartbeat = driver.clock.now()
        while True:
            for action in actions:
                self.act(action, control, endpoints)
            if coordinator.finished:
                return
            driver.clock.sleep(driver.poll_s)
            now = driver.clock.now()
            if now - heartbeat >= 2.0:
                heartbeat = now
                driver.redis_step(driver.owner.renew, f"migration {mid}")
            actions = []
            try:
                driver.backend.check_alive()
            except BackendError as exc:
                actions += coordinator.on_failure(f"a worker failed while key groups moved: {exc}", now)
            installed = driver.redis_step(lambda: driver.store.acks(mid, "installed"), f"migration {mid} acks")
            for number in sorted(int(n) for n in installed if n.isdigit() and int(n) not in seen):
                seen.add(number)
                actions += coordinator.on_installed(number, now)
            actions += coordinator.on_tick(now)

    def act(self, action: BatchAction, control: ControlChannel, endpoints: Mapping[str, str]) -> None:
        if action.kind == BatchActionKind.FAIL:
            raise BatchFailed(action.reason)
        if action.kind == BatchActionKind.FLIP and action.step is not None:
            step = action.step
            if self.driver.before_step is not None:
                self.driver.before_step(step.number)
            message = self.flip_message(step, endpoints)
            senders = senders_of(self.driver.topology, self.old, step.vertex)
            self.flipped = True
            self.driver.redis_step(
                lambda: control.send_each({s: message for s in senders}), f"migration {self.migration_id} flip"
            )

    def flip_message(self, step: Step, endpoints: Mapping[str, str]) -> dict[str, Any]:
        """FLIP of `step` (`runtime.keygroup_migration.on_flip`): its batches with the donor's channel index
        and the recipient's endpoint; for a vertex with an input that is not keyed, the new receivers too."""
        missing = sorted({b.recipient.executor for b in step.batches} - set(endpoints))
        if missing:
            raise BatchFailed(f"no endpoint registered for the new instances {', '.join(missing[:5])}")
        message: dict[str, Any] = {
            "type": ControlType.FLIP,
            "mid": self.migration_id,
            "vertex": step.vertex,
            "batches": [
                {
                    "n": b.number,
                    "donorIndex": split_executor_id(b.donor.executor)[1],
                    "recipient": b.recipient.executor,
                    "endpoint": endpoints[b.recipient.executor],
                    "groups": list(b.key_groups),
                }
                for b in step.batches
            ],
        }
        if step.vertex in whole_vertices(self.driver.topology, [step.vertex]):
            k = self.new.parallelism()[step.vertex]
            receivers = [f"{step.vertex}#{i}" for i in range(k)]
            message["channels"] = [[r, endpoints[r]] for r in receivers]
        return message

    def hand_over_sources(self) -> None:
        """The sources that move: the old instance pauses and saves its position (HANDOFF); at the same time the
        new one is told to start there once it is saved (INIT naming the old instances it waits for, then
        RESUME), so no controller round trip lies between them. Returns once every new one has started."""
        driver, mid, sources = self.driver, self.migration_id, set(self.driver.topology.sources)
        leaving = sorted(e for e in self.parts.moving_old if split_executor_id(e)[0] in sources)
        arriving = sorted(e for e in self.parts.moving_new if split_executor_id(e)[0] in sources)
        if not leaving and not arriving:
            return
        started = driver.clock.now()
        old_control = ControlChannel(driver.client, self.prefix, self.old)
        new_control = ControlChannel(driver.client, self.prefix, self.new)

        def init(executor: str) -> dict[str, Any]:
            vertex = split_executor_id(executor)[0]
            awaited = [e for e in leaving if split_executor_id(e)[0] == vertex]
            return {"type": ControlType.INIT, "mid": mid, "to": "new", "await": awaited}

        def hand_over() -> None:
            old_control.send_each({e: {"type": ControlType.HANDOFF, "mid": mid} for e in leaving})
            new_control.send_each({e: init(e) for e in arriving})
            new_control.send_each({e: {"type": ControlType.RESUME, "mid": mid, "to": "new"} for e in arriving})

        driver.redis_step(hand_over, f"migration {mid} handoff")
        self.wait_acks("initializing", set(arriving), driver.timeouts.commit_s)
        self.handoff_ms = (driver.clock.now() - started) * 1000.0

    def wait_acks(self, phase: str, expected: set[str], timeout_s: float) -> dict[str, dict[str, Any]]:
        """The acks of `phase` once every one of `expected` has acked; `BatchFailed` on a dead worker or after
        `timeout_s`."""
        driver, mid = self.driver, self.migration_id
        deadline = driver.clock.now() + timeout_s
        while True:
            acks: dict[str, dict[str, Any]] = driver.redis_step(
                lambda: driver.store.acks(mid, phase), f"migration {mid} {phase}"
            )
            if expected <= set(acks):
                return acks
            driver.backend.check_alive()
            if driver.clock.now() > deadline:
                absent = sorted(expected - set(acks))
                raise BatchFailed(f"{phase}: no ack from {', '.join(absent[:5])} within {timeout_s:g} s")
            driver.clock.sleep(driver.poll_s)

    # --------------------------------------------------------------------------------------------- outcome

    def fail(self, reason: str) -> None:
        """Before the first FLIP nothing moved: the staged schedule goes and the old one runs on. After it, the
        topology rolls back to the last periodic checkpoint."""
        driver, mid = self.driver, self.migration_id
        with contextlib.suppress(BackendError, redis.RedisError):
            driver.backend.discard(self.new)
        driver.redis_step(lambda: driver.store.delete_migration(mid), f"migration {mid} cleanup")
        if not self.flipped:
            driver.events.emit(EventReason.MIGRATION_ABORTED, f"migration {mid}: {reason}; nothing moved", warning=True)
            return
        driver.events.emit(
            EventReason.MIGRATION_ROLLING_BACK,
            f"migration {mid}: {reason}; rolling back to the last periodic checkpoint",
            warning=True,
        )
        self.rollback = driver.roll_back()

    def report(self, reason: str) -> MigrationReport:
        driver, coordinator = self.driver, self.coordinator
        holds = coordinator.hold_times_s() if coordinator is not None else []
        if not reason:
            outcome = Outcome.SUCCEEDED
        else:
            outcome = Outcome.ABORTED
            if self.rollback is not None:
                rollback = self.rollback
                reason += (
                    f"; rolled back to checkpoint {rollback.restored_from}: {rollback.replayed} events replayed"
                    if rollback.outcome == Outcome.SUCCEEDED
                    else f"; the rollback to the last checkpoint failed too: {rollback.reason}"
                )
        paused = sum(1 for e in self.parts.moving_old if split_executor_id(e)[0] in driver.topology.sources)
        report = MigrationReport(
            migration_id=self.migration_id,
            protocol="ccr",
            direction=direction(self.old, self.new),
            from_nodes=len(self.old.nodes),
            to_nodes=len(self.new.nodes) if outcome == Outcome.SUCCEEDED else len(self.old.nodes),
            phases_ms=self.times.durations_ms(),
            captured_events=0,
            lost=0,
            replayed=0,
            outcome=outcome,
            reason=reason,
            pause_ms=self.handoff_ms,
            prepare_ms=self.prepare_ms,
            scope="keyGroups",
            paused_executors=paused,
            executors=len(self.old.assignment),
            batches=coordinator.batches if coordinator is not None else 0,
            longest_hold_ms=max(holds) * 1000.0 if holds else None,
        )
        driver.events.emit(
            EventReason.MIGRATED if outcome == Outcome.SUCCEEDED else EventReason.MIGRATION_FAILED,
            f"key-group migration {self.migration_id} {outcome}: {report.batches} batches"
            + (f", longest hold {report.longest_hold_ms:.0f} ms" if report.longest_hold_ms is not None else "")
            + (f"; {reason}" if reason else ""),
            warning=outcome != Outcome.SUCCEEDED,
        )
        return report


def direction(old: Schedule, new: Schedule) -> Direction:
    """A migration's direction in its report: out when the new schedule has more nodes, in otherwise."""
    return Direction.OUT if len(new.nodes) > len(old.nodes) else Direction.IN
