"""Metric hygiene of the per-interval input series behind `input_trend` (`core.window_analysis.analyze_samples`).

A sample's delta from its previous sample is spread evenly over the intervals it covers, so missing
samples, restarts and rescales do not show a steady input as a trend; and `queue_length` carries the
pending items.
"""

from __future__ import annotations

import pytest

from elastream.core.metrics import MetricSample, MetricSnapshot, SnapshotError
from elastream.core.topology import parse_manifest
from elastream.core.window_analysis import analyze_samples
from support.manifests import edge, manifest, sink, src, work

# window 10 of 1 s intervals ending at ts 20: (10, 20], interval k = (10 + k, 11 + k]
WINDOW = 10


@pytest.fixture
def topo():
    """a -> b -> c (source, worker, sink)."""
    return parse_manifest(manifest([src("a"), work("b", 3), sink("c")], [edge("a", "b"), edge("b", "c")]))


def s(ts, executor, count, *, started_at=0.0, queue_len=0, busy=0.5):
    vertex = executor.split("#")[0]
    return MetricSample(
        ts=float(ts),
        node="n1",
        vertex=vertex,
        executor=executor,
        started_at=float(started_at),
        received=count,
        processed=count,
        emitted=0 if vertex == "c" else count,
        busy_s=busy * (ts - started_at),
        queue_len=queue_len,
    )


def steady(executor, ts_range, per_s, *, started_at=0.0, busy=0.5):
    return [s(t, executor, round(per_s * (t - started_at)), started_at=started_at, busy=busy) for t in ts_range]


def ls_slope(ys, interval_s=1.0):
    """Least-squares slope of a per-interval rate series (tuples/s per second), computed directly."""
    xs = [interval_s * k for k in range(len(ys))]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def trends(result):
    return {v: m.input_trend for v, m in result.snapshot.vertices.items()}


def gap(ts_range, missing):
    return [t for t in ts_range if t not in missing]


def test_steady_executors_with_missing_samples_show_no_trend(topo):
    # four missing samples of each steady executor in the middle of the window (and of the sink)
    samples = steady("a#0", gap(range(1, 21), {13, 14, 15, 16}), 100)
    samples += steady("b#0", gap(range(1, 21), {12, 13, 14, 15}), 100)
    samples += steady("c#0", gap(range(1, 21), {15, 16, 17, 18}), 100)
    result = analyze_samples(topo, samples, window=WINDOW)
    assert (result.window_start, result.window_end) == (10.0, 20.0)
    assert {v: m.processing_rate for v, m in result.snapshot.vertices.items()} == {"a": 100, "b": 100, "c": 100}
    # the gap aligns to intervals: the spread deltas are exactly the missing intervals' counts
    assert trends(result) == {"a": 0.0, "b": 0.0, "c": 0.0}


def test_gap_straddling_the_window_start_spreads_from_interval_0(topo):
    # the previous sample (ts 7) is before the window start: the 600 at ts 13 spread over intervals 0..2
    # (the baseline's counts before the window start count in the window, as for the rates)
    samples = steady("a#0", gap(range(1, 21), {8, 9, 10, 11, 12}), 100)
    result = analyze_samples(topo, samples, window=WINDOW)
    assert result.snapshot.vertices["a"].processing_rate == 130.0
    assert result.snapshot.vertices["a"].input_trend == pytest.approx(ls_slope([200] * 3 + [100] * 7))


def test_samples_sparser_than_intervals_show_no_trend(topo):
    # one sample per second, 0.5 s intervals: every delta covers two intervals (a sawtooth before the fix)
    samples = steady("a#0", range(1, 21), 100)
    result = analyze_samples(topo, samples, window=20, interval_s=0.5)
    assert result.snapshot.vertices["a"].input_trend == 0.0
    assert result.snapshot.vertices["b"].input_trend == 0.0


