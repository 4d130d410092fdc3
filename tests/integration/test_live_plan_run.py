"""`elastream plan --live` against a running `elastream run` (real worker processes, a real Redis), as a user
runs it: a too-short window refused in one line, the plan and its prediction for 3 nodes with nothing written,
then `elastream scale` to 3 nodes and the throughput measured afterwards beside the prediction. And on a Redis
holding what workers would have left (no worker running, so every key must stay byte for byte the same): an
answer, then each question it cannot answer refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest
import redis

from elastream.core.metrics import MetricSample
from elastream.core.schedule import initial_schedule
from elastream.core.topology import Topology, parse_manifest
from elastream.crd import load_manifest
from elastream.store.metric_stream import MetricStream
from elastream.store.registry import Registry, store_manifest
from support.harness import ELASTREAM, read_log, run_scale, start_run, stop_run, write_manifest
from support.manifests import edge, keyed_count_pipeline, manifest, sink, src, work

pytestmark = pytest.mark.integration

NAMESPACE, NAME = "analytics", "live-what-if"
REF = f"{NAMESPACE}/{NAME}"


def _live_plan(redis_url: str, *args: str, ref: str = REF, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELASTREAM, "plan", "--live", ref, "--redis-url", redis_url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env} if env else None,
    )


def _plan_once_the_window_is_full(redis_url: str, nodes: int, timeout_s: float = 90.0) -> dict[str, Any]:
    """`plan --live --output json`, asked again while it says the window is still filling."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = _live_plan(redis_url, "--nodes", str(nodes), "--output", "json")
        if result.returncode == 0:
            return json.loads(result.stdout)
        assert "the metric window has" in result.stderr, result.stdout + result.stderr
        assert time.monotonic() < deadline, result.stderr
        time.sleep(1.0)


def _watched(client: redis.Redis, prefix: str) -> dict[str, bytes | None]:
    """Every key of the topology a plan could write, DUMPed: all but its streams (the workers append metrics)
    and the sources' positions (rewritten every interval); and the request, status and claim keys, present
    or not. (The run takes no periodic checkpoint, whose rounds would rewrite keys of their own.)"""
    keys = {k.decode() for k in client.scan_iter(match=f"{prefix}*", count=1000)}
    named = {f"{prefix}{s}" for s in ("scale-request", "last-scaling", "last-recovery", "autoscaler", "mig:current")}
    watched = {k for k in keys if client.type(k) != b"stream" and k != f"{prefix}positions"} | named
    return {k: client.dump(k) for k in sorted(watched)}


def test_plan_live_predicts_the_scale_out_that_the_scale_then_measures(tmp_path, redis_url: str) -> None:
    # src offers 300/s; w (5 ms an event, one executor) processes about 200/s: w is the bottleneck
    doc = keyed_count_pipeline(NAME, cost_ms=5.0, count_parallelism=1, slots_per_node=3)
    doc["metadata"]["namespace"] = NAMESPACE
    doc["spec"]["scaling"] = {"window": 8, "checkpointIntervalSeconds": 0}
    path = write_manifest(str(tmp_path), doc)
    prefix = load_manifest(path).redis_prefix
    client = redis.Redis.from_url(redis_url)
    run, log_path = start_run(str(tmp_path), path, redis_url, duration_s=300)
    try:
        deadline = time.monotonic() + 60
        while not client.exists(f"{prefix}metrics") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert client.exists(f"{prefix}metrics"), read_log(log_path)[-2000:]

        early = _live_plan(redis_url, "--nodes", "3", "--window", "60")
        assert early.returncode == 1 and early.stdout == "", early.stdout + early.stderr
        (line,) = early.stderr.strip().splitlines()
        assert line.startswith("error: the metric window has ") and "of 60 intervals" in line
        assert line.endswith("or lower --window")

        before = _watched(client, prefix)
        planned = _plan_once_the_window_is_full(redis_url, 3)
        text = _live_plan(redis_url, "--nodes", "3")
        after = _watched(client, prefix)
        assert after == before  # nothing written: no request, no status, no claim, the schedule untouched
        assert before[f"{prefix}scale-request"] is None and before[f"{prefix}last-scaling"] is None
        assert "ScalingPlanned" not in read_log(log_path)  # the run was asked nothing

        assert planned["topology"] == REF and planned["spec_from"] == "redis" and planned["applied"] is False
        assert planned["window"]["intervals"] == 8 and planned["window"]["engine"] == "python"
        plan = planned["plan"]
        assert plan["direction"] == "out" and plan["from_nodes"] == 2 and plan["to_nodes"] == 3
        assert plan["added_nodes"] == ["node-2"]
        assert "w" in planned["congested"] and any(e["vertex"] == "w" for e in plan["new_executors"])
        predicted, current = planned["predicted_throughput"], planned["measured_throughput"]
        assert current > 0.0 and predicted > 1.2 * current  # the bottleneck gets executors: more than now

        assert text.returncode == 0, text.stderr
        assert f"live {REF}: 2 nodes running" in text.stdout
        assert "plan live-what-if: scale out 2 -> 3 nodes with stela" in text.stdout
        assert "nothing applied; to apply: elastream scale FILE --nodes 3" in text.stdout
        print(f"$ elastream plan --live {REF} --nodes 3\n{text.stdout}")

        scale, status = run_scale(path, redis_url, "--nodes", "3", "--timeout", "150")
        assert scale.returncode == 0 and status is not None, scale.stdout + scale.stderr
        assert status["outcome"] == "succeeded" and status["toNodes"] == 3
        assert status["plan"]["added_nodes"] == plan["added_nodes"]

        # the same command after the scaling: its window starts once the new schedule settled
        scaled = _plan_once_the_window_is_full(redis_url, 3)
        assert scaled["plan"]["direction"] == "none" and scaled["window"]["start"] > status["finishedAt"]
        measured = scaled["measured_throughput"]
        print(
            f"plan --live on 2 nodes: measured {current:.1f}/s, predicted for 3 nodes {predicted:.1f}/s; "
            f"the controller's plan at the scale predicted {status['predictedThroughput']:.1f}/s from "
            f"{status['throughputBefore']:.1f}/s; measured on 3 nodes afterwards: {measured:.1f}/s"
        )
        assert measured > current  # the scale-out raised the throughput
        assert predicted / 2.0 <= measured <= predicted * 2.0  # a broad factor: the machine is shared and noisy
    finally:
        stop_run(run)
        client.close()


