"""Operators: the code an executor runs for each event, built-in or user-supplied.

This package's modules, one job each: `api` (the operator API below, what user code implements), `cpu` (CPU
emulation of `costMs`), `builtin` (the built-in logic operators), `sources` and `sinks` (the built-in
sources and sinks), `streams` (what the redis-stream source and sink share) and `loading` (from a vertex to
the operator an executor runs). This module re-exports the user-facing API only.

An event is a tuple ``(id, key, value, ts)``: `id` is the number its source gave it (derived events keep
their input's id, so sinks can check exactly-once delivery), `key` the grouping key, `value` the payload
(anything msgpack can encode), `ts` the source's emission time (seconds since the epoch, for end-to-end
latency). User operators receive it as an `Event` named tuple (``event.key``); built-ins index the plain tuple.

The operator API (also for user code, named ``logic: {module: "package.module:Class"}`` in the manifest)::

    class Operator:
        def open(self, context: Context) -> None: ...          # once, before the first event
        def process(self, event, emit) -> None: ...            # emit(value, key=...) sends one event on
        def snapshot_state(self) -> dict[int, object]: ...     # stateful only: key group -> state
        def restore_state(self, state: dict[int, object]) -> None: ...
        def close(self) -> None: ...

`emit(value, key=SAME)` creates an event with the input's id and ts, the given value and, unless a new key
is given, the input's key. Stateful operators keep their state per key group (``context.key_group(key)``)
so that a rescale can move exactly the groups an executor gains or loses. Sources implement
`SourceOperator`: `poll(now, emit_new)` emits the events that are due, `position()`/`seek(position)` make
their read position part of a checkpoint.

An operator may also have ``process_batch(events, emit)`` (`BatchOperator`): the executor then hands it its
input many events at a time, as an iterator, and this `emit(event)` takes a whole event ``(id, key, value,
ts)``; an exception is counted against the event it took last, and it is called again with the rest. The
built-in operators have it (and the synthetic source `poll_batch`): it saves Python calls per event and hop.
"""

from elastream.runtime.operators.api import (
    SAME,
    BatchOperator,
    Context,
    Emit,
    EmitEvent,
    Event,
    Operator,
    SourceOperator,
)

__all__ = ["SAME", "BatchOperator", "Context", "Emit", "EmitEvent", "Event", "Operator", "SourceOperator"]
