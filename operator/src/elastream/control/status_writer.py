"""The one writer of a StreamTopology's status: one merge patch per change, volatile figures at most every
`volatile_every_s`.

Everything the operator reports goes through `StatusWriter.write(status)` with the whole status it wants the
resource to show. The writer keeps what it wrote last and sends only the difference, as a JSON merge patch
(RFC 7386: a key the new status drops is sent as null, so a record is replaced, not merged). Figures that move
every interval — the throughput and the vertices' processing rates — do not make a write on their own more
often than every `volatile_every_s` (15 s by default): at a thousand topologies, a write every 2 s each would
be 500 writes per second to etcd for numbers nobody reads that often. A write that fails (the API server
away) is not forgotten: the next `write` sends the difference from what the server last accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastream.core.ports import SystemClock

log = logging.getLogger("elastream.operator")

#: top-level status fields that change every interval
VOLATILE_FIELDS = ("throughput",)
#: per-vertex fields that change every interval
VOLATILE_VERTEX_FIELDS = ("processingRate",)


def stable_part(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status` without its volatile figures: what decides whether a write is due now."""
    stable = {k: v for k, v in status.items() if k not in VOLATILE_FIELDS}
    vertices = stable.get("vertices")
    if isinstance(vertices, list):
        stable["vertices"] = [
            {k: v for k, v in vertex.items() if k not in VOLATILE_VERTEX_FIELDS}
            if isinstance(vertex, Mapping)
            else vertex
            for vertex in vertices
        ]
    return stable


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns `old` into `new` (empty when they are equal)."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if before == value:
            continue
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    return patch


_MISSING = object()


@dataclass
class StatusWriter:
    """Writes one resource's status. `send(patch)` applies a merge patch to the status subresource (raises on
    failure; a deleted resource is the caller's to ignore)."""

    send: Callable[[dict[str, Any]], None]
    volatile_every_s: float = 15.0
    clock: Callable[[], float] = field(default=SystemClock().monotonic)
    #: the status the API server has, as far as this writer knows (None: not known yet)
    written: dict[str, Any] | None = None
    #: writes sent (the benchmark and the tests count them)
    writes: int = 0
    _volatile_at: float = field(default=float("-inf"), repr=False)

    def prime(self, status: Mapping[str, Any] | None) -> None:
        """What the resource shows now (read from it), so the first write sends only what differs."""
        if self.written is None:
            self.written = dict(status or {})

    def write(self, status: Mapping[str, Any], volatile: bool = False) -> bool:
        """Make the resource show `status`: one patch if its stable part changed, or if its volatile figures
        changed and are due (or `volatile` forces them). Returns whether a patch was sent and accepted."""
        new = _jsonable(status)
        old = self.written if self.written is not None else {}
        now = self.clock()
        if stable_part(new) == stable_part(old):
            due = volatile or now - self._volatile_at >= self.volatile_every_s
            if not due:
                return False
        patch = merge_patch(old, new)
        if not patch:
            return False
        try:
            self.send(patch)
        except Exception as exc:  # the API server away: the next write sends the difference again
            log.warning("status not written: %s", exc)
            return False
        self.written = new
        self.writes += 1
        self._volatile_at = now
        return True


def _jsonable(value: Any) -> Any:
    """Status values as JSON types (floats rounded; a None field left out, as the server stores a merge
    patch's null: deleted)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return round(value, 3)
    return value
