"""Periodic checkpoints: what `restart` restores and what a failed worker rolls back to.

`CheckpointDriver` runs rounds of aligned barriers (the pure `CheckpointRound` decides): `begin` claims the
topology like a migration does (so checkpoints and migrations never overlap) and tells every source to
checkpoint; `poll`, one look per reconcile pass, reads the executors' acks and, once all are in, makes the
round the latest checkpoint in Redis and deletes the one before. A round spans passes: no reconcile thread
waits on a worker's ack (a migration about to claim the topology makes the open round give way,
`abandon_open`). `take` waits for a whole round (a suspend takes its last one that way, on demand). A round that
times out or loses a worker is abandoned: the executors are told to stop aligning, its keys go, and the
previous checkpoint stays the latest. With `ELASTREAM_DURABLE_COMMITS=on` (`store.checkpoint_store.DurableCommits`)
a completed round whose commit Redis does not confirm on disk in time is reported failed (it is the latest
all the same: nothing is abandoned), so what waits for a checkpoint tries again. `Checkpointer` begins a round
every `spec.scaling.checkpointIntervalSeconds` and follows it from the controller's loop, backing off after
failed rounds in a row.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import redis

from elastream.control.retrying import backoff_delay
from elastream.core.checkpoint_protocol import CheckpointPhase, CheckpointRound
from elastream.core.migration_protocol import ControlType
from elastream.core.ports import Backend, BackendError, Clock, SystemClock
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology, split_executor_id
from elastream.store.checkpoint_store import CheckpointScope, CheckpointStore, DurableCommits
from elastream.store.claim import OwnerLease, controller_identity
from elastream.store.control import ControlChannel

log = logging.getLogger("elastream.checkpoint")

#: a checkpoint's claim on the topology expires by itself if its controller dies
CLAIM_TTL_S = 120
#: the longest pause between failed rounds in a row (the pause doubles from the interval up to this)
FAILED_ROUNDS_BACKOFF_CAP_S = 300.0


@dataclass(frozen=True)
class CheckpointResult:
    checkpoint_id: str | None
    outcome: str  # completed | failed | skipped
    duration_ms: float | None = None
    state_bytes: int = 0
    reason: str = ""
    #: when its last ack came in (the clock's `now()`), for a completed round: the checkpoint age's origin
    completed_at: float | None = None


class Checkpoints(Protocol):
    """Checkpoints on demand (`control.checkpoint_driver.CheckpointDriver`): a suspend's last one, and the id of the
    latest completed one (what a resume restores)."""

    def take(self) -> CheckpointResult: ...

    def latest(self) -> str | None: ...

    def discard_uncommitted(self) -> int: ...

    def state_by_vertex(self) -> Mapping[str, int]: ...


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
    #: the topology's own Redis user's connection, which a completion runs on (`CheckpointStore.commit_as`)
    commit_as: Callable[[], redis.Redis | None] | None = None

    def __post_init__(self) -> None:
        self.store = CheckpointStore(
            self.client, self.topology.redis_prefix, durability=self.durability, commit_as=self.commit_as
        )
        self.scope = CheckpointScope.of(self.topology)
        self.owner = OwnerLease(self.client, self.topology.redis_prefix, self.identity)
        self._open: _OpenRound | None = None
        #: begin, poll and abandon_open one at a time (a suspend's `take` may run beside the checkpointer's thread)
        self._lock = threading.RLock()
        #: bytes of state per vertex in the last checkpoint this driver completed
        self.last_state_by_vertex: dict[str, int] = {}

    def latest(self) -> str | None:
        """The id of the latest completed checkpoint (None: none completed yet); raises `redis.RedisError`."""
        latest = self.store.latest_checkpoint()
        return str(latest["id"]) if latest else None

    def state_by_vertex(self) -> Mapping[str, int]:
        """Bytes of state per vertex in the last checkpoint this driver completed (empty before one): what a
        key-group migration sizes its batches from."""
        return dict(self.last_state_by_vertex)

    def discard_uncommitted(self) -> int:
        """Drop what the exactly-once sinks staged and no checkpoint committed (a start from the sources'
        beginning replays it: the next checkpoint must not commit it as a leftover). Returns the keys dropped."""
        return self.store.discard_transactions()

    @property
    def round_open(self) -> bool:
        """Whether a round is in progress (begun, neither completed nor failed yet)."""
        return self._open is not None

    def open_round(self) -> str | None:
        """The id of the round in progress, None when none is (its claim on the topology is this driver's)."""
        opened = self._open
        return None if opened is None else opened.round.checkpoint_id

    def take(self) -> CheckpointResult:
        """One checkpoint round, waited for here (a suspend's last checkpoint, benchmarks); never raises for a
        failed round (the result says why). A round already open is followed to its end."""
        if self._open is None:
            skipped = self.begin()
            if skipped is not None:
                return skipped
        while True:
            result = self.poll()
            if result is not None:
                return result
            self.clock.sleep(self.poll_s)

    def begin(self) -> CheckpointResult | None:
        """Start a round without waiting for it: claim the topology and tell the sources to checkpoint. None
        when it started (`poll` follows it, pass after pass), a `skipped` result when it could not start (another
        owner drives the topology, a migration holds it). Raises `redis.RedisError`."""
        with self._lock:
            return self._begin()

    def _begin(self) -> CheckpointResult | None:
        if self._open is not None:
            return None
        schedule = self.backend.current_schedule()
        if not self.owner.renew():
            return CheckpointResult(None, "skipped", reason=f"{self.owner.holder()} drives this topology now")
        checkpoint_id = self.store.next_checkpoint_id()
        if not self.store.claim(checkpoint_id, CLAIM_TTL_S):
            return CheckpointResult(None, "skipped", reason=f"migration {self.store.current()} in progress")
        control = ControlChannel(self.client, self.topology.redis_prefix, schedule)
        round_ = CheckpointRound(checkpoint_id, frozenset(schedule.assignment), self.clock.now(), self.timeout_s)
        self._open = _OpenRound(round_, schedule, control)
        try:
            sources = [e for e in schedule.assignment if split_executor_id(e)[0] in self.topology.sources]
            control.send_many(sources, {"type": ControlType.CHECKPOINT, "mid": checkpoint_id})
        except redis.RedisError as exc:
            round_.on_failure(f"Redis: {exc}")
        return None

    def poll(self) -> CheckpointResult | None:
        """One look at the open round (its acks, its workers, its deadline): its result once it completed or
        failed, None while it runs (or when none is open). A failed round is abandoned here."""
        with self._lock:
            return self._poll()

    def _poll(self) -> CheckpointResult | None:
        opened = self._open
        if opened is None:
            return None
        round_, checkpoint_id = opened.round, opened.round.checkpoint_id
        if round_.phase == CheckpointPhase.RUNNING:
            now = self.clock.now()
            try:
                self.backend.check_alive()
                for executor, info in self.store.acks(checkpoint_id, "checkpointing").items():
                    round_.on_ack(executor, int(info.get("state_bytes", 0)), now)
                round_.on_tick(now)
            except BackendError as exc:
                round_.on_failure(str(exc))
            except redis.RedisError as exc:
                round_.on_failure(f"Redis: {exc}")
            except Exception as exc:  # whatever broke the round, its claim must go: a claim left blocks scaling
                log.exception("checkpoint %s: the round broke", checkpoint_id)
                round_.on_failure(f"{type(exc).__name__}: {exc}")
        if round_.phase == CheckpointPhase.RUNNING:
            return None
        self._open = None
        if round_.phase == CheckpointPhase.COMPLETED:
            return self._complete(round_, opened.schedule)
        return self._abandon(opened, round_.failure or "failed")

    def abandon_open(self, reason: str) -> CheckpointResult | None:
        """Give up the open round, if any, for `reason` (a migration or recovery is about to claim the topology:
        a migration is a checkpoint itself, a recovery rolls back past it); its result, or None."""
        with self._lock:
            return self._abandon_open(reason)

    def _abandon_open(self, reason: str) -> CheckpointResult | None:
        opened, self._open = self._open, None
        if opened is None:
            return None
        opened.round.on_failure(reason)
        return self._abandon(opened, opened.round.failure or reason)

    def _complete(self, round_: CheckpointRound, schedule: Schedule) -> CheckpointResult:
        checkpoint_id = round_.checkpoint_id
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
        log.debug("checkpoint %s completed in %.0f ms (replaced %s)", checkpoint_id, round_.duration_ms, done.replaced)
        by_vertex: dict[str, int] = {}
        for executor, size in round_.state_bytes_by_executor.items():
            vertex = split_executor_id(executor)[0]
            by_vertex[vertex] = by_vertex.get(vertex, 0) + size
        self.last_state_by_vertex = by_vertex
        return CheckpointResult(
            checkpoint_id, "completed", round_.duration_ms, round_.state_bytes, completed_at=round_.completed_at
        )

    def _abandon(self, opened: _OpenRound, reason: str) -> CheckpointResult:
        log.warning("%s; the previous checkpoint stays the latest", reason)
        checkpoint_id = opened.round.checkpoint_id
        with contextlib.suppress(redis.RedisError):  # if Redis is away its keys expire, the claim too
            abandon_checkpoint(opened.control, self.store, opened.schedule.assignment, checkpoint_id)
        return CheckpointResult(checkpoint_id, "failed", reason=reason)


@dataclass
class _OpenRound:
    """A round in progress, between `begin` and its end: what `poll` follows and `_abandon` undoes."""

    round: CheckpointRound
    schedule: Schedule
    control: ControlChannel


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
    a round waits for it: both claim the topology in Redis). `tick()` begins a round when one is due and
    follows an open one, one look per call, so a round whose acks are slow or never come holds no thread (a
    controller calls it from its own loop, one pass after another; issue 38: eight topologies whose workers
    never acknowledged held every reconcile thread). Failed rounds in a row back off: the next is due after
    `interval_s` doubling per failure up to `FAILED_ROUNDS_BACKOFF_CAP_S`. With `own_thread` (benchmarks and
    tests that have no control loop) `start()` runs a thread that calls it."""

    driver: CheckpointDriver
    interval_s: float
    own_thread: bool = True
    last: CheckpointResult | None = None
    #: the last round that completed (its time and duration are served as metrics, read by another thread)
    last_completed: CheckpointResult | None = None
    completed: int = 0
    #: failed rounds in a row (a completed one resets it; a skipped one leaves it)
    failures: int = 0

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
        with contextlib.suppress(Exception):  # the workers stop next: the round cannot complete
            self.driver.abandon_open("the topology's checkpoints stopped")

    def tick(self) -> CheckpointResult | None:
        """Begin a round if one is due, or take one look at the open round; the round's result when it ended
        at this call, else None. Never raises."""
        now = self.driver.clock.now()
        try:
            if not self.driver.round_open:
                if self._due is None or now < self._due:
                    return None
                self._due = now + self.interval_s
                skipped = self.driver.begin()
                if skipped is not None:
                    self.last = skipped
                    return skipped
            result = self.driver.poll()
        except Exception as exc:  # Redis away, the backend not started: the next round tries again
            log.warning("checkpoint not taken: %s", exc)
            return None
        if result is None:
            return None
        self.last = result
        if result.outcome == "completed":
            self.last_completed = result
            self.completed += 1
            self.failures = 0
        elif result.outcome == "failed":
            self.failures += 1
            delay = backoff_delay(self.failures, self.interval_s, max(self.interval_s, FAILED_ROUNDS_BACKOFF_CAP_S))
            self._due = max(self._due or 0.0, self.driver.clock.now() + delay)
        return result

    def _run(self) -> None:
        while not self._stop.wait(self.driver.poll_s if self.driver.round_open else min(self.interval_s, 0.2)):
            self.tick()
