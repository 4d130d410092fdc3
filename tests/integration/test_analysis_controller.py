"""The analysis as the controller uses it, on a real Redis (and local Spark): the hot window with missing
samples and a schedule cut-off, the Parquet history archive the controller appends to, topologies named by
the manifest `elastream run` keeps in Redis, and `elastream run` scaling with its warm Spark session."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time

import pytest
import redis

from elastream.analysis import Analyzer, SparkUnavailable
from elastream.analysis import session as spark_session
from elastream.analysis.sources import read_parquet_local
from elastream.cli import main
from elastream.control.metrics import MetricArchiver, StreamMetricSource, archive_cursor_key, local_archive_path
from elastream.core.metrics import MetricSample
from elastream.core.topology import parse_manifest
from elastream.core.window_analysis import analyze_samples
from elastream.store.metric_stream import MetricStream, metric_stream_key
from elastream.store.registry import manifest_key, store_manifest, stored_manifest
from support.harness import ELASTREAM, read_log, run_scale, stop_run, write_manifest
from support.manifests import edge, in_line, manifest, sink, src, work

pytestmark = pytest.mark.integration
BASE = 1_700_000_000.0


@pytest.fixture(scope="module")
def spark():
    try:
        return spark_session.get_session()
    except SparkUnavailable as exc:
        pytest.fail(f"local Spark does not start: {exc}; install Java 17 (make setup)")


def chain(name: str = "hot"):
    doc = manifest([src("a"), work("b", 3), sink("c")], [edge("a", "b"), edge("b", "c")], name=name, nodes=2)
    return parse_manifest(doc), doc


def reports(executor: str, times, per_s: int, *, started_at: float = 0.0, node: str = "n1") -> list[MetricSample]:
    """Cumulative samples of one executor at BASE + t for t in `times` (count = per_s * t since BASE)."""
    vertex = executor.split("#")[0]
    out = []
    for t in times:
        done = per_s * t
        out.append(
            MetricSample(
                ts=BASE + t,
                node=node,
                vertex=vertex,
                executor=executor,
                started_at=BASE + started_at,
                received=done,
                processed=done,
                emitted=0 if vertex == "c" else done,
                busy_s=0.25 * t,
                queue_len=t % 7,
            )
        )
    return out


def publish(client: redis.Redis, prefix: str, samples: list[MetricSample]) -> None:
    MetricStream(client, prefix).publish(sorted(samples, key=lambda s: s.ts))


def newest_entry_id(client: redis.Redis, prefix: str) -> bytes:
    """The id of the newest entry of the topology's metric stream (what an archive cursor ends at)."""
    [(entry_id, _)] = client.xrevrange(metric_stream_key(prefix), count=1)
    return entry_id


def test_hot_window_source_finds_baselines_behind_missing_samples(redis_url):
    topology, _ = chain()
    gap = set(range(17, 22))  # b#0 reports nothing from t=17 to 21: the window (20, 30] starts inside the gap
    samples = reports("a#0", range(1, 31), 100) + reports("c#0", range(1, 31), 100, node="n2")
    samples += reports("b#0", [t for t in range(1, 31) if t not in gap], 50) + reports("b#1", range(1, 31), 50)
    client = redis.Redis.from_url(redis_url)
    publish(client, topology.redis_prefix, samples)
    source = StreamMetricSource(client, topology, Analyzer("python"), interval_s=1.0)
    result = source.analyse(10)
    assert result == analyze_samples(topology, samples, window=10)
    # b#0's baseline is its t=16 report, four intervals before the window start: no count is lost, its
    # 700 since then count in the window (reading one interval before the window would have found no
    # baseline, started it at its first report in the window, t=22, and kept only 400)
    assert result.snapshot.vertices["b"].processing_rate == (50 * 14 + 50 * 10) / 10
    assert result.snapshot.vertices["b"].executors == 2
    assert source.last is result
    assert source.snapshot(10) == result.snapshot
    client.close()


