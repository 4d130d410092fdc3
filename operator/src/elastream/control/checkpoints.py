"""Periodic checkpoints: what `restart` restores and what a failed worker rolls back to.

`CheckpointDriver.take()` runs one round of aligned barriers (the pure `CheckpointRound` decides): it claims
the topology like a migration does (so checkpoints and migrations never overlap), tells every source to
checkpoint, waits for every executor's ack, then makes the round the latest checkpoint in Redis and deletes
the one before (a suspend takes one the same way, on demand, before it stops the workers). A round that
times out or loses a worker is abandoned: the executors are told to stop aligning, its keys go, and the
previous checkpoint stays the latest. With `ELASTREAM_DURABLE_COMMITS=on` (`store.checkpoint.DurableCommits`)
a completed round whose commit Redis does not confirm on disk in time is reported failed (it is the latest
all the same: nothing is abandoned), so what waits for a checkpoint tries again. `Checkpointer` runs `take()` every
`spec.scaling.checkpointIntervalSeconds` on a thread of the controller process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import redis

from elastream.core.checkpoint_protocol import CheckpointPhase, CheckpointRound
from elastream.core.migration_protocol import ControlType
from elastream.core.ports import Backend, BackendError, Clock, SystemClock
from elastream.core.topology import Topology, split_executor_id
from elastream.store.checkpoint import CheckpointScope, CheckpointStore, DurableCommits
from elastream.store.claim import OwnerLease, controller_identity
from elastream.store.control import ControlChannel

log = logging.getLogger("elastream.checkpoint")

#: a checkpoint's claim on the topology expires by itself if its controller dies
CLAIM_TTL_S = 120


@dataclass(frozen=True)
class CheckpointResult:
    checkpoint_id: str | None
    outcome: str  # completed | failed | skipped
    duration_ms: float | None = None
    state_bytes: int = 0
    reason: str = ""


class Checkpoints(Protocol):
    """Checkpoints on demand (`control.checkpoints.CheckpointDriver`): a suspend's last one, and the id of the
    latest completed one (what a resume restores)."""

    def take(self) -> CheckpointResult: ...

    def latest(self) -> str | None: ...

    def discard_uncommitted(self) -> int: ...


@dataclass
class CheckpointDriver:
    topology: Topology
    backend: Backend
    client: redis.Redis
    timeout_s: float = 30.0
    clock: Clock = field(default_factory=SystemClock)
    poll_s: float = 0.02
    #: the controller as the owner of the claim (the migration driver's identity: one owner per controller)
    identity: str = field(default_factory=controller_identity)
    #: whether a completion waits for its commit to be on disk (`ELASTREAM_DURABLE_COMMITS`)
    durability: DurableCommits = field(default_factory=DurableCommits.from_env)

    def __post_init__(self) -> None:
        self.store = CheckpointStore(self.client, self.topology.redis_prefix, durability=self.durability)
        self.scope = CheckpointScope.of(self.topology)
        self.owner = OwnerLease(self.client, self.topology.redis_prefix, self.identity)

    def latest(self) -> str | None:
        """The id of the latest completed checkpoint (None: none completed yet); raises `redis.RedisError`."""
        latest = self.store.latest_checkpoint()
        return str(latest["id"]) if latest else None

    def discard_uncommitted(self) -> int:
        """Drop what the exactly-once sinks staged and no checkpoint committed (a start from the sources'
        beginning replays it: the next checkpoint must not commit it as a leftover). Returns the keys dropped."""
        return self.store.discard_transactions()

    def take(self) -> CheckpointResult:
        """One checkpoint round; never raises for a failed round (the result says why)."""
        schedule = self.backend.current_schedule()
        if not self.owner.renew():
            return CheckpointResult(None, "skipped", reason=f"{self.owner.holder()} drives this topology now")
        checkpoint_id = self.store.next_checkpoint_id()
        if not self.store.claim(checkpoint_id, CLAIM_TTL_S):
            return CheckpointResult(None, "skipped", reason=f"migration {self.store.current()} in progress")
        control = ControlChannel(self.client, self.topology.redis_prefix, schedule)
        round_ = CheckpointRound(checkpoint_id, frozenset(schedule.assignment), self.clock.now(), self.timeout_s)
        try:
            sources = [e for e in schedule.assignment if split_executor_id(e)[0] in self.topology.sources]
            control.send_many(sources, {"type": ControlType.CHECKPOINT, "mid": checkpoint_id})
            while round_.phase == CheckpointPhase.RUNNING:
                self.clock.sleep(self.poll_s)
                now = self.clock.now()
                try:
                    self.backend.check_alive()
                except BackendError as exc:
                    round_.on_failure(str(exc))
                    break
                for executor, info in self.store.acks(checkpoint_id, "checkpointing").items():
                    round_.on_ack(executor, int(info.get("state_bytes", 0)), now)
                round_.on_tick(now)
        except redis.RedisError as exc:
            round_.on_failure(f"Redis: {exc}")
        except Exception as exc:  # whatever broke the round, its claim must go: a claim left behind blocks scaling
            log.exception("checkpoint %s: the round broke", checkpoint_id)
            round_.on_failure(f"{type(exc).__name__}: {exc}")
        if round_.phase == CheckpointPhase.COMPLETED:
            done = self.store.complete_checkpoint(
                checkpoint_id, {"completedAt": round_.completed_at, "schedule": schedule.to_dict()}, self.scope
            )
            self.store.release(checkpoint_id)
            if done.not_durable:
                # committed and the latest (nothing to abandon), but not known to survive a Redis crash: what
                # waits for a checkpoint (a suspend, a savepoint) tries again rather than count on it
                reason = f"checkpoint {checkpoint_id}: {done.not_durable}"
                log.warning("%s; the round counts as failed", reason)
                return CheckpointResult(checkpoint_id, "failed", round_.duration_ms, round_.state_bytes, reason)
            log.debug(
                "checkpoint %s completed in %.0f ms (replaced %s)", checkpoint_id, round_.duration_ms, done.replaced
            )
            return CheckpointResult(checkpoint_id, "completed", round_.duration_ms, round_.state_bytes)
        reason = round_.failure or "failed"
        log.warning("%s; the previous checkpoint stays the latest", reason)
        with contextlib.suppress(redis.RedisError):  # if Redis is away its keys expire, the claim too
            abandon_checkpoint(control, self.store, schedule.assignment, checkpoint_id)
        return CheckpointResult(checkpoint_id, "failed", reason=reason)


def abandon_checkpoint(
    control: ControlChannel, store: CheckpointStore, executors: Iterable[str], checkpoint_id: str
) -> None:
    """Give up a round: executors stop aligning (they release what they held), its keys and claim go; the
    previous checkpoint stays the latest."""
    control.send_many(executors, {"type": ControlType.CHECKPOINT_ABORT, "mid": checkpoint_id})
    store.delete_migration(checkpoint_id)


@dataclass
class Checkpointer:
    """Takes a checkpoint every `interval_s` (a migration in progress skips a round; one that starts during
    a round waits for it: both claim the topology in Redis). `tick()` takes a round when one is due: a
    controller calls it from its own loop (no thread per topology); with `own_thread` (benchmarks and tests
    that have no control loop) `start()` runs a thread that calls it."""

    driver: CheckpointDriver
    interval_s: float
    own_thread: bool = True
    last: CheckpointResult | None = None
    completed: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpointer", daemon=True)
        self._due: float | None = None

    def start(self) -> Checkpointer:
        if self.interval_s > 0:
            self._due = self.driver.clock.now() + self.interval_s
            if self.own_thread:
                self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._due = None
        if self._thread.is_alive():
            self._thread.join(timeout=self.driver.timeout_s + 5.0)

    def tick(self) -> CheckpointResult | None:
        """Take a round if one is due (returns its result); never raises."""
        now = self.driver.clock.now()
        if self._due is None or now < self._due:
            return None
        self._due = now + self.interval_s
        try:
            self.last = self.driver.take()
        except Exception as exc:  # Redis away, the backend not started: the next round tries again
            log.warning("checkpoint not taken: %s", exc)
            return None
        if self.last.outcome == "completed":
            self.completed += 1
        return self.last

    def _run(self) -> None:
        while not self._stop.wait(min(self.interval_s, 0.2)):
            self.tick()
