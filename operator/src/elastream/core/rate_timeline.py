"""The sources' and sinks' rates around a migration, and when the output came back to its level.

`rate_timeline` turns metric samples into input and output rates per bucket (the curves of the CCR paper's
Fig. 7); `recovery_times` reads the catch-up and stabilization times off the output curve, as the paper
measures them (`control.catch_up` reports them after each rescale, bench/migration.py per run).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from elastream.core.metrics import MetricSample


def rate_timeline(
    samples: Iterable[MetricSample],
    sources: Iterable[str],
    sinks: Iterable[str],
    at: float = 0.0,
    bucket_s: float = 0.5,
) -> dict[str, list[tuple[float, float]]]:
    """Input (the sources' processing rate) and output (the sinks') per `bucket_s`, times relative to `at`:
    the curves of the CCR paper's Fig. 7 and what `recovery_times` reads. Rates come from consecutive
    samples of one executor incarnation; buckets without a sample (workers stopped or starting) are rates
    of zero, not gaps to draw across.

    Buckets lie on the wall clock's grid (multiples of `bucket_s` since the epoch), as the workers sample
    (`runtime.worker.next_grid_time`): a sample a little late for its grid time stays in that time's bucket.
    Buckets placed relative to `at` instead would put a bucket edge wherever `at` falls, and a sample's few
    milliseconds of delay would move it across: two samples in one bucket and none in the next read as twice
    the rate and then nothing. Two samples of one incarnation in one bucket (a late one and its successor)
    count as their mean, not their sum, for the same reason."""
    source_set, sink_set = set(sources), set(sinks)
    #: kind -> bucket index (on the wall clock's grid) -> incarnation -> its rates in that bucket
    series: dict[str, dict[int, dict[tuple[str, float], list[float]]]] = {"input": {}, "output": {}}
    previous: dict[tuple[str, float], MetricSample] = {}
    for sample in sorted(samples, key=lambda s: s.ts):
        kind = "input" if sample.vertex in source_set else "output" if sample.vertex in sink_set else None
        if kind is None:
            continue
        key = (sample.executor, sample.started_at)
        old = previous.get(key)
        previous[key] = sample
        if old is not None and sample.ts > old.ts:
            bucket = grid_index(sample.ts, bucket_s)
            rate = (sample.processed - old.processed) / (sample.ts - old.ts)
            series[kind].setdefault(bucket, {}).setdefault(key, []).append(rate)
    indices = [i for buckets in series.values() for i in buckets]
    if not indices:
        return {kind: [] for kind in series}
    return {
        kind: [
            (i * bucket_s - at, sum(sum(rates) / len(rates) for rates in buckets.get(i, {}).values()))
            for i in range(min(indices), max(indices) + 1)
        ]
        for kind, buckets in series.items()
    }


def grid_index(ts: float, bucket_s: float) -> int:
    """The bucket of the wall clock's grid a sample taken at `ts` belongs to: the grid time at or before it
    (a worker samples at a grid time or a little after, never before; the epsilon absorbs float error in
    `ts / bucket_s` for a sample exactly on a grid time)."""
    return math.floor(ts / bucket_s + 1e-6)


def recovery_times(
    output: Sequence[tuple[float, float]],
    migrated_at: float = 0.0,
    tolerance: float = 0.1,
    hold: int = 3,
    resumed_at: float | None = None,
) -> tuple[float | None, float | None]:
    """Catch-up and stabilization time (seconds after `migrated_at`) from an output-rate timeline of
    (time, rate) points, as the CCR paper measures them: the reference is the rate before the migration;
    catch-up ends at the first point after the pause whose rate is back to at least (1 - tolerance) x
    reference; stabilization ends where the rate enters the ±tolerance band and stays there for `hold`
    points. None when the timeline has no such point (or no reference).

    The reference is the median of the points before `migrated_at`, not their mean: the window before a
    rescale can hold the topology's start (a first bucket of 260/s where the steady rate is 200/s, as workers
    deliver what queued while they started) or a previous rescale's dip, and a mean moved by either more than
    `tolerance` leaves the steady output outside the band for good ("not stable").

    Points are searched from `resumed_at` on (the same time frame; default `migrated_at`): a time at or after
    the migration's pause ended. Between the request and the pause the output still runs at its old level
    (the request's analysis and the migration's prepare phase take seconds), and a point there is neither a
    catch-up nor a stabilization."""
    before = [rate for t, rate in output if t < migrated_at]
    start = migrated_at if resumed_at is None else max(migrated_at, resumed_at)
    after = [(t, rate) for t, rate in output if t >= start]
    if not before or not after:
        return None, None
    reference = statistics.median(before)
    if reference <= 0.0:
        return None, None
    catch_up = next((t - migrated_at for t, rate in after if rate >= (1.0 - tolerance) * reference), None)
    stable: float | None = None
    for i in range(len(after) - hold + 1):
        window = after[i : i + hold]
        if all(abs(rate - reference) <= tolerance * reference for _, rate in window):
            stable = window[0][0] - migrated_at
            break
    return catch_up, stable
