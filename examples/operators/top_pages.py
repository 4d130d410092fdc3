"""A user operator for elastream: keeps the highest value seen per key and emits it when it grows.

Run it with `PYTHONPATH=examples/operators elastream run examples/user-operator.yaml --duration 10`
(in Kubernetes, install the module into the worker image). The class needs only `process`; `open`,
`snapshot_state`, `restore_state` and `close` are optional. State is kept per key group so that a rescale
can hand each group to its new owner: `snapshot_state` returns {key_group: state}, `restore_state` merges it.
"""

from __future__ import annotations

from typing import Any


class MaxPerKey:
    def open(self, context: Any) -> None:
        # context.vertex, .index, .parallelism, .max_parallelism, .config (the manifest's logic block),
        # .key_groups (the key groups this executor owns) and .key_group(key)
        self.context = context
        self.threshold = float(context.config.get("threshold", 0))
        self.groups: dict[int, dict[Any, float]] = {}

    def process(self, event: Any, emit: Any) -> None:
        # event: Event(id, key, value, ts); emit(value, key=...) keeps the id and ts of the input
        group = self.groups.setdefault(self.context.key_group(event.key), {})
        value = float(event.value)
        if value > group.get(event.key, float("-inf")) and value >= self.threshold:
            group[event.key] = value
            emit({"key": event.key, "max": value})

    def snapshot_state(self) -> dict[int, Any]:
        return {g: dict(values) for g, values in self.groups.items()}

    def restore_state(self, state: dict[int, Any]) -> None:
        for g, values in state.items():
            self.groups.setdefault(int(g), {}).update(values)
