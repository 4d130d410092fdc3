"""One warm SparkSession for the metric analysis.

The master comes from `ELASTREAM_SPARK_MASTER` (default `local[*]`; e.g. `spark://host:7077` for a
standalone cluster or `k8s://https://<api-server>:443` for Kubernetes) and extra configuration from
`ELASTREAM_SPARK_CONF` as `key=value,key=value` (e.g. `spark.executor.instances=2,
spark.kubernetes.container.image=apache/spark:3.5.3`). The session is created once per process and kept
warm; when Java or Spark cannot start, `SparkUnavailable` says why (the deepest Java cause, not py4j's
"An error occurred while calling ..."). Start-up is capped: a cluster master is first probed over TCP
(refused, unresolvable or not answering: fails in seconds), and creating the session plus a first job
must finish within `ELASTREAM_SPARK_START_TIMEOUT` seconds (default 60 for a cluster master, 300 for
local mode, whose JVM only takes that long on a starved machine), so an unreachable or executor-less
cluster does not hold the caller for Spark's own 60-80 s of registration retries.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from elastream.store.registry import redacted

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MASTER_ENV = "ELASTREAM_SPARK_MASTER"
CONF_ENV = "ELASTREAM_SPARK_CONF"
START_TIMEOUT_ENV = "ELASTREAM_SPARK_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_LOCAL_START_TIMEOUT_S = 300.0
#: longest wait for a TCP connection to a cluster master before Spark is started at all
MASTER_PROBE_S = 5.0
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


def start_timeout_s(master: str | None = None) -> float:
    """`ELASTREAM_SPARK_START_TIMEOUT` (seconds, > 0); default 60 for a cluster master, 300 for local mode."""
    text = os.environ.get(START_TIMEOUT_ENV, "").strip()
    if not text:
        local = (master or spark_master()).startswith("local")
        return DEFAULT_LOCAL_START_TIMEOUT_S if local else DEFAULT_START_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0.0:
        raise SparkUnavailable(f"{START_TIMEOUT_ENV}: {text!r} is not a positive number of seconds; use e.g. 60")
    return value


def spark_error_reason(exc: BaseException) -> str:
    """One line saying why Spark failed: the deepest cause of a Java exception (py4j's own first line,
    "An error occurred while calling ...", names no reason), else the exception's first line."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        java = getattr(current, "java_exception", None) or getattr(current, "_origin", None)
        if java is not None:
            text = _deepest_java_cause(java)
            if text:
                return text
        current = current.__cause__
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _deepest_java_cause(java: Any) -> str:
    try:
        deepest = java
        for _ in range(64):  # cause chains are short; a cycle must not hang us
            cause = deepest.getCause()
            if cause is None:
                break
            deepest = cause
        text = str(deepest.toString()).strip()
    except Exception:  # the JVM is gone: the Python-side message is all there is
        return ""
    return " ".join(text.split())


def _java_problem() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return None
    if shutil.which("java") is None:
        return "no Java runtime found (set JAVA_HOME or put java on PATH; Spark 3.5 needs Java 8, 11 or 17)"
    return None


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs a cluster master URL names (empty for local, yarn and other managers).

    Raises `SparkUnavailable` for a URL Spark would reject (it would only say so on the JVM's stderr)."""
    if master.startswith("local") or master == "yarn":
        return []
    bad = SparkUnavailable(
        f"{MASTER_ENV}: {redacted(master)!r} is not a Spark master URL; use local[*], spark://host:7077 or "
        "k8s://https://host:443"
    )
    for scheme, default_port in (("spark://", 7077), ("mesos://", 5050)):
        if master.startswith(scheme):
            addresses = []
            for item in master[len(scheme) :].split(","):
                host, sep, port = item.strip().rpartition(":")
                if not sep:
                    host, port = item.strip(), ""
                if not host or (port and not port.isdigit()):
                    raise bad
                addresses.append((host.strip("[]"), int(port) if port else default_port))
            return addresses
    if master.startswith("k8s://"):
        url = master[len("k8s://") :]
        parts = urlsplit(url if "://" in url else f"https://{url}")
        if parts.hostname:
            try:
                given = parts.port
            except ValueError:
                given = None
            return [(parts.hostname, given or (80 if parts.scheme == "http" else 443))]
    raise bad


def probe_master(master: str, timeout_s: float = MASTER_PROBE_S) -> None:
    """Raise `SparkUnavailable` unless one of the master's addresses accepts a TCP connection."""
    problems = []
    for host, port in master_addresses(master):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError | socket.timeout):
                reason = f"no answer within {timeout_s:.0f} s"
            problems.append(f"{host}:{port}: {reason.lower()}")
    if problems:
        raise SparkUnavailable(
            f"cannot reach the Spark master {redacted(master)} ({'; '.join(problems)}); start it, fix {MASTER_ENV}, "
            "or unset it to analyse on local[*]"
        )


