"""`bench/latency.py`, the maths behind the migration benchmark's latency and throughput figures, on hand-made
samples: percentiles of known lists, buckets aligned on the request, a gap's empty buckets, the ratios and the
targets."""

from __future__ import annotations

import pytest

from support.bench_modules import load_bench

latency = load_bench("latency.py")

AT = 1_700_000_000.0  # the rescale request (s since the epoch)


def steady_stream(start_s: float, end_s: float, every_s: float, latency_s: float) -> list[tuple[float, float]]:
    """One sample every `every_s` from AT + start_s (inclusive) to AT + end_s (exclusive), all `latency_s`."""
    n = round((end_s - start_s) / every_s)
    return [(AT + start_s + i * every_s, latency_s) for i in range(n)]


def test_sample_reads_the_entry_id_and_ts() -> None:
    # event 50 at 100 events/s is due 0.5 s after the clock start, whenever the source emitted it
    assert latency.sample("1700000000623-4", 50, 1_700_000_000.1, 100.0) == pytest.approx((1_700_000_000.623, 0.023))
    assert latency.sample(b"1700000000500-0", 0, 1_700_000_000.25, 100.0) == pytest.approx((1_700_000_000.5, 0.25))


def test_the_clock_is_the_earliest_emission_less_the_due_offset_so_a_late_emission_counts_its_wait() -> None:
    # events 0..3 at 10/s from clock 100.0, event 2 emitted 0.3 s late (a paused source)
    emitted = [(0, 100.01), (1, 100.11), (2, 100.5), (3, 100.31)]
    clock = latency.due_clock(emitted, 10.0)
    assert clock == pytest.approx(100.01)
    assert latency.sample("100520-0", 2, clock, 10.0)[1] == pytest.approx(0.31)  # due 100.21, arrived 100.52


def test_nearest_rank_percentiles_of_known_lists() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert latency.percentile(values, 50) == 50.0
    assert latency.percentile(values, 99) == 99.0
    assert latency.percentile(values, 100) == 100.0
    assert latency.percentile(list(reversed(values)), 99) == 99.0  # order does not matter
    assert latency.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert latency.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0  # the lower middle: a measured value
    assert latency.percentile([5.0, 1.0, 9.0], 99) == 9.0  # fewer than 100 values: the maximum
    assert latency.percentile([7.0], 50) == 7.0
    assert latency.percentile([], 99) is None
    with pytest.raises(ValueError):
        latency.percentile([1.0], 0)


def test_buckets_are_aligned_on_the_request() -> None:
    assert latency.bucket_of(AT, AT) == 0
    assert latency.bucket_of(AT + 0.0999, AT) == 0
    assert latency.bucket_of(AT + 0.3, AT) == 3  # on a boundary: the later bucket
    assert latency.bucket_of(AT - 0.001, AT) == -1
    assert latency.bucket_of(AT - 5.0, AT) == -50


def test_every_bucket_is_there_with_its_count_throughput_and_percentiles() -> None:
    samples = [(AT + 0.01, 0.010), (AT + 0.02, 0.030), (AT + 0.05, 0.020), (AT + 0.15, 0.5), (AT - 0.05, 0.004)]
    timeline = latency.buckets(samples, AT, start_s=-0.2, end_s=0.3)
    assert [b.start_s for b in timeline] == pytest.approx([-0.2, -0.1, 0.0, 0.1, 0.2])
    assert [b.count for b in timeline] == [0, 1, 3, 1, 0]
    assert [b.throughput for b in timeline] == pytest.approx([0.0, 10.0, 30.0, 10.0, 0.0])
    first = timeline[2]
    assert (first.p50_s, first.p99_s, first.max_s) == (0.020, 0.030, 0.030)
    assert timeline[0].p99_s is None and timeline[0].max_s is None  # empty: no latency
    assert latency.buckets([(AT + 10.0, 1.0), (AT - 5.01, 1.0)], AT)[0].count == 0  # outside: dropped
    assert len(latency.buckets([], AT)) == 150  # 5 s before, 10 s after


