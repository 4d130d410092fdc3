"""Operator scale benchmark: 1, 100 and 1,000 StreamTopology resources on one operator process.

The operator's own reconcile machinery, driven as `elastream operator` drives it: the kopf handlers of
`elastream.handlers.topology` (`reconcile_loop`, one asyncio task per resource as kopf's daemons are, and
`changed`, which wakes a loop when its spec changes) on one asyncio loop, each pass
(`TopologyReconciler.reconcile`) on the reconcile pool of `reconcile_workers` (8) slots, over the real controller,
Kubernetes backend, migration and checkpoint drivers, status writer and a real Redis (with a Redis ACL user
per topology and the operator's `UserKeeper`). What is not real:
- the Kubernetes API is in memory (`InMemoryApi`): pods, ConfigMaps, Secrets, PodDisruptionBudgets, events and
  the StreamTopology resources, every request counted; pods come back as the Kubernetes client's models
  (deserialised from JSON by its own `ApiClient`, as a real list is), the rest as dicts; no HTTP, no API
  server latency; a status patch is merged into the stored resource and, as kopf's watch would, into the
  live body the loop reads;
- kopf's watch, its daemon bookkeeping and its event queue are replaced by the loop here, which calls the
  real handler coroutines;
- every worker pod is played by `bench/operator_scale_workers.py`, one process that registers, stages,
  switches and acknowledges like a worker (PREPARE, COMMIT, INIT, checkpoint barriers) and publishes one
  metric sample per executor per second, processing nothing;
- the metric analysis is the Python reference (`--engine python`): the Spark JVM is a process of its own
  and its warm-up per new topology would be measured instead of the operator.

One run per size, each in fresh processes (a redis-server, the stand-in, the operator: its peak RSS is its
own). Per size: create every topology at once and wait until all are Running; a steady window (every
topology idle but for its periodic checkpoints and metric samples) measures the reconcile passes (duration,
time queued for a pool thread, time between two passes of one topology), status writes and API requests;
then one topology (t0000) is scaled out 1 -> 2 nodes and back by changing `spec.nodes`, `--scalings` times
each way, timed from the change to a status that shows the new node count, all nodes ready and the new
generation observed. The benchmark's process samples the operator's /proc/<pid>/status (VmRSS, VmHWM,
Threads) and CPU, and Redis' INFO and PING time, every 0.5 s from outside, so no sampling thread runs in the
operator (a timer around each pass, a counter of its Redis round trips and the in-memory API do). With
`--py-spy PATH` (a py-spy binary; not a dependency of the project) the operator's threads are also sampled
during each steady window, and the report says where the passes spend their time.

Writes docs/benchmarks/operator-scale.md and operator-scale.png; the raw results go to --raw (JSON), from
which `--report-only` writes the report again.

    python bench/operator_scale.py                     # 1, 100, 1000 topologies (about 8 min)
    python bench/operator_scale.py --sizes 1,10 --steady-s 20 --scalings 1   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import datetime
import itertools
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))  # support/
sys.path.insert(0, os.path.join(HERE, os.pardir, "operator", "src"))
from elastream.control.pacing import LoopSettings  # noqa: E402
from elastream.control.reconcile_slots import ReconcilePool, ReconcileSlots  # noqa: E402
from support.paths import REPO  # noqa: E402

WORKERS_SCRIPT = os.path.join(HERE, "operator_scale_workers.py")
POD_QUEUE = "elastream-bench:pods"  # the stand-in's (bench/operator_scale_workers.py)
NAMESPACE = "bench"
PROBE = "t0000"
SIZES = (1, 100, 1000)
SAMPLE_S = 0.5
MIB = 1024.0 * 1024.0


def log(message: str) -> None:
    print(f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


# ------------------------------------------------------------------------------------------------ pure helpers


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank: the ceil(p/100 * n)-th smallest (a value that was measured); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return float(ordered[int(rank) - 1])


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: `patch` applied to `target` (neither is changed; a null deletes a key)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def proc_status(text: str) -> dict[str, float]:
    """VmRSS and VmHWM (MiB) and Threads from the text of /proc/<pid>/status."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) / 1024.0
        elif name == "Threads":
            found[name] = float(value.strip())
    return found


def proc_cpu_s(stat: str, ticks: float) -> float:
    """utime + stime (s) from the text of /proc/<pid>/stat (the command may hold spaces and parentheses)."""
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def window(samples: Sequence[Mapping[str, float]], start: float, end: float) -> list[Mapping[str, float]]:
    return [s for s in samples if start <= s["t"] <= end]


def rate_per_s(samples: Sequence[Mapping[str, float]], key: str) -> float | None:
    """The growth of a cumulative `key` per second between the first and the last sample."""
    usable = [s for s in samples if key in s]
    if len(usable) < 2 or usable[-1]["t"] <= usable[0]["t"]:
        return None
    return (usable[-1][key] - usable[0][key]) / (usable[-1]["t"] - usable[0]["t"])


def topology_resource(index: int, nodes: int = 1) -> dict[str, Any]:
    """A small StreamTopology (source -> work -> sink, one executor each, the spec's defaults otherwise)."""
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {
            "name": f"t{index:04d}",
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid4()),
            "generation": 1,
            "annotations": {},
        },
        "spec": {
            "nodes": nodes,
            "slotsPerNode": 4,
            "image": "elastream-worker:dev",
            "vertices": [
                {"name": "spout", "source": {"type": "synthetic", "rate": 100}, "parallelism": 1, "maxParallelism": 8},
                {"name": "work", "logic": {"builtin": "work", "costMs": 1.0}, "parallelism": 1, "maxParallelism": 8},
                {"name": "out", "sink": {"type": "null"}, "parallelism": 1, "maxParallelism": 8},
            ],
            "streams": [
                {"from": "spout", "to": "work", "grouping": "shuffle"},
                {"from": "work", "to": "out", "grouping": "shuffle"},
            ],
        },
    }


def shows(status: Mapping[str, Any], nodes: int, generation: int) -> bool:
    """Whether a status shows `nodes` running and ready, `generation` observed, phase Running."""
    return (
        status.get("phase") == "Running"
        and status.get("nodes") == nodes
        and status.get("readyNodes") == nodes
        and int(status.get("observedGeneration") or 0) >= generation
    )


def count_round_trips(client: Any) -> list[int]:
    """Count the round trips the operator's Redis client makes (a command, or a pipeline's execution), in the
    returned one-element list; the stand-in's, the benchmark's own and other clients' are not counted."""
    import redis

    counted = [0]
    pool = client.connection_pool
    command, pipeline = redis.Redis.execute_command, redis.client.Pipeline.execute

    def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        if self.connection_pool is pool:
            counted[0] += 1
        return command(self, *args, **options)

    def execute(self: Any, *args: Any, **options: Any) -> Any:
        if self.connection_pool is pool and self.command_stack:
            counted[0] += 1
        return pipeline(self, *args, **options)

    redis.Redis.execute_command = execute_command  # type: ignore[method-assign]
    redis.client.Pipeline.execute = execute  # type: ignore[method-assign]
    return counted


def command_stats(client: Any) -> dict[str, tuple[int, int]]:
    """Redis' INFO commandstats: command -> (calls, microseconds of server time); {} when it cannot say."""
    try:
        info = client.info("commandstats")
    except Exception:
        return {}
    return {
        str(name).removeprefix("cmdstat_"): (int(stats.get("calls", 0)), int(stats.get("usec", 0)))
        for name, stats in info.items()
        if isinstance(stats, Mapping)
    }


def command_rates(
    before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]], seconds: float, top: int = 12
) -> dict[str, dict[str, float]]:
    """The `top` commands by server time between two `command_stats`: calls and server microseconds per second."""
    rates = {}
    for name, (calls, usec) in after.items():
        was_calls, was_usec = before.get(name, (0, 0))
        if calls > was_calls and seconds > 0:
            rates[name] = {"calls_per_s": (calls - was_calls) / seconds, "usec_per_s": (usec - was_usec) / seconds}
    ranked = sorted(rates.items(), key=lambda item: -item[1]["usec_per_s"])
    return dict(ranked[:top])


def thread_kinds(names: Iterable[str]) -> dict[str, int]:
    """Thread names grouped by what they are: `reconcile_3` and `reconcile_0` are both `reconcile`."""
    kinds: collections.Counter[str] = collections.Counter()
    for name in names:
        base, _, tail = name.rpartition("_")
        kinds[base if base and tail.isdigit() else name] += 1
    return dict(sorted(kinds.items()))


