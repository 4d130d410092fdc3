"""Window analysis: from a window of cumulative metric samples to a snapshot, congestion and ETP.

`analyze_samples` is the pure-Python reference; `elastream.analysis.job.analyze_with_spark` computes the
same `WindowTotals` with Spark and hands them to the same `analysis_from_totals`, so both engines agree.
The window's bounds (`window_start`, `first_sample_after`), where a sample's delta falls in it
(`delta_position`) and the order of an executor's samples are defined here once for both engines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elastream.core.metrics import (
    MetricSample,
    MetricSnapshot,
    VertexMetrics,
    demand_input_trends,
    derive_input_rates,
    rates_from_snapshot,
)
from elastream.core.planner.etp import congested_vertices, etp_map, etp_sums
from elastream.core.topology import DEFAULT_CONGESTION_RATE, DEFAULT_WINDOW, Topology


@dataclass(frozen=True)
class WindowTotals:
    """What one vertex did in the window, summed over its incarnations (the engines' common result).

    Counts are integers, so they are exact and the same whichever engine summed them. The trend sums are
    sum((x - c) * delta) over the sample deltas, x the position of the middle of the time a delta covers, in
    intervals (`delta_position`), and c = (window - 1) / 2: the same formula in both engines, equal to
    rounding (exactly equal when the times are exact in binary).
    """

    processed: int = 0
    emitted: int = 0
    busy_s: float = 0.0
    executors: int = 0
    #: events offered to the vertex (for a source: due by its rate, emitted or not)
    received: int = 0
    queue_first: int = 0
    queue_last: int = 0
    processed_trend: float = 0.0
    emitted_trend: float = 0.0
    #: sum((k - c) * received delta): a source's offered series, for its input trend
    received_trend: float = 0.0
    samples: int = 0


@dataclass(frozen=True)
class Analysis:
    """A window of samples analysed: the snapshot, congestion and ETP per vertex, ETPSum per node."""

    snapshot: MetricSnapshot
    congested: dict[str, bool]
    etp: dict[str, float]
    node_etp_sum: dict[str, float]
    window_start: float
    window_end: float
    samples_used: int

    def etp_dict(self, topology: Topology) -> dict[str, Any]:
        """The "etp" table of `elastream analyze --json`: as `elastream etp --json`, plus ETPSum per node."""
        vertices = self.snapshot.vertices
        return {
            "throughput": sum(vertices[s].processing_rate for s in topology.sinks),
            "vertices": {
                v: {
                    "input_rate": vertices[v].input_rate,
                    "processing_rate": vertices[v].processing_rate,
                    "congested": self.congested[v],
                    "etp": self.etp[v],
                }
                for v in topology.order
            },
            "node_etp_sum": dict(self.node_etp_sum),
        }

    def to_dict(self, topology: Topology) -> dict[str, Any]:
        """`MetricSnapshot.to_dict` plus the "etp" table (so `elastream etp/plan --metrics` can read it)."""
        return {**self.snapshot.to_dict(), "etp": self.etp_dict(topology)}


def check_window_args(window: int, interval_s: float, congestion_rate: float) -> None:
    """Raise `ValueError` naming the fix unless window ≥ 1, interval > 0 and congestion rate ≥ 1."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window: {window!r} is not a positive number of intervals; use e.g. 20")
    if not math.isfinite(interval_s) or interval_s <= 0.0:
        raise ValueError(f"interval: {interval_s!r} is not a positive number of seconds; use e.g. 1.0")
    if not math.isfinite(congestion_rate) or congestion_rate < 1.0:
        raise ValueError(f"congestion rate: {congestion_rate!r} is below 1.0; use a value ≥ 1.0 (the paper uses 1.2)")


#: workers sample on one wall-clock grid of intervals, each waking a little late (a busy machine: a few ms,
#: sometimes tens): a sample up to this share of an interval after a grid time is that time's sample. So
#: one a little after the window's start is the baseline (`window_start`), and one a little after the
#: hot window's watermark is in it (`analysis.sources.reported_by_all`)
GRID_SLACK = 0.25


def window_start(window_end: float, window: int, interval_s: float) -> float:
    """The window is (window_end - window * interval_s, window_end]: both engines compute it this way.

    A sample counts in it when it is more than `first_sample_after` the start: a worker samples on its own
    clock, so when the window ends at one of its samples its sample a window earlier sits on the start,
    and the last bit of its time decided whether it was the baseline or an interval's counts from before
    the window counted in it (+20 % input and a trend of −50/s² on a steady 200/s, one evaluation in three).
    """
    return window_end - window * interval_s


