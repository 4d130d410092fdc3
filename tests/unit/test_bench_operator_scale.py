"""`bench/operator_scale.py` and its worker stand-in `bench/operator_scale_workers.py`, without services: the
stand-in's decisions (a pod becomes a ready or staged node, STAGE/SWITCH/UNSTAGE/STOP, PREPARE and INIT acked
at once, COMMIT and checkpoint barriers acked for every executor once every source has one, metric samples),
the in-memory API server the operator talks to (pods as the client's models, owner checks, preconditions,
status patches merged and counted), the timed pool, and the report's arithmetic and rendering."""

from __future__ import annotations

import random
from typing import Any

import pytest

from elastream.control.backends.worker_objects import (
    WorkerPodSettings,
    is_owned_by,
    pod_name,
    selector_for,
    worker_pod,
)
from elastream.control.resource_api import topology_from_resource
from support.bench_modules import load_bench

bench = load_bench("operator_scale.py")
workers = load_bench("operator_scale_workers.py")

PREFIX = "elastream:{bench/t0000}:"


# ------------------------------------------------------------------------------------------------ the stand-in


class Schedules:
    """Schedules by version, the running one named: what the stand-in reads from Redis."""

    def __init__(self) -> None:
        self.versions: dict[int, dict[str, str]] = {}
        self.running = 0

    def add(self, version: int, assignment: dict[str, str], running: bool = False) -> None:
        self.versions[version] = assignment
        if running:
            self.running = version

    def __call__(self, prefix: str, version: int | None) -> tuple[int, dict[str, str]] | None:
        wanted = self.running if version is None else version
        found = self.versions.get(wanted)
        return None if found is None else (wanted, found)


def one_node() -> tuple[Any, Schedules]:
    schedules = Schedules()
    schedules.add(1, {"spout#0": "node-0", "work#0": "node-0", "out#0": "node-0"}, running=True)
    return workers.StandIn(frozenset({"spout"}), schedules), schedules


def kinds(effects: list[Any]) -> list[str]:
    return [e.kind for e in effects]


def test_a_created_pod_clears_its_control_list_and_becomes_ready_with_an_endpoint_per_executor() -> None:
    standin, _ = one_node()
    effects = standin.on_pod({"op": "create", "prefix": PREFIX, "node": "node-0", "version": 0}, now=5.0)
    assert kinds(effects) == ["clear", "ready"]
    ready = effects[1]
    assert (ready.version, ready.node) == (1, "node-0")
    assert set(ready.endpoints) == {"spout#0", "work#0", "out#0"}
    assert len(set(ready.endpoints.values())) == 3  # one inbox each
    assert standin.nodes[(PREFIX, "node-0")].executors == ("out#0", "spout#0", "work#0")
    assert standin.control_keys() == [f"{PREFIX}control:node-0"]


def test_a_pod_for_a_staged_version_is_staged_not_ready_until_its_switch() -> None:
    standin, schedules = one_node()
    schedules.add(2, {"spout#0": "node-0", "work#0": "node-0", "out#0": "node-0", "spout#1": "node-1"})
    effects = standin.on_pod({"op": "create", "prefix": PREFIX, "node": "node-1", "version": 2}, now=1.0)
    assert kinds(effects) == ["clear", "staged"]
    assert effects[1].version == 2 and set(effects[1].endpoints) == {"spout#1"}
    assert standin.samples(2.0, 100.0, random.Random(1)) == {}  # not running yet: no metrics
    switched = standin.on_control(PREFIX, "node-1", "", {"type": "switch", "version": 2, "mid": "m1"})
    assert kinds(switched) == ["ready"] and switched[0].version == 2
    assert standin.on_control(PREFIX, "node-1", "", {"type": "switch", "version": 2}) == []  # a repeated switch


