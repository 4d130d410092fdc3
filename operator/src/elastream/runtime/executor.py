"""Executors: one thread per executor, running an operator over its inbox and routing what it emits
(`elastream.runtime.routing`). `Counters` are what the worker publishes every interval.

An exception in a user operator's `process` (or another hook) is counted in `errors` and the executor goes on.
Any other exception that reaches an executor's loop is a fault of the runtime: the thread logs it with its
traceback and calls its `on_failure` (the worker then reports not-ready and exits, so recovery starts). A
`RetryCancelled` (the executor stopped while it waited for Redis) is a clean stop, not a failure.

Test-only fault injection: with `ELASTREAM_TEST_CRASH=<executor>:<n>` in the environment (e.g. `w#0:500`),
that executor's loop raises `InjectedCrash` once it has processed `n` events (a source: emitted), outside
any operator, as a bug in the runtime would. Unset (always, outside tests) it does nothing.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter, length_hint
from typing import Any

from elastream.core.migration_protocol import ControlType, Mode
from elastream.runtime.keygroup_migration import IN_BAND_BATCHING, Batching, accepts, hold_or_pass, on_flip, on_in_band
from elastream.runtime.operators.api import SAME, Context
from elastream.runtime.partial_migration import on_sender_control, pending_share, release_held
from elastream.runtime.participant import Migration
from elastream.runtime.routing import Router
from elastream.runtime.transport import CONTROL, DATA, MAX_BATCH, Inbox
from elastream.store.retry import RetryCancelled

log = logging.getLogger("elastream.worker")

#: how long an idle executor waits on its inbox before it looks at its control queue again (the latency of
#: a PREPARE or INIT to an idle executor)
IDLE_POLL_MS = 20
#: the sender name of the controller's messages
CONTROLLER = "controller"
#: frames an executor takes off its socket ahead of processing (their events are its visible queue length)
READ_AHEAD = 8
#: the control messages executors send each other in-band (and DCR's PREPARE, with protocol "dcr")
IN_BAND = frozenset((ControlType.COMMIT, ControlType.BARRIER))
#: an event's ts
_TS = itemgetter(3)
#: the upper bounds (seconds) of the buckets of a sink's end-to-end latency histogram (`Counters.latency_buckets`)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: test-only: `<executor>:<n>` makes that executor's loop raise `InjectedCrash` after n events (see above)
TEST_CRASH_ENV = "ELASTREAM_TEST_CRASH"
#: what an executor emits goes out at least this often while it works through a batch, and a source's poll
#: emits at most this much of its own time: a costly operator's output would otherwise wait for the whole
#: batch (seconds, after a rescale's catch-up), which users feel as latency
FLUSH_S = 0.01
#: a batch is processed in parts of about this much time: between two, the executor looks at its controller
#: messages (a PREPARE interrupts a long batch), at its stop and at whether its output is due (`FLUSH_S`). A
#: part's size follows the operator's cost per event: one event of a costly operator, a whole frame of a
#: cheap one, which then pays for these looks (and for the clock) once a frame, not once an event
PART_S = 0.001


class InjectedCrash(RuntimeError):
    """The fault `ELASTREAM_TEST_CRASH` injects into an executor's loop (tests only)."""


def injected_crash_after(executor: str, environ: Mapping[str, str] = os.environ) -> int | None:
    """The event count after which `executor` must crash, from `ELASTREAM_TEST_CRASH`; None when unset, for
    another executor, or malformed (logged)."""
    raw = environ.get(TEST_CRASH_ENV, "").strip()
    if not raw:
        return None
    target, _, count = raw.rpartition(":")
    if target != executor:
        return None
    if not count.isdigit():
        log.warning("%s=%r: expected <executor>:<events>; ignored", TEST_CRASH_ENV, raw)
        return None
    return int(count)


#: what an executor thread calls when its loop dies of an exception (the worker's fatal-error path)
FailureHandler = Callable[["ExecutorLoop"], None]


