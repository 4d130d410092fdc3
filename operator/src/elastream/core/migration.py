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
(per key group), pending list and source position, forwards COMMIT, acks;  4. the backend applies the new
schedule;  5. INIT broadcast, resent every `init_resend_s` until acked; each executor loads the key groups
it now owns and the pending events routed to it, replays them, acks (a duplicate INIT is re-acked, not
re-applied);  6. sources resume, record closed. Failure before step 4 aborts (executors replay their own
pending lists, sources resume); from step 4 on the migration only goes forward.
DCR differs in step 2-3: PREPARE travels in-band behind the data (so queues drain through processing),
nothing is captured, and COMMIT persists state only.
`restart` skips steps 2-3: the backend stops every worker and starts the new schedule, whose executors are
initialised from the last periodic checkpoint (state per key group, source positions); the sources replay
what they emitted after it, so sinks see those events twice and the report counts them.

Periodic checkpoints (`CheckpointRound`) are aligned barriers, as in Flink: the sources persist their
position and send BARRIER in-band; an executor that has BARRIER from one upstream channel holds that
channel's later input until BARRIER has come from every upstream executor, then persists its state,
forwards BARRIER and acks. The sources never pause.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from elastream.core.metrics import MetricSample
from elastream.core.outcomes import Direction, Outcome
from elastream.core.schedule import Schedule, key_group_owner
from elastream.core.topology import Topology, executor_id, split_executor_id

Protocol = Literal["ccr", "dcr", "restart"]


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


class Phase(enum.Enum):
    PREPARING = "preparing"  # PREPARE sent; waiting for every executor's ack
    COMMITTING = "committing"  # COMMIT sweeping the dataflow; waiting for every executor's ack
    REBALANCING = "rebalancing"  # backend applying the new schedule
    INITIALIZING = "initializing"  # INIT broadcast (and resent); waiting for every new executor's ack
    DONE = "done"
    ABORTED = "aborted"


#: phases after which the migration can only go forward (state is in Redis, the old schedule may be gone)
POINT_OF_NO_RETURN = Phase.REBALANCING


class ActionKind(enum.Enum):
    PAUSE_SOURCES = "pause_sources"
    BROADCAST_PREPARE = "broadcast_prepare"
    START_COMMIT = "start_commit"  # sources emit COMMIT in-band on all their output channels
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
    #: after COMMIT a timed-out phase is retried this many times, then the migration stalls
    #: (`MigrationStalled`): its state stays in Redis and the controller resumes it later, with backoff
    retries_after_commit: int = 2


class MigrationStalled(Exception):
    """A migration past COMMIT could not finish within its retries (a worker that does not come back, Redis
    away): nothing is lost, its record and state stay in Redis for a later `resume`."""


@dataclass
class MigrationCoordinator:
    """The controller's side of one migration. Feed it `start`, `on_ack`, `on_rebalanced`, `on_tick` and
    `on_failure`; carry out the actions it returns, in order."""

    migration_id: str
    protocol: Protocol
    old_executors: frozenset[str]
    new_executors: frozenset[str]
    timeouts: Timeouts = field(default_factory=Timeouts)
    phase: Phase = Phase.PREPARING
    acked: set[str] = field(default_factory=set)
    times: PhaseTimes = field(default_factory=PhaseTimes)
    phase_started: float = 0.0
    last_init_sent: float = 0.0
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
        """Resend INIT to the executors that have not acked; time phases out."""
        if self.phase in (Phase.DONE, Phase.ABORTED):
            return []
        limit = {
            Phase.PREPARING: self.timeouts.prepare_s,
            Phase.COMMITTING: self.timeouts.commit_s,
            Phase.REBALANCING: self.timeouts.rebalance_s,
            Phase.INITIALIZING: self.timeouts.init_s,
        }[self.phase]
        if now - self.phase_started > limit:
            missing = sorted(set(self._expected()) - self.acked)
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            reason = f"{self.phase.value} timed out after {limit:g} s" + (f" waiting for {shown}" if missing else "")
            return self.on_failure(reason, now)
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
    protocol: Protocol = "ccr"
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
        if migration_id != self.migration_id:
            return False
        if from_upstream is not None:
            self.commits_seen.add(from_upstream)
        if self.commits_seen >= self.upstream:
            self.mode = Mode.CHECKPOINTED
            return True
        return False

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


# ---- who owns what after a rescale -------------------------------------------------------------------------


@dataclass(frozen=True)
class StateMove:
    vertex: str
    key_group: int
    from_executor: str
    to_executor: str


def state_moves(topology: Topology, old: Schedule, new: Schedule) -> list[StateMove]:
    """Key groups of stateful vertices whose owning executor changes between two schedules (parallelism
    changes move ranges; executors that only change node keep their groups but their state still travels
    through the store, so those are listed too)."""
    old_par, new_par = old.parallelism(), new.parallelism()
    moves: list[StateMove] = []
    for name, vertex in topology.vertices.items():
        if not vertex.stateful:
            continue
        max_par = vertex.max_parallelism
        for group in range(max_par):
            before = executor_id(name, key_group_owner(max_par, old_par[name], group))
            after = executor_id(name, key_group_owner(max_par, new_par[name], group))
            if before != after or old.node_of(before) != new.node_of(after):
                moves.append(StateMove(name, group, before, after))
    return moves