def first_sample_after(start: float, interval_s: float) -> float:
    """Samples at or before this time are baselines of the window starting at `start` (`GRID_SLACK`)."""
    return start + GRID_SLACK * interval_s


def delta_position(ts: float, prev_ts: float | None, started_at: float, start: float, interval_s: float) -> float:
    """Where in the window a sample's delta happened, in intervals (k for the middle of interval k): the
    middle of the time it covers, spread evenly (a missing sample loses no trend).

    The delta covers (prev_ts, ts] after a previous sample; (started_at, ts] for the first sample of an
    incarnation that started in the window (counted from zero); clipped to the window's start. Any other
    first sample has a zero delta (its position does not matter: ts). In time, not in interval indices:
    workers sample on their own clocks, often exactly on the window's boundaries, and a sample whose
    interval a rounding error of the boundary decided moved a whole interval's count to its neighbour (a
    steady 200/s read as a trend of ±40/s² on worker processes). The Spark job computes the same."""
    if prev_ts is not None:
        origin = prev_ts
    elif started_at >= start:
        origin = started_at
    else:
        origin = ts
    return ((max(origin, start) + ts) / 2.0 - start) / interval_s - 0.5


def trend_center(window: int) -> float:
    """c = (window - 1) / 2, the mean interval index (the regression's x̄ in intervals)."""
    return (window - 1) / 2


def sample_order_key(s: MetricSample) -> tuple[float, int, int, int, float, int]:
    """Order of an incarnation's samples (ties on ts broken by the counters, as the Spark job does)."""
    return (s.ts, s.processed, s.emitted, s.received, s.busy_s, s.queue_len)


def _executor_key(s: MetricSample) -> tuple[float, float, int, int, int, float, int, str]:
    """Which of an executor's samples is its latest/earliest (the Spark job takes max/min of this struct)."""
    return (s.ts, s.started_at, s.processed, s.emitted, s.received, s.busy_s, s.queue_len, s.node)


