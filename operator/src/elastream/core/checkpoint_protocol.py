"""Periodic checkpoints as a pure state machine: one round of aligned barriers, and what a restore replays.

Aligned barriers, as in Flink: the sources persist their position and send BARRIER in-band; an executor
that has BARRIER from one upstream channel holds that channel's later input until BARRIER has come from
every upstream executor, then persists its state, forwards BARRIER and acks. The sources never pause.
`CheckpointRound` is the controller's side of one round (`control.checkpoint_driver` drives it over Redis);
`replayed_events` counts what the sources emit again when a restore goes back to a checkpoint.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from elastream.core.migration_protocol import first_few


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
    #: what each executor reported: a key-group migration sizes its batches from it (`core.keygroup_batches`)
    state_bytes_by_executor: dict[str, int] = field(default_factory=dict)
    failure: str | None = None
    completed_at: float | None = None

    def on_ack(self, executor: str, state_bytes: int, now: float) -> CheckpointPhase:
        if self.phase == CheckpointPhase.RUNNING and executor in self.executors and executor not in self.acked:
            self.acked.add(executor)
            self.state_bytes += state_bytes
            self.state_bytes_by_executor[executor] = state_bytes
            if self.acked == set(self.executors):
                self.phase = CheckpointPhase.COMPLETED
                self.completed_at = now
        return self.phase

    def on_tick(self, now: float) -> CheckpointPhase:
        if self.phase == CheckpointPhase.RUNNING and now - self.started_at > self.timeout_s:
            missing = sorted(self.executors - self.acked)
            waiting = first_few(missing)
            self.failure = f"checkpoint {self.checkpoint_id} timed out after {self.timeout_s:g} s waiting for {waiting}"
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
