"""`elastream plan --live` against a running `elastream run` (real worker processes, a real Redis), as a user
runs it: a too-short window refused in one line, the plan and its prediction for 3 nodes with nothing written,
then `elastream scale` to 3 nodes and the throughput measured afterwards beside the prediction."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
import redis

from elastream.resources import load_manifest
from support.harness import ELASTREAM, read_log, run_scale, start_run, stop_run, write_manifest
from support.manifests import keyed_count_pipeline

pytestmark = pytest.mark.integration

NAMESPACE, NAME = "analytics", "live-what-if"
REF = f"{NAMESPACE}/{NAME}"


def _live_plan(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELASTREAM, "plan", "--live", REF, "--redis-url", redis_url, *args],
        capture_output=True,
        text=True,
        timeout=120,
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
