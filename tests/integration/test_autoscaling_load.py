"""Automatic scaling decided by the load, on real worker processes as a user runs them (`elastream run`).

- A constant load, with noise, that keeps a vertex 60 % busy on one executor needs no change: for minutes
  after the start, through the start-up and through whatever the first right-sizing does, both policies make
  at most one change (issue 20: they made seven in 250 s when the start-up ramp and each rescale's pause and
  catch-up read as trends).
- A `steps` source's rate profile belongs to the topology: rescaled twice in its first step, it still
  switches to its second step at the step's time (it restarted at its first step with every rescale).
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import redis

from elastream.core.rates import RateProfile, _jitter
from elastream.crd import load_manifest
from elastream.store.registry import Registry
from support.harness import ELASTREAM, read_log, start_run, stop_run, write_manifest
from support.manifests import by_key, count, edge, manifest, src, work

pytestmark = pytest.mark.integration

#: seconds of constant load watched after the start (the issue: at least 3 minutes)
STEADY_S = 190.0


def noisy_constant(rate: float, noise: float, seconds: int = 60) -> list[dict[str, float]]:
    """A constant rate with ±`noise` fluctuations changing every second (the rate presets' jitter)."""
    return [{"rate": round(rate * (1.0 + noise * _jitter(i)), 1), "seconds": 1} for i in range(seconds)]


POLICIES = ("autoscale", "rules")


def steady_manifest(policy: str) -> dict:
    # work costs 3 ms: one executor does 333/s, so 200/s (±5 % every second) keeps it 60 % busy: AUTOSCALE's
    # medium band, under the rules' capacity threshold; a keyed count and an exactly-once sink behind it
    return manifest(
        [
            src("src", 1, keys=64, steps=noisy_constant(200.0, 0.05)),
            work("work", 1, costMs=3.0),
            count(),
            {"name": "out", "sink": {"type": "redis-stream", "delivery": "exactly-once"}},
        ],
        [
            edge("src", "work"),
            by_key("work", "count"),
            edge("count", "out"),
        ],
        name=f"steady-{policy}",
        nodes=2,
        slotsPerNode=4,
        scaling={
            "window": 5,
            "auto": {"enabled": True, "policy": policy, "minNodes": 2, "maxNodes": 6, "stabilizationSeconds": 15},
        },
    )


def test_a_constant_load_makes_at_most_one_change(tmp_path, redis_url: str) -> None:
    """Both policies, each on its own topology, side by side (one after the other they took 6.5 of CI's
    minutes): the other's workers are load on the machine, as a tenant's neighbours are."""
    client = redis.Redis.from_url(redis_url)
    runs: dict[str, tuple[subprocess.Popen[str], str, str]] = {}
    try:
        for policy in POLICIES:
            directory = tmp_path / policy
            directory.mkdir()
            path = write_manifest(str(directory), steady_manifest(policy))
            run, log_path = start_run(str(directory), path, redis_url, duration_s=STEADY_S + 30.0)
            runs[policy] = (run, log_path, load_manifest(path).redis_prefix)
        evaluations: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
        changes: dict[str, list[tuple[float, dict]]] = {policy: [] for policy in POLICIES}
        last_at: dict[str, float | None] = dict.fromkeys(POLICIES)
        last_scaling: dict[str, bytes | None] = dict.fromkeys(POLICIES)
        started = time.monotonic()
        while time.monotonic() - started < STEADY_S:
            for policy, (run, log_path, prefix) in runs.items():
                assert run.poll() is None, f"{policy}: " + read_log(log_path)[-3000:]
                raw = client.get(f"{prefix}autoscaler")
                if raw is not None:
                    evaluation = json.loads(raw)
                    if evaluation["evaluatedAt"] != last_at[policy]:
                        last_at[policy] = evaluation["evaluatedAt"]
                        evaluations[policy].append(evaluation)
                raw = client.get(f"{prefix}last-scaling")
                if raw is not None and raw != last_scaling[policy]:
                    last_scaling[policy] = raw
                    changes[policy].append((time.monotonic() - started, json.loads(raw)))
            time.sleep(1.0)
    finally:
        for run, _, _ in runs.values():
            stop_run(run, 90)
    for policy, (_, log_path, _) in runs.items():
        check_steady(policy, read_log(log_path), evaluations[policy], changes[policy])


def check_steady(policy: str, output: str, evaluations: list[dict], changes: list[tuple[float, dict]]) -> None:
    decided = [line for line in output.splitlines() if "AutoscalerDecided" in line]
    # the autoscaler ran all along, on measured numbers, with the policy asked for
    assert len(evaluations) >= 30, f"{policy}: " + output[-3000:]
    assert {e["policy"] for e in evaluations} == {policy}
    if policy == "autoscale":
        measured = [e["vertices"]["work"]["lal"] for e in evaluations if e["vertices"]["work"]["lal"] is not None]
        assert measured and 0.3 < sorted(measured)[len(measured) // 2] < 0.8, measured  # the median: medium
    else:
        busy = sorted(e["vertices"]["work"]["busy"] for e in evaluations)
        assert 0.3 < busy[len(busy) // 2] < 0.8, busy
    automatic = [status for _, status in changes if status.get("trigger") == "autoscaler"]
    assert len(decided) <= 1 and len(automatic) <= 1, (
        f"{policy}:\n"
        + "\n".join(decided)
        + "\n"
        + "\n".join(f"{e['evaluatedAt']:.1f} {e['decision']} {e['vertices']['work']}" for e in evaluations)
    )


def sink_count(client: redis.Redis, key: str) -> int:
    return int(client.xlen(key))


def test_a_steps_source_rescaled_twice_in_its_first_step_still_switches_at_the_step_time(
    tmp_path, redis_url: str
) -> None:
    # 100/s for the first 50 s, then 400/s; the source is rescaled 1 -> 2 -> 3 executors within its first step
    first_step_s = 50.0
    doc = manifest(
        [
            src("src", 1, keys=64, steps=[{"rate": 100, "seconds": first_step_s}, {"rate": 400, "seconds": 600}]),
            work("work", 1, costMs=0.2),
            {"name": "out", "sink": {"type": "redis-stream"}},
        ],
        [edge("src", "work"), edge("work", "out")],
        name="stepped",
        nodes=2,
        slotsPerNode=4,
    )
    path = write_manifest(str(tmp_path), doc)
    run, log_path = start_run(str(tmp_path), path, redis_url, duration_s=first_step_s + 60.0)
    client = redis.Redis.from_url(redis_url)
    prefix = load_manifest(path).redis_prefix
    key = f"{prefix}sink:out"
    scales: list[subprocess.Popen[bytes]] = []
    counts: list[tuple[float, int]] = []  # (seconds since the first event reached the sink, events there)
    try:
        deadline = time.monotonic() + 60.0
        while sink_count(client, key) == 0:
            assert time.monotonic() < deadline and run.poll() is None, read_log(log_path)[-3000:]
            time.sleep(0.2)
        first = client.xrange(key, count=1)[0][0].decode()
        origin = int(first.split("-")[0]) / 1000.0  # the first event's arrival: the profile started just before

        def since_origin() -> float:
            return time.time() - origin

        for parallelism in (2, 3):
            while since_origin() < 8.0 * parallelism:  # at about 16 s and 24 s (each takes a few seconds)
                time.sleep(0.2)
            # `elastream scale` also waits for the catch-up and stabilization measurement: the test goes on
            # once the new schedule runs
            scale = subprocess.Popen(
                [*ELASTREAM, "scale", path, "--redis", redis_url, "--parallelism", f"src={parallelism}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            scales.append(scale)
            deadline = time.monotonic() + 60.0
            while (running := Registry(client, prefix).schedule()) is None or running[1].parallelism()[
                "src"
            ] != parallelism:
                assert time.monotonic() < deadline and run.poll() is None, read_log(log_path)[-3000:]
                time.sleep(0.2)
        assert since_origin() < first_step_s - 10.0, "the two rescales took too long to test the first step"
        while since_origin() < first_step_s + 30.0:
            assert run.poll() is None, read_log(log_path)[-3000:]
            counts.append((since_origin(), sink_count(client, key)))
            time.sleep(1.0)
    finally:
        for scale in scales:
            scale.kill()
            scale.wait(10)
        stop_run(run, 90)

    # What reached the sink is what the steps offered by then (their integral, `due`), in events, once the
    # rescales' catch-up is over: late in the first step and through the second. The tolerance is a second at
    # the second step's rate (the origin is the first arrival, the profile started just before it). A source
    # whose executors restarted the profile at a rescale (at about 24 s) would still offer 100/s at 60-78 s:
    # about 8,000 events there instead of 16,000, and this fails.
    offered = RateProfile(doc["spec"]["vertices"][0]["source"])
    tolerance = 400.0
    inside = [(t, n) for t, n in counts if first_step_s - 12.0 <= t <= first_step_s - 2.0]
    inside += [(t, n) for t, n in counts if first_step_s + 10.0 <= t <= first_step_s + 28.0]
    assert len(inside) >= 10, counts
    off = [(round(t, 1), n, round(offered.due(t))) for t, n in inside if abs(n - offered.due(t)) > tolerance]
    assert not off, (off, counts)
    assert "Traceback" not in read_log(log_path)
