"""Metric samples and snapshots: what workers report and what planners consume.

A `MetricSample` is one executor's report at the end of one interval. Counters are *cumulative* since the
executor started (so a lost sample loses no counts and a restart shows as a counter reset); queue length and
latency are gauges. A `MetricSnapshot` is the analysis of a window of samples: per-vertex rates and, per node,
the executors it hosts. It reads and writes the JSON shape DESIGN.md fixes:

    {"vertices": {"<v>": {"processing_rate", "emit_rate", "executors", "input_rate"?}},
     "placement": {"<node>": ["<v>#0", ...]}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from elastream.core.topology import Topology


class SnapshotError(ValueError):
    """A snapshot is malformed or does not match the topology."""


@dataclass(frozen=True)
class MetricSample:
    """One executor's report for one interval (counters cumulative since `started_at`)."""

    ts: float
    node: str
    vertex: str
    executor: str
    started_at: float
    received: int
    processed: int
    emitted: int
    busy_s: float
    queue_len: int
    latency_ms: float = 0.0
    errors: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> MetricSample:
        try:
            return MetricSample(
                ts=float(data["ts"]),
                node=str(data["node"]),
                vertex=str(data["vertex"]),
                executor=str(data["executor"]),
                started_at=float(data["started_at"]),
                received=int(data["received"]),
                processed=int(data["processed"]),
                emitted=int(data["emitted"]),
                busy_s=float(data["busy_s"]),
                queue_len=int(data["queue_len"]),
                latency_ms=float(data.get("latency_ms", 0.0)),
                errors=int(data.get("errors", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"metric sample {dict(data)!r} is malformed: {exc}") from None


@dataclass(frozen=True)
class VertexMetrics:
    """Rates of one vertex summed over its executors, in tuples/s."""

    processing_rate: float
    emit_rate: float
    executors: int
    #: None: derive from the parents' emit rates (a source without it is never congested)
    input_rate: float | None = None
    busy_fraction: float | None = None
    #: processed / busy seconds: what the vertex could do if it never waited for input
    true_processing_rate: float | None = None
    queue_growth: float | None = None
    #: least-squares slope of the input rate over the window (tuples/s per second)
    input_trend: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class MetricSnapshot:
    vertices: Mapping[str, VertexMetrics]
    placement: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "vertices": {name: m.to_dict() for name, m in self.vertices.items()},
            "placement": {node: list(execs) for node, execs in self.placement.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> MetricSnapshot:
        raw = data.get("vertices")
        if not isinstance(raw, Mapping) or not raw:
            raise SnapshotError("snapshot.vertices: is missing or empty; give rates for every vertex")
        vertices: dict[str, VertexMetrics] = {}
        for name, entry in raw.items():
            if not isinstance(entry, Mapping):
                raise SnapshotError(f"snapshot.vertices.{name}: is not a mapping")
            values: dict[str, Any] = {}
            for key in VertexMetrics.__dataclass_fields__:
                if key in entry and entry[key] is not None:
                    value = entry[key]
                    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                        raise SnapshotError(f"snapshot.vertices.{name}.{key}: {value!r} is not a finite number")
                    if key != "input_trend" and key != "queue_growth" and value < 0:
                        raise SnapshotError(f"snapshot.vertices.{name}.{key}: {value!r} is negative")
                    values[key] = int(value) if key == "executors" else float(value)
            for required in ("processing_rate", "emit_rate"):
                if required not in values:
                    raise SnapshotError(f"snapshot.vertices.{name}.{required}: is missing; give it in tuples/s")
            values.setdefault("executors", 1)
            vertices[str(name)] = VertexMetrics(**values)
        placement_raw = data.get("placement", {}) or {}
        if not isinstance(placement_raw, Mapping):
            raise SnapshotError("snapshot.placement: is not a mapping of node -> [executors]")
        placement = {str(n): [str(e) for e in execs] for n, execs in placement_raw.items()}
        return MetricSnapshot(vertices, placement)

    @staticmethod
    def load(path: str) -> MetricSnapshot:
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except OSError as exc:
            raise SnapshotError(f"{path}: cannot read ({exc.strerror}); check the path") from None
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"{path}: line {exc.lineno} is not valid JSON ({exc.msg})") from None
        if not isinstance(data, Mapping):
            raise SnapshotError(f"{path}: is not a JSON object with vertices and placement")
        return MetricSnapshot.from_dict(data)

    def check_against(self, topology: Topology) -> None:
        """Raise `SnapshotError` unless the snapshot covers exactly the topology's vertices."""
        missing = [v for v in topology.order if v not in self.vertices]
        unknown = [v for v in self.vertices if v not in topology.vertices]
        if missing:
            raise SnapshotError(f"snapshot.vertices: no rates for {', '.join(missing)}; add them")
        if unknown:
            raise SnapshotError(f"snapshot.vertices: {', '.join(unknown)} not in topology {topology.name}; remove them")


@dataclass(frozen=True)
class Rates:
    """The rate maps Stela works on (mutable copies are made by the planner)."""

    input: dict[str, float]
    processing: dict[str, float]
    emit: dict[str, float]
    executors: dict[str, int]
    #: true processing rate (processed / busy seconds) where the snapshot has it: what the vertex could do
    capacity: dict[str, float] = field(default_factory=dict)


def rates_from_snapshot(topology: Topology, snapshot: MetricSnapshot) -> Rates:
    """Per-vertex input, processing and emit rates, with input rates derived from parents where absent.

    A source's input is its own `input_rate` (the rate its input arrives); without one, it is taken equal to
    its processing rate, so a source is congested only when told its input outpaces it.
    """
    snapshot.check_against(topology)
    processing = {v: snapshot.vertices[v].processing_rate for v in topology.order}
    emit = {v: snapshot.vertices[v].emit_rate for v in topology.order}
    executors = {v: snapshot.vertices[v].executors for v in topology.order}
    given = {v: snapshot.vertices[v].input_rate for v in topology.order}
    inputs = derive_input_rates(topology, emit, given, processing)
    capacity = {v: rate for v in topology.order if (rate := snapshot.vertices[v].true_processing_rate) is not None}
    return Rates(inputs, processing, emit, executors, capacity)


def derive_input_rates(
    topology: Topology,
    emit: Mapping[str, float],
    given: Mapping[str, float | None],
    processing: Mapping[str, float],
) -> dict[str, float]:
    """input(v) = given(v) if known, else the sum of its parents' emit rates (a source: its processing rate)."""
    inputs: dict[str, float] = {}
    for v in topology.order:
        value = given.get(v)
        if value is not None:
            inputs[v] = value
        elif topology.graph.in_degree(v) == 0:
            inputs[v] = processing[v]
        else:
            inputs[v] = sum(emit[p] for p in topology.graph.predecessors(v))
    return inputs


def with_vertex(snapshot: MetricSnapshot, name: str, **changes: Any) -> MetricSnapshot:
    """A copy of the snapshot with one vertex's metrics changed (tests and what-if tools)."""
    vertices = dict(snapshot.vertices)
    vertices[name] = replace(vertices[name], **changes)
    return MetricSnapshot(vertices, snapshot.placement)
