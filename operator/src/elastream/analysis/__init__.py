"""Metric analysis: a window of executor samples -> MetricSnapshot, congestion, ETP and ETPSum.

`Analyzer` runs the Spark job (`job.analyze_with_spark`) on a warm session (`session.get_session`) and
falls back, loudly, to the pure-Python reference `core.window_analysis.analyze_samples` when Spark cannot start or
fails during an analysis. Both engines share the window semantics documented on `analyze_samples`.
`Analyzer.warm_up` (or `start_warm_up`, in a background thread) starts the session and runs a first
analysis on a small synthetic window, so a controller's first scaling request finds a warm job.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from elastream.analysis.session import SparkUnavailable, get_session, spark_error_reason
from elastream.core.metrics import MetricSample
from elastream.core.topology import DEFAULT_CONGESTION_RATE, DEFAULT_WINDOW, Topology, parse_manifest
from elastream.core.window_analysis import Analysis, analyze_samples, check_window_args

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["WARM_RUNS", "WARM_WINDOW", "Analyzer", "Engine", "SparkUnavailable", "synthetic_window"]

log = logging.getLogger("elastream.analysis")

Engine = Literal["spark", "python"]

#: intervals in the warm-up's synthetic window
WARM_WINDOW = 5
#: warm-up analyses, each on the synthetic window one interval later: one leaves the first real analysis
#: about twice as slow as a warm one (measured), two bring it to warm latency
WARM_RUNS = 2


class Analyzer:
    """Analyse windows with Spark; when Spark cannot start or fails, warn why and use the Python reference.

    `engine="python"` uses the reference only. After `analyze`, `engine_used` says which engine ran and
    `fallback_reason` why Spark was not used (None when it was). A Spark that could not start is not tried
    again by this analyzer; a Spark that failed during one analysis is tried again at the next. One lock
    serialises the analyzer's Spark work (warm-up, analyses), so a request during the warm-up waits for it.
    """

    def __init__(self, engine: Engine = "spark", spark: SparkSession | None = None) -> None:
        if engine not in ("spark", "python"):
            raise ValueError(f"engine {engine!r} is unknown; use spark or python")
        self.engine: Engine = engine
        self._spark = spark
        self._lock = threading.RLock()
        self.start_failure: str | None = None
        self.engine_used: Engine | None = None
        self.fallback_reason: str | None = None
        #: the warm-up's analysis of its synthetic window (None until `warm_up` ran on Spark)
        self.warm_analysis: Analysis | None = None

    def spark(self) -> SparkSession | None:
        """The session, or None (after a warning) when Spark cannot start."""
        if self.engine == "python":
            return None
        with self._lock:
            if self._spark is None and self.start_failure is None:
                try:
                    self._spark = get_session()
                except SparkUnavailable as exc:
                    self.start_failure = str(exc)
                    _loud(f"Spark unavailable, falling back to the Python reference analysis: {exc}")
        return self._spark

    def warm_up(self, topology: Topology | None = None) -> Analysis | None:
        """Start Spark and run first analyses (`WARM_RUNS`) on a small synthetic window of `topology` (a
        two-vertex topology by default), so the first real analysis runs on a warm session and a warm job.

        Returns the last one, of `synthetic_window(topology, WARM_WINDOW, WARM_RUNS - 1)` (None with the
        python engine or when Spark cannot start)."""
        if self.engine == "python":
            return None
        with self._lock:
            if self.spark() is None:
                return None
            topo = topology if topology is not None else _warm_topology()
            result = None
            for offset in range(WARM_RUNS):
                result = self.analyze(topo, synthetic_window(topo, WARM_WINDOW, offset), window=WARM_WINDOW)
            if self.engine_used == "spark":
                self.warm_analysis = result
            return result

    def start_warm_up(
        self, topology: Topology | None = None, report: Callable[[str], None] | None = None
    ) -> threading.Thread:
        """`warm_up` in a daemon thread (started); join it to wait. Failures are logged, never raised.
        `report`, when given, receives one line saying which engine is ready (and how long Spark took)."""

        def run() -> None:
            started = time.monotonic()
            try:
                self.warm_up(topology)
            except Exception as exc:  # the analyses fall back on their own; say why the warm-up did not help
                log.warning("Spark warm-up failed: %s", spark_error_reason(exc))
            if report is None:
                return
            if self.warm_analysis is not None:
                report(
                    f"metric analysis: Spark ready (session and a first analysis in {time.monotonic() - started:.1f} s)"
                )
            elif self.engine == "python":
                report("metric analysis: Python reference (--engine python)")
            else:
                report(f"metric analysis: Python reference ({self.start_failure or self.fallback_reason})")

        thread = threading.Thread(target=run, name="elastream-spark-warm-up", daemon=True)
        thread.start()
        return thread

    def analyze(
        self,
        topology: Topology,
        samples: Iterable[MetricSample] | DataFrame,
        *,
        window: int = DEFAULT_WINDOW,
        interval_s: float = 1.0,
        congestion_rate: float = DEFAULT_CONGESTION_RATE,
    ) -> Analysis:
        """Analyse the newest window. A DataFrame of samples needs Spark: if Spark fails on it, this raises
        `SparkUnavailable` (there is nothing to fall back on); samples fall back to the reference."""
        check_window_args(window, interval_s, congestion_rate)
        with self._lock:
            spark = self.spark()
            if spark is not None:
                from elastream.analysis.job import analyze_with_spark

                if not hasattr(samples, "toLocalIterator"):
                    samples = list(samples)  # kept for the fallback
                try:
                    result = analyze_with_spark(spark, topology, samples, window, interval_s, congestion_rate)
                except Exception as exc:
                    reason = f"Spark failed during the analysis: {spark_error_reason(exc)}"
                    if hasattr(samples, "toLocalIterator"):
                        raise SparkUnavailable(f"{reason}; rerun with --engine python") from exc
                    self.fallback_reason = reason
                    _loud(f"{reason}; falling back to the Python reference analysis for this window")
                else:
                    self.engine_used = "spark"
                    self.fallback_reason = None
                    return result
            else:
                self.fallback_reason = self.start_failure
        self.engine_used = "python"
        if hasattr(samples, "toLocalIterator"):
            from elastream.analysis.sources import samples_from_rows

            samples = samples_from_rows(samples.toLocalIterator())
        return analyze_samples(
            topology,
            samples,
            window=window,
            interval_s=interval_s,
            congestion_rate=congestion_rate,
        )


def _loud(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _warm_topology() -> Topology:
    return parse_manifest(
        {
            "kind": "StreamTopology",
            "metadata": {"name": "elastream-warm-up"},
            "spec": {
                "nodes": 2,
                "slotsPerNode": 2,
                "vertices": [
                    {"name": "source", "source": {"type": "synthetic"}, "parallelism": 2},
                    {"name": "sink", "sink": {"type": "null"}, "parallelism": 2},
                ],
                "streams": [{"from": "source", "to": "sink"}],
            },
        }
    )


def synthetic_window(topology: Topology, intervals: int = WARM_WINDOW, offset: int = 0) -> list[MetricSample]:
    """`intervals` + 1 samples of every executor of `topology` (at most 4 per vertex, on 2 nodes), with
    steady cumulative counters, starting `offset` intervals after 0: a small window exercising every step of
    the job (the warm-up's input)."""
    samples = []
    for position, name in enumerate(topology.order):
        vertex = topology.vertices[name]
        sink = topology.graph.out_degree(name) == 0
        for index in range(min(vertex.parallelism, 4)):
            rate = 100 * (position + 1) + index
            for t in range(intervals + 1):
                done = rate * (t + offset)
                samples.append(
                    MetricSample(
                        ts=float(t + offset),
                        node=f"warm-{index % 2}",
                        vertex=name,
                        executor=f"{name}#{index}",
                        started_at=0.0,
                        received=done,
                        processed=done,
                        emitted=0 if sink else done,
                        busy_s=0.5 * t,
                        queue_len=index,
                    )
                )
    return samples
