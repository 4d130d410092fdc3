"""The `MetricSource` of a running topology: the hot window of the Redis metric stream, analysed.

Samples older than `not_before` (the moment the current schedule started running) are ignored, so a window
never mixes executors of a schedule that is gone; the window shrinks to the intervals since then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

from elastream.analysis import Analyzer
from elastream.core.metrics import Analysis, MetricSnapshot
from elastream.core.topology import Topology
from elastream.store.metric_stream import MetricStream


@dataclass
class StreamMetricSource:
    client: redis.Redis
    topology: Topology
    analyzer: Analyzer = field(default_factory=Analyzer)
    interval_s: float = 1.0
    not_before: float = 0.0
    last: Analysis | None = None

    def snapshot(self, window: int) -> MetricSnapshot:
        return self.analyse(window).snapshot

    def analyse(self, window: int) -> Analysis:
        now = time.time()
        since = max(now - (window + 1) * self.interval_s, self.not_before)
        samples = MetricStream(self.client, self.topology.redis_prefix).read_since(since)
        newest = max((s.ts for s in samples), default=now)
        # whole intervals covered since `since`: the window must not reach back before the schedule started
        intervals = max(1, min(window, int((newest - since) / self.interval_s)))
        self.last = self.analyzer.analyze(
            self.topology,
            samples,
            window=intervals,
            interval_s=self.interval_s,
            congestion_rate=self.topology.scaling.congestion_rate,
        )
        return self.last
