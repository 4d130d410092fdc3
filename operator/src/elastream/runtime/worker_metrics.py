"""The worker's metrics: one `MetricSample` per executor published to Redis every interval, the sources'
positions beside them, the same counters served to Prometheus (`WorkerCollector`), and what the data plane
dropped and refused, logged when it grew.

What the inboxes drop (malformed frames, frames of unchecked connections, control messages no executor sends
in-band) and the handshakes they refuse are counted (`DataPlaneStats`), served as Prometheus counters and
logged, at most every `DATA_PLANE_LOG_S`, when they grew. A metric sample that cannot be published while
Redis is away is skipped (the counters are cumulative: the next one carries it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from elastream.core.metrics import MAX_PROBLEM_CHARS, MetricSample
from elastream.core.ports import Clock
from elastream.core.topology import Topology, split_executor_id
from elastream.runtime.executor import LATENCY_BUCKETS_S, Counters, ExecutorThread
from elastream.runtime.source_thread import SourceThread
from elastream.runtime.transport import DataPlaneStats
from elastream.runtime.worker_state import Generation, RedisStores
from elastream.store.codec import pack
from elastream.store.retry import REDIS, RedisAttempt

log = logging.getLogger("elastream.worker")

#: what the data plane dropped and refused is logged at most this often (when it grew)
DATA_PLANE_LOG_S = 10.0


class MetricsReporting:
    """A worker's metric samples and data-plane log lines. It owns when the data plane was last logged and what
    it said; it may read the running generation's executors (`generation`), the inboxes' counts
    (`data_plane`) and publish through its `stores` (the metric stream, the sources' positions and lags)."""

    def __init__(
        self,
        node: str,
        clock: Clock,
        stores: RedisStores,
        generation: Callable[[], Generation | None],
        data_plane: DataPlaneStats,
    ) -> None:
        self.node = node
        self.clock = clock
        self.stores = stores
        self.generation = generation
        self.data_plane = data_plane
        self._data_plane_logged: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self._data_plane_log_at = 0.0

    def publish_metrics(self) -> None:
        """One sample per executor and the sources' positions, one attempt: while Redis is away the interval's
        sample is skipped (the counters are cumulative: the next one carries it) and the outage logged once."""
        with RedisAttempt(f"node {self.node}: cannot publish metrics", REDIS) as attempt:
            current = self.generation()
            threads = current.threads if current is not None else []
            written = self.stores.metrics.publish(self.samples(threads))
            positions = source_positions(threads)
            self.stores.store.publish_positions(positions)
            lags = partition_lag(threads)
            if lags:
                self.stores.store.publish_partition_lag(lags)
            # Redis answered only if something was written (a staged node has nothing to publish: no proof)
            attempt.reached = bool(written or positions)

    def log_data_plane(self, force: bool = False) -> None:
        """Log what the data plane dropped and refused since the worker started, when it grew since the last
        line, at most every `DATA_PLANE_LOG_S` (never a frame's content or a peer's key)."""
        now = self.clock.monotonic()
        if not force and now < self._data_plane_log_at:
            return
        dropped, refused = self.data_plane.snapshot()
        if (dropped, refused) == self._data_plane_logged:
            return
        self._data_plane_logged, self._data_plane_log_at = (dropped, refused), now + DATA_PLANE_LOG_S
        log.warning(
            "node %s: data plane: %d frames dropped%s, %d handshakes refused%s since start",
            self.node,
            sum(dropped.values()),
            _by_reason(dropped),
            sum(refused.values()),
            _by_reason(refused),
        )

    def samples(self, threads: Iterable[ExecutorThread | SourceThread]) -> Iterable[MetricSample]:
        """One sample of each of `threads`, stamped now."""
        now = self.clock.now()
        for thread in threads:
            c: Counters = thread.counters
            received, queue_len = (
                thread.offered_at(now) if isinstance(thread, SourceThread) else (c.received, max(c.queue_len, 0))
            )
            yield MetricSample(
                ts=now,
                node=self.node,
                vertex=split_executor_id(thread.executor)[0],
                executor=thread.executor,
                started_at=c.started_at,
                received=received,
                processed=c.processed,
                emitted=c.emitted,
                busy_s=round(c.busy_s, 6),
                queue_len=queue_len,
                latency_ms=round(c.take_latency_ms(), 4),
                errors=c.errors,
                problem=connector_problem(thread.operator),
            )


def source_positions(threads: Iterable[ExecutorThread | SourceThread]) -> dict[str, bytes]:
    """The read position of each source of `threads` (`restart` counts what the sources will replay from
    them): a running one's as its own thread last read it (`SourceThread.reported_position`), a stopped one's
    last; a source still waiting for INIT has none yet."""
    positions: dict[str, bytes] = {}
    for thread in threads:
        position = thread.reported_position() if isinstance(thread, SourceThread) else None
        if position is not None:
            positions[thread.executor] = pack(position)
    return positions


def partition_lag(threads: Iterable[ExecutorThread | SourceThread]) -> dict[str, bytes]:
    """The consumer lag per partition of each running kafka source executor of `threads`, packed."""
    lags: dict[str, bytes] = {}
    for thread in threads:
        lag = getattr(thread.operator, "partition_lag", None)
        if isinstance(thread, SourceThread) and thread.opened and callable(lag):
            lags[thread.executor] = pack({int(p): int(n) for p, n in lag().items()})
    return lags


class Scraped(Protocol):
    """What `WorkerCollector` reads of a worker at scrape time."""

    @property
    def topology(self) -> Topology: ...

    @property
    def node(self) -> str: ...

    @property
    def threads(self) -> list[ExecutorThread | SourceThread]: ...

    @property
    def data_plane(self) -> DataPlaneStats: ...


class WorkerCollector:
    """Serves the executors' counters as Prometheus metrics, read at scrape time (no per-event cost): every
    series labelled with the topology's namespace and name, the node, the vertex and the executor (the data
    plane's: namespace, topology and node). A sink's latency histogram is built here from its counters'
    buckets (`Counters.latency_buckets`)."""

    def __init__(self, worker: Scraped) -> None:
        self.worker = worker

    def collect(self) -> Iterable[Any]:
        worker = self.worker
        topology = [worker.topology.namespace, worker.topology.name]
        labels = ["namespace", "topology", "node", "vertex", "executor"]
        families = {
            "received": CounterMetricFamily("elastream_executor_received", "events received", labels=labels),
            "processed": CounterMetricFamily("elastream_executor_processed", "events processed", labels=labels),
            "emitted": CounterMetricFamily("elastream_executor_emitted", "events emitted", labels=labels),
            "errors": CounterMetricFamily("elastream_executor_errors", "operator exceptions", labels=labels),
            "busy_s": CounterMetricFamily("elastream_executor_busy_seconds", "seconds spent processing", labels=labels),
        }
        queued = GaugeMetricFamily("elastream_executor_queued_events", "events waiting in the inbox", labels=labels)
        latency = HistogramMetricFamily(
            "elastream_sink_latency_seconds",
            "end-to-end latency of the events a sink processed: the event's source timestamp to processed",
            labels=labels,
        )
        partition_lag = GaugeMetricFamily(
            "elastream_source_partition_lag",
            "messages in a partition the source has not read yet (its high watermark minus its next offset)",
            labels=[*labels, "topic", "partition"],
        )
        for thread in worker.threads:
            counters = thread.counters
            label_values = [*topology, worker.node, split_executor_id(thread.executor)[0], thread.executor]
            for name, family in families.items():
                family.add_metric(label_values, float(getattr(counters, name)))
            queued.add_metric(label_values, float(max(counters.queue_len, 0)))
            buckets = counters.latency_buckets
            if buckets is not None:
                latency.add_metric(label_values, _cumulative(list(buckets)), counters.latency_total_s)
            lag = getattr(thread.operator, "partition_lag", None)
            if isinstance(thread, SourceThread) and thread.opened and callable(lag):
                topic = str(getattr(thread.operator, "topic", ""))
                for partition, messages in sorted(lag().items()):
                    partition_lag.add_metric([*label_values, topic, str(partition)], float(messages))
        yield from families.values()
        yield queued
        yield latency
        yield partition_lag
        yield from self.data_plane([*topology, worker.node])

    def data_plane(self, label_values: list[str]) -> Iterable[CounterMetricFamily]:
        """What this worker's inboxes dropped and refused, by reason (every reason, 0 until it happens)."""
        dropped_frames, refused_handshakes = self.worker.data_plane.snapshot()
        labels = ["namespace", "topology", "node", "reason"]
        dropped = CounterMetricFamily(
            "elastream_data_plane_dropped_frames",
            "frames the inboxes dropped: malformed, unauthenticated, sender (not its connection's), control "
            "(not an in-band message of an upstream executor)",
            labels=labels,
        )
        refused = CounterMetricFamily(
            "elastream_data_plane_refused_handshakes",
            "connections the inboxes refused: auth (not the topology's key), protocol (no CURVE, another "
            "server key), other",
            labels=labels,
        )
        for reason in ("malformed", "unauthenticated", "sender", "control"):
            dropped.add_metric([*label_values, reason], float(dropped_frames.get(reason, 0)))
        for reason in ("auth", "protocol", "other"):
            refused.add_metric([*label_values, reason], float(refused_handshakes.get(reason, 0)))
        yield dropped
        yield refused


def _cumulative(counts: list[int]) -> list[tuple[str, float]]:
    """A histogram's buckets as Prometheus wants them, `le` and the events at most it, from the counts of each
    bucket of `LATENCY_BUCKETS_S` alone (a copy: the sink goes on counting meanwhile), the last one +Inf."""
    bounds = [*map(floatToGoString, LATENCY_BUCKETS_S), "+Inf"]
    return list(zip(bounds, map(float, accumulate(counts)), strict=True))


def connector_problem(operator: Any) -> str:
    """What a connector operator reports it cannot do now (its `problem`), cut to `MAX_PROBLEM_CHARS` bytes of
    UTF-8 (a metric stream field holds 256)."""
    problem = getattr(operator, "problem", "")
    if not isinstance(problem, str) or not problem:
        return ""
    return problem.encode()[:MAX_PROBLEM_CHARS].decode(errors="ignore")


def _by_reason(counts: Mapping[str, int]) -> str:
    return f" ({', '.join(f'{reason} {n}' for reason, n in sorted(counts.items()))})" if counts else ""