@dataclass
class Counters:
    """Cumulative counters of one executor since `started_at` (gauges: queue_len, latency_ms), and a sink's
    latency histogram (`observe_sink_latencies`)."""

    started_at: float = field(default_factory=time.time)
    received: int = 0
    processed: int = 0
    emitted: int = 0
    busy_s: float = 0.0
    queue_len: int = 0
    errors: int = 0
    latency_sum_s: float = 0.0
    latency_count: int = 0
    #: the mean latency of the last published interval (ms), what the metric stream carries
    latency_ms: float = 0.0
    #: a sink's end-to-end latencies since it started: how many fell in each bucket of `LATENCY_BUCKETS_S`
    #: (at most its bound and above the previous one; the last: above them all), and their sum (seconds). Plain
    #: ints a scrape reads (`worker_metrics.WorkerCollector`): no lock, no Prometheus object per executor.
    #: None on an executor that is not a sink
    latency_buckets: list[int] | None = None
    latency_total_s: float = 0.0
    #: a source's offered count in its last published sample (`source_thread.SourceThread.offered_at`)
    reported_received: int = 0
    #: when an error of each hook was last logged (monotonic)
    last_error_log: dict[str, float] = field(default_factory=dict)

    def take_latency_ms(self) -> float:
        """Mean latency since the last call, in ms (end-to-end at sinks, per event elsewhere); also kept as
        `latency_ms`."""
        count, total = self.latency_count, self.latency_sum_s
        self.latency_count, self.latency_sum_s = 0, 0.0
        self.latency_ms = 1000.0 * total / count if count else 0.0
        return self.latency_ms

    def observe_sink_latencies(self, now: float, events: Sequence[Any]) -> None:
        """Count the end-to-end latency of each of `events` a sink processed at `now` (its source timestamp to
        `now`) in the interval's mean and, when kept, in the histogram.

        The hot path of every sink: a batch's timestamps are sorted (in C; nearly in order already), the
        buckets of its youngest and oldest event found, and one bisect per bound between them counts each
        bucket's events; a bisect per event, in Python, cost more than the rest of a null sink's work (measured
        on batches of 512: 27 ns an event without the histogram, 33 with it, 142 with a bisect per event). A
        batch whose sum is negative (a sink's clock behind its source's) adds 0 to the histogram's sum, which a
        counter must not decrease."""
        stamps = sorted(map(_TS, events))
        if not stamps:
            return
        count = len(stamps)
        total = count * now - sum(stamps)
        self.latency_sum_s += total
        self.latency_count += count
        buckets = self.latency_buckets
        if buckets is None:
            return
        self.latency_total_s += max(total, 0.0)
        bounds = LATENCY_BUCKETS_S
        youngest, oldest = bisect_left(bounds, now - stamps[-1]), bisect_left(bounds, now - stamps[0])
        older = count  # the events older than the previous bound (all, before the youngest's bucket)
        for bucket in range(youngest, oldest):
            older_than_bound = bisect_left(stamps, now - bounds[bucket])
            buckets[bucket] += older - older_than_bound
            older = older_than_bound
        buckets[oldest] += older


class ExecutorLoop(threading.Thread):
    """What executor and source threads share: the operator and its context, the router of its output, the
    migration bookkeeping, the stop of its generation, the controller's messages (handed over by the worker's
    control thread; they go before any input), its counters and the failure path (`on_failure`)."""

    def __init__(
        self,
        executor: str,
        operator: Any,
        context: Context,
        router: Router,
        stop: threading.Event,
        migration: Migration,
        on_failure: FailureHandler | None = None,
    ) -> None:
        super().__init__(name=executor, daemon=True)
        self.executor = executor
        self.operator = operator
        self.context = context
        self.router = router
        self.stop = stop
        self.migration = migration
        self.on_failure = on_failure
        self.crash_after = injected_crash_after(executor)
        self.control: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.counters = Counters()
        self.failure: BaseException | None = None
        #: a source's pause (set: it emits nothing; until every node is ready, and during a migration)
        self.paused = threading.Event()
        #: its part in a migration of scope `keyGroups` (`runtime.keygroup_migration`)
        self.batching = Batching()
        _bind_errors(operator, self.counters, context, executor)

    #: what the log lines call this thread's executor
    kind = "executor"

    def run(self) -> None:
        """Open the operator, run `loop` until stopped, close it. A stop while waiting for Redis is clean; any
        other exception is a fault of the runtime (`_failed`)."""
        try:
            self.operator.open(self.context)
            self.loop()
            self.router.flush()
            self.batching.close()
            self.operator.close()
        except RetryCancelled:
            log.info("%s %s stopped while waiting for Redis", self.kind, self.executor)
        except BaseException as exc:
            _failed(self, exc)

    def loop(self) -> None:
        raise NotImplementedError

    def crash_if_due(self) -> None:
        """Test-only: raise `InjectedCrash` once `ELASTREAM_TEST_CRASH` says so (see the module)."""
        if self.crash_after is not None and self.counters.processed >= self.crash_after:
            raise InjectedCrash(f"{TEST_CRASH_ENV}: {self.kind} {self.executor} after {self.crash_after} events")


