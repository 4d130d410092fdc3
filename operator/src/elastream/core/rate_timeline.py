"""The sources' and sinks' rates around a migration, and when the output came back to its level.

`rate_timeline` turns metric samples into input and output rates per bucket (the curves of the CCR paper's
Fig. 7); `recovery_times` reads the catch-up and stabilization times off the output curve, as the paper
measures them (`control.catch_up` reports them after each rescale, bench/migration.py per run).
"""

from __future__ import annotations

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
    of zero, not gaps to draw across."""
    source_set, sink_set = set(sources), set(sinks)
    series: dict[str, dict[float, float]] = {"input": {}, "output": {}}
    previous: dict[tuple[str, float], MetricSample] = {}
    for sample in sorted(samples, key=lambda s: s.ts):
        kind = "input" if sample.vertex in source_set else "output" if sample.vertex in sink_set else None
        if kind is None:
            continue
        key = (sample.executor, sample.started_at)
        old = previous.get(key)
        previous[key] = sample
        if old is not None and sample.ts > old.ts:
            bucket = round((sample.ts - at) / bucket_s) * bucket_s
            rate = (sample.processed - old.processed) / (sample.ts - old.ts)
            series[kind][bucket] = series[kind].get(bucket, 0.0) + rate
    times = [t for rates in series.values() for t in rates]
    if not times:
        return {kind: [] for kind in series}
    first, last = min(times), max(times)
    buckets = [first + bucket_s * i for i in range(round((last - first) / bucket_s) + 1)]
    return {
        kind: [(t, rates.get(round(t / bucket_s) * bucket_s, 0.0)) for t in buckets] for kind, rates in series.items()
    }


def recovery_times(
    output: Sequence[tuple[float, float]], migrated_at: float = 0.0, tolerance: float = 0.1, hold: int = 3
) -> tuple[float | None, float | None]:
    """Catch-up and stabilization time (seconds after `migrated_at`) from an output-rate timeline of
    (time, rate) points, as the CCR paper measures them: the reference is the mean rate before the
    migration; catch-up ends at the first point after it whose rate is back to at least (1 - tolerance) x
    reference; stabilization ends where the rate enters the ±tolerance band and stays there for `hold`
    points. None when the timeline has no such point (or no reference)."""
    before = [rate for t, rate in output if t < migrated_at]
    after = [(t, rate) for t, rate in output if t >= migrated_at]
    if not before or not after:
        return None, None
    reference = sum(before) / len(before)
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
