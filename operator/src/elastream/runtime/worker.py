"""The worker process: one per node. It runs the executors the schedule places on its node.

Start-up, each step retried with backoff and a log line saying what it waits for:
1. connect to Redis; 2. read the current schedule; 3. load the operators (a missing `module:Class` stops the
worker at once with a one-line reason); 4. bind an inbox per executor on `--bind HOST[:PORT]` and register the
endpoints; 5. wait for the endpoints of every downstream executor and connect; 6. start the executors and
mark the node ready; 7. once every node of the schedule is ready, start the sources.
Then, every interval, it publishes one `MetricSample` per executor to `<prefix>metrics` and serves the same
counters as Prometheus metrics. SIGTERM or SIGINT stops it cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
import zmq
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from elastream.core.metrics import MetricSample
from elastream.core.migration import ExecutorParticipant
from elastream.core.schedule import Schedule, key_group_ranges
from elastream.core.topology import Topology, split_executor_id
from elastream.runtime.executor import Counters, ExecutorThread, Router, SourceThread, build_outputs
from elastream.runtime.operators import Context, NodeCpu, OperatorLoadError, make_operator, resolve_rate_file
from elastream.runtime.participant import Migration, pack
from elastream.runtime.transport import Channel, Inbox
from elastream.store.checkpoint import CheckpointStore
from elastream.store.control import control_key, pop_control
from elastream.store.metric_stream import MetricStream, metric_stream_maxlen
from elastream.store.registry import RedisUnavailable, Registry, connect

log = logging.getLogger("elastream.worker")

EXIT_USER_ERROR = 2


@dataclass(frozen=True)
class WorkerOptions:
    node: str
    redis_url: str
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int = 0
    interval_s: float = 1.0
    redis_wait_s: float = 300.0
    #: where relative paths in the manifest (a synthetic source's `csv`) are resolved
    manifest_dir: str = "."


class Worker:
    def __init__(self, topology: Topology, options: WorkerOptions) -> None:
        self.topology = topology
        self.options = options
        self.node = options.node
        self.stop = threading.Event()
        self.zmq = zmq.Context(io_threads=1)
        self.threads: list[ExecutorThread | SourceThread] = []
        self.inboxes: dict[str, Inbox] = {}
        self.channels: list[Channel] = []
        self.version = 0
        self.schedule: Schedule | None = None
        self.awaiting: str | None = None

    # ---------------------------------------------------------------------------------------------- start-up

    def _retrying(self, what: str) -> Any:
        last = [0.0]

        def on_retry(reason: str, delay: float) -> None:
            if time.monotonic() - last[0] >= 2.0:
                last[0] = time.monotonic()
                log.warning("%s: %s; retrying in %.1f s", what, reason, delay)

        return on_retry

    def connect(self) -> None:
        self.client = connect(self.options.redis_url, self.options.redis_wait_s, self._retrying("connecting"))
        self.registry = Registry(self.client, self.topology.redis_prefix)
        self.metrics = MetricStream(self.client, self.topology.redis_prefix)
        self.store = CheckpointStore(self.client, self.topology.redis_prefix)

    def wait_for(
        self, what: str | Callable[[], str], probe: Callable[[], Any], poll_s: float = 0.05, max_poll_s: float = 1.0
    ) -> Any:
        """Call `probe()` until it returns something truthy, logging every 5 s what is awaited. The pause
        between probes starts at `poll_s` and grows by half each time up to `max_poll_s`, so a long wait
        (a peer that never comes) does not hammer Redis while a short one stays quick."""
        last_log = time.monotonic()
        while not self.stop.is_set():
            try:
                result = probe()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                result, detail = None, f"Redis unreachable ({exc})"
            else:
                detail = ""
            if result:
                return result
            if time.monotonic() - last_log >= 5.0:
                last_log = time.monotonic()
                log.warning("waiting for %s%s", what() if callable(what) else what, f": {detail}" if detail else "")
            self.stop.wait(poll_s)
            poll_s = min(max_poll_s, poll_s * 1.5)
        return None

    def build(self) -> None:
        found = self.wait_for("the schedule in Redis (the backend writes it)", self.registry.schedule)
        if found is None:
            return
        self.version, self.schedule = found
        schedule = self.schedule
        # about an hour of samples for the executors that actually run, at the actual interval
        self.metrics.maxlen = metric_stream_maxlen(len(schedule), self.options.interval_s)
        if self.node not in schedule.nodes:
            raise OperatorLoadError(f"node {self.node} is not in schedule version {self.version}; nothing to run")
        parallelism = schedule.parallelism()
        cpu = NodeCpu(self.topology.node_cpu)
        mine = schedule.executors_on(self.node)
        operators: dict[str, tuple[Any, Context]] = {}
        for executor in mine:
            vertex_name, index = split_executor_id(executor)
            vertex = self.topology.vertices[vertex_name]
            k = parallelism[vertex_name]
            context = Context(
                vertex=vertex_name,
                index=index,
                parallelism=k,
                max_parallelism=vertex.max_parallelism,
                config=resolve_rate_file(vertex, self.options.manifest_dir),
                key_groups=key_group_ranges(vertex.max_parallelism, k)[index],
                node_cpu=cpu,
            )
            operators[executor] = (make_operator(vertex, self._client_factory, self.topology.redis_prefix), context)
        for executor in mine:
            if self.topology.vertices[split_executor_id(executor)[0]].kind != "source":
                self.inboxes[executor] = Inbox(self.zmq, self.options.host, self._port_for(executor))
        self.awaiting = self.migration_in_progress()
        self.registry.register_endpoints(self.version, {e: box.endpoint for e, box in self.inboxes.items()})
        self.registry.register_worker(
            self.node,
            {
                "pid": os.getpid(),
                "host": self.options.host,
                "metricsPort": self.options.metrics_port,
                "version": self.version,
                "startedAt": time.time(),
            },
        )
        needed = {
            f"{child}#{i}"
            for executor in mine
            for child in self.topology.children(split_executor_id(executor)[0])
            for i in range(parallelism[child])
        }
        state: dict[str, dict[str, str]] = {"endpoints": {}}

        def all_endpoints() -> bool:
            state["endpoints"] = self.registry.endpoints(self.version)
            return needed <= set(state["endpoints"])

        def missing() -> str:
            absent = sorted(needed - set(state["endpoints"]))
            nodes = sorted({schedule.node_of(e) for e in absent})
            return f"endpoints of {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''} (on {', '.join(nodes)})"

        if not self.wait_for(missing, all_endpoints):
            return
        endpoints = state["endpoints"]
        for executor in mine:
            vertex_name, _ = split_executor_id(executor)
            operator, context = operators[executor]
            outputs = build_outputs(self.topology, vertex_name, executor, parallelism, endpoints, self._open_channel)
            router = Router(outputs, self.stop)
            migration = self._migration_for(executor, parallelism)
            thread: ExecutorThread | SourceThread
            if self.topology.vertices[vertex_name].kind == "source":
                thread = SourceThread(executor, operator, context, router, self.stop, migration)
                thread.paused.set()  # until every node is ready (and, during a migration, until RESUME)
            else:
                is_sink = self.topology.vertices[vertex_name].kind == "sink"
                inbox = self.inboxes[executor]
                thread = ExecutorThread(executor, operator, context, inbox, router, self.stop, is_sink, migration)
            self.threads.append(thread)

    def migration_in_progress(self) -> str | None:
        """The migration whose INIT this worker's executors must wait for: one that has passed COMMIT (its
        state is in Redis and this worker runs the schedule it moves to)."""
        mid = self.store.current()
        if mid is None:
            return None
        phase = self.store.record(mid).get("phase")
        if phase in ("rebalancing", "initializing"):
            log.info("migration %s in progress: executors wait for INIT", mid)
            return mid
        return None

    def _migration_for(self, executor: str, parallelism: Mapping[str, int]) -> Migration:
        vertex = split_executor_id(executor)[0]
        parents = self.topology.parents(vertex)
        upstream = frozenset(f"{p}#{i}" for p in parents for i in range(parallelism[p]))
        inputs = {p: (self.topology.stream(p, vertex).grouping, self.topology.stream(p, vertex).key) for p in parents}
        return Migration(
            executor=executor,
            store=self.store,
            participant=ExecutorParticipant(executor, upstream),
            inputs=inputs,
            max_parallelism=self.topology.vertices[vertex].max_parallelism,
            awaiting=self.awaiting,
        )

    def _port_for(self, executor: str) -> int:
        if not self.options.port or self.schedule is None:
            return 0
        return self.options.port + 1 + list(self.schedule.executors_on(self.node)).index(executor)

    def _open_channel(self, sender: str, receiver: str, endpoint: str) -> Channel:
        channel = Channel(self.zmq, sender, receiver, endpoint)
        self.channels.append(channel)
        return channel

    def _client_factory(self) -> redis.Redis:
        return redis.Redis.from_url(self.options.redis_url)

    # -------------------------------------------------------------------------------------------------- run

    def run(self) -> int:
        self._install_signals()
        try:
            self.connect()
            self.build()
        except (OperatorLoadError, RedisUnavailable) as exc:
            log.error("%s", exc)
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USER_ERROR
        if self.stop.is_set() or self.schedule is None:
            self.shutdown()
            return 0
        if self.options.metrics_port:
            registry = CollectorRegistry()
            registry.register(WorkerCollector(self))
            start_http_server(self.options.metrics_port, addr=self.options.host, registry=registry)
        for thread in self.threads:
            thread.start()
        self.client.delete(control_key(self.topology.redis_prefix, self.node))  # a previous worker's leftovers
        threading.Thread(target=self.dispatch_control, name="control", daemon=True).start()
        self.registry.mark_ready(self.version, self.node)
        log.info("node %s ready: %d executors (schedule version %d)", self.node, len(self.threads), self.version)
        schedule = self.schedule
        ready = self.wait_for(
            "every node to be ready", lambda: self.registry.ready_nodes(self.version) >= set(schedule.nodes)
        )
        if ready and self.awaiting is None:  # during a migration the controller resumes the sources
            for thread in self.threads:
                if isinstance(thread, SourceThread):
                    thread.paused.clear()
        next_publish = time.monotonic() + self.options.interval_s
        parent = _watched_parent()
        while not self.stop.wait(max(0.0, next_publish - time.monotonic())):
            next_publish += self.options.interval_s
            self.publish_metrics()
            if parent is not None and os.getppid() != parent:
                log.warning("node %s: the process that started it (pid %d) is gone; stopping", self.node, parent)
                self.stop.set()
        failed = [t for t in self.threads if t.failure is not None]
        self.shutdown()
        return 1 if failed else 0

    def dispatch_control(self) -> None:
        """Hand the controller's messages for this node to the executors they name (ahead of their input)."""
        by_executor = {thread.executor: thread for thread in self.threads}
        client = redis.Redis.from_url(self.options.redis_url, socket_timeout=10.0)
        while not self.stop.is_set():
            try:
                item = pop_control(client, self.topology.redis_prefix, self.node, timeout_s=0.5)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("control channel: Redis unreachable (%s); retrying", exc)
                self.stop.wait(1.0)
                continue
            if item is None:
                continue
            executor, message = item
            thread = by_executor.get(executor)
            if thread is None:
                log.warning("control message %s for %s, which is not on this node; dropped", message, executor)
                continue
            thread.control.put(message)
        client.close()

    def publish_metrics(self) -> None:
        try:
            self.metrics.publish(self.samples())
            self.store.publish_positions(self.source_positions())
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("metrics not published: Redis unreachable (%s); counters are cumulative, nothing is lost", exc)

    def source_positions(self) -> dict[str, bytes]:
        """The read position of each running source (`restart` counts what the sources will replay from
        them); a source still waiting for INIT has none yet."""
        positions: dict[str, bytes] = {}
        for thread in self.threads:
            position = getattr(thread.operator, "position", None)
            if isinstance(thread, SourceThread) and thread.migration.awaiting is None and callable(position):
                positions[thread.executor] = pack(position())
        return positions

    def samples(self) -> Iterable[MetricSample]:
        now = time.time()
        for thread in self.threads:
            c: Counters = thread.counters
            yield MetricSample(
                ts=now,
                node=self.node,
                vertex=split_executor_id(thread.executor)[0],
                executor=thread.executor,
                started_at=c.started_at,
                received=c.received,
                processed=c.processed,
                emitted=c.emitted,
                busy_s=round(c.busy_s, 6),
                queue_len=max(c.queue_len, 0),
                latency_ms=round(c.take_latency_ms(), 4),
                errors=c.errors,
            )

    def shutdown(self) -> None:
        self.stop.set()
        for thread in self.threads:
            if thread.is_alive():
                thread.join(timeout=5.0)
        with contextlib.suppress(Exception):  # best effort on the way out
            self.publish_metrics()
        for channel in self.channels:
            channel.close(0)
        for inbox in self.inboxes.values():
            inbox.close()
        self.zmq.term()
        log.info("node %s stopped", self.node)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("node %s: %s, stopping", self.node, signal.Signals(signum).name)
            self.stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)


