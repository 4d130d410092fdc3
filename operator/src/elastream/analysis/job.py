"""The Spark analysis job: the same window semantics as `core.window_analysis.analyze_samples`, as one SQL statement.

Per incarnation (executor, started_at) a window function orders the samples and takes each one's delta
from its predecessor (or from zero / itself for the first, as the reference does) and where in the window
it happened (`core.window_analysis.delta_position`); the deltas in the window are summed per (vertex, executor),
then per vertex, together with the trend sums Σ (x − c)·delta, executor counts, queue lengths
and placement. Only the per-vertex rows are collected (one per vertex, with its executors' nodes); rates,
congestion and ETP then come from `core.window_analysis.analysis_from_totals`, the function the reference ends in,
so the two engines agree to rounding in the busy-seconds and trend sums (the counts are exact).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from elastream.analysis.sources import samples_frame
from elastream.core.metrics import MetricSample
from elastream.core.topology import DEFAULT_CONGESTION_RATE, DEFAULT_WINDOW, Topology
from elastream.core.window_analysis import (
    Analysis,
    WindowTotals,
    analysis_from_totals,
    check_window_args,
    first_sample_after,
    trend_center,
    window_start,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: the order of an incarnation's samples (as `core.window_analysis.sample_order_key`)
ORDER_COLUMNS = ("ts", "processed", "emitted", "received", "busy_s", "queue_len")
#: which sample of an executor is its latest / earliest (as `core.window_analysis._executor_key`)
EXECUTOR_KEY = ("ts", "started_at", "processed", "emitted", "received", "busy_s", "queue_len", "node")


#: inputs up to this many rows (the hot window of a controller) run in one partition, without a shuffle,
#: and with SMALL_INPUT_CONF
SMALL_INPUT_ROWS = 200_000
#: for a hot window, interpreted expressions: compiling generated code (Janino) for a few thousand rows
#: costs more than it saves (measured: about a fifth of a warm analysis); set for the query, then restored
SMALL_INPUT_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def analyze_with_spark(
    spark: SparkSession,
    topology: Topology,
    samples: DataFrame | Iterable[MetricSample],
    window: int = DEFAULT_WINDOW,
    interval_s: float = 1.0,
    congestion_rate: float = DEFAULT_CONGESTION_RATE,
) -> Analysis:
    """Analyse the newest window of `samples` (a DataFrame with the sample columns, or samples) with Spark."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    check_window_args(window, interval_s, congestion_rate)
    names = list(topology.order)
    frame: DataFrame | None
    if isinstance(samples, DataFrame):
        frame = samples.where(F.col("vertex").isin(names))
        end_row = frame.agg(F.max("ts").alias("end")).first()
        end = None if end_row is None else end_row["end"]
    else:
        rows = [s for s in samples if s.vertex in topology.vertices]
        end = max((s.ts for s in rows), default=None)
        frame = samples_frame(spark, rows) if rows else None
    if end is None or frame is None:
        return analysis_from_totals(topology, {}, {}, 0.0, 0.0, window, interval_s, congestion_rate)
    small = not isinstance(samples, DataFrame) and len(rows) <= SMALL_INPUT_ROWS
    return _analyze_frame(spark, topology, frame, float(end), window, interval_s, congestion_rate, small)


def _double(value: float) -> str:
    """A Spark SQL double literal that parses back to exactly `value` (repr round-trips; D makes it double)."""
    return f"{float(value)!r}D"


