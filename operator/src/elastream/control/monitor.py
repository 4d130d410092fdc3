"""Live rates from the metric stream: what `elastream run` prints every interval.

`LiveRates` keeps each executor's two newest samples and turns them into per-vertex rates over the last
interval; executors that stopped reporting (older than `stale_s`) drop out. The window analysis for
planning is `elastream.analysis`; this is only the live view. It keeps executors of the topology's vertices
only (`<vertex>#<i>`, i below the vertex's maxParallelism), so what it holds is bounded by the topology, not
by the names a worker writes.

`SampleFollower` is the controller tick's read of the metric stream: each new entry once, resumed by entry
id (`MetricStream.read_forward`), at most `FOLLOW_BUDGET_ENTRIES` entries a pass. A start without a position
(an operator restart adopting a running topology) reads the last `lookback_s` only, and a pass that finds
more new entries than its budget skips to the last `lookback_s` of the stream instead of reading the
backlog: the live view needs the newest samples, and a worker that floods its stream costs one bounded pass.
What each pass skipped (malformed and oversized entries) goes to its `report` (the controller's
`control.metrics.SkippedSamples`: a counter and a rate-limited warning event).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from elastream.core.metrics import MetricSample
from elastream.core.ports import SampleFeed
from elastream.core.topology import Topology
from elastream.core.topology.limits import MAX_EXECUTORS
from elastream.core.topology.model import split_executor_id
from elastream.store.metric_stream import StreamRead, id_order, stream_start

#: entries the controller's tick reads of the metric stream at most a pass: four intervals of the most
#: executors a topology may have (a lookback's three, and one to spare)
FOLLOW_BUDGET_ENTRIES = 4 * MAX_EXECUTORS


@dataclass
class LiveRates:
    topology: Topology
    stale_s: float = 3.0
    newest: dict[str, MetricSample] = field(default_factory=dict)
    previous: dict[str, MetricSample] = field(default_factory=dict)

    def add(self, samples: Iterable[MetricSample]) -> None:
        for sample in samples:
            if not self._ours(sample):
                continue
            current = self.newest.get(sample.executor)
            if current is not None and sample.ts <= current.ts:
                continue
            if current is not None:
                self.previous[sample.executor] = current
            self.newest[sample.executor] = sample

    def _ours(self, sample: MetricSample) -> bool:
        """Whether `sample` is of an executor this topology can have."""
        vertex = self.topology.vertices.get(sample.vertex)
        if vertex is None:
            return False
        try:
            name, index = split_executor_id(sample.executor)
        except ValueError:
            return False
        return name == sample.vertex and index < vertex.max_parallelism

    def rates(self) -> dict[str, float]:
        """Per vertex: events processed per second over the last interval, summed over its executors."""
        rates = {v: 0.0 for v in self.topology.order}
        for new in self.fresh():
            if new.vertex not in rates:
                continue
            old = self.previous.get(new.executor)
            if old is not None and old.started_at == new.started_at and new.ts > old.ts:
                rates[new.vertex] += (new.processed - old.processed) / (new.ts - old.ts)
            elif new.ts > new.started_at:
                rates[new.vertex] += new.processed / (new.ts - new.started_at)
        return rates

    def throughput(self) -> float:
        rates = self.rates()
        return sum(rates[s] for s in self.topology.sinks)

    def fresh(self) -> list[MetricSample]:
        """The newest sample of every executor still reporting (within `stale_s` of the newest)."""
        if not self.newest:
            return []
        horizon = max(s.ts for s in self.newest.values()) - self.stale_s
        return [s for s in self.newest.values() if s.ts >= horizon]

    def connector_problems(self) -> dict[str, str]:
        """Executor -> what its connector reports it cannot do, for the executors still reporting."""
        return {s.executor: s.problem for s in sorted(self.fresh(), key=lambda s: s.executor) if s.problem}

    def source_backlog(self) -> dict[str, int]:
        """Per source vertex: the events waiting to be read (a kafka source's consumer lag) over its executors."""
        backlog = dict.fromkeys(self.topology.sources, 0)
        for sample in self.fresh():
            if sample.vertex in backlog:
                backlog[sample.vertex] += max(0, sample.queue_len)
        return backlog

    def latency_ms(self) -> float:
        sinks = [s.latency_ms for s in self.newest.values() if s.vertex in self.topology.sinks and s.latency_ms > 0]
        return sum(sinks) / len(sinks) if sinks else 0.0


@runtime_checkable
class ForwardFeed(Protocol):
    """A feed read by entry id (`MetricStream`): what `SampleFollower` prefers to `SampleFeed.read_since`."""

    def read_forward(self, start: str, max_entries: int | None = None) -> StreamRead: ...

    def newest_id(self) -> str | None: ...


@dataclass
class SampleFollower:
    """The samples added to the metric stream since the last read, each once (see the module's docstring).

    `read(feed, since)`: `since` is where the controller (re)started the topology (seconds, None: not known);
    a `since` other than the last one, or another feed, starts over from it. Feeds without `read_forward`
    (test doubles) are read by time, from just after the newest finite timestamp seen."""

    report: Callable[[StreamRead], None] | None = None
    #: how far back a start without a position, or a pass behind by more than its budget, reads
    lookback_s: float = 5.0
    max_entries: int = FOLLOW_BUDGET_ENTRIES
    #: the last pass's findings (None before the first, or for a feed read by time)
    last: StreamRead | None = None
    _feed: SampleFeed | None = None
    _since: float | None = None
    _start: str | None = None
    _ts: float | None = None

    def read(self, feed: SampleFeed, since: float | None = None) -> list[MetricSample]:
        if since != self._since or feed is not self._feed:
            self._feed, self._since, self._start, self._ts = feed, since, None, None
        if not isinstance(feed, ForwardFeed):
            return self._read_by_time(feed)
        if self._start is None:
            self._start = stream_start(since) if since is not None else self._recent(feed)
        read = feed.read_forward(self._start, self.max_entries)
        self._start = read.next_start
        if read.truncated:
            recent = self._recent(feed)
            if id_order(recent) > id_order(self._start):
                self._start = recent  # the backlog between is skipped unread
        self.last = read
        if self.report is not None:
            self.report(read)
        return read.samples

    def _recent(self, feed: ForwardFeed) -> str:
        """The bound `lookback_s` before the newest entry."""
        newest = feed.newest_id()
        if newest is None:
            return "-"
        ms = id_order(newest)[0]
        return f"{max(0, ms - int(self.lookback_s * 1000))}-0"

    def _read_by_time(self, feed: SampleFeed) -> list[MetricSample]:
        samples = feed.read_since(self._ts if self._ts is not None else self._since)
        finite = [s.ts for s in samples if math.isfinite(s.ts)]
        if finite:
            self._ts = max(finite) + 0.001
        return samples
