"""The built-in logic operators (`logic: {builtin: work | filter | count | window}`)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from elastream.core.schedule import key_group_of
from elastream.runtime.operators.api import Context, Emit, EmitEvent
from elastream.runtime.operators.cpu import Cost


def _passes(event_id: int, selectivity: float) -> int:
    """How many copies of an event a vertex of this selectivity emits, deterministically from the event id
    (so a replay after a migration makes the same decision): floor(s) plus one more for a hash-chosen share."""
    whole = int(selectivity)
    fraction = selectivity - whole
    if fraction > 0.0 and ((event_id * 2654435761) & 0xFFFFFFFF) < fraction * 4294967296.0:
        whole += 1
    return whole


class Work:
    """`builtin: work` — spend `costMs` per event, emit `selectivity` events per input (default 1)."""

    def open(self, context: Context) -> None:
        self.cost = Cost(context.config, context.node_cpu)
        self.selectivity = float(context.config.get("selectivity", 1.0))

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        for _ in range(_passes(event[0], self.selectivity)):
            emit(event[2])

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        # what `process` emits is its input again (same id, key, value and ts): the event itself goes on
        charge, selectivity = self.cost.charge, self.selectivity
        if selectivity == 1.0:
            if self.cost.per_event_s <= 0.0:
                for event in events:
                    emit(event)
            else:
                for event in events:
                    charge()
                    emit(event)
            return
        for event in events:
            charge()
            for _ in range(_passes(event[0], selectivity)):
                emit(event)

    def close(self) -> None:
        self.cost.pay()


class Filter(Work):
    """`builtin: filter` — keep a deterministic `selectivity` share of the events (by id)."""

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        if _passes(event[0], min(self.selectivity, 1.0)):
            emit(event[2])

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        charge, selectivity = self.cost.charge, min(self.selectivity, 1.0)
        for event in events:
            charge()
            if _passes(event[0], selectivity):
                emit(event)


class Count:
    """`builtin: count` — stateful keyed counter: emits the running count of the event's key for every event.

    With `key: FIELD` it counts by ``value[FIELD]`` when the value is a mapping holding it (else by the
    event key), as a fields grouping on FIELD routes, so a `count` fed by ``grouping: fields, key: FIELD``
    sees every event of a key. State is kept per key group, so a rescale moves exactly the groups an
    executor gains or loses."""

    def open(self, context: Context) -> None:
        self.context = context
        self.cost = Cost(context.config, context.node_cpu)
        field = context.config.get("key")
        self.field = None if field is None else str(field)
        self.groups: dict[int, dict[Any, int]] = {}

    def process(self, event: Any, emit: Emit) -> None:
        emit(self._count(event))

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        count = self._count
        for event in events:
            emit((event[0], event[1], count(event), event[3]))

    def _count(self, event: Any) -> int:
        """Count `event` in its key's running count and return that."""
        self.cost.charge()
        key = event[1]
        if self.field is not None:
            value = event[2]
            if isinstance(value, Mapping) and self.field in value:
                key = value[self.field]
        group = self.groups.setdefault(key_group_of(key, self.context.max_parallelism), {})
        count = group.get(key, 0) + 1
        group[key] = count
        return count

    def snapshot_state(self) -> dict[int, Any]:
        return {g: dict(counts) for g, counts in self.groups.items()}

    def restore_state(self, state: Mapping[int, Any]) -> None:
        for g, counts in state.items():
            self.groups.setdefault(int(g), {}).update(counts)

    def counts(self) -> dict[Any, int]:
        return {k: c for group in self.groups.values() for k, c in group.items()}

    def close(self) -> None:
        self.cost.pay()


class Window:
    """`builtin: window` — tumbling keyed aggregate over `sizeMs` of processing time: when a window closes it
    emits, per key, ``[count, sum]`` of the numeric values it saw (the event carries the window's last id)."""

    #: the processing-time clock windows close on (replaceable in tests, as `Synthetic.wall_clock`)
    wall_clock = staticmethod(time.time)

    def open(self, context: Context) -> None:
        self.context = context
        self.cost = Cost(context.config, context.node_cpu)
        self.size_s = float(context.config.get("sizeMs", 1000.0)) / 1000.0
        self.window_end = 0.0
        self.groups: dict[int, dict[Any, list[Any]]] = {}

    def process(self, event: Any, emit: Emit) -> None:
        if self._closing():
            self.flush(emit)
        self._aggregate(event)

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        for event in events:
            if self._closing():
                self._close(emit)
            self._aggregate(event)

    def _closing(self) -> bool:
        """Charge an event's cost; whether the window's time is up (the next window is then set)."""
        self.cost.charge()
        now = self.wall_clock()
        if now < self.window_end:
            return False
        self.window_end = (now // self.size_s + 1) * self.size_s
        return True

    def _aggregate(self, event: Any) -> None:
        key = event[1]
        group = self.groups.setdefault(key_group_of(key, self.context.max_parallelism), {})
        agg = group.get(key)
        value = event[2] if isinstance(event[2], int | float) and not isinstance(event[2], bool) else 0
        if agg is None:
            group[key] = [1, value, event[0], event[3]]
        else:
            agg[0] += 1
            agg[1] += value
            agg[2] = event[0]

    def timer(self, emit: Emit) -> None:
        """Called by an idle executor (every ~20 ms): close the window when its time is up, so the last
        window of a burst is emitted without waiting for a later event. Not called on close(): a migration
        stops executors mid-window and the open window moves with the state."""
        now = self.wall_clock()
        if self.groups and now >= self.window_end:
            self.flush(emit)
            self.window_end = (now // self.size_s + 1) * self.size_s

    def flush(self, emit: Emit) -> None:
        self._close(lambda closed: emit(closed[2], key=closed[1], event_id=closed[0], ts=closed[3]))

    def _close(self, emit: EmitEvent) -> None:
        """Emit every key's aggregate, ``(last id, key, (count, sum), ts of its first event)``, and start over."""
        for group in self.groups.values():
            for key, (count, total, last_id, ts) in group.items():
                emit((last_id, key, (count, total), ts))
        self.groups = {}

    def snapshot_state(self) -> dict[int, Any]:
        return {g: {k: list(v) for k, v in keys.items()} for g, keys in self.groups.items()}

    def restore_state(self, state: Mapping[int, Any]) -> None:
        for g, keys in state.items():
            self.groups.setdefault(int(g), {}).update({k: list(v) for k, v in keys.items()})

    def close(self) -> None:
        self.cost.pay()


LOGIC_BUILTINS: Mapping[str, type] = {"work": Work, "filter": Filter, "count": Count, "window": Window}
