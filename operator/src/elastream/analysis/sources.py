"""Where samples come from: the Redis hot window, Parquet archives, and Python lists turned into frames.

The Redis stream is read through `elastream.store.metric_stream.MetricStream` (passed in: the analysis
layer does not import the store layer, anything with `read_last`/`read_since` works). Archives are Parquet
with one row per `MetricSample`, columns as `SAMPLE_COLUMNS`; Spark reads and appends them at a local path
or any Hadoop URI (hdfs://, s3a://, gs:// ... with the matching connector on the classpath).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from elastream.core.metrics import MetricSample
from elastream.core.window_analysis import GRID_SLACK, check_window_args

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: column -> type ("double", "string" or "long"), in MetricSample field order
SAMPLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ts", "double"),
    ("node", "string"),
    ("vertex", "string"),
    ("executor", "string"),
    ("started_at", "double"),
    ("received", "long"),
    ("processed", "long"),
    ("emitted", "long"),
    ("busy_s", "double"),
    ("queue_len", "long"),
    ("latency_ms", "double"),
    ("errors", "long"),
)

#: how much older than the window start the hot window reads, in windows: finds each incarnation's baseline
#: sample unless it skipped a whole window of reports
HISTORY_WINDOWS = 1.0
#: slack for the stream ids (Redis server clock) running behind the samples' ts (worker clocks)
CLOCK_SKEW_S = 30.0
#: an executor whose newest sample is this many intervals older than the newest of all has stopped
#: reporting (it left, or its worker is gone): the hot window's end does not wait for it
REPORTING_INTERVALS = 2.0


class SampleStream(Protocol):
    """What the hot-window reader needs from `MetricStream`."""

    def read_last(self, count: int) -> list[MetricSample]:
        """The valid samples among the newest `count` entries, oldest first."""
        ...

    def read_since(self, since_ts: float | None = None, count: int | None = None) -> list[MetricSample]:
        """The valid samples of the entries added at or after `since_ts` (all when None), oldest first: of the
        newest `count` of them at most (None: the stream's own budget)."""
        ...


def read_hot_window(
    stream: SampleStream,
    window: int,
    interval_s: float,
    not_before: float | None = None,
    budget: int | None = None,
) -> list[MetricSample]:
    """The samples the analysis of the newest window needs: ts ≥ newest ts − (1 + HISTORY_WINDOWS) windows.

    The stream is ordered by arrival, so the newest entry gives the window end; the read starts a window
    before the window start so that each incarnation's baseline (its last sample before the window) is there
    even when the samples around the window start are missing. Entries older than that start are not read
    (the read begins at the stream id of the start, less `CLOCK_SKEW_S`), and at most `budget` entries are
    (None: the stream's own budget), the newest: a stream its workers flooded costs a bounded read, whose
    oldest part is cut, never the window's end.

    `not_before` (a controller's cut-off: when the current schedule started running) limits the *window*,
    not the baselines: with it, no sample newer than the cut-off gives [] (nothing ran since), else analyse
    `hot_window_intervals(...)` intervals. Samples before the cut-off stay as baselines of incarnations that
    report after it; those that stopped before it have no sample in the window and count for nothing.
    """
    check_window_args(window, interval_s, 1.0)
    newest = stream.read_last(64)
    if not newest:
        return []
    end = max(s.ts for s in newest)
    if not_before is not None and end < not_before:
        return []
    since = end - (1.0 + HISTORY_WINDOWS) * window * interval_s
    samples = [s for s in stream.read_since(since - CLOCK_SKEW_S, count=budget) if s.ts >= since]
    if not samples:  # stream ids and sample clocks disagree: the newest entries the budget allows
        samples = [s for s in stream.read_since(None, count=budget) if s.ts >= since]
    return samples


class ForwardRead(Protocol):
    """What `FollowedStream.read_forward` returns (`store.metric_stream.StreamRead`)."""

    samples: list[MetricSample]
    truncated: bool
    next_start: str


class FollowedStream(Protocol):
    """What `HotWindow` needs from `MetricStream`: reads bounded by entry ids."""

    def newest_id(self) -> str | None: ...

    def read_since(
        self, since_ts: float | None = None, count: int | None = None, end: str = "+"
    ) -> list[MetricSample]: ...

    def read_forward(self, start: str, max_entries: int | None = None) -> ForwardRead: ...


#: the newest samples (in arrival order) whose newest timestamp is the window's end, as `read_hot_window`'s
#: `read_last(64)`
NEWEST_SAMPLES = 64


class HotWindow:
    """`read_hot_window` kept between analyses, so that each entry of the stream is read once, by entry id.

    The first `read` reads the window as `read_hot_window` does (up to the newest entry then, at most
    `budget` entries, the newest) and remembers that entry's id; each later one reads only the entries added
    after it (`read_forward`), appends their samples, and drops those older than the window's history start.
    It reads the window afresh when it cannot go on: a read that met its budget (a flood), a window that grew
    past what it kept, more samples than `budget`, or a stream whose newest entry lies before the position
    (the stream was replaced). Samples are kept in arrival order, as a fresh read returns them."""

    def __init__(self, stream: FollowedStream, budget: int | None = None) -> None:
        self.stream = stream
        self.budget = budget
        self.samples: list[MetricSample] = []
        #: where the next read goes on from (None: read afresh), and the oldest history start kept whole
        self.position: str | None = None
        self.covers = float("inf")

    def reset(self) -> None:
        self.samples, self.position, self.covers = [], None, float("inf")

    def read(self, window: int, interval_s: float, not_before: float | None = None) -> list[MetricSample]:
        check_window_args(window, interval_s, 1.0)
        span = (1.0 + HISTORY_WINDOWS) * window * interval_s
        fresh = False
        if self.position is not None and not self._go_on():
            self.reset()
        if self.position is None:
            if not self._afresh(span):
                return []
            fresh = True
        since = self._end() - span
        if since < self.covers and not fresh:  # the window grew past what is kept: read it afresh
            self.reset()
            if not self._afresh(span):
                return []
            since = self._end() - span
        if not_before is not None and since + span < not_before:
            return []
        self.samples = [s for s in self.samples if s.ts >= since]
        self.covers = max(self.covers, since)
        return list(self.samples)

    def _end(self) -> float:
        """The window's end: the newest timestamp of the newest samples (arrival order)."""
        return max((s.ts for s in self.samples[-NEWEST_SAMPLES:]), default=float("-inf"))

    def _go_on(self) -> bool:
        """Append the entries added since the position; False when the window must be read afresh."""
        assert self.position is not None
        read = self.stream.read_forward(self.position, self.budget)
        if read.truncated:
            return False
        if not read.samples and read.next_start == self.position:
            newest = self.stream.newest_id()
            if newest is not None and _id_key(newest) < _id_key(self.position):
                return False  # the stream was replaced by one whose entries lie before the position
        self.samples.extend(read.samples)
        self.position = read.next_start
        return self.budget is None or len(self.samples) <= self.budget

    def _afresh(self, span: float) -> bool:
        """Read the window as `read_hot_window` does, up to the newest entry now; False for an empty stream."""
        newest = self.stream.newest_id()
        if newest is None:
            return False
        recent = self.stream.read_since(None, count=NEWEST_SAMPLES, end=newest)
        if not recent:
            return False
        since = max(s.ts for s in recent) - span
        samples = [s for s in self.stream.read_since(since - CLOCK_SKEW_S, self.budget, end=newest) if s.ts >= since]
        if not samples:  # stream ids and sample clocks disagree: the newest entries the budget allows
            samples = [s for s in self.stream.read_since(None, self.budget, end=newest) if s.ts >= since]
        self.samples, self.position, self.covers = samples, f"({newest}", since
        return True


def _id_key(bound: str) -> tuple[int, int]:
    """A stream id (or an exclusive bound `(<id>`) as a sort key."""
    ms, _, seq = bound.lstrip("(").partition("-")
    return (int(ms), int(seq or 0))


def reported_by_all(samples: Sequence[MetricSample], interval_s: float) -> list[MetricSample]:
    """The samples up to the newest time every reporting executor has reported (a watermark): what a live
    controller analyses (`control.metrics.StreamMetricSource`; `elastream analyze` reads up to the newest
    sample, as it does an archive).

    Workers publish their samples a little apart (each on its own clock tick, some delayed by a busy
    machine). Analysed up to the newest sample, the last interval would miss the counts of the executors
    that have not published theirs yet, a dip that reads as a falling trend, and a rise one evaluation
    later. An executor whose newest sample is `REPORTING_INTERVALS` older than the newest of all has
    stopped reporting and is not waited for.

    The watermark is a grid slot, not an instant: a sample up to `GRID_SLACK` of an interval after it is kept.
    Cut at the instant, a source that woke 1 ms after the slowest executor lost its whole last interval
    (rate 4/5 of the load and a slope of -rate/5 per second over a 5-interval window: a 60 %-busy vertex
    read 25 % busy in every other evaluation on a loaded machine)."""
    latest: dict[tuple[str, str], float] = {}
    for s in samples:
        key = (s.vertex, s.executor)
        latest[key] = max(latest.get(key, s.ts), s.ts)
    if not latest:
        return list(samples)
    newest = max(latest.values())
    watermark = min(t for t in latest.values() if t >= newest - REPORTING_INTERVALS * interval_s)
    return [s for s in samples if s.ts <= watermark + GRID_SLACK * interval_s]


def hot_window_intervals(samples: Sequence[MetricSample], window: int, interval_s: float, not_before: float) -> int:
    """The whole intervals (1 to `window`) between `not_before` and the newest sample: the window of a
    `read_hot_window(..., not_before)` read, which must not reach back before the cut-off."""
    end = max((s.ts for s in samples), default=not_before)
    return max(1, min(window, int((end - not_before) / interval_s)))


def spark_schema() -> StructType:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    types = {"double": DoubleType(), "string": StringType(), "long": LongType()}
    return StructType([StructField(name, types[kind], nullable=False) for name, kind in SAMPLE_COLUMNS])


def arrow_schema() -> pa.Schema:
    import pyarrow as pa

    types = {"double": pa.float64(), "string": pa.string(), "long": pa.int64()}
    return pa.schema([pa.field(name, types[kind], nullable=False) for name, kind in SAMPLE_COLUMNS])


def samples_to_arrow(samples: Iterable[MetricSample]) -> pa.Table:
    import pyarrow as pa

    rows = list(samples)
    columns = {name: [getattr(s, name) for s in rows] for name, _ in SAMPLE_COLUMNS}
    return pa.Table.from_pydict(columns, schema=arrow_schema())


def samples_to_pandas(samples: Iterable[MetricSample]) -> pd.DataFrame:
    return samples_to_arrow(samples).to_pandas()


def samples_frame(spark: SparkSession, samples: Iterable[MetricSample]) -> DataFrame:
    """A Spark DataFrame of the samples (through Arrow), with the archive's schema."""
    with warnings.catch_warnings():  # pyspark 3.5's pandas checks use APIs newer pandas deprecates
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return spark.createDataFrame(samples_to_pandas(samples), schema=spark_schema())


def samples_from_rows(rows: Iterable[Any]) -> list[MetricSample]:
    """Spark Rows, dicts or pyarrow records back to samples."""
    out = []
    for row in rows:
        data = row.asDict() if hasattr(row, "asDict") else dict(row)
        out.append(MetricSample.from_dict(data))
    return out


def read_parquet(spark: SparkSession, path: str | Sequence[str]) -> DataFrame:
    """The archive at `path` (a file, a directory of parts, or any Hadoop URI), as the sample schema."""
    paths = [path] if isinstance(path, str) else list(path)
    frame = spark.read.schema(spark_schema()).parquet(*paths)
    return frame.select(*[name for name, _ in SAMPLE_COLUMNS])


def append_parquet(spark: SparkSession, samples: Iterable[MetricSample] | DataFrame, path: str) -> None:
    """Append samples to the archive at `path` (local or any Hadoop URI) as new part files."""
    from pyspark.sql import DataFrame

    frame = samples if isinstance(samples, DataFrame) else samples_frame(spark, samples)
    frame.write.mode("append").parquet(path)


def write_parquet_local(samples: Iterable[MetricSample], path: str, append: bool = True) -> str:
    """Without Spark: write the samples as one new part file in the directory `path` (created). Returns it."""
    import uuid

    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    if not append:
        for name in os.listdir(path):
            if name.endswith(".parquet"):
                os.remove(os.path.join(path, name))
    target = os.path.join(path, f"part-{uuid.uuid4().hex}.parquet")
    pq.write_table(samples_to_arrow(samples), target)
    return target


def read_parquet_local(path: str) -> list[MetricSample]:
    """Without Spark: every sample in a local Parquet file or directory (the Python engine's reader)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=[name for name, _ in SAMPLE_COLUMNS])
    return samples_from_rows(table.to_pylist())
