"""An executor calls an operator's `process_batch` with the semantics of `process` (one error per failing event, a
controller message interrupting a long batch, output sent every `FLUSH_S`), and the built-ins' `process_batch`
emits what their `process` does; with fakes at the executor's ports (no sockets, no Redis)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from elastream.core.migration_protocol import ControlType, ExecutorParticipant
from elastream.runtime.executor import PART_S, ExecutorThread, next_part
from elastream.runtime.operators import SAME, Context, Event
from elastream.runtime.operators.builtin import Count, Filter, Window, Work
from elastream.runtime.operators.loading import UserOperator
from elastream.runtime.operators.sinks import LogSink, NullSink
from elastream.runtime.participant import Migration
from elastream.runtime.transport import DATA, MAX_BATCH


class Store:
    def save(self, mid: str, checkpoint: Any, token: str | None = None) -> None:
        pass

    def ack(self, mid: str, phase: str, executor: str, info: Any = None) -> None:
        pass


class FakeRouter:
    """What an executor's router is asked: events routed (one by one or in batches) and flushes."""

    def __init__(self) -> None:
        self.routed: list[Any] = []
        self.flushed_at: list[int] = []  # how many events had been routed at each flush

    def route(self, event: Any) -> None:
        self.routed.append(event)

    def route_batch(self, events: list[Any]) -> None:
        self.routed += events

    def flush(self) -> None:
        self.flushed_at.append(len(self.routed))

    def send_control(self, message: dict[str, Any]) -> None:
        pass

    def take_blocked(self) -> float:
        return 0.0

    def holding_full(self) -> bool:
        return False


def executor(operator: Any, is_sink: bool = False) -> tuple[ExecutorThread, FakeRouter]:
    participant = ExecutorParticipant("t#0", frozenset({"s#0"}))
    migration = Migration("t#0", Store(), participant)  # type: ignore[arg-type]
    router = FakeRouter()
    operator.open(Context("t", 0, 1, 8, {}))
    thread = ExecutorThread(
        "t#0",
        operator,
        Context("t", 0, 1, 8, {}),
        None,  # type: ignore[arg-type]
        router,  # type: ignore[arg-type]
        threading.Event(),
        is_sink,
        migration,  # type: ignore[arg-type]
    )
    return thread, router


def batch(*ids: int) -> list[tuple[int, Any, Any, float]]:
    return [(i, i % 3, i, time.time()) for i in ids]


class Picky:
    """A batch operator that fails on multiples of 5, after emitting a part of their output."""

    def open(self, context: Context) -> None:
        self.calls = 0

    def process(self, event: Any, emit: Any) -> None:
        raise AssertionError("process_batch is there: process is not called")

    def process_batch(self, events: Any, emit: Any) -> None:
        self.calls += 1
        for event in events:
            if event[0] % 5 == 0:
                emit((event[0], "partial", None, event[3]))
                raise ValueError(f"event {event[0]}")
            emit(event)


def test_an_exception_in_process_batch_counts_one_error_for_the_event_it_took_last() -> None:
    thread, router = executor(Picky())
    thread.process_batch(batch(*range(1, 31)), "s#0")
    assert thread.counters.errors == 6  # 5, 10, ..., 30
    assert [e[0] for e in router.routed if e[1] != "partial"] == [i for i in range(1, 31) if i % 5]
    assert [e[0] for e in router.routed if e[1] == "partial"] == [5, 10, 15, 20, 25, 30]  # what it emitted goes
    assert thread.counters.processed == thread.counters.received == 30
    assert thread.counters.emitted == len(router.routed)


class Hopeless:
    """A batch operator that raises before taking any event."""

    def open(self, context: Context) -> None:
        pass

    def process(self, event: Any, emit: Any) -> None:
        raise RuntimeError("broken")

    def process_batch(self, events: Any, emit: Any) -> None:
        raise RuntimeError("broken")


def test_a_process_batch_that_takes_nothing_counts_every_event_once_and_ends() -> None:
    thread, router = executor(Hopeless())
    thread.process_batch(batch(*range(40)), "s#0")
    assert thread.counters.errors == 40 and router.routed == [] and thread.counters.processed == 40


class Interrupted:
    """Puts a controller message on its executor's queue while it processes event `at` (one arrived)."""

    def __init__(self, at: int, batched: bool) -> None:
        self.at = at
        self.seen: list[int] = []
        self.thread: ExecutorThread | None = None
        if batched:
            self.process_batch = self._process_batch

    def open(self, context: Context) -> None:
        pass

    def process(self, event: Any, emit: Any) -> None:
        self.seen.append(event[0])
        if event[0] == self.at:
            assert self.thread is not None
            self.thread.control.put({"type": ControlType.PREPARE, "mid": "m"})

    def _process_batch(self, events: Any, emit: Any) -> None:
        for event in events:
            self.process(event, emit)


@pytest.mark.parametrize("batched", [False, True])
def test_a_controller_message_interrupts_a_long_batch_and_the_rest_waits_behind_it(batched: bool) -> None:
    operator = Interrupted(at=2, batched=batched)
    thread, _ = executor(operator)
    operator.thread = thread
    thread.process_batch(batch(*range(200)), "s#0")
    assert operator.seen[:3] == [0, 1, 2] and len(operator.seen) < 200  # it stopped soon after event 2
    kind, sender, rest = thread.ahead[0]
    assert kind == DATA and sender == "s#0"
    assert operator.seen + [e[0] for e in rest] == list(range(200))  # every event once, in order
    assert thread.counters.processed == len(operator.seen) and thread.counters.queue_len == len(rest)


