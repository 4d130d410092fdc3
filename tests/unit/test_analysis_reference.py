"""The Python reference window analysis (`core.window_analysis.analyze_samples`) on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from elastream.core.metrics import MetricSample, MetricSnapshot
from elastream.core.planner import etp_table
from elastream.core.topology import parse_manifest
from elastream.core.window_analysis import analyze_samples
from support.manifests import edge, manifest, sink, src, work


@pytest.fixture
def topo():
    """a -> b -> c (source, worker, sink)."""
    return parse_manifest(manifest([src("a"), work("b", 2), sink("c")], [edge("a", "b"), edge("b", "c")]))


def s(ts, executor, processed, *, started_at=0.0, emitted=None, busy_s=0.0, queue_len=0, node="n1"):
    vertex = executor.split("#")[0]
    return MetricSample(
        ts=float(ts),
        node=node,
        vertex=vertex,
        executor=executor,
        started_at=float(started_at),
        received=processed,
        processed=processed,
        emitted=(0 if vertex == "c" else processed) if emitted is None else emitted,
        busy_s=float(busy_s),
        queue_len=queue_len,
    )


def steady(executor, ts_range, per_s, **kw):
    return [s(t, executor, per_s * t, busy_s=0.5 * t, **kw) for t in ts_range]


def test_steady_rates_window_and_snapshot_fields(topo):
    samples = steady("a#0", range(1, 11), 100) + steady("b#0", range(1, 11), 50) + steady("b#1", range(1, 11), 50)
    samples += steady("c#0", range(1, 11), 100, node="n2")
    result = analyze_samples(topo, samples, window=4, interval_s=1.0)
    assert (result.window_start, result.window_end) == (6.0, 10.0)
    assert result.samples_used == 4 * 4  # ts 7, 8, 9, 10 of four executors
    a, b, c = (result.snapshot.vertices[v] for v in "abc")
    assert (a.processing_rate, a.emit_rate, a.input_rate, a.executors) == (100.0, 100.0, 100.0, 1)
    assert (b.processing_rate, b.input_rate, b.executors) == (100.0, 100.0, 2)
    assert (c.processing_rate, c.emit_rate, c.input_rate) == (100.0, 0.0, 100.0)
    assert a.busy_fraction == 0.5 and b.busy_fraction == 0.5  # 2 s busy in 4 s per executor
    assert a.true_processing_rate == 200.0  # 400 processed in 2 busy seconds
    # b: 400 processed in 4 busy seconds over 2 executors: 100/s each, 200/s with both busy (the vertex's rate,
    # what Stela's projection and the fluid model divide by executors)
    assert b.true_processing_rate == 200.0
    assert a.input_trend == 0.0 and a.queue_growth == 0.0
    assert result.snapshot.placement == {"n1": ["a#0", "b#0", "b#1"], "n2": ["c#0"]}
    assert result.congested == {"a": False, "b": False, "c": False}
    assert result.etp == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert result.node_etp_sum == {"n1": 3.0, "n2": 1.0}


def test_counter_reset_counts_both_incarnations(topo):
    old = steady("a#0", range(1, 8), 10)  # last report at ts 7 (70 processed)
    new = [s(8, "a#0", 5, started_at=7.5), s(9, "a#0", 15, started_at=7.5), s(10, "a#0", 25, started_at=7.5)]
    result = analyze_samples(topo, old + new, window=4)
    # old incarnation: 70 - 60 (baseline at ts 6 = window start); new one started in the window: 25 - 0
    assert result.snapshot.vertices["a"].processing_rate == (10 + 25) / 4
    assert result.snapshot.vertices["a"].executors == 1  # one executor id, two incarnations
    assert result.samples_used == 4


def test_executor_joining_mid_window_counts_from_zero(topo):
    samples = [*steady("b#0", range(1, 11), 10), s(9, "b#1", 20, started_at=8.0), s(10, "b#1", 40, started_at=8.0)]
    result = analyze_samples(topo, samples, window=4)
    b = result.snapshot.vertices["b"]
    assert b.processing_rate == (40 + 40) / 4
    assert b.executors == 2


def test_missing_samples_lose_no_counts(topo):
    # reports only at ts 5 and 10; the baseline is the ts-5 sample (at/before the window start 6)
    samples = [s(5, "a#0", 50), s(10, "a#0", 100)]
    result = analyze_samples(topo, samples, window=4)
    a = result.snapshot.vertices["a"]
    assert a.processing_rate == 50 / 4
    # the 50 is spread over the four intervals it covers (the baseline is before the window start): a steady
    # 12.5/s, no trend (before the spreading all 50 fell in the last interval: a slope of 15 tuples/s per s)
    assert a.input_trend == 0.0
    assert result.snapshot.vertices["b"].input_trend == 0.0  # b's input is a's emit


def test_started_before_window_without_earlier_sample_uses_first_sample_in_window(topo):
    samples = [s(8, "a#0", 80), s(10, "a#0", 100)]  # started at 0, nothing before the window
    result = analyze_samples(topo, samples, window=4)
    assert result.snapshot.vertices["a"].processing_rate == 20 / 4


def test_empty_window_is_all_zero(topo):
    for samples in ([], [MetricSample(1.0, "n1", "zzz", "zzz#0", 0.0, 5, 5, 5, 1.0, 1)]):
        result = analyze_samples(topo, samples, window=4)
        assert (result.window_start, result.window_end, result.samples_used) == (0.0, 0.0, 0)
        for m in result.snapshot.vertices.values():
            assert (m.processing_rate, m.emit_rate, m.input_rate, m.executors) == (0.0, 0.0, 0.0, 0)
            assert (m.busy_fraction, m.true_processing_rate, m.queue_growth, m.input_trend) == (0.0, None, 0.0, 0.0)
        assert result.snapshot.placement == {}
        assert result.congested == {"a": False, "b": False, "c": False}
        assert result.etp == {"a": 0.0, "b": 0.0, "c": 0.0}
        assert result.node_etp_sum == {}


def test_single_sample(topo):
    started_inside = analyze_samples(topo, [s(10, "a#0", 30, started_at=9.0, busy_s=1.5)], window=4)
    a = started_inside.snapshot.vertices["a"]
    assert (started_inside.window_start, started_inside.window_end) == (6.0, 10.0)
    assert a.processing_rate == 30 / 4 and a.executors == 1 and a.busy_fraction == 1.5 / 4
    assert started_inside.snapshot.placement == {"n1": ["a#0"]}
    started_before = analyze_samples(topo, [s(10, "a#0", 30, started_at=1.0)], window=4)
    assert started_before.snapshot.vertices["a"].processing_rate == 0.0
    assert started_before.snapshot.vertices["a"].executors == 1
    assert started_before.samples_used == 1


def test_zero_processing_vertex_is_defined_and_congested(topo):
    samples = steady("a#0", range(1, 11), 100) + [s(t, "b#0", 0, queue_len=10 * t) for t in range(1, 11)]
    samples += steady("c#0", range(1, 11), 0)
    result = analyze_samples(topo, samples, window=4)
    b = result.snapshot.vertices["b"]
    assert (b.processing_rate, b.busy_fraction, b.true_processing_rate) == (0.0, 0.0, None)
    assert b.input_rate == 100.0
    assert b.queue_growth == (100 - 70) / 4  # earliest in-window queue (ts 7) to the latest (ts 10)
    assert result.congested == {"a": False, "b": True, "c": False}
    assert result.etp == {"a": 0.0, "b": 0.0, "c": 0.0}  # no sink throughput


def test_input_trend_is_least_squares_slope(topo):
    # per-interval deltas 10, 20, 30, 40 over (6, 10]: rates 10..40 tuples/s, slope 10 tuples/s per s
    counts = [0, 10, 30, 60, 100]
    samples = [s(6 + i, "a#0", c) for i, c in enumerate(counts)]
    result = analyze_samples(topo, samples, window=4)
    assert result.snapshot.vertices["a"].input_trend == pytest.approx(10.0)
    assert result.snapshot.vertices["b"].input_trend == pytest.approx(10.0)
    # 0.5 s intervals: 8 over (6, 10], each delta spread over the two intervals it covers (0-1, 2-3, 4-5,
    # 6-7) as 10, 20, 30, 40 tuples/s each (not a sawtooth 0, 20, 0, 40, ...)
    half = analyze_samples(topo, samples, window=8, interval_s=0.5)
    xs = [0.5 * k for k in range(8)]
    ys = [10, 10, 20, 20, 30, 30, 40, 40]
    mx, my = sum(xs) / 8, sum(ys) / 8
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    assert half.snapshot.vertices["a"].input_trend == pytest.approx(slope)
    one = analyze_samples(topo, samples, window=1)
    assert one.snapshot.vertices["a"].input_trend == 0.0


def test_back_pressured_source_trend_follows_its_offered_events(topo):
    # the source is offered 100, 110, 120, 130 events per interval over (6, 10] but back-pressure holds it
    # to 100/s: its input rate is the offered rate and so is its trend (+10 tuples/s per s), not the flat
    # processed series (whose slope is 0)
    offered = [0, 100, 210, 330, 460]
    samples = [
        MetricSample(
            6.0 + i,
            "n1",
            "a",
            "a#0",
            0.0,
            received=r,
            processed=100 * i,
            emitted=100 * i,
            busy_s=0.0,
            queue_len=r - 100 * i,
        )
        for i, r in enumerate(offered)
    ]
    result = analyze_samples(topo, samples, window=4)
    a = result.snapshot.vertices["a"]
    assert a.processing_rate == 100.0
    assert a.input_rate == 460 / 4
    assert a.input_trend == pytest.approx(10.0)
    assert a.input_trend > 0.0
    assert result.snapshot.vertices["b"].input_trend == 0.0  # b sees a's flat emit series
    # a source that reports fewer offered than processed events keeps up: its processed series counts
    keeps_up = [
        MetricSample(6.0 + i, "n1", "a", "a#0", 0.0, 0, c, c, 0.0, 0) for i, c in enumerate([0, 10, 30, 60, 100])
    ]
    assert analyze_samples(topo, keeps_up, window=4).snapshot.vertices["a"].input_trend == pytest.approx(10.0)


def test_congestion_and_etp_match_the_planner(topo):
    # b's two executors are busy all the time at 100/s each: 200/s with both busy, against 300/s offered
    busy_b = [s(t, e, 100 * t, busy_s=1.0 * t) for e in ("b#0", "b#1") for t in range(1, 11)]
    samples = steady("a#0", range(1, 11), 300) + busy_b
    samples += steady("c#0", range(1, 11), 200, node="n2")
    result = analyze_samples(topo, samples, window=5, congestion_rate=1.2)
    assert result.congested == {"a": False, "b": True, "c": False}
    assert result.snapshot.vertices["b"].true_processing_rate == 200.0
    # half busy at the same rates, b could do 400/s: held back, not congested
    half = steady("a#0", range(1, 11), 300) + steady("b#0", range(1, 11), 100) + steady("b#1", range(1, 11), 100)
    half += steady("c#0", range(1, 11), 200, node="n2")
    assert analyze_samples(topo, half, window=5, congestion_rate=1.2).congested["b"] is False
    table = etp_table(topo, result.snapshot, 1.2)
    assert result.etp == {v: row.etp for v, row in table.vertices.items()}
    assert result.congested == {v: row.congested for v, row in table.vertices.items()}
    data = result.to_dict(topo)
    assert set(data) == {"vertices", "placement", "etp"}
    assert MetricSnapshot.from_dict(data) == MetricSnapshot.from_dict(result.snapshot.to_dict())
    assert data["etp"]["node_etp_sum"] == result.node_etp_sum
    assert math.isclose(data["etp"]["throughput"], 200.0)


def test_samples_outside_window_are_baselines_only(topo):
    samples = steady("a#0", range(1, 11), 10) + steady("b#0", range(1, 4), 10)  # b#0 stopped long ago
    result = analyze_samples(topo, samples, window=4)
    assert result.snapshot.vertices["b"].executors == 0
    assert "b#0" not in result.snapshot.placement["n1"]


def test_executor_moving_node_is_placed_by_its_latest_sample(topo):
    samples = steady("a#0", range(1, 9), 10) + [s(t, "a#0", 10 * t, started_at=8.5, node="n2") for t in (9, 10)]
    result = analyze_samples(topo, samples, window=4)
    assert result.snapshot.placement == {"n2": ["a#0"]}


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [({"window": 0}, "window"), ({"interval_s": 0.0}, "interval"), ({"congestion_rate": 0.5}, "congestion")],
)
def test_bad_arguments_name_the_fix(topo, kwargs, word):
    with pytest.raises(ValueError, match=word):
        analyze_samples(topo, [], **kwargs)