class ExecutorThread(ExecutorLoop):
    """Runs a logic or sink operator: takes frames from the inbox, processes their events, routes output."""

    def __init__(
        self,
        executor: str,
        operator: Any,
        context: Context,
        inbox: Inbox,
        router: Router,
        stop: threading.Event,
        is_sink: bool,
        migration: Migration,
        on_failure: FailureHandler | None = None,
    ) -> None:
        super().__init__(executor, operator, context, router, stop, migration, on_failure)
        self.held: list[list[Any]] = []  # DATA that arrived before the INIT this executor waits for
        #: the periodic checkpoint being aligned: its id, the upstream executors whose BARRIER has come, and
        #: the frames of those channels held back until BARRIER has come from all
        self.barrier: str | None = None
        self.barriers_seen: set[str] = set()
        self.aligning_held: list[list[Any]] = []
        #: the latest rounds the controller abandoned (CHECKPOINT_ABORT)
        self.abandoned_rounds: collections.deque[str] = collections.deque(maxlen=16)
        self.inbox = inbox
        self.is_sink = is_sink
        if is_sink:
            self.counters.latency_buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.current: Any = None
        self.ahead: deque[list[Any]] = deque()
        self._last_error_log = 0.0
        self.timer = getattr(operator, "timer", None)
        #: the operator's `process_batch` (`BatchOperator`), or None: `process` is called event by event
        self.process_events: Callable[[Iterator[Any], Callable[[Any], None]], None] | None = getattr(
            operator, "process_batch", None
        )
        #: what a part of a batch emitted through `process_batch`, routed when the part is done
        self.out: list[Any] = []
        #: events in the next part of a batch (`PART_S`); it starts at one, for an operator of unknown cost
        self.part = 1

    def emit(self, value: Any, key: Any = SAME, event_id: int | None = None, ts: float | None = None) -> None:
        current = self.current
        self.counters.emitted += 1
        self.router.route(
            (
                current[0] if event_id is None else event_id,
                current[1] if key is SAME else key,
                value,
                current[3] if ts is None else ts,
            )
        )

    def loop(self) -> None:
        while not self.stop.is_set():
            frame = self._next_frame(take_input=not self.router.holding_full())
            if frame is not None:
                self.handle(frame)
            elif self.timer is not None and self._timer_allowed():
                self.on_timer()
            self.crash_if_due()

    def _timer_allowed(self) -> bool:
        """Timers fire only in normal processing: not during a migration (from PREPARE: what they would emit
        is in the state that moves, and must be emitted once, by the new executor), nor while waiting for
        INIT or aligning a checkpoint barrier (the state being saved must not change meanwhile)."""
        migration = self.migration
        return (
            migration.awaiting is None
            and migration.participant.mode is Mode.RUNNING
            and self.barrier is None
            and not self.batching.donating()
        )

    def on_timer(self) -> None:
        """Let an idle operator emit what is due by time (a window closing), then send it."""
        counters = self.counters
        start = time.perf_counter()
        self.current = (0, None, None, time.time())
        try:
            self.timer(self.emit)  # type: ignore[misc]
        except Exception as exc:
            report_error(counters, self.context, self.executor, "timer()", exc)
        self.router.flush()
        counters.busy_s += time.perf_counter() - start - self.router.take_blocked()

    def _next_frame(self, take_input: bool = True) -> list[Any] | None:
        if not self.control.empty():
            return [CONTROL, CONTROLLER, self.control.get_nowait()]
        if not take_input:  # a partial migration holds enough for moving receivers: input waits (back-pressure)
            self.stop.wait(IDLE_POLL_MS / 1000.0)
            return None
        if not self.ahead:
            frame = self.inbox.receive(IDLE_POLL_MS)
            if frame is None:
                return None
            self._take(frame)
        while len(self.ahead) < READ_AHEAD:
            frame = self.inbox.receive(0)
            if frame is None:
                break
            self._take(frame)
        if not self.ahead:  # what came was dropped (`_take`)
            return None
        frame = self.ahead.popleft()
        if len(frame) > 3:  # taken for processing: its credit goes back to the sender
            self.inbox.ack(frame[3])
            frame = frame[:3]
        if frame[0] == DATA:
            self.counters.queue_len -= len(frame[2])
        return frame

    def _take(self, frame: list[Any]) -> None:
        # In-band messages from upstream executors (COMMIT, DCR's PREPARE) keep their place behind the data
        # they follow; the controller's own messages arrive through `control` and go before everything.
        if frame[0] == DATA:
            self.counters.queue_len += len(frame[2])
        elif not self.in_band(frame[1], frame[2]):
            self.inbox.stats.drop("control")
            return
        self.ahead.append(frame)

    def in_band(self, sender: str, message: Mapping[str, Any]) -> bool:
        """Whether a control message that came on the inbox is one an upstream executor sends in-band:
        COMMIT, BARRIER or DCR's PREPARE, from an executor of this one's upstream. The controller's messages
        (INIT, ABORT, RESUME, CHECKPOINT_ABORT, ...) come only through the control queue, never a socket."""
        kind = message.get("type")
        if type(kind) is not str:
            return False
        if kind in IN_BAND_BATCHING:
            return accepts(self, sender, message)
        if kind not in IN_BAND and not (kind == ControlType.PREPARE and message.get("protocol") == "dcr"):
            return False
        return sender in self.migration.participant.upstream

    def handle(self, frame: list[Any]) -> None:
        kind, sender, payload = frame
        if kind == CONTROL:
            self.on_control(sender, payload)
            return
        migration = self.migration
        if migration.awaiting is not None:
            self.held.append(frame)
        elif self.batching.receiving():  # a new instance of a key-group migration: hold what is still to come
            events = hold_or_pass(self, sender, payload)
            if events:
                self.process_batch(events, sender)
        elif migration.participant.captures():
            self.counters.received += len(payload)
            migration.capture(sender, payload)
        elif self.barrier is not None and sender in self.barriers_seen:
            self.aligning_held.append(frame)  # this channel is past the barrier: hold it until aligned
        else:
            self.process_batch(payload, sender)

    def on_control(self, sender: str, message: Mapping[str, Any]) -> None:
        migration, participant = self.migration, self.migration.participant
        kind, mid = message.get("type"), str(message.get("mid"))
        log.debug("executor %s: %s of migration %s from %s", self.executor, kind, mid, sender)
        if sender == CONTROLLER and on_sender_control(self, message):
            return
        if sender == CONTROLLER and kind == ControlType.FLIP:
            on_flip(self.executor, self.router, message)
            return
        if sender != CONTROLLER and on_in_band(self, sender, message):
            return
        if kind == ControlType.PREPARE:
            participant.protocol = message.get("protocol", "ccr")
            migration.hand_over = message.get("scope") == "moving"
            prepared = participant.on_prepare(mid, sender if participant.protocol == "dcr" else None)
            self.abandon_alignment()
            if prepared:
                if participant.protocol == "dcr":
                    self.router.send_control({"type": ControlType.PREPARE, "mid": mid, "protocol": "dcr"})
                migration.ack(mid, "preparing")
        elif kind == ControlType.COMMIT:
            if message.get("resend") and migration.recommit(mid):
                return  # committed before: saved again (only if lost) and acked again
            if participant.on_commit(mid, sender):
                state_bytes = migration.checkpoint(mid, self.operator)
                self.router.send_control({"type": ControlType.COMMIT, "mid": mid})
                migration.ack(mid, "committing", captured=migration.captured, state_bytes=state_bytes)
        elif kind == ControlType.BARRIER:
            self.on_barrier(sender, mid)
        elif kind == ControlType.CHECKPOINT_ABORT:
            migration.abort(mid, self.operator)  # nothing is captured during a checkpoint: only the sink's part
            self.abandoned_rounds.append(mid)  # its barriers still on their way are ignored
            if self.barrier == mid:
                self.release_aligned()
        elif kind == ControlType.INIT:
            if migration.awaiting == mid and participant.on_init(mid):
                context = self.context
                source = str(message.get("from") or mid)  # `restart`: the periodic checkpoint to restore
                index, share = pending_share(message, context)
                events = migration.restore(source, self.operator, context.key_groups, index, share)
                # initialised: state loaded, captured events in hand. Ack now (restore ends here, as in the
                # paper); replaying them, before any newer input, is the catch-up that follows.
                migration.ack(mid, "initializing", replayed=len(events))
                for start in range(0, len(events), MAX_BATCH):
                    self.process_batch(events[start : start + MAX_BATCH])
                migration.awaiting = None
                held, self.held = self.held, []
                for frame in held:
                    self.handle(frame)
            elif migration.awaiting is None:
                migration.ack(mid, "initializing")  # a resent INIT: already done, ack again
        elif kind == ControlType.ABORT:
            participant.on_abort()
            release_held(self)
            events = migration.abort(mid, self.operator)
            for start in range(0, len(events), MAX_BATCH):
                self.process_batch(events[start : start + MAX_BATCH])
            log.warning(
                "executor %s: migration %s aborted; replayed %d captured events", self.executor, mid, len(events)
            )

    def on_barrier(self, sender: str, checkpoint_id: str) -> None:
        """BARRIER of a periodic checkpoint from one upstream channel. Once it has come from every upstream
        executor, everything before it is processed and nothing after it is: persist the state, forward
        BARRIER, ack, then go on with the input held meanwhile."""
        if self.migration.participant.mode != Mode.RUNNING or checkpoint_id in self.abandoned_rounds:
            # an abandoned round's barrier arriving late (behind the data it follows), or one during a
            # migration (no round runs in one): aligning it would hold input for a round that never
            # completes, and a sink would stage its output under it
            return
        if self.barrier != checkpoint_id:
            if self.barrier is not None:  # a newer round: the old one was abandoned
                self.release_aligned()
            self.barrier, self.barriers_seen = checkpoint_id, set()
        self.barriers_seen.add(sender)
        if not self.barriers_seen >= self.migration.participant.upstream:
            return
        state_bytes = self.migration.checkpoint(checkpoint_id, self.operator)
        self.router.send_control({"type": ControlType.BARRIER, "mid": checkpoint_id})
        self.migration.ack(checkpoint_id, "checkpointing", state_bytes=state_bytes)
        self.release_aligned()

    def abandon_alignment(self) -> None:
        """A migration began here while a periodic checkpoint's barrier was being aligned (a round the
        controller abandoned, e.g. while Redis was away, so its CHECKPOINT_ABORT never came): the input held
        for the alignment was in no checkpoint, so it goes the migration's way now (CCR captures it, DCR
        processes it); left held, it was lost with the old executor."""
        if self.barrier is not None:
            log.info("executor %s: checkpoint %s abandoned for a migration", self.executor, self.barrier)
            self.release_aligned()

    def release_aligned(self) -> None:
        self.barrier, self.barriers_seen = None, set()
        held, self.aligning_held = self.aligning_held, []
        for frame in held:
            self.handle(frame)

    def process_batch(self, events: Sequence[Any], sender: str | None = None) -> None:
        """Process a batch, in parts of about `PART_S` each. With a `sender` (live input, not a replay) a
        controller message arriving mid-batch interrupts it: the rest of the batch goes back to the front of
        the queue, behind that message, so a PREPARE captures it instead of waiting for a long batch to
        finish. A slow batch sends what it emitted every `FLUSH_S`."""
        counters, router = self.counters, self.router
        start = flushed = time.perf_counter()
        run = self._run_each if self.process_events is None else self._run_batched
        stop, control = self.stop, self.control
        total, done, part = len(events), 0, self.part
        while done < total:
            if stop.is_set():  # shutting down: the rest of the batch is dropped, as a killed worker's would be
                break
            if sender is not None and not control.empty():
                rest = list(events[done:])
                self.ahead.appendleft([DATA, sender, rest])
                counters.queue_len += len(rest)
                break
            began = time.perf_counter()
            end = min(total, done + part)
            run(events[done:end])
            done = end
            now = time.perf_counter()
            part = next_part(part, now - began)
            if now - flushed >= FLUSH_S and done < total:
                router.flush()  # a slow batch sends what it has so far (`FLUSH_S`)
                flushed = time.perf_counter()
        self.part = part
        events = events[:done]
        counters.received += len(events)
        counters.processed += len(events)
        if self.is_sink:
            counters.observe_sink_latencies(time.time(), events)
            flush = getattr(self.operator, "flush", None)
            if flush is not None:
                flush()
        router.flush()
        elapsed = time.perf_counter() - start
        if not self.is_sink:
            counters.latency_sum_s += elapsed
            counters.latency_count += len(events)
        counters.busy_s += elapsed - router.take_blocked()

    def _run_each(self, events: Sequence[Any]) -> None:
        """A part of a batch through the operator's `process`, event by event (`emit` routes at once)."""
        process, emit = self.operator.process, self.emit
        for event in events:
            self.current = event
            try:
                process(event, emit)
            except Exception as exc:
                self._report(exc, event)

    def _run_batched(self, events: Sequence[Any]) -> None:
        """A part of a batch through the operator's `process_batch`, then what it emitted to the router. An
        exception is the event's the operator took last (the first one's, when it took none): one error,
        and the operator goes on with the rest."""
        process, out = self.process_events, self.out
        assert process is not None
        taking = iter(events)
        left = len(events)
        while left:
            try:
                process(taking, out.append)
                break
            except Exception as exc:
                still = length_hint(taking)
                if still == left:  # it raised before taking an event: the next one is the failing one
                    next(taking)
                    still -= 1
                left = still
                self._report(exc, events[len(events) - left - 1])
        if out:
            self.counters.emitted += len(out)
            self.router.route_batch(out)
            out.clear()

    def _report(self, exc: Exception, event: Any) -> None:
        self.counters.errors += 1
        now = time.monotonic()
        if now - self._last_error_log >= 5.0:  # at most one line every 5 s per executor
            self._last_error_log = now
            log.error(
                "vertex %s: executor %s: operator raised %s: %s (event id %s; %d errors so far; the event is skipped)",
                self.context.vertex,
                self.executor,
                type(exc).__name__,
                exc,
                event[0],
                self.counters.errors,
            )


