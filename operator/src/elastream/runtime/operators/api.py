"""The operator API: the event, the context and the protocols an executor uses, the same for built-in and user
operators (the package's docstring, `elastream.runtime.operators`, describes it for users)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from elastream.core.schedule import key_group_of
from elastream.runtime.operators.cpu import NodeCpu


class Event(NamedTuple):
    id: int
    key: Any
    value: Any
    ts: float


SAME: Any = object()
Emit = Callable[..., None]
#: what `process_batch` and `poll_batch` emit through: a whole event ``(id, key, value, ts)`` (`process_batch`:
#: one at a time; `poll_batch`: a list of them at once)
EmitEvent = Callable[[Any], None]


@dataclass
class Context:
    """What an operator knows about where it runs."""

    vertex: str
    index: int
    parallelism: int
    max_parallelism: int
    config: Mapping[str, Any]
    #: key groups this executor owns (contiguous range; all of them for a non-keyed vertex)
    key_groups: range = field(default_factory=lambda: range(0))
    node_cpu: NodeCpu | None = None
    #: set when the executor stops: a built-in operator waiting for Redis gives up then
    stop: threading.Event | None = None

    def key_group(self, key: Any) -> int:
        return key_group_of(key, self.max_parallelism)


class Operator(Protocol):
    def open(self, context: Context) -> None: ...
    def process(self, event: Any, emit: Emit) -> None: ...
    def close(self) -> None: ...


class BatchOperator(Operator, Protocol):
    """An operator that may also take its input many events at a time: when it has `process_batch`, the
    executor calls that instead of `process` (which it must still have, with the same effect per event).

    `events` is an iterator over events; `emit(event)` sends one whole event ``(id, key, value, ts)`` on (a
    derived event keeps its input's id and ts, e.g. ``emit((e[0], e[1], new_value, e[3]))``; ``emit(e)`` sends
    the input itself on). Take the events one at a time and emit what each produces before taking the next:
    an exception is blamed on the event taken last (one error counted for it, as `process` raising for it
    would), and `process_batch` is called again with the rest of the iterator. The executor calls it for
    parts of a frame, each about a millisecond of processing, so that a controller message or the output's
    `FLUSH_S` is never kept waiting by a long frame."""

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None: ...


class SourceOperator(Protocol):
    """A source. Every method is called on the source's own executor thread (`position` also once it has
    stopped, for its last position), never beside a `poll`: an operator needs no lock of its own."""

    def open(self, context: Context) -> None: ...
    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        """Emit up to `budget` due events through `emit_new(id, key, value)`; return how many were due."""
        ...

    def position(self) -> Any: ...
    def seek(self, position: Any) -> None: ...
    def close(self) -> None: ...


class BatchSource(SourceOperator, Protocol):
    """A source that may also emit many events at a time: when it has `poll_batch`, the executor calls that
    instead of `poll`. `emit_events(events)` sends a list of whole events ``(id, key, value, now)``, stamped
    with the `now` given; a long poll may call it several times (what it emitted goes out as frames fill).
    It returns how many events were due, as `poll` does."""

    def poll_batch(self, now: float, emit_events: EmitEvent, budget: int) -> int: ...