def _chain(name: str) -> dict[str, Any]:
    """s (300/s) -> w (5 ms an event) -> z on 2 nodes of 3 slots, window 8, in the test's namespace."""
    doc = manifest(
        [src("s", 1, rate=300), work("w", 1, costMs=5), sink("z")],
        [edge("s", "w"), edge("w", "z")],
        name=name,
        nodes=2,
        slotsPerNode=3,
        scaling={"window": 8},
    )
    doc["metadata"]["namespace"] = NAMESPACE
    return doc


def _reported(client: redis.Redis, topology: Topology, ending: float, intervals: int = 12) -> None:
    """What the workers of `topology` (on its initial schedule) would have published for `intervals` intervals
    up to `ending`: s offered 300/s and sending 200/s, w busy all the time at 200/s, z at 200/s."""
    rows = {"s": (300, 200, 200, 0.6), "w": (200, 200, 200, 1.0), "z": (200, 200, 0, 0.1)}
    nodes = dict(initial_schedule(topology).assignment)
    started = ending - intervals - 0.5
    samples = [
        MetricSample(ending - intervals + t, nodes[f"{v}#0"], v, f"{v}#0", started, r * t, p * t, e * t, b * t, 0)
        for t in range(intervals + 1)
        for v, (r, p, e, b) in rows.items()
    ]
    MetricStream(client, topology.redis_prefix).publish(samples)


def _everything(client: redis.Redis) -> dict[bytes, bytes | None]:
    return {k: client.dump(k) for k in sorted(client.scan_iter(count=1000))}


def test_plan_live_reads_only_and_says_what_it_cannot_answer(tmp_path, redis_url: str) -> None:
    """No worker runs: what they would have left in Redis is written by the test, and nothing else changes
    it, so every key (streams included) must be byte for byte the same after every call, answered or not."""
    client = redis.Redis.from_url(redis_url)
    now = time.time()
    running, bare, stopped = (parse_manifest(_chain(n)) for n in ("synthetic", "bare", "stopped"))
    for topology in (running, bare, stopped):
        Registry(client, topology.redis_prefix).publish_schedule(initial_schedule(topology))
    store_manifest(client, running)
    store_manifest(client, stopped)
    _reported(client, running, now)
    _reported(client, stopped, now - 200.0)
    other = write_manifest(str(tmp_path), manifest([src("s"), sink("z")], [edge("s", "z")], name="other"))
    bare_file = write_manifest(str(tmp_path), _chain("bare"))
    client.set(f"elastream:{{{NAMESPACE}/garbled}}:schedule", "{not a schedule")
    before = _everything(client)
    no_cluster = {"KUBECONFIG": str(tmp_path / "no-kubeconfig"), "KUBERNETES_SERVICE_HOST": ""}

    answered = _live_plan(redis_url, "--nodes", "3", "--output", "json", ref=f"{NAMESPACE}/synthetic")
    assert answered.returncode == 0, answered.stderr
    result = json.loads(answered.stdout)
    assert result["window"]["intervals"] == 8 and result["plan"]["to_nodes"] == 3
    assert result["measured_throughput"] == pytest.approx(200.0) and result["predicted_throughput"] is not None

    def refused(ref: str, *args: str, **env: str) -> str:
        done = _live_plan(redis_url, "--nodes", "3", *args, ref=ref, **env)
        assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: ") and "Traceback" not in done.stderr
        return line

    unknown = refused(f"{NAMESPACE}/nope")
    assert "no topology analytics/nope runs on Redis at " in unknown
    assert "no key elastream:{analytics/nope}:schedule" in unknown
    assert "topologies there: analytics/bare, analytics/garbled, analytics/stopped, analytics/synthetic" in unknown
    assert "--manifest names default/other, not analytics/synthetic" in refused(
        f"{NAMESPACE}/synthetic", "--manifest", other
    )
    nowhere = refused(f"{NAMESPACE}/bare", **no_cluster)
    assert nowhere.startswith("error: no spec for analytics/bare: ")
    assert "no key elastream:{analytics/bare}:manifest" in nowhere and "the Kubernetes API cannot be used" in nowhere
    empty = refused(f"{NAMESPACE}/bare", "--manifest", bare_file)
    assert "the metric window has 0 of 8 intervals (no worker has reported yet" in empty
    assert "or lower --window" in empty
    assert "Redis key elastream:{analytics/garbled}:schedule is not a schedule" in refused(f"{NAMESPACE}/garbled")
    stale = refused(f"{NAMESPACE}/stopped")
    assert "the newest metric sample of analytics/stopped is" in stale and "not reporting" in stale

    assert _everything(client) == before
    client.close()
