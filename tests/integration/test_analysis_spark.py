"""The Spark analysis job against the Python reference, the Redis and Parquet sources, and `elastream analyze`.

One local SparkSession serves the whole module (session-scoped, the process's warm session). Random sample
sets are seeded: many vertices, executors joining and leaving, missing samples, counter resets, ts jitter
around interval boundaries. Spark and the reference must agree to 1e-9 relative on every field.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterable

import pytest
import redis
import yaml

from elastream.analysis import WARM_RUNS, WARM_WINDOW, Analyzer, SparkUnavailable, synthetic_window
from elastream.analysis import session as spark_session
from elastream.analysis.job import SMALL_INPUT_CONF, analysis_sql, analyze_with_spark
from elastream.analysis.sources import (
    append_parquet,
    read_hot_window,
    read_parquet,
    read_parquet_local,
    samples_frame,
    write_parquet_local,
)
from elastream.cli import main
from elastream.core.metrics import MetricSample
from elastream.core.topology import Topology, parse_manifest
from elastream.core.window_analysis import Analysis, analyze_samples
from elastream.store.metric_stream import MetricStream
from support.manifests import edge, manifest, sink, src, work

pytestmark = pytest.mark.integration

REL = 1e-9


@pytest.fixture(scope="session")
def spark():
    try:
        session = spark_session.get_session()
    except SparkUnavailable as exc:
        pytest.fail(f"local Spark does not start: {exc}; install Java 17 (make setup)")
    spark_session.warm_up(session)
    return session


def random_topology(rnd: random.Random, n: int = 12) -> tuple[Topology, dict]:
    names = [f"v{i}" for i in range(n)]
    sources, sinks = names[:2], names[-2:]
    edges: set[tuple[str, str]] = set()
    for i in range(2, n):
        for parent in rnd.sample(names[: min(i, n - 2)], k=min(rnd.randint(1, 2), min(i, n - 2))):
            edges.add((parent, names[i]))
    for i in range(n - 2):
        if not any(a == names[i] for a, _ in edges):
            edges.add((names[i], names[rnd.randint(max(i + 1, 2), n - 1)]))
    vertices = [src(v, 4) if v in sources else sink(v, 4) if v in sinks else work(v, 4) for v in names]
    doc = manifest(vertices, [edge(a, b) for a, b in sorted(edges)], name="rnd", nodes=4, slotsPerNode=4 * n)
    return parse_manifest(doc), doc


def random_samples(
    rnd: random.Random,
    topology: Topology,
    intervals: int,
    interval_s: float,
    *,
    missing: float = 0.15,
    restart: float = 0.04,
    jitter: bool = True,
) -> list[MetricSample]:
    out: list[MetricSample] = []
    base = 1_700_000_000.0
    for v in topology.order:
        sink_vertex = topology.graph.out_degree(v) == 0
        for e in range(rnd.randint(1, 4)):
            first = rnd.randint(0, intervals // 2) if rnd.random() < 0.3 else 0  # joins late
            last = rnd.randint(intervals // 2, intervals) if rnd.random() < 0.2 else intervals  # leaves early
            started_at = base + first * interval_s - rnd.random() * interval_s
            node = f"n{rnd.randint(0, 3)}"
            counters = [0, 0, 0, 0.0]
            for j in range(first, last):
                ts = base + j * interval_s + (rnd.choice([0.0, 1e-6, -1e-6, 0.5 * interval_s]) if jitter else 0.0)
                if rnd.random() < restart:
                    started_at = ts - rnd.random() * interval_s * 0.5
                    counters = [0, 0, 0, 0.0]
                    node = f"n{rnd.randint(0, 3)}"
                done = rnd.randint(0, 500)
                counters[0] += done + rnd.randint(0, 5)
                counters[1] += done
                counters[2] += 0 if sink_vertex else done * rnd.randint(0, 2)
                counters[3] += rnd.random() * interval_s
                if rnd.random() < missing:
                    continue
                out.append(
                    MetricSample(
                        ts=ts,
                        node=node,
                        vertex=v,
                        executor=f"{v}#{e}",
                        started_at=started_at,
                        received=counters[0],
                        processed=counters[1],
                        emitted=counters[2],
                        busy_s=counters[3],
                        queue_len=rnd.randint(0, 100),
                        latency_ms=rnd.random() * 10,
                    )
                )
    rnd.shuffle(out)
    return out


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def assert_agree(spark_result: Analysis, reference: Analysis) -> None:
    assert spark_result.window_start == reference.window_start
    assert spark_result.window_end == reference.window_end
    assert spark_result.samples_used == reference.samples_used
    assert spark_result.snapshot.placement == reference.snapshot.placement
    assert spark_result.congested == reference.congested
    assert spark_result.snapshot.vertices.keys() == reference.snapshot.vertices.keys()
    for v, ref in reference.snapshot.vertices.items():
        got = spark_result.snapshot.vertices[v]
        for name in ref.__dataclass_fields__:
            assert close(getattr(got, name), getattr(ref, name)), (v, name, getattr(got, name), getattr(ref, name))
    for v in reference.etp:
        assert close(spark_result.etp[v], reference.etp[v]), v
    assert spark_result.node_etp_sum.keys() == reference.node_etp_sum.keys()
    for n in reference.node_etp_sum:
        assert close(spark_result.node_etp_sum[n], reference.node_etp_sum[n]), n


@pytest.mark.parametrize("seed", range(8))
def test_spark_agrees_with_reference_on_random_sets(spark, seed):
    rnd = random.Random(seed)
    topology, _ = random_topology(rnd, n=rnd.randint(4, 16))
    interval_s = rnd.choice([0.5, 1.0, 2.0])
    samples = random_samples(rnd, topology, rnd.randint(1, 50), interval_s)
    window = rnd.randint(1, 30)
    rate = rnd.choice([1.0, 1.2, 2.0])
    reference = analyze_samples(topology, samples, window=window, interval_s=interval_s, congestion_rate=rate)
    assert reference.samples_used > 0
    assert_agree(analyze_with_spark(spark, topology, samples, window, interval_s, rate), reference)


def test_spark_agrees_on_a_frame_with_foreign_vertices_and_many_executors(spark):
    rnd = random.Random(99)
    topology, _ = random_topology(rnd, n=40)
    samples = random_samples(rnd, topology, 40, 1.0)
    foreign = [MetricSample(2e9, "n0", "other", "other#0", 0.0, 9, 9, 9, 1.0, 1)]  # later ts, unknown vertex
    frame = samples_frame(spark, samples + foreign)
    reference = analyze_samples(topology, samples, window=20)
    assert_agree(analyze_with_spark(spark, topology, frame, 20), reference)


def test_spark_edge_cases_match_reference(spark):
    rnd = random.Random(5)
    topology, _ = random_topology(rnd, n=5)
    one = random_samples(rnd, topology, 3, 1.0, missing=0.0)[:1]
    zero = [MetricSample(float(t), "n0", v, f"{v}#0", 0.0, 0, 0, 0, 0.0, t) for t in range(5) for v in topology.order]
    for samples in ([], one, zero):
        reference = analyze_samples(topology, samples, window=3)
        assert_agree(analyze_with_spark(spark, topology, samples, 3), reference)
    empty_frame = samples_frame(spark, [])
    assert_agree(analyze_with_spark(spark, topology, empty_frame, 3), analyze_samples(topology, [], window=3))


def gappy_window() -> tuple[Topology, list[MetricSample]]:
    """a -> b -> c with missing samples, a restart on an interval boundary, a restart with downtime, an
    executor joining late (its first samples missing), one leaving, and a baseline long before the window.
    Every count and busy second is exact in binary, so the engines must agree to the last bit."""
    topology = parse_manifest(manifest([src("a"), work("b", 4), sink("c")], [edge("a", "b"), edge("b", "c")]))

    def run(executor: str, ts: Iterable[float], per_s: int, started_at: float = 0.0) -> list[MetricSample]:
        vertex = executor.split("#")[0]
        out = []
        for t in ts:
            count = int(per_s * (t - started_at))
            emitted = 0 if vertex == "c" else count
            out.append(
                MetricSample(
                    t, "n1", vertex, executor, started_at, count, count, emitted, 0.5 * (t - started_at), int(t) % 7
                )
            )
        return out

    ticks = [float(t) for t in range(1, 41)]
    samples = run("a#0", [t for t in ticks if t not in (13, 14, 15, 16)], 100)  # a gap
    samples += run("a#1", [t for t in ticks if t <= 24], 60)
    samples += run("a#1", [t for t in ticks if t >= 27], 60, started_at=24.0)  # restart on a boundary, late
    samples += run("b#0", [t for t in ticks if t <= 20 or t >= 33], 80)  # a gap of 12
    samples += run("b#1", [t for t in ticks if t <= 29], 50)
    samples += run("b#1", [t for t in ticks if t >= 31.5], 50, started_at=30.5)  # down (29, 30.5]
    samples += run("b#2", [t for t in ticks if t >= 35], 40, started_at=31.0)  # joins, first reports late
    samples += run("b#3", [t for t in ticks if t <= 26], 40)  # leaves
    samples += run("c#0", [1.0, 2.0, 3.0, 38.0, 40.0], 90)  # baseline long before any window
    samples += run("c#1", [t + 0.25 for t in ticks[:-1] if t % 3 == 0], 30)  # sparse, off the interval grid
    return topology, samples


@pytest.mark.parametrize(("window", "interval_s"), [(10, 1.0), (20, 0.5), (30, 1.0), (7, 2.0), (1, 1.0)])
def test_spark_agrees_exactly_with_reference_on_a_window_with_gaps(spark, window, interval_s):
    topology, samples = gappy_window()
    reference = analyze_samples(topology, samples, window=window, interval_s=interval_s)
    assert reference.samples_used > 0
    result = analyze_with_spark(spark, topology, samples, window, interval_s)
    assert result == reference  # every total exact: the trends too, half-integers times integers
    if interval_s == 1.0 and window in (10, 30):
        # a#0 and a#1 steady through their gap and their restart: the input of b has no trend at all
        assert reference.snapshot.vertices["b"].input_trend == 0.0
    assert_agree(analyze_with_spark(spark, topology, samples_frame(spark, samples), window, interval_s), reference)


@pytest.mark.parametrize("seed", range(3))
def test_spark_agrees_with_reference_on_random_sets_with_many_gaps(spark, seed):
    rnd = random.Random(1000 + seed)
    topology, _ = random_topology(rnd, n=8)
    interval_s = rnd.choice([0.5, 1.0, 2.0])
    samples = random_samples(rnd, topology, 40, interval_s, missing=0.5, restart=0.08)
    window = rnd.randint(5, 30)
    reference = analyze_samples(topology, samples, window=window, interval_s=interval_s)
    result = analyze_with_spark(spark, topology, samples, window, interval_s)
    assert_agree(result, reference)
    # the trend sums are exact in both engines: the trends are identical, not just close
    assert {v: m.input_trend for v, m in result.snapshot.vertices.items()} == {
        v: m.input_trend for v, m in reference.snapshot.vertices.items()
    }


def test_redis_hot_window_round_trip(spark, redis_url):
    rnd = random.Random(11)
    topology, _ = random_topology(rnd, n=8)
    samples = random_samples(rnd, topology, 60, 1.0, missing=0.0, restart=0.0, jitter=False)
    samples.sort(key=lambda s: s.ts)
    client = redis.Redis.from_url(redis_url)
    stream = MetricStream(client, topology.redis_prefix)
    assert stream.publish(samples) == len(samples)
    hot = read_hot_window(stream, 10, 1.0)
    end = max(s.ts for s in samples)
    assert sorted(hot, key=repr) == sorted([s for s in samples if s.ts >= end - 20.0], key=repr)
    reference = analyze_samples(topology, samples, window=10)
    assert_agree(analyze_with_spark(spark, topology, hot, 10), reference)
    assert read_hot_window(MetricStream(client, "elastream:{empty/x}:"), 10, 1.0) == []
    client.close()


def test_parquet_archive_round_trip(spark, tmp_path):
    rnd = random.Random(12)
    topology, _ = random_topology(rnd, n=10)
    samples = random_samples(rnd, topology, 30, 1.0)
    archive = str(tmp_path / "archive")
    append_parquet(spark, samples[: len(samples) // 2], archive)
    append_parquet(spark, samples[len(samples) // 2 :], archive)
    assert sorted(read_parquet_local(archive), key=repr) == sorted(samples, key=repr)
    frame = read_parquet(spark, "file://" + archive)
    assert frame.count() == len(samples)
    reference = analyze_samples(topology, samples, window=15)
    assert_agree(analyze_with_spark(spark, topology, frame, 15), reference)
    local = str(tmp_path / "local")
    write_parquet_local(samples, local)
    assert_agree(analyze_with_spark(spark, topology, read_parquet(spark, local), 15), reference)


@pytest.fixture
def published(redis_url, tmp_path):
    rnd = random.Random(21)
    topology, doc = random_topology(rnd, n=6)
    path = tmp_path / "rnd.yaml"
    path.write_text(yaml.safe_dump(doc))
    samples = random_samples(rnd, topology, 30, 1.0, missing=0.0, restart=0.0, jitter=False)
    client = redis.Redis.from_url(redis_url)
    MetricStream(client, topology.redis_prefix).publish(sorted(samples, key=lambda s: s.ts))
    client.close()
    return topology, samples, str(path)


def test_cli_analyze_json_against_real_redis(spark, published, redis_url, capsys):
    topology, samples, path = published
    reference = analyze_samples(topology, samples, window=10, congestion_rate=1.2)
    for engine in ("spark", "python"):
        capsys.readouterr()
        argv = ["analyze", "--redis", redis_url, "--topology", path, "--window", "10", "--json", "--engine", engine]
        assert main(argv) == 0
        data = json.loads(capsys.readouterr().out)
        assert set(data) == {"vertices", "placement", "etp"}
        expected = json.loads(json.dumps(reference.to_dict(topology)))
        assert data["placement"] == expected["placement"]
        for v, row in expected["vertices"].items():
            assert data["vertices"][v].keys() == row.keys()
            for key, value in row.items():
                assert close(data["vertices"][v][key], value), (engine, v, key)
        for v, row in expected["etp"]["vertices"].items():
            assert data["etp"]["vertices"][v]["congested"] == row["congested"]
            assert close(data["etp"]["vertices"][v]["etp"], row["etp"])


def test_cli_analyze_output_feeds_etp_and_plan(spark, published, redis_url, tmp_path, capsys):
    _, _, path = published
    capsys.readouterr()
    assert main(["analyze", "--redis", redis_url, "--topology", path, "--window", "10", "--json"]) == 0
    snap = tmp_path / "snap.json"
    snap.write_text(capsys.readouterr().out)
    data = json.loads(snap.read_text())
    assert main(["etp", path, "--metrics", str(snap), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert {v: row["etp"] for v, row in table["vertices"].items()} == {
        v: row["etp"] for v, row in data["etp"]["vertices"].items()
    }
    assert main(["plan", path, "--metrics", str(snap), "--nodes", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["to_nodes"] == 5


def test_cli_analyze_table_and_parquet(spark, published, redis_url, tmp_path, capsys):
    topology, samples, path = published
    capsys.readouterr()
    assert main(["analyze", "--redis", redis_url, "--topology", path, "--window", "10"]) == 0
    out = capsys.readouterr().out
    assert "engine spark" in out and "ETPSum" in out
    for v in topology.order:
        assert f"\n{v} " in out
    archive = str(tmp_path / "arch")
    write_parquet_local(samples, archive)
    for engine in ("spark", "python"):
        assert main(["analyze", "--parquet", archive, "--topology", path, "--window", "10", "--engine", engine]) == 0
        assert f"engine {engine}" in capsys.readouterr().out
    assert main(["analyze", "--parquet", str(tmp_path / "nope"), "--topology", path]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_cli_unreachable_redis_is_one_error_line(tmp_path):
    _, doc = random_topology(random.Random(1), n=4)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "elastream", "analyze", "--redis", "redis://127.0.0.1:1/0", "--topology", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: cannot reach Redis at redis://127.0.0.1:1/0")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_analyzer_falls_back_loudly_when_spark_cannot_start(monkeypatch):
    def broken():
        raise SparkUnavailable("no Java runtime found (test)")

    monkeypatch.setattr("elastream.analysis.get_session", broken)
    rnd = random.Random(3)
    topology, _ = random_topology(rnd, n=5)
    samples = random_samples(rnd, topology, 10, 1.0)
    analyzer = Analyzer()
    with pytest.warns(RuntimeWarning, match="falling back to the Python reference.*no Java runtime"):
        result = analyzer.analyze(topology, samples, window=5)
    assert analyzer.engine_used == "python" and "no Java" in (analyzer.fallback_reason or "")
    assert result == analyze_samples(topology, samples, window=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Analyzer("python").analyze(topology, samples, window=5) == result


def test_session_configuration_from_environment(monkeypatch):
    monkeypatch.setenv(spark_session.CONF_ENV, "spark.executor.memory=2g, spark.sql.shuffle.partitions=8")
    monkeypatch.setenv(spark_session.MASTER_ENV, "spark://master:7077")
    conf = spark_session.session_conf()
    assert conf["spark.executor.memory"] == "2g" and conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.ui.enabled"] == "false"
    assert spark_session.spark_master() == "spark://master:7077"
    monkeypatch.setenv(spark_session.CONF_ENV, "spark.executor.memory")
    with pytest.raises(SparkUnavailable, match="not key=value"):
        spark_session.session_conf()
    monkeypatch.delenv(spark_session.MASTER_ENV)
    assert spark_session.spark_master() == "local[*]"
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "no Java runtime" in (spark_session._java_problem() or "")


def test_cli_falls_back_to_python_with_one_warning_line(tmp_path):
    env = {"PATH": "/nonexistent", "JAVA_HOME": "", "HOME": str(tmp_path)}  # no Java anywhere
    proc, expected = _analyze_subprocess(tmp_path, env, seed=4)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "warning: Spark unavailable, falling back to the Python reference analysis: no Java runtime found "
        "(set JAVA_HOME or put java on PATH; Spark 3.5 needs Java 8, 11 or 17)"
    ]
    assert json.loads(proc.stdout) == expected


def test_warm_up_runs_a_first_analysis_on_spark(spark):
    rnd = random.Random(31)
    topology, _ = random_topology(rnd, n=6)
    analyzer = Analyzer(spark=spark)
    result = analyzer.warm_up(topology)
    assert result is not None and analyzer.engine_used == "spark" and analyzer.warm_analysis is result
    window = synthetic_window(topology, WARM_WINDOW, WARM_RUNS - 1)
    assert window and {s.vertex for s in window} == set(topology.order)
    expected = analyze_samples(topology, window, window=WARM_WINDOW)
    assert_agree(result, expected)
    assert result.samples_used > 0 and all(m.processing_rate > 0 for m in result.snapshot.vertices.values())
    assert Analyzer(spark=spark).warm_up() is not None  # a built-in topology when none is given
    assert Analyzer("python").warm_up(topology) is None


def test_spark_error_reason_is_the_deepest_java_cause(spark):
    with pytest.raises(Exception) as caught:
        spark.range(3).selectExpr("raise_error('kaput at the bottom')").collect()
    assert "An error occurred while calling" in str(caught.value).splitlines()[0]  # what py4j says first
    assert spark_session.spark_error_reason(caught.value) == "java.lang.RuntimeException: kaput at the bottom"
    wrapped = SparkUnavailable("outer")
    wrapped.__cause__ = caught.value
    assert spark_session.spark_error_reason(wrapped) == "java.lang.RuntimeException: kaput at the bottom"
    assert spark_session.spark_error_reason(ValueError("plain\nsecond line")) == "plain"


def test_master_urls_are_checked_before_spark_starts():
    assert spark_session.master_addresses("local[*]") == []
    assert spark_session.master_addresses("spark://a:7078,b") == [("a", 7078), ("b", 7077)]
    assert spark_session.master_addresses("k8s://https://api.example:6443") == [("api.example", 6443)]
    for bad in ("foo://x", "spark://", "spark://h:port"):
        with pytest.raises(SparkUnavailable, match="is not a Spark master URL; use local"):
            spark_session.master_addresses(bad)
    with pytest.raises(
        SparkUnavailable, match=r"cannot reach the Spark master spark://127.0.0.1:1 \(127.0.0.1:1: conn"
    ):
        spark_session.probe_master("spark://127.0.0.1:1")


def _analyze_subprocess(tmp_path, env: dict[str, str], seed: int = 8) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`elastream analyze --parquet` in a process with `env`, on an archive of random samples of a random
    topology (from `seed`); its result and the Python reference analysis's."""
    rnd = random.Random(seed)
    topology, doc = random_topology(rnd, n=5)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    samples = random_samples(rnd, topology, 20, 1.0)
    write_parquet_local(samples, str(tmp_path / "arch"))
    argv = ["analyze", "--parquet", str(tmp_path / "arch"), "--topology", str(path), "--window", "5", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "elastream", *argv], capture_output=True, text=True, timeout=120, env=env
    )
    expected = json.loads(json.dumps(analyze_samples(topology, samples, window=5).to_dict(topology)))
    return proc, expected