#: a leaf frame that is a thread waiting for a Redis reply (redis-py reading its socket)
REDIS_WAIT_LEAF = "_read_from_socket"
#: fewer samples of passes than this (one topology: a few ms of passes per 2 s) say nothing: not reported
MIN_PROFILE_SAMPLES = 200
#: a frame of a pool thread running a reconcile pass
PASS_FRAME = "TopologyReconciler.reconcile ("


def profile_summary(lines: Iterable[str], top: int = 14) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks of the operator, `thread (tid): name;frame;...;frame count` per line:
    of the samples of pool threads running a pass, the share spent in each elastream function (inclusive, the
    `top` most) and waiting for a Redis reply; and how busy the event loop (MainThread) was."""
    inclusive: collections.Counter[str] = collections.Counter()
    total = redis_wait = loop_total = loop_busy = 0
    for line in lines:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0].partition(": ")[2] or frames[0]
        if thread == "MainThread":
            loop_total += count
            if "select (selectors.py" not in frames[-1]:
                loop_busy += count
            continue
        if not thread.startswith("reconcile") or not any(PASS_FRAME in f for f in frames):
            continue  # another thread, or a pool thread waiting for work
        total += count
        if REDIS_WAIT_LEAF in frames[-1]:
            redis_wait += count
        seen = set()
        for frame in frames[1:]:
            name, _, where = frame.partition(" (")
            path = where.rpartition(":")[0]
            if "elastream/" not in path:
                continue
            label = f"{name} ({path.rpartition('elastream/')[2]})"
            if label not in seen:
                seen.add(label)
                inclusive[label] += count
    share: dict[str, float] = {}
    for label, count in inclusive.most_common():
        name, _, where = label.partition(" (")
        owner, _, function = name.rpartition(".")
        twin = f"{owner}.{function.lstrip('_')} ({where}" if owner else ""
        if count >= 0.99 * total or (function.startswith("_") and inclusive.get(twin, 0) >= count):
            continue  # the pass itself, or the private half of a public method with the same share
        share[label] = round(100.0 * count / total, 1)
        if len(share) == top:
            break
    return {
        "reconcile_samples": total,
        "redis_wait_pct": round(100.0 * redis_wait / total, 1) if total else None,
        "loop_busy_pct": round(100.0 * loop_busy / loop_total, 1) if loop_total else None,
        "inclusive_pct": share,
    }


# ------------------------------------------------------------------------------------- the in-memory API server


def _api_exception(status: int, reason: str) -> Exception:
    from kubernetes.client.exceptions import ApiException

    return ApiException(status=status, reason=reason)


class InMemoryApi:
    """The parts of core/v1, policy/v1 and the custom objects API the operator calls, in memory. Every call is
    counted (`calls`, by method); status patches are counted apart (`status_writes`) and merged into the stored
    resource, then into the live body the reconcile loop reads (through `on_status`, which the loop sets).
    Objects are kept as JSON text, as a server keeps them (`stored_bytes` is all of it: the part of the
    operator process's memory that is this stand-in's, not the operator's). Pods are returned as
    `kubernetes.client.V1Pod` models, deserialised from their JSON by the client's own `ApiClient` (what a real
    list costs the operator's CPU, less the HTTP); the rest as dicts. Created and deleted pods are told to the
    worker stand-in on the Redis list `POD_QUEUE`."""

    def __init__(self, notify: Callable[[dict[str, Any]], None]) -> None:
        from kubernetes.client import ApiClient

        self.notify = notify
        self.lock = threading.Lock()
        self.client = ApiClient()
        #: (kind, namespace, name) -> the stored object's JSON
        self.objects: dict[tuple[str, str, str], str] = {}
        #: (namespace, instance label) -> pod names: a topology's pods without scanning all
        self.pods_of: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
        #: (namespace, name) -> the StreamTopology's JSON
        self.resources: dict[tuple[str, str], str] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        self.status_writes = 0
        self.events = 0
        #: called with (namespace, name, status after the patch, time) after each status patch
        self.on_status: Callable[[str, str, dict[str, Any], float], None] | None = None
        self._uids = itertools.count(1)

    def stored_bytes(self) -> int:
        with self.lock:
            return sum(map(len, self.objects.values())) + sum(map(len, self.resources.values()))

    # -- helpers
    def _count(self, name: str) -> None:
        self.calls[name] += 1

    def _text(self, kind: str, namespace: str, name: str) -> str:
        found = self.objects.get((kind, namespace, name))
        if found is None:
            raise _api_exception(404, "Not Found")
        return found

    def _read(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            found: dict[str, Any] = json.loads(self._text(kind, namespace, name))
        return found

    def _store(self, kind: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        stored: dict[str, Any] = json.loads(json.dumps(body))  # what the client sends is JSON
        metadata = stored.setdefault("metadata", {})
        metadata.setdefault("namespace", namespace)
        metadata["uid"] = f"uid-{next(self._uids)}"
        metadata["creationTimestamp"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if kind == "Pod":
            stored["status"] = {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": "worker",
                        "image": "elastream-worker:dev",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": metadata["creationTimestamp"]}},
                    }
                ],
            }
        key = (kind, namespace, metadata["name"])
        with self.lock:
            if key in self.objects:
                raise _api_exception(409, "AlreadyExists")
            self.objects[key] = json.dumps(stored)
        return stored

    def _patch(self, kind: str, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        patch = json.loads(json.dumps(body))
        with self.lock:
            stored = json.loads(self._text(kind, namespace, name))
            self.objects[(kind, namespace, name)] = json.dumps(apply_merge_patch(stored, patch))

    # -- events
    def create_namespaced_event(self, namespace: str, body: Any) -> Any:
        self._count("create event")
        json.dumps(body)
        with self.lock:
            self.events += 1
        return None

    # -- ConfigMaps and Secrets (as dicts: the operator reads both shapes)
    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        self._count("read configmap")
        return self._read("ConfigMap", namespace, name)

    def create_namespaced_config_map(self, namespace: str, body: Any) -> Any:
        self._count("create configmap")
        self._store("ConfigMap", namespace, body)

    def patch_namespaced_config_map(self, name: str, namespace: str, body: Any) -> Any:
        self._count("patch configmap")
        self._patch("ConfigMap", namespace, name, body)

    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        import base64

        self._count("read secret")
        stored = self._read("Secret", namespace, name)
        data = dict(stored.get("data") or {})
        for key, value in (stored.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        stored["data"] = data
        return stored

    def create_namespaced_secret(self, namespace: str, body: Any) -> Any:
        self._count("create secret")
        self._store("Secret", namespace, body)

    def patch_namespaced_secret(self, name: str, namespace: str, body: Any) -> Any:
        self._count("patch secret")
        self._patch("Secret", namespace, name, body)

    # -- PodDisruptionBudgets
    def read_namespaced_pod_disruption_budget(self, name: str, namespace: str) -> Any:
        self._count("read pdb")
        return self._read("PodDisruptionBudget", namespace, name)

    def create_namespaced_pod_disruption_budget(self, namespace: str, body: Any) -> Any:
        self._count("create pdb")
        self._store("PodDisruptionBudget", namespace, body)

    def patch_namespaced_pod_disruption_budget(self, name: str, namespace: str, body: Any) -> Any:
        self._count("patch pdb")
        self._patch("PodDisruptionBudget", namespace, name, body)

    # -- pods
    def create_namespaced_pod(self, namespace: str, body: Any) -> Any:
        self._count("create pod")
        pod = self._store("Pod", namespace, body)
        labels = pod["metadata"].get("labels") or {}
        instance = labels.get("app.kubernetes.io/instance", "")
        with self.lock:
            self.pods_of[(namespace, instance)].add(pod["metadata"]["name"])
        annotations = pod["metadata"].get("annotations") or {}
        self.notify(
            {
                "op": "create",
                "prefix": _prefix(namespace, instance),
                "node": labels.get("elastream.dev/node", ""),
                "version": int(annotations.get("elastream.dev/schedule-version") or 0),
            }
        )
        return None

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        self._count("read pod")
        with self.lock:
            text = self._text("Pod", namespace, name)
        return self.client.deserialize(text, "V1Pod", "application/json")

    def delete_namespaced_pod(self, name: str, namespace: str, **options: Any) -> Any:
        self._count("delete pod")
        with self.lock:
            pod = json.loads(self._text("Pod", namespace, name))
            wanted = ((options.get("body") or {}).get("preconditions") or {}).get("uid")
            if wanted is not None and wanted != pod["metadata"]["uid"]:
                raise _api_exception(409, "Conflict")
            del self.objects[("Pod", namespace, name)]
            labels = pod["metadata"].get("labels") or {}
            instance = labels.get("app.kubernetes.io/instance", "")
            self.pods_of[(namespace, instance)].discard(name)
        self.notify({"op": "delete", "prefix": _prefix(namespace, instance), "node": labels.get("elastream.dev/node")})
        return None

    def list_namespaced_pod(self, namespace: str, label_selector: str = "", **_: Any) -> Any:
        self._count("list pods")
        wanted = dict(pair.split("=", 1) for pair in label_selector.split(",") if pair)
        with self.lock:
            names = sorted(self.pods_of.get((namespace, wanted.get("app.kubernetes.io/instance", "")), ()))
            texts = [self.objects[("Pod", namespace, n)] for n in names]
        pods = [json.loads(t) for t in texts]
        matching = [p for p in pods if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())]
        text = json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": matching})
        return self.client.deserialize(text, "V1PodList", "application/json")

    # -- StreamTopology resources
    def add_resource(self, body: Mapping[str, Any]) -> None:
        metadata = body["metadata"]
        with self.lock:
            self.resources[(metadata["namespace"], metadata["name"])] = json.dumps(body)

    def set_spec(self, namespace: str, name: str, spec: Mapping[str, Any], generation: int) -> None:
        with self.lock:
            stored = json.loads(self.resources[(namespace, name)])
            stored["spec"] = dict(spec)
            stored["metadata"]["generation"] = generation
            self.resources[(namespace, name)] = json.dumps(stored)

    def statuses(self) -> list[Mapping[str, Any]]:
        with self.lock:
            texts = list(self.resources.values())
        return [json.loads(t).get("status") or {} for t in texts]

    def patch_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **_: Any
    ) -> Any:
        self._count("patch status")
        patch = json.loads(json.dumps(body))
        with self.lock:
            found = self.resources.get((namespace, name))
            if found is None:
                raise _api_exception(404, "Not Found")
            stored = json.loads(found)
            stored["status"] = status = apply_merge_patch(stored.get("status") or {}, patch.get("status") or {})
            self.resources[(namespace, name)] = json.dumps(stored)
            self.status_writes += 1
        if self.on_status is not None:
            self.on_status(namespace, name, status, time.time())
        return None

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **_: Any
    ) -> Any:
        self._count("patch resource")
        patch = json.loads(json.dumps(body))
        with self.lock:
            found = self.resources.get((namespace, name))
            if found is None:
                raise _api_exception(404, "Not Found")
            stored = json.loads(found)
            updated = apply_merge_patch(stored, patch)
            if updated.get("spec") != stored.get("spec"):
                updated["metadata"]["generation"] = int(updated["metadata"].get("generation") or 0) + 1
            self.resources[(namespace, name)] = json.dumps(updated)
            return {"metadata": {"generation": updated["metadata"]["generation"]}}


def _prefix(namespace: str, name: str) -> str:
    from elastream.core.topology import topology_prefix

    return topology_prefix(namespace, name)


# -------------------------------------------------------------------------------------- the timed thread pool


class TimedPool(ReconcilePool):
    """The operator's reconcile pool (`OperatorMemo.pool`, `handlers.main.reconcile_pool`), timing each pass: how
    long it waited for a thread (queued) and ran, and the time since the same topology's last pass started
    (its period). While `recording`, the figures go into compact arrays (a few hundred KiB at the largest
    size); the passes of `probe` (a topology's key) are kept apart with wall-clock times, whenever they run."""

    def __init__(self, slots: ReconcileSlots, waiting: int, probe: str = "") -> None:
        super().__init__(slots, waiting)
        self.probe = probe
        self.recording = False
        self.passes = 0
        self.run_ms = array("d")
        self.queued_ms = array("d")
        self.period_s = array("d")
        self.last_start: dict[str, float] = {}
        self.probe_passes: list[tuple[float, float, float]] = []

    def start_recording(self) -> None:
        self.run_ms, self.queued_ms, self.period_s = array("d"), array("d"), array("d")
        self.recording = True

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        queued = time.monotonic()
        queued_at = time.time()
        body = args[0] if args else {}
        metadata = (body.get("metadata") or {}) if isinstance(body, Mapping) else {}
        key = f"{metadata.get('namespace')}/{metadata.get('name')}"

        def timed() -> Any:
            start = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.monotonic()
                self.passes += 1
                previous = self.last_start.get(key)
                self.last_start[key] = start
                if self.recording:
                    self.run_ms.append((end - start) * 1000.0)
                    self.queued_ms.append((start - queued) * 1000.0)
                    if previous is not None:
                        self.period_s.append(start - previous)
                if key.endswith(f"/{self.probe}"):
                    self.probe_passes.append((queued_at, queued_at + (start - queued), queued_at + (end - queued)))

        return super().submit(timed)


class Stopped:
    """kopf's `DaemonStopped` flag: false until the daemon is told to stop."""

    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag


class WarningCounter(logging.Handler):
    """Counts warnings and errors by logger (and keeps a few distinct messages) while `counting`."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counting = False
        self.counts: collections.Counter[str] = collections.Counter()
        self.examples: dict[str, str] = {}
        #: errors at any time, and the first one's message (a run whose passes fail says so at once)
        self.errors = 0
        self.first_error = ""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors += 1
            self.first_error = (
                self.first_error or f"{record.getMessage()[:200]} ({record.exc_info and record.exc_info[1]!r})"
            )
        if not self.counting:
            return
        self.counts[record.name] += 1
        if len(self.examples) < 8:
            message = record.getMessage()[:200]
            self.examples.setdefault(message[:60], message)


# ---------------------------------------------------------------------------------------- the operator process


def checkpoint_counts(topologies: Any) -> tuple[int, int]:
    """(rounds completed, rounds that did not complete) over every running controller's checkpointer."""
    completed = failed = 0
    for managed in list(topologies.topologies.values()):
        controller = managed.controller
        for task in getattr(controller, "background", ()) or ():
            completed += int(getattr(task, "completed", 0))
            failed += int(getattr(task, "failed_rounds", 0))
    return completed, failed


async def operate(args: argparse.Namespace) -> dict[str, Any]:
    """The operator process: the real TopologyReconciler behind the real kopf handlers, over `InMemoryApi`."""
    import kopf  # noqa: F401  (the operator imports it: its memory is part of the operator's)
    import kubernetes.client  # noqa: F401

    from elastream.analysis import Analyzer
    from elastream.control.checkpoint_driver import Checkpointer
    from elastream.control.operator_options import OperatorOptions
    from elastream.control.reconciler import TopologyReconciler
    from elastream.handlers import topology as handlers
    from elastream.store.acl import UserKeeper
    from elastream.store.registry import connect

    n = args.n
    phases: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    redis_client = connect(args.redis, wait_s=10.0)
    pods_client = connect(args.redis, wait_s=10.0)
    round_trips = count_round_trips(redis_client)
    api = InMemoryApi(lambda op: pods_client.rpush(POD_QUEUE, json.dumps(op)))
    options = OperatorOptions(redis_url=args.redis)
    slots = ReconcileSlots(options.reconcile_workers)
    topologies = TopologyReconciler(
        redis_client=redis_client,
        redis_url=args.redis,
        core_api=api,
        custom_api=api,
        analyzer=Analyzer(engine="python"),
        settings=options.worker,
        policy_api=api,
        user_keeper=UserKeeper(redis_client),
        loop=LoopSettings.of_options(options),
        slots=slots,
    )
    pool = TimedPool(slots, options.waiting_passes, probe=PROBE)
    shared = handlers.OperatorMemo(topologies, pool)  # the operator memo `elastream operator` gives kopf
    warnings = WarningCounter()
    logging.getLogger().addHandler(warnings)

    # checkpoint rounds that did not complete, counted beside the checkpointer's own `completed`
    original_tick = Checkpointer.tick

    def counted_tick(self: Any) -> Any:
        result = original_tick(self)
        if result is not None and result.outcome != "completed":
            self.failed_rounds = getattr(self, "failed_rounds", 0) + 1
        return result

    Checkpointer.tick = counted_tick  # type: ignore[method-assign]

    bodies: dict[str, dict[str, Any]] = {}
    memos: dict[str, handlers.OperatorMemo] = {}
    probe_statuses: list[tuple[float, dict[str, Any]]] = []

    def on_status(namespace: str, name: str, status: dict[str, Any], at: float) -> None:
        if name == PROBE:
            probe_statuses.append((at, status))
        body = bodies.get(name)
        if body is not None:  # kopf's watch: the live body follows the stored resource (on the loop)
            loop.call_soon_threadsafe(body.__setitem__, "status", status)

    api.on_status = on_status
    phases["ready"] = time.time()
    print(f"PROGRESS operator ready (pid {os.getpid()}); idle {args.idle_s:.0f} s before the topologies", flush=True)
    await asyncio.sleep(args.idle_s)

    # ---- every topology at once, as kopf's first listing hands them over
    phases["created"] = time.time()
    tasks = []
    for i in range(n):
        body = topology_resource(i)
        name = body["metadata"]["name"]
        api.add_resource(body)
        bodies[name], memos[name] = body, copy.copy(shared)  # as kopf makes each resource's memo
        tasks.append(asyncio.create_task(handlers.reconcile_loop(body=body, memo=memos[name], stopped=Stopped())))
        await handlers.changed(event={"type": None, "object": body}, memo=memos[name])
    print(f"PROGRESS {n} topologies created; waiting until all are Running", flush=True)
    deadline = time.monotonic() + args.start_timeout_s
    next_report = time.monotonic() + 5.0
    running = 0
    while time.monotonic() < deadline:
        running = sum(1 for s in api.statuses() if shows(s, 1, 1))
        if running == n:
            break
        if time.monotonic() >= next_report:
            next_report += 5.0
            print(
                f"PROGRESS {running}/{n} Running after {time.time() - phases['created']:.0f} s "
                f"({pool.passes} passes, {api.calls['create pod']} pods"
                + (f"; {warnings.errors} errors, the first: {warnings.first_error}" if warnings.errors else "")
                + ")",
                flush=True,
            )
        await asyncio.sleep(0.25)
    phases["available"] = time.time()
    print(f"PROGRESS {running}/{n} Running after {phases['available'] - phases['created']:.1f} s", flush=True)

    # ---- steady: nothing changes but checkpoints and metric samples
    await asyncio.sleep(args.warm_s)
    before_writes, before_events, before_calls = api.status_writes, api.events, collections.Counter(api.calls)
    before_ckpt = checkpoint_counts(topologies)
    before_commands = command_stats(redis_client)
    passes_before = pool.passes
    trips_before = round_trips[0]
    warnings.counting = True
    pool.start_recording()
    phases["steady_start"] = time.time()
    print(f"PROGRESS steady window: {args.steady_s:.0f} s", flush=True)
    await asyncio.sleep(args.steady_s)
    phases["steady_end"] = time.time()
    pool.recording = False
    warnings.counting = False
    steady_s = phases["steady_end"] - phases["steady_start"]
    after_ckpt = checkpoint_counts(topologies)
    trips = round_trips[0] - trips_before
    commands = command_rates(before_commands, command_stats(redis_client), steady_s)
    calls = {k: v - before_calls.get(k, 0) for k, v in api.calls.items() if v - before_calls.get(k, 0)}
    run_ms, queued_ms, period_s = list(pool.run_ms), list(pool.queued_ms), list(pool.period_s)
    steady = {
        "window_s": steady_s,
        "running": sum(1 for s in api.statuses() if shows(s, 1, 1)),
        "status_writes": api.status_writes - before_writes,
        "events": api.events - before_events,
        "api_calls": dict(sorted(calls.items())),
        "passes": pool.passes - passes_before,
        "pass_ms": {f"p{p}": percentile(run_ms, p) for p in (50, 90, 99)} | {"max": max(run_ms, default=None)},
        "queued_ms": {f"p{p}": percentile(queued_ms, p) for p in (50, 90, 99)} | {"max": max(queued_ms, default=None)},
        "period_s": {f"p{p}": percentile(period_s, p) for p in (50, 90, 99)} | {"max": max(period_s, default=None)},
        "checkpoints_completed": after_ckpt[0] - before_ckpt[0],
        "checkpoints_failed": after_ckpt[1] - before_ckpt[1],
        "warnings": dict(warnings.counts),
        "warning_examples": list(warnings.examples.values()),
        "threads": thread_kinds(t.name for t in threading.enumerate()),
        "redis_commands": commands,
        "redis_round_trips": trips,
        "api_stored_mib": api.stored_bytes() / MIB,
    }
    print(
        f"PROGRESS steady: {steady['passes']} passes (p50 {_ms(steady['pass_ms']['p50'])}, p99 "
        f"{_ms(steady['pass_ms']['p99'])}; queued p50 {_ms(steady['queued_ms']['p50'])}), "
        f"{steady['status_writes']} status writes, {steady['checkpoints_completed']} checkpoints",
        flush=True,
    )

    # ---- one topology scaled out and back by its spec, the others running on
    phases["scalings_start"] = time.time()
    scalings = []
    body, memo = bodies[PROBE], memos[PROBE]
    for k in range(args.scalings):
        for target in (2, 1):
            generation = int(body["metadata"]["generation"]) + 1
            seen = len(probe_statuses)
            passes_seen = len(pool.probe_passes)
            body["spec"] = {**body["spec"], "nodes": target}
            body["metadata"]["generation"] = generation
            api.set_spec(NAMESPACE, PROBE, body["spec"], generation)
            patched = time.time()
            await handlers.changed(event={"type": "MODIFIED", "object": body}, memo=memo)
            done: tuple[float, dict[str, Any]] | None = None
            limit = time.monotonic() + args.scale_timeout_s
            while done is None and time.monotonic() < limit:
                await asyncio.sleep(0.01)
                done = next(((t, s) for t, s in probe_statuses[seen:] if shows(s, target, generation)), None)
            record = _scaling_record(target, patched, done, pool.probe_passes[passes_seen:])
            scalings.append(record)
            print(
                f"PROGRESS scaling {2 * k + (1 if target == 2 else 2)}/{2 * args.scalings} "
                f"({'out 1 -> 2' if target == 2 else 'in 2 -> 1'}): "
                + (
                    f"status after {record['patch_to_status_ms']:.0f} ms ({record['outcome']})"
                    if done is not None
                    else f"no status within {args.scale_timeout_s:.0f} s"
                ),
                flush=True,
            )
            await asyncio.sleep(args.gap_s)
    phases["scalings_end"] = time.time()
    for task in tasks:
        task.cancel()
    return {
        "n": n,
        "phases": phases,
        "running": running,
        "available_s": phases["available"] - phases["created"],
        "steady": steady,
        "scalings": scalings,
        "api_calls_total": dict(sorted(api.calls.items())),
        "pid": os.getpid(),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _scaling_record(
    target: int,
    patched: float,
    done: tuple[float, Mapping[str, Any]] | None,
    passes: Sequence[tuple[float, float, float]],
) -> dict[str, Any]:
    """One scaling of the probe: patch -> first pass queued/started -> scaling started/finished (the status's
    lastScaling, the operator's clock) -> the status that shows it (wall clock of the same machine)."""
    record: dict[str, Any] = {"direction": "out" if target == 2 else "in", "to": target, "outcome": "timeout"}
    after = [p for p in passes if p[0] >= patched]
    if after:
        record["patch_to_first_pass_ms"] = (after[0][1] - patched) * 1000.0
        record["first_pass_queued_ms"] = (after[0][1] - after[0][0]) * 1000.0
    if done is None:
        return record
    at, status = done
    last = status.get("lastScaling") or {}
    record["patch_to_status_ms"] = (at - patched) * 1000.0
    record["outcome"] = str(last.get("outcome"))
    started, finished = last.get("startedAt"), last.get("finishedAt")
    if isinstance(started, int | float) and isinstance(finished, int | float):
        record["patch_to_scaling_ms"] = (started - patched) * 1000.0
        record["scaling_ms"] = (finished - started) * 1000.0
        record["finished_to_status_ms"] = (at - finished) * 1000.0
        # the pass that ran the scaling: the one during which it started
        running = [p for p in after if p[1] <= started <= p[2]]
        if running:
            record["scaling_pass_queued_ms"] = (running[0][1] - running[0][0]) * 1000.0
    for key in ("pauseMs", "prepareMs"):
        if isinstance(last.get(key), int | float):
            record[key] = float(last[key])
    return record


def operator_main(args: argparse.Namespace) -> int:
    level = os.environ.get("ELASTREAM_LOG_LEVEL", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    result = asyncio.run(operate(args))
    with open(args.result, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print("PROGRESS done", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # passes may still run on the pool's threads: the measurement is over


# ------------------------------------------------------------------------------------------- the orchestrator


class Sampler:
    """Samples the operator's and the stand-in's /proc and Redis' INFO every `SAMPLE_S` from this process."""

    def __init__(self, operator_pid: int, standin_pid: int, redis_url: str) -> None:
        import redis

        self.pids = {"op": operator_pid, "standin": standin_pid}
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=5.0)
        self.samples: list[dict[str, float]] = []
        self.stop = threading.Event()
        self.ticks = float(os.sysconf("SC_CLK_TCK"))
        self.thread = threading.Thread(target=self.run, name="sampler", daemon=True)

    def one(self) -> dict[str, float]:
        sample: dict[str, float] = {"t": time.time()}
        for who, pid in self.pids.items():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
                    for key, value in proc_status(handle.read()).items():
                        sample[f"{who}_{key}"] = value
                with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                    sample[f"{who}_cpu"] = proc_cpu_s(handle.read(), self.ticks)
        with contextlib.suppress(Exception):
            info = self.redis.info()
            sample["redis_cpu"] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
            sample["redis_commands"] = float(info["total_commands_processed"])
            sample["redis_memory"] = float(info["used_memory"]) / MIB
            sample["redis_keys"] = float((info.get("db0") or {}).get("keys", 0))
        with contextlib.suppress(Exception):
            started = time.perf_counter()
            self.redis.ping()
            sample["redis_ping_ms"] = (time.perf_counter() - started) * 1000.0
        with contextlib.suppress(OSError):
            sample["load1"] = os.getloadavg()[0]
        return sample

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.one())
            self.stop.wait(SAMPLE_S)


def summarise(result: dict[str, Any], samples: Sequence[dict[str, float]]) -> dict[str, Any]:
    """The process figures of one size from the sampler's samples and the operator's phase times."""
    phases = result["phases"]
    baseline = window(samples, phases["ready"], phases["created"])
    steady = window(samples, phases["steady_start"], phases["steady_end"])
    rss = [s["op_VmRSS"] for s in steady if "op_VmRSS" in s]
    threads = [s["op_Threads"] for s in steady if "op_Threads" in s]
    every_threads = [s["op_Threads"] for s in samples if "op_Threads" in s]
    return {
        "baseline_rss_mib": statistics.median([s["op_VmRSS"] for s in baseline if "op_VmRSS" in s] or [0.0]),
        "steady_rss_mib": statistics.median(rss) if rss else None,
        "steady_rss_max_mib": max(rss) if rss else None,
        "peak_rss_mib": max((s.get("op_VmHWM", 0.0) for s in samples), default=None),
        "steady_threads": statistics.median(threads) if threads else None,
        "max_threads": max(every_threads) if every_threads else None,
        "operator_cpu_cores": rate_per_s(steady, "op_cpu"),
        "standin_cpu_cores": rate_per_s(steady, "standin_cpu"),
        "standin_rss_mib": statistics.median([s["standin_VmRSS"] for s in steady if "standin_VmRSS" in s] or [0.0]),
        "redis_cpu_cores": rate_per_s(steady, "redis_cpu"),
        "redis_commands_per_s": rate_per_s(steady, "redis_commands"),
        "redis_memory_mib": max((s.get("redis_memory", 0.0) for s in steady), default=None),
        "redis_keys": max((s.get("redis_keys", 0.0) for s in steady), default=None),
        "load1": statistics.median([s["load1"] for s in steady if "load1" in s] or [0.0]),
        "redis_ping_ms": statistics.median([s["redis_ping_ms"] for s in steady if "redis_ping_ms" in s] or [0.0]),
    }


def run_size(n: int, args: argparse.Namespace, scratch: str) -> dict[str, Any]:
    from support.redis_servers import RedisServer

    log(f"N={n}: a fresh redis-server, the worker stand-in and the operator")
    server = RedisServer().start()
    standin_log = open(os.path.join(scratch, f"standin-{n}.log"), "w", encoding="utf-8")  # noqa: SIM115
    operator_log = open(os.path.join(scratch, f"operator-{n}.log"), "w", encoding="utf-8")  # noqa: SIM115
    result_path = os.path.join(scratch, f"operator-{n}.json")
    python = sys.executable
    standin = subprocess.Popen(
        [python, WORKERS_SCRIPT, "--redis", server.url, "--sources", "spout"], stdout=standin_log, stderr=standin_log
    )
    command = [
        python,
        os.path.abspath(__file__),
        "--role",
        "operator",
        "--n",
        str(n),
        "--redis",
        server.url,
        "--result",
        result_path,
        "--steady-s",
        str(args.steady_s),
        "--warm-s",
        str(args.warm_s),
        "--idle-s",
        str(args.idle_s),
        "--scalings",
        str(args.scalings),
        "--gap-s",
        str(args.gap_s),
        "--start-timeout-s",
        str(args.start_timeout_s),
        "--scale-timeout-s",
        str(args.scale_timeout_s),
    ]
    operator = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=operator_log, text=True, bufsize=1)
    sampler = Sampler(operator.pid, standin.pid, server.url)
    sampler.thread.start()
    limit = args.start_timeout_s + args.warm_s + args.steady_s + args.idle_s
    limit += 2 * args.scalings * (args.scale_timeout_s + args.gap_s) + 120
    killer = threading.Timer(limit, operator.kill)
    killer.start()
    profile_path = os.path.join(scratch, f"profile-{n}.txt")
    profiler: subprocess.Popen[bytes] | None = None
    try:
        assert operator.stdout is not None
        for line in operator.stdout:
            if line.startswith("PROGRESS "):
                log(f"N={n}: {line[len('PROGRESS ') :].rstrip()}")
            if args.py_spy and profiler is None and "steady window" in line:
                duration = max(5, int(min(30.0, args.steady_s - 5.0)))
                record = ["record", "-p", str(operator.pid), "--duration", str(duration), "--rate", "50"]
                profiler = subprocess.Popen(
                    [
                        args.py_spy,
                        *record,
                        "--idle",
                        "--threads",
                        "--nonblocking",
                        "--format",
                        "raw",
                        "-o",
                        profile_path,
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
        operator.wait()
    finally:
        if profiler is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                profiler.wait(timeout=60)
        killer.cancel()
        sampler.stop.set()
        sampler.thread.join(timeout=5)
        standin.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            standin.wait(timeout=10)
        if standin.poll() is None:
            standin.kill()
        server.remove()
        standin_log.close()
        operator_log.close()
    if operator.returncode != 0 or not os.path.exists(result_path):
        raise SystemExit(
            f"N={n}: the operator process ended with {operator.returncode}; its log: "
            f"{os.path.join(scratch, f'operator-{n}.log')}"
        )
    with open(result_path, encoding="utf-8") as handle:
        result: dict[str, Any] = json.load(handle)
    result["process"] = summarise(result, sampler.samples)
    if os.path.exists(profile_path):
        with open(profile_path, encoding="utf-8") as handle:
            result["profile"] = profile_summary(handle)
    result["samples"] = sampler.samples
    process = result["process"]
    log(
        f"N={n}: RSS {process['steady_rss_mib']:.1f} MiB steady, {process['peak_rss_mib']:.1f} MiB peak, "
        f"{process['steady_threads']:.0f} threads, operator CPU {process['operator_cpu_cores'] or 0:.2f} cores"
    )
    return result


# ------------------------------------------------------------------------------------------------ the report


def _f(value: Any, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def _median_range(values: Sequence[float], digits: int = 0) -> str:
    if not values:
        return "-"
    return f"{_f(statistics.median(values), digits)} ({_f(min(values), digits)}-{_f(max(values), digits)})"


def scaling_values(result: Mapping[str, Any], key: str, direction: str | None = None) -> list[float]:
    return [
        float(s[key])
        for s in result["scalings"]
        if key in s
        and str(s.get("outcome")).lower() == "succeeded"
        and (direction is None or s["direction"] == direction)
    ]


def growth_kib(smaller: Mapping[str, Any], larger: Mapping[str, Any]) -> float | None:
    """Steady operator RSS added per topology from one size to a larger one (KiB)."""
    a, b = smaller["process"]["steady_rss_mib"], larger["process"]["steady_rss_mib"]
    if a is None or b is None or larger["n"] <= smaller["n"]:
        return None
    return float((b - a) * 1024.0 / (larger["n"] - smaller["n"]))


def per_minute(count: float, seconds: float) -> float:
    return count * 60.0 / seconds if seconds else 0.0


def render(results: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """docs/benchmarks/operator-scale.md from the raw results."""
    lines: list[str] = []
    add = lines.append
    add("# Operator scale: 1 to 1,000 topologies on one operator")
    add("")
    add(
        f"Produced by `{meta['command']}` in {meta['took_s']:.0f} s on {meta['machine']}, "
        f"{meta['date']}, code at {meta.get('code', 'unknown')}. Other jobs may run beside it (the load average "
        "during each steady window is in the last table), so single figures vary by tens of percent; nothing "
        "was re-run to pick a result."
    )
    add("")
    add("## What runs, what is a stand-in")
    add("")
    add(
        "Real: the operator's reconcile machinery as `elastream operator` wires it (`handlers/main.py`): the kopf "
        "handlers of `handlers/topology.py` (`reconcile_loop`, one asyncio task per resource as kopf's daemons "
        "are, and `changed`, which wakes a loop when its spec changes), each pass "
        "(`TopologyReconciler.reconcile`, `control/reconciler.py`, and its parts: `lifecycle.py`, `upgrades.py`, "
        "`controller_tick.py`, `convergence.py`) on the "
        "reconcile pool of `reconcile_workers` = 8 slots (`control/reconcile_slots.py`), the controller, the "
        "Kubernetes backend (`backends/kubernetes.py`: "
        "ConfigMap, Secret, PodDisruptionBudget and worker pods per topology), the migration (CCR) and checkpoint "
        "drivers, the status writer (`status_writer.py`, one merge patch per change, the rates at most every "
        "15 s), events, a real redis-server (one per size) with a Redis ACL user per topology and the operator's "
        "`UserKeeper`, and the operator's defaults (`OperatorOptions`)."
    )
    add("")
    add("Stand-ins:")
    add("")
    add(
        "- **The Kubernetes API is in memory** (`InMemoryApi` in the script): requests are counted by kind; a "
        "status patch is merged into the stored resource and, as kopf's watch would, into the live body the "
        "loop reads. Pods come back as the Kubernetes client's `V1Pod` models, deserialised from JSON by the "
        "client's own `ApiClient` (the CPU a real list costs the operator), the rest as dicts. No HTTP, no API "
        "server latency, no etcd: a real API server adds a few ms to each request, on the reconcile threads."
    )
    add(
        "- **kopf's watch and daemon bookkeeping** are replaced by the script's loop, which calls the real "
        "handler coroutines; kopf is imported (its memory counts), its per-resource bookkeeping is not measured."
    )
    add(
        "- **Workers**: `bench/operator_scale_workers.py`, one process for every worker node of every topology. "
        "Told of each pod the operator creates or deletes, it registers endpoints and readiness (or the staged "
        "version) in Redis as a worker does, answers STAGE, SWITCH, UNSTAGE and STOP on the node's control list, "
        "acks PREPARE and INIT at once and COMMIT and the checkpoint barrier for every executor once every source "
        "has it (the in-band sweep), writes the sources' positions with each checkpoint, and publishes one metric "
        "sample per executor per second with rates that move by a few percent. It processes nothing."
    )
    add(
        "- **Analysis**: the Python reference (`--engine python`); the Spark JVM is a process of its own (its "
        "memory is in [operator.md](operator.md)) and would warm up per new topology."
    )
    add("")
    add(
        "Each topology: source -> work -> sink, one executor each, 1 node (`slotsPerNode` 4), every other "
        "field the CRD's default (checkpoint every 10 s, CCR, Stela, window 20). Per size: every topology is "
        "created at once; once all are Running and "
        f"{meta['warm_s']:.0f} s later, a steady window of {meta['steady_s']:.0f} s; then t0000 is scaled out "
        "1 -> 2 nodes and back in by changing `spec.nodes` (a new generation, `changed` wakes its loop), "
        f"{meta['scalings']} times each way, {meta['gap_s']:.0f} s apart, while the others run on. The memory "
        "and threads of the operator process are read from `/proc/<pid>/status` (VmRSS, VmHWM, Threads) every "
        "0.5 s by the benchmark's own process. The operator process also holds the benchmark's instruments: a "
        "timer around each pass (compact arrays, under a MiB), a counter of Redis round trips and the in-memory "
        "API's objects (their size is in the detail table)."
    )
    add("")
    add("## Results")
    add("")
    add(
        "| topologies | all Running after | operator RSS, steady (MiB) | peak RSS (MiB) | threads | operator CPU "
        "(cores) | pass p50 / p99 (ms) | waited for a thread p50 / p99 (ms) | time between passes p50 / p99 (s) "
        "| spec.nodes -> status (ms), median (min-max) | status writes per minute (per topology) |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        p, s = r["process"], r["steady"]
        latency = scaling_values(r, "patch_to_status_ms")
        writes = per_minute(s["status_writes"], s["window_s"])
        add(
            f"| {r['n']:,} | {_f(r['available_s'], 1, ' s')}"
            + ("" if r["running"] == r["n"] else f" ({r['running']:,} of {r['n']:,})")
            + f" | {_f(p['steady_rss_mib'], 1)} | {_f(p['peak_rss_mib'], 1)} | {_f(p['steady_threads'])} "
            f"| {_f(p['operator_cpu_cores'], 2)} | {_f(s['pass_ms']['p50'], 1)} / {_f(s['pass_ms']['p99'], 1)} "
            f"| {_f(s['queued_ms']['p50'], 1)} / {_f(s['queued_ms']['p99'], 1)} "
            f"| {_f(s['period_s']['p50'], 2)} / {_f(s['period_s']['p99'], 2)} "
            f"| {_median_range(latency)} | {_f(writes, 0)} ({_f(writes / r['n'], 2)}) |"
        )
    add("")
    add(
        "RSS steady: the median over the steady window; peak: VmHWM at the end of the run (start-up and scalings "
        "included). Threads: the median over the steady window (the most seen at any time is in the detail "
        'table). A pass is one `TopologyReconciler.reconcile` on a pool thread; "waited for a thread" is the '
        'time from the loop\'s `run_in_executor` to the pass starting; "time between passes" is between two '
        "pass starts of the same topology (an idle topology asks for one every `tick_s` = 2 s). Status writes: "
        "every patch of a status in the steady window (all topologies), per minute."
    )
    add("")
    add("### Scaling one topology among N")
    add("")
    add(
        "From the change of `spec.nodes` (the resource stored with a new generation and `changed` called, as "
        "kopf does on the watch event) to the first status write that shows the new node count, every node "
        "ready, the generation observed and phase Running. The pieces: until the first pass starts (the wake "
        "and the wait for a pool thread), until the scaling starts (that pass sees the new spec and waits "
        "`settle_s` = 1 s for a burst of patches to end; the next pass waits for a thread again), the scaling "
        "(analysis, Stela's plan, a new worker pod started and staged, CCR: PREPARE, COMMIT, SWITCH, INIT; "
        "`lastScaling.startedAt` -> `finishedAt`), and its end to the status write. Medians (min-max) of the "
        "scalings that succeeded, in ms."
    )
    add("")
    add(
        "| topologies | direction | scalings | spec.nodes -> first pass | -> scaling starts | of which waiting for "
        "a thread | scaling | of which sources paused | -> status written | **spec.nodes -> status** |"
    )
    add("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        for direction in ("out", "in"):
            ok = scaling_values(r, "patch_to_status_ms", direction)
            tried = [s for s in r["scalings"] if s["direction"] == direction]
            add(
                f"| {r['n']:,} | {direction} ({'1 -> 2' if direction == 'out' else '2 -> 1'}) | {len(ok)} of "
                f"{len(tried)} | {_median_range(scaling_values(r, 'patch_to_first_pass_ms', direction))} "
                f"| {_median_range(scaling_values(r, 'patch_to_scaling_ms', direction))} "
                f"| {_median_range(scaling_values(r, 'scaling_pass_queued_ms', direction))} "
                f"| {_median_range(scaling_values(r, 'scaling_ms', direction))} "
                f"| {_median_range(scaling_values(r, 'pauseMs', direction))} "
                f"| {_median_range(scaling_values(r, 'finished_to_status_ms', direction))} "
                f"| **{_median_range(ok)}** |"
            )
    add("")
    add("### Detail of the steady window")
    add("")
    add(
        "| topologies | window (s) | passes | checkpoints completed / due | checkpoints failed | status writes "
        "| events | warnings logged | max threads | baseline RSS (MiB) | RSS over the baseline (MiB) "
        "| of which the in-memory API's objects (MiB) "
        "| stand-in CPU (cores) | Redis CPU (cores) | Redis commands/s | Redis memory (MiB) | Redis PING (ms) "
        "| load average |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        p, s = r["process"], r["steady"]
        due = r["n"] * s["window_s"] / 10.0
        over = p["steady_rss_mib"] - p["baseline_rss_mib"] if p["steady_rss_mib"] else None
        add(
            f"| {r['n']:,} | {s['window_s']:.0f} | {s['passes']:,} | {s['checkpoints_completed']:,} / {due:,.0f} "
            f"| {s['checkpoints_failed']:,} | {s['status_writes']:,} | {s['events']:,} "
            f"| {sum(s['warnings'].values()):,} | {_f(p['max_threads'])} | {_f(p['baseline_rss_mib'], 1)} "
            f"| {_f(over, 1)} | {_f(s.get('api_stored_mib'), 1)} "
            f"| {_f(p['standin_cpu_cores'], 2)} | {_f(p['redis_cpu_cores'], 2)} "
            f"| {_f(p['redis_commands_per_s'], 0)} | {_f(p['redis_memory_mib'], 0)} "
            f"| {_f(p.get('redis_ping_ms'), 2)} | {_f(p['load1'], 1)} |"
        )
    add("")
    growth = [
        f"{a['n']:,} -> {b['n']:,}: {kib:,.0f} KiB"
        for a, b in itertools.pairwise(results)
        if (kib := growth_kib(a, b)) is not None
    ]
    if growth:
        add("")
        add(f"Operator RSS added per topology between the sizes (steady medians): {'; '.join(growth)}.")
    add("")
    add("Threads of the operator process at the end of the steady window, by kind:")
    add("")
    for r in results:
        kinds = ", ".join(f"{k} {v}" for k, v in r["steady"]["threads"].items())
        add(f"- {r['n']:,} topologies: {kinds}")
    add("")
    add("API requests in the steady window, per minute (what a real API server would serve):")
    add("")
    for r in results:
        s = r["steady"]
        calls = ", ".join(f"{k} {per_minute(v, s['window_s']):,.0f}" for k, v in s["api_calls"].items())
        add(f"- {r['n']:,} topologies: {calls or 'none'}")
    add("")
    add(
        "Redis in the steady window, every client (the operator and the stand-in), the commands that took the "
        "most server time: calls per second, and server time in ms per second (1,000 = one core busy):"
    )
    add("")
    for r in results:
        commands = r["steady"].get("redis_commands") or {}
        shown = ", ".join(
            f"{name} {c['calls_per_s']:,.0f}/s ({c['usec_per_s'] / 1000.0:,.1f})" for name, c in commands.items()
        )
        add(f"- {r['n']:,} topologies: {shown or 'not read'}")
    add("")
    add("Redis round trips of the operator (a command, or a pipeline) in the steady window, per reconcile pass:")
    add("")
    for r in results:
        s = r["steady"]
        trips = s.get("redis_round_trips")
        if trips is not None and s["passes"]:
            add(
                f"- {r['n']:,} topologies: {trips / s['passes']:,.1f} per pass "
                f"({per_minute(trips, s['window_s']) / 60.0:,.0f} per second)"
            )
    profiled = [r for r in results if (r.get("profile") or {}).get("reconcile_samples", 0) >= MIN_PROFILE_SAMPLES]
    if profiled:
        add("")
        add(
            "Where the reconcile threads' time goes (py-spy, `--py-spy`: 50 samples a second of every thread of "
            "the operator, waiting included, for up to 30 s of the steady window). Of the samples of a pool "
            "thread running a pass: the share waiting for a Redis reply, and the elastream functions on the stack "
            "(inclusive: a function's callees count in its share); and how busy the event loop was:"
        )
        add("")
        for r in profiled:
            prof = r["profile"]
            shares = "; ".join(f"{k} {v:.0f} %" for k, v in prof["inclusive_pct"].items())
            add(
                f"- {r['n']:,} topologies ({prof['reconcile_samples']:,} samples): waiting for Redis "
                f"{_f(prof['redis_wait_pct'], 0)} %, event loop busy {_f(prof['loop_busy_pct'], 0)} %. {shares}"
            )
    examples = [(r["n"], e) for r in results for e in r["steady"].get("warning_examples", [])]
    if examples:
        add("")
        add("Warnings the operator logged in the steady window (first few distinct):")
        add("")
        for n, example in examples[:12]:
            add(f"- {n:,} topologies: `{example}`")
    add("")
    add("![operator scale](operator-scale.png)")
    add("")
    for paragraph in [*findings(results), *meta.get("notes", [])]:
        add(paragraph)
        add("")
    return "\n".join(lines).rstrip() + "\n"


def plot(results: Sequence[Mapping[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0][0]
    ax.plot(ns, [r["process"]["steady_rss_mib"] for r in results], "o-", label="RSS, steady (median)")
    ax.plot(ns, [r["process"]["peak_rss_mib"] for r in results], "s--", label="peak RSS (VmHWM)")
    ax.set_ylabel("MiB")
    ax.set_title("operator memory")
    ax.legend()
    ax = axes[0][1]
    ax.plot(ns, [r["process"]["steady_threads"] for r in results], "o-", label="steady (median)")
    ax.plot(ns, [r["process"]["max_threads"] for r in results], "s--", label="most at any time")
    ax.set_ylim(bottom=0)
    ax.set_title("operator threads")
    ax.legend()
    ax = axes[1][0]
    medians, lows, highs = [], [], []
    for r in results:
        values = scaling_values(r, "patch_to_status_ms")
        m = statistics.median(values) if values else float("nan")
        medians.append(m / 1000.0)
        lows.append((m - min(values)) / 1000.0 if values else 0.0)
        highs.append((max(values) - m) / 1000.0 if values else 0.0)
    ax.errorbar(ns, medians, yerr=[lows, highs], fmt="o-", capsize=4, label="spec.nodes -> status (median, min-max)")
    ax.plot(ns, [(r["steady"]["pass_ms"]["p99"] or 0) / 1000.0 for r in results], "s--", label="reconcile pass p99")
    ax.plot(
        ns, [(r["steady"]["queued_ms"]["p99"] or 0) / 1000.0 for r in results], "^:", label="waited for a thread p99"
    )
    ax.set_ylabel("s")
    ax.set_title("reconcile latency of one topology")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    ax.plot(ns, [per_minute(r["steady"]["status_writes"], r["steady"]["window_s"]) for r in results], "o-")
    ax.set_ylabel("status writes per minute (all topologies)")
    ax.set_title("status writes")
    for ax in axes.flat:
        ax.set_xscale("log")
        ax.set_xlabel("topologies")
        ax.set_xticks(ns)
        ax.set_xticklabels([f"{n:,}" for n in ns])
        ax.grid(True, alpha=0.3)
    fig.suptitle("One operator process, N StreamTopology resources (workers: stand-in)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    memory = ""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", encoding="utf-8") as handle:
        total_kib = int(handle.readline().split()[1])
        memory = f", {total_kib / 1024 / 1024:.0f} GiB of memory"
    return (
        f"a shared {platform.machine()} machine with {os.cpu_count()} cores{memory}, Python "
        f"{platform.python_version()}, redis-server {_redis_version()}"
    )


def _redis_version() -> str:
    with contextlib.suppress(Exception):
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
        for part in out.split():
            if part.startswith("v="):
                return part[2:]
    return "?"


def code_version() -> str:
    """The commit measured, and whether the operator's sources differed from it (other work in progress)."""
    with contextlib.suppress(Exception):
        head = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", REPO, "status", "--short", "--", "operator/src"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
        return f"{head}" + (f" with {len(changed)} uncommitted files under operator/src" if changed else "")
    return "unknown"


def write_report(raw: Mapping[str, Any], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    results = raw["results"]
    with open(os.path.join(out, "operator-scale.md"), "w", encoding="utf-8") as handle:
        handle.write(render(results, raw["meta"]))
    plot(results, os.path.join(out, "operator-scale.png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="topology counts, comma-separated")
    parser.add_argument("--steady-s", type=float, default=60.0)
    parser.add_argument("--warm-s", type=float, default=15.0, help="after all are Running, before the steady window")
    parser.add_argument("--idle-s", type=float, default=3.0, help="the operator with no topology (its baseline)")
    parser.add_argument("--scalings", type=int, default=3, help="scale-outs of t0000 (each followed by a scale-in)")
    parser.add_argument("--gap-s", type=float, default=4.0, help="between the scalings")
    parser.add_argument("--start-timeout-s", type=float, default=300.0)
    parser.add_argument("--scale-timeout-s", type=float, default=120.0)
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks"))
    parser.add_argument("--raw", default=os.path.join("/tmp", "elastream-operator-scale.json"))
    parser.add_argument("--report-only", action="store_true", help="write the report from --raw, run nothing")
    parser.add_argument(
        "--py-spy", default="", help="a py-spy binary: sample the operator's threads during each steady window"
    )
    # the operator process (internal)
    parser.add_argument("--role", choices=("bench", "operator"), default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--redis", default="", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "operator":
        return operator_main(args)
    if args.report_only:
        with open(args.raw, encoding="utf-8") as handle:
            write_report(json.load(handle), args.out)
        log(f"wrote {args.out}/operator-scale.md and operator-scale.png from {args.raw}")
        return 0
    import tempfile

    started = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="elastream-operator-scale-")
    log(f"logs of the operator and the stand-in in {scratch}")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results = [run_size(n, args, scratch) for n in sizes]
    shown = " ".join(sys.argv[1:])
    meta = {
        "command": f"python bench/operator_scale.py{' ' + shown if shown else ''}",
        "took_s": time.monotonic() - started,
        "machine": machine(),
        "code": code_version(),
        "date": datetime.date.today().isoformat(),
        "steady_s": args.steady_s,
        "warm_s": args.warm_s,
        "scalings": args.scalings,
        "gap_s": args.gap_s,
        "notes": NOTES,
    }
    raw = {"meta": meta, "results": results}
    with open(args.raw, "w", encoding="utf-8") as handle:
        json.dump(raw, handle)
    write_report(raw, args.out)
    log(f"wrote {args.out}/operator-scale.md and operator-scale.png (raw: {args.raw}) in {meta['took_s']:.0f} s")
    return 0


def findings(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The explanations under the tables: what limited scale, in the largest size's numbers, and where in the
    code (file:line at the commit the report names)."""
    if not results:
        return []
    big, small = max(results, key=lambda r: r["n"]), min(results, key=lambda r: r["n"])
    n, s, p = big["n"], big["steady"], big["process"]
    prof = big.get("profile") or {}
    rate = s["passes"] / s["window_s"] if s["window_s"] else 0.0
    trips = s.get("redis_round_trips")
    per_pass = trips / s["passes"] if trips is not None and s["passes"] else None
    latency = scaling_values(big, "patch_to_status_ms")
    scaling = scaling_values(big, "scaling_ms")
    small_latency = scaling_values(small, "patch_to_status_ms")
    growth = [g for a, b in itertools.pairwise(results) if (g := growth_kib(a, b)) is not None]
    lists = s["api_calls"].get("list pods", 0)
    commands = list((s.get("redis_commands") or {}).items())
    ranked = [i for i, (name, _) in enumerate(commands) if name == "acl|getuser"]
    getuser = "ACL GETUSER was not among the commands that took the most Redis server time"
    if ranked:
        stats = commands[ranked[0]][1]
        place = "the command" if ranked[0] == 0 else f"number {ranked[0] + 1} of the commands"
        getuser = (
            f"at {n:,} topologies it was {place} that took the most Redis server time "
            f"({stats['usec_per_s'] / 1000.0:,.0f} ms a second, "
            f"{stats['usec_per_s'] / max(stats['calls_per_s'], 1e-9):,.0f} µs a call)"
        )
    out = [
        "## What limits scale",
        f"**The reconcile pool.** At {n:,} topologies the one pool of 8 reconcile threads is the bottleneck. An "
        f"idle topology asks for a pass every `tick_s` = 2 s (`Pacing.tick_s`, control/pacing.py), {n / 2:,.0f} passes "
        f"per second in all; the pool ran {rate:,.0f} per second, so a pass waited "
        f"{_f(s['queued_ms']['p50'] / 1000.0, 1)} s (median) for a thread and a topology got one every "
        f"{_f(s['period_s']['p50'], 1)} s instead of 2 s. The "
        f"threads were busy, not the processor: the operator used {_f(p['operator_cpu_cores'], 2)} cores, and "
        f"{_f(prof.get('redis_wait_pct'), 0)} % of the time a pool thread spent in a pass it was blocked on a Redis "
        f"reply (py-spy). A pass of an idle topology makes {_f(per_pass, 1)} Redis round trips one after the other "
        f"on the synchronous client; at the {_f(p.get('redis_ping_ms'), 1)} ms a round trip took on this loaded "
        f"machine (Redis PING; Redis itself used {_f(p['redis_cpu_cores'], 2)} cores), that is most of the "
        f"{_f(s['pass_ms']['p50'], 0)} ms a pass took (median). The pool's throughput is about `reconcile_workers` / "
        "(round trips x round-trip time + processor time per pass): a quieter machine goes further, but the bound "
        "is the same, and every topology shares one first-in first-out queue (handlers/topology.py `reconcile_loop`, "
        "`loop.run_in_executor(memo.pool, ...)`; the pool: handlers/main.py `run`, `reconcile_workers` = 8 slots "
        "in control/operator_options.py), so a topology whose spec changed waits behind every idle tick. "
        "(A pass that waits "
        "for pods gives its slot back, control/reconcile_slots.py; an idle topology's pass never waits, so here "
        "the pool kept its 8 threads.)",
        f"**A scaling waits twice.** A change of `spec.nodes` is acted on two passes later: the pass that sees it "
        "notes the new spec and comes back after `settle_s` = 1 s (`Pacing.settle_s`, "
        "control/pacing.py), and the next pass scales; both wait for a thread in that queue. So at "
        f"{n:,} topologies spec.nodes -> status took {_median_range([v / 1000.0 for v in latency], 1)} s, of "
        f"which the scaling itself (analysis, plan, CCR migration) {_median_range(scaling)} ms; at {small['n']:,} "
        f"topology it is the settle second plus the scaling, {_median_range(small_latency)} ms.",
        "**What a pass reads.** In order (control/reconciler.py `TopologyReconciler._pass`): the topology's Redis "
        "user, with an "
        "ACL GETUSER on every pass that compares its rules (`Lifecycle.check_redis_user`, "
        "control/lifecycle.py -> store/acl.py), although the operator's `UserKeeper` already sets a lost user "
        "again within 2 s "
        f"with one ACL USERS for all of them (store/acl.py `UserKeeper`); {getuser}; then the controller's tick "
        "(control/controller.py `TopologyController.tick`): the metric stream (a Lua "
        "page script, store/metric_stream.py), the state epoch, a migration or checkpoint left "
        "unfinished, drain requests (control/controller_drains.py), the checkpoint round's begin, look and completion "
        "(control/checkpoint_driver.py, store/checkpoint_store.py); then the ready nodes for the status. "
        "Mostly reads of what did not change, each its own round trip. Reading them in one pipeline per pass, "
        "leaving the Redis user to the keeper, and serving a topology whose resource changed before the idle "
        "ticks (or ticking idle topologies less often as their number grows) would each shorten the queue.",
        f"**Memory and threads.** The operator's RSS grows by about {' and '.join(f'{g:,.0f}' for g in growth)} KiB "
        "per topology between the sizes (the live resource bodies, as kopf would hold them, and per topology a "
        "controller, a Kubernetes backend, a status writer, events and a Redis user to keep), of which this "
        f"benchmark's in-memory API objects are {_f(s.get('api_stored_mib'), 1)} MiB at {n:,}. The threads do not "
        "grow: the event loop, the 8 pool threads (made as needed: 3 threads in all with one topology) and the "
        f"Redis user keeper; the most seen ({_f(p['max_threads'])}) were during the start-up, when each start "
        "runs the analysis warm-up on a thread of its own (`Analyzer.start_warm_up`, analysis/__init__.py), "
        "which ends at once with the Python engine. With the Spark engine (the operator's default, not measured "
        "here) each warm-up runs two small Spark analyses under the analyzer's one lock (analysis/__init__.py): "
        "a thousand topologies started at once make up to a thousand threads waiting for it, and a scaling's "
        "analysis waits behind them.",
        f"**API requests.** {per_minute(s['status_writes'], s['window_s']) / n:,.1f} status writes per topology "
        "per minute: the rates change a little every interval and are written at most every `status_every_s` = "
        "15 s (control/status_writer.py; control/operator_options.py), fewer when passes are further apart; "
        f"{per_minute(s['status_writes'], s['window_s']):,.0f} a minute to the API server at {n:,}. Every pass "
        f"also lists the topology's pods ({per_minute(lists, s['window_s']):,.0f} lists a minute at {n:,}: the "
        "backend's pod cache, `POD_CACHE_S` = 0.5 s in control/backends/kubernetes.py, is shorter than the time "
        "between two passes of a topology); with the pool keeping up that would be one list per topology every "
        "2 s, which a real API server would have to serve.",
        f"**Checkpoints.** {s['checkpoints_completed']:,} of {n * s['window_s'] / 10.0:,.0f} due rounds completed "
        f"in the steady window at the largest size, {s['checkpoints_failed']:,} failed: a round begins in one "
        "pass and completes in a "
        "later one (control/checkpoint_driver.py `Checkpointer`), so its period is the interval plus the time to "
        "the next pass.",
        f"**The machine.** It was shared (load average in the detail table): the Redis PING took "
        f"{_f(p.get('redis_ping_ms'), 2)} ms at {n:,} topologies against {_f(small['process'].get('redis_ping_ms'), 2)}"
        f" ms at {small['n']:,}. What is bound by round trips (pass time, passes per second, waits, the scaling "
        "latency at the largest size) would be better on a quiet machine; the counts (round trips per pass, "
        "status writes, API requests) and the memory would not change.",
    ]
    return out


#: explanations that do not depend on the numbers (none: `findings` writes them from the results)
NOTES: list[str] = []


if __name__ == "__main__":
    sys.exit(main())
