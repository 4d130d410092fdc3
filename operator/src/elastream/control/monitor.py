"""Live rates from the metric stream: what `elastream run` prints every interval.

`LiveRates` keeps each executor's two newest samples and turns them into per-vertex rates over the last
interval; executors that stopped reporting (older than `stale_s`) drop out. The window analysis for
planning is `elastream.analysis`; this is only the live view.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from elastream.core.metrics import MetricSample
from elastream.core.topology import Topology


@dataclass
class LiveRates:
    topology: Topology
    stale_s: float = 3.0
    newest: dict[str, MetricSample] = field(default_factory=dict)
    previous: dict[str, MetricSample] = field(default_factory=dict)

    def add(self, samples: Iterable[MetricSample]) -> None:
        for sample in samples:
            current = self.newest.get(sample.executor)
            if current is not None and sample.ts <= current.ts:
                continue
            if current is not None:
                self.previous[sample.executor] = current
            self.newest[sample.executor] = sample

    def rates(self) -> dict[str, float]:
        """Per vertex: events processed per second over the last interval, summed over its executors."""
        rates = {v: 0.0 for v in self.topology.order}
        if not self.newest:
            return rates
        horizon = max(s.ts for s in self.newest.values()) - self.stale_s
        for executor, new in self.newest.items():
            if new.ts < horizon or new.vertex not in rates:
                continue
            old = self.previous.get(executor)
            if old is not None and old.started_at == new.started_at and new.ts > old.ts:
                rates[new.vertex] += (new.processed - old.processed) / (new.ts - old.ts)
            elif new.ts > new.started_at:
                rates[new.vertex] += new.processed / (new.ts - new.started_at)
        return rates

    def throughput(self) -> float:
        rates = self.rates()
        return sum(rates[s] for s in self.topology.sinks)

    def latency_ms(self) -> float:
        sinks = [s.latency_ms for s in self.newest.values() if s.vertex in self.topology.sinks and s.latency_ms > 0]
        return sum(sinks) / len(sinks) if sinks else 0.0