class WorkerCollector:
    """Serves the executors' counters as Prometheus metrics (read at scrape time: no per-event cost)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterable[Any]:
        labels = ["node", "vertex", "executor"]
        families = {
            "received": CounterMetricFamily("elastream_executor_received", "events received", labels=labels),
            "processed": CounterMetricFamily("elastream_executor_processed", "events processed", labels=labels),
            "emitted": CounterMetricFamily("elastream_executor_emitted", "events emitted", labels=labels),
            "errors": CounterMetricFamily("elastream_executor_errors", "operator exceptions", labels=labels),
            "busy_s": CounterMetricFamily("elastream_executor_busy_seconds", "seconds spent processing", labels=labels),
        }
        queue = GaugeMetricFamily("elastream_executor_queue_length", "events waiting in the inbox", labels=labels)
        latency = GaugeMetricFamily(
            "elastream_executor_latency_ms",
            "mean latency over the last metric interval in ms (end-to-end at sinks, per event elsewhere)",
            labels=labels,
        )
        for thread in self.worker.threads:
            label_values = [self.worker.node, split_executor_id(thread.executor)[0], thread.executor]
            for name, family in families.items():
                family.add_metric(label_values, float(getattr(thread.counters, name)))
            queue.add_metric(label_values, float(max(thread.counters.queue_len, 0)))
            latency.add_metric(label_values, float(thread.counters.latency_ms))
        yield from families.values()
        yield queue
        yield latency


def _watched_parent() -> int | None:
    """The pid of the local backend that started this worker (it must not outlive it), or None."""
    raw = os.environ.get("ELASTREAM_PARENT_PID", "")
    return int(raw) if raw.isdigit() else None


def configure_logging(node: str) -> None:
    logging.basicConfig(
        level=os.environ.get("ELASTREAM_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s %(levelname)s {node}: %(message)s",
        stream=sys.stderr,
    )