def get_session() -> SparkSession:
    """The process's SparkSession, created on first use. Raises `SparkUnavailable` with the reason.

    "Created" means it ran a trivial job, all within `start_timeout_s()`: a master that accepts the
    connection but never gives the application executors fails here, not at the first analysis."""
    global _session
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            return _session
        master = spark_master()
        conf = session_conf()
        timeout_s = start_timeout_s(master)
        if master.startswith("local"):
            problem = _java_problem()
            if problem:
                raise SparkUnavailable(problem)
        else:
            probe_master(master, min(MASTER_PROBE_S, timeout_s))
        try:
            from pyspark.sql import SparkSession
        except ImportError as exc:  # pragma: no cover - pyspark is a dependency
            raise SparkUnavailable(f"pyspark is not installed ({exc}); pip install pyspark==3.5.3") from None
        builder = SparkSession.builder.master(master).appName(APP_NAME)
        for key, value in conf.items():
            builder = builder.config(key, value)
        _session = _start(builder, master, timeout_s)
        return _session


def _start(builder: Any, master: str, timeout_s: float) -> SparkSession:
    """Create the session and run a trivial job in a helper thread; give up after `timeout_s`."""
    done = threading.Event()
    abandoned = threading.Event()
    outcome: dict[str, Any] = {}

    def create() -> None:
        session = None
        try:
            session = builder.getOrCreate()
            session.sparkContext.setLogLevel("ERROR")
            _trivial_job(session)
            outcome["session"] = session
        except BaseException as exc:  # reported by the caller
            outcome["error"] = exc
        finally:
            done.set()
            if session is not None and ("error" in outcome or abandoned.is_set()):  # never leave a broken one
                with contextlib.suppress(Exception):
                    session.stop()

    thread = threading.Thread(target=create, name="elastream-spark-start", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        abandoned.set()
        _cancel_active_jobs()
        raise SparkUnavailable(
            f"Spark did not start within {timeout_s:.0f} s with master {redacted(master)} (no executors, or the "
            f"master does not answer); check the cluster, or raise {START_TIMEOUT_ENV}"
        )
    if "error" in outcome:
        exc = outcome["error"]
        raise SparkUnavailable(f"cannot start Spark with master {redacted(master)}: {spark_error_reason(exc)}") from exc
    session: SparkSession = outcome["session"]
    return session


def _cancel_active_jobs() -> None:
    with contextlib.suppress(Exception):
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is not None:
            context.cancelAllJobs()


def _trivial_job(session: SparkSession) -> None:
    session.range(0, 1000, numPartitions=2).selectExpr("sum(id) as s").collect()


def warm_up(spark: SparkSession | None = None) -> SparkSession:
    """Start the session (if needed) and run a trivial job so the first real analysis is warm."""
    session = spark if spark is not None else get_session()
    try:
        _trivial_job(session)
    except Exception as exc:
        raise SparkUnavailable(f"Spark started but cannot run a job: {spark_error_reason(exc)}") from exc
    return session
