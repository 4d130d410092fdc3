"""The executor's side of a migration (CCR, DCR): what an executor does with PREPARE, COMMIT, INIT, RESUME and
ABORT, with its captured events, and with its state, on top of the pure `ExecutorParticipant`.

Control messages are dicts ``{"type", "mid", "protocol"?}``. The controller sends PREPARE (CCR: to every
executor; DCR: to the sources, which forward it in-band), COMMIT (to the sources, which forward it in-band),
INIT (to every executor of the new schedule), RESUME (to the sources) and ABORT. Executors ack in Redis
through the `CheckpointStore` (phases "preparing", "committing", "initializing").

Every Redis call here waits out a Redis outage (`retry_redis`) until the executor stops: an ack, a
checkpoint's save and INIT's loads are retried, never skipped, and a save is applied once however often it is
retried (its token), so a migration or checkpoint in flight completes when Redis is back.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from elastream.core.migration_protocol import ExecutorParticipant
from elastream.core.schedule import key_group_of
from elastream.core.topology import split_executor_id
from elastream.runtime.routing import grouping_key
from elastream.store.checkpoint_store import ANY, CheckpointStore, ExecutorCheckpoint
from elastream.store.codec import pack, unpack
from elastream.store.retry import retry_redis

T = TypeVar("T")

log = logging.getLogger("elastream.worker")

#: how often a new source instance looks for its old instance's position during a hand-over
POSITION_POLL_S = 0.002


@dataclass
class Migration:
    """One executor's migration bookkeeping."""

    executor: str
    store: CheckpointStore
    participant: ExecutorParticipant
    #: parent vertex -> (grouping, key field) of the stream into this executor's vertex
    inputs: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    max_parallelism: int = 1
    #: the migration whose INIT this executor waits for before it processes anything
    awaiting: str | None = None
    pending: dict[str, list[Any]] = field(default_factory=dict)
    captured: int = 0
    #: the executor's stop event: a call waiting for Redis gives up when it is set (`RetryCancelled`)
    stop: threading.Event | None = None
    #: the partial migration this executor, which stays, holds its output to moving receivers for
    holding: str | None = None
    #: this executor moves in a partial migration (PREPARE's scope `moving`): its checkpoint is not a
    #: consistent cut of the topology, so an exactly-once sink hands its uncommitted output over instead of
    #: staging it under the migration (the new instance commits it with the next periodic checkpoint)
    hand_over: bool = False
    #: the checkpoint saved at a migration's COMMIT: (its id, the save's token, what was saved, its state's
    #: size), for a resent COMMIT (`recommit`); dropped once the migration is over here (INIT or ABORT)
    last_save: tuple[str, str, ExecutorCheckpoint, int] | None = None

    @property
    def vertex(self) -> str:
        return split_executor_id(self.executor)[0]

    def _redis(self, what: str, call: Callable[[], T]) -> T:
        return retry_redis(call, f"executor {self.executor}: cannot {what}", self.stop)

    def ack(self, mid: str, phase: str, **info: int) -> None:
        self._redis(f"ack {phase} of {mid}", lambda: self.store.ack(mid, phase, self.executor, info))

    def ack_batch(self, mid: str, batch: int) -> None:
        """A recipient installed `batch` of a migration of scope `keyGroups`: acked under the batch's number."""
        info = {"executor": self.executor}
        self._redis(f"ack batch {batch} of {mid}", lambda: self.store.ack(mid, "installed", str(batch), info))

    def capture(self, sender: str, events: Any) -> None:
        """Keep events that arrived after PREPARE, by the key group they belong to in this vertex (fields
        inputs) or in the shared list (other groupings), in arrival order."""
        grouping, key_field = self.inputs.get(split_executor_id(sender)[0], ("shuffle", None))
        for event in events:
            if grouping == "fields":
                bucket = str(key_group_of(grouping_key(event, key_field), self.max_parallelism))
            else:
                bucket = ANY
            self.pending.setdefault(bucket, []).append(event)
        self.captured += len(events)

    def checkpoint(self, mid: str, operator: Any, position: Any = None) -> int:
        """Persist state (per key group), captured events and a source's position in one round trip; an
        exactly-once sink first stages its output under `mid` (committed with the checkpoint)."""
        hand_over = getattr(operator, "hand_over", None)
        if self.hand_over and callable(hand_over):
            uncommitted = hand_over()
            self.pending.setdefault(ANY, []).extend(uncommitted)  # any new instance of the sink may write them
            self.captured += len(uncommitted)
        else:
            pre_commit = getattr(operator, "pre_commit", None)
            if callable(pre_commit):
                pre_commit(mid)
        state: dict[int, bytes] = {}
        snapshot = getattr(operator, "snapshot_state", None)
        if callable(snapshot):
            state = {int(g): pack(v) for g, v in snapshot().items()}
        pending = {bucket: [pack(e) for e in events] for bucket, events in self.pending.items()}
        checkpoint = ExecutorCheckpoint(
            self.executor,
            self.vertex,
            state=state,
            pending=pending,
            position=None if position is None else pack(position),
        )
        token = uuid.uuid4().hex  # the same on every retry: the save is applied once
        self._redis(f"save checkpoint {mid}", lambda: self.store.save(mid, checkpoint, token=token))
        state_bytes = sum(len(b) for b in state.values())
        if self.participant.committed(mid):  # a migration's COMMIT, not a periodic checkpoint: kept for a resend
            self.last_save = (mid, token, checkpoint, state_bytes)
        return state_bytes

    def recommit(self, mid: str) -> bool:
        """A resent COMMIT: the controller has not seen this executor's ack of `mid`. If this executor has
        committed `mid`, save the same checkpoint again under the same token (so it is written only if the
        first save was lost, as a Redis failover can lose an acknowledged write) and ack again; True then.
        False when it has not committed: the COMMIT is handled as any other."""
        saved = self.last_save
        if saved is None or saved[0] != mid or not self.participant.committed(mid):
            return False
        _, token, checkpoint, state_bytes = saved
        self._redis(f"save checkpoint {mid} again", lambda: self.store.save(mid, checkpoint, token=token))
        self.ack(mid, "committing", captured=self.captured, state_bytes=state_bytes)
        return True

    def abort(self, mid: str, operator: Any) -> list[Any]:
        """`mid` was abandoned: an exactly-once sink takes back what it staged; returns the captured events
        to replay locally."""
        abort_commit = getattr(operator, "abort_commit", None)
        if callable(abort_commit):
            abort_commit(mid)
        return self.take_pending()

    def take_pending(self) -> list[Any]:
        """The captured events in arrival order per bucket (after an ABORT they are replayed locally)."""
        events = [e for bucket in self.pending.values() for e in bucket]
        self.pending, self.last_save = {}, None
        self.captured = 0
        return events

    def restore(self, mid: str, operator: Any, key_groups: range, index: int, parallelism: int) -> list[Any]:
        """Load the state of the key groups this executor owns now; return the captured events routed to it."""
        self.last_save = None
        restore = getattr(operator, "restore_state", None)
        if callable(restore):
            blobs = self._redis(f"load the state of {mid}", lambda: self.store.load_state(mid, self.vertex, key_groups))
            if blobs:
                restore({g: unpack(b) for g, b in blobs.items()})
        pending = self._redis(
            f"load the captured events of {mid}",
            lambda: self.store.load_pending(mid, self.vertex, key_groups, index, parallelism),
        )
        return [unpack(b) for b in pending]

    def wait_positions(self, mid: str, executors: Collection[str], timeout_s: float = 30.0) -> bool:
        """Wait until every one of `executors` has saved its position under `mid` (a key-group migration's
        source hand-over: the new instance starts where the old one stopped, without a controller round trip
        between them); False when stopped or after `timeout_s`."""
        wanted = set(executors)
        deadline = time.monotonic() + timeout_s
        while True:
            saved = self._redis(f"read the source positions of {mid}", lambda: self.store.load_positions(mid))
            if wanted <= set(saved):
                return True
            if time.monotonic() > deadline or (self.stop is not None and self.stop.wait(POSITION_POLL_S)):
                return False
            if self.stop is None:
                time.sleep(POSITION_POLL_S)

    def merged_positions(self, mid: str) -> dict[Any, Any]:
        """Every old source executor's position of this vertex, merged (lanes are disjoint)."""
        merged: dict[Any, Any] = {}
        positions = self._redis(f"load the source positions of {mid}", lambda: self.store.load_positions(mid))
        for executor, blob in positions.items():
            if split_executor_id(executor)[0] == self.vertex:
                position = unpack(blob)
                if isinstance(position, Mapping):
                    merged.update(position)
        return merged
