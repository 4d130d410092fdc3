"""What a simulated autoscaling run is given and what it reports (`sim.autoscaling` runs it).

The policies a run compares (``static-min``: AUTOSCALE's ConfMin, ``static-expert``: ConfExpt, and the
adaptive ``autoscale`` and ``rules``), its settings (intervals, evaluation period, CCR's measured
migration delays, when a change counts as settled, the latency bound), the sources' offered rates, the
static configurations, and the per-interval results with the measures the benchmark reports (events late,
throughput kept, latency percentiles, node- and executor-seconds).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from elastream.core.autoscaling.decision import Recommendation
from elastream.core.planner.parallelism import resize
from elastream.core.rates import RateProfile
from elastream.core.schedule import Schedule, fresh_node_names
from elastream.core.simulate import SimulationModel
from elastream.core.topology import Topology

Policy = Literal["static-min", "static-expert", "autoscale", "rules"]
POLICIES: tuple[Policy, ...] = ("static-min", "static-expert", "autoscale", "rules")


@dataclass(frozen=True)
class MigrationDelays:
    """CCR's phases as measured (docs/benchmarks/migration.md, medians over the five DAGs)."""

    #: prepare when nodes are added (they start and bind their inboxes), while everything runs
    prepare_out_s: float = 0.568
    #: prepare without new nodes (staying workers bind new executors' inboxes)
    prepare_in_s: float = 0.007
    #: sources held: PREPARE sent until every source is told to resume
    pause_s: float = 0.116


@dataclass(frozen=True)
class SimSettings:
    interval_s: float = 1.0
    #: intervals per analysis window (None: the topology's `scaling.window`)
    window: int | None = None
    #: seconds between autoscaler evaluations (the controller's default: two intervals)
    period_s: float = 2.0
    #: simulated seconds (None: one period of the longest source profile)
    duration_s: float | None = None
    delays: MigrationDelays = field(default_factory=MigrationDelays)
    #: a change counts as settled after this long even if the output never came back (controller: 60 s)
    settle_timeout_s: float = 60.0
    settle_tolerance: float = 0.1
    settle_hold: int = 3
    #: end-to-end latency above which an event counts as late
    latency_bound_s: float = 1.0


@dataclass(frozen=True)
class VertexInterval:
    """One vertex over one interval (counts are items, not rates)."""

    received: float
    processed: float
    emitted: float
    busy_s: float
    #: items pending at the end of the interval (a source: offered but not yet emitted)
    queue: float


@dataclass(frozen=True)
class Interval:
    #: end of the interval (it covers (end - interval_s, end])
    end: float
    offered: float
    #: what the sinks processed
    delivered: float
    #: what the sinks would process with unlimited capacity: offered × gain
    expected: float
    latency_s: float
    #: resources billed over the interval (time-weighted: during a migration both schedules' extras count)
    node_seconds: float
    executor_seconds: float
    nodes: int
    parallelism: Mapping[str, int]
    vertices: Mapping[str, VertexInterval]

    @property
    def executors(self) -> int:
        return sum(self.parallelism.values())

    @property
    def backlog(self) -> float:
        return sum(v.queue for v in self.vertices.values())


@dataclass(frozen=True)
class Change:
    decided_at: float
    #: when the new schedule took over (after prepare and the sources' pause)
    applied_at: float
    action: str
    direction: str
    from_nodes: int
    to_nodes: int
    from_parallelism: Mapping[str, int]
    to_parallelism: Mapping[str, int]
    reason: str
    settled_at: float | None = None


@dataclass(frozen=True)
class SimResult:
    policy: str
    settings: SimSettings
    intervals: tuple[Interval, ...]
    changes: tuple[Change, ...]
    evaluations: tuple[Recommendation, ...]
    #: recommendations `make_plan` rejected: (time, error)
    rejected: tuple[tuple[float, str], ...] = ()

    @property
    def offered(self) -> float:
        return sum(i.offered for i in self.intervals)

    @property
    def throughput_kept(self) -> float:
        """Delivered over expected at the sinks, over the whole run (backlog left at the end is not kept)."""
        expected = sum(i.expected for i in self.intervals)
        return sum(i.delivered for i in self.intervals) / expected if expected > 0.0 else 1.0

    @property
    def late_fraction(self) -> float:
        """Share of the offered events whose end-to-end latency exceeds the bound."""
        offered = self.offered
        late = sum(i.offered for i in self.intervals if i.latency_s > self.settings.latency_bound_s)
        return late / offered if offered > 0.0 else 0.0

    def latency_percentile(self, q: float) -> float:
        return weighted_percentile([(i.latency_s, i.offered) for i in self.intervals], q)

    @property
    def node_seconds(self) -> float:
        return sum(i.node_seconds for i in self.intervals)

    @property
    def executor_seconds(self) -> float:
        return sum(i.executor_seconds for i in self.intervals)

    @property
    def final_backlog(self) -> float:
        return self.intervals[-1].backlog if self.intervals else 0.0


