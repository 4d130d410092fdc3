"""User operators, sources and sinks behind their adapters: Event tuples, optional hooks, and exceptions in
any hook reported through the executor instead of killing it."""

from __future__ import annotations

from typing import Any

from elastream.core.topology import Vertex
from elastream.runtime.executor import Counters, _bind_errors
from elastream.runtime.operators import Context, Event
from elastream.runtime.operators.loading import UserOperator, UserSource, make_operator


class Sink:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def process(self, event: Any, emit: Any) -> None:
        self.seen.append(event)


class Broken:
    def open(self, context: Context) -> None:
        raise RuntimeError("no database")

    def process(self, event: Any, emit: Any) -> None:
        emit(event.value)

    def snapshot_state(self) -> dict[int, Any]:
        raise ValueError("cannot pickle a socket")

    def restore_state(self, state: Any) -> None:
        raise KeyError("k")

    def close(self) -> None:
        raise OSError("already closed")


class Source:
    def __init__(self) -> None:
        self.polls = 0

    def poll(self, now: float, emit_new: Any, budget: int) -> int:
        self.polls += 1
        if self.polls == 1:
            raise ConnectionError("feed down")
        emit_new(self.polls, "k", "v")
        return self.polls

    def position(self) -> int:
        return self.polls


def bound(operator: Any) -> tuple[Counters, list[str]]:
    counters = Counters()
    context = Context("v", 0, 1, 8, {})
    _bind_errors(operator, counters, context, "v#0")
    return counters, []


def test_a_user_sink_gets_event_named_tuples(monkeypatch) -> None:
    import elastream.runtime.operators.loading as loading

    monkeypatch.setattr(loading, "load_class", lambda vertex: Sink)
    vertex = Vertex("out", "sink", 1, 1, config={"module": "x:Sink"})
    adapter = make_operator(vertex, lambda: None, "p:")
    assert isinstance(adapter, UserOperator)
    adapter.open(Context("out", 0, 1, 1, {}))
    adapter.process((7, "k", {"a": 1}, 1.5), lambda *a, **k: None)
    assert adapter.inner.seen == [Event(7, "k", {"a": 1}, 1.5)]
    assert adapter.inner.seen[0].value == {"a": 1}


def test_exceptions_in_user_hooks_are_reported_with_the_vertex_and_counted(caplog) -> None:
    adapter = UserOperator(Broken())
    counters, _ = bound(adapter)
    adapter.open(Context("v", 0, 1, 8, {}))  # raises inside: reported, not raised
    assert adapter.snapshot_state() == {}
    adapter.restore_state({1: {}})
    adapter.close()
    assert counters.errors == 4
    for hook, error in (
        ("open()", "RuntimeError: no database"),
        ("snapshot_state()", "ValueError"),
        ("close()", "OSError"),
    ):
        assert f"vertex v: executor v#0: {hook} raised {error}" in caplog.text


def test_a_user_source_whose_poll_raises_is_reported_and_polled_again(caplog) -> None:
    adapter = UserSource(Source())
    counters, _ = bound(adapter)
    emitted: list[Any] = []
    adapter.open(Context("v", 0, 1, 8, {}))
    assert adapter.poll(100.0, lambda *e: emitted.append(e), 10) == 0
    assert counters.errors == 1 and "vertex v: executor v#0: poll() raised ConnectionError: feed down" in caplog.text
    assert adapter.poll(100.01, lambda *e: emitted.append(e), 10) == 0  # backing off
    assert adapter.poll(101.0, lambda *e: emitted.append(e), 10) == 2
    assert emitted == [(2, "k", "v")]
    assert adapter.position() == 2  # passed through
    assert not hasattr(adapter, "seek")  # absent hooks stay absent (the executor checks for them)
