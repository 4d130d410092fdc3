"""The sources' and sinks' rates around a migration, and when the output came back to its level.

`rate_timeline` turns metric samples into input and output rates per bucket (the curves of the CCR paper's
Fig. 7); `recovery_times` reads the catch-up and stabilization times off the output curve, as the paper
measures them, against the level before the request (bench/migration.py per run). `recovery` does the same
against the level the output actually settles at: a scale that changes what a congested topology can deliver
moves that level (1,887/s to 2,833/s), and measured against the old level the output is "not stable" for good;
`control.catch_up` reports it after each rescale, saying which reference it used.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from elastream.core.metrics import MetricSample

#: what catch-up and stabilization are measured against: the output's level before the request, or the new
#: level it settled at after the pause (the scale changed what the topology delivers)
Reference = Literal["before", "newLevel"]


def rate_timeline(
    samples: Iterable[MetricSample],
    sources: Iterable[str],
    sinks: Iterable[str],
    at: float = 0.0,
    bucket_s: float = 0.5,
    offered: bool = False,
) -> dict[str, list[tuple[float, float]]]:
    """Input (the sources' processing rate) and output (the sinks') per `bucket_s`, times relative to `at`:
    the curves of the CCR paper's Fig. 7 and what `recovery_times` reads. With `offered`, also the sources'
    offered rate (their `received` counter: what their input offered them, emitted or not), on the same time
    axis: a source emitting less than it is offered is held back by a congested topology, one emitting more
    is working off a backlog (what `recovery` tells a new level from a transient by). Rates come from consecutive
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
    if offered:
        series["offered"] = {}
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
            if offered and kind == "input":
                received = (sample.received - old.received) / (sample.ts - old.ts)
                series["offered"].setdefault(bucket, {}).setdefault(key, []).append(received)
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
    after = _after_pause(output, migrated_at, resumed_at)
    if not before or not after:
        return None, None
    reference = statistics.median(before)
    if reference <= 0.0:
        return None, None
    return _times_against(after, reference, migrated_at, tolerance, hold)


@dataclass(frozen=True)
class Recovery:
    """Catch-up and stabilization (seconds after the request; None: not reached) and what they are measured
    against: `recovery`'s answer."""

    catch_up: float | None
    stabilization: float | None
    #: "newLevel" when the output settled at a level more than the tolerance away from `level_before`;
    #: "before" otherwise, also while the output has not settled yet (`final` says when it has)
    reference: Reference
    #: the sinks' output before the request (the median of its points), events/s; None: no point before it
    level_before: float | None
    #: the level the output settled at after the pause, events/s; None: not settled (yet)
    level_after: float | None
    #: whether the sources were offered more than they emitted before the request (the topology held them
    #: back: congested); None when the samples tell no offered rate
    congested_before: bool | None = None

    @property
    def final(self) -> bool:
        """Whether more output cannot change the answer: the output settled, so the reference is decided, and
        it stabilized against that reference."""
        return self.level_after is not None and self.stabilization is not None


def recovery(
    output: Sequence[tuple[float, float]],
    migrated_at: float = 0.0,
    tolerance: float = 0.1,
    hold: int = 3,
    resumed_at: float | None = None,
    emitted: Sequence[tuple[float, float]] = (),
    offered: Sequence[tuple[float, float]] = (),
) -> Recovery:
    """Catch-up and stabilization as `recovery_times` measures them, against the level the output settles at
    when a scale moved it. A scale-out of a congested topology raises what its sinks deliver (from 1,887/s to
    2,833/s while the sources offer 3,200/s), a scale-in can lower it: the level before the request is not the
    one the output comes back to, and measured against it the output never stabilizes.

    The level after the pause is known (`level_after`, the median of the points) once `hold` + 1 points in a
    row lie within ±`tolerance` of the level before, or within `tolerance` x their median of each other
    (largest minus smallest: an output still rising through the old level is not a level); the first such run
    gives it, so a later read with more output finds the same. The newest point is left out (read live, its
    bucket may hold only some executors' samples yet), and no point may be one where the sources emit more
    than `tolerance` above what they are offered: they are working off the backlog the pause left, a
    transient, not a level. When the settled level differs from the level before by more than
    `tolerance` (or there was no output before), catch-up and stabilization are measured against it
    ("newLevel"), otherwise against the level before, exactly as `recovery_times` does ("before", also while
    the level is not known yet).

    `emitted` and `offered` are the sources' emitted and offered rates on the output's time axis
    (`rate_timeline`'s "input" and "offered"); they also tell whether the topology was congested before the
    request (`congested_before`). Without an offered rate (none given, or all zero: sources that do not tell
    it) the decision rests on the output alone, and a long backlog worked off at a higher rate can read as a
    new level."""
    before = [rate for t, rate in output if t < migrated_at]
    after = _after_pause(output, migrated_at, resumed_at)
    level_before = statistics.median(before) if before else None
    draining = _draining(emitted, offered, tolerance)
    level_after = _settled_level(after, tolerance, hold, draining, level_before)
    congested_before = _congested_before(emitted, offered, migrated_at, tolerance)
    if level_after is not None and (
        level_before is None or level_before <= 0.0 or abs(level_after - level_before) > tolerance * level_before
    ):
        catch_up, stable = _times_against(after, level_after, migrated_at, tolerance, hold)
        return Recovery(catch_up, stable, "newLevel", level_before, level_after, congested_before)
    catch_up, stable = recovery_times(output, migrated_at, tolerance, hold, resumed_at)
    return Recovery(catch_up, stable, "before", level_before, level_after, congested_before)