def test_a_300_ms_gap_gives_a_worst_bucket_of_zero() -> None:
    # 100 events/s (10 per bucket) at 20 ms all along, except nothing from +2.0 s to +2.3 s
    samples = steady_stream(-5.0, 2.0, 0.01, 0.020) + steady_stream(2.3, 10.0, 0.01, 0.020)
    summary = latency.summarize(samples, AT)
    assert summary.steady_throughput == pytest.approx(100.0)
    assert summary.worst_throughput == 0.0
    assert summary.throughput_ratio == 0.0
    assert summary.throughput_met is False
    assert summary.steady_worst_throughput == pytest.approx(100.0)  # the steady window has no gap
    assert summary.steady_throughput_ratio == pytest.approx(1.0)
    assert summary.steady_throughput_met is True and summary.steady_p99_met is True
    assert summary.p99_ratio == pytest.approx(1.0)  # the latency did not change
    assert summary.p99_met is True
    timeline = latency.buckets(samples, AT)
    assert [b.count for b in timeline if 2.0 - 1e-9 <= b.start_s < 2.3 - 1e-9] == [0, 0, 0]


def test_a_latency_spike_after_the_request_sets_the_p99_ratio_and_the_max() -> None:
    # steady: latencies 1..100 ms, each once per second (100 events/s), so the pooled steady p50 is 50 ms and
    # its p99 99 ms; after: the same, except one bucket at +1.0 s where all ten events wait 250-340 ms
    samples = [
        (AT + second + i * 0.01, 0.25 + i / 100.0 if second == 1 and i < 10 else (i + 1) / 1000.0)
        for second in range(-5, 10)
        for i in range(100)
    ]
    summary = latency.summarize(samples, AT)
    assert summary.steady_p50_s == pytest.approx(0.050)
    assert summary.steady_p99_s == pytest.approx(0.099)
    assert summary.during_p99_s == pytest.approx(0.34)  # the spike bucket's p99: its maximum (10 events)
    assert summary.max_s == pytest.approx(0.34)
    assert summary.p99_ratio == pytest.approx(0.34 / 0.099)
    assert summary.p99_met is False
    assert summary.throughput_ratio == pytest.approx(1.0)
    assert summary.throughput_met is True
    # with no rescale the worst bucket's p99 is already above the pooled one: the steady window's buckets
    # each hold ten consecutive latencies, the last of them 91..100 ms
    assert summary.steady_worst_p99_s == pytest.approx(0.100)
    assert summary.steady_p99_ratio == pytest.approx(0.100 / 0.099)
    assert summary.steady_p99_met is True


def test_the_targets_and_their_edges() -> None:
    ok = latency.Summary(0.01, 0.02, 0.04, 0.05, 100.0, 90.0, 0.03, 80.0)
    assert ok.p99_ratio == pytest.approx(2.0) and ok.p99_met is True  # exactly 2x: met
    assert ok.throughput_ratio == pytest.approx(0.9) and ok.throughput_met is True  # exactly 90 %: met
    assert ok.steady_p99_met is True and ok.steady_throughput_met is False  # 0.03 / 0.02; 80 / 100
    bad = latency.Summary(0.01, 0.02, 0.0401, 0.05, 100.0, 89.9, 0.0401, 90.0)
    assert bad.p99_met is False and bad.throughput_met is False
    assert bad.steady_p99_met is False and bad.steady_throughput_met is True
    empty = latency.summarize([], AT)
    assert empty.steady_p99_s is None and empty.p99_ratio is None and empty.p99_met is None
    assert empty.steady_throughput == 0.0 and empty.throughput_ratio is None and empty.throughput_met is None
    assert latency.share_met([True, True]) == "yes"
    assert latency.share_met([False, None]) == "no"
    assert latency.share_met([True, False, True, None]) == "2 of 3 runs"
    assert latency.share_met([None]) == "-"
