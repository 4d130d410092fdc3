"""Metric samples and snapshots: what workers report and what planners consume.

A `MetricSample` is one executor's report at the end of one interval. Counters are *cumulative* since the
executor started (so a lost sample loses no counts and a restart shows as a counter reset); queue length and
latency are gauges. A `MetricSnapshot` is the analysis of a window of samples: per-vertex rates and, per node,
the executors it hosts. It reads and writes the JSON shape DESIGN.md fixes:

    {"vertices": {"<v>": {"processing_rate", "emit_rate", "executors", "input_rate"?}},
     "placement": {"<node>": ["<v>#0", ...]}}

The rates a snapshot implies are here too: the planner's (`rates_from_snapshot`) and the load the
autoscaling policies decide on (`offered_load`, `waiting_load`), both seeing through back-pressure. How a
window of samples becomes a snapshot is `core.window_analysis`'s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from elastream.core.topology import Topology

#: the longest connector problem a sample carries (a metric stream field holds 256 bytes)
MAX_PROBLEM_CHARS = 200


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
    #: what a connector of the executor cannot do now (a topic missing or not authorised, the broker away), in
    #: its own words without secrets; "" when it works (the operator's ConnectorError condition)
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.problem:
            del data["problem"]  # the common case costs no field in the metric stream
        return data

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
                problem=str(data.get("problem", ""))[:MAX_PROBLEM_CHARS],
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
    #: processed / busy seconds × executors: what the vertex could do with every executor busy
    true_processing_rate: float | None = None
    queue_growth: float | None = None
    #: least-squares slope of the input rate over the window (tuples/s per second)
    input_trend: float | None = None
    #: items waiting: the sum over the vertex's executors of their latest queue length in the window
    queue_length: float | None = None

    @property
    def executor_rate(self) -> float | None:
        """One executor's true processing rate (1/Lat): the vertex's over its executors; None unmeasured."""
        if self.true_processing_rate is None:
            return None
        return self.true_processing_rate / max(self.executors, 1)

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
    capacity = {v: rate for v in topology.order if (rate := snapshot.vertices[v].true_processing_rate) is not None}
    if capacity:
        inputs = demand_input_rates(topology, emit, given, processing, capacity)
    else:
        inputs = derive_input_rates(topology, emit, given, processing)
    return Rates(inputs, processing, emit, executors, capacity)


def demand_input_rates(
    topology: Topology,
    emit: Mapping[str, float],
    given: Mapping[str, float | None],
    processing: Mapping[str, float],
    capacity: Mapping[str, float],
) -> dict[str, float]:
    """Input rates that see through back-pressure: what each vertex would receive if nothing held it back.

    With bounded queues a bottleneck slows everything upstream of it: its parents block, their processing
    drops to its rate and its measured input (the parents' emit) equals its processing, so by the paper's
    rule nothing downstream of the sources looks congested. A parent that is held back rather than busy has
    a true processing rate (capacity) at least its own demand; such a parent passes its whole demand on
    (times its selectivity). A parent without headroom, or whose capacity is unknown, passes what it emits,
    as the paper's rule says. Sources' demand is their measured input rate (events offered).
    """
    demand: dict[str, float] = {}
    for v in topology.order:
        parents = list(topology.graph.predecessors(v))
        if not parents:
            value = given.get(v)
            demand[v] = value if value is not None else processing[v]
            continue
        total = 0.0
        for p in parents:
            held_back = passes_its_demand(capacity.get(p), demand[p], processing[p])
            total += demand[p] * emit[p] / processing[p] if held_back else emit[p]
        demand[v] = max(total, given.get(v) or 0.0)
    return demand


def passes_its_demand(capacity: float | None, demand: float, processing: float) -> bool:
    """A parent held back rather than busy: its true processing rate covers its demand, so it would pass
    its whole demand on (times its selectivity) if its children let it. One rule for the rates
    (`demand_input_rates`), the trends (`demand_input_trends`) and the items waiting (`waiting_load`)."""
    return capacity is not None and capacity >= demand and processing > 0.0


def demand_input_trends(
    topology: Topology,
    emit_trend: Mapping[str, float],
    offered_trend: Mapping[str, float],
    emit: Mapping[str, float],
    processing: Mapping[str, float],
    capacity: Mapping[str, float],
    offered: Mapping[str, float],
) -> dict[str, float]:
    """Input trends by the rule of `demand_input_rates`: a source's is the trend of what it is offered; a
    parent held back rather than busy passes its own input trend on (times its selectivity), any other
    parent the trend of what it emitted. So a pause, a catch-up or a back-pressured stretch does not read
    as a trend: what the sources offer does not change with them, what a vertex emits does."""
    demand = demand_input_rates(topology, emit, offered, processing, capacity)
    trends: dict[str, float] = {}
    for v in topology.order:
        parents = list(topology.graph.predecessors(v))
        if not parents:
            trends[v] = offered_trend.get(v, 0.0)
            continue
        total = 0.0
        for p in parents:
            held_back = passes_its_demand(capacity.get(p), demand[p], processing[p])
            total += trends[p] * emit[p] / processing[p] if held_back else emit_trend[p]
        trends[v] = total
    return trends


def offered_load(topology: Topology, snapshot: MetricSnapshot) -> dict[str, float]:
    """The input rate each vertex is offered by the sources' load: `demand_input_rates` from the sources'
    offered rates alone, without the measured input of a vertex below. The autoscaling policies decide on
    it: a parent draining a backlog after a rescale emits more than the load, and that catch-up must not
    read as load (the planner's `rates_from_snapshot` keeps the measured input, which it must carry)."""
    snapshot.check_against(topology)
    vertices = snapshot.vertices
    processing = {v: vertices[v].processing_rate for v in topology.order}
    emit = {v: vertices[v].emit_rate for v in topology.order}
    offered = {s: vertices[s].input_rate for s in topology.sources}
    capacity = {v: rate for v in topology.order if (rate := vertices[v].true_processing_rate) is not None}
    if capacity:
        return demand_input_rates(topology, emit, offered, processing, capacity)
    return derive_input_rates(topology, emit, offered, processing)


def waiting_load(
    topology: Topology, snapshot: MetricSnapshot, load: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The items each vertex has still to process: its own queues plus what waits upstream of it behind
    parents held back rather than busy (their waiting items times their selectivity), by the rule of
    `demand_input_rates`. With bounded queues a bottleneck's backlog waits at the source that its
    back-pressure holds back, not in its own queue; counted there alone, the vertex that must drain it
    never saw it. `load`: the snapshot's `offered_load`, when the caller has it already."""
    load = offered_load(topology, snapshot) if load is None else load
    vertices = snapshot.vertices
    waiting: dict[str, float] = {}
    for v in topology.order:
        total = vertices[v].queue_length or 0.0
        for p in topology.graph.predecessors(v):
            parent = vertices[p]
            if passes_its_demand(parent.true_processing_rate, load[p], parent.processing_rate):
                total += waiting[p] * parent.emit_rate / parent.processing_rate
        waiting[v] = total
    return waiting


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
