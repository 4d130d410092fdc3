"""The operator API: the event, the context and the protocols an executor uses, the same for built-in and user
operators (the package's docstring, `elastream.runtime.operators`, describes it for users)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
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


class SourceOperator(Protocol):
    def open(self, context: Context) -> None: ...
    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        """Emit up to `budget` due events through `emit_new(id, key, value)`; return how many were due."""
        ...

    def position(self) -> Any: ...
    def seek(self, position: Any) -> None: ...
    def close(self) -> None: ...