#: The job as one SQL statement over the samples (a temporary view): one round trip to build and analyse
#: the plan, where the DataFrame API took a py4j call per column expression (most of a warm hot-window
#: analysis). {hint} places the rows: one partition for a hot window (no shuffle at all: window, both
#: aggregations and the collect run in one task), else one shuffle by (vertex, executor), which serves the
#: window and the per-executor aggregation; only the small per-executor table is shuffled again, by vertex.
#: `spans` and `w` are `core.window_analysis.delta_position` (a first sample of an incarnation started before the
#: window has a zero delta and its own ts as origin).
ANALYSIS_SQL = """
WITH placed AS (
  SELECT {hint} * FROM {view}
),
lagged AS (
  SELECT ts, node, vertex, executor, started_at, received, processed, emitted, busy_s, queue_len,
    LAG(STRUCT(processed, emitted, busy_s, received, ts)) OVER (
      PARTITION BY vertex, executor, started_at ORDER BY {order}) AS prev
  FROM placed
),
spans AS (
  SELECT *,
    CASE WHEN prev IS NOT NULL THEN prev.ts WHEN started_at >= {start} THEN started_at ELSE ts END AS origin
  FROM lagged
  WHERE ts > {first}
),
deltas AS (
  SELECT vertex, executor,
    {dp} AS dp, {de} AS de, {db} AS db, {dr} AS dr,
    ((GREATEST(origin, {start}) + ts) / 2.0D - {start}) / {interval} - 0.5D - {center} AS w,
    STRUCT({key}) AS key
  FROM spans
),
per_executor AS (
  SELECT vertex, executor, SUM(dp) AS dp, SUM(de) AS de, SUM(db) AS db, SUM(dr) AS dr,
    SUM(w * dp) AS wp, SUM(w * de) AS we, SUM(w * dr) AS wr, COUNT(1) AS n, MAX(key) AS last, MIN(key) AS first
  FROM deltas
  GROUP BY vertex, executor
)
SELECT vertex, SUM(dp) AS processed, SUM(de) AS emitted, SUM(db) AS busy_s, SUM(dr) AS received,
  SUM(wp) AS processed_trend, SUM(we) AS emitted_trend, SUM(wr) AS received_trend, SUM(n) AS samples,
  COUNT(1) AS executors, SUM(first.queue_len) AS queue_first, SUM(last.queue_len) AS queue_last,
  COLLECT_LIST(STRUCT(executor, last.node AS node)) AS placement
FROM per_executor
GROUP BY vertex
"""


def analysis_sql(view: str, start: float, window: int, interval_s: float, small: bool) -> str:
    """The statement `_analyze_frame` runs (the window's parameters as exact literals)."""

    def delta(name: str, zero: str) -> str:
        # from the previous sample; the first: from zero if the incarnation started in the window, else none
        return (
            f"CASE WHEN prev IS NOT NULL THEN {name} - prev.{name} "
            f"WHEN started_at >= {_double(start)} THEN {name} ELSE {zero} END"
        )

    return ANALYSIS_SQL.format(
        hint="/*+ COALESCE(1) */" if small else "/*+ REPARTITION(vertex, executor) */",
        order=", ".join(ORDER_COLUMNS),
        view=view,
        dp=delta("processed", "0"),
        de=delta("emitted", "0"),
        db=delta("busy_s", "0.0D"),
        dr=delta("received", "0"),
        start=_double(start),
        first=_double(first_sample_after(start, interval_s)),
        interval=_double(interval_s),
        center=_double(trend_center(window)),
        key=", ".join(EXECUTOR_KEY),
    )


def _analyze_frame(
    spark: SparkSession,
    topology: Topology,
    frame: DataFrame,
    end: float,
    window: int,
    interval_s: float,
    congestion_rate: float,
    small: bool = False,
) -> Analysis:
    end = float(end)
    start = window_start(end, window, interval_s)
    view = f"elastream_samples_{uuid.uuid4().hex}"
    frame.createOrReplaceTempView(view)
    conf = SMALL_INPUT_CONF if small else {}
    previous: dict[str, str | None] = {key: spark.conf.get(key, None) for key in conf}
    try:
        for key, value in conf.items():
            spark.conf.set(key, value)
        rows = spark.sql(analysis_sql(view, start, window, interval_s, small)).collect()
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)
        spark.catalog.dropTempView(view)
    totals: dict[str, WindowTotals] = {}
    placement: dict[str, str] = {}
    for row in rows:
        totals[row["vertex"]] = WindowTotals(
            processed=int(row["processed"]),
            emitted=int(row["emitted"]),
            busy_s=float(row["busy_s"]),
            executors=int(row["executors"]),
            received=int(row["received"]),
            queue_first=int(row["queue_first"]),
            queue_last=int(row["queue_last"]),
            processed_trend=float(row["processed_trend"]),
            emitted_trend=float(row["emitted_trend"]),
            received_trend=float(row["received_trend"]),
            samples=int(row["samples"]),
        )
        for item in row["placement"]:
            placement[item["executor"]] = item["node"]
    return analysis_from_totals(topology, totals, placement, start, end, window, interval_s, congestion_rate)
