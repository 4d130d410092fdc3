"""What users feel around a rescale, from what the sinks wrote: end-to-end latency and sink throughput in
100 ms buckets, relative to the rescale request, and the figures `bench/migration.py` reports from them.

Pure: no Redis, no clock. A *sample* is one sink entry as ``(arrival_s, latency_s)``: its arrival time in
seconds since the epoch (the first part of its Redis stream entry ID, the Redis server's clock in ms when
the entry was written) and its latency, arrival less the time the event was *due* at its source (same
machine clock). Not its `ts` field: that is when the source emitted it, and a source paused by a migration
emits what fell due meanwhile late, stamped late, so the pause would not show. A synthetic source's event
`id` is due at ``clock + id / rate`` (its sequence over all lanes, at the vertex's rate, from the sources'
clock start); `due_clock()` finds that start as the earliest ``ts - id / rate`` (no event is emitted before
it is due). `sample()` makes one from an entry.

Buckets are `BUCKET_S` wide and aligned on the request: bucket k holds the entries that arrived in
``[at + k * BUCKET_S, at + (k + 1) * BUCKET_S)``. The steady state is the `STEADY_S` before the request
(buckets -50..-1), the rescale the `AFTER_S` after it (buckets 0..99).

- steady p50 / p99: percentiles of every entry that arrived in the steady window (pooled, not per bucket);
- p99 during the rescale: the worst (highest) per-bucket p99 in the `AFTER_S` after, over the buckets that
  received something (an empty bucket has no latency: it shows up in the throughput);
- max latency: the highest latency of any entry that arrived in the `AFTER_S` after;
- steady throughput: the mean of the steady window's per-bucket throughputs (events/s), empty buckets
  counting 0; the worst bucket is the lowest per-bucket throughput in the `AFTER_S` after, empty ones
  included (a 300 ms gap gives 0);
- the same worst-bucket figures over the steady window itself (`steady_worst_*`): how far a window's worst
  bucket is from its pooled figure with no rescale at all, the noise floor the targets are read against.

Percentiles are nearest-rank: the p-th percentile of n values is the ceil(p/100 * n)-th smallest (p99 of
fewer than 100 values is their maximum), always a value that was measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: bucket width (s)
BUCKET_S = 0.1
#: the steady state: this long before the rescale request (s)
STEADY_S = 5.0
#: the rescale: this long after the request (s)
AFTER_S = 10.0
#: the issue's targets: p99 during a rescale at most this many times the steady p99 ...
P99_TARGET = 2.0
#: ... and the worst bucket's throughput at least this share of the steady throughput
THROUGHPUT_TARGET = 0.9

#: (arrival time, s since the epoch; latency, s)
Sample = tuple[float, float]


def arrival_s(entry_id: str | bytes) -> float:
    """When a stream entry was written: its ID's first part (``"<ms>-<seq>"``), in seconds."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0]) / 1000.0


def due_clock(emitted: Iterable[tuple[int, float]], rate: float) -> float:
    """The sources' clock start from ``(id, ts)`` pairs: the earliest ``ts - id / rate``."""
    return min(ts - event_id / rate for event_id, ts in emitted)


def sample(entry_id: str | bytes, event_id: int, clock: float, rate: float) -> Sample:
    """One sink entry as a sample: ``entry_id`` is its stream ID, ``event_id`` its `id`, due at
    ``clock + event_id / rate``."""
    arrival = arrival_s(entry_id)
    return arrival, arrival - (clock + event_id / rate)


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (the ceil(p/100 * n)-th smallest value); None for no values."""
    if not values:
        return None
    if not 0.0 < p <= 100.0:
        raise ValueError(f"percentile {p} outside (0, 100]")
    ordered = sorted(values)
    rank = math.ceil(p / 100.0 * len(ordered) - 1e-9)  # the tolerance keeps 99/100*100 at rank 99
    return ordered[max(rank, 1) - 1]


def bucket_of(arrival: float, at: float, bucket_s: float = BUCKET_S) -> int:
    """The index of the bucket (aligned on `at`) an arrival falls in; negative before `at`."""
    # an arrival on a boundary (at + 0.3 may come out as 2.99999... buckets) falls in the later bucket: within
    # 1 µs, far below the arrivals' 1 ms resolution and above a float's error on epoch seconds (~0.2 µs)
    return math.floor((arrival - at + 1e-6) / bucket_s)


@dataclass(frozen=True)
class Bucket:
    """One bucket: `start_s` relative to the request, what arrived in it, and its latency percentiles (s)."""

    start_s: float
    count: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    width_s: float = BUCKET_S

    @property
    def throughput(self) -> float:
        """Events/s in this bucket."""
        return self.count / self.width_s


def _grouped(
    samples: Iterable[Sample], at: float, start_s: float, end_s: float, bucket_s: float
) -> dict[int, list[float]]:
    """The latencies of every bucket index from `start_s` to `end_s`, empty ones included."""
    first, last = round(start_s / bucket_s), round(end_s / bucket_s)
    latencies: dict[int, list[float]] = {k: [] for k in range(first, last)}
    for arrival, latency in samples:
        k = bucket_of(arrival, at, bucket_s)
        if first <= k < last:
            latencies[k].append(latency)
    return latencies


def _bucket(k: int, values: list[float], bucket_s: float) -> Bucket:
    return Bucket(
        start_s=k * bucket_s,
        count=len(values),
        p50_s=percentile(values, 50),
        p99_s=percentile(values, 99),
        max_s=max(values, default=None),
        width_s=bucket_s,
    )


def buckets(
    samples: Iterable[Sample],
    at: float,
    start_s: float = -STEADY_S,
    end_s: float = AFTER_S,
    bucket_s: float = BUCKET_S,
) -> list[Bucket]:
    """Every bucket from `start_s` to `end_s` (relative to the request at `at`), empty ones included."""
    return [
        _bucket(k, values, bucket_s) for k, values in sorted(_grouped(samples, at, start_s, end_s, bucket_s).items())
    ]


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference; None when either is missing or the reference is 0."""
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