def test_stage_switch_out_unstage_and_stop_as_a_worker_does() -> None:
    standin, schedules = one_node()
    standin.on_pod({"op": "create", "prefix": PREFIX, "node": "node-0"}, now=0.0)
    schedules.add(2, {"spout#0": "node-1", "work#0": "node-1", "out#0": "node-1"})
    staged = standin.on_control(PREFIX, "node-0", "", {"type": "stage", "version": 2})
    assert kinds(staged) == ["staged"] and staged[0].endpoints == {}  # nothing of version 2 here
    # a node the new schedule drops exits at its switch
    assert kinds(standin.on_control(PREFIX, "node-0", "", {"type": "switch", "version": 2})) == ["stopped"]
    assert standin.nodes == {}
    assert standin.on_control(PREFIX, "node-0", "spout#0", {"type": "prepare", "mid": "m"}) == []  # gone

    standin, schedules = one_node()
    schedules.add(4, {"spout#0": "node-1", "work#0": "node-1", "out#0": "node-1"})
    standin.on_pod({"op": "create", "prefix": PREFIX, "node": "node-1", "version": 4}, now=0.0)
    assert kinds(standin.on_control(PREFIX, "node-1", "", {"type": "unstage", "version": 4})) == ["stopped"]
    standin.on_pod({"op": "create", "prefix": PREFIX, "node": "node-0"}, now=0.0)
    assert kinds(standin.on_control(PREFIX, "node-0", "", {"type": "stop"})) == ["stopped"]
    standin.on_pod({"op": "create", "prefix": PREFIX, "node": "node-0"}, now=0.0)
    assert kinds(standin.on_pod({"op": "delete", "prefix": PREFIX, "node": "node-0"}, now=1.0)) == ["stopped"]


def test_prepare_and_init_are_acked_at_once_by_the_executor_they_name() -> None:
    standin, _ = one_node()
    standin.on_pod({"op": "create", "prefix": PREFIX, "node": "node-0"}, now=0.0)
    for kind, phase in (("prepare", "preparing"), ("init", "initializing")):
        (ack,) = standin.on_control(PREFIX, "node-0", "work#0", {"type": kind, "mid": "m7"})
        assert (ack.kind, ack.mid, ack.phase, ack.executors) == ("ack", "m7", phase, ("work#0",))
    for kind in ("resume", "abort", "checkpoint-abort"):
        assert standin.on_control(PREFIX, "node-0", "spout#0", {"type": kind, "mid": "m7"}) == []


def test_a_barrier_or_commit_is_acked_by_every_executor_once_every_source_has_it() -> None:
    schedules = Schedules()
    schedules.add(
        3,
        {"spout#0": "node-0", "spout#1": "node-1", "work#0": "node-0", "out#0": "node-1"},
        running=True,
    )
    standin = workers.StandIn(frozenset({"spout"}), schedules)
    for node in ("node-0", "node-1"):
        standin.on_pod({"op": "create", "prefix": PREFIX, "node": node}, now=0.0)
    for kind, phase in (("checkpoint", "checkpointing"), ("commit", "committing")):
        assert standin.on_control(PREFIX, "node-0", "spout#0", {"type": kind, "mid": "ckpt-1"}) == []
        effects = standin.on_control(PREFIX, "node-1", "spout#1", {"type": kind, "mid": "ckpt-1"})
        assert kinds(effects) == ["position", "ack"]
        assert effects[0].executors == ("spout#0", "spout#1")  # the sources write a position
        assert effects[1].phase == phase
        assert effects[1].executors == ("out#0", "spout#0", "spout#1", "work#0")
    assert standin.sweeps == {}


def test_samples_of_running_nodes_grow_at_about_the_rate() -> None:
    standin, _ = one_node()
    standin.on_pod({"op": "create", "prefix": PREFIX, "node": "node-0"}, now=100.0)
    samples = standin.samples(110.0, 50.0, random.Random(3))[PREFIX]
    assert sorted(s["executor"] for s in samples) == ["out#0", "spout#0", "work#0"]
    for sample in samples:
        assert sample["started_at"] == 100.0 and sample["ts"] == 110.0
        assert 500 * 0.97 <= sample["processed"] <= 500 * 1.03
    source = next(s for s in samples if s["vertex"] == "spout")
    assert source["received"] == 0  # a source receives nothing
    from elastream.core.metrics import MetricSample

    assert MetricSample.from_dict({k: str(v) for k, v in source.items()}).processed == source["processed"]


def test_vertex_of_an_executor() -> None:
    assert workers.vertex_of("spout#12") == "spout"
    assert workers.vertex_of("sink") == "sink"


# ------------------------------------------------------------------------------------- the in-memory API server


