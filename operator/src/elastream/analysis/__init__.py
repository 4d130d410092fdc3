"""Metric analysis: a window of executor samples -> MetricSnapshot, congestion, ETP and ETPSum.

`Analyzer` runs the Spark job (`job.analyze_with_spark`) on a warm session (`session.get_session`) and
falls back, loudly, to the pure-Python reference `core.metrics.analyze_samples` when Spark cannot start.
Both engines share the window semantics documented on `analyze_samples`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from elastream.analysis.session import SparkUnavailable, get_session
from elastream.core.metrics import Analysis, MetricSample, analyze_samples
from elastream.core.topology import Topology

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Analyzer", "Engine", "SparkUnavailable"]

log = logging.getLogger("elastream.analysis")

Engine = Literal["spark", "python"]


class Analyzer:
    """Analyse windows with Spark; when Spark cannot start, warn why and use the Python reference.

    `engine="python"` uses the reference only. After `analyze`, `engine_used` says which engine ran and
    `fallback_reason` why Spark was not used (None when it was).
    """

    def __init__(self, engine: Engine = "spark", spark: SparkSession | None = None) -> None:
        if engine not in ("spark", "python"):
            raise ValueError(f"engine {engine!r} is unknown; use spark or python")
        self.engine: Engine = engine
        self._spark = spark
        self.engine_used: Engine | None = None
        self.fallback_reason: str | None = None

    def spark(self) -> SparkSession | None:
        """The session, or None (after a warning) when Spark cannot start."""
        if self.engine == "python":
            return None
        if self._spark is None and self.fallback_reason is None:
            try:
                self._spark = get_session()
            except SparkUnavailable as exc:
                self.fallback_reason = str(exc)
                message = f"Spark unavailable, falling back to the Python reference analysis: {exc}"
                log.warning(message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
        return self._spark

    def analyze(
        self,
        topology: Topology,
        samples: Iterable[MetricSample] | DataFrame,
        *,
        window: int = 20,
        interval_s: float = 1.0,
        congestion_rate: float = 1.2,
    ) -> Analysis:
        spark = self.spark()
        if spark is not None:
            from elastream.analysis.job import analyze_with_spark

            self.engine_used = "spark"
            return analyze_with_spark(spark, topology, samples, window, interval_s, congestion_rate)
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