class Slow:
    """A batch operator that takes 3 ms an event (a sleep, as `costMs` does)."""

    def open(self, context: Context) -> None:
        pass

    def process(self, event: Any, emit: Any) -> None:
        raise AssertionError("not called")

    def process_batch(self, events: Any, emit: Any) -> None:
        for event in events:
            time.sleep(0.003)
            emit(event)


def test_a_slow_batch_sends_its_output_as_it_goes_and_each_of_its_parts_is_about_one_event() -> None:
    thread, router = executor(Slow())
    thread.process_batch(batch(*range(12)), "s#0")
    assert len(router.routed) == 12
    assert router.flushed_at[0] < 12  # what it emitted went out before the batch was done (FLUSH_S)
    assert thread.part == 1


def test_a_part_of_a_batch_is_about_part_s_and_grows_at_most_fourfold() -> None:
    assert next_part(1, 0.0) == 4 and next_part(1, PART_S / 1000) == 4  # a cheap operator: whole frames soon
    assert next_part(256, PART_S / 100) == MAX_BATCH
    assert next_part(64, 2 * PART_S) == 32
    assert next_part(4, 1.0) == 1  # a costly one: event by event, a controller message waits one event


def test_a_sink_counts_the_latency_of_every_event() -> None:
    thread, _ = executor(NullSink(), is_sink=True)
    now = time.time()
    thread.process_batch([(i, 0, 0, now - 1.0) for i in range(10)], "s#0")
    assert thread.counters.latency_count == 10
    assert thread.counters.latency_sum_s == pytest.approx(10.0, abs=0.5)


class UserBatch:
    """A user operator with `process_batch`."""

    def __init__(self) -> None:
        self.types: set[type] = set()

    def process(self, event: Any, emit: Any) -> None:
        emit(event.value + 1)

    def process_batch(self, events: Any, emit: Any) -> None:
        for event in events:
            self.types.add(type(event))
            if event.id == 3:
                emit("not an event")  # refused: the frame it would travel in would be dropped whole
            emit(event._replace(value=event.value + 1))


def test_a_user_process_batch_gets_event_tuples_and_may_emit_only_events() -> None:
    inner = UserBatch()
    thread, router = executor(UserOperator(inner))
    thread.process_batch(batch(*range(6)), "s#0")
    assert inner.types == {Event}
    assert [(e[0], e[2]) for e in router.routed] == [(i, i + 1) for i in range(6) if i != 3]
    assert thread.counters.errors == 1
    assert not hasattr(UserOperator(object()), "process_batch")  # without one, `process` is called


# ---- the built-ins' process_batch -------------------------------------------------------------------------


def run_each(operator: Any, events: list[Any]) -> list[Any]:
    """What `process` emits, as whole events."""
    out: list[Any] = []
    current: list[Any] = [None]

    def emit(value: Any, key: Any = SAME, event_id: int | None = None, ts: float | None = None) -> None:
        event = current[0]
        out.append(
            (
                event[0] if event_id is None else event_id,
                event[1] if key is SAME else key,
                value,
                event[3] if ts is None else ts,
            )
        )

    for event in events:
        current[0] = event
        operator.process(event, emit)
    return out


def run_batched(operator: Any, events: list[Any]) -> list[Any]:
    out: list[Any] = []
    for start in range(0, len(events), 7):
        operator.process_batch(iter(events[start : start + 7]), out.append)
    return out


@pytest.mark.parametrize(
    ("make", "config"),
    [
        (Work, {}),
        (Work, {"selectivity": 0.5}),
        (Work, {"selectivity": 2.5}),
        (Work, {"costMs": 0.01}),
        (Filter, {"selectivity": 0.3}),
        (Count, {}),
        (Count, {"key": "f"}),
    ],
)
def test_a_builtins_process_batch_emits_what_its_process_does(make: type, config: dict[str, Any]) -> None:
    events = [(i, f"k{i % 4}", {"f": i % 3} if i % 2 else i, 100.0 + i) for i in range(300)]
    each, batched = make(), make()
    each.open(Context("v", 0, 1, 8, config))
    batched.open(Context("v", 0, 1, 8, config))
    assert run_batched(batched, events) == run_each(each, events)


def test_a_windows_process_batch_closes_windows_as_its_process_does(monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(Window, "wall_clock", staticmethod(lambda: clock[0]))
    events = [(i, f"k{i % 3}", i, 50.0 + i) for i in range(60)]
    outputs = []
    for run in (run_each, run_batched):
        clock[0] = 1000.0
        window = Window()
        window.open(Context("v", 0, 1, 8, {"sizeMs": 100}))
        out = []
        for start in range(0, 60, 10):
            clock[0] += 0.05  # two batches a window
            out += run(window, events[start : start + 10])
        outputs.append(out)
    assert outputs[0] == outputs[1] and outputs[0]  # the same windows closed, with the same aggregates


def test_sinks_process_batch_counts_and_prints_as_their_process_does(capsys) -> None:
    sink = LogSink()
    sink.open(Context("out", 0, 1, 8, {"every": 3}))
    sink.process_batch(iter(batch(*range(9))), lambda e: None)
    assert capsys.readouterr().out.count("out#0: id=") == 3
    null = NullSink()
    null.open(Context("out", 0, 1, 8, {}))
    null.process_batch(iter(batch(1, 2)), lambda e: None)
