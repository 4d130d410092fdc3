"""The worker process: one per node. It runs the executors the schedule places on its node.

Start-up, each step retried with backoff and a log line saying what it waits for:
1. connect to Redis; 2. read the current schedule; 3. load the operators (a missing `module:Class` stops the
worker at once with a one-line reason); 4. bind an inbox per executor on `--bind HOST[:PORT]` and register the
endpoints (at `--advertise HOST` when it listens on every interface);
5. wait for the endpoints of every downstream executor and connect; 6. start the executors and
mark the node ready; 7. once every node of the schedule is ready, start the sources.
Then, every interval, it publishes one `MetricSample` per executor to `<prefix>metrics` and serves the same
counters as Prometheus metrics. SIGINT stops it cleanly, as does SIGTERM without a drain grace period.

Graceful drains (`--drain-grace`, `ELASTREAM_DRAIN_GRACE_S`; on Kubernetes the pod's
terminationGracePeriodSeconds): the first SIGTERM of a worker that runs executors does not stop it. It
writes a drain request for its node (`store.drains`) and serves on until the controller's migration moves
its executors off (the switch after COMMIT takes its node out of the schedule: it stops, exit code 0), for
at most the grace period less `core.drain.DRAIN_MARGIN_S`; then it stops anyway (a lost worker: the
controller rolls back to the last checkpoint). Redis away, no executors (a node staged for a migration, one
still starting), the parent of a local worker gone, a second SIGTERM or a SIGINT: it stops at once. A STOP
message on its control list (its backend is about to stop it: a suspend, a scale-in, a shutdown) stops it
at once too, so the SIGTERM that follows asks for nothing.

The data plane is authenticated and encrypted with the topology's CURVE keys (`WorkerOptions.data_plane`,
from the environment: `elastream.runtime.security`) unless `ELASTREAM_DATA_PLANE_AUTH=off`. What the
inboxes drop (malformed frames, frames of unchecked connections, control messages no executor sends
in-band) and the handshakes they refuse are counted (`DataPlaneStats`), served as Prometheus counters and
logged, at most every `DATA_PLANE_LOG_S`, when they grew.

Redis outages: once started, the worker never dies of an unreachable Redis (refused, reset, timed out,
LOADING after a restart). Every thread that needs Redis (the control dispatcher, readiness marks, executors'
acks, checkpoint saves and INIT's loads, redis-stream sinks and sources) waits it out with `retry_redis`:
a write or an ack is retried, never skipped; data flows on between executors meanwhile where it needs no
Redis. The outage is logged once when it starts and once when it ends. A metric sample that cannot be
published is skipped (the counters are cumulative: the next one carries it). Every Redis call has a socket
timeout, so a stop request is honoured within seconds, Redis or not.

Faults of the worker's own code: an executor or source thread, the control dispatcher or the main loop that
dies of an exception that is not a user operator's (those are counted in `errors`) logs it with the
traceback, takes the node's readiness back (the /ready probe fails, its `ready:<version>` mark goes) and
exits with `EXIT_INTERNAL_ERROR` (70) within seconds, so the backend sees a failed worker and recovery
starts; before, the process stayed up and ready with its executors stopped.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
import zmq
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from elastream.core.drain import drain_deadline
from elastream.core.metrics import MetricSample
from elastream.core.migration_protocol import ControlType, ExecutorParticipant
from elastream.core.schedule import Schedule, key_group_ranges
from elastream.core.topology import Topology, split_executor_id
from elastream.runtime.executor import Counters, ExecutorThread, Router, SourceThread, build_outputs
from elastream.runtime.health import serve_health
from elastream.runtime.operators import Context, NodeCpu, OperatorLoadError, make_operator, resolve_rate_file
from elastream.runtime.participant import Migration, pack
from elastream.runtime.security import DataPlaneKeys, PeerAuthenticator
from elastream.runtime.transport import Channel, DataPlaneStats, Inbox
from elastream.store.checkpoint import CheckpointStore
from elastream.store.control import control_key, pop_control
from elastream.store.drains import cancel_drain, request_drain
from elastream.store.metric_stream import MetricStream, metric_stream_maxlen
from elastream.store.registry import RedisUnavailable, Registry, client_for, connect
from elastream.store.retry import REDIS, AnyOf, RetryCancelled, backoff, is_redis_outage, retry_redis

log = logging.getLogger("elastream.worker")

EXIT_USER_ERROR = 2
#: the exit code of a worker whose own code failed (an executor's loop, the control dispatcher, the main
#: loop died of an exception): sysexits' EX_SOFTWARE, "internal software error"
EXIT_INTERNAL_ERROR = 70
#: how long a failed worker's orderly shutdown may take before the process exits anyway
FAILURE_EXIT_S = 10.0
#: socket timeouts of the worker's Redis clients: a call on a Redis that hangs fails within this, so a
#: stop request is honoured within seconds whatever Redis does
REDIS_CONNECT_TIMEOUT_S = 2.0
REDIS_SOCKET_TIMEOUT_S = 5.0
#: `--bind` hosts that listen on every interface (peers then need `--advertise`)
ALL_INTERFACES = ("0.0.0.0", "::")
#: what the data plane dropped and refused is logged at most this often (when it grew)
DATA_PLANE_LOG_S = 10.0


@dataclass(frozen=True)
class WorkerOptions:
    node: str
    #: never in a repr (a log line, a traceback's locals): it may hold a password
    redis_url: str = field(repr=False)
    #: the address the inboxes, /healthz and metrics listen on (0.0.0.0: every interface)
    host: str = "127.0.0.1"
    #: the address peers reach this worker at (registered with the endpoints); empty: `host`
    advertise: str = ""
    port: int = 0
    metrics_port: int = 0
    interval_s: float = 1.0
    redis_wait_s: float = 300.0
    #: where relative paths in the manifest (a synthetic source's `csv`) are resolved
    manifest_dir: str = "."
    #: start for this staged schedule version (a node a migration adds) instead of the current schedule
    schedule_version: int = 0
    #: serve /healthz and /ready (a pod's probes) on this port of `host` (0: off)
    health_port: int = 0
    #: the topology's CURVE keys: inboxes accept only its peers, everything is encrypted (None: plain TCP)
    data_plane: DataPlaneKeys | None = None
    #: seconds between SIGTERM and being killed (a pod's terminationGracePeriodSeconds): the first SIGTERM asks
    #: for a drain and waits for it within that (0: no drains, SIGTERM stops at once)
    drain_grace_s: float = 0.0

    @property
    def address(self) -> str:
        """The address other workers connect to."""
        return self.advertise or self.host


@dataclass
class Generation:
    """The executors a worker runs under one schedule version: operators made and inboxes bound when it is
    staged (endpoints registered, nothing running), threads built and started when it is activated, all
    stopped together when a newer generation replaces it. `stop` is this generation's own: setting it ends
    its threads and leaves the process (and any staged successor) running."""

    version: int
    schedule: Schedule
    operators: dict[str, tuple[Any, Context]]
    inboxes: dict[str, Inbox]
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[ExecutorThread | SourceThread] = field(default_factory=list)
    channels: list[Channel] = field(default_factory=list)
    #: the migration whose INIT the executors wait for before they process anything (None: run at once)
    awaiting: str | None = None

    def by_executor(self) -> dict[str, ExecutorThread | SourceThread]:
        return {thread.executor: thread for thread in self.threads}


class Worker:
    def __init__(self, topology: Topology, options: WorkerOptions) -> None:
        self.topology = topology
        self.options = options
        self.node = options.node
        self.stop = threading.Event()
        self.zmq = zmq.Context(io_threads=1)
        #: what every inbox of this worker dropped and refused
        self.data_plane = DataPlaneStats()
        self._data_plane_logged: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self._data_plane_log_at = 0.0
        #: the ZAP handler that admits only the topology's peers to the inboxes (before any inbox binds)
        self.authenticator: PeerAuthenticator | None = None
        if options.data_plane is not None:
            self.authenticator = PeerAuthenticator(self.zmq, options.data_plane)
            self.authenticator.start()
        self.cpu = NodeCpu(topology.node_cpu)
        #: the generation running now, and the one staged ahead of a migration (inboxes bound, idle)
        self.current: Generation | None = None
        self.staged: Generation | None = None
        self._switching = threading.Lock()
        #: what failed (an executor, "control", "main loop"), when the worker's own code did: it exits with
        #: EXIT_INTERNAL_ERROR and is not ready
        self.failed: str | None = None
        #: the thread waiting for this node's drain, once the first SIGTERM asked for one
        self.draining: threading.Thread | None = None
        #: a STOP came on the control list: a SIGTERM around it is the backend's, not a drain request
        self.stopped_by_backend = False

    @property
    def threads(self) -> list[ExecutorThread | SourceThread]:
        current = self.current
        return list(current.threads) if current is not None else []

    # ---------------------------------------------------------------------------------------------- start-up

    def _retrying(self, what: str) -> Any:
        last = [0.0]

        def on_retry(reason: str, delay: float) -> None:
            if time.monotonic() - last[0] >= 2.0:
                last[0] = time.monotonic()
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
        last_log = time.monotonic()
        stop = stop or self.stop
        delays = backoff(poll_s, 1.5, max_poll_s)
        while not stop.is_set() and not self.stop.is_set():
            attempt = time.monotonic()
            try:
                result = probe()
            except Exception as exc:
                if not is_redis_outage(exc):
                    raise
                REDIS.failed(f"node {self.node}: waiting for {what() if callable(what) else what}", exc, attempt)
                result = None
            else:
                REDIS.succeeded()
            if result:
                return result
            if time.monotonic() - last_log >= 5.0:
                last_log = time.monotonic()
                log.warning(
                    "waiting for %s%s", what() if callable(what) else what, " (Redis is away)" if REDIS.active else ""
                )
            stop.wait(next(delays))
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

    def stage(self, version: int, schedule: Schedule) -> Generation:
        """Make this node's operators of `schedule` and bind their inboxes; register the endpoints under
        `version`. Nothing runs yet: a migration stages the new schedule before it pauses anything."""
        if self.node not in schedule.nodes:
            raise OperatorLoadError(f"node {self.node} is not in schedule version {version}; nothing to run")
        parallelism = schedule.parallelism()
        mine = schedule.executors_on(self.node)
        stop = threading.Event()  # the generation's: built-in operators waiting for Redis give up when it is set
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
                stop=stop,
            )
            operators[executor] = (make_operator(vertex, self._client_factory, self.topology.redis_prefix), context)
        inboxes: dict[str, Inbox] = {}
        try:
            for slot, executor in enumerate(mine):
                if self.topology.vertices[split_executor_id(executor)[0]].kind != "source":
                    inboxes[executor] = Inbox(
                        self.zmq,
                        self.options.host,
                        self._port_for(version, slot),
                        self.options.address,
                        self.options.data_plane,
                        self.data_plane,
                    )
        except zmq.ZMQError:
            for inbox in inboxes.values():
                inbox.close()
            raise
        endpoints = {e: box.endpoint for e, box in inboxes.items()}
        try:
            self.redis_call("register its endpoints", lambda: self.registry.register_endpoints(version, endpoints))
        except BaseException:
            for inbox in inboxes.values():
                inbox.close()
            raise
        return Generation(version, schedule, operators, inboxes, stop)

    def activate(self, generation: Generation) -> bool:
        """Connect `generation`'s outputs to the registered endpoints of its downstream executors, build its
        threads and start them; False when stopped while waiting for endpoints."""
        schedule, version = generation.schedule, generation.version
        parallelism = schedule.parallelism()
        mine = list(generation.operators)
        needed = {
            f"{child}#{i}"
            for executor in mine
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
            channel = Channel(self.zmq, sender, receiver, endpoint, self.options.data_plane)
            generation.channels.append(channel)
            return channel

        for executor in mine:
            vertex_name, _ = split_executor_id(executor)
            operator, context = generation.operators[executor]
            outputs = build_outputs(self.topology, vertex_name, executor, parallelism, endpoints, open_channel)
            router = Router(outputs, generation.stop)
            migration = self._migration_for(executor, parallelism, generation.awaiting, generation.stop)
            thread: ExecutorThread | SourceThread
            if self.topology.vertices[vertex_name].kind == "source":
                thread = SourceThread(
                    executor, operator, context, router, generation.stop, migration, self.executor_failed
                )
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
                    generation.stop,
                    is_sink,
                    migration,
                    self.executor_failed,
                )
            generation.threads.append(thread)
        # about an hour of samples for the executors that actually run, at the actual interval
        self.metrics.maxlen = metric_stream_maxlen(len(schedule), self.options.interval_s)
        for thread in generation.threads:
            thread.start()
        self.current = generation
        info = {
            "pid": os.getpid(),
            "host": self.options.address,
            "metricsPort": self.options.metrics_port,
            "version": version,
            "startedAt": time.time(),
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

    def retire(self, generation: Generation) -> None:
        """Stop a generation's threads and close its sockets. In a migration they are checkpointed (state and
        captured events committed) and idle; a source's final position is published for `restart`'s count."""
        generation.stop.set()
        _join(generation.threads, 5.0)
        positions = self.source_positions(generation)
        with contextlib.suppress(RetryCancelled):  # only a stopping worker gives up on them
            self.redis_call("publish source positions", lambda: self.store.publish_positions(positions))
        for channel in generation.channels:
            channel.close(0)
        for inbox in generation.inboxes.values():
            inbox.close()

    def migration_in_progress(self) -> str | None:
        """The migration whose INIT this worker's executors must wait for: one that has passed COMMIT (its
        state is in Redis and this worker runs the schedule it moves to)."""
        mid: str | None = self.redis_call("read the migration in progress", self.store.current)
        if mid is None:
            return None
        phase = self.redis_call("read the migration record", lambda: self.store.record(mid)).get("phase")
        if phase in ("rebalancing", "initializing"):
            log.info("migration %s in progress: executors wait for INIT", mid)
            return mid
        return None

    def _migration_for(
        self, executor: str, parallelism: Mapping[str, int], awaiting: str | None, stop: threading.Event
    ) -> Migration:
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
            awaiting=awaiting,
            stop=stop,
        )

    def _port_for(self, version: int, slot: int) -> int:
        """Inboxes of `--bind HOST:PORT` sit at PORT+1+slot for odd schedule versions and one block of
        `slotsPerNode` higher for even ones: a node restarted under the same version binds the same ports
        (its peers reconnect to it), and a staged version never collides with the running one (the
        backend gives consecutive versions different parities)."""
        if not self.options.port:
            return 0
        return self.options.port + 1 + (version % 2) * self.topology.slots_per_node + slot

    def _client_factory(self) -> redis.Redis:
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
        next_publish = next_grid_time(time.time(), interval)
        parent = _watched_parent()
        while not self.stop.is_set():
            delay = next_publish - time.time()
            if delay > interval:  # the wall clock went back: the grid from here, not a wait as long
                next_publish = next_grid_time(time.time(), interval)
                continue
            if delay > 0.0:
                self.stop.wait(delay)
                continue
            # a late wake-up (a busy machine, the clock went forward) skips the slots it missed
            next_publish = max(next_publish + interval, next_grid_time(time.time(), interval))
            self.publish_metrics()
            self.log_data_plane()
            if parent is not None and os.getppid() != parent:
                log.warning("node %s: the process that started it (pid %d) is gone; stopping", self.node, parent)
                self.stop.set()

    def is_ready(self) -> bool:
        """Executors bound and registered: running a schedule, or staged and idle for the one that adds us;
        never once the worker's own code failed."""
        return self.failed is None and (self.current is not None or self.staged is not None)

    # ------------------------------------------------------------------------------------------ failures

    def executor_failed(self, thread: ExecutorThread | SourceThread) -> None:
        """An executor's loop died (it logged the traceback): the worker fails."""
        self.fail(f"executor {thread.executor}", None)

    def fail(self, what: str, exc: BaseException | None) -> None:
        """The worker's own code failed in `what` (logged here with the traceback unless `exc` is None: the
        failing thread logged it): stop, so that `run` takes readiness back and exits with
        `EXIT_INTERNAL_ERROR`. The first failure is the one reported."""
        if exc is not None:
            log.critical("node %s: %s failed: %s: %s", self.node, what, type(exc).__name__, exc, exc_info=exc)
        if self.failed is None:
            self.failed = what
        self.stop.set()

    def exit_failed(self) -> int:
        """Take the node's readiness back, stop what can be stopped within `FAILURE_EXIT_S` (then exit
        regardless) and return `EXIT_INTERNAL_ERROR`."""
        log.error(
            "node %s: %s failed; not ready, exiting with code %d so that recovery starts",
            self.node,
            self.failed,
            EXIT_INTERNAL_ERROR,
        )
        watchdog = threading.Timer(FAILURE_EXIT_S, _exit_now, args=(self.node,))
        watchdog.daemon = True
        watchdog.start()
        self.unmark_ready()
        self.shutdown()
        watchdog.cancel()
        return EXIT_INTERNAL_ERROR

    def unmark_ready(self) -> None:
        """Remove this node's ready and staged marks (one attempt each: a failed worker does not wait for
        Redis; its exit tells the backend anyway)."""
        registry: Registry | None = getattr(self, "registry", None)
        if registry is None:  # failed before it connected
            return
        versions = {g.version for g in (self.current, self.staged) if g is not None}
        for version in versions:
            try:
                registry.unmark(version, self.node)
            except Exception as exc:
                log.warning("node %s: could not take back its ready mark of version %d: %s", self.node, version, exc)

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

    def dispatch_control(self) -> None:
        """Hand the controller's messages for this node to the executors they name (ahead of their input);
        messages for the node itself (stage, switch, unstage) are carried out here, in order. A Redis outage
        is waited out; a fault of this loop fails the worker."""
        client = self._client_factory()
        prefix = self.topology.redis_prefix
        try:
            while not self.stop.is_set():
                try:
                    item = self.redis_call(
                        "read its control list", lambda: pop_control(client, prefix, self.node, timeout_s=0.5)
                    )
                except RetryCancelled:
                    break
                except (ValueError, KeyError, TypeError) as exc:  # popped, but not a message: drop it
                    log.error("node %s: a malformed control message was dropped: %s", self.node, exc)
                    continue
                if item is not None:
                    self.dispatch(*item)
        except Exception as exc:
            self.fail("the control dispatcher", exc)
        finally:
            client.close()

    def dispatch(self, executor: str, message: dict[str, Any]) -> None:
        if not executor:
            try:
                self.on_node_message(message)
            except RetryCancelled:
                pass  # stopping
            except OperatorLoadError as exc:  # reported in the log; the controller times the step out
                log.error("node %s: %s failed: %s", self.node, message.get("type"), exc)
            except Exception as exc:
                if message.get("type") != ControlType.SWITCH:
                    # a STAGE or UNSTAGE that failed leaves the running executors as they were: the
                    # controller times the step out
                    log.exception("node %s: %s failed: %s", self.node, message.get("type"), exc)
                else:  # half switched: this node's executors are in no known state
                    self.fail(f"the switch to schedule version {message.get('version')}", exc)
            return
        current = self.current
        thread = current.by_executor().get(executor) if current is not None else None
        if thread is None:
            log.warning("control message %s for %s, which is not on this node; dropped", message, executor)
            return
        thread.control.put(message)

    def on_node_message(self, message: Mapping[str, Any]) -> None:
        kind = message.get("type")
        version = int(message.get("version", 0))
        if kind == ControlType.STAGE:
            found = self.redis_call("read a staged schedule", lambda: self.registry.schedule_version(version))
            if found is None:
                raise OperatorLoadError(f"staged schedule version {version} is not in Redis")
            self.discard_staged()
            self.staged = self.stage(*found)
            self.redis_call("mark itself staged", lambda: self.registry.mark_staged(version, self.node))
        elif kind == ControlType.UNSTAGE:
            if self.staged is not None and self.staged.version == version:
                self.discard_staged()
                if self.current is None:  # started only for the staged schedule: nothing left to run
                    log.info("node %s: staged schedule version %d discarded; stopping", self.node, version)
                    self.stop.set()
        elif kind == ControlType.SWITCH:
            self.switch(version, message.get("mid") or None)
        elif kind == ControlType.STOP:
            self.stopped_by_backend = True  # before anything else: a SIGTERM may come between any two lines
            self.stop.set()
            log.info("node %s: stopped by its backend", self.node)

    def discard_staged(self) -> None:
        staged, self.staged = self.staged, None
        if staged is not None:
            for inbox in staged.inboxes.values():
                inbox.close()

    def switch(self, version: int, migration_id: str | None) -> None:
        """Load schedule `version` in place: stop this node's executors of the running schedule (after a
        migration's COMMIT they are checkpointed and idle), start the ones the new schedule places here,
        waiting for INIT of `migration_id`, or stop the process when the node is no longer in it."""
        found = self.redis_call("read the new schedule", lambda: self.registry.schedule_version(version))
        if found is None:
            raise OperatorLoadError(f"schedule version {version} is not in Redis")
        _, schedule = found
        started = time.perf_counter()
        with self._switching:
            old = self.current
            if old is not None and old.version == version:
                # the controller sent this switch again (Redis went away while it applied the schedule): this
                # node runs that version already; binding its inboxes a second time would fail
                log.info(
                    "node %s: already runs schedule version %d; the repeated switch is ignored", self.node, version
                )
                return
            if self.node not in schedule.nodes:
                if old is not None:
                    self.retire(old)
                self.current = None
                log.info("node %s: not in schedule version %d; stopping", self.node, version)
                self.stop.set()
                return
            staged = self.staged if self.staged is not None and self.staged.version == version else None
            if staged is None:
                self.discard_staged()
            self.staged = None
            if old is not None:
                self.retire(old)
            generation = staged or self.stage(version, schedule)
            generation.awaiting = migration_id
            self.activate(generation)
        log.info(
            "node %s switched to schedule version %d in %.0f ms%s",
            self.node,
            version,
            (time.perf_counter() - started) * 1000.0,
            "" if staged is None else " (staged ahead)",
        )

    def publish_metrics(self) -> None:
        """One sample per executor and the sources' positions, one attempt: while Redis is away the interval's
        sample is skipped (the counters are cumulative: the next one carries it) and the outage logged once."""
        attempt = time.monotonic()
        try:
            written = self.metrics.publish(self.samples())
            current = self.current
            positions = self.source_positions(current) if current is not None else {}
            self.store.publish_positions(positions)
        except Exception as exc:
            if not is_redis_outage(exc):
                raise
            REDIS.failed(f"node {self.node}: cannot publish metrics", exc, attempt)
        else:
            if written or positions:  # Redis answered (a staged node has nothing to publish: no proof it is back)
                REDIS.succeeded()

    def log_data_plane(self, force: bool = False) -> None:
        """Log what the data plane dropped and refused since the worker started, when it grew since the last
        line, at most every `DATA_PLANE_LOG_S` (never a frame's content or a peer's key)."""
        now = time.monotonic()
        if not force and now < self._data_plane_log_at:
            return
        dropped, refused = self.data_plane.snapshot()
        if (dropped, refused) == self._data_plane_logged:
            return
        self._data_plane_logged, self._data_plane_log_at = (dropped, refused), now + DATA_PLANE_LOG_S
        log.warning(
            "node %s: data plane: %d frames dropped%s, %d handshakes refused%s since start",
            self.node,
            sum(dropped.values()),
            _by_reason(dropped),
            sum(refused.values()),
            _by_reason(refused),
        )

    def source_positions(self, generation: Generation) -> dict[str, bytes]:
        """The read position of each running source (`restart` counts what the sources will replay from
        them); a source still waiting for INIT has none yet."""
        positions: dict[str, bytes] = {}
        for thread in generation.threads:
            position = getattr(thread.operator, "position", None)
            if isinstance(thread, SourceThread) and thread.migration.awaiting is None and callable(position):
                positions[thread.executor] = pack(position())
        return positions

    def samples(self, generation: Generation | None = None) -> Iterable[MetricSample]:
        now = time.time()
        threads = self.threads if generation is None else generation.threads
        for thread in threads:
            c: Counters = thread.counters
            received, queue_len = (
                thread.offered_at(now) if isinstance(thread, SourceThread) else (c.received, max(c.queue_len, 0))
            )
            yield MetricSample(
                ts=now,
                node=self.node,
                vertex=split_executor_id(thread.executor)[0],
                executor=thread.executor,
                started_at=c.started_at,
                received=received,
                processed=c.processed,
                emitted=c.emitted,
                busy_s=round(c.busy_s, 6),
                queue_len=queue_len,
                latency_ms=round(c.take_latency_ms(), 4),
                errors=c.errors,
            )

    def shutdown(self) -> None:
        self.stop.set()
        with self._switching:
            current, self.current = self.current, None
            if current is not None:
                current.stop.set()
                _join(current.threads, 5.0)
                with contextlib.suppress(Exception):  # best effort on the way out
                    self.metrics.publish(self.samples(current))
                    self.store.publish_positions(self.source_positions(current))
                for channel in current.channels:
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

    # ------------------------------------------------------------------------------------------- drains

    def wants_drain(self) -> bool:
        """Whether a SIGTERM now asks for a drain rather than stopping: drains on, none asked yet, not
        stopping, executors running (a staged or starting node has nothing to move), its parent alive."""
        parent = _watched_parent()
        return (
            drain_deadline(self.options.drain_grace_s) > 0
            and self.draining is None
            and not self.stop.is_set()
            and self.current is not None
            and getattr(self, "client", None) is not None
            and (parent is None or os.getppid() == parent)
        )

    def drain(self) -> None:
        """Ask the controller to move this node's executors off, then wait (bounded) for the switch that takes
        the node out of the schedule, which stops the worker; stop anyway at the deadline or when the request
        cannot be written."""
        wait_s = drain_deadline(self.options.drain_grace_s)
        now = time.time()
        try:
            request_drain(self.client, self.topology.redis_prefix, self.node, now, now + wait_s)
        except Exception as exc:
            if not is_redis_outage(exc):
                log.exception("node %s: the drain request failed", self.node)
            log.warning("node %s: no drain (Redis: %s); stopping", self.node, exc)
            self.stop.set()
            return
        log.info(
            "node %s: drain requested; serving until its executors are moved off (at most %.0f s)", self.node, wait_s
        )
        if self.stop.wait(wait_s):
            if self.stopped_by_backend:  # the SIGTERM was its backend's stop, which raced the STOP: no drain
                with contextlib.suppress(Exception):
                    cancel_drain(self.client, self.topology.redis_prefix, self.node)
        else:
            log.warning(
                "node %s: not drained within %.0f s; stopping (the controller rolls back to the last checkpoint)",
                self.node,
                wait_s,
            )
            self.stop.set()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if signum == signal.SIGTERM and self.wants_drain():
                log.info("node %s: %s, asking for a drain (a second SIGTERM stops at once)", self.node, name)
                self.draining = threading.Thread(target=self.drain, name="drain", daemon=True)
                self.draining.start()
                return
            log.info("node %s: %s, stopping", self.node, name)
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
        dropped_frames, refused_handshakes = self.worker.data_plane.snapshot()
        dropped = CounterMetricFamily(
            "elastream_data_plane_dropped_frames",
            "frames the inboxes dropped: malformed, unauthenticated, sender (not its connection's), control "
            "(not an in-band message of an upstream executor)",
            labels=["node", "reason"],
        )
        refused = CounterMetricFamily(
            "elastream_data_plane_refused_handshakes",
            "connections the inboxes refused: auth (not the topology's key), protocol (no CURVE, another "
            "server key), other",
            labels=["node", "reason"],
        )
        for reason in ("malformed", "unauthenticated", "sender", "control"):
            dropped.add_metric([self.worker.node, reason], float(dropped_frames.get(reason, 0)))
        for reason in ("auth", "protocol", "other"):
            refused.add_metric([self.worker.node, reason], float(refused_handshakes.get(reason, 0)))
        yield dropped
        yield refused


def _by_reason(counts: Mapping[str, int]) -> str:
    return f" ({', '.join(f'{reason} {n}' for reason, n in sorted(counts.items()))})" if counts else ""


def _join(threads: Iterable[threading.Thread], timeout_s: float) -> None:
    """Join `threads` within `timeout_s` in all (a thread stuck past it is a daemon: it dies with the process)."""
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        if thread.is_alive():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _either(first: threading.Event | None, second: threading.Event) -> threading.Event | AnyOf:
    return second if first is None or first is second else AnyOf(first, second)


def _exit_now(node: str) -> None:
    """A failed worker whose shutdown hangs (a socket that will not close) exits anyway."""
    log.critical("node %s: shutdown did not finish within %.0f s; exiting now", node, FAILURE_EXIT_S)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(EXIT_INTERNAL_ERROR)


def next_grid_time(now: float, interval_s: float) -> float:
    """The first multiple of `interval_s` (seconds since the epoch) after `now`."""
    return (math.floor(now / interval_s) + 1) * interval_s


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