def api() -> tuple[Any, list[dict[str, Any]]]:
    told: list[dict[str, Any]] = []
    return bench.InMemoryApi(told.append), told


def test_pods_come_back_as_client_models_owned_by_their_topology_and_are_told_to_the_stand_in() -> None:
    server, told = api()
    resource = bench.topology_resource(0)
    topology = topology_from_resource(resource)
    owner = {"name": resource["metadata"]["name"], "uid": resource["metadata"]["uid"]}
    server.create_namespaced_pod("bench", worker_pod(topology, "node-0", owner, WorkerPodSettings()))
    server.create_namespaced_pod("bench", worker_pod(topology, "node-1", owner, WorkerPodSettings(), 7))
    assert told == [
        {"op": "create", "prefix": PREFIX, "node": "node-0", "version": 0},
        {"op": "create", "prefix": PREFIX, "node": "node-1", "version": 7},
    ]
    listed = server.list_namespaced_pod("bench", label_selector=selector_for(topology))
    assert sorted(p.metadata.labels["elastream.dev/node"] for p in listed.items) == ["node-0", "node-1"]
    assert all(p.status.phase == "Running" and is_owned_by(p, owner) for p in listed.items)
    assert server.list_namespaced_pod("bench", label_selector="app.kubernetes.io/instance=other").items == []

    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as exists:
        server.create_namespaced_pod("bench", worker_pod(topology, "node-0", owner, WorkerPodSettings()))
    assert exists.value.status == 409
    name = pod_name(topology, "node-0")
    with pytest.raises(ApiException) as conflict:
        server.delete_namespaced_pod(name, "bench", body={"preconditions": {"uid": "someone-else"}})
    assert conflict.value.status == 409
    uid = server.read_namespaced_pod(name, "bench").metadata.uid
    server.delete_namespaced_pod(name, "bench", body={"preconditions": {"uid": uid}})
    assert told[-1] == {"op": "delete", "prefix": PREFIX, "node": "node-0"}
    with pytest.raises(ApiException) as missing:
        server.read_namespaced_pod(name, "bench")
    assert missing.value.status == 404
    assert server.calls["create pod"] == 3 and server.calls["list pods"] == 2


def test_secrets_read_back_base64_and_config_maps_merge_their_data() -> None:
    import base64

    server, _ = api()
    server.create_namespaced_secret("bench", {"metadata": {"name": "s"}, "stringData": {"url": "redis://x"}})
    server.patch_namespaced_secret("s", "bench", {"stringData": {"key": "k"}})
    data = server.read_namespaced_secret("s", "bench")["data"]
    assert {k: base64.b64decode(v).decode() for k, v in data.items()} == {"url": "redis://x", "key": "k"}
    server.create_namespaced_config_map("bench", {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}})
    server.patch_namespaced_config_map("c", "bench", {"data": {"a": None, "c": "3"}})
    assert server.read_namespaced_config_map("c", "bench")["data"] == {"b": "2", "c": "3"}


def test_status_patches_are_merged_counted_and_told() -> None:
    server, _ = api()
    resource = bench.topology_resource(3)
    server.add_resource(resource)
    seen: list[tuple[str, dict[str, Any]]] = []
    server.on_status = lambda namespace, name, status, at: seen.append((name, status))
    args = ("elastream.dev", "v1alpha1", "bench", "streamtopologies", "t0003")
    server.patch_namespaced_custom_object_status(*args, {"status": {"phase": "Running", "nodes": 1, "x": {"a": 1}}})
    server.patch_namespaced_custom_object_status(*args, {"status": {"x": None, "readyNodes": 1}})
    assert server.status_writes == 2
    assert seen[-1] == ("t0003", {"phase": "Running", "nodes": 1, "readyNodes": 1})
    assert server.statuses() == [{"phase": "Running", "nodes": 1, "readyNodes": 1}]
    assert server.patch_namespaced_custom_object(*args, {"spec": {"nodes": 4}}) == {"metadata": {"generation": 2}}


def test_the_benchmark_topology_is_a_valid_streamtopology() -> None:
    topology = topology_from_resource(bench.topology_resource(12, nodes=2))
    assert topology.name == "t0012" and topology.nodes == 2
    assert list(topology.sources) == ["spout"]