def affected_executors(old: Schedule, new: Schedule) -> frozenset[str]:
    """Executors that start, stop or move: the ones a migration must checkpoint and initialise."""
    changed = {e for e in old.assignment if new.assignment.get(e) != old.assignment[e]}
    changed |= {e for e in new.assignment if e not in old.assignment}
    return frozenset(changed)


def upstream_executors(topology: Topology, schedule: Schedule, executor: str) -> frozenset[str]:
    """Every executor with a channel into `executor` under `schedule` (COMMIT alignment needs them all)."""
    vertex, index = split_executor_id(executor)
    result: set[str] = set()
    parallelism = schedule.parallelism()
    for parent in topology.parents(vertex):
        grouping = topology.stream(parent, vertex).grouping
        if grouping == "global" and index != 0:
            continue
        result.update(executor_id(parent, i) for i in range(parallelism[parent]))
    return frozenset(result)


@dataclass(frozen=True)
class MigrationReport:
    """The paper's metrics for one migration, in the shape the resource's status.lastScaling takes."""

    migration_id: str
    protocol: Protocol
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
        }


def missing_and_duplicates(sent: Iterable[tuple[str, int]], received: Sequence[tuple[str, int]]) -> tuple[int, int]:
    """Exactly-once check: (events sent but never received, events received more than once)."""
    sent_set = set(sent)
    seen: set[tuple[str, int]] = set()
    duplicates = 0
    for event in received:
        if event in seen:
            duplicates += 1
        seen.add(event)
    return len(sent_set - seen), duplicates


def rate_timeline(
    samples: Iterable[MetricSample],
    sources: Iterable[str],
    sinks: Iterable[str],
    at: float = 0.0,
    bucket_s: float = 0.5,
) -> dict[str, list[tuple[float, float]]]:
    """Input (the sources' processing rate) and output (the sinks') per `bucket_s`, times relative to `at`:
    the curves of the CCR paper's Fig. 7 and what `recovery_times` reads. Rates come from consecutive
    samples of one executor incarnation; buckets without a sample (workers stopped or starting) are rates
    of zero, not gaps to draw across."""
    source_set, sink_set = set(sources), set(sinks)
    series: dict[str, dict[float, float]] = {"input": {}, "output": {}}
    previous: dict[tuple[str, float], MetricSample] = {}
    for sample in sorted(samples, key=lambda s: s.ts):
        kind = "input" if sample.vertex in source_set else "output" if sample.vertex in sink_set else None
        if kind is None:
            continue
        key = (sample.executor, sample.started_at)
        old = previous.get(key)
        previous[key] = sample
        if old is not None and sample.ts > old.ts:
            bucket = round((sample.ts - at) / bucket_s) * bucket_s
            rate = (sample.processed - old.processed) / (sample.ts - old.ts)
            series[kind][bucket] = series[kind].get(bucket, 0.0) + rate
    times = [t for rates in series.values() for t in rates]
    if not times:
        return {kind: [] for kind in series}
    first, last = min(times), max(times)
    buckets = [first + bucket_s * i for i in range(round((last - first) / bucket_s) + 1)]
    return {
        kind: [(t, rates.get(round(t / bucket_s) * bucket_s, 0.0)) for t in buckets] for kind, rates in series.items()
    }


def recovery_times(
    output: Sequence[tuple[float, float]], migrated_at: float = 0.0, tolerance: float = 0.1, hold: int = 3
) -> tuple[float | None, float | None]:
    """Catch-up and stabilization time (seconds after `migrated_at`) from an output-rate timeline of
    (time, rate) points, as the CCR paper measures them: the reference is the mean rate before the
    migration; catch-up ends at the first point after it whose rate is back to at least (1 - tolerance) x
    reference; stabilization ends where the rate enters the ±tolerance band and stays there for `hold`
    points. None when the timeline has no such point (or no reference)."""
    before = [rate for t, rate in output if t < migrated_at]
    after = [(t, rate) for t, rate in output if t >= migrated_at]
    if not before or not after:
        return None, None
    reference = sum(before) / len(before)
    if reference <= 0.0:
        return None, None
    catch_up = next((t - migrated_at for t, rate in after if rate >= (1.0 - tolerance) * reference), None)
    stable: float | None = None
    for i in range(len(after) - hold + 1):
        window = after[i : i + hold]
        if all(abs(rate - reference) <= tolerance * reference for _, rate in window):
            stable = window[0][0] - migrated_at
            break
    return catch_up, stable