@dataclass(frozen=True)
class Summary:
    """The figures of one run (latencies in s, throughputs in events/s); None where nothing arrived."""

    steady_p50_s: float | None
    steady_p99_s: float | None
    #: the worst per-bucket p99 in the `AFTER_S` after the request
    during_p99_s: float | None
    #: the highest latency in the `AFTER_S` after the request
    max_s: float | None
    #: mean per-bucket throughput of the steady window
    steady_throughput: float
    #: the lowest per-bucket throughput in the `AFTER_S` after the request
    worst_throughput: float | None
    #: the steady window's own worst bucket p99 and lowest bucket throughput (the noise floor)
    steady_worst_p99_s: float | None
    steady_worst_throughput: float | None

    @property
    def p99_ratio(self) -> float | None:
        return ratio(self.during_p99_s, self.steady_p99_s)

    @property
    def throughput_ratio(self) -> float | None:
        return ratio(self.worst_throughput, self.steady_throughput)

    @property
    def steady_p99_ratio(self) -> float | None:
        return ratio(self.steady_worst_p99_s, self.steady_p99_s)

    @property
    def steady_throughput_ratio(self) -> float | None:
        return ratio(self.steady_worst_throughput, self.steady_throughput)

    @property
    def p99_met(self) -> bool | None:
        """p99 during the rescale ≤ `P99_TARGET` × steady (None: not measurable)."""
        r = self.p99_ratio
        return None if r is None else r <= P99_TARGET

    @property
    def throughput_met(self) -> bool | None:
        """The worst bucket ≥ `THROUGHPUT_TARGET` × steady throughput (None: not measurable)."""
        r = self.throughput_ratio
        return None if r is None else r >= THROUGHPUT_TARGET

    @property
    def steady_p99_met(self) -> bool | None:
        """The p99 target held by the steady window's own worst bucket (no rescale)."""
        r = self.steady_p99_ratio
        return None if r is None else r <= P99_TARGET

    @property
    def steady_throughput_met(self) -> bool | None:
        """The throughput target held by the steady window's own worst bucket (no rescale)."""
        r = self.steady_throughput_ratio
        return None if r is None else r >= THROUGHPUT_TARGET


def summarize(
    samples: Iterable[Sample],
    at: float,
    steady_s: float = STEADY_S,
    after_s: float = AFTER_S,
    bucket_s: float = BUCKET_S,
) -> Summary:
    """The figures of one run whose rescale was requested at `at` (seconds since the epoch)."""
    grouped = _grouped(samples, at, -steady_s, after_s, bucket_s)
    before = [_bucket(k, values, bucket_s) for k, values in sorted(grouped.items()) if k < 0]
    after = [_bucket(k, values, bucket_s) for k, values in sorted(grouped.items()) if k >= 0]
    steady = [latency for k, values in grouped.items() if k < 0 for latency in values]
    before_p99 = [b.p99_s for b in before if b.p99_s is not None]
    after_p99 = [b.p99_s for b in after if b.p99_s is not None]
    after_max = [b.max_s for b in after if b.max_s is not None]
    return Summary(
        steady_p50_s=percentile(steady, 50),
        steady_p99_s=percentile(steady, 99),
        during_p99_s=max(after_p99, default=None),
        max_s=max(after_max, default=None),
        steady_throughput=sum(b.throughput for b in before) / len(before) if before else 0.0,
        worst_throughput=min((b.throughput for b in after), default=None),
        steady_worst_p99_s=max(before_p99, default=None),
        steady_worst_throughput=min((b.throughput for b in before), default=None),
    )


def share_met(flags: Iterable[bool | None]) -> str:
    """'yes' when every measured run met a target, 'no' when none did, else 'k of n runs'; '-' for none."""
    measured = [f for f in flags if f is not None]
    if not measured:
        return "-"
    met = sum(measured)
    return "yes" if met == len(measured) else "no" if met == 0 else f"{met} of {len(measured)} runs"
