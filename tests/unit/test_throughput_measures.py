"""Stela's throughput measures over a (time, rate) timeline (`elastream.sim.throughput_measures`)."""

from __future__ import annotations

from elastream.sim.throughput_measures import convergence_time, time_at_zero


def test_convergence_time_waits_for_two_crossings_each_way_within_five_percent() -> None:
    # before, a dip, an overshoot (above the post-scale average but far from it), then oscillation at ~200
    timeline = [(-1.0, 100.0), (0.0, 0.0), (1.0, 50.0), (2.0, 260.0), (3.0, 190.0)]
    timeline += [(4.0, 205.0), (5.0, 195.0), (6.0, 204.0), (7.0, 198.0)]
    assert convergence_time(timeline, reference=200.0) == 3.0
    # the same points around a post-scale average of 150 never stay within 5 % of it
    assert convergence_time(timeline, reference=150.0) is None
    # never below the average: no oscillation, no convergence
    assert convergence_time([(0.0, 210.0), (1.0, 220.0), (2.0, 230.0)], reference=200.0) is None
    assert convergence_time(timeline, reference=0.0) is None
    # the clock starts at the scale operation, not at the timeline's first point
    assert convergence_time(timeline, reference=200.0, started_at=1.0) == 2.0


def test_time_at_zero_counts_the_buckets_without_throughput_in_the_span() -> None:
    timeline = [(-0.5, 0.0), (0.0, 10.0), (0.5, 0.0), (1.0, 0.0), (1.5, 3.0), (2.0, 0.0)]
    assert time_at_zero(timeline, 0.0, 1.5, bucket_s=0.5) == 1.0
    assert time_at_zero(timeline, 0.0, 2.0, bucket_s=0.5, floor=5.0) == 2.0
