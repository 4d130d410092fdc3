"""The worker process: one per node. It runs the executors the schedule places on its node.

Start-up, each step retried with backoff and a log line saying what it waits for:
1. connect to Redis; 2. read the current schedule; 3. load the operators (a missing `module:Class` stops the
worker at once with a one-line reason); 4. bind an inbox per executor on `--bind HOST[:PORT]` and register the
endpoints (at `--advertise HOST` when it listens on every interface);
5. wait for the endpoints of every downstream executor and connect; 6. start the executors and
mark the node ready; 7. once every node of the schedule is ready, start the sources.
Then, every interval, it publishes one `MetricSample` per executor to `<prefix>metrics` and serves the same
counters as Prometheus metrics. SIGINT stops it cleanly, as does SIGTERM without a drain grace period.

Its other concerns are in modules of their own, mixed into `Worker`: the controller's messages and the
schedule switch (`worker_control`), metrics and the data plane's counts (`worker_metrics`), graceful
drains on SIGTERM (`worker_drains`), the failure path (`worker_failures`). The data plane is authenticated
and encrypted with the topology's CURVE keys (`WorkerOptions.data_plane`, from the environment:
`elastream.worker_inputs.keys`) unless `ELASTREAM_DATA_PLANE_AUTH=off`.

Redis outages: once started, the worker never dies of an unreachable Redis (refused, reset, timed out,
LOADING after a restart). Every thread that needs Redis (the control dispatcher, readiness marks, executors'
acks, checkpoint saves and INIT's loads, redis-stream sinks and sources) waits it out with `retry_redis`:
a write or an ack is retried, never skipped; data flows on between executors meanwhile where it needs no
Redis. The outage is logged once when it starts and once when it ends. A metric sample that cannot be
published is skipped (the counters are cumulative: the next one carries it). Every Redis call has a socket
timeout, so a stop request is honoured within seconds, Redis or not.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis
import zmq
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry

from elastream.core.migration_protocol import ControlType
from elastream.core.migration_scope import migration_parts
from elastream.core.ports import Clock
from elastream.core.schedule import Schedule, key_group_ranges
from elastream.core.topology import Topology, split_executor_id
from elastream.log_format import configure_logging as configure_log_format
from elastream.runtime.executor import ExecutorThread
from elastream.runtime.health import serve_health
from elastream.runtime.operators.api import Context
from elastream.runtime.operators.loading import make_operator
from elastream.runtime.routing import OpenChannel, Router, build_outputs
from elastream.runtime.source_thread import SourceThread
from elastream.runtime.transport import INITIAL_WINDOW, Channel, Inbox
from elastream.runtime.worker_control import ControlMessages
from elastream.runtime.worker_drains import Drains, watched_parent
from elastream.runtime.worker_failures import FailurePath
from elastream.runtime.worker_metrics import MetricsReporting, WorkerCollector
from elastream.runtime.worker_state import Generation
from elastream.runtime.worker_state import WorkerOptions as WorkerOptions  # what `elastream worker` builds
from elastream.store.checkpoint_store import CheckpointStore
from elastream.store.control import control_key
from elastream.store.metric_stream import MetricStream, metric_stream_maxlen
from elastream.store.registry import RedisUnavailable, Registry, client_for, connect
from elastream.store.retry import REDIS, AnyOf, RedisAttempt, RetryCancelled, backoff, retry_redis
from elastream.worker_inputs.rate_files import resolve_rate_file
from elastream.worker_inputs.user_code import OperatorLoadError

log = logging.getLogger("elastream.worker")

EXIT_USER_ERROR = 2
#: socket timeouts of the worker's Redis clients: a call on a Redis that hangs fails within this, so a
#: stop request is honoured within seconds whatever Redis does
REDIS_CONNECT_TIMEOUT_S = 2.0
REDIS_SOCKET_TIMEOUT_S = 5.0
#: `--bind` hosts that listen on every interface (peers then need `--advertise`)
ALL_INTERFACES = ("0.0.0.0", "::")


class Worker(ControlMessages, MetricsReporting, Drains, FailurePath):
    """One node's worker: start-up, its generations of executors, the main loop and its failure path (the
    other concerns: see the module)."""

    # ---------------------------------------------------------------------------------------------- start-up

    def _retrying(self, what: str) -> Any:
        last = [0.0]

        def on_retry(reason: str, delay: float) -> None:
            if self.clock.monotonic() - last[0] >= 2.0:
                last[0] = self.clock.monotonic()
                log.warning("%s: %s; retrying in %.1f s", what, reason, delay)

        return on_retry

    def connect(self) -> None:
        self.client = connect(
            self.options.redis_url,
            self.options.redis_wait_s,
            self._retrying("connecting"),
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        )
        self.registry = Registry(self.client, self.topology.redis_prefix)
        self.metrics = MetricStream(self.client, self.topology.redis_prefix)
        self.store = CheckpointStore(self.client, self.topology.redis_prefix)

    def wait_for(
        self,
        what: str | Callable[[], str],
        probe: Callable[[], Any],
        poll_s: float = 0.05,
        max_poll_s: float = 1.0,
        stop: threading.Event | None = None,
    ) -> Any:
        """Call `probe()` until it returns something truthy, logging every 5 s what is awaited. The pause
        between probes starts at `poll_s` and grows by half each time up to `max_poll_s`, so a long wait
        (a peer that never comes) does not hammer Redis while a short one stays quick."""
        last_log = self.clock.monotonic()
        stop = stop or self.stop
        delays = backoff(poll_s, 1.5, max_poll_s)
        while not stop.is_set() and not self.stop.is_set():
            result = None
            with RedisAttempt(lambda: f"node {self.node}: waiting for {_described(what)}", REDIS):
                result = probe()
            if result:
                return result
            if self.clock.monotonic() - last_log >= 5.0:
                last_log = self.clock.monotonic()
                log.warning("waiting for %s%s", _described(what), " (Redis is away)" if REDIS.active else "")
            self.clock.wait(stop, next(delays))
        return None

    def redis_call(self, what: str, call: Callable[[], Any], stop: threading.Event | None = None) -> Any:
        """`call()` until Redis answers (an outage is waited out, logged once); `RetryCancelled` once `stop`
        (default: the worker's) or the worker's stop is set."""
        return retry_redis(call, f"node {self.node}: cannot {what}", _either(stop, self.stop))

    def read_schedule(self) -> tuple[int, Schedule] | None:
        """The schedule this process starts with: the staged version it was started for, else the current."""
        version = self.options.schedule_version
        found: tuple[int, Schedule] | None
        if version:
            found = self.wait_for(
                f"staged schedule version {version} in Redis", lambda: self.registry.schedule_version(version)
            )
        else:
            found = self.wait_for("the schedule in Redis (the backend writes it)", self.registry.schedule)
        return found

    def stage(self, version: int, schedule: Schedule, keep: Generation | None = None) -> Generation:
        """Make this node's operators of `schedule` and bind their inboxes; register the endpoints under
        `version`. Nothing runs yet: a migration stages the new schedule before it pauses anything. With
        `keep` (a partial migration's: the running generation) the executors it runs that stay as they are
        (`core.migration_scope`) are not made again: their inboxes are registered under `version` too."""
        if self.node not in schedule.nodes:
            raise OperatorLoadError(f"node {self.node} is not in schedule version {version}; nothing to run")
        parallelism = schedule.parallelism()
        kept_executors: set[str] = set()
        if keep is not None:
            parts = migration_parts(self.topology, keep.schedule, schedule, "moving")
            kept_executors = {t.executor for t in keep.threads} & parts.kept
        kept = {e: box for e, box in (keep.inboxes if keep is not None else {}).items() if e in kept_executors}
        mine = [e for e in schedule.executors_on(self.node) if e not in kept_executors]
        stops = {executor: threading.Event() for executor in mine}
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
                node_cpu=self.cpu,
                stop=stops[executor],
            )
            operators[executor] = (make_operator(vertex, self.client_factory, self.topology.redis_prefix), context)
        inboxes: dict[str, Inbox] = {}
        receivers = [e for e in mine if self.topology.vertices[split_executor_id(e)[0]].kind != "source"]
        ports = self._ports_for(version, len(receivers), {box.endpoint.rpartition(":")[2] for box in kept.values()})
        try:
            for executor, port in zip(receivers, ports, strict=True):
                inboxes[executor] = Inbox(
                    self.zmq, self.options.host, port, self.options.address, self.options.data_plane, self.data_plane
                )
        except zmq.ZMQError:
            for inbox in inboxes.values():
                inbox.close()
            raise
        endpoints = {e: box.endpoint for e, box in (inboxes | kept).items()}
        try:
            self.redis_call("register its endpoints", lambda: self.registry.register_endpoints(version, endpoints))
        except BaseException:
            for inbox in inboxes.values():
                inbox.close()
            raise
        return Generation(version, schedule, operators, inboxes, stops)

    def activate(self, generation: Generation) -> bool:
        """Connect `generation`'s outputs to the registered endpoints of its downstream executors, build its
        threads and start them; False when stopped while waiting for endpoints."""
        schedule, version = generation.schedule, generation.version
        parallelism = schedule.parallelism()
        mine = list(generation.operators)
        senders = mine + [t.executor for t in generation.threads]  # the kept threads of a partial switch too
        needed = {
            f"{child}#{i}"
            for executor in senders
            for child in self.topology.children(split_executor_id(executor)[0])
            for i in range(parallelism[child])
        }
        found: dict[str, dict[str, str]] = {"endpoints": {}}

        def all_endpoints() -> bool:  # wait_for waits out a Redis outage
            found["endpoints"] = self.registry.endpoints(version)
            return needed <= set(found["endpoints"])

        def missing() -> str:
            absent = sorted(needed - set(found["endpoints"]))
            nodes = sorted({schedule.node_of(e) for e in absent})
            return f"endpoints of {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''} (on {', '.join(nodes)})"

        if not self.wait_for(missing, all_endpoints, poll_s=0.005, stop=generation.stop):
            return False
        endpoints = found["endpoints"]

        def open_channel(sender: str, receiver: str, endpoint: str) -> Channel:
            window = generation.windows.get((sender, split_executor_id(receiver)[0]), INITIAL_WINDOW)
            return Channel(self.zmq, sender, receiver, endpoint, self.options.data_plane, window)

        kept = list(generation.threads)
        for running in kept:  # a partial switch: the kept threads take the new schedule's outputs and upstream
            running.control.put(self._reroute(running, parallelism, endpoints, open_channel))
        for executor in mine:
            vertex_name, _ = split_executor_id(executor)
            operator, context = generation.operators[executor]
            stop = generation.stops[executor]
            outputs = build_outputs(self.topology, executor, parallelism, endpoints, open_channel)
            router = Router(outputs, stop)
            migration = self._migration_for(executor, parallelism, generation.awaiting, stop)
            thread: ExecutorThread | SourceThread
            if self.topology.vertices[vertex_name].kind == "source":
                thread = SourceThread(executor, operator, context, router, stop, migration, self.executor_failed)
                thread.paused.set()  # until every node is ready (and, during a migration, until RESUME)
            else:
                is_sink = self.topology.vertices[vertex_name].kind == "sink"
                inbox = generation.inboxes[executor]
                thread = ExecutorThread(
                    executor,
                    operator,
                    context,
                    inbox,
                    router,
                    stop,
                    is_sink,
                    migration,
                    self.executor_failed,
                )
            generation.threads.append(thread)
        # about an hour of samples for the executors that actually run, at the actual interval
        self.metrics.maxlen = metric_stream_maxlen(len(schedule), self.options.interval_s)
        for thread in generation.threads:
            if thread not in kept:
                thread.start()
        self.current = generation
        info = {
            "pid": os.getpid(),
            "host": self.options.address,
            "metricsPort": self.options.metrics_port,
            "version": version,
            "startedAt": self.clock.now(),
        }
        self.redis_call("register itself", lambda: self.registry.register_worker(self.node, info), generation.stop)
        if self.failed is not None:  # an executor died already: never say ready
            return False
        self.redis_call("mark itself ready", lambda: self.registry.mark_ready(version, self.node), generation.stop)
        log.info(
            "node %s ready: %d executors (schedule version %d%s)",
            self.node,
            len(generation.threads),
            version,
            f", waiting for INIT of migration {generation.awaiting}" if generation.awaiting else "",
        )
        return True

    def _reroute(
        self,
        thread: ExecutorThread | SourceThread,
        parallelism: Mapping[str, int],
        endpoints: Mapping[str, str],
        open_channel: OpenChannel,
    ) -> dict[str, Any]:
        """The REROUTE a kept thread of a partial switch gets: its outputs under the new schedule (None when
        its receivers are the same; a channel to a receiver that stays is the same object, its credit and
        order intact) and its upstream executors."""
        existing = {(c.receiver, c.endpoint): c for c in thread.router.channels()}

        def reuse(sender: str, receiver: str, endpoint: str) -> Channel:
            return existing.get((receiver, endpoint)) or open_channel(sender, receiver, endpoint)

        vertex = split_executor_id(thread.executor)[0]
        wanted = {
            (f"{child}#{i}", endpoints[f"{child}#{i}"])
            for child in self.topology.children(vertex)
            for i in range(parallelism[child])
        }
        outputs = None
        if wanted != set(existing):
            outputs = build_outputs(self.topology, thread.executor, parallelism, endpoints, reuse)
        upstream = {f"{p}#{i}" for p in self.topology.parents(vertex) for i in range(parallelism[p])}
        return {"type": ControlType.REROUTE, "outputs": outputs, "upstream": upstream}

    def retire(self, generation: Generation, executors: Iterable[str] | None = None) -> None:
        """Stop a generation's threads (or only those of `executors`: a partial switch) and close their
        sockets. In a migration they are checkpointed (state and captured events committed) and idle; a
        source's final position is published for `restart`'s count."""
        if executors is None:
            generation.halt()
            threads = list(generation.threads)
        else:
            leaving = set(executors)
            threads = [t for t in generation.threads if t.executor in leaving]
            for executor in leaving:
                generation.stops[executor].set()
        _join(threads, 5.0, self.clock)
        positions = self.source_positions(threads)
        with contextlib.suppress(RetryCancelled):  # only a stopping worker gives up on them
            self.redis_call("publish source positions", lambda: self.store.publish_positions(positions))
        for thread in threads:
            for channel in thread.router.channels():
                channel.close(0)
            inbox = generation.inboxes.get(thread.executor)
            if inbox is not None:
                inbox.close()

    def _ports_for(self, version: int, count: int, taken: set[str]) -> list[int]:
        """Ports for `count` new inboxes. Inboxes of `--bind HOST:PORT` sit at PORT+1+slot for odd schedule
        versions and one block of `slotsPerNode` higher for even ones: a node restarted under the same
        version binds the same ports (its peers reconnect to it), and a staged version never collides with
        the running one (the backend gives consecutive versions different parities). The inboxes a partial
        migration keeps (`taken`, as text) stay where they are; new ones take the free ports of both blocks,
        their version's first. 0 (the OS picks) without a port."""
        if not self.options.port:
            return [0] * count
        slots = self.topology.slots_per_node
        blocks = [version % 2, 1 - version % 2]
        ports = [self.options.port + 1 + block * slots + slot for block in blocks for slot in range(slots)]
        return [p for p in ports if str(p) not in taken][:count]

    def client_factory(self) -> redis.Redis:
        """A Redis client for a built-in source or sink (timeouts: a hung Redis cannot hold an executor)."""
        return client_for(
            self.options.redis_url,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        )

    # -------------------------------------------------------------------------------------------------- run

    def run(self) -> int:
        """Start, serve until stopped, stop; the exit code: 0, `EXIT_USER_ERROR` for a bad manifest or no
        Redis at start-up, `EXIT_INTERNAL_ERROR` when the worker's own code failed."""
        self._install_signals()
        try:
            self.connect()
            found = self.read_schedule()
            if found is not None:
                version, schedule = found
                generation = self.stage(version, schedule)
                # a node started for a staged schedule idles until the migration switches to it
                if self.options.schedule_version:
                    self.staged = generation
                else:
                    generation.awaiting = self.migration_in_progress()
        except (OperatorLoadError, RedisUnavailable) as exc:
            log.error("%s", exc)
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USER_ERROR
        except RetryCancelled:  # stopped while Redis was away
            found = None
        except Exception as exc:
            self.fail("start-up", exc)
            return self.exit_failed()
        if self.stop.is_set() or found is None:
            self.shutdown()
            return 0
        try:
            self.start(generation)
            self.serve()
        except RetryCancelled:  # stopped while Redis was away
            pass
        except Exception as exc:
            self.fail("the main loop", exc)
        if self.failed is not None:
            return self.exit_failed()
        self.shutdown()
        return 0

    def start(self, generation: Generation) -> None:
        if self.options.data_plane is not None:
            log.info("node %s: data plane authenticated and encrypted (CURVE, the topology's keys)", self.node)
        else:
            log.warning(
                "node %s: data plane NOT authenticated (ELASTREAM_DATA_PLANE_AUTH=off): anyone who reaches this "
                "worker's ports can send it events and read its traffic",
                self.node,
            )
        if self.options.health_port:
            serve_health(self.options.host, self.options.health_port, self.is_ready)
        if self.options.metrics_port:
            registry = CollectorRegistry()
            registry.register(WorkerCollector(self))
            start_http_server(self.options.metrics_port, addr=self.options.host, registry=registry)
        leftovers = control_key(self.topology.redis_prefix, self.node)  # a previous worker's messages
        self.redis_call("clear its control list", lambda: self.client.delete(leftovers))
        threading.Thread(target=self.dispatch_control, name="control", daemon=True).start()
        if self.staged is not None:
            staged = self.staged
            self.redis_call("mark itself staged", lambda: self.registry.mark_staged(staged.version, self.node))
            log.info("node %s staged for schedule version %d: idle until the switch", self.node, staged.version)
        elif self.activate(generation):
            self.start_sources_when_all_ready(generation)

    def serve(self) -> None:
        """Publish metrics every interval until stopped (or the process that started this one is gone).

        On the wall clock's grid of intervals (at multiples of the interval since the epoch), the same for
        every worker: the analysis's window ends at a sample's time, and a worker sampling at another phase
        would have its last part of the window not yet counted (a dip read as a falling trend)."""
        interval = self.options.interval_s
        clock = self.clock
        next_publish = next_grid_time(clock.now(), interval)
        parent = watched_parent()
        while not self.stop.is_set():
            delay = next_publish - clock.now()
            if delay > interval:  # the wall clock went back: the grid from here, not a wait as long
                next_publish = next_grid_time(clock.now(), interval)
                continue
            if delay > 0.0:
                clock.wait(self.stop, delay)
                continue
            # a late wake-up (a busy machine, the clock went forward) skips the slots it missed
            next_publish = max(next_publish + interval, next_grid_time(clock.now(), interval))
            self.publish_metrics()
            self.log_data_plane()
            if parent is not None and os.getppid() != parent:
                log.warning("node %s: the process that started it (pid %d) is gone; stopping", self.node, parent)
                self.stop.set()

    def is_ready(self) -> bool:
        """Executors bound and registered: running a schedule, or staged and idle for the one that adds us;
        never once the worker's own code failed."""
        return self.failed is None and (self.current is not None or self.staged is not None)

    def start_sources_when_all_ready(self, generation: Generation) -> None:
        """Start the sources once every node of the schedule is ready (during a migration the controller
        resumes them after INIT instead)."""
        nodes = set(generation.schedule.nodes)
        ready = self.wait_for(
            "every node to be ready",
            lambda: self.registry.ready_nodes(generation.version) >= nodes,
            stop=generation.stop,
        )
        if ready and generation.awaiting is None:
            for thread in generation.threads:
                if isinstance(thread, SourceThread):
                    thread.paused.clear()

    def shutdown(self) -> None:
        self.stop.set()
        with self._switching:
            current, self.current = self.current, None
            if current is not None:
                current.halt()
                _join(current.threads, 5.0, self.clock)
                with contextlib.suppress(Exception):  # best effort on the way out
                    self.metrics.publish(self.samples(current))
                    self.store.publish_positions(self.source_positions(current.threads))
                for thread in current.threads:
                    for channel in thread.router.channels():
                        channel.close(0)
                for inbox in current.inboxes.values():
                    inbox.close()
            self.discard_staged()
        self.log_data_plane(force=True)
        draining = self.draining
        if draining is not None:  # it takes back a request the backend's stop made moot (one Redis call)
            draining.join(timeout=REDIS_SOCKET_TIMEOUT_S)
        if self.authenticator is not None:
            self.authenticator.stop()
        self.zmq.term()
        log.info("node %s stopped", self.node)


def _join(threads: Iterable[threading.Thread], timeout_s: float, clock: Clock) -> None:
    """Join `threads` within `timeout_s` in all (a thread stuck past it is a daemon: it dies with the process)."""
    deadline = clock.monotonic() + timeout_s
    for thread in threads:
        if thread.is_alive():
            thread.join(timeout=max(0.0, deadline - clock.monotonic()))


def _described(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


def _either(first: threading.Event | None, second: threading.Event) -> threading.Event | AnyOf:
    return second if first is None or first is second else AnyOf(first, second)


def next_grid_time(now: float, interval_s: float) -> float:
    """The first multiple of `interval_s` (seconds since the epoch) after `now`."""
    return (math.floor(now / interval_s) + 1) * interval_s


def configure_logging(node: str, log_format: str = "text", topology: Topology | None = None) -> None:
    """The worker's lines on stderr (`elastream.log_format`): text, or JSON objects that all carry `node` and
    its topology's `namespace` and `topology` (a worker serves one topology for its whole life)."""
    fields = (
        {"node": node}
        if topology is None
        else {"namespace": topology.namespace, "topology": topology.name, "node": node}
    )
    configure_log_format(log_format, fields=fields, text_format=f"%(asctime)s %(levelname)s {node}: %(message)s")
