"""Congestion detection and ETP (Stela, section II-C and II-D), and ETPSum per node (section II-F).

ETP is implemented as the paper *defines* it, not as Algorithm 1 literally computes it:

    ETP(o) = (sum of processing rates of the sinks reachable from o through at least one path of
              non-congested vertices) / (sum of the processing rates of all sinks)

Each effectively reachable sink counts once. Algorithm 1's post-order sum returns the sum over *paths*, so in
a diamond (o -> a -> s, o -> b -> s) it would count sink s twice and can exceed 1. Here every vertex carries
the set of sinks it reaches through non-congested vertices as a bitset, so ETP is in [0, 1] and one pass over
the DAG in reverse topological order computes every vertex's ETP: O(V + E) big-integer operations, where
the paper's per-operator DFS is O(V²) per iteration. Conventions the paper leaves open:

- A sink's ETP is its own share of throughput, whether or not it is congested (Algorithm 1, line 3).
- The path starts *after* o: o itself may be congested (that is the point: it is the candidate).
- With total sink throughput 0 every ETP is 0.
- congested ⇔ input / processing > CongestionRate; processing 0 with input > 0 is congested, 0/0 is not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elastream.core.metrics import MetricSnapshot, rates_from_snapshot

# Defined with ScalingSpec, whose default it is; re-exported here for the planner's callers.
from elastream.core.topology import DEFAULT_CONGESTION_RATE as DEFAULT_CONGESTION_RATE
from elastream.core.topology import Topology, split_executor_id


def is_congested(input_rate: float, processing_rate: float, congestion_rate: float) -> bool:
    if processing_rate <= 0.0:
        return input_rate > 0.0
    return input_rate / processing_rate > congestion_rate


def congested_vertices(
    topology: Topology,
    input_rates: Mapping[str, float],
    processing_rates: Mapping[str, float],
    congestion_rate: float = DEFAULT_CONGESTION_RATE,
    capacity: Mapping[str, float] | None = None,
) -> frozenset[str]:
    """The CongestedMap of Algorithm 2: vertices whose input outpaces their processing by the rate.

    Where a vertex's true processing rate (capacity) is known, it is compared instead of the measured rate:
    a vertex that could process its input but is held back by back-pressure from downstream is not
    congested (the bottleneck downstream is). Without capacities this is exactly the paper's rule."""
    capacity = capacity or {}
    return frozenset(
        v
        for v in topology.order
        if is_congested(input_rates[v], max(processing_rates[v], capacity.get(v, 0.0)), congestion_rate)
    )


def etp_map(
    topology: Topology,
    processing_rates: Mapping[str, float],
    congested: frozenset[str] | set[str],
) -> dict[str, float]:
    """ETP of every vertex, by the definition (each effectively reachable sink counted once)."""
    sinks = topology.sinks
    bit = {s: 1 << i for i, s in enumerate(sinks)}
    total = sum(processing_rates[s] for s in sinks)
    # reach[v]: sinks reachable from v through vertices that are all non-congested, v included.
    reach: dict[str, int] = {}
    # effective[v]: sinks reachable from v through non-congested vertices after v (v itself may be congested).
    effective: dict[str, int] = {}
    graph = topology.graph
    for v in reversed(topology.order):
        if v in bit:
            effective[v] = bit[v]
        else:
            mask = 0
            for child in graph.successors(v):
                mask |= reach[child]
            effective[v] = mask
        reach[v] = 0 if v in congested else effective[v]
    if total <= 0.0:
        return dict.fromkeys(topology.order, 0.0)
    share_cache: dict[int, float] = {}
    result: dict[str, float] = {}
    for v in topology.order:
        mask = effective[v]
        if mask not in share_cache:
            share_cache[mask] = sum(processing_rates[s] for s in sinks if mask & bit[s]) / total
        result[v] = share_cache[mask]
    return result


def etp_sums(etp: Mapping[str, float], placement: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """ETPSum per node: the sum of the ETPs of the vertices of the executors it hosts (Algorithm 3)."""
    return {node: sum(etp[split_executor_id(e)[0]] for e in executors) for node, executors in placement.items()}


@dataclass(frozen=True)
class VertexEtp:
    input_rate: float
    processing_rate: float
    congested: bool
    etp: float

    def to_dict(self) -> dict[str, object]:
        return {
            "input_rate": self.input_rate,
            "processing_rate": self.processing_rate,
            "congested": self.congested,
            "etp": self.etp,
        }


@dataclass(frozen=True)
class EtpTable:
    """What `elastream etp` shows: total sink throughput and, per vertex, rates, congestion and ETP."""

    throughput: float
    vertices: Mapping[str, VertexEtp]

    def to_dict(self) -> dict[str, object]:
        return {"throughput": self.throughput, "vertices": {v: e.to_dict() for v, e in self.vertices.items()}}

    def priority(self) -> list[str]:
        """Congested vertices by decreasing ETP (ties in topological order): Stela's scale-out order."""
        position = {v: i for i, v in enumerate(self.vertices)}
        congested = [v for v in self.vertices if self.vertices[v].congested]
        return sorted(congested, key=lambda v: (-self.vertices[v].etp, position[v]))


def etp_table(
    topology: Topology, snapshot: MetricSnapshot, congestion_rate: float = DEFAULT_CONGESTION_RATE
) -> EtpTable:
    rates = rates_from_snapshot(topology, snapshot)
    congested = congested_vertices(topology, rates.input, rates.processing, congestion_rate, rates.capacity)
    etp = etp_map(topology, rates.processing, congested)
    return EtpTable(
        throughput=sum(rates.processing[s] for s in topology.sinks),
        vertices={v: VertexEtp(rates.input[v], rates.processing[v], v in congested, etp[v]) for v in topology.order},
    )