def next_part(part: int, took: float) -> int:
    """The size of the next part of a batch: about `PART_S` at the pace of the last part (`part` events in
    `took` seconds), between 1 and `MAX_BATCH`, growing at most fourfold."""
    grown = min(MAX_BATCH, 4 * part)
    if took <= 0.0:
        return grown
    return max(1, min(grown, int(part * PART_S / took)))


def _failed(thread: ExecutorLoop, exc: BaseException) -> None:
    """An executor's loop died of `exc`: a fault of the runtime, not of a user operator (those are counted
    in `errors`). Log it with the traceback, stop the executors of its generation and tell the worker."""
    thread.failure = exc
    log.critical(
        "executor %s died: %s: %s (a fault of the runtime, not of the operator's code)",
        thread.executor,
        type(exc).__name__,
        exc,
        exc_info=exc,
    )
    thread.stop.set()
    if thread.on_failure is not None:
        thread.on_failure(thread)


def report_error(counters: Counters, context: Context, executor: str, hook: str, exc: BaseException) -> None:
    """An exception in an operator hook other than `process`: counted in `errors`, logged with the vertex
    name (at most every 5 s per executor and hook); the executor goes on."""
    counters.errors += 1
    now = time.monotonic()
    if now - counters.last_error_log.get(hook, -1e9) >= 5.0:
        counters.last_error_log[hook] = now
        log.error(
            "vertex %s: executor %s: %s raised %s: %s (%d errors so far; the executor goes on)",
            context.vertex,
            executor,
            hook,
            type(exc).__name__,
            exc,
            counters.errors,
        )


def _bind_errors(operator: Any, counters: Counters, context: Context, executor: str) -> None:
    bind = getattr(operator, "bind_errors", None)
    if callable(bind):
        bind(lambda hook, exc: report_error(counters, context, executor, hook, exc))