def weighted_percentile(points: Sequence[tuple[float, float]], q: float) -> float:
    """The smallest value v such that the weight of points ≤ v is at least q × the total (q in [0, 1])."""
    total = sum(w for _, w in points)
    if total <= 0.0:
        return 0.0
    running = 0.0
    ordered = sorted(points)
    for value, weight in ordered:
        running += weight
        if running >= q * total - 1e-9:
            return value
    return ordered[-1][0]


# ---- sources -----------------------------------------------------------------------------------------------


def offered_rate(config: Mapping[str, Any]) -> RateProfile:
    """A source's offered rate over time, as its executors see it (`core.rates.RateProfile`): `profile`,
    `steps` or a constant `rate`. A `csv` needs reading a file: give its rates as `steps` instead."""
    try:
        profile = RateProfile(config)
    except ValueError:
        profile = None
    if profile is None or profile.unbounded:
        raise ValueError("a simulated source needs a rate, steps or a profile (csv: pass its rates as steps)")
    return profile


def offered_rates(topology: Topology) -> dict[str, RateProfile]:
    return {s: offered_rate(topology.vertices[s].config) for s in topology.sources}


def gains(topology: Topology, model: SimulationModel, parallelism: Mapping[str, int]) -> dict[str, float]:
    """Per source: sink items per offered event with unlimited capacity (Σ over paths of the selectivities;
    an `all` stream delivers a copy to each of the child's executors)."""
    result: dict[str, float] = {}
    for source in topology.sources:
        flow = dict.fromkeys(topology.order, 0.0)
        flow[source] = 1.0
        for v in topology.order:
            for c in topology.children(v):
                copies = parallelism[c] if topology.stream(v, c).grouping == "all" else 1
                flow[c] += flow[v] * model.vertices[v].selectivity * copies
        result[source] = sum(flow[s] for s in topology.sinks)
    return result


# ---- static configurations ---------------------------------------------------------------------------------


def min_parallelism(topology: Topology) -> dict[str, int]:
    return dict.fromkeys(topology.order, 1)


def expert_parallelism(topology: Topology, model: SimulationModel | None = None) -> dict[str, int]:
    """ConfExpt: per vertex the fewest executors whose capacity covers its input at the sources' peak
    offered rates (each source's maximum, fluctuation included, propagated by the selectivities), within
    [1, maxParallelism]; 1 for a vertex without a cost."""
    model = model or SimulationModel.from_topology(topology)
    rates = offered_rates(topology)
    peak_in: dict[str, float] = dict.fromkeys(topology.order, 0.0)
    for s in topology.sources:
        peak_in[s] = rates[s].peak
    degrees: dict[str, int] = {}
    for v in topology.order:
        vm = model.vertices[v]
        for c in topology.children(v):
            peak_in[c] += peak_in[v] * vm.selectivity
        need = 1 if math.isinf(vm.capacity) else math.ceil(round(peak_in[v] / vm.capacity, 9))
        degrees[v] = max(1, min(topology.vertices[v].max_parallelism, need))
    return degrees


def nodes_for(topology: Topology, parallelism: Mapping[str, int]) -> int:
    return max(1, math.ceil(sum(parallelism.values()) / topology.slots_per_node))


def schedule_for(topology: Topology, parallelism: Mapping[str, int], nodes: int | None = None) -> Schedule:
    """`parallelism` on `nodes` fresh nodes (default: the fewest that hold it), spread by `resize`."""
    count = nodes if nodes is not None else nodes_for(topology, parallelism)
    empty = Schedule({}, tuple(fresh_node_names((), count)), topology.slots_per_node)
    return resize(empty, {v: parallelism[v] for v in topology.order})


def with_policy(topology: Topology, policy: str) -> Topology:
    """The topology with `scaling.auto` enabled for `policy` (autoscale | rules)."""
    auto = dataclasses.replace(topology.scaling.auto, enabled=True, policy=policy)
    return dataclasses.replace(topology, scaling=dataclasses.replace(topology.scaling, auto=auto))