def analyze_samples(
    topology: Topology,
    samples: Iterable[MetricSample],
    *,
    window: int = DEFAULT_WINDOW,
    interval_s: float = 1.0,
    congestion_rate: float = DEFAULT_CONGESTION_RATE,
) -> Analysis:
    """Analyse the last `window` intervals of cumulative samples (the reference the Spark job must match).

    Window. Samples of vertices not in the topology are ignored. The window ends at the largest `ts`
    (window_end) and is the half-open interval (window_end - window·interval_s, window_end]: its duration
    D = window·interval_s is fixed, whatever samples are present. An executor incarnation is one
    (vertex, executor, started_at); counters (received, processed, emitted, busy_s) are cumulative since
    started_at, so a new started_at is a counter reset. For each incarnation with at least one sample in the
    window, the window's counts are last − baseline, where last is its latest sample in the window and the
    baseline is, in this order: its latest sample at or before the window start (or up to `GRID_SLACK` of
    an interval after it: `first_sample_after`); zero, if it started in the window (started_at ≥ window
    start); else its first sample in the window (the counts before it are not attributable to the window
    and are dropped). Missing samples therefore lose no counts, a restart adds
    the old incarnation's counts up to its last sample plus the new one's since zero.

    Per vertex, with its incarnations' deltas summed:

    - processing_rate = processed / D, emit_rate = emitted / D;
    - executors: the executors (ids) with a sample in the window; placement: each such executor under the
      node of its latest sample (an executor that stopped reporting inside the window still counts);
    - input_rate = sum of the parents' emit rates; a source's is the rate it was offered events,
      received / D (processed / D for a source that reports no offered events) (`derive_input_rates`);
    - congestion and ETP as the planner sees the snapshot (`rates_from_snapshot`: back-pressure-aware when
      true processing rates are known);
    - busy_fraction = busy_s / (D · executors) (0 without executors);
    - true_processing_rate = processed / busy_s × executors (the vertex's rate with every executor busy),
      None when busy_s is 0;
    - queue_growth = (Σ latest queue_len − Σ earliest queue_len over its executors' samples in the window) / D;
    - input_trend: the least-squares slope (tuples/s per second) of the vertex's input rate per interval:
      the window is cut into `window` intervals, interval k = (start + k·I, start + (k+1)·I], and each
      sample's delta from its previous sample (or from its baseline) is spread evenly over the time it
      covers (deltas telescope to the window counts), `delta_position`: from its previous sample (the
      window start when that sample is at or before it) up to its own; the first sample of an incarnation
      that started in the window (counted from zero) from started_at. So missing samples (a gap), samples
      sparser than the intervals or off their grid, a restart or an executor joining late do not show a
      steady input as a trend: a delta weighs the position of the middle of its span, x − c. A source's
      is the slope of its received (offered) series, the one its input rate comes from (its processed
      series when it reports none); below the sources the slopes are combined as `demand_input_trends`
      says: a parent held back rather than busy passes its input trend on times its selectivity, any
      other the slope of its emitted series. So the trend is the load's: a rescale's pause and catch-up
      change what is emitted, not what the sources offer. window = 1 gives 0;
    - queue_length: Σ latest queue_len over its executors' samples in the window (the items pending).

    Then congestion (input / processing > congestion_rate) and ETP by the planner's functions, and ETPSum per
    node from the placement. Edge cases: no sample of the topology → every rate and growth 0, no executors,
    no placement, window_start = window_end = 0.0, samples_used 0; a single sample → D is still the full
    window and its counts count only if its incarnation started in the window; zero processing → rates 0,
    true_processing_rate None, congested iff its input is positive.
    """
    check_window_args(window, interval_s, congestion_rate)
    relevant = [s for s in samples if s.vertex in topology.vertices]
    if not relevant:
        return analysis_from_totals(topology, {}, {}, 0.0, 0.0, window, interval_s, congestion_rate)
    end = max(s.ts for s in relevant)
    start = window_start(end, window, interval_s)
    center = trend_center(window)
    counted_after = first_sample_after(start, interval_s)
    incarnations: dict[tuple[str, str, float], list[MetricSample]] = {}
    for s in relevant:
        incarnations.setdefault((s.vertex, s.executor, s.started_at), []).append(s)
    processed: dict[str, int] = {}
    emitted: dict[str, int] = {}
    busy: dict[str, float] = {}
    received: dict[str, int] = {}
    p_trend: dict[str, float] = {}
    e_trend: dict[str, float] = {}
    r_trend: dict[str, float] = {}
    count: dict[str, int] = {}
    first: dict[tuple[str, str], MetricSample] = {}
    last: dict[tuple[str, str], MetricSample] = {}
    for (_, _, started_at), runs in incarnations.items():
        runs.sort(key=sample_order_key)
        prev: MetricSample | None = None
        for s in runs:
            if s.ts > counted_after:
                if prev is not None:
                    dp, de, db = s.processed - prev.processed, s.emitted - prev.emitted, s.busy_s - prev.busy_s
                    dr = s.received - prev.received
                elif started_at >= start:
                    dp, de, db, dr = s.processed, s.emitted, s.busy_s, s.received
                else:
                    dp, de, db, dr = 0, 0, 0.0, 0
                v = s.vertex
                weight = delta_position(s.ts, None if prev is None else prev.ts, started_at, start, interval_s) - center
                processed[v] = processed.get(v, 0) + dp
                emitted[v] = emitted.get(v, 0) + de
                busy[v] = busy.get(v, 0.0) + db
                received[v] = received.get(v, 0) + dr
                p_trend[v] = p_trend.get(v, 0.0) + weight * dp
                e_trend[v] = e_trend.get(v, 0.0) + weight * de
                r_trend[v] = r_trend.get(v, 0.0) + weight * dr
                count[v] = count.get(v, 0) + 1
                key = (v, s.executor)
                if key not in last or _executor_key(s) > _executor_key(last[key]):
                    last[key] = s
                if key not in first or _executor_key(s) < _executor_key(first[key]):
                    first[key] = s
            prev = s
    executors: dict[str, int] = {}
    q_first: dict[str, int] = {}
    q_last: dict[str, int] = {}
    placement: dict[str, str] = {}
    for (v, executor), s in last.items():
        executors[v] = executors.get(v, 0) + 1
        q_last[v] = q_last.get(v, 0) + s.queue_len
        q_first[v] = q_first.get(v, 0) + first[(v, executor)].queue_len
        placement[executor] = s.node
    totals = {
        v: WindowTotals(
            processed=processed[v],
            emitted=emitted[v],
            busy_s=busy[v],
            executors=executors[v],
            received=received[v],
            queue_first=q_first[v],
            queue_last=q_last[v],
            processed_trend=p_trend[v],
            emitted_trend=e_trend[v],
            received_trend=r_trend[v],
            samples=count[v],
        )
        for v in count
    }
    return analysis_from_totals(topology, totals, placement, start, end, window, interval_s, congestion_rate)


