"""The Redis metric stream `<prefix>metrics`: workers append samples, the analysis reads a window.

One stream entry per `MetricSample`, its fields the sample's fields as strings, so any Redis client (and
Spark, through a plain read) can decode it. The stream is capped approximately (MAXLEN ~) so it holds about
an hour of samples: workers size the cap for the executors of their schedule and their interval
(`metric_stream_maxlen`).
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from elastream.core.metrics import MetricSample
from elastream.store.codec import decode_sample

DEFAULT_MAXLEN = 3600 * 200  # an hour of 1 s samples for 200 executors (when the schedule is not known)
#: what the cap keeps at least, however few executors
MIN_MAXLEN = 10_000
HOUR_S = 3600.0


def metric_stream_maxlen(executors: int, interval_s: float, keep_s: float = HOUR_S) -> int:
    """Entries that hold `keep_s` seconds of samples of `executors` executors publishing every `interval_s`."""
    per_second = max(1, executors) / max(interval_s, 0.001)
    return max(MIN_MAXLEN, int(keep_s * per_second + 0.5))


def metric_stream_key(prefix: str) -> str:
    return f"{prefix}metrics"


class MetricStream:
    def __init__(self, client: redis.Redis, prefix: str, maxlen: int = DEFAULT_MAXLEN) -> None:
        self.client = client
        self.key = metric_stream_key(prefix)
        self.maxlen = maxlen

    def publish(self, samples: Iterable[MetricSample]) -> int:
        """Append samples in one pipelined round trip; returns how many were written."""
        pipe = self.client.pipeline(transaction=False)
        count = 0
        for sample in samples:
            fields = {k: str(v) for k, v in sample.to_dict().items()}
            pipe.xadd(self.key, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            count += 1
        if count:
            pipe.execute()
        return count

    def read_since(self, since_ts: float | None = None, count: int | None = None) -> list[MetricSample]:
        """Samples whose `ts` is at or after `since_ts` (all when None), oldest first."""
        start = "-" if since_ts is None else f"{int(since_ts * 1000)}-0"
        entries = self.client.xrange(self.key, min=start, max="+", count=count) or []
        return [decode_sample(fields) for _, fields in entries if fields]

    def read_last(self, count: int) -> list[MetricSample]:
        """The newest `count` samples, oldest first."""
        entries = self.client.xrevrange(self.key, max="+", min="-", count=count) or []
        return [decode_sample(fields) for _, fields in reversed(entries) if fields]
