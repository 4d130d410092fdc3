"""Running topologies on real worker processes in tests: start, wait for the sinks, read what arrived."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
import yaml

from elastream.control.backends.local import LocalCluster
from elastream.control.controller import TopologyController
from elastream.control.local_mode import local_controller
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.topology import Topology
from elastream.crd import load_manifest

#: the CLI as a user runs it, on this interpreter
ELASTREAM = (sys.executable, "-m", "elastream")


def run_scale(
    path: str, redis_url: str, *args: str, timeout_s: float = 180.0
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """`elastream scale` of the running topology at `path`: its output, and the status record it printed
    (None if it printed none)."""
    result = subprocess.run(
        [*ELASTREAM, "scale", path, "--redis", redis_url, *args], capture_output=True, text=True, timeout=timeout_s
    )
    start = result.stdout.find("{")
    return result, (json.loads(result.stdout[start:]) if start >= 0 else None)


def start_run(
    directory: str, path: str, redis_url: str, *extra: str, duration_s: float = 150.0
) -> tuple[subprocess.Popen[str], str]:
    """`elastream run` of the manifest at `path` as a user starts it (Python analysis engine), its output in
    `<directory>/run.log`; returns the process and the log's path."""
    log_path = os.path.join(directory, "run.log")
    command = [*ELASTREAM, "run", path, "--redis", redis_url, "--engine", "python"]
    with open(log_path, "w", encoding="utf-8") as log:
        run = subprocess.Popen(
            [*command, "--duration", f"{duration_s:g}", *extra], stdout=log, stderr=subprocess.STDOUT, text=True
        )
    return run, log_path


def stop_run(run: subprocess.Popen[Any], timeout_s: float = 60.0) -> None:
    """Stop an `elastream run` as Ctrl-C does and wait (bounded) for it to exit."""
    run.send_signal(signal.SIGINT)
    run.wait(timeout_s)