# ----------------------------------------------------------------------------------------------- the pool


def test_the_pool_times_passes_and_keeps_the_probes_apart() -> None:
    pool = bench.TimedPool(bench.ReconcileSlots(2), 0, probe="t0000")
    pool.start_recording()
    bodies = [bench.topology_resource(0), bench.topology_resource(1), bench.topology_resource(0)]
    futures = [pool.submit(lambda body: body["metadata"]["name"], body) for body in bodies]
    assert [f.result(timeout=10) for f in futures] == ["t0000", "t0001", "t0000"]
    pool.shutdown(wait=True)
    assert pool.passes == 3 and len(pool.run_ms) == 3 and len(pool.queued_ms) == 3
    assert len(pool.period_s) == 1  # t0000's second pass
    assert len(pool.probe_passes) == 2
    assert all(queued <= started <= ended for queued, started, ended in pool.probe_passes)


# ----------------------------------------------------------------------------------------------- arithmetic


def test_percentiles_merge_patches_and_proc_files() -> None:
    assert bench.percentile([], 50) is None
    assert bench.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert bench.percentile(list(range(1, 101)), 99) == 99.0
    assert bench.percentile([7.0], 99) == 7.0
    assert bench.apply_merge_patch({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": None, "e": 3}, "d": None}) == {
        "a": {"c": 2, "e": 3}
    }
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t11\n"
    assert bench.proc_status(status) == {"VmHWM": 200.0, "VmRSS": 100.0, "Threads": 11.0}
    stat = "123 (python (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0"
    assert bench.proc_cpu_s(stat, 100.0) == 3.0
    samples = [{"t": 0.0, "c": 1.0}, {"t": 1.0}, {"t": 4.0, "c": 3.0}]
    assert bench.rate_per_s(samples, "c") == 0.5
    assert bench.rate_per_s(samples[:1], "c") is None
    assert bench.window(samples, 0.5, 4.0) == samples[1:]
    assert bench.thread_kinds(["reconcile_0", "reconcile_7", "MainThread", "redis-user-keeper"]) == {
        "MainThread": 1,
        "reconcile": 2,
        "redis-user-keeper": 1,
    }
    assert bench.shows({"phase": "Running", "nodes": 2, "readyNodes": 2, "observedGeneration": 3}, 2, 3)
    assert not bench.shows({"phase": "Running", "nodes": 2, "readyNodes": 1, "observedGeneration": 3}, 2, 3)
    assert not bench.shows({"phase": "Scaling", "nodes": 2, "readyNodes": 2, "observedGeneration": 3}, 2, 3)


def test_a_scaling_record_splits_the_time_from_the_patch_to_the_status() -> None:
    status = {"lastScaling": {"outcome": "succeeded", "startedAt": 101.0, "finishedAt": 101.5, "pauseMs": 30.0}}
    passes = [(99.0, 99.1, 99.2), (100.0, 100.2, 100.3), (101.0, 100.9 + 0.05, 101.6)]
    record = bench._scaling_record(2, 100.0, (101.7, status), passes)
    assert record["direction"] == "out" and record["outcome"] == "succeeded"
    assert record["patch_to_first_pass_ms"] == pytest.approx(200.0)
    assert record["first_pass_queued_ms"] == pytest.approx(200.0)
    assert record["patch_to_status_ms"] == pytest.approx(1700.0)
    assert record["patch_to_scaling_ms"] == pytest.approx(1000.0)
    assert record["scaling_ms"] == pytest.approx(500.0)
    assert record["finished_to_status_ms"] == pytest.approx(200.0)
    assert record["pauseMs"] == 30.0
    assert bench._scaling_record(1, 100.0, None, [])["outcome"] == "timeout"


def test_a_profile_says_where_the_reconcile_threads_wait() -> None:
    base = "Thread.run (threading.py:982);TopologyReconciler.reconcile (elastream/control/reconciler.py:108)"
    tick = f"{base};TopologyController.tick (elastream/control/controller.py:388)"
    lines = [
        f"thread (1): reconcile_0;{tick};TopologyController._tick (elastream/control/controller.py:401);"
        "SocketBuffer._read_from_socket (redis/_parsers/socket.py:64) 6",
        f"thread (2): reconcile_1;{tick};decode_sample (elastream/store/codec.py:90) 2",
        f"thread (3): reconcile_2;{base};ManagedTopology.write (elastream/control/managed.py:150) 2",
        "thread (4): MainThread;run_forever (asyncio/base_events.py:608);EpollSelector.select (selectors.py:468) 9",
        "thread (4): MainThread;run_forever (asyncio/base_events.py:608);deepcopy (copy.py:128) 1",
        "thread (5): redis-user-keeper;UserKeeper._run (elastream/store/acl.py:271) 10",
        "thread (6): reconcile_3;Thread.run (threading.py:982);_worker (concurrent/futures/thread.py:81) 40",
        "not a stack line",
    ]
    summary = bench.profile_summary(lines)
    assert summary["reconcile_samples"] == 10  # a pool thread waiting for work is not counted
    assert summary["redis_wait_pct"] == 60.0
    assert summary["loop_busy_pct"] == 10.0
    assert summary["inclusive_pct"] == {
        "TopologyController.tick (control/controller.py)": 80.0,  # the pass itself and _tick's twin left out
        "decode_sample (store/codec.py)": 20.0,
        "ManagedTopology.write (control/managed.py)": 20.0,
    }


def synthetic_result(n: int) -> dict[str, Any]:
    quantiles = {"p50": 2.0, "p90": 5.0, "p99": 9.0, "max": 12.0}
    return {
        "n": n,
        "running": n,
        "available_s": 1.5,
        "phases": {"ready": 0.0, "created": 1.0, "steady_start": 5.0, "steady_end": 65.0},
        "steady": {
            "window_s": 60.0,
            "status_writes": 4 * n,
            "events": 0,
            "api_calls": {"list pods": 30 * n, "patch status": 4 * n},
            "passes": 30 * n,
            "pass_ms": quantiles,
            "queued_ms": quantiles,
            "period_s": {"p50": 2.0, "p90": 2.1, "p99": 2.4, "max": 3.0},
            "checkpoints_completed": 6 * n,
            "checkpoints_failed": 0,
            "warnings": {},
            "warning_examples": [],
            "threads": {"MainThread": 1, "reconcile": 8},
            "redis_commands": {"get": {"calls_per_s": 10.0, "usec_per_s": 20.0}},
        },
        "scalings": [
            {"direction": "out", "outcome": "succeeded", "patch_to_status_ms": 1100.0, "scaling_ms": 60.0},
            {"direction": "in", "outcome": "succeeded", "patch_to_status_ms": 1050.0, "scaling_ms": 50.0},
            {"direction": "out", "outcome": "timeout"},
        ],
        "process": {
            "baseline_rss_mib": 90.0,
            "steady_rss_mib": 90.0 + n * 0.2,
            "peak_rss_mib": 95.0 + n * 0.2,
            "steady_threads": 10.0,
            "max_threads": 12.0,
            "operator_cpu_cores": 0.1,
            "standin_cpu_cores": 0.01,
            "redis_cpu_cores": 0.01,
            "redis_commands_per_s": 100.0,
            "redis_memory_mib": 2.0,
            "load1": 3.0,
        },
    }


def test_the_report_and_its_plot_are_written_from_raw_results(tmp_path: Any) -> None:
    raw = {
        "meta": {
            "command": "python bench/operator_scale.py",
            "took_s": 100.0,
            "machine": "a test machine",
            "code": "abc1234",
            "date": "2026-01-01",
            "steady_s": 60.0,
            "warm_s": 15.0,
            "scalings": 2,
            "gap_s": 4.0,
            "notes": ["A note."],
        },
        "results": [synthetic_result(1), synthetic_result(100)],
    }
    bench.write_report(raw, str(tmp_path))
    text = (tmp_path / "operator-scale.md").read_text()
    assert "| 100 | 1.5 s | 110.0 | 115.0 | 10 |" in text
    assert "1,075 (1,050-1,100)" in text  # both directions pooled, the timed-out one left out
    assert "| 1 | out (1 -> 2) | 1 of 2 |" in text
    assert "A note." in text and "abc1234" in text
    assert "1 -> 100: 205 KiB" in text  # 0.2 MiB more per topology
    assert (tmp_path / "operator-scale.png").stat().st_size > 10_000
