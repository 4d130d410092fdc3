"""The source executor: a thread that polls a source operator for the events that fall due, stamps them and
routes them (`elastream.runtime.routing`), and takes part in migrations and checkpoints as their starting
point (its position is what a checkpoint records). `elastream.runtime.executor` has the loop both kinds of
executor share and the executor of processing vertices and sinks."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from elastream.core.migration_protocol import ControlType
from elastream.runtime.executor import CONTROLLER, FLUSH_S, ExecutorLoop
from elastream.runtime.keygroup_migration import on_flip
from elastream.runtime.partial_migration import on_sender_control, release_held
from elastream.runtime.transport import MAX_BATCH

log = logging.getLogger("elastream.worker")


class SourceThread(ExecutorLoop):
    """Runs a source operator: polls it for due events, stamps them and routes them.

    `received` counts the events offered so far (due by the rate profile), `processed` those emitted, so a
    source that cannot keep up shows a growing queue and a processing rate below its input rate. A source
    that tells what it was offered and what waits (`offered(now)`, `backlog(now)`: `Synthetic`) reports
    those instead, at the metric sample's own time: what it was offered since it took its lanes over, and
    what it owes (a backlog inherited from a migration, what back-pressure holds) as its queue."""

    kind = "source"
    #: the time of the events being emitted (their `ts`), and whether the operator is open (`offered_at` may
    #: ask it then)
    now = 0.0
    opened = False
    #: the position this thread last read for the worker to publish (`reported_position`), and whether the
    #: worker asks for a fresh one. The operator's position is read on this thread only: `Synthetic.position`
    #: settles its lanes, and read beside a poll (the metrics thread did) it could make the poll emit a lane's
    #: last events again, or fail it
    published_position: Any = None
    position_wanted = False

    def offered_at(self, now: float) -> tuple[int, int]:
        """`received` and `queue_len` for a metric sample taken at `now`. A source that can tell what it was
        offered without emitting (`Synthetic.offered`) is asked at the sample's own time: its offered series
        then follows the rate profile, not when this thread last ran, which back-pressure, a pause or a busy
        machine delays (and a rescale's catch-up would read as a trend of the load)."""
        counters = self.counters
        offered, backlog = getattr(self.operator, "offered", None), getattr(self.operator, "backlog", None)
        if not self.opened or not callable(offered) or not callable(backlog) or self.migration.awaiting is not None:
            return counters.received, max(counters.queue_len, 0)
        received = max(counters.received, counters.reported_received, int(offered(now)))
        counters.reported_received = received
        return received, int(backlog(now))

    def reported_position(self) -> Any:
        """The position for the worker to publish (`worker_metrics.source_positions`), from any thread: once
        this thread has ended, the operator's own (its last); while it runs, the one it last read, and a fresh
        one is asked for (its loop reads it next). None before the first, and while it waits for INIT."""
        position = getattr(self.operator, "position", None)
        if not callable(position) or self.migration.awaiting is not None:
            return None
        if not self.is_alive():
            return position() if self.opened else None
        self.position_wanted = True
        return self.published_position

    def _read_position(self) -> Any:
        """The operator's position, on this thread, kept for `reported_position` too."""
        position = getattr(self.operator, "position", None)
        self.position_wanted = False
        self.published_position = position() if callable(position) else None
        return self.published_position

    def emit_new(self, event_id: int, key: Any, value: Any) -> None:
        self.counters.emitted += 1
        self.router.route((event_id, key, value, self.now))

    def emit_events(self, events: list[Any]) -> None:
        """What a `poll_batch` emits: whole events, stamped with the poll's time."""
        self.counters.emitted += len(events)
        self.router.route_batch(events)

    def loop(self) -> None:
        counters = self.counters
        poll_batch = getattr(self.operator, "poll_batch", None)
        exhausted = getattr(self.operator, "exhausted", None)
        backlog = getattr(self.operator, "backlog", None)
        backlog = backlog if callable(backlog) else None
        self.opened = True
        #: events one poll may emit: about `FLUSH_S` of this source's own time per event, measured
        poll_cap = MAX_BATCH
        while not self.stop.is_set():
            while not self.control.empty():
                self.on_control(CONTROLLER, self.control.get_nowait())
            if self.position_wanted and self.migration.awaiting is None:
                self._read_position()
            if self.paused.is_set() or (exhausted is not None and exhausted()):
                self.stop.wait(0.005)  # not a sleep: a stop is honoured at once
                continue
            start = time.perf_counter()
            budget = self.router.budget(MAX_BATCH)
            if budget == 0:  # the channels are (nearly) full: back-pressure reaches the source here
                self.router.await_credit(0.01)
                counters.busy_s += time.perf_counter() - start - self.router.take_blocked()
                continue
            self.now = time.time()
            before = counters.emitted
            if poll_batch is not None:
                due = poll_batch(self.now, self.emit_events, min(budget, poll_cap))
            else:
                due = self.operator.poll(self.now, self.emit_new, min(budget, poll_cap))
            polled = time.perf_counter() - start
            self.router.flush()
            emitted = counters.emitted - before
            if emitted:
                poll_cap = max(1, min(MAX_BATCH, int(FLUSH_S * emitted / max(polled, 1e-6))))
            counters.processed += emitted
            if backlog is not None:  # the source tells what it was offered and what waits (`Synthetic`)
                counters.received = max(counters.received, int(due))
                counters.queue_len = backlog(self.now)
            else:
                counters.received = max(counters.received, int(due), counters.processed)
                counters.queue_len = counters.received - counters.processed
            counters.busy_s += time.perf_counter() - start - self.router.take_blocked()
            self.crash_if_due()
            if emitted == 0:
                self.stop.wait(0.002)

    def on_control(self, sender: str, message: Mapping[str, Any]) -> None:
        migration = self.migration
        kind, mid = message.get("type"), str(message.get("mid"))
        if on_sender_control(self, message):
            return
        if kind == ControlType.FLIP:  # a key-group migration of a vertex this source feeds
            on_flip(self.executor, self.router, message)
        elif kind == ControlType.HANDOFF:
            # a key-group migration moves this source: it stops here, and its new instance starts where it did
            self.paused.set()
            self.router.flush()
            position = self._read_position()
            migration.checkpoint(mid, self.operator, position)
            migration.ack(mid, "handoff")
        elif kind == ControlType.PREPARE:
            self.paused.set()
            migration.participant.protocol = message.get("protocol", "ccr")
            migration.participant.on_prepare(mid)
            if migration.participant.protocol == "dcr":
                self.router.send_control({"type": ControlType.PREPARE, "mid": mid, "protocol": "dcr"})
            migration.ack(mid, "preparing")
        elif kind == ControlType.COMMIT:
            if message.get("resend") and migration.recommit(mid):
                return  # committed before: saved again (only if lost) and acked again
            if not migration.participant.on_commit(mid, None):
                return  # the migration was aborted (RESUME came first): nothing to commit
            position = self._read_position()
            migration.checkpoint(mid, self.operator, position)
            self.router.send_control({"type": ControlType.COMMIT, "mid": mid})
            migration.ack(mid, "committing")
        elif kind == ControlType.CHECKPOINT:
            # the position of everything emitted so far, then BARRIER behind it on every channel
            position = self._read_position()
            state_bytes = migration.checkpoint(mid, self.operator, position)
            self.router.send_control({"type": ControlType.BARRIER, "mid": mid})
            migration.ack(mid, "checkpointing", state_bytes=state_bytes)
        elif kind == ControlType.INIT:
            awaited = message.get("await")
            if migration.awaiting == mid and awaited and not migration.wait_positions(mid, awaited):
                log.error("source %s: the positions of %s never came; not started", self.executor, awaited)
                return  # stays paused and unacked: the controller's wait times out and the migration rolls back
            if migration.awaiting == mid:
                restore_from = str(message.get("from") or mid)  # a recovery's checkpoint, or this migration
                merged = migration.merged_positions(restore_from)
                if merged and callable(getattr(self.operator, "seek", None)):
                    self.operator.seek(merged)
                    pace_replay = getattr(self.operator, "pace_replay", None)
                    if restore_from != mid and callable(pace_replay):
                        pace_replay()  # a recovery replays since its checkpoint: at the profile's rate
                migration.awaiting = None
                self._read_position()  # what the worker publishes from now on
            migration.ack(mid, "initializing")
        elif kind in (ControlType.RESUME, ControlType.ABORT):
            if message.get("to") == "new" and migration.awaiting is not None:
                return  # a hand-over whose INIT did not complete: never start from no position
            migration.participant.on_abort()
            release_held(self)
            self.paused.clear()