def test_hot_window_source_not_before_cuts_the_window_not_the_baselines(redis_url):
    topology, _ = chain()
    samples = reports("a#0", range(1, 31), 100) + reports("c#0", range(1, 31), 100)
    samples += reports("b#0", range(1, 31), 60)  # keeps running across the cut-off (same incarnation)
    samples += reports("b#1", range(1, 25), 40)  # of the schedule that is gone: stopped before the cut-off
    samples += reports("b#2", range(26, 31), 40, started_at=25.2)  # of the new schedule
    client = redis.Redis.from_url(redis_url)
    publish(client, topology.redis_prefix, samples)
    source = StreamMetricSource(client, topology, Analyzer("python"), interval_s=1.0, not_before=BASE + 25.5)
    result = source.analyse(10)
    assert (result.window_start, result.window_end) == (BASE + 26.0, BASE + 30.0)  # 4 whole intervals since
    assert result == analyze_samples(topology, samples, window=4)
    b = result.snapshot.vertices["b"]
    assert b.executors == 2 and "b#1" not in [e for execs in result.snapshot.placement.values() for e in execs]
    assert b.processing_rate == 60.0 + 40.0  # b#0 and b#2 from their t=26 reports (the window start) on
    source.not_before = BASE + 31.0  # nothing reported since the cut-off yet
    empty = source.analyse(10)
    assert empty.samples_used == 0 and empty.snapshot.placement == {}
    client.close()


def test_archiver_appends_every_entry_once_and_resumes_from_its_cursor(redis_url, tmp_path):
    topology, _ = chain("archived")
    client = redis.Redis.from_url(redis_url)
    first = reports("a#0", range(1, 11), 10) + reports("b#0", range(1, 11), 10)
    second = reports("a#0", range(11, 21), 10) + reports("b#0", range(11, 21), 10)
    third = reports("c#0", range(1, 21), 10)
    path = str(tmp_path / "archive")
    publish(client, topology.redis_prefix, first)
    archiver = MetricArchiver(client, topology, path, batch=7)
    assert archiver.archive_once() == len(first)
    assert archiver.archive_once() == 0
    cursor_key = archive_cursor_key(topology, path)
    assert client.get(cursor_key) == newest_entry_id(client, topology.redis_prefix)
    publish(client, topology.redis_prefix, second)
    restarted = MetricArchiver(client, topology, path, batch=5)  # a restarted controller: the cursor is in Redis
    assert restarted.archive_once() == len(second)
    assert client.get(cursor_key) == newest_entry_id(client, topology.redis_prefix)
    assert sorted(read_parquet_local(path), key=repr) == sorted(first + second, key=repr)
    other = MetricArchiver(client, topology, str(tmp_path / "other"))  # another archive has its own cursor
    assert other.archive_once() == len(first) + len(second)
    background = MetricArchiver(client, topology, path, every_s=3600.0).start()
    publish(client, topology.redis_prefix, third)
    assert background.stop() == len(third)  # the last pass at stop archives what came since
    assert sorted(read_parquet_local(path), key=repr) == sorted(first + second + third, key=repr)
    client.close()


def test_local_archive_paths():
    assert local_archive_path("/data/archive") == "/data/archive"
    assert local_archive_path("relative/dir") == "relative/dir"
    assert local_archive_path("file:///data/archive") == "/data/archive"
    assert local_archive_path("s3a://bucket/metrics") is None
    assert local_archive_path("hdfs://nn:8020/metrics") is None