def test_unreachable_master_falls_back_without_starting_spark(tmp_path):
    proc, expected = _analyze_subprocess(tmp_path, {**os.environ, spark_session.MASTER_ENV: "spark://127.0.0.1:1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "warning: Spark unavailable, falling back to the Python reference analysis: cannot reach the Spark master "
        "spark://127.0.0.1:1 (127.0.0.1:1: connection refused); start it, fix ELASTREAM_SPARK_MASTER, or unset it "
        "to analyse on local[*]"
    ]
    assert json.loads(proc.stdout) == expected


def test_silent_master_start_is_capped_by_the_start_timeout(tmp_path):
    # a master that accepts connections and never answers: Spark itself would retry for over a minute
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        master = f"spark://127.0.0.1:{silent.getsockname()[1]}"
        env = {**os.environ, spark_session.MASTER_ENV: master, spark_session.START_TIMEOUT_ENV: "3"}
        proc, expected = _analyze_subprocess(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    warning = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warning == [
        "warning: Spark unavailable, falling back to the Python reference analysis: Spark did not start within 3 s "
        f"with master {master} (no executors, or the master does not answer); check the cluster, or raise "
        "ELASTREAM_SPARK_START_TIMEOUT"
    ]
    assert json.loads(proc.stdout) == expected


FAIL_DURING_ANALYSIS = """
import json, os, sys, warnings
from pyspark import SparkContext
from elastream.analysis import Analyzer, synthetic_window
from elastream.core.window_analysis import analyze_samples
from elastream.core.topology import parse_manifest

doc = json.loads(sys.argv[1])
topology = parse_manifest(doc)
analyzer = Analyzer()
assert analyzer.warm_up(topology) is not None and analyzer.engine_used == "spark"
SparkContext._gateway.proc.kill()  # the JVM dies after start-up (OOM killer, crash)
SparkContext._gateway.proc.wait()
samples = synthetic_window(topology, 8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = analyzer.analyze(topology, samples, window=8)
out = {
    "engine": analyzer.engine_used,
    "reason": analyzer.fallback_reason,
    "warnings": [str(w.message) for w in caught],
    "same": result == analyze_samples(topology, samples, window=8),
}
print("RESULT " + json.dumps(out), flush=True)
os._exit(0)
"""


def test_spark_failing_during_an_analysis_falls_back_to_the_reference(tmp_path):
    _, doc = random_topology(random.Random(9), n=4)
    proc = subprocess.run(
        [sys.executable, "-c", FAIL_DURING_ANALYSIS, json.dumps(doc)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, spark_session.MASTER_ENV: "local[1]"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT ") :])
    assert out["engine"] == "python" and out["same"] is True
    assert out["reason"].startswith("Spark failed during the analysis: ")
    assert "An error occurred while calling" not in out["reason"]
    assert len(out["warnings"]) == 1
    assert out["warnings"][0].startswith(out["reason"])
    assert out["warnings"][0].endswith("falling back to the Python reference analysis for this window")


def test_a_hot_window_runs_in_one_task_without_a_shuffle_and_leaves_the_session_conf_alone(spark):
    rnd = random.Random(17)
    topology, _ = random_topology(rnd, n=6)
    samples = random_samples(rnd, topology, 30, 1.0)
    before = {key: spark.conf.get(key, None) for key in SMALL_INPUT_CONF}
    assert_agree(analyze_with_spark(spark, topology, samples, 10), analyze_samples(topology, samples, window=10))
    assert {key: spark.conf.get(key, None) for key in SMALL_INPUT_CONF} == before
    samples_frame(spark, samples).createOrReplaceTempView("plan_check")
    try:
        plans = {
            small: spark.sql(analysis_sql("plan_check", 1_700_000_010.0, 10, 1.0, small))
            ._jdf.queryExecution()
            .executedPlan()
            .toString()
            for small in (True, False)
        }
    finally:
        spark.catalog.dropTempView("plan_check")
    assert "Exchange" not in plans[True] and "Coalesce 1" in plans[True]
    assert "Exchange hashpartitioning(vertex" in plans[False]


def test_start_timeout_defaults_and_setting(monkeypatch):
    monkeypatch.delenv(spark_session.START_TIMEOUT_ENV, raising=False)
    assert spark_session.start_timeout_s("local[*]") == 300.0
    assert spark_session.start_timeout_s("spark://master:7077") == 60.0
    monkeypatch.setenv(spark_session.START_TIMEOUT_ENV, "7.5")
    assert spark_session.start_timeout_s("local[*]") == 7.5
    for bad in ("0", "-1", "soon"):
        monkeypatch.setenv(spark_session.START_TIMEOUT_ENV, bad)
        with pytest.raises(SparkUnavailable, match=r"ELASTREAM_SPARK_START_TIMEOUT: .* is not a positive number"):
            spark_session.start_timeout_s()
