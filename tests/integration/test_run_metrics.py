"""`elastream run --metrics-port P` serves the operator's per-topology metrics at 127.0.0.1:P and each worker's
at its node's loopback address and P, as a user scrapes them (urllib, a real `elastream run` process on the
real Redis of the test session); and the Redis memory gauges' cache and Redis-away behaviour on a real server."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from elastream.control.backends.local import node_host
from elastream.control.topology_metrics import RedisMemory
from elastream.core.status import PHASES
from support.fakes import ManualClock
from support.harness import read_log, run_scale, start_run, stop_run, write_manifest
from support.manifests import in_line, sink, src
from support.ports import free_port

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(host: str, port: int) -> Samples:
    """Every sample served at http://host:port/metrics, by (name, labels)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def wait_for(what: str, check: Callable[[], bool], log_path: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:  # not serving yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what} not seen in {timeout_s:.0f} s; run log:\n{read_log(log_path)[-3000:]}")


def test_run_serves_the_topologys_series_and_each_worker_its_own(tmp_path, redis_url: str) -> None:
    doc = in_line(
        [src("s", 1, rate=200), sink("z", 1)],
        name="metered",
        nodes=2,
        slotsPerNode=2,
        scaling={"checkpointIntervalSeconds": 2},
    )
    doc["metadata"]["namespace"] = "team-a"
    path = write_manifest(str(tmp_path), doc)
    port = free_port("127.0.0.1", *(node_host(f"node-{i}") for i in range(3)))
    run, log_path = start_run(str(tmp_path), path, redis_url, "--metrics-port", str(port), duration_s=240)
    labels = {"namespace": "team-a", "topology": "metered"}
    try:
        wait_for(
            "phase Running with 2 ready nodes",
            lambda: (
                value(scrape("127.0.0.1", port), "elastream_topology_ready_nodes", **labels) == 2.0
                and value(scrape("127.0.0.1", port), "elastream_topology_phase", **labels, phase="Running") == 1.0
            ),
            log_path,
        )
        wait_for(
            "a completed checkpoint",
            lambda: value(scrape("127.0.0.1", port), "elastream_checkpoint_age_seconds", **labels) is not None,
            log_path,
        )
        served = scrape("127.0.0.1", port)
        for phase in PHASES:
            assert value(served, "elastream_topology_phase", **labels, phase=phase) == (phase == "Running"), phase
        assert value(served, "elastream_topology_desired_nodes", **labels) == 2.0
        assert value(served, "elastream_topology_nodes", **labels) == 2.0
        assert value(served, "elastream_topology_condition", **labels, type="Available", reason="AllNodesReady") == 1
        assert value(served, "elastream_topology_condition", **labels, type="Degraded", reason="AsExpected") == 0
        assert value(served, "elastream_topology_condition", **labels, type="Ready", reason="AsExpected") == 1
        assert value(served, "elastream_checkpoint_interval_seconds", **labels) == 2.0
        assert (value(served, "elastream_checkpoint_duration_seconds", **labels) or -1.0) >= 0.0
        assert (value(served, "elastream_checkpoint_age_seconds", **labels) or -1.0) >= 0.0
        assert value(served, "elastream_source_backlog_events", **labels, vertex="s") is not None
        assert (value(served, "elastream_redis_memory_used_bytes") or 0.0) > 0.0
        assert value(served, "elastream_redis_memory_limit_bytes") is not None

        # each worker serves its own executors' counters on its node's address
        first = scrape(node_host("node-0"), port)
        assert any(name == "elastream_executor_processed_total" for name, _ in first)
        wait_for(
            "node-0's processed counter growing",
            lambda: (
                total(scrape(node_host("node-0"), port), "elastream_executor_processed_total")
                > total(first, "elastream_executor_processed_total")
            ),
            log_path,
            timeout_s=30.0,
        )

        # a rescale asked with `elastream scale` is counted, with its trigger, duration and pause
        scale, status = run_scale(path, redis_url, "--nodes", "3", "--timeout", "150")
        assert scale.returncode == 0 and status is not None, scale.stdout + scale.stderr
        assert status["outcome"] == "succeeded", status
        rescale = {**labels, "direction": "out", "outcome": "succeeded", "trigger": "request"}
        wait_for(
            "the rescale counted",
            lambda: value(scrape("127.0.0.1", port), "elastream_rescales_total", **rescale) == 1.0,
            log_path,
            timeout_s=30.0,
        )
        served = scrape("127.0.0.1", port)
        assert value(served, "elastream_rescale_duration_seconds_count", **labels) == 1.0
        assert value(served, "elastream_last_rescale_pause_seconds", **labels) == pytest.approx(
            status["pauseMs"] / 1000.0
        )
        assert value(served, "elastream_topology_desired_nodes", **labels) == 3.0
        assert value(served, "elastream_topology_nodes", **labels) == 3.0
    finally:
        stop_run(run)
    assert run.returncode == 130, read_log(log_path)[-3000:]  # stopped as Ctrl-C stops it, not crashed
    assert f"metrics at http://127.0.0.1:{port}/metrics" in read_log(log_path)


def test_redis_memory_is_asked_once_per_period_and_an_away_redis_gives_nothing(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    clock = ManualClock()
    memory = RedisMemory(client, clock, wait_s=10.0)  # type: ignore[arg-type]
    used, limit = memory.read() or (0.0, -1.0)
    assert used > 0 and limit >= 0
    # Redis goes away: within the period the last answer stands (nothing is asked) ...
    memory.client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    clock.t += 14.0
    assert memory.read() == (used, limit)
    # ... past it, the question is asked again and goes unanswered: no value, not an old one
    clock.t += 2.0
    assert memory.read() is None
    memory.client = client
    clock.t += 15.0
    assert memory.read() is not None
