"""Automatic scaling and direct parallelism changes as a user runs them: `elastream run` with
`spec.scaling.auto` on real worker processes and a real Redis, and `elastream scale --parallelism`."""

from __future__ import annotations

import json
import time

import pytest
import redis

from elastream.crd import load_manifest
from elastream.store.registry import Registry
from support.harness import read_log, run_scale, start_run, stop_run, write_manifest
from support.manifests import edge, keyed_count_pipeline, manifest, src, work
from support.waiting import wait_until

pytestmark = pytest.mark.integration


def wait_for(predicate, timeout_s: float, what: str, log_path: str):
    return wait_until(predicate, timeout_s, what, 0.5, detail=lambda: f"run log:\n{read_log(log_path)[-3000:]}")


def test_the_autoscaler_scales_a_congested_vertex_out_on_real_workers(tmp_path, redis_url: str) -> None:
    # w does 250/s per executor (4 ms, sleeping) against 600/s offered: LAL ≈ 2.4, critical, ⌈1 × 2.4⌉ = 3
    doc = manifest(
        [src("src", 1, rate=600, keys=16), work("w", 1, costMs=4.0), {"name": "out", "sink": {"type": "null"}}],
        [edge("src", "w"), edge("w", "out")],
        name="autoscaled",
        nodes=1,
        slotsPerNode=4,
        scaling={
            "window": 6,
            "auto": {"enabled": True, "policy": "autoscale", "maxNodes": 3, "stabilizationSeconds": 5},
        },
    )
    path = write_manifest(str(tmp_path), doc)
    run, log_path = start_run(str(tmp_path), path, redis_url, "--interval", "0.5")
    client = redis.Redis.from_url(redis_url)
    prefix = load_manifest(path).redis_prefix
    try:

        def scaled() -> dict | None:
            raw = client.get(f"{prefix}last-scaling")
            status = json.loads(raw) if raw else None
            return status if status and status.get("trigger") == "autoscaler" else None

        status = wait_for(scaled, 90, "an automatic scaling", log_path)
        assert status["outcome"] == "succeeded", status
        evaluation = json.loads(client.get(f"{prefix}autoscaler"))
        assert evaluation["policy"] == "autoscale" and evaluation["vertices"]["w"]["lal"] is not None
        running = Registry(client, prefix).schedule()
        assert running is not None and running[1].parallelism()["w"] >= 2  # grew past its 1 executor
        assert status["requestedParallelism"]["w"] >= 2
    finally:
        stop_run(run)
    output = read_log(log_path)
    assert "AutoscalerDecided: scale-out" in output
    assert "ScalingPlanned:" in output and "parallelism w 1->" in output


def test_scale_sets_a_vertex_parallelism_on_a_running_topology(tmp_path, redis_url: str) -> None:
    doc = keyed_count_pipeline("reparallelized", cost_ms=1.0, count_parallelism=2, slots_per_node=4)
    path = write_manifest(str(tmp_path), doc)
    run, log_path = start_run(str(tmp_path), path, redis_url)
    client = redis.Redis.from_url(redis_url)
    prefix = load_manifest(path).redis_prefix
    try:
        wait_for(lambda: client.exists(f"{prefix}metrics"), 60, "metrics", log_path)
        time.sleep(3.0)
        bad, _ = run_scale(path, redis_url, "--parallelism", "nope=2", timeout_s=60)
        assert bad.returncode == 1 and "'nope' is not a vertex" in bad.stderr and "Traceback" not in bad.stderr
        scale, status = run_scale(path, redis_url, "--parallelism", "w=3", "--parallelism", "count=1")
        assert scale.returncode == 0 and status is not None, scale.stdout + scale.stderr
        assert status["outcome"] == "succeeded" and status["toNodes"] == 2
        assert status["plan"]["parallelism"] == {"src": 1, "w": 3, "count": 1, "out": 1}
        running = Registry(client, prefix).schedule()
        assert running is not None and running[1].parallelism()["w"] == 3
    finally:
        stop_run(run)
