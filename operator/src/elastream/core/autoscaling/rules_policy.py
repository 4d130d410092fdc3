"""ARiSto's dynamic mechanism (Gkolemis et al., section 3) as pure rules over one analysed window.

The paper's four rules, in its order:

1. a component whose capacity exceeds th_cc gets one more executor;
2. if the executors per worker then exceed th_e, a worker (node) is added;
3. if no component is over th_cc but the topology's total capacity exceeds th_high, a node is added;
4. if no component is over th_cc and the total capacity is below th_low, a node is removed — checked
   first: the remaining nodes must stay under th_high, and a vertex never loses the executors that keep
   it under th_cc (unchecked, removing a node squeezed a vertex over th_cc and rule 1 added it back:
   bench/autoscale.py saw a scale-in reversed 32 s later, 11 times in 600 s on a noisy constant input).

Storm's "capacity" of a bolt is the share of time it is executing. Measured (busy seconds over window
seconds, per executor) it follows every transient: a rescale's catch-up keeps a vertex 100 % busy for a few
seconds, a pause idles it. The rules take it from the load instead: the input rate the sources offer
(`core.metrics.offered_load`) over the vertex's capacity with every executor busy (its true processing
rate), the busy fraction the vertex settles at under that load; the measured one where the capacity was
never measured. The paper does not define "total capacity of the topology" nor
give threshold values; this module takes the busy threads of all executors over the slots the nodes offer
(Σ busy_fraction × executors / (nodes × slotsPerNode)), so adding a node lowers it and removing one raises
it, and the defaults th_cc 0.8, th_high 0.75, th_low 0.25 and th_e = slotsPerNode (a node never holds more
executors than it has slots). Who gets a new node's slots, and which node goes, is the planner's: Stela's
ETP fills the slots, ETPSum picks the node. The warm-up window after each change is the autoscaler's
stabilization interval (`core.autoscaling.decision`), shared with the AUTOSCALE policy.

A window whose busy fractions or total capacity are not finite numbers (a load over a capacity that
overflowed, a threshold of 0) decides nothing: no executor, no node, and the rule says why ("...: nothing
decided"). `evaluate_rules` never raises on the numbers of a window; a window with NaN, infinite or
negative rates is not given to it at all (`core.autoscaling.window_check`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from elastream.core.metrics import MetricSnapshot, offered_load
from elastream.core.topology import Topology

DEFAULT_TH_CC = 0.8
DEFAULT_TH_HIGH = 0.75
DEFAULT_TH_LOW = 0.25


@dataclass(frozen=True)
class RuleThresholds:
    capacity: float = DEFAULT_TH_CC
    #: executors per node above which a node is added; None: the topology's slotsPerNode
    executors_per_node: int | None = None
    high: float = DEFAULT_TH_HIGH
    low: float = DEFAULT_TH_LOW


@dataclass(frozen=True)
class RulesEvaluation:
    """What the rules decided and why (the shape of `status.autoscaler` for the rules policy)."""

    busy: Mapping[str, float]
    #: vertices over th_cc (rule 1), each getting one executor
    over_capacity: tuple[str, ...]
    #: the degrees after the rules (rule 1's growth, or what rule 4 lowers to fit one node fewer)
    parallelism: Mapping[str, int]
    total_capacity: float
    node_delta: int
    rule: str


def total_capacity(busy: Mapping[str, float], parallelism: Mapping[str, int], nodes: int, slots_per_node: int) -> float:
    """Busy threads over the slots of the nodes: Σ busy_fraction(v) × executors(v) / (nodes × slots)."""
    slots = nodes * slots_per_node
    return sum(busy[v] * parallelism[v] for v in busy) / slots if slots > 0 else 0.0


def unusable(busy: Mapping[str, float], total: float, th: RuleThresholds, executors_per_node: int) -> str | None:
    """Why the rules cannot act on this window's numbers (one line), None when they can."""
    bad = [f"{v} {b:g}" for v, b in busy.items() if not math.isfinite(b) or b < 0.0]
    if bad:
        return f"busy fraction {', '.join(bad)} in the window"
    if not math.isfinite(total):
        return f"total capacity {total:g} in the window"
    if executors_per_node < 1 or not th.capacity > 0.0:
        return f"thresholds th_e {executors_per_node}, th_cc {th.capacity:g} leave no room"
    return None


