"""A light stand-in for elastream's worker processes, for `bench/operator_scale.py`: one process plays every
worker node of every topology, registers and acknowledges through Redis the way `elastream worker` does, and
processes nothing. So a benchmark of a thousand topologies measures the operator, not a thousand Python
worker processes with their executors, sockets and sources.

What it does, node by node, with the keys and messages of the real protocol (`store.registry`,
`store.control`, `store.checkpoint_store`, `store.metric_stream`):
- a pod created by the operator (the benchmark's in-memory API server tells it on the Redis list
  `POD_QUEUE`) starts a node: it clears the node's control list (a previous worker's messages), reads the
  running schedule (or, for a node a migration adds, the staged version named in the pod), registers an
  endpoint per executor it hosts (never bound: no data plane), and marks itself ready (or staged), as a
  worker does once its executors are bound;
- its control list `<prefix>control:<node>`: STAGE (endpoints of the staged version, marked staged), SWITCH
  (the new version's endpoints, marked ready; a node the new schedule drops stops), UNSTAGE, STOP; for an
  executor, PREPARE and INIT are acked at once, CHECKPOINT and COMMIT (sent to the sources) are acked for
  every executor of the schedule once every source has one, as the barrier or COMMIT sweeping the dataflow
  in-band would; sources write a read position with their checkpoint. RESUME, ABORT and CHECKPOINT_ABORT
  need no answer;
- a deleted pod stops its node;
- every interval, one `MetricSample` per executor of every running node on `<prefix>metrics`, its counters
  growing at `--rate` events/s per vertex with a few percent of jitter (so the live rates move, as a running
  topology's do).

What it does not do: run executors, move events, bind sockets, keep state (a checkpoint's state is empty),
use the topology's own Redis user (it connects with the URL it is given). `StandIn` decides (no I/O:
`on_pod`, `on_control` and `samples` return effects); `Runner` reads Redis (keyspace notifications tell it
which lists have messages: it sets `notify-keyspace-events` on the benchmark's own redis-server) and carries
the effects out.

    python bench/operator_scale_workers.py --redis redis://127.0.0.1:6379/0 --sources spout
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "operator", "src"))

#: the Redis list the benchmark's in-memory API server pushes pod creations and deletions to
POD_QUEUE = "elastream-bench:pods"
#: control message types (the values of `elastream.core.migration_protocol.ControlType`)
STAGE, SWITCH, UNSTAGE, STOP = "stage", "switch", "unstage", "stop"
PREPARE, COMMIT, INIT, CHECKPOINT = "prepare", "commit", "init", "checkpoint"
#: the ack phase of the sweeps: COMMIT and CHECKPOINT reach every executor in-band behind the sources'
SWEEP_PHASE = {COMMIT: "committing", CHECKPOINT: "checkpointing"}
#: seconds between the stand-in's progress lines (on its stdout)
REPORT_S = 10.0
#: seconds between pops of every known list (a keyspace notification missed is picked up by the next)
SWEEP_S = 2.0

#: (version, {executor: node}) of a schedule, or None when Redis has none
ScheduleLookup = Callable[[str, int | None], tuple[int, Mapping[str, str]] | None]


def vertex_of(executor: str) -> str:
    return executor.rpartition("#")[0] or executor


def hosted(assignment: Mapping[str, str], node: str) -> tuple[str, ...]:
    """The executors `assignment` places on `node`, sorted."""
    return tuple(sorted(e for e, n in assignment.items() if n == node))


def endpoints_for(executors: Iterable[str], version: int, node: str) -> dict[str, str]:
    """Inbox endpoints as a worker registers them (never bound here): one port per executor, by version."""
    base = 20000 + (version % 2) * 1000 + (sum(map(ord, node)) % 50) * 10
    return {e: f"tcp://127.0.0.1:{base + i}" for i, e in enumerate(sorted(executors))}


@dataclass
class StandInNode:
    prefix: str
    node: str
    #: the running schedule version (0: started for a staged version only, not running yet)
    version: int = 0
    staged: int = 0
    executors: tuple[str, ...] = ()
    started_at: float = 0.0


@dataclass(frozen=True)
class Effect:
    """Something to write to Redis: `kind` is clear (the node's control list) | ack | position | staged |
    ready | stopped."""

    kind: str
    prefix: str
    node: str = ""
    version: int = 0
    mid: str = ""
    phase: str = ""
    executors: tuple[str, ...] = ()
    endpoints: Mapping[str, str] = field(default_factory=dict)


@dataclass
class StandIn:
    """Every stand-in node and the sweeps in flight; pure (schedules come from `lookup`)."""

    source_vertices: frozenset[str]
    lookup: ScheduleLookup
    nodes: dict[tuple[str, str], StandInNode] = field(default_factory=dict)
    #: (prefix, kind, mid) -> the sources that have it
    sweeps: dict[tuple[str, str, str], set[str]] = field(default_factory=dict)

    def on_pod(self, op: Mapping[str, Any], now: float) -> list[Effect]:
        """A pod was created (`op` create: prefix, node, version: the staged one or 0) or deleted (delete)."""
        prefix, node = str(op["prefix"]), str(op["node"])
        key = (prefix, node)
        if op.get("op") == "delete":
            return self._stop(key)
        staged = int(op.get("version") or 0)
        found = self.lookup(prefix, staged or None)
        if found is None:  # a real worker waits for it; the operator wrote it before creating the pod
            return []
        version, assignment = found
        mine = hosted(assignment, node)
        state = StandInNode(prefix, node, started_at=now)
        self.nodes[key] = state
        clear = Effect("clear", prefix, node)  # a previous worker's messages (its STOP), as a worker clears them
        if staged:
            state.staged = version
            return [clear, Effect("staged", prefix, node, version, endpoints=endpoints_for(mine, version, node))]
        state.version, state.executors = version, mine
        return [clear, Effect("ready", prefix, node, version, endpoints=endpoints_for(mine, version, node))]

    def on_control(self, prefix: str, node: str, executor: str, message: Mapping[str, Any]) -> list[Effect]:
        """One message popped from `<prefix>control:<node>` (executor "" : for the node itself)."""
        key = (prefix, node)
        state = self.nodes.get(key)
        kind = str(message.get("type"))
        mid = str(message.get("mid") or "")
        if state is None:
            return []  # a node that stopped: its list is read no more by a real worker either
        if not executor:
            return self._node_message(state, kind, int(message.get("version") or 0))
        if kind in (PREPARE, INIT):
            phase = "preparing" if kind == PREPARE else "initializing"
            return [Effect("ack", prefix, node, mid=mid, phase=phase, executors=(executor,))]
        if kind in SWEEP_PHASE:
            return self._sweep(prefix, kind, mid, executor)
        return []  # RESUME, ABORT, CHECKPOINT_ABORT: nothing captured, nothing to replay

    def _node_message(self, state: StandInNode, kind: str, version: int) -> list[Effect]:
        prefix, node = state.prefix, state.node
        if kind == STOP:
            return self._stop((prefix, node))
        if kind == UNSTAGE:
            if state.staged == version:
                state.staged = 0
                if not state.version:
                    return self._stop((prefix, node))
            return []
        found = self.lookup(prefix, version)
        if found is None:
            return []  # a real worker logs it; the operator times the step out
        _, assignment = found
        mine = hosted(assignment, node)
        if kind == STAGE:
            state.staged = version
            return [Effect("staged", prefix, node, version, endpoints=endpoints_for(mine, version, node))]
        if kind == SWITCH:
            if node not in set(assignment.values()):
                return self._stop((prefix, node))  # not in the new schedule: the worker exits
            if state.version == version:
                return []  # a repeated switch
            state.version, state.staged, state.executors = version, 0, mine
            return [Effect("ready", prefix, node, version, endpoints=endpoints_for(mine, version, node))]
        return []

    def _sweep(self, prefix: str, kind: str, mid: str, source: str) -> list[Effect]:
        """COMMIT or CHECKPOINT to one source; once every source of the running schedule has it, every
        executor acks (the in-band sweep), sources with a position."""
        found = self.lookup(prefix, None)
        if found is None:
            return []
        _, assignment = found
        sources = {e for e in assignment if vertex_of(e) in self.source_vertices}
        seen = self.sweeps.setdefault((prefix, kind, mid), set())
        seen.add(source)
        if not seen >= sources:
            return []
        del self.sweeps[(prefix, kind, mid)]
        effects = [Effect("position", prefix, mid=mid, executors=tuple(sorted(sources)))]
        effects.append(Effect("ack", prefix, mid=mid, phase=SWEEP_PHASE[kind], executors=tuple(sorted(assignment))))
        return effects

    def _stop(self, key: tuple[str, str]) -> list[Effect]:
        state = self.nodes.pop(key, None)
        if state is None:
            return []
        return [Effect("stopped", key[0], key[1])]

    def samples(self, now: float, rate: float, rng: random.Random) -> dict[str, list[dict[str, Any]]]:
        """prefix -> this interval's metric samples (fields of `elastream.core.metrics.MetricSample`) of every
        executor of every running node: cumulative counters at about `rate` events/s since the node started."""
        out: dict[str, list[dict[str, Any]]] = {}
        for state in self.nodes.values():
            if not state.version:
                continue
            up = max(0.0, now - state.started_at)
            for executor in state.executors:
                count = int(rate * up * (1.0 + rng.uniform(-0.03, 0.03)))
                sink_like = vertex_of(executor) not in self.source_vertices
                out.setdefault(state.prefix, []).append(
                    {
                        "ts": now,
                        "node": state.node,
                        "vertex": vertex_of(executor),
                        "executor": executor,
                        "started_at": state.started_at,
                        "received": count if sink_like else 0,
                        "processed": count,
                        "emitted": count,
                        "busy_s": round(count * 0.0001, 6),
                        "queue_len": 0,
                        "latency_ms": 1.0,
                        "errors": 0,
                    }
                )
        return out

    def control_keys(self) -> list[str]:
        return [f"{prefix}control:{node}" for prefix, node in self.nodes]


class Runner:
    """Reads Redis and carries `StandIn`'s effects out. A message is found by Redis' keyspace notifications
    (`notify-keyspace-events Kl`: an RPUSH to the pod queue or a control list is announced), then popped with
    the others of its round in one pipeline; every `SWEEP_S` every known list is popped as well, in case a
    notification was missed. So a thousand nodes cost a message's own work, not a BLPOP over a thousand keys
    each. The effects of a round are written in one pipeline, in the layout of `store.registry` and
    `store.checkpoint_store`. A second thread publishes the metric samples."""

    def __init__(self, url: str, sources: Iterable[str], rate: float, interval_s: float) -> None:
        from elastream.store.codec import pack
        from elastream.store.registry import Registry, client_for

        self._pack = pack
        self._registry = Registry
        self.client = client_for(url, socket_timeout=30.0)
        self.metrics_client = client_for(url, socket_timeout=30.0)
        self.db = int(self.client.connection_pool.connection_kwargs.get("db", 0) or 0)
        self.rate, self.interval_s = rate, interval_s
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.standin = StandIn(frozenset(sources), self.lookup)
        #: messages handled, by type (printed every `REPORT_S`)
        self.handled: dict[str, int] = {}

    def lookup(self, prefix: str, version: int | None) -> tuple[int, Mapping[str, str]] | None:
        registry = self._registry(self.client, prefix)
        found = registry.schedule() if version is None else registry.schedule_version(version)
        return None if found is None else (found[0], dict(found[1].assignment))

    def run_control(self) -> None:
        from elastream.store.codec import text

        self.client.config_set("notify-keyspace-events", "Kl")
        channel = f"__keyspace@{self.db}__:"
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.psubscribe(f"{channel}*control:*", f"{channel}{POD_QUEUE}")
        next_report = time.monotonic() + REPORT_S
        next_sweep = time.monotonic() + SWEEP_S
        while not self.stop.is_set():
            due: set[str] = set()
            message = pubsub.get_message(timeout=0.2)
            while message is not None:
                if message.get("type") == "pmessage" and text(message["data"]) == "rpush":
                    due.add(text(message["channel"])[len(channel) :])
                message = pubsub.get_message(timeout=0.0)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + SWEEP_S
                with self.lock:
                    due.update(self.standin.control_keys())
                due.add(POD_QUEUE)
            if not due:
                continue
            self.round(sorted(due, key=lambda k: k != POD_QUEUE))  # pods first: their nodes' messages follow
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + REPORT_S
                print(
                    f"{time.strftime('%H:%M:%S')} {len(self.standin.nodes)} nodes; handled {self.handled}", flush=True
                )

    def round(self, keys: list[str]) -> None:
        """Pop every message of `keys` (in one pipeline), decide, and write the effects (in one more)."""
        from elastream.store.codec import text

        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.lpop(key, 1000)
        popped = pipe.execute()
        effects: list[Effect] = []
        #: control lists of nodes started in this round: what was popped from them was there before the pod
        #: (a previous worker's STOP), which a worker clears unread
        started: set[str] = set()
        for key, items in zip(keys, popped, strict=True):
            if key in started:
                continue
            for item in items or ():
                raw = json.loads(text(item))
                with self.lock:
                    if key == POD_QUEUE:
                        kind = f"pod {raw.get('op')}"
                        effects += self.standin.on_pod(raw, time.time())
                        if raw.get("op") == "create":
                            started.add(f"{raw['prefix']}control:{raw['node']}")
                    else:
                        prefix, _, node = key.rpartition("control:")
                        kind = str(raw["message"].get("type"))
                        effects += self.standin.on_control(prefix, node, str(raw["executor"]), raw["message"])
                self.handled[kind] = self.handled.get(kind, 0) + 1
        if effects:
            self.carry_out(effects)

    def carry_out(self, effects: Iterable[Effect]) -> None:
        """The effects in one pipeline, keys as `store.registry.Registry` and `store.checkpoint_store.CheckpointStore`
        write them (a day's TTL on what is versioned or belongs to a migration)."""
        day = 24 * 3600
        pipe = self.client.pipeline(transaction=False)
        for effect in effects:
            p = effect.prefix
            if effect.kind == "clear":
                pipe.delete(f"{p}control:{effect.node}")
            elif effect.kind == "ack":
                key = f"{p}mig:{effect.mid}:acks:{effect.phase}"
                for executor in effect.executors:
                    pipe.hset(key, executor, json.dumps({"state_bytes": 0}))
                pipe.expire(key, day)
            elif effect.kind == "position":
                key = f"{p}mig:{effect.mid}:position"
                for executor in effect.executors:
                    pipe.hset(key, executor, self._pack({"0": int(time.time())}))
                pipe.expire(key, day)
            elif effect.kind in ("staged", "ready"):
                if effect.endpoints:
                    pipe.hset(f"{p}endpoints:{effect.version}", mapping=dict(effect.endpoints))  # type: ignore[arg-type]
                pipe.expire(f"{p}endpoints:{effect.version}", day)
                info = {"pid": os.getpid(), "host": "127.0.0.1", "version": effect.version, "startedAt": time.time()}
                pipe.hset(f"{p}workers", effect.node, json.dumps(info))
                marks = f"{p}{effect.kind}:{effect.version}"
                pipe.sadd(marks, effect.node)
                pipe.expire(marks, day)
        pipe.execute()

    def run_metrics(self) -> None:
        rng = random.Random(7)
        next_at = time.time() + self.interval_s
        while not self.stop.wait(max(0.0, next_at - time.time())):
            next_at += self.interval_s
            with self.lock:
                batches = self.standin.samples(time.time(), self.rate, rng)
            pipe = self.metrics_client.pipeline(transaction=False)
            for prefix, samples in batches.items():
                for sample in samples:
                    fields = {k: str(v) for k, v in sample.items()}
                    pipe.xadd(f"{prefix}metrics", fields, maxlen=2000, approximate=True)  # type: ignore[arg-type]
            pipe.execute()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", required=True, help="the Redis URL (the operator's)")
    parser.add_argument("--sources", default="spout", help="comma-separated source vertex names")
    parser.add_argument("--rate", type=float, default=100.0, help="events/s each executor reports")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between metric samples")
    args = parser.parse_args(argv)
    runner = Runner(args.redis, [s for s in args.sources.split(",") if s], args.rate, args.interval)
    signal.signal(signal.SIGTERM, lambda *_: runner.stop.set())
    metrics = threading.Thread(target=runner.run_metrics, name="metrics", daemon=True)
    metrics.start()
    with contextlib.suppress(KeyboardInterrupt):
        runner.run_control()
    runner.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
