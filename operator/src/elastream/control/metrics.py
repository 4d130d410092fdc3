"""The metrics of a running topology: the analysed hot window (`StreamMetricSource`) and the Parquet history
archive the controller appends to (`MetricArchiver`).

`StreamMetricSource` reads the hot window of the Redis metric stream with `analysis.sources.read_hot_window`
(a window of history before the window start, so each incarnation's baseline is found even when samples
are missing). Samples older than `not_before` (the moment the current schedule started running) do not
open the window, so a window never mixes executors of a schedule that is gone; the window shrinks to the
whole intervals since then. It ends where every reporting executor has reported (`reported_by_all`), not
at the newest sample, whose worker may be the only one to have published that interval yet.

`MetricArchiver` copies the stream's new entries to a Parquet archive (a local directory, or any Hadoop URI
through Spark) every `every_s` seconds. Its cursor (the last archived stream entry id) lives in Redis next
to the stream, so a restarted controller continues where the last one stopped; an entry is archived at
least once (a crash between a write and the cursor update repeats that batch; duplicate samples change no
count of the analysis).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import redis
from prometheus_client import Counter

from elastream.analysis import Analyzer
from elastream.analysis.sources import (
    append_parquet,
    hot_window_intervals,
    read_hot_window,
    reported_by_all,
    write_parquet_local,
)
from elastream.core.metrics import MetricSample, MetricSnapshot
from elastream.core.topology import Topology
from elastream.core.window_analysis import Analysis
from elastream.store.codec import decode_sample, optional_text
from elastream.store.metric_stream import MetricStream, metric_stream_key
from elastream.store.registry import redacted

log = logging.getLogger("elastream.control")

#: autoscaler evaluations that raised (analysis or policy): each decided nothing and the topology kept running
AUTOSCALER_EVALUATION_ERRORS = Counter(
    "elastream_autoscaler_evaluation_errors",
    "autoscaler evaluations that raised and decided nothing (the topology kept running), by policy",
    ["policy"],
)

#: where `elastream run` archives the metric stream when `--archive` is not given
ARCHIVE_ENV = "ELASTREAM_METRICS_ARCHIVE"


@dataclass
class StreamMetricSource:
    client: redis.Redis
    topology: Topology
    analyzer: Analyzer = field(default_factory=Analyzer)
    interval_s: float = 1.0
    not_before: float = 0.0
    last: Analysis | None = None

    @property
    def engine(self) -> str | None:
        return self.analyzer.engine_used

    def snapshot(self, window: int) -> MetricSnapshot:
        return self.analyse(window).snapshot

    def analyse(self, window: int) -> Analysis:
        stream = MetricStream(self.client, self.topology.redis_prefix)
        samples = reported_by_all(read_hot_window(stream, window, self.interval_s, self.not_before), self.interval_s)
        intervals = hot_window_intervals(samples, window, self.interval_s, self.not_before)
        self.last = self.analyzer.analyze(
            self.topology,
            samples,
            window=intervals,
            interval_s=self.interval_s,
            congestion_rate=self.topology.scaling.congestion_rate,
        )
        return self.last


def archive_cursor_key(topology: Topology, path: str) -> str:
    """The Redis key holding the last stream entry id archived to `path` (one cursor per archive)."""
    digest = hashlib.sha1(path.encode(), usedforsecurity=False).hexdigest()[:12]
    return f"{topology.redis_prefix}metrics-archived:{digest}"


def local_archive_path(path: str) -> str | None:
    """The local directory of an archive path (plain or file://), None for other URIs (s3a://, hdfs://...)."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return parts.path
    if not parts.scheme or len(parts.scheme) == 1:  # a Windows drive letter is not a scheme
        return path
    return None


@dataclass
class MetricArchiver:
    """Append the metric stream's new samples to the Parquet archive at `path`, every `every_s` seconds.

    A local path is written with pyarrow (one part file per pass, no Spark needed); any other URI through
    Spark (`append_parquet`, the analyzer's session). `start()` runs the passes in a daemon thread;
    `stop()` ends it and runs a last pass, so what the workers reported before they stopped is archived.
    Entries trimmed from the stream (it holds about an hour) before a pass reaches them are not archived.
    """

    client: redis.Redis
    topology: Topology
    path: str
    analyzer: Analyzer | None = None
    every_s: float = 10.0
    batch: int = 50_000
    archived: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def archive_once(self) -> int:
        """Archive every entry after the cursor; returns how many samples were written."""
        with self._lock:
            key = metric_stream_key(self.topology.redis_prefix)
            cursor_key = archive_cursor_key(self.topology, self.path)
            cursor = optional_text(self.client.get(cursor_key))
            written = 0
            while True:
                start = "-" if cursor is None else _next_id(cursor)
                entries = self.client.xrange(key, min=start, max="+", count=self.batch) or []
                if not entries:
                    break
                samples = [decode_sample(fields) for _, fields in entries if fields]
                if samples:
                    self._write(samples)
                cursor = optional_text(entries[-1][0])
                assert cursor is not None
                self.client.set(cursor_key, cursor)
                written += len(samples)
                if len(entries) < self.batch:
                    break
            self.archived += written
            return written

    def _write(self, samples: Sequence[MetricSample]) -> None:
        local = local_archive_path(self.path)
        if local is not None:
            write_parquet_local(samples, local)
            return
        analyzer = self.analyzer or Analyzer()
        spark = analyzer.spark()
        if spark is None:
            raise RuntimeError(f"archiving to {redacted(self.path)} needs Spark: {analyzer.start_failure}")
        append_parquet(spark, samples, self.path)

    def _pass(self) -> None:
        try:
            self.archive_once()
        except Exception as exc:  # the controller keeps running; the next pass retries from the cursor
            log.warning(
                "metric archive %s: pass failed, retrying in %.0f s: %s", redacted(self.path), self.every_s, exc
            )

    def start(self) -> MetricArchiver:
        def loop() -> None:
            while not self._stop.wait(self.every_s):
                self._pass()

        self._thread = threading.Thread(target=loop, name="elastream-metric-archive", daemon=True)
        self._thread.start()
        return self

    def tick(self) -> None:
        """Nothing: the passes run on the archive's own thread (local mode only), because a Spark write
        can take seconds and must not hold the control loop."""

    def stop(self) -> int:
        """Stop the passes, run a last one; returns the samples archived in all."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._pass()
        return self.archived


def _next_id(entry_id: str) -> str:
    """The smallest stream id after `entry_id` (XRANGE's start is inclusive)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"
