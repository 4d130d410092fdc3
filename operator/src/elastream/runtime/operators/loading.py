"""From a vertex to the operator an executor runs: a built-in, or the user class the manifest names (found by
`elastream.worker_inputs.user_code`) behind an adapter that reports the exceptions of its hooks."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from elastream.core.topology import Vertex
from elastream.runtime.operators.api import Context, Emit, EmitEvent, Event
from elastream.runtime.operators.builtin import LOGIC_BUILTINS
from elastream.runtime.operators.kafka import KafkaSink, KafkaSource
from elastream.runtime.operators.outbox import OutboxEntry, OutboxOutput
from elastream.runtime.operators.sinks import LogSink, NullSink, RedisStreamSink
from elastream.runtime.operators.sources import RedisStreamSource, Synthetic
from elastream.store.retry import RetryLater, backoff
from elastream.worker_inputs.user_code import load_class


def make_operator(vertex: Vertex, client_factory: Callable[[], Any], prefix: str) -> Any:
    """A fresh operator instance for one executor of `vertex` (not yet opened)."""
    config = vertex.config
    if "module" in config:
        instance = load_class(vertex)()
        if vertex.kind == "source":
            return UserSource(instance)
        if vertex.kind == "sink" and config.get("delivery") == "exactly-once":
            return UserTwoPhaseSink(instance, client_factory, prefix)
        return UserOperator(instance)
    if vertex.kind == "source":
        if config["type"] == "kafka":
            return KafkaSource(prefix)
        return Synthetic() if config["type"] == "synthetic" else RedisStreamSource(client_factory, prefix)
    if vertex.kind == "sink":
        kind = config["type"]
        if kind == "redis-stream":
            return RedisStreamSink(client_factory, prefix)
        if kind == "kafka":
            return KafkaSink(client_factory, prefix)
        return LogSink() if kind == "log" else NullSink()
    return LOGIC_BUILTINS[str(config["builtin"])]()


#: the types of an event's ts the data plane takes (`transport.parse`)
_TIMESTAMPS = (float, int)

#: how an executor hears of an exception in a user hook: report(hook name, exception)
ErrorReport = Callable[[str, BaseException], None]


def _log_report(hook: str, exc: BaseException) -> None:
    logging.getLogger("elastream.worker").error("user operator: %s raised %s: %s", hook, type(exc).__name__, exc)


class _UserCode:
    """What user sources and operators share: optional hooks, and exceptions in them reported through
    `report` (the executor's: log line with the vertex name + errors metric) instead of killing the worker."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.report: ErrorReport = _log_report

    def bind_errors(self, report: ErrorReport) -> None:
        self.report = report

    def _call(self, hook: str, *args: Any) -> Any:
        method = getattr(self.inner, hook, None)
        if not callable(method):
            return None
        try:
            return method(*args)
        except Exception as exc:
            self.report(f"{hook}()", exc)
            return None

    def open(self, context: Context) -> None:
        self._call("open", context)

    def close(self) -> None:
        self._call("close")


class UserOperator(_UserCode):
    """Adapts a user logic or sink class to the executor: events arrive as `Event` named tuples; missing
    hooks are no-ops. An exception in `process` propagates (the executor skips and reports that event); in
    `open`, `close`, `snapshot_state` or `restore_state` it is reported and the executor goes on (a failed
    snapshot checkpoints no state for this executor)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.stateful = callable(getattr(inner, "snapshot_state", None))
        if callable(getattr(inner, "process_batch", None)):  # the executor looks for the attribute
            self.process_batch = self._process_batch

    def process(self, event: Any, emit: Emit) -> None:
        self.inner.process(Event._make(event), emit)

    def _process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        """The user class's `process_batch`, with `Event` named tuples in, and only events out: anything else
        emitted raises (an error of the event being processed) instead of reaching the wire, where the
        receiver would drop the whole frame it travels in."""

        def emit_event(event: Any) -> None:
            if not isinstance(event, tuple) or len(event) != 4 or type(event[3]) not in _TIMESTAMPS:
                raise TypeError(f"process_batch emitted {event!r}: an event is a tuple (id, key, value, ts)")
            emit(event)

        self.inner.process_batch(map(Event._make, events), emit_event)

    def snapshot_state(self) -> dict[int, Any]:
        if not self.stateful:
            return {}
        state = self._call("snapshot_state")
        return dict(state) if isinstance(state, Mapping) else {}

    def restore_state(self, state: Mapping[int, Any]) -> None:
        self._call("restore_state", state)


class UserSource(_UserCode):
    """Adapts a user source class: `poll(now, emit_new, budget)` (an exception is reported and the source
    tries again at its next tick, backing off to 1 s while it keeps failing); `position`, `seek` and
    `exhausted` are passed through when the class has them."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        #: while `poll` keeps failing: when to poll again (50 ms doubling to 1 s)
        self.retry = RetryLater(lambda: backoff(0.05, 2.0, 1.0))
        self.due = 0
        for hook in ("position", "seek", "exhausted"):
            if callable(getattr(inner, hook, None)):
                setattr(self, hook, getattr(inner, hook))

    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        if not self.retry.due(now):
            return self.due
        try:
            self.due = int(self.inner.poll(now, emit_new, budget) or 0)
        except Exception as exc:
            self.report("poll()", exc)
            self.retry.failed(now)
        else:
            self.retry.succeeded()
        return self.due


class UserTwoPhaseSink(_UserCode):
    """A user sink with `delivery: exactly-once`: the operator API's two-phase sink (`runtime.operators.outbox`).
    Its events are not given to `process`: the executor keeps them, stages them with every checkpoint and
    migration (pre-commit; an abandoned round takes them back), the checkpoint's completion commits them to
    the sink's outbox, and executor 0's publisher hands them, in order, to the class's two methods:

        def last_committed(self) -> str | None: ...      # the marker the target system holds (None: none)
        def commit_batch(self, marker: str, events: list[Event]) -> None: ...
                                                          # store the events and the marker atomically

    on a thread of its own (after `open`, on executor 0's instance). An exception in either ends the publisher's
    session; it starts again from `last_committed` after a backoff, so a batch is stored once if the class
    stores events and marker atomically. Keys arrive as text, values as the JSON they were (anything JSON
    cannot take, as its text)."""

    batched = True

    def __init__(self, inner: Any, client_factory: Callable[[], Any], prefix: str) -> None:
        super().__init__(inner)  # (`load_class` made sure it has last_committed and commit_batch)
        self.client_factory, self.prefix = client_factory, prefix
        self.buffer: list[Any] = []

    def open(self, context: Context) -> None:
        super().open(context)
        name = f"{context.vertex}#{context.index}"
        self.output = OutboxOutput(
            self.client_factory, self.prefix, context, lambda: UserTarget(self.inner), f"committing through {name}"
        )

    def process(self, event: Any, emit: Emit) -> None:
        self.buffer.append((event[0], "" if event[1] is None else str(event[1]), _json(event[2]), event[3]))

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        append = self.buffer.append
        for e in events:
            append((e[0], "" if e[1] is None else str(e[1]), _json(e[2]), e[3]))

    def pre_commit(self, txn_id: str) -> None:
        self.output.stage(txn_id, self.buffer)
        self.buffer = []

    def hand_over(self) -> list[Any]:
        events, self.buffer = self.buffer, []
        return events

    def abort_commit(self, txn_id: str) -> None:
        self.buffer = self.output.take_back(txn_id) + self.buffer

    @property
    def problem(self) -> str:
        return self.output.problem

    def close(self) -> None:
        self.output.close()
        super().close()


class UserTarget:
    """A user two-phase sink as an `OutboxTarget`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def start(self) -> str:
        marker = self.inner.last_committed()
        return "0-0" if marker is None else str(marker)

    def write(self, marker: str, entries: list[OutboxEntry]) -> None:
        events = [Event(_event_id(e.id), e.key, _unjson(e.value), e.ts) for e in entries]
        self.inner.commit_batch(marker, events)

    def stop(self) -> None:
        """Nothing to release: the class's own clients are its `close`'s."""


def _json(value: Any) -> str:
    return json.dumps(value, default=str, separators=(",", ":"))


def _unjson(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _event_id(text: str) -> Any:
    return int(text) if text.lstrip("-").isdigit() else text
