"""Stela's throughput measures (Xu et al., IC2E 2016, section IV-D) over a (time, rate) timeline.

`convergence_time` (how long until the throughput settles after a scale operation) and `time_at_zero`
(the down time, Fig. 8b) are what bench/stela.py reports per planner; the operator does not measure them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def convergence_time(
    output: Sequence[tuple[float, float]],
    reference: float,
    started_at: float = 0.0,
    tolerance: float = 0.05,
    crossings: int = 2,
) -> float | None:
    """Stela's convergence time (Xu et al., IC2E 2016, section IV-D): seconds from `started_at` (the scale
    operation's start) until the throughput stabilizes, i.e. the first point of the timeline from which the
    rate goes `crossings` times above and `crossings` times below `reference` (the post-scale average) with
    a standard deviation of those points within `tolerance` (5 %) of it. None when it never does."""
    if reference <= 0.0:
        return None
    after = [(t, rate) for t, rate in output if t >= started_at]
    for i, (start, _) in enumerate(after):
        above = below = 0
        for j in range(i, len(after)):
            rate = after[j][1]
            above += rate > reference
            below += rate < reference
            if above >= crossings and below >= crossings:
                window = [r for _, r in after[i : j + 1]]
                if statistics.pstdev(window) <= tolerance * reference:
                    return start - started_at
                break
    return None


def time_at_zero(
    output: Sequence[tuple[float, float]], start: float, end: float, bucket_s: float, floor: float = 0.0
) -> float:
    """Seconds of the timeline's buckets in [start, end] whose rate is at most `floor` (the paper's down
    time, Fig. 8b: the time the topology's throughput is zero)."""
    return bucket_s * sum(1 for t, rate in output if start <= t <= end and rate <= floor)