def test_analyze_names_a_topology_stored_in_redis(redis_url, tmp_path, capsys):
    topology, doc = chain("named")
    path = write_manifest(str(tmp_path), doc)
    doc_prod = json.loads(json.dumps(doc))
    doc_prod["metadata"]["namespace"] = "prod"
    prod = parse_manifest(doc_prod)
    client = redis.Redis.from_url(redis_url)
    samples = reports("a#0", range(1, 21), 10) + reports("b#0", range(1, 21), 10) + reports("c#0", range(1, 21), 10)
    for topo in (topology, prod):
        store_manifest(client, topo)
        publish(client, topo.redis_prefix, samples)
    stored = parse_manifest(stored_manifest(client, "named") or {})
    assert (stored.name, stored.namespace, stored.order, stored.spec) == (
        "named",
        "default",
        topology.order,
        topology.spec,
    )
    stored_prod = parse_manifest(stored_manifest(client, "prod/named") or {})
    assert (stored_prod.name, stored_prod.namespace, stored_prod.spec) == ("named", "prod", prod.spec)
    assert stored_manifest(client, "ghost") is None
    outputs = []
    for spec in (path, "named", "prod/named"):
        capsys.readouterr()
        argv = ["analyze", "--redis", redis_url, "--topology", spec, "--window", "5", "--json", "--engine", "python"]
        assert main(argv) == 0, capsys.readouterr().err
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0] == json.loads(json.dumps(analyze_samples(topology, samples, window=5).to_dict(topology)))
    capsys.readouterr()
    assert main(["analyze", "--redis", redis_url, "--topology", "ghost", "--engine", "python"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --topology: no topology ghost in Redis at {redis_url} (no key ")
    assert manifest_key("ghost") in err and f"elastream run FILE --redis {redis_url}" in err
    assert main(["analyze", "--parquet", str(tmp_path), "--topology", "named"]) == 1
    assert "is not a file; give the manifest file, or --redis URL" in capsys.readouterr().err
    assert main(["analyze", "--redis", redis_url, "--topology", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err
    client.close()


def close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def wait_for_line(path: str, text: str, proc: subprocess.Popen[bytes], limit_s: float = 400.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with open(path, encoding="utf-8", errors="replace") as handle:
            if text in handle.read():
                return
        assert proc.poll() is None, f"elastream run exited early ({proc.returncode})"
        time.sleep(0.5)
    pytest.fail(f"{text!r} never appeared in the output of elastream run")


def test_run_scales_with_warm_spark_and_its_archive_agrees_with_redis(spark, redis_url, tmp_path, capsys):
    vertices = [src("src", 2, rate=300), work("w", 2, costMs=0.2), sink("out")]
    doc = in_line(vertices, name="archived-run", nodes=2, slotsPerNode=3)
    path = write_manifest(str(tmp_path), doc)
    archive = str(tmp_path / "archive")
    out_path = str(tmp_path / "run.out")
    command = [*ELASTREAM, "run", path, "--redis", redis_url, "--archive-every", "2"]
    env = {**os.environ, "ELASTREAM_METRICS_ARCHIVE": archive}  # the archive path from the environment
    with open(out_path, "wb") as out:
        run = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        # the warm-up (session and a first analysis) is reported before any scaling request was made
        wait_for_line(out_path, "metric analysis: Spark ready", run)
        scale, status = run_scale(path, redis_url, "--nodes", "3", "--timeout", "300", timeout_s=400)
        assert status is not None, scale.stdout + scale.stderr
        assert status["analysisEngine"] == "spark", scale.stdout
        assert scale.returncode == 0, scale.stdout + scale.stderr
        assert (status["outcome"], status["fromNodes"], status["toNodes"]) == ("succeeded", 2, 3), scale.stdout
        time.sleep(3.0)  # a few intervals of the new schedule in the stream
    finally:
        stop_run(run, 120)
    output = read_log(out_path)
    lines = output.splitlines()
    assert f"archiving metric samples to {archive} every 2 s" in lines
    ready = next(i for i, line in enumerate(lines) if line.startswith("metric analysis: Spark ready"))
    engine = next(i for i, line in enumerate(lines) if line.strip() == "analysis engine: spark")
    assert ready < engine
    archived = next(line for line in lines if line.startswith("archived "))
    assert int(archived.split()[1]) > 0
    client = redis.Redis.from_url(redis_url)
    assert int(archived.split()[1]) == client.xlen(f"{parse_manifest(doc).redis_prefix}metrics")
    client.close()

    capsys.readouterr()
    assert main(["analyze", "--redis", redis_url, "--topology", "archived-run", "--window", "5", "--json"]) == 0
    from_redis = json.loads(capsys.readouterr().out)
    assert main(["analyze", "--parquet", archive, "--topology", path, "--window", "5", "--json"]) == 0
    from_archive = json.loads(capsys.readouterr().out)
    # Nothing is congested (w can do 5000/s per executor), so every vertex runs at about the sources' rate;
    # catching up the events held during the migration may lift a window above it.
    offered = parse_manifest(doc).vertices["src"].source_rate
    assert offered == 300.0
    rates = {v: row["processing_rate"] for v, row in from_redis["vertices"].items()}
    assert rates.keys() == {"src", "w", "out"}
    assert all(0.5 * offered <= rate <= 1.5 * offered for rate in rates.values()), rates
    assert 0.5 * offered <= from_redis["vertices"]["src"]["input_rate"] <= 1.5 * offered, from_redis
    # scale-out moves no executor, so the window's executors are those of the new schedule
    placement = {node: sorted(executors) for node, executors in from_redis["placement"].items()}
    planned = {node: sorted(executors) for node, executors in status["plan"]["schedule"]["placement"].items()}
    assert placement == planned, (placement, planned)
    assert close(from_redis, from_archive), (from_redis, from_archive)
