"""AUTOSCALE's preventive auto-parallelization (Kotto Kombi et al., section IV), as pure functions.

One evaluation takes the analysis of the last window (a `MetricSnapshot`) and the running parallelism, and
returns, per vertex, the paper's numbers and a new parallelism degree:

- the input forecast (eq. 2-3): the window's input rate moved along its least-squares trend by one
  evaluation period (the regression over window j-1 evaluated at window j's timestamps, which are one period
  later), times the window's duration, plus the items pending (in the vertex's queues and held upstream
  by its back-pressure);
- the capacity (eq. 4): items one executor processes per busy second (1/Lat: the vertex's true processing
  rate over its executors) × window duration × degree,
  and its estimate for the next window (eq. 5): capacity + ε;
- LAL = EstimInput / EstimCapacity (eq. 6), the activity level by θmin/θmax;
- the global pass (Algorithm 1, eq. 7-10): in topological order from the sources' children, a vertex with
  a critical parent replaces its input estimate by combine(local, Σ parents' EstimOutput), GAL is that over
  EstimCapacity (otherwise GAL = LAL);
- the decision matrix (Table I) from GAL's activity and the sign of the input trend, and the new degree by
  eq. 11, bounded by [1, maxParallelism].

Where the paper is silent or ambiguous, this module chooses, and says so:

- The inputs are the load, not what was processed: a vertex's input rate is what the sources offer passed
  on through the selectivities (`core.metrics.offered_load`), its trend the slope of that offered series
  (`input_trend`, `core.metrics.demand_input_trends`). Measured on processed or emitted events, a rescale's
  pause reads as a falling input and its catch-up as a rising one, and a constant load rescaled itself
  every 40 s on worker processes. The paper's equations take "the input"; the offered series is the input
  a source has, whatever the operators did with it. (Start-up is the autoscaler's: no decision before the
  first window that starts after the topology did.)
- Eq. 3's pending items are the vertex's own queues plus what its back-pressure holds upstream
  (`core.metrics.waiting_load`): with bounded queues a bottleneck's backlog waits at the source, and
  counted in its own queue alone, a sink 1.8 times over its capacity from the start was sized for its
  input rate and caught up one executor at a time (bench/autoscale_processes.py, 3-step stream: 6 % of
  the events late where the simulator, whose queues are unbounded, predicted 1.6 %).

- The forecast looks one evaluation period ahead (the paper's iterations): the activity levels and the
  decision come from it. A scale-out, once decided, is sized for a *rising* input projected to the end of
  the stabilization interval, since no correction can come sooner (deciding on that projection would let
  a noisy trend trigger scale-outs). bench/autoscale.py, 5-step stream: 39 % -> 6 % of the events late on
  the linear topology, 34 % -> 26 % on the advertising one (p99 17 s -> 4 s); the 3-step stream is
  unchanged.
- ε of eq. 5 is "the covariance between the capacity during F_{j-1} and the capacities observed during
  previous iterations". Read as a regression like the input's: ε = cov(t, c) / var(t) × period, the
  least-squares slope of the per-executor capacity over the previous evaluations, one period ahead (0 with
  fewer than two). Per executor, so a parallelism change does not look like a capacity trend.
- Eq. 8 confines a parent's estimated processing to its capacity. A critical parent is being scaled out in
  the same evaluation, so its capacity is taken at its new degree; with its current one, a critical
  parent's output could never exceed what the child already receives and the global pass would change
  nothing.
- Table I's "low activity" row is one merged cell: scale-in whatever the trend (the forecast already holds
  the trend; a low vertex with increasing input is still over-provisioned for the next window).
- A scale-in's degree is ⌈deg × GAL / θmax⌉, not eq. 11's ⌈deg × GAL⌉: that one sizes the vertex for 100 %
  busy, in the high band, and the next rising trend adds an executor back (bench/autoscale.py saw
  7 -> 1 -> 2 within 32 s on the 5-step stream). Sized for θmax, it lands in the medium band.
- A vertex whose processing rate was never measured (no busy time in the window) has no capacity: with no
  input it is low (scale-in to 1), with input it is left alone ("unmeasured").
- So is a vertex whose capacity is estimated at zero (eq. 5's ε, on a falling capacity, took it below 0) or
  whose numbers are not finite (an estimate that overflowed): it decides nothing ("nothing", its degree
  kept) and its reason says so ("no capacity estimated for vertex a in the window ...: nothing decided").
  Dividing by that capacity gave GAL = ∞, "critical", and eq. 11's ⌈deg × ∞⌉ raised OverflowError out of
  the controller's tick (issue 38). Every degree is computed by `ceil_degree`, which is total: an infinite
  or huge level is maxParallelism, NaN keeps the degree. A window that holds NaN, infinite or negative
  rates, or no duration, is not given to a policy at all (`core.autoscaling.window_check`).
- A vertex fed only through `global` streams gains nothing from more executors (everything goes to
  executor 0): it is never scaled out (decision "nothing", reason "global input").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from elastream.core.metrics import MetricSnapshot, VertexMetrics, offered_load, waiting_load
from elastream.core.planner.stela import fed_only_by_global
from elastream.core.topology import Topology

Activity = Literal["low", "medium", "high", "critical"]
Decision = Literal["scale-in", "nothing", "scale-out"]
Combine = Literal["max", "min"]

#: AUTOSCALE's thresholds (Table II)
DEFAULT_THETA_MIN = 0.3
DEFAULT_THETA_MAX = 0.8


@dataclass(frozen=True)
class AutoscaleSettings:
    theta_min: float = DEFAULT_THETA_MIN
    theta_max: float = DEFAULT_THETA_MAX
    combine: Combine = "max"
    #: seconds between evaluations: how far ahead the input and capacity forecasts look
    period_s: float = 1.0
    #: how far ahead a *rising* input is forecast (None: period_s): until the next change can take effect
    rising_horizon_s: float | None = None


@dataclass(frozen=True)
class VertexEvaluation:
    """One vertex's numbers in one evaluation (the shape of `status.autoscaler.vertices[v]`)."""

    vertex: str
    parallelism: int
    #: items expected in the next window: forecast arrivals plus pending (eq. 3); after the global pass
    estim_input: float
    #: items the vertex processes in a window at its current degree (eq. 4), None when never measured
    capacity: float | None
    estim_capacity: float | None
    lal: float | None
    gal: float | None
    #: input trend, tuples/s per second (its sign picks Table I's column)
    trend: float
    activity: Activity | None
    decision: Decision
    target: int
    reason: str = ""

    def to_status(self) -> dict[str, object]:
        return {
            "parallelism": self.parallelism,
            "target": self.target,
            "lal": _rounded(self.lal),
            "gal": _rounded(self.gal),
            "trend": _rounded(self.trend, 3),
            "activity": self.activity,
            "decision": self.decision,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class AutoscaleEvaluation:
    vertices: Mapping[str, VertexEvaluation]
    settings: AutoscaleSettings = field(default_factory=AutoscaleSettings)

    @property
    def parallelism(self) -> dict[str, int]:
        return {v: e.target for v, e in self.vertices.items()}

    @property
    def changes(self) -> dict[str, tuple[int, int]]:
        return {v: (e.parallelism, e.target) for v, e in self.vertices.items() if e.target != e.parallelism}


def _rounded(value: float | None, digits: int = 4) -> float | None:
    """For the status: None for a number JSON cannot carry (NaN, infinity) as for a missing one."""
    return None if value is None or not math.isfinite(value) else round(value, digits)


# ---- the formulas, one function each ------------------------------------------------------------------------


def forecast_input(
    rate: float, trend: float, period_s: float, window_s: float, pending: float, rising_horizon_s: float | None = None
) -> float:
    """Eq. 2-3: items expected in the next window. The regression line of the input rate over the last
    window, evaluated one period later (a rising one `rising_horizon_s` later), summed over the window
    (rate × duration), plus the pending items."""
    ahead = rising_horizon_s if trend > 0.0 and rising_horizon_s is not None else period_s
    return max(0.0, rate + trend * ahead) * window_s + max(0.0, pending)


def capacity(executor_rate: float, window_s: float, degree: int) -> float:
    """Eq. 4: (1 / Lat) × Δ × deg, with 1/Lat the items one executor processes per busy second."""
    return executor_rate * window_s * degree


def capacity_trend(history: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of (time, per-executor capacity rate) pairs: cov(t, c) / var(t); 0 with
    fewer than two points or no spread in time."""
    points = [(t, c) for t, c in history if math.isfinite(t) and math.isfinite(c)]
    if len(points) < 2:
        return 0.0
    n = float(len(points))
    mean_t = sum(t for t, _ in points) / n
    mean_c = sum(c for _, c in points) / n
    var_t = sum((t - mean_t) * (t - mean_t) for t, _ in points)  # not ** 2: a float power raises on overflow
    if not math.isfinite(var_t) or var_t <= 0.0:
        return 0.0
    slope = sum((t - mean_t) * (c - mean_c) for t, c in points) / var_t
    return slope if math.isfinite(slope) else 0.0


def estim_capacity(current: float, epsilon: float) -> float:
    """Eq. 5: the next window's capacity, never below zero."""
    return max(0.0, current + epsilon)


def load_level(estimate: float, capacity_items: float | None) -> float | None:
    """Eq. 6 and 10: LAL or GAL, the estimated input over the estimated capacity. None when it cannot be
    computed: no capacity (None, zero or below: nothing was measured, or eq. 5's trend took it to 0), or
    a number that is not finite. Never ∞: an infinite level would read as "critical" and size the vertex
    by ⌈deg × ∞⌉."""
    if capacity_items is None or not math.isfinite(capacity_items) or capacity_items <= 0.0:
        return None
    if not math.isfinite(estimate) or estimate < 0.0:
        return None
    level = estimate / capacity_items
    return level if math.isfinite(level) else None


def activity_level(level: float, theta_min: float, theta_max: float) -> Activity:
    """Section IV-C: ≤ θmin low, ≤ θmax medium, ≤ 1 high, above 1 critical."""
    if level <= theta_min:
        return "low"
    if level <= theta_max:
        return "medium"
    if level <= 1.0:
        return "high"
    return "critical"


def decide(activity: Activity, trend: float) -> Decision:
    """Table I: the activity and whether the input is increasing (trend strictly positive)."""
    increasing = trend > 0.0
    if activity == "low":
        return "scale-in"
    if activity == "medium":
        return "nothing"
    if activity == "high":
        return "scale-out" if increasing else "nothing"
    return "scale-out"


def new_degree(
    current: int, gal: float, activity: Activity, max_parallelism: int, theta_max: float = DEFAULT_THETA_MAX
) -> int:
    """Eq. 11: high activity adds one executor; critical ⌈deg × GAL⌉; within [1, maxParallelism]. A low
    vertex shrinks to ⌈deg × GAL / θmax⌉ (see the module docstring: eq. 11's ⌈deg × GAL⌉ sizes it for
    100 % busy, in the high band, where the next rising trend adds an executor back)."""
    if activity == "high":
        return max(1, min(max_parallelism, current + 1))
    target = gal / theta_max if activity == "low" and theta_max > 0.0 else gal
    return ceil_degree(current, target, max_parallelism)


def ceil_degree(current: int, level: float, max_parallelism: int) -> int:
    """⌈current × level⌉ within [1, maxParallelism], for any float: an infinite or huge product is
    maxParallelism (never `math.ceil(inf)`, which raises), NaN keeps the current degree (bounded)."""
    product = current * level
    if math.isnan(product):
        wanted = current
    elif product >= max_parallelism:
        wanted = max_parallelism
    elif product <= 0.0:
        wanted = 1
    else:
        wanted = math.ceil(round(product, 9))  # round: 2 × 0.5 must give 1, not 2 from 1.0000000002
    return max(1, min(max_parallelism, wanted))


def estim_output(estim_input: float, capacity_items: float, selectivity: float) -> float:
    """Eq. 8-9: min(EstimInput, Capacity) × SF."""
    return min(estim_input, capacity_items) * selectivity


def combine_estimates(local: float, parents: float, how: Combine) -> float:
    return max(local, parents) if how == "max" else min(local, parents)


# ---- one evaluation ----------------------------------------------------------------------------------------


def evaluate(
    topology: Topology,
    snapshot: MetricSnapshot,
    parallelism: Mapping[str, int],
    window_s: float,
    settings: AutoscaleSettings | None = None,
    capacity_history: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> AutoscaleEvaluation:
    """Evaluate every vertex (local pass, then Algorithm 1's global pass) and decide its new degree."""
    settings = settings or AutoscaleSettings()
    history = capacity_history or {}
    global_only = fed_only_by_global(topology)
    # the load: input rates that see through back-pressure (a vertex behind a bottleneck is offered what
    # the bottleneck would pass on, not what it lets through) and through a catch-up (a parent draining a
    # backlog after a rescale passes on what the sources offer, not its burst): see `offered_load`
    inputs = offered_load(topology, snapshot)
    # eq. 3's pending items, with those a vertex's back-pressure holds at its sources (`waiting_load`)
    pending = waiting_load(topology, snapshot, inputs)
    local: dict[str, _Local] = {}
    for v in topology.order:
        metrics = snapshot.vertices[v]
        local[v] = _local(metrics, inputs[v], pending[v], parallelism[v], window_s, settings, history.get(v, ()))
    result: dict[str, VertexEvaluation] = {}
    output: dict[str, float] = {}
    for v in topology.order:
        vertex = topology.vertices[v]
        mine = local[v]
        degree = parallelism[v]
        estimate = mine.estim_input
        parents = topology.parents(v)
        reason = "local activity"
        if parents and any(result[p].activity == "critical" for p in parents):
            from_parents = sum(output[p] for p in parents)
            estimate = combine_estimates(mine.estim_input, from_parents, settings.combine)
            reason = f"a critical parent: {settings.combine}(local {mine.estim_input:.0f}, parents {from_parents:.0f})"
        gal, undecided = _global_level(v, estimate, mine)
        activity: Activity | None = None if gal is None else activity_level(gal, settings.theta_min, settings.theta_max)
        if activity is None or gal is None:
            decision: Decision = "nothing"
            target = degree
            reason = undecided
        else:
            decision = decide(activity, mine.trend)
            target = (
                degree
                if decision == "nothing"
                else new_degree(degree, gal, activity, vertex.max_parallelism, settings.theta_max)
            )
            if decision == "scale-out" and mine.ahead_input > mine.estim_input:
                # sized for the rising input at the end of the stabilization interval (module docstring)
                ahead = load_level(estimate + mine.ahead_input - mine.estim_input, mine.estim_capacity)
                if ahead is not None:
                    target = max(target, ceil_degree(degree, ahead, vertex.max_parallelism))
            if decision == "scale-out" and v in global_only:
                decision, target, reason = "nothing", degree, "global input: another executor would get nothing"
            elif decision == "scale-out" and target <= degree:
                decision, target = "nothing", degree  # already at maxParallelism
                reason = f"at maxParallelism {vertex.max_parallelism}"
        result[v] = VertexEvaluation(
            vertex=v,
            parallelism=degree,
            estim_input=estimate,
            capacity=mine.capacity,
            estim_capacity=mine.estim_capacity,
            lal=mine.lal,
            gal=gal,
            trend=mine.trend,
            activity=activity,
            decision=decision,
            target=target,
            reason=reason,
        )
        # eq. 8-9 with the capacity at the degree just decided (see the module docstring)
        if mine.executor_rate is None:
            output[v] = estimate * mine.selectivity
        else:
            output[v] = estim_output(estimate, capacity(mine.executor_rate, window_s, target), mine.selectivity)
    return AutoscaleEvaluation(result, settings)


def _global_level(vertex: str, estimate: float, mine: _Local) -> tuple[float | None, str]:
    """GAL (eq. 10) of one vertex, or None and why nothing can be decided for it."""
    if not math.isfinite(estimate):
        return None, f"the input estimate of vertex {vertex} is {estimate:g} in the window: nothing decided"
    if mine.estim_capacity is None or mine.executor_rate is None:
        if estimate > 0.0:
            return None, (
                f"unmeasured: input but no busy time in the window, no capacity measured for vertex {vertex}: "
                "nothing decided"
            )
        return 0.0, ""  # no input and no capacity: low (scale-in to 1)
    if not math.isfinite(mine.estim_capacity):
        return None, f"the capacity of vertex {vertex} is {mine.estim_capacity:g} in the window: nothing decided"
    if mine.estim_capacity <= 0.0:
        if estimate > 0.0:
            return None, (
                f"no capacity estimated for vertex {vertex} in the window (eq. 5 gives 0 from a measured "
                f"{mine.capacity or 0.0:.0f} and a falling trend), input {estimate:.0f}: nothing decided"
            )
        return 0.0, ""  # nothing to process: low, as with no capacity measured
    level = load_level(estimate, mine.estim_capacity)
    if level is None:
        return None, (
            f"vertex {vertex}'s activity level overflows ({estimate:g} / {mine.estim_capacity:g}): nothing decided"
        )
    return level, ""


@dataclass(frozen=True)
class _Local:
    estim_input: float
    #: the same forecast with a rising input projected `rising_horizon_s` ahead (sizes scale-outs only)
    ahead_input: float
    executor_rate: float | None
    capacity: float | None
    estim_capacity: float | None
    lal: float | None
    trend: float
    selectivity: float


def _local(
    metrics: VertexMetrics,
    rate: float,
    pending: float,
    degree: int,
    window_s: float,
    settings: AutoscaleSettings,
    history: Sequence[tuple[float, float]],
) -> _Local:
    trend = metrics.input_trend or 0.0
    estim_input = forecast_input(rate, trend, settings.period_s, window_s, pending)
    ahead_input = forecast_input(rate, trend, settings.period_s, window_s, pending, settings.rising_horizon_s)
    selectivity = metrics.emit_rate / metrics.processing_rate if metrics.processing_rate > 0.0 else 1.0
    executor_rate = metrics.executor_rate
    if executor_rate is None or not executor_rate > 0.0:  # not >: NaN is unmeasured too
        return _Local(estim_input, ahead_input, None, None, None, None, trend, selectivity)
    current = capacity(executor_rate, window_s, degree)
    epsilon = capacity_trend(history) * settings.period_s * window_s * degree
    estimated = estim_capacity(current, epsilon)
    lal = load_level(estim_input, estimated)
    return _Local(estim_input, ahead_input, executor_rate, current, estimated, lal, trend, selectivity)