def _executor_vertex(executor: str) -> str | None:
    vertex, _, index = executor.rpartition("#")
    return vertex if vertex and index.isdigit() else None


def analysis_from_totals(
    topology: Topology,
    totals: Mapping[str, WindowTotals],
    placement: Mapping[str, str],
    start: float,
    end: float,
    window: int,
    interval_s: float,
    congestion_rate: float,
) -> Analysis:
    """Rates, snapshot, congestion, ETP and ETPSum from per-vertex window totals (both engines end here).

    `placement` maps each live executor to its node. Vertices absent from `totals` had no sample.
    """
    duration = window * interval_s
    empty = WindowTotals()
    tot = {v: totals.get(v, empty) for v in topology.order}
    processing = {v: tot[v].processed / duration for v in topology.order}
    emit = {v: tot[v].emitted / duration for v in topology.order}
    # a source's input is what it was offered (due by its rate): more than it emitted when back-pressure
    # holds it back, less while it drains a backlog (after a pause or a recovery), so the catch-up is not
    # load; a source that reports no offered events is taken to keep up
    offered = {v: (tot[v].received if tot[v].received > 0 else tot[v].processed) / duration for v in topology.sources}
    inputs = derive_input_rates(topology, emit, offered, processing)
    spread = float(window * (window * window - 1)) / 12.0  # Σ (k - c)² over k = 0 .. window-1
    if spread > 0.0:
        scale = interval_s * interval_s * spread
        p_slope = {v: tot[v].processed_trend / scale for v in topology.order}
        e_slope = {v: tot[v].emitted_trend / scale for v in topology.order}
        r_slope = {v: tot[v].received_trend / scale for v in topology.sources}
    else:
        p_slope = dict.fromkeys(topology.order, 0.0)
        e_slope = dict.fromkeys(topology.order, 0.0)
        r_slope = dict.fromkeys(topology.sources, 0.0)
    # a source's trend follows the series its input rate comes from: offered (received) events, unless it
    # reports none (then it is taken to keep up, as for the rate)
    offered_trend = {v: r_slope[v] if tot[v].received > 0 else p_slope[v] for v in topology.sources}
    capacity = {
        v: tot[v].processed * max(tot[v].executors, 1) / tot[v].busy_s for v in topology.order if tot[v].busy_s > 0.0
    }
    trends = demand_input_trends(topology, e_slope, offered_trend, emit, processing, capacity, offered)
    vertices: dict[str, VertexMetrics] = {}
    for v in topology.order:
        t = tot[v]
        vertices[v] = VertexMetrics(
            processing_rate=processing[v],
            emit_rate=emit[v],
            executors=t.executors,
            input_rate=inputs[v],
            busy_fraction=t.busy_s / (duration * t.executors) if t.executors > 0 else 0.0,
            # the vertex's rate with every executor busy: each executor's processed / busy, times executors
            true_processing_rate=capacity.get(v),
            queue_growth=(t.queue_last - t.queue_first) / duration,
            input_trend=trends[v],
            queue_length=float(t.queue_last),
        )
    by_node: dict[str, list[str]] = {}
    for executor, node in placement.items():
        by_node.setdefault(node, []).append(executor)
    position = topology.position
    last = len(topology.order)

    def order(executor: str) -> tuple[int, str, int]:
        vertex = _executor_vertex(executor)
        if vertex is None:
            return (last, executor, -1)
        return (position.get(vertex, last), vertex, int(executor.rpartition("#")[2]))

    nodes = {n: sorted(by_node[n], key=order) for n in sorted(by_node)}
    snapshot = MetricSnapshot(vertices, nodes)
    # the planner's view of the same snapshot: back-pressure-aware when true processing rates are known
    rates = rates_from_snapshot(topology, snapshot)
    congested = congested_vertices(topology, rates.input, rates.processing, congestion_rate, rates.capacity)
    etp = etp_map(topology, processing, congested)
    node_etp = etp_sums(etp, {n: [e for e in ex if _executor_vertex(e) in etp] for n, ex in nodes.items()})
    return Analysis(
        snapshot=snapshot,
        congested={v: v in congested for v in topology.order},
        etp=etp,
        node_etp_sum=node_etp,
        window_start=start,
        window_end=end,
        samples_used=sum(t.samples for t in totals.values()),
    )
