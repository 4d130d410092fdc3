"""Migration protocols as pure state machines: CCR (capture-checkpoint-resume), DCR (drain-checkpoint-restore)
and `restart` (stop everything, restore the last periodic checkpoint, sources replay).

The coordinator here decides; adapters act. `MigrationCoordinator` consumes events (acks, ticks of a
replaceable clock, failures) and returns `Action`s (broadcast PREPARE, start COMMIT, apply the schedule,
broadcast INIT, resume sources, abort) for the control layer to carry out over Redis and the backend.
`ExecutorParticipant` is the per-executor side the worker drives: what to do with a data event, a
PREPARE, a COMMIT from one upstream channel, an INIT. Both are deterministic and unit-tested without I/O.

CCR, as DESIGN.md and section 3.2 of the CCR paper fix it:
1. record written, sources paused;  2. PREPARE broadcast, queued behind each executor's input: from then
on the executor captures every input into its pending list, acks;  3. when all acked, sources send COMMIT
in-band on every output channel; an executor that has COMMIT from every upstream executor persists state
(per key group), pending list and source position, forwards COMMIT, acks (COMMIT is resent every
`commit_resend_s` to those that have not acked: one that has committed saves again under the same token and
acks again, for a Redis failover may lose an acknowledged write);  4. the backend applies the new
schedule;  5. INIT broadcast, resent every `init_resend_s` until acked; each executor loads the key groups
it now owns and the pending events routed to it, replays them, acks (a duplicate INIT is re-acked, not
re-applied);  6. sources resume, record closed. Failure before step 4 aborts (executors replay their own
pending lists, sources resume); from step 4 on the migration only goes forward.
DCR differs in step 2-3: PREPARE travels in-band behind the data (so queues drain through processing),
nothing is captured, and COMMIT persists state only.
`restart` skips steps 2-3: the backend stops every worker and starts the new schedule, whose executors are
initialised from the last periodic checkpoint (state per key group, source positions); the sources replay
what they emitted after it, so sinks see those events twice and the report counts them.

Periodic checkpoints are `core.checkpoint_protocol`'s; `control.migration` carries the actions out.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elastream.core.outcomes import Direction, Outcome
from elastream.core.topology.limits import MigrationProtocol, MigrationScope


class ControlType(enum.StrEnum):
    """The `type` of a control message. The controller sends PREPARE, COMMIT (to sources), INIT, RESUME, ABORT,
    CHECKPOINT (to sources), CHECKPOINT_ABORT to executors and STAGE, SWITCH, UNSTAGE to nodes; executors
    forward COMMIT, BARRIER and DCR's PREPARE in-band. A `StrEnum`, so a message's JSON text compares equal."""

    PREPARE = "prepare"
    COMMIT = "commit"
    INIT = "init"
    RESUME = "resume"
    ABORT = "abort"
    CHECKPOINT = "checkpoint"
    BARRIER = "barrier"
    CHECKPOINT_ABORT = "checkpoint-abort"
    #: a node binds the inboxes of a staged schedule version (before a migration pauses anything)
    STAGE = "stage"
    #: a node loads a schedule version in place (after COMMIT): stops the executors it loses, starts the new
    SWITCH = "switch"
    #: a node drops a staged version (the migration did not start or was aborted)
    UNSTAGE = "unstage"
    #: a node's worker stops now: its backend is about to stop it (a SIGTERM that follows is no drain request)
    STOP = "stop"
    #: a worker to one of its executors that stays in a partial migration: the new schedule's outputs and
    #: upstream (never sent through Redis: it carries the channels)
    REROUTE = "reroute"
    #: a migration of scope `keyGroups` (`core.keygroup_batches`): a node starts its staged generation's new
    #: executor instances beside the running ones (OVERLAP); the controller tells a vertex's senders to send
    #: a step's key groups to their recipients (FLIP); a sender tells a donor, in band, that nothing more of
    #: those groups follows (MARKER); a donor ships their state to the recipient, in band (STATE); a moving
    #: source pauses and saves its position (HANDOFF)
    OVERLAP = "overlap"
    #: (keyGroups) a node opens its senders' channels to the new instances before the FLIPs that use them
    WARM = "warm"
    FLIP = "flip"
    MARKER = "marker"
    STATE = "state"
    HANDOFF = "handoff"


#: the `role` of PREPARE and COMMIT to an executor that stays and sends to moving ones (`core.migration_scope`)
SENDER = "sender"


class Phase(enum.Enum):
    PREPARING = "preparing"  # PREPARE sent; waiting for every executor's ack
    COMMITTING = "committing"  # COMMIT sweeping the dataflow; waiting for every executor's ack
    REBALANCING = "rebalancing"  # backend applying the new schedule
    INITIALIZING = "initializing"  # INIT broadcast (and resent); waiting for every new executor's ack
    DONE = "done"
    ABORTED = "aborted"


#: the phases that end when every expected executor has acked
ACK_WAITING = (Phase.PREPARING, Phase.COMMITTING, Phase.INITIALIZING)


class ActionKind(enum.Enum):
    PAUSE_SOURCES = "pause_sources"
    BROADCAST_PREPARE = "broadcast_prepare"
    START_COMMIT = "start_commit"  # sources emit COMMIT in-band on all their output channels
    #: COMMIT again to the executors whose ack has not come: one that committed saves again (written only if
    #: its first save was lost) and acks again; a source that never got COMMIT commits now
    RESEND_COMMIT = "resend_commit"
    APPLY_SCHEDULE = "apply_schedule"
    BROADCAST_INIT = "broadcast_init"
    RESUME_SOURCES = "resume_sources"
    ABORT = "abort"  # executors replay their own pending lists; old schedule goes on
    CLEANUP = "cleanup"  # delete the migration's keys


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    #: executors the action addresses (INIT resends go only to those that have not acked)
    executors: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Ack:
    migration_id: str
    phase: Phase
    executor: str
    #: what the executor reports with its ack (captured events, bytes of state, replayed events)
    captured: int = 0
    state_bytes: int = 0
    replayed: int = 0


@dataclass
class PhaseTimes:
    started_at: float | None = None
    prepare_done: float | None = None
    commit_done: float | None = None
    rebalance_done: float | None = None
    init_done: float | None = None

    def durations_ms(self) -> dict[str, float | None]:
        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else (b - a) * 1000.0

        return {
            "captureMs": span(self.started_at, self.prepare_done),
            "commitMs": span(self.prepare_done, self.commit_done),
            "rebalanceMs": span(self.commit_done, self.rebalance_done),
            "restoreMs": span(self.rebalance_done, self.init_done),
        }


@dataclass(frozen=True)
class Timeouts:
    prepare_s: float = 30.0
    commit_s: float = 60.0
    rebalance_s: float = 120.0
    init_s: float = 120.0
    init_resend_s: float = 1.0
    #: COMMIT is sent again this often to the executors that have not acked it. An acknowledged Redis write can
    #: be lost when a primary fails before its replica has it (replication is asynchronous): the ack, and the
    #: checkpoint before it, would never come otherwise, and the migration would abort at `commit_s`.
    commit_resend_s: float = 5.0
    #: after COMMIT a timed-out phase is retried this many times, then the migration stalls
    #: (`MigrationStalled`): its state stays in Redis and the controller resumes it later, with backoff
    retries_after_commit: int = 2


def first_few(names: Sequence[str], count: int = 5) -> str:
    """`names` for a message: the first `count`, and how many more."""
    more = f" and {len(names) - count} more" if len(names) > count else ""
    return ", ".join(names[:count]) + more


class MigrationStalled(Exception):
    """A migration past COMMIT could not finish within its retries (a worker that does not come back, Redis
    away): nothing is lost, its record and state stay in Redis for a later `resume`."""


@dataclass
class MigrationCoordinator:
    """The controller's side of one migration. Feed it `start`, `on_ack`, `on_rebalanced`, `on_tick` and
    `on_failure`; carry out the actions it returns, in order."""

    migration_id: str
    protocol: MigrationProtocol
    old_executors: frozenset[str]
    new_executors: frozenset[str]
    timeouts: Timeouts = field(default_factory=Timeouts)
    phase: Phase = Phase.PREPARING
    acked: set[str] = field(default_factory=set)
    times: PhaseTimes = field(default_factory=PhaseTimes)
    phase_started: float = 0.0
    last_init_sent: float = 0.0
    last_commit_sent: float = 0.0
    captured: int = 0
    replayed: int = 0
    failure: str | None = None
    #: phases retried after COMMIT so far
    retries: int = 0

    def start(self, now: float) -> list[Action]:
        self.times.started_at = now
        self.phase_started = now
        if self.protocol == "restart":
            # nothing to capture: stop everything and start the new schedule from the last checkpoint
            self.times.prepare_done = self.times.commit_done = now
            self.phase = Phase.REBALANCING
            return [Action(ActionKind.APPLY_SCHEDULE)]
        self.phase = Phase.PREPARING
        everyone = tuple(sorted(self.old_executors))
        if self.protocol == "dcr":
            # DCR's PREPARE travels in-band from the sources, behind the data.
            return [Action(ActionKind.PAUSE_SOURCES), Action(ActionKind.BROADCAST_PREPARE, everyone, "in-band")]
        return [Action(ActionKind.PAUSE_SOURCES), Action(ActionKind.BROADCAST_PREPARE, everyone)]

    def _expected(self) -> frozenset[str]:
        return self.new_executors if self.phase == Phase.INITIALIZING else self.old_executors

    def on_ack(self, ack: Ack, now: float) -> list[Action]:
        if ack.migration_id != self.migration_id or ack.phase != self.phase:
            return []  # a late or duplicate ack of an earlier phase, or of another migration
        if ack.executor not in self._expected() or ack.executor in self.acked:
            return []
        self.acked.add(ack.executor)
        self.captured += ack.captured
        self.replayed += ack.replayed
        if self.acked != set(self._expected()):
            return []
        return self._advance(now)

    def _advance(self, now: float) -> list[Action]:
        self.acked = set()
        self.phase_started = now
        if self.phase == Phase.PREPARING:
            self.times.prepare_done = now
            self.phase = Phase.COMMITTING
            self.last_commit_sent = now
            return [Action(ActionKind.START_COMMIT)]
        if self.phase == Phase.COMMITTING:
            self.times.commit_done = now
            self.phase = Phase.REBALANCING
            return [Action(ActionKind.APPLY_SCHEDULE)]
        if self.phase == Phase.INITIALIZING:
            self.times.init_done = now
            self.phase = Phase.DONE
            return [Action(ActionKind.RESUME_SOURCES), Action(ActionKind.CLEANUP)]
        return []

    def on_rebalanced(self, now: float) -> list[Action]:
        """The backend has applied the new schedule: broadcast INIT to every executor of it."""
        if self.phase != Phase.REBALANCING:
            return []
        self.times.rebalance_done = now
        self.phase = Phase.INITIALIZING
        self.phase_started = now
        self.last_init_sent = now
        self.acked = set()
        return [Action(ActionKind.BROADCAST_INIT, tuple(sorted(self.new_executors)))]

    def on_tick(self, now: float) -> list[Action]:
        """Resend COMMIT and INIT to the executors that have not acked; time phases out. A phase that waits for nobody
        (a partial migration in which nothing moves) is over at once."""
        if self.phase in (Phase.DONE, Phase.ABORTED):
            return []
        if self.phase in ACK_WAITING and not self._expected():
            return self._advance(now)
        limit = {
            Phase.PREPARING: self.timeouts.prepare_s,
            Phase.COMMITTING: self.timeouts.commit_s,
            Phase.REBALANCING: self.timeouts.rebalance_s,
            Phase.INITIALIZING: self.timeouts.init_s,
        }[self.phase]
        if now - self.phase_started > limit:
            missing = sorted(set(self._expected()) - self.acked)
            waiting = f" waiting for {first_few(missing)}" if missing else ""
            reason = f"{self.phase.value} timed out after {limit:g} s{waiting}"
            return self.on_failure(reason, now)
        if self.phase == Phase.COMMITTING and now - self.last_commit_sent >= self.timeouts.commit_resend_s:
            self.last_commit_sent = now
            return [Action(ActionKind.RESEND_COMMIT, tuple(sorted(self.old_executors - self.acked)), "resend")]
        if self.phase == Phase.INITIALIZING and now - self.last_init_sent >= self.timeouts.init_resend_s:
            self.last_init_sent = now
            pending = tuple(sorted(self.new_executors - self.acked))
            return [Action(ActionKind.BROADCAST_INIT, pending, "resend")]
        return []

    def on_failure(self, reason: str, now: float) -> list[Action]:
        """A participant died or a phase timed out. Before the point of no return: abort; after it: keep
        going (the caller retries the current phase: a restarted worker re-reads its state from Redis)."""
        if self.phase in (Phase.DONE, Phase.ABORTED):
            return []
        if self.phase in (Phase.PREPARING, Phase.COMMITTING):
            self.failure = reason
            self.phase = Phase.ABORTED
            return [
                Action(ActionKind.ABORT, tuple(sorted(self.old_executors)), reason),
                Action(ActionKind.RESUME_SOURCES),
                Action(ActionKind.CLEANUP),
            ]
        self.failure = reason
        self.phase_started = now
        self.retries += 1
        if self.retries > self.timeouts.retries_after_commit:
            raise MigrationStalled(
                f"migration {self.migration_id} stalled in {self.phase.value} after "
                f"{self.timeouts.retries_after_commit} retries: {reason}"
            )
        if self.phase == Phase.REBALANCING:
            return [Action(ActionKind.APPLY_SCHEDULE, reason=f"retry: {reason}")]
        pending = tuple(sorted(self.new_executors - self.acked))
        self.last_init_sent = now
        return [Action(ActionKind.BROADCAST_INIT, pending, f"retry: {reason}")]


# ---- participants ------------------------------------------------------------------------------------------


class Mode(enum.Enum):
    RUNNING = "running"
    CAPTURING = "capturing"  # CCR: after PREPARE, inputs go to the pending list
    DRAINING = "draining"  # DCR: waiting for PREPARE on every input channel
    CHECKPOINTED = "checkpointed"  # state persisted; waiting for the new schedule's INIT (or ABORT)


@dataclass
class ExecutorParticipant:
    """One executor's view of a migration. The worker asks it what to do with each message."""

    executor: str
    upstream: frozenset[str]  # executors that send to this one (empty for a source)
    protocol: MigrationProtocol = "ccr"
    mode: Mode = Mode.RUNNING
    migration_id: str | None = None
    commits_seen: set[str] = field(default_factory=set)
    prepares_seen: set[str] = field(default_factory=set)
    initialized_for: str | None = None

    def on_prepare(self, migration_id: str, from_upstream: str | None = None) -> bool:
        """PREPARE dequeued. CCR: start capturing, return True (ack now). DCR: return True once PREPARE
        has come in-band from every upstream executor (the input is drained through processing)."""
        self.migration_id = migration_id
        if self.protocol == "ccr":
            self.mode = Mode.CAPTURING
            return True
        if from_upstream is not None:
            self.prepares_seen.add(from_upstream)
        self.mode = Mode.DRAINING
        return self.prepares_seen >= self.upstream

    def captures(self) -> bool:
        """Should a data event dequeued now go to the pending list instead of being processed?"""
        return self.mode in (Mode.CAPTURING, Mode.CHECKPOINTED) and self.protocol == "ccr"

    def on_commit(self, migration_id: str, from_upstream: str | None) -> bool:
        """COMMIT from one upstream channel (None: this is a source told to commit). Returns True when COMMIT
        has arrived from every upstream executor: persist, forward COMMIT downstream, ack.

        A COMMIT of another migration than the one this executor prepared for is ignored: in-band COMMIT can
        arrive after the controller's ABORT overtook it (ABORT comes through the control list, COMMIT behind
        the data), and taking it would checkpoint the executor and capture its input forever, waiting for an
        INIT that never comes."""
        if migration_id != self.migration_id or self.mode == Mode.CHECKPOINTED:
            return False  # ... and a COMMIT again once committed is a duplicate (a sender's, resent)
        if from_upstream is not None:
            self.commits_seen.add(from_upstream)
        if self.commits_seen >= self.upstream:
            self.mode = Mode.CHECKPOINTED
            return True
        return False

    def committed(self, migration_id: str) -> bool:
        """Whether this executor has persisted its state for `migration_id` and waits for INIT or ABORT."""
        return self.mode == Mode.CHECKPOINTED and self.migration_id == migration_id

    def on_init(self, migration_id: str) -> bool:
        """INIT dequeued. True: load state and pending events, replay, ack. False: a duplicate, ack only."""
        if self.initialized_for == migration_id:
            return False
        self.initialized_for = migration_id
        self.mode = Mode.RUNNING
        self.commits_seen.clear()
        self.prepares_seen.clear()
        return True

    def on_abort(self) -> None:
        """Back to the old schedule: the worker replays this executor's own pending list, then runs on."""
        self.mode = Mode.RUNNING
        self.migration_id = None
        self.commits_seen.clear()
        self.prepares_seen.clear()


