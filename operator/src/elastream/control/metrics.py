"""The metrics of a running topology: the analysed hot window (`StreamMetricSource`) and the Parquet history
archive the controller appends to (`MetricArchiver`).

`StreamMetricSource` reads the hot window of the Redis metric stream with `analysis.sources.HotWindow`
(a window of history before the window start, so each incarnation's baseline is found even when samples
are missing; kept between analyses, so each entry is read once, by id, at most `hot_window_budget` of
them). Samples older than `not_before` (the moment the current schedule started running) do not open the
window, so a window never mixes executors of a schedule that is gone; the window shrinks to the
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
    CLOCK_SKEW_S,
    HISTORY_WINDOWS,
    HotWindow,
    append_parquet,
    hot_window_intervals,
    reported_by_all,
    write_parquet_local,
)
from elastream.control.metric_series import series
from elastream.core.metrics import MetricSample, MetricSnapshot
from elastream.core.ports import Clock, EventSink, SystemClock
from elastream.core.status import EventReason
from elastream.core.topology import Topology
from elastream.core.window_analysis import Analysis
from elastream.store.codec import optional_text
from elastream.store.metric_stream import MetricStream, StreamRead, is_entry_id
from elastream.store.registry import redacted

log = logging.getLogger("elastream.control")

#: autoscaler evaluations that raised (analysis or policy): each decided nothing and the topology kept running.
#: Like every per-topology series, made through `metric_series.series` (a deleted topology's are removed)
AUTOSCALER_EVALUATION_ERRORS = Counter(
    "elastream_autoscaler_evaluation_errors",
    "autoscaler evaluations that raised and decided nothing (the topology kept running), by topology and policy",
    ["namespace", "topology", "policy"],
)

#: metric stream entries the controller's live read skipped (`store.metric_stream`), per topology: `malformed`
#: (not a valid sample: NaN, a negative count, a missing field, not a stream at all...) or `oversized` (more
#: fields, or longer ones, than a sample has)
METRIC_SAMPLES_SKIPPED = Counter(
    "elastream_metric_samples_skipped",
    "metric stream entries skipped by the controller's read, by topology and reason (malformed, oversized)",
    ["namespace", "topology", "reason"],
)
#: passes of the controller's live read that found more new entries than their budget and skipped the backlog
METRIC_READS_TRUNCATED = Counter(
    "elastream_metric_reads_truncated",
    "controller reads of a metric stream that met their budget and skipped older entries unread, by topology",
    ["namespace", "topology"],
)
#: at most one MetricSamplesSkipped warning per topology in this many seconds (it says the count since the last)
SKIPPED_EVENT_EVERY_S = 60.0
#: the hot window's read budget: this many intervals of samples of every executor the topology may run
#: (two windows and the clock-skew slack of `analysis.sources`, with room to spare), and within these bounds
HOT_WINDOW_MIN_ENTRIES = 10_000
HOT_WINDOW_MAX_ENTRIES = 1_000_000

#: where `elastream run` archives the metric stream when `--archive` is not given
ARCHIVE_ENV = "ELASTREAM_METRICS_ARCHIVE"


@dataclass
class SkippedSamples:
    """What the controller's live read skipped (`control.monitor.SampleFollower`'s report): counted in
    `METRIC_SAMPLES_SKIPPED` as it happens, and told in a `MetricSamplesSkipped` warning event at most every
    `every_s` seconds per topology, with the count since the last event and the first entry skipped. Each
    entry is counted once: only the live read (which reads each entry once) reports here, not the analysis'
    re-reads of its window."""

    topology: Topology
    events: EventSink
    clock: Clock = field(default_factory=SystemClock)
    every_s: float = SKIPPED_EVENT_EVERY_S
    #: skipped since the last event, by reason; the first problem since then; passes that skipped a backlog
    pending: dict[str, int] = field(default_factory=dict)
    problem: str = ""
    truncated: int = 0
    last_event: float | None = None
    #: skipped in all (this controller's life)
    total: int = 0

    def __call__(self, read: StreamRead) -> None:
        labels = (self.topology.namespace, self.topology.name)
        for reason, count in (("malformed", read.malformed), ("oversized", read.oversized)):
            if count:
                series(METRIC_SAMPLES_SKIPPED, *labels, reason).inc(count)
                self.pending[reason] = self.pending.get(reason, 0) + count
                self.total += count
        if read.truncated:
            series(METRIC_READS_TRUNCATED, *labels).inc()
            self.truncated += 1
        if read.problem and not self.problem:
            self.problem = read.problem
        if not self.pending and not self.truncated:
            return
        now = self.clock.monotonic()
        if self.last_event is not None and now - self.last_event < self.every_s:
            return
        parts = [f"{count} {reason}" for reason, count in sorted(self.pending.items())]
        said = f"skipped {', '.join(parts)} metric stream entries" if parts else ""
        if self.truncated:
            backlog = f"skipped a backlog of entries unread in {self.truncated} reads (more than a read takes)"
            said = f"{said}; {backlog}" if said else backlog
        since = "" if self.last_event is None else f" in the last {now - self.last_event:.0f} s"
        first = f"; first: {self.problem}" if self.problem else ""
        log.warning("%s/%s: %s%s%s", *labels, said, since, first)
        self.events.emit(EventReason.METRIC_SAMPLES_SKIPPED, f"{said}{since}{first}", warning=True)
        self.pending, self.problem, self.truncated, self.last_event = {}, "", 0, now


def hot_window_budget(topology: Topology, window: int, interval_s: float) -> int:
    """The entries the hot window's read may look at: every executor the topology may run (its parallelism,
    or every slot of its nodes, whichever is more), for two windows and the clock-skew slack of
    `analysis.sources`, doubled; within [HOT_WINDOW_MIN_ENTRIES, HOT_WINDOW_MAX_ENTRIES]."""
    executors = max(topology.executors, topology.nodes * topology.slots_per_node, 1)
    intervals = (1.0 + HISTORY_WINDOWS) * window + CLOCK_SKEW_S / max(interval_s, 0.001) + 2
    wanted = int(2 * executors * intervals)
    return max(HOT_WINDOW_MIN_ENTRIES, min(HOT_WINDOW_MAX_ENTRIES, wanted))


@dataclass
class StreamMetricSource:
    client: redis.Redis
    topology: Topology
    analyzer: Analyzer = field(default_factory=Analyzer)
    interval_s: float = 1.0
    not_before: float = 0.0
    last: Analysis | None = None
    #: the hot window kept between analyses (each stream entry read once, by id)
    hot: HotWindow | None = field(default=None, init=False, repr=False)

    @property
    def engine(self) -> str | None:
        return self.analyzer.engine_used

    def snapshot(self, window: int) -> MetricSnapshot:
        return self.analyse(window).snapshot

    def analyse(self, window: int) -> Analysis:
        budget = hot_window_budget(self.topology, window, self.interval_s)
        if self.hot is None or self.hot.budget != budget:
            self.hot = HotWindow(MetricStream(self.client, self.topology.redis_prefix), budget)
        samples = reported_by_all(self.hot.read(window, self.interval_s, self.not_before), self.interval_s)
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
    #: entries one pass looks at, at most (a stream flooded by its workers is archived over several passes)
    pass_entries: int = 500_000
    archived: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def archive_once(self) -> int:
        """Archive the entries after the cursor, `batch` entries a write, at most `pass_entries` a pass (the
        next pass goes on); returns how many samples were written. Entries that are not valid samples are
        skipped (the controller's live read counts them). A cursor that is not a stream id (the key lies under
        the topology's prefix, which its workers may write) starts over from the stream's first entry."""
        with self._lock:
            stream = MetricStream(self.client, self.topology.redis_prefix)
            cursor_key = archive_cursor_key(self.topology, self.path)
            cursor = optional_text(self.client.get(cursor_key))
            if cursor is not None and not is_entry_id(cursor):
                log.warning("metric archive %s: cursor %.40r is not a stream id; from the start", self.path, cursor)
                cursor = None
            written = scanned = 0
            while scanned < self.pass_entries:
                read = stream.read_forward("-" if cursor is None else f"({cursor}", self.batch)
                if not read.scanned:
                    break
                scanned += read.scanned
                if read.samples:
                    self._write(read.samples)
                cursor = read.next_start.removeprefix("(")
                self.client.set(cursor_key, cursor)
                written += len(read.samples)
                if not read.truncated:
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
