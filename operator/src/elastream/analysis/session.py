"""One warm SparkSession for the metric analysis.

The master comes from `ELASTREAM_SPARK_MASTER` (default `local[*]`; e.g. `spark://host:7077` for a
standalone cluster or `k8s://https://<api-server>:443` for Kubernetes) and extra configuration from
`ELASTREAM_SPARK_CONF` as `key=value,key=value` (e.g. `spark.executor.instances=2,
spark.kubernetes.container.image=apache/spark:3.5.3`). The session is created once per process and kept
warm; when Java or Spark cannot start, `SparkUnavailable` says why.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MASTER_ENV = "ELASTREAM_SPARK_MASTER"
CONF_ENV = "ELASTREAM_SPARK_CONF"
DEFAULT_MASTER = "local[*]"
APP_NAME = "elastream-analysis"

#: what every session gets (ELASTREAM_SPARK_CONF may override any of it)
BASE_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=ERROR",
}

_lock = threading.Lock()
_session: SparkSession | None = None


class SparkUnavailable(RuntimeError):
    """Spark could not start (no Java, bad master or configuration); the message says why."""


def spark_master() -> str:
    return os.environ.get(MASTER_ENV, "").strip() or DEFAULT_MASTER


def parse_conf(text: str) -> dict[str, str]:
    """`k=v,k=v` → {k: v}; blank items are skipped. Raises `SparkUnavailable` naming a malformed item."""
    conf: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SparkUnavailable(f"{CONF_ENV}: {item!r} is not key=value; write e.g. spark.executor.memory=2g")
        conf[key.strip()] = value.strip()
    return conf


def session_conf() -> dict[str, str]:
    return {**BASE_CONF, **parse_conf(os.environ.get(CONF_ENV, ""))}


def _java_problem() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return None
    if shutil.which("java") is None:
        return "no Java runtime found (set JAVA_HOME or put java on PATH; Spark 3.5 needs Java 8, 11 or 17)"
    return None


def get_session() -> SparkSession:
    """The process's SparkSession, created on first use. Raises `SparkUnavailable` with the reason."""
    global _session
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            return _session
        master = spark_master()
        conf = session_conf()
        if master.startswith("local"):
            problem = _java_problem()
            if problem:
                raise SparkUnavailable(problem)
        try:
            from pyspark.sql import SparkSession
        except ImportError as exc:  # pragma: no cover - pyspark is a dependency
            raise SparkUnavailable(f"pyspark is not installed ({exc}); pip install pyspark==3.5.3") from None
        builder = SparkSession.builder.master(master).appName(APP_NAME)
        for key, value in conf.items():
            builder = builder.config(key, value)
        try:
            session = builder.getOrCreate()
            session.sparkContext.setLogLevel("ERROR")
        except Exception as exc:  # Java gateway, bad master URL, cluster unreachable ...
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SparkUnavailable(f"cannot start Spark with master {master}: {reason}") from exc
        _session = session
        return session


def warm_up(spark: SparkSession | None = None) -> SparkSession:
    """Start the session (if needed) and run a trivial job so the first real analysis is warm."""
    session = spark if spark is not None else get_session()
    try:
        session.range(0, 1000, numPartitions=2).selectExpr("sum(id) as s").collect()
    except Exception as exc:
        raise SparkUnavailable(f"Spark started but cannot run a job: {str(exc).strip()[:300]}") from exc
    return session


def stop_session() -> None:
    """Stop the warm session (tests and benchmarks that measure a cold start)."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