def read_log(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def log_tail(path: str, lines: int = 40) -> str:
    """A log's last `lines` lines for a failure message (what stands instead when it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def write_manifest(directory: str, doc: dict[str, Any]) -> str:
    path = os.path.join(directory, f"{doc['metadata']['name']}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    return path


@contextmanager
def running(
    path: str,
    redis_url: str,
    schedule: Schedule | None = None,
    backend: Callable[..., LocalCluster] = LocalCluster,
    **options: Any,
) -> Iterator[tuple[LocalCluster, Topology]]:
    """The manifest at `path` on local worker processes (`backend`: a `LocalCluster` or a subclass that
    injects a fault), closed when the block ends."""
    topology = load_manifest(path)
    cluster = backend(topology, path, redis_url, interval_s=0.5, **options)
    try:
        cluster.start(schedule or initial_schedule(topology))
        yield cluster, topology
    finally:
        cluster.close()


def controlled(
    topology: Topology, path: str, redis_url: str, analyzer: Any, events: Any, **options: Any
) -> tuple[LocalCluster, TopologyController]:
    """Worker processes for the manifest at `path` (`options` for the `LocalCluster`, e.g. `extra_env`) and a
    controller over them, wired as `elastream run` wires them, neither started: enter both (`with cluster,
    controller:`)."""
    cluster = LocalCluster(topology, path, redis_url, interval_s=0.5, **options)
    return cluster, local_controller(topology, cluster, analyzer, events=events)


@contextmanager
def ticking(controller: Any) -> Iterator[None]:
    """The controller ticked once per interval on a thread while the block runs, as `elastream run` does
    (checkpoints are taken by its ticks, and exactly-once sinks commit with them)."""
    import threading

    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            controller.tick()
            stop.wait(controller.interval_s)

    thread = threading.Thread(target=loop, name="ticking", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)


def sink_key(topology: Topology, sink: str) -> str:
    return f"{topology.redis_prefix}sink:{sink}"


def wait_for_sink(
    cluster: LocalCluster,
    topology: Topology,
    sink: str,
    count: int,
    timeout_s: float = 60.0,
) -> int:
    """Wait until the sink's stream holds `count` entries (or the timeout); returns the length seen."""
    deadline = time.monotonic() + timeout_s
    length = 0
    while time.monotonic() < deadline:
        cluster.check_alive()
        length = int(cluster.client.xlen(sink_key(topology, sink)))
        if length >= count:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # anything beyond `count` (a duplicate) has time to arrive too
    return int(cluster.client.xlen(sink_key(topology, sink)))


def wait_for_sinks_idle(cluster: LocalCluster, topology: Topology, quiet_s: float, timeout_s: float) -> None:
    """Wait until no sink stream has grown for `quiet_s` (finite sources drained), or the timeout."""
    keys = [sink_key(topology, s) for s in topology.sinks]
    last, stable_since, deadline = -1, time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        total = sum(int(cluster.client.xlen(k)) for k in keys)
        if total != last:
            last, stable_since = total, time.monotonic()
        elif time.monotonic() - stable_since > quiet_s:
            return
        time.sleep(0.25)


def sink_events(client: redis.Redis, topology: Topology, sink: str) -> list[dict[str, str]]:
    entries = client.xrange(sink_key(topology, sink), "-", "+")
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def id_counts(events: list[dict[str, str]]) -> Counter[int]:
    return Counter(int(e["id"]) for e in events)


def expected_copies(topology: Topology, ids: Iterable[int]) -> dict[str, Counter[int]]:
    """How many copies of each source id every sink must receive: selectivity decisions are a function of the
    id (`_passes`), so the exact multiset a correct run delivers can be computed without running anything."""
    from elastream.runtime.operators.builtin import _passes

    ids = list(ids)
    copies: dict[str, Counter[int]] = {}
    for v in topology.order:
        vertex = topology.vertices[v]
        if vertex.kind == "source":
            copies[v] = Counter(ids)
            continue
        incoming: Counter[int] = Counter()
        for parent in topology.parents(v):
            incoming.update(copies[parent])
        if vertex.kind == "logic" and vertex.config.get("builtin") in ("work", "filter"):
            selectivity = float(vertex.config.get("selectivity", 1.0))
            if vertex.config["builtin"] == "filter":
                selectivity = min(selectivity, 1.0)
            incoming = Counter({i: n * _passes(i, selectivity) for i, n in incoming.items()})
            incoming = +incoming
        copies[v] = incoming
    return {s: copies[s] for s in topology.sinks}


def with_audit(doc: dict[str, Any], limit: int) -> dict[str, Any]:
    """A copy of an example manifest with finite sources and a redis-stream `audit` sink after every stateful
    vertex (its running counts prove the state moved exactly), every other sink a redis-stream."""
    import copy

    doc = copy.deepcopy(doc)
    spec = doc["spec"]
    audits = []
    for vertex in spec["vertices"]:
        if "source" in vertex:
            vertex["source"]["limit"] = limit
        if "sink" in vertex:
            vertex["sink"] = {"type": "redis-stream"}
        if vertex.get("stateful"):
            audits.append(vertex["name"])
    for name in audits:
        spec["vertices"].append({"name": f"audit-{name}", "sink": {"type": "redis-stream"}, "maxParallelism": 16})
        spec["streams"].append({"from": name, "to": f"audit-{name}", "grouping": "shuffle"})
    spec["slotsPerNode"] = spec.get("slotsPerNode", 4) + len(audits)
    return doc


def exactly_once(
    doc: dict[str, Any], checkpoint_s: float, rate: float | None = None, nodes: int | None = None
) -> dict[str, Any]:
    """`doc` (changed in place and returned) with exactly-once sinks and periodic checkpoints every
    `checkpoint_s` seconds (0: none), and if given, every source at `rate` events/s and `nodes` nodes."""
    for vertex in doc["spec"]["vertices"]:
        if "source" in vertex and rate is not None:
            vertex["source"]["rate"] = rate
        if "sink" in vertex:
            vertex["sink"]["delivery"] = "exactly-once"
    if nodes is not None:
        doc["spec"]["nodes"] = nodes
    doc["spec"]["scaling"]["checkpointIntervalSeconds"] = checkpoint_s
    return doc