def _after_pause(
    output: Sequence[tuple[float, float]], migrated_at: float, resumed_at: float | None
) -> list[tuple[float, float]]:
    start = migrated_at if resumed_at is None else max(migrated_at, resumed_at)
    return [(t, rate) for t, rate in output if t >= start]


def _times_against(
    after: Sequence[tuple[float, float]], reference: float, migrated_at: float, tolerance: float, hold: int
) -> tuple[float | None, float | None]:
    """Catch-up (the first point back to at least (1 - tolerance) x `reference`) and stabilization (the first
    of `hold` points in a row within ±tolerance of it), in seconds after `migrated_at`."""
    catch_up = next((t - migrated_at for t, rate in after if rate >= (1.0 - tolerance) * reference), None)
    stable: float | None = None
    for i in range(len(after) - hold + 1):
        window = after[i : i + hold]
        if all(abs(rate - reference) <= tolerance * reference for _, rate in window):
            stable = window[0][0] - migrated_at
            break
    return catch_up, stable


def _settled_level(
    after: Sequence[tuple[float, float]],
    tolerance: float,
    hold: int,
    draining: set[float],
    level_before: float | None,
) -> float | None:
    """The median of the first `hold` + 1 points in a row (the newest point left out) where none is a backlog
    worked off and they either all lie within ±tolerance of `level_before` (back at the old level, as steady
    as `recovery_times` asks) or agree within `tolerance` x their median (`recovery`); None when no such run
    has come yet, or when its level is no output. The first such run, so that a later read of the same
    output, with more points after it, finds the same level."""
    points = list(after[:-1])
    for i in range(len(points) - hold):
        window = points[i : i + hold + 1]
        if any(t in draining for t, _ in window):
            continue
        rates = [rate for _, rate in window]
        level = statistics.median(rates)
        if level <= 0.0:
            continue
        if level_before is not None and all(abs(rate - level_before) <= tolerance * level_before for rate in rates):
            return level
        if max(rates) - min(rates) <= tolerance * level:
            return level
    return None


def _draining(
    emitted: Sequence[tuple[float, float]], offered: Sequence[tuple[float, float]], tolerance: float
) -> set[float]:
    """The times at which the sources emitted more than `tolerance` above what they were offered."""
    offered_at = dict(offered)
    return {t for t, rate in emitted if offered_at.get(t, 0.0) > 0.0 and rate > (1.0 + tolerance) * offered_at[t]}


def _congested_before(
    emitted: Sequence[tuple[float, float]],
    offered: Sequence[tuple[float, float]],
    migrated_at: float,
    tolerance: float,
) -> bool | None:
    """Whether the sources emitted more than `tolerance` less than they were offered before the request (the
    medians of both); None when no offered rate is known there."""
    offered_before = [rate for t, rate in offered if t < migrated_at]
    emitted_before = [rate for t, rate in emitted if t < migrated_at]
    if not emitted_before or not any(rate > 0.0 for rate in offered_before):
        return None
    return statistics.median(offered_before) > (1.0 + tolerance) * statistics.median(emitted_before)


def reference_phrase(reference: str | None, level_before: float | None, level_after: float | None) -> str:
    """What catch-up and stabilization were measured against, for a line a user reads: "the new level 2,833/s
    (the scale raised the output from 1,887/s)" or "the level before, 1,887/s"."""
    if reference == "newLevel" and level_after is not None:
        if level_before is None or level_before <= 0.0:
            return f"the new level {level_after:,.0f}/s (no output before the request)"
        moved = "raised" if level_after > level_before else "lowered"
        return f"the new level {level_after:,.0f}/s (the scale {moved} the output from {level_before:,.0f}/s)"
    return "the level before" + ("" if level_before is None else f", {level_before:,.0f}/s")