@dataclass(frozen=True)
class MigrationReport:
    """The paper's metrics for one migration, in the shape the resource's status.lastScaling takes."""

    migration_id: str
    protocol: MigrationProtocol
    direction: Direction
    from_nodes: int
    to_nodes: int
    phases_ms: Mapping[str, float | None]
    captured_events: int
    lost: int
    replayed: int
    outcome: Outcome
    reason: str = ""
    catch_up_ms: float | None = None
    stabilization_ms: float | None = None
    #: `restart`: the periodic checkpoint the new schedule started from
    restored_from: str | None = None
    #: PREPARE sent (or, for `restart`, the workers told to stop) -> every source resumed
    pause_ms: float | None = None
    #: readying the new schedule before anything was paused (added nodes started, inboxes bound)
    prepare_ms: float | None = None
    #: CCR: whether every executor paused (`all`) or only those that moved (`moving`)
    scope: MigrationScope = "all"
    #: executors of the old schedule that paused (captured, drained or stopped), and how many it had
    paused_executors: int | None = None
    executors: int | None = None
    #: scope `keyGroups`: the batches the key groups moved in, and the longest a batch's events waited (its
    #: flip to its state installed)
    batches: int | None = None
    longest_hold_ms: float | None = None

    def to_status(self) -> dict[str, object]:
        return {
            "migration": self.protocol,
            "direction": self.direction,
            "fromNodes": self.from_nodes,
            "toNodes": self.to_nodes,
            "phases": {k: v for k, v in self.phases_ms.items() if v is not None},
            "capturedEvents": self.captured_events,
            "lost": self.lost,
            "replayed": self.replayed,
            "outcome": self.outcome,
            "reason": self.reason,
            "catchUpMs": self.catch_up_ms,
            "stabilizationMs": self.stabilization_ms,
            "restoredFrom": self.restored_from,
            "pauseMs": self.pause_ms,
            "prepareMs": self.prepare_ms,
            "scope": self.scope,
            "pausedExecutors": self.paused_executors,
            "executors": self.executors,
            **({} if self.batches is None else {"batches": self.batches, "longestHoldMs": self.longest_hold_ms}),
        }
