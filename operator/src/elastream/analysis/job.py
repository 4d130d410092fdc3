"""The Spark analysis job: the same window semantics as `core.metrics.analyze_samples`, as DataFrame work.

Per incarnation (executor, started_at) a window function orders the samples and takes each one's delta
from its predecessor (or from zero / itself for the first, as the reference does); the deltas in the
window are summed per (vertex, executor), then per vertex, together with the trend sums Σ (k − c)·delta,
executor counts, queue lengths and placement. Only the per-vertex rows are collected (one per vertex, with
its executors' nodes); rates, congestion and ETP then come from `core.metrics.analysis_from_totals`, the
function the reference ends in, so the two engines agree to rounding in the busy-seconds sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from elastream.analysis.sources import samples_frame
from elastream.core.metrics import (
    Analysis,
    MetricSample,
    WindowTotals,
    analysis_from_totals,
    check_window_args,
    trend_center,
    window_start,
)
from elastream.core.topology import Topology

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: the order of an incarnation's samples (as `core.metrics.sample_order_key`)
ORDER_COLUMNS = ("ts", "processed", "emitted", "received", "busy_s", "queue_len")
#: which sample of an executor is its latest / earliest (as `core.metrics._executor_key`)
EXECUTOR_KEY = ("ts", "started_at", "processed", "emitted", "received", "busy_s", "queue_len", "node")


#: inputs up to this many rows (the hot window of a controller) run with one shuffle partition
SMALL_INPUT_ROWS = 200_000


def analyze_with_spark(
    spark: SparkSession,
    topology: Topology,
    samples: DataFrame | Iterable[MetricSample],
    window: int = 20,
    interval_s: float = 1.0,
    congestion_rate: float = 1.2,
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
    previous = spark.conf.get("spark.sql.shuffle.partitions") or "200"
    if small:
        # a controller's hot window (thousands of rows): one partition per shuffle saves a task per
        # partition and stage, the bulk of a warm analysis's latency
        spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        return _analyze_frame(spark, topology, frame, float(end), window, interval_s, congestion_rate)
    finally:
        if small:
            spark.conf.set("spark.sql.shuffle.partitions", previous)


def _analyze_frame(
    spark: SparkSession,
    topology: Topology,
    frame: DataFrame,
    end: float,
    window: int,
    interval_s: float,
    congestion_rate: float,
) -> Analysis:
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    end = float(end)
    start = window_start(end, window, interval_s)
    center = trend_center(window)

    # One shuffle by (vertex, executor) serves the window and the per-executor aggregation; only the small
    # per-executor table is shuffled again, by vertex.
    incarnation = Window.partitionBy("vertex", "executor", "started_at").orderBy(*ORDER_COLUMNS)
    lagged = (
        frame.repartition("vertex", "executor")
        .select(
            "ts",
            "node",
            "vertex",
            "executor",
            "started_at",
            "received",
            "processed",
            "emitted",
            "busy_s",
            "queue_len",
            F.lag(F.struct("processed", "emitted", "busy_s", "received")).over(incarnation).alias("prev"),
        )
        .where(F.col("ts") > F.lit(start))
    )
    has_prev = F.col("prev").isNotNull()
    from_zero = F.col("started_at") >= F.lit(start)

    def delta(name: str, zero: float) -> Column:
        return F.when(has_prev, F.col(name) - F.col(f"prev.{name}")).when(from_zero, F.col(name)).otherwise(F.lit(zero))

    k = F.ceil((F.col("ts") - F.lit(start)) / F.lit(interval_s)) - F.lit(1)
    k = F.least(F.greatest(k, F.lit(0)), F.lit(window - 1))
    deltas = lagged.select(
        "vertex",
        "executor",
        delta("processed", 0).alias("dp"),
        delta("emitted", 0).alias("de"),
        delta("busy_s", 0.0).alias("db"),
        delta("received", 0).alias("dr"),
        (k.cast("double") - F.lit(center)).alias("w"),
        F.struct(*EXECUTOR_KEY).alias("key"),
    )
    per_executor = deltas.groupBy("vertex", "executor").agg(
        F.sum("dp").alias("dp"),
        F.sum("de").alias("de"),
        F.sum("db").alias("db"),
        F.sum("dr").alias("dr"),
        F.sum(F.col("w") * F.col("dp")).alias("wp"),
        F.sum(F.col("w") * F.col("de")).alias("we"),
        F.sum(F.col("w") * F.col("dr")).alias("wr"),
        F.count(F.lit(1)).alias("n"),
        F.max("key").alias("last"),
        F.min("key").alias("first"),
    )
    per_vertex = per_executor.groupBy("vertex").agg(
        F.sum("dp").alias("processed"),
        F.sum("de").alias("emitted"),
        F.sum("db").alias("busy_s"),
        F.sum("dr").alias("received"),
        F.sum("wp").alias("processed_trend"),
        F.sum("we").alias("emitted_trend"),
        F.sum("wr").alias("received_trend"),
        F.sum("n").alias("samples"),
        F.count(F.lit(1)).alias("executors"),
        F.sum("first.queue_len").alias("queue_first"),
        F.sum("last.queue_len").alias("queue_last"),
        F.collect_list(F.struct(F.col("executor"), F.col("last.node").alias("node"))).alias("placement"),
    )
    totals: dict[str, WindowTotals] = {}
    placement: dict[str, str] = {}
    for row in per_vertex.collect():
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