def test_ramp_keeps_its_slope(topo):
    # interval k (ts 11 + k) gets 10·(k + 1) tuples: a ramp of 10 tuples/s per s
    counts = [0]
    for k in range(WINDOW):
        counts.append(counts[-1] + 10 * (k + 1))
    ts = range(10, 21)
    full = [s(t, "a#0", c) for t, c in zip(ts, counts, strict=True)]
    assert analyze_samples(topo, full, window=WINDOW).snapshot.vertices["a"].input_trend == pytest.approx(10.0)
    # samples at ts 14, 15, 16 missing: the 40 + 50 + 60 + 70 at ts 17 spread over intervals 3..6
    holey = [x for x in full if x.ts not in (14.0, 15.0, 16.0)]
    result = analyze_samples(topo, holey, window=WINDOW)
    expected = ls_slope([10, 20, 30, 55, 55, 55, 55, 80, 90, 100])
    assert trends(result) == pytest.approx({"a": expected, "b": expected, "c": 0.0})  # b: no samples
    assert 9.0 < expected < 10.0


def test_restart_at_an_interval_boundary_shows_no_trend(topo):
    # a#0 restarts at ts 14 (counter reset, new started_at); its first new sample comes only at ts 17
    old = steady("a#0", range(1, 15), 100)
    new = steady("a#0", range(17, 21), 100, started_at=14.0)
    result = analyze_samples(topo, old + new, window=WINDOW)
    assert result.snapshot.vertices["a"].processing_rate == 100.0
    assert result.snapshot.vertices["a"].executors == 1
    assert trends(result)["a"] == 0.0 and trends(result)["b"] == 0.0


def test_restart_with_downtime_shows_the_dip(topo):
    # down during (14, 15]: the new incarnation counts from started_at 15; its first sample (ts 16) covers
    # interval 5 only, so interval 4 is the one without input
    old = steady("a#0", range(1, 15), 100)
    new = steady("a#0", range(16, 21), 100, started_at=15.0)
    result = analyze_samples(topo, old + new, window=WINDOW)
    expected = ls_slope([100, 100, 100, 100, 0, 100, 100, 100, 100, 100])
    assert trends(result) == pytest.approx({"a": expected, "b": expected, "c": 0.0})  # b: no samples
    # the same restart whose first sample is late (ts 18): its counts spread over intervals 5..7 alike
    late = [x for x in new if x.ts >= 18.0]
    assert trends(analyze_samples(topo, old + late, window=WINDOW)) == pytest.approx(trends(result))


@pytest.mark.parametrize("busy", [0.5, 1.0])
def test_a_rescale_mid_window_is_a_trend_only_where_it_limits_what_passes(topo, busy):
    # a offers 150/s; to a b busy all the time, 200/s: more than b's executors can take (169/s)
    a = steady("a#0", range(1, 21), 150 if busy < 1.0 else 200)
    b = steady("b#0", range(1, 21), 50, busy=busy)
    # b#1 leaves after its ts-13 report; b#2 starts at ts 15 and first reports at ts 18 (two missing)
    b += steady("b#1", range(1, 14), 50, busy=busy) + steady("b#2", range(18, 21), 50, started_at=15.0, busy=busy)
    result = analyze_samples(topo, a + b, window=WINDOW)
    b_metrics = result.snapshot.vertices["b"]
    assert b_metrics.executors == 3
    # b emits 100/s up to ts 13, 50/s in (13, 15], 100/s from 15 on
    assert b_metrics.processing_rate == (500 + 150 + 250) / 10
    assert result.snapshot.vertices["a"].input_trend == 0.0 and b_metrics.input_trend == 0.0
    if busy < 1.0:
        # b had headroom: it passes on the load it is offered, and a offers a steady 150/s: the dip in what b
        # emitted is the rescale, not the load, and is no trend of c's input
        assert result.snapshot.vertices["c"].input_trend == pytest.approx(0.0)
    else:
        # b was busy all the time and short of its load: what it emitted is what c could get, and its dip
        # is c's input trend
        expected = ls_slope([100, 100, 100, 50, 50, 100, 100, 100, 100, 100])
        assert result.snapshot.vertices["c"].input_trend == pytest.approx(expected)