def load_busy_fractions(topology: Topology, snapshot: MetricSnapshot) -> dict[str, float]:
    """Per vertex, the busy fraction its offered load implies: load / true processing rate (above 1 when
    the load exceeds what every executor busy does); the measured busy fraction where that is unknown."""
    load = offered_load(topology, snapshot)
    busy: dict[str, float] = {}
    for v in topology.order:
        metrics = snapshot.vertices[v]
        rate = metrics.true_processing_rate
        busy[v] = load[v] / rate if rate is not None and rate > 0.0 else (metrics.busy_fraction or 0.0)
    return busy


def evaluate_rules(
    topology: Topology,
    snapshot: MetricSnapshot,
    parallelism: Mapping[str, int],
    nodes: int,
    thresholds: RuleThresholds | None = None,
) -> RulesEvaluation:
    th = thresholds or RuleThresholds()
    th_e = th.executors_per_node if th.executors_per_node is not None else topology.slots_per_node
    busy = load_busy_fractions(topology, snapshot)
    total = total_capacity(busy, parallelism, nodes, topology.slots_per_node)
    why = unusable(busy, total, th, th_e)
    if why is not None:
        return RulesEvaluation(busy, (), dict(parallelism), total, 0, f"{why}: nothing decided")
    over = tuple(
        v for v in topology.order if busy[v] > th.capacity and parallelism[v] < topology.vertices[v].max_parallelism
    )
    new_parallelism = {v: parallelism[v] + (1 if v in over else 0) for v in topology.order}
    executors = sum(new_parallelism.values())
    if over:
        needed = math.ceil(executors / th_e)
        delta = max(0, needed - nodes)
        rule = f"capacity over {th.capacity:g} in {', '.join(over)}: one more executor each" + (
            f"; {executors} executors exceed {th_e} per node on {nodes} nodes: add {delta}" if delta else ""
        )
        return RulesEvaluation(busy, over, new_parallelism, total, delta, rule)
    if total > th.high:
        return RulesEvaluation(
            busy, over, new_parallelism, total, 1, f"total capacity {total:.2f} over {th.high:g}: add a node"
        )
    if total < th.low and nodes > 1:
        return _remove_a_node(topology, _Window(busy, parallelism, nodes, total), th)
    return RulesEvaluation(
        busy, over, new_parallelism, total, 0, f"total capacity {total:.2f} within [{th.low:g}, {th.high:g}]"
    )


@dataclass(frozen=True)
class _Window:
    """What the rules read off one window: the busy fractions, the degrees and nodes, the total capacity."""

    busy: Mapping[str, float]
    parallelism: Mapping[str, int]
    nodes: int
    total: float


def _remove_a_node(topology: Topology, window: _Window, th: RuleThresholds) -> RulesEvaluation:
    """Rule 4, checked before it acts (the paper does not say; unchecked, it flaps): the remaining nodes
    must stay under th_high, and where the executors no longer fit, a vertex keeps the executors that hold
    its busy threads under th_cc (⌈busy × k / th_cc⌉), or rule 1 would add them back at once."""
    busy, parallelism, nodes, total = window.busy, window.parallelism, window.nodes, window.total
    after = total * nodes / (nodes - 1)
    unchanged = dict(parallelism)
    if after > th.high:
        why = f"total capacity {total:.2f} under {th.low:g}, but {nodes - 1} nodes would be at {after:.2f}"
        return RulesEvaluation(busy, (), unchanged, total, 0, why)
    keep = {v: _kept(busy[v], parallelism[v], th.capacity) for v in busy}
    slots = (nodes - 1) * topology.slots_per_node
    if sum(keep.values()) > slots:
        why = f"total capacity {total:.2f} under {th.low:g}, but the executors it needs do not fit {nodes - 1} nodes"
        return RulesEvaluation(busy, (), unchanged, total, 0, why)
    degrees = dict(parallelism)
    while sum(degrees.values()) > slots:
        spare = max(topology.order, key=lambda v: (degrees[v] - keep[v], -topology.position[v]))
        degrees[spare] -= 1
    lowered = {v: (parallelism[v], k) for v, k in degrees.items() if k != parallelism[v]}
    why = f"total capacity {total:.2f} under {th.low:g}: remove a node" + (
        "; " + ", ".join(f"{v} {a}->{b}" for v, (a, b) in lowered.items()) + " to fit" if lowered else ""
    )
    return RulesEvaluation(busy, (), degrees, total, -1, why)


def _kept(busy: float, degree: int, th_cc: float) -> int:
    """The executors that hold a vertex's busy threads under th_cc, ⌈busy × k / th_cc⌉ within [1, k]
    (a ratio that overflows keeps them all; never `math.ceil(inf)`)."""
    wanted = busy * degree / th_cc
    if not wanted < degree:  # also NaN and infinity
        return degree
    return max(1, math.ceil(round(wanted, 9)))
