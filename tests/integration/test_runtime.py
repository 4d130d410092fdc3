"""The runtime on real worker processes over real sockets and a real Redis: exactly-once delivery without
rescaling, groupings, stateful counts, metrics, and bad input (user errors, missing classes, no Redis)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import defaultdict

import pytest
import redis

from elastream.control.backends.local import LocalCluster, node_host
from elastream.core.schedule import initial_schedule
from elastream.core.topology import stream_key, topology_prefix
from elastream.crd import load_manifest
from elastream.runtime.transport import INITIAL_WINDOW, MAX_BATCH
from elastream.store.metric_stream import MetricStream
from elastream.worker_inputs.keys import generate_keys
from support.harness import ELASTREAM, id_counts, running, sink_events, wait_for_sink, write_manifest
from support.manifests import edge, in_line, manifest, sink, src, work
from support.ports import worker_port

pytestmark = pytest.mark.integration


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def rsink(name: str, parallelism: int = 1) -> dict[str, object]:
    return {"name": name, "parallelism": parallelism, "sink": {"type": "redis-stream"}}


def test_linear_every_event_reaches_the_sink_exactly_once(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [
            src("src", 2, rate=3000, limit=4000, keys=50),
            work("a", 2, costMs=0.1),
            work("b", 3),
            rsink("out", 2),
        ],
        [edge("src", "a"), edge("a", "b"), edge("b", "out")],
        name="linear",
        nodes=3,
        slotsPerNode=3,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        assert len(set(initial_schedule(topology).assignment.values())) == 3  # really spread over 3 processes
        assert wait_for_sink(cluster, topology, "out", 4000) == 4000
        counts = id_counts(sink_events(cluster.client, topology, "out"))
    assert set(counts) == set(range(4000))
    assert max(counts.values()) == 1


def test_diamond_delivers_each_event_once_per_path(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [
            src("src", 1, rate=2000, limit=2000),
            work("left", 2),
            work("right", 1),
            rsink("out"),
        ],
        [
            edge("src", "left"),
            edge("src", "right"),
            edge("left", "out"),
            edge("right", "out"),
        ],
        name="diamond",
        nodes=2,
        slotsPerNode=3,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        assert wait_for_sink(cluster, topology, "out", 4000) == 4000
        counts = id_counts(sink_events(cluster.client, topology, "out"))
    assert set(counts) == set(range(2000))
    assert set(counts.values()) == {2}  # two paths, each exactly once


def test_star_two_sources_reach_every_sink_once(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [
            src("s1", 1, rate=1500, limit=1500),
            src("s2", 1, rate=1500, limit=1500, idOffset=1_000_000),
            work("hub", 2),
            rsink("k1"),
            rsink("k2"),
        ],
        [edge("s1", "hub"), edge("s2", "hub"), edge("hub", "k1"), edge("hub", "k2")],
        name="star",
        nodes=3,
        slotsPerNode=3,
    )
    expected = set(range(1500)) | set(range(1_000_000, 1_001_500))
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        for sink in ("k1", "k2"):
            assert wait_for_sink(cluster, topology, sink, 3000) == 3000
            counts = id_counts(sink_events(cluster.client, topology, sink))
            assert set(counts) == expected
            assert max(counts.values()) == 1


def test_fields_grouping_sends_each_key_to_one_executor_and_counts_are_exact(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [
            src("src", 2, rate=3000, limit=3000, keys=37),
            {
                "name": "count",
                "parallelism": 3,
                "maxParallelism": 12,
                "stateful": True,
                "logic": {"builtin": "count"},
            },
            rsink("out"),
        ],
        [edge("src", "count", "fields", key="key"), edge("count", "out")],
        name="counting",
        nodes=2,
        slotsPerNode=3,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        assert wait_for_sink(cluster, topology, "out", 3000) == 3000
        events = sink_events(cluster.client, topology, "out")
    per_key: dict[str, list[int]] = defaultdict(list)
    for event in events:
        per_key[event["key"]].append(int(event["value"]))
    truth = {str(k): sum(1 for seq in range(3000) if seq % 37 == k) for k in range(37)}
    assert set(per_key) == set(truth)
    for key, counts in per_key.items():
        # one executor owns the key: its running counts are exactly 1..n, no restart, no gap, no repeat
        assert sorted(counts) == list(range(1, truth[key] + 1)), key


def test_metrics_reach_redis_and_prometheus(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [
            src("src", 1, rate=500),
            work("w", 2, costMs=1.0),
            {"name": "out", "sink": {"type": "null"}},
        ],
        [edge("src", "w"), edge("w", "out")],
        name="metrics",
        nodes=2,
        slotsPerNode=2,
    )
    port = worker_port(2)  # on both nodes' addresses, from the OS
    with running(write_manifest(str(tmp_path), doc), redis_url, metrics_port=port) as (
        cluster,
        topology,
    ):
        time.sleep(3.0)
        samples = MetricStream(cluster.client, topology.redis_prefix).read_since(None)
        node = cluster.current_schedule().node_of("out#0")
        body = urllib.request.urlopen(f"http://{node_host(node)}:{port}/metrics", timeout=5).read().decode()
    executors = {s.executor for s in samples}
    assert executors == {"src#0", "w#0", "w#1", "out#0"}
    last = {s.executor: s for s in samples}
    assert last["w#0"].processed > 0 and last["w#0"].busy_s > 0
    assert last["out#0"].latency_ms > 0  # measured (bounded in events by back-pressure: test_runtime_flow.py)
    labels = f'executor="out#0",namespace="{topology.namespace}",node="{node}",topology="{topology.name}"'
    assert f"elastream_executor_processed_total{{{labels},vertex=" in body
    # the end-to-end latency of every event the sink processed, as a histogram (sinks only)
    counts = [line for line in body.splitlines() if line.startswith("elastream_sink_latency_seconds_count{")]
    assert len(counts) == 1 and labels in counts[0] and float(counts[0].rsplit(" ", 1)[1]) > 0, body


def test_a_raising_user_operator_is_reported_not_fatal(tmp_path, redis_url: str) -> None:
    (tmp_path / "userops.py").write_text(
        textwrap.dedent(
            """
            class Fussy:
                def process(self, event, emit):
                    if event.id % 10 == 0:
                        raise ValueError("ids ending in 0 are not welcome")
                    emit(event.value)
            """
        )
    )
    doc = manifest(
        [
            src("src", 1, rate=2000, limit=1000),
            {"name": "fussy", "logic": {"module": "userops:Fussy"}},
            rsink("out"),
        ],
        [edge("src", "fussy"), edge("fussy", "out")],
        name="fussy",
        nodes=1,
    )
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with running(write_manifest(str(tmp_path), doc), redis_url, extra_env=env) as (
        cluster,
        topology,
    ):
        assert wait_for_sink(cluster, topology, "out", 900) == 900
        counts = id_counts(sink_events(cluster.client, topology, "out"))
        time.sleep(1.2)
        errors = [s.errors for s in MetricStream(cluster.client, topology.redis_prefix).read_last(20)]
        log_text = read(cluster.workers["node-0"].log_path)
        cluster.check_alive()  # the worker survived
    assert set(counts) == {i for i in range(1000) if i % 10}
    assert max(errors) == 100
    assert "vertex fussy: executor fussy#0: operator raised ValueError: ids ending in 0 are not welcome" in log_text


def test_a_missing_user_class_fails_at_start_in_one_line(tmp_path) -> None:
    doc = manifest(
        [
            src("src"),
            {"name": "ghost", "logic": {"module": "no_such_module:Ghost"}},
            rsink("out"),
        ],
        [edge("src", "ghost"), edge("ghost", "out")],
        name="ghost",
    )
    path = write_manifest(str(tmp_path), doc)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "elastream",
            "run",
            path,
            "--duration",
            "1",
            "--redis",
            "redis://127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: spec.vertices[ghost].logic.module: cannot import 'no_such_module'")
    assert "Traceback" not in result.stderr


def test_a_worker_without_redis_retries_then_says_why(tmp_path) -> None:
    doc = manifest([src("src"), rsink("out")], [edge("src", "out")], name="lonely")
    path = write_manifest(str(tmp_path), doc)
    command = ["worker", "--topology", path, "--node", "node-0", "--redis", "redis://127.0.0.1:1/0"]
    command += ["--redis-wait", "6"]
    env = {**os.environ, **generate_keys().env()}  # the topology's data-plane keys, as its Secret gives them
    result = subprocess.run([*ELASTREAM, *command], capture_output=True, text=True, timeout=60, check=False, env=env)
    assert result.returncode == 2
    assert result.stderr.count("retrying in") >= 2  # it retried with backoff rather than giving up at once
    assert "error: cannot reach Redis at redis://127.0.0.1:1/0" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_worker_waiting_for_a_peer_says_which(tmp_path, redis_url: str) -> None:
    doc = manifest([src("src"), work("w"), rsink("out")], [edge("src", "w"), edge("w", "out")], name="waiting")
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    cluster = LocalCluster(topology, path, redis_url)
    try:
        schedule = initial_schedule(topology)  # src, w, out round-robin over node-0 and node-1
        cluster.version = cluster.registry.publish_schedule(schedule)
        cluster.schedule = schedule
        cluster.workers["node-0"] = cluster._spawn("node-0")  # node-1 never comes up
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline and "waiting for endpoints" not in text:
            time.sleep(0.5)
            text = read(cluster.workers["node-0"].log_path)
    finally:
        cluster.close()
    assert "waiting for endpoints of" in text and "(on node-1)" in text


def test_run_command_prints_live_throughput_and_reaps_its_processes(tmp_path, redis_url: str) -> None:
    vertices = [src("src", 2, rate=1000), work("w", 2, costMs=0.5), sink("out")]
    doc = in_line(vertices, name="live", nodes=2, slotsPerNode=3)
    path = write_manifest(str(tmp_path), doc)
    result = subprocess.run(
        [*ELASTREAM, "run", path, "--duration", "5", "--redis", redis_url],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip().endswith(tuple("0123456789"))]
    rows = [row for row in rows if row[0].endswith("s") and row[0][:-1].isdigit()]  # time sinks/s lat src w out
    assert len(rows) >= 4
    # the live throughput is the sink's: the `out` column, and events reached it
    assert all(row[1] == row[5] for row in rows) and max(float(row[1]) for row in rows) > 0, rows
    leftover = subprocess.run(["pgrep", "-f", "--", f"--topology {path}"], capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == ""
    client = redis.Redis.from_url(redis_url)
    assert client.exists(f"{load_manifest(path).redis_prefix}metrics")
    # The sink kept up with the sources, in events (a window in seconds would measure the machine): the
    # sources were never held back (a backlog of at most a frame each: a slow sink's back-pressure would
    # leave them thousands of events behind their 1,000/s), and what they emitted reached the sink but for
    # what the 6 channels' credit windows can hold.
    last = {s.executor: s for s in MetricStream(client, load_manifest(path).redis_prefix).read_since(None)}
    sources = [last[f"src#{i}"] for i in range(2)]
    assert all(s.queue_len <= MAX_BATCH for s in sources), sources
    emitted, sunk = sum(s.processed for s in sources), last["out#0"].processed
    assert sunk > 0 and emitted - sunk <= 6 * INITIAL_WINDOW, (emitted, sunk)


def test_stop_and_start_runs_a_new_schedule_on_new_processes(tmp_path, redis_url: str) -> None:
    """What `restart` does (Storm's rebalance): every worker stops, the new schedule starts on new processes."""
    from elastream.core.planner import make_plan
    from elastream.core.simulate import simulate, snapshot_from_simulation

    doc = manifest(
        [src("src", 1, rate=800), work("w", 2, costMs=1.0), rsink("out")],
        [edge("src", "w"), edge("w", "out")],
        name="restart",
        nodes=2,
        slotsPerNode=4,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        before = cluster.current_schedule()
        first_version = cluster.version
        old_pids = {w.process.pid for w in cluster.workers.values()}
        snapshot = snapshot_from_simulation(topology, before, simulate(topology, before))
        new_schedule = make_plan(topology, before, snapshot, 3, "round-robin").new_schedule
        cluster.stop_workers()
        cluster.start(new_schedule)
        assert cluster.version > first_version
        assert set(cluster.workers) == {"node-0", "node-1", "node-2"}
        assert old_pids.isdisjoint(w.process.pid for w in cluster.workers.values())
        assert cluster.registry.ready_nodes(cluster.version) == {"node-0", "node-1", "node-2"}
        length = int(cluster.client.xlen(f"{topology.redis_prefix}sink:out"))
        time.sleep(2.0)
        assert int(cluster.client.xlen(f"{topology.redis_prefix}sink:out")) > length + 500  # still flowing


def test_redis_stream_source_reads_every_entry_once(tmp_path, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    orders = stream_key(topology_prefix("default", "from-redis"), "source", "orders")
    for i in range(500):
        client.xadd(orders, {"key": f"c{i % 7}", "value": str(i)})
    doc = manifest(
        [
            {"name": "orders", "parallelism": 2, "source": {"type": "redis-stream", "stream": "orders"}},
            work("w", 1),
            rsink("out"),
        ],
        [edge("orders", "w"), edge("w", "out")],
        name="from-redis",
        nodes=2,
        slotsPerNode=2,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        assert wait_for_sink(cluster, topology, "out", 500) == 500
        events = sink_events(cluster.client, topology, "out")
    assert sorted(int(e["value"]) for e in events) == list(range(500))


def test_run_uses_an_embedded_redis_without_a_url(tmp_path) -> None:
    doc = manifest([src("src", 1, rate=500), {"name": "out", "sink": {"type": "null"}}], [edge("src", "out")])
    path = write_manifest(str(tmp_path), doc)
    env = {k: v for k, v in os.environ.items() if k != "ELASTREAM_REDIS_URL"}
    result = subprocess.run(
        [*ELASTREAM, "run", path, "--duration", "3"], capture_output=True, text=True, timeout=90, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    assert "embedded Redis" in result.stdout.splitlines()[0]
    rows = [line.split() for line in result.stdout.splitlines()]
    rates = [float(row[1]) for row in rows if row and row[0].endswith("s") and row[0][:-1].isdigit()]
    assert rates and all(rate > 0 for rate in rates[1:]), rates  # events reach the sink in every interval


def test_a_worker_serves_ready_once_its_executors_run(tmp_path, redis_url: str) -> None:
    """The pod readiness probe: /healthz while the process runs, /ready once its executors are bound."""
    from support.ports import free_port

    doc = manifest([src("s", 1, rate=50), sink("z")], [edge("s", "z")], name="probed", nodes=1, slotsPerNode=2)
    path = write_manifest(str(tmp_path), doc)
    port = free_port()
    with running(path, redis_url, health_port=port):
        url = f"http://{node_host('node-0')}:{port}"
        with urllib.request.urlopen(f"{url}/ready", timeout=5) as response:
            assert response.status == 200 and response.read() == b"ok\n"
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            assert response.status == 200


def test_a_worker_listening_on_every_interface_is_reached_at_its_advertised_address(
    tmp_path, redis_url: str, monkeypatch
) -> None:
    """What a worker pod runs by default (`--bind 0.0.0.0:7000 --advertise $(POD_IP)`), on a real process:
    inboxes and /ready listen on every interface (localhost included, as `kubectl port-forward` needs), and
    the endpoints registered for peers name the advertised address."""
    from elastream.control.backends import local
    from support.ports import free_port

    doc = manifest(
        [src("s", 1, rate=500, limit=300), rsink("out")], [edge("s", "out")], name="anywhere", nodes=1, slotsPerNode=2
    )
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    health = free_port()
    argv: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(command, **kwargs):  # type: ignore[no-untyped-def]
        # the local backend's `--bind 127.0.0.2:PORT` becomes the pod's form; ephemeral inbox ports, as
        # 0.0.0.0 is shared with every other test's workers on this machine
        command = list(command)
        i = command.index("--bind")
        command[i + 1 : i + 2] = ["0.0.0.0", "--advertise", node_host("node-0")]
        argv.append(command)
        return real_popen(command, **kwargs)

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    with running(path, redis_url, health_port=health) as (cluster, _):
        assert argv and argv[0][argv[0].index("--bind") + 1] == "0.0.0.0"
        endpoints = cluster.registry.endpoints(cluster.version)
        assert endpoints and all(e.startswith(f"tcp://{node_host('node-0')}:") for e in endpoints.values())
        assert wait_for_sink(cluster, topology, "out", 300) == 300  # the source reached the sink through it
        for host in ("127.0.0.1", node_host("node-0")):
            with urllib.request.urlopen(f"http://{host}:{health}/ready", timeout=5) as response:
                assert response.status == 200