def test_queue_length_is_the_latest_pending_items_summed_over_executors(topo):
    samples = [s(t, "b#0", 10 * t, queue_len=t) for t in range(1, 21)]
    samples += [s(t, "b#1", 10 * t, queue_len=100 - t) for t in range(1, 19)]  # last report at ts 18
    samples += [s(t, "a#0", 20 * t) for t in range(1, 21)]
    result = analyze_samples(topo, samples, window=WINDOW)
    b = result.snapshot.vertices["b"]
    assert b.queue_length == 20 + 82
    assert result.snapshot.vertices["a"].queue_length == 0.0
    assert result.snapshot.vertices["c"].queue_length == 0.0  # no samples
    data = result.snapshot.to_dict()
    assert data["vertices"]["b"]["queue_length"] == 102.0
    assert MetricSnapshot.from_dict(data) == result.snapshot
    bad = {"vertices": {"b": {"processing_rate": 1.0, "emit_rate": 1.0, "queue_length": -1}}}
    with pytest.raises(SnapshotError, match="queue_length: -1 is negative"):
        MetricSnapshot.from_dict(bad)
    absent = MetricSnapshot.from_dict({"vertices": {"b": {"processing_rate": 1.0, "emit_rate": 1.0}}})
    assert absent.vertices["b"].queue_length is None
    assert "queue_length" not in absent.to_dict()["vertices"]["b"]


def test_the_autoscaler_decides_the_same_on_a_window_with_gaps_restarts_and_a_rescale(topo):
    # what the policies read (rates, true rates, pending, trend) must not change with the window's holes: a
    # steady pipeline at 100/s, each executor busy half the time, decided on a complete window and on ones
    # with missing samples, a restart at an interval boundary and an executor replaced mid-window
    from elastream.core.autoscaling.autoscale_policy import evaluate
    from elastream.core.autoscaling.rules_policy import evaluate_rules

    def decide(samples):
        snapshot = analyze_samples(topo, samples, window=WINDOW).snapshot
        auto = evaluate(topo, snapshot, {"a": 1, "b": 1, "c": 1}, float(WINDOW))
        rules = evaluate_rules(topo, snapshot, {"a": 1, "b": 1, "c": 1}, 1)
        return (
            {v: (round(e.lal or 0.0, 6), e.activity, e.decision, e.target) for v, e in auto.vertices.items()},
            (rules.node_delta, dict(rules.parallelism), round(rules.total_capacity, 6)),
        )

    full = steady("a#0", range(1, 21), 100) + steady("b#0", range(1, 21), 100) + steady("c#0", range(1, 21), 100)
    expected = decide(full)
    assert expected[0]["b"][1] == "medium"  # 1000 per window against 2000 of capacity: LAL 0.5
    holes = steady("a#0", gap(range(1, 21), {13, 14, 15, 16}), 100)
    holes += steady("b#0", gap(range(1, 21), {12, 13, 14, 15}), 100)
    holes += steady("c#0", gap(range(1, 21), {15, 16, 17, 18}), 100)
    assert decide(holes) == expected
    restarted = steady("a#0", range(1, 15), 100) + steady("a#0", range(17, 21), 100, started_at=14.0)
    restarted += steady("b#0", range(1, 21), 100) + steady("c#0", range(1, 21), 100)
    assert decide(restarted) == expected
    # b#0 replaced by b#1 at ts 15 (a rescale that moved it): the vertex keeps one executor's worth of rate
    replaced = steady("a#0", range(1, 21), 100) + steady("b#0", range(1, 16), 100)
    replaced += steady("b#1", range(16, 21), 100, started_at=15.0) + steady("c#0", range(1, 21), 100)
    auto, _ = decide(replaced)
    assert auto["b"][1:] == ("medium", "nothing", 1)


def test_a_source_draining_a_backlog_is_no_trend_and_no_load(topo):
    # a is offered a steady 100/s; after a pause it emits 300/s for two intervals (its backlog) and then
    # 100/s: b (with headroom) sees the burst, but the load it is offered has neither trend nor burst
    a, b = [], []
    emitted = 0
    for t in range(1, 21):
        emitted += 300 if t in (12, 13) else (0 if t in (10, 11) else 100)
        a.append(MetricSample(float(t), "n1", "a", "a#0", 0.0, 100 * t, emitted, emitted, 0.1 * t, 0))
        b.append(MetricSample(float(t), "n1", "b", "b#0", 0.0, emitted, emitted, emitted, 0.3 * t, 0))
    result = analyze_samples(topo, a + b, window=WINDOW)
    vertices = result.snapshot.vertices
    assert vertices["a"].input_rate == pytest.approx(100.0) and vertices["a"].input_trend == pytest.approx(0.0)
    assert vertices["b"].input_rate == pytest.approx(130.0)  # measured: what a emitted in the window
    assert vertices["b"].input_trend == pytest.approx(0.0)  # the emitted series falls from 300 to 100
    from elastream.core.metrics import offered_load

    assert offered_load(topo, result.snapshot)["b"] == pytest.approx(100.0)