def convergence_time(
    output: Sequence[tuple[float, float]],
    reference: float,
    started_at: float = 0.0,
    tolerance: float = 0.05,
    crossings: int = 2,
) -> float | None:
    """Stela's convergence time (Xu et al., IC2E 2016, section IV-D): seconds from `started_at` (the scale
    operation's start) until the throughput stabilizes, i.e. the first point of the timeline from which the
    rate goes `crossings` times above and `crossings` times below `reference` (the post-scale average) with
    a standard deviation of those points within `tolerance` (5 %) of it. None when it never does."""
    if reference <= 0.0:
        return None
    after = [(t, rate) for t, rate in output if t >= started_at]
    for i, (start, _) in enumerate(after):
        above = below = 0
        for j in range(i, len(after)):
            rate = after[j][1]
            above += rate > reference
            below += rate < reference
            if above >= crossings and below >= crossings:
                window = [r for _, r in after[i : j + 1]]
                if statistics.pstdev(window) <= tolerance * reference:
                    return start - started_at
                break
    return None


def time_at_zero(
    output: Sequence[tuple[float, float]], start: float, end: float, bucket_s: float, floor: float = 0.0
) -> float:
    """Seconds of the timeline's buckets in [start, end] whose rate is at most `floor` (the paper's down
    time, Fig. 8b: the time the topology's throughput is zero)."""
    return bucket_s * sum(1 for t, rate in output if start <= t <= end and rate <= floor)


# ---- periodic checkpoints ----------------------------------------------------------------------------------


class CheckpointPhase(enum.Enum):
    RUNNING = "running"  # BARRIER sweeping the dataflow; waiting for every executor's ack
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass
class CheckpointRound:
    """The controller's side of one periodic checkpoint: BARRIER to the sources, then every executor's ack.
    A round that does not complete in `timeout_s` fails; the caller tells the executors to stop aligning
    (they release what they held) and deletes its keys: the previous checkpoint stays the latest."""

    checkpoint_id: str
    executors: frozenset[str]
    started_at: float
    timeout_s: float = 30.0
    phase: CheckpointPhase = CheckpointPhase.RUNNING
    acked: set[str] = field(default_factory=set)
    state_bytes: int = 0
    failure: str | None = None
    completed_at: float | None = None

    def on_ack(self, executor: str, state_bytes: int, now: float) -> CheckpointPhase:
        if self.phase == CheckpointPhase.RUNNING and executor in self.executors and executor not in self.acked:
            self.acked.add(executor)
            self.state_bytes += state_bytes
            if self.acked == set(self.executors):
                self.phase = CheckpointPhase.COMPLETED
                self.completed_at = now
        return self.phase

    def on_tick(self, now: float) -> CheckpointPhase:
        if self.phase == CheckpointPhase.RUNNING and now - self.started_at > self.timeout_s:
            missing = sorted(self.executors - self.acked)
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            self.failure = f"checkpoint {self.checkpoint_id} timed out after {self.timeout_s:g} s waiting for {shown}"
            self.phase = CheckpointPhase.FAILED
        return self.phase

    def on_failure(self, reason: str) -> CheckpointPhase:
        if self.phase == CheckpointPhase.RUNNING:
            self.failure = f"checkpoint {self.checkpoint_id} failed: {reason}"
            self.phase = CheckpointPhase.FAILED
        return self.phase

    @property
    def duration_ms(self) -> float | None:
        return None if self.completed_at is None else (self.completed_at - self.started_at) * 1000.0


def _position_counts(position: object) -> dict[object, int]:
    """A source position as {lane: events read in it}. Positions are mappings from a lane (a synthetic
    source's lane, a redis-stream executor's index) to a count, or to ``[entry id, count]``; a key that is
    no lane number (a synthetic source's profile "clock", a redis-stream source's "lanes" mark) is not a
    count."""
    counts: dict[object, int] = {}
    if isinstance(position, Mapping):
        for lane, value in position.items():
            if not str(lane).isdigit():
                continue
            if isinstance(value, int | float) and not isinstance(value, bool):
                counts[str(lane)] = int(value)
            elif isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) == 2:
                counts[str(lane)] = int(value[1])
    return counts


def replayed_events(checkpointed: Iterable[object], latest: Iterable[object]) -> int:
    """How many events the sources emit again when they go back from their `latest` positions to the
    `checkpointed` ones: per lane, the furthest position reached minus the checkpointed one (a lane's
    position only grows between checkpoints, and a rescale hands whole lanes to other executors, so
    positions are merged per lane by their maximum)."""
    at_checkpoint: dict[object, int] = {}
    for position in checkpointed:
        for lane, count in _position_counts(position).items():
            at_checkpoint[lane] = max(at_checkpoint.get(lane, 0), count)
    reached: dict[object, int] = {}
    for position in latest:
        for lane, count in _position_counts(position).items():
            reached[lane] = max(reached.get(lane, 0), count)
    return sum(max(0, count - at_checkpoint.get(lane, 0)) for lane, count in reached.items())