def test_samples_on_the_window_boundaries_read_steady_whatever_their_last_bits(topo):
    # one worker samples exactly on the grid the window's end makes, its clock a few ulps either side
    for wobble in (-2e-7, 0.0, 2e-7):
        samples = [s(1000.0 + t + (wobble if t % 2 else -wobble), "a#0", 200 * t) for t in range(1, 21)]
        result = analyze_samples(topo, samples, window=5)
        vertex = result.snapshot.vertices["a"]
        assert vertex.input_rate == pytest.approx(200.0, rel=1e-3), wobble
        assert vertex.input_trend == pytest.approx(0.0, abs=0.1), wobble


def test_samples_late_on_the_grid_read_steady(topo):
    # two workers sample on the same grid (`worker.next_grid_time`), each a few to 50 ms late, the window
    # ending at the newest: a steady 100/s each reads steady
    a = [s(t + (0.003 if t % 3 else 0.05), "a#0", 100 * t) for t in range(1, 31)]
    a += [s(t + (0.02 if t % 2 else 0.001), "a#1", 100 * t) for t in range(1, 31)]
    result = analyze_samples(topo, a, window=10)
    assert result.snapshot.vertices["a"].input_rate == pytest.approx(200.0, rel=0.01)
    assert result.snapshot.vertices["a"].input_trend == pytest.approx(0.0, abs=1.0)
    assert result.snapshot.vertices["b"].input_trend == pytest.approx(0.0, abs=1.0)


def test_a_sample_a_little_late_at_the_window_start_is_the_baseline(topo):
    # the window ends at the sink's on-time sample; the source's sample a window earlier woke 2 ms late:
    # counted in the window it added a sixth interval to five (240/s, slope -50/s² at a steady 200/s)
    source = [s(t + (0.002 if t == 5 else 0.0), "a#0", 200 * t) for t in range(1, 11)]
    result = analyze_samples(topo, source, window=5)
    assert result.snapshot.vertices["a"].input_rate == pytest.approx(200.0, rel=0.01)
    assert result.snapshot.vertices["a"].input_trend == pytest.approx(0.0, abs=1.0)


def test_the_hot_window_ends_where_every_reporting_executor_has_reported():
    from elastream.analysis.sources import reported_by_all

    early = [s(t, "a#0", 100 * t) for t in range(1, 11)]  # published up to ts 10
    late = [s(t + 0.5, "b#0", 100 * t) for t in range(1, 10)]  # its ts-9.5 sample is its newest yet
    gone = [s(t, "c#0", 100 * t) for t in range(1, 6)]  # stopped reporting at ts 5
    kept = reported_by_all(early + late + gone, 1.0)
    assert max(x.ts for x in kept) == 9.5  # waits for b, not for c
    assert [x.ts for x in kept if x.executor == "a#0"][-1] == 9.0


def test_a_sample_a_little_late_on_the_grid_is_of_the_watermarks_slot(topo):
    # the source woke 1 ms after the sink at every tick: cut at the sink's instant, the source's last
    # interval was missing (rate 160/s, slope -40/s² at a steady 200/s)
    from elastream.analysis.sources import reported_by_all

    source = [s(t + 0.001, "a#0", 200 * t) for t in range(1, 11)]
    sink = [s(float(t), "b#0", 200 * t) for t in range(1, 11)]
    kept = reported_by_all(source + sink, 1.0)
    assert max(x.ts for x in kept) == 10.001
    result = analyze_samples(topo, kept, window=5)
    assert result.snapshot.vertices["a"].input_rate == pytest.approx(200.0, rel=0.01)
    assert result.snapshot.vertices["a"].input_trend == pytest.approx(0.0, abs=1.0)


def test_workers_sample_on_the_wall_clocks_interval_grid():
    from elastream.runtime.worker import next_grid_time

    assert next_grid_time(1000.3, 1.0) == 1001.0
    assert next_grid_time(1001.0, 1.0) == 1002.0  # on the grid: the next one, never the same slot twice
    assert next_grid_time(1000.3, 0.5) == 1000.5 and next_grid_time(7.9, 2.0) == 8.0
