"""The worker process: one per node. It runs the executors the schedule places on its node.

Start-up, each step retried with backoff and a log line saying what it waits for:
1. connect to Redis; 2. read the current schedule; 3. load the operators (a missing `module:Class` stops the
worker at once with a one-line reason); 4. bind an inbox per executor on `--bind HOST[:PORT]` and register the
endpoints (at `--advertise HOST` when it listens on every interface);
5. wait for the endpoints of every downstream executor and connect; 6. start the executors and
mark the node ready; 7. once every node of the schedule is ready, start the sources.
Then, every interval, it publishes one `MetricSample` per executor to `<prefix>metrics` and serves the same
counters as Prometheus metrics. SIGINT stops it cleanly, as does SIGTERM without a drain grace period.

`Worker` composes parts, each an object with its own state that is given only what it may touch: the
generations of executors, staged, activated, switched and retired (`worker_generations.Generations`), the
controller's messages (`worker_control.ControlMessages`), metrics and the data plane's counts
(`worker_metrics.MetricsReporting`, `WorkerCollector`), graceful drains on SIGTERM
(`worker_drains.Drains`), the failure path (`worker_failures.FailurePath`); they share the Redis stores
(`worker_state.RedisStores`) and the way to wait on Redis (`worker_state.RedisWaits`). The data plane is authenticated
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

import logging
import math
import os
import sys
import threading
from typing import Any

import redis
import zmq
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry

from elastream.core.ports import Clock, SystemClock
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology
from elastream.log_format import configure_logging as configure_log_format
from elastream.runtime.executor import ExecutorThread
from elastream.runtime.health import serve_health
from elastream.runtime.operators.cpu import NodeCpu
from elastream.runtime.security import PeerAuthenticator
from elastream.runtime.source_thread import SourceThread
from elastream.runtime.transport import DataPlaneStats
from elastream.runtime.worker_control import ControlMessages
from elastream.runtime.worker_drains import Drains, watched_parent
from elastream.runtime.worker_failures import FailurePath
from elastream.runtime.worker_generations import Generations
from elastream.runtime.worker_metrics import MetricsReporting, WorkerCollector, source_positions
from elastream.runtime.worker_state import Generation, RedisStores, RedisWaits
from elastream.runtime.worker_state import WorkerOptions as WorkerOptions  # what `elastream worker` builds
from elastream.store.control import control_key
from elastream.store.registry import RedisUnavailable, client_for, connect
from elastream.store.retry import RetryCancelled
from elastream.worker_inputs.user_code import OperatorLoadError

log = logging.getLogger("elastream.worker")

EXIT_USER_ERROR = 2
#: socket timeouts of the worker's Redis clients: a call on a Redis that hangs fails within this, so a
#: stop request is honoured within seconds whatever Redis does
REDIS_CONNECT_TIMEOUT_S = 2.0
REDIS_SOCKET_TIMEOUT_S = 5.0
#: `--bind` hosts that listen on every interface (peers then need `--advertise`)
ALL_INTERFACES = ("0.0.0.0", "::")


class Worker:
    """One node's worker: start-up, the main loop and the stop, composed of its parts (see the module)."""

    def __init__(self, topology: Topology, options: WorkerOptions, clock: Clock | None = None) -> None:
        self.topology = topology
        self.options = options
        self.node = options.node
        self.clock: Clock = clock or SystemClock()
        self.stop = threading.Event()
        self.zmq = zmq.Context(io_threads=1)
        #: what every inbox of this worker dropped and refused
        self.data_plane = DataPlaneStats()
        #: the ZAP handler that admits only the topology's peers to the inboxes (before any inbox binds)
        self.authenticator: PeerAuthenticator | None = None
        if options.data_plane is not None:
            self.authenticator = PeerAuthenticator(self.zmq, options.data_plane)
            self.authenticator.start()
        prefix = topology.redis_prefix
        self.stores = RedisStores()
        self.waits = RedisWaits(self.node, self.clock, self.stop)
        self.failures = FailurePath(
            self.node, self.stop, self.stores, lambda: self.generations.marked_versions(), self.shutdown
        )
        self.generations = Generations(
            topology,
            options,
            self.clock,
            self.stop,
            self.stores,
            self.waits,
            self.zmq,
            self.data_plane,
            NodeCpu(topology.node_cpu),
            self.client_factory,
            self.failures.executor_failed,
            lambda: self.failures.failed is not None,
        )
        self.reporting = MetricsReporting(
            self.node, self.clock, self.stores, lambda: self.generations.current, self.data_plane
        )
        self.drains = Drains(
            self.node,
            prefix,
            options.drain_grace_s,
            self.clock,
            self.stop,
            self.stores,
            lambda: self.generations.current is not None,
        )
        self.control = ControlMessages(
            self.node,
            prefix,
            self.stop,
            self.client_factory,
            self.waits.redis_call,
            self.generations.running,
            self.generations.overlapping,
            self.generations,
            self.drains.backend_stops,
            self.failures.fail,
        )

    @property
    def threads(self) -> list[ExecutorThread | SourceThread]:
        """The executors running now (what `WorkerCollector` scrapes)."""
        return self.generations.threads

    # ---------------------------------------------------------------------------------------------- start-up

    def _retrying(self, what: str) -> Any:
        last = [0.0]

        def on_retry(reason: str, delay: float) -> None:
            if self.clock.monotonic() - last[0] >= 2.0:
                last[0] = self.clock.monotonic()
                log.warning("%s: %s; retrying in %.1f s", what, reason, delay)

        return on_retry

    def connect(self) -> None:
        client = connect(
            self.options.redis_url,
            self.options.redis_wait_s,
            self._retrying("connecting"),
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        )
        self.stores.attach(client, self.topology.redis_prefix)

    def read_schedule(self) -> tuple[int, Schedule] | None:
        """The schedule this process starts with: the staged version it was started for, else the current."""
        version = self.options.schedule_version
        registry = self.stores.registry
        found: tuple[int, Schedule] | None
        if version:
            found = self.waits.wait_for(
                f"staged schedule version {version} in Redis", lambda: registry.schedule_version(version)
            )
        else:
            found = self.waits.wait_for("the schedule in Redis (the backend writes it)", registry.schedule)
        return found

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
        self.drains.install_signals()
        generations = self.generations
        try:
            self.connect()
            found = self.read_schedule()
            if found is not None:
                version, schedule = found
                generation = generations.stage(version, schedule)
                # a node started for a staged schedule idles until the migration switches to it
                if self.options.schedule_version:
                    generations.staged = generation
                else:
                    generation.awaiting = generations.migration_in_progress()
        except (OperatorLoadError, RedisUnavailable) as exc:
            log.error("%s", exc)
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USER_ERROR
        except RetryCancelled:  # stopped while Redis was away
            found = None
        except Exception as exc:
            self.failures.fail("start-up", exc)
            return self.failures.exit_failed()
        if self.stop.is_set() or found is None:
            self.shutdown()
            return 0
        try:
            self.start(generation)
            self.serve()
        except RetryCancelled:  # stopped while Redis was away
            pass
        except Exception as exc:
            self.failures.fail("the main loop", exc)
        if self.failures.failed is not None:
            return self.failures.exit_failed()
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
            scraped = CollectorRegistry()
            scraped.register(WorkerCollector(self))
            start_http_server(self.options.metrics_port, addr=self.options.host, registry=scraped)
        leftovers = control_key(self.topology.redis_prefix, self.node)  # a previous worker's messages
        client = self.stores.client
        self.waits.redis_call("clear its control list", lambda: client.delete(leftovers))
        threading.Thread(target=self.control.dispatch_control, name="control", daemon=True).start()
        staged = self.generations.staged
        if staged is not None:
            registry = self.stores.registry
            self.waits.redis_call("mark itself staged", lambda: registry.mark_staged(staged.version, self.node))
            log.info("node %s staged for schedule version %d: idle until the switch", self.node, staged.version)
        elif self.generations.activate(generation):
            self.generations.start_sources_when_all_ready(generation)

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
            self.reporting.publish_metrics()
            self.reporting.log_data_plane()
            if parent is not None and os.getppid() != parent:
                log.warning("node %s: the process that started it (pid %d) is gone; stopping", self.node, parent)
                self.stop.set()

    def is_ready(self) -> bool:
        """Executors bound and registered: running a schedule, or staged and idle for the one that adds us;
        never once the worker's own code failed."""
        generations = self.generations
        return self.failures.failed is None and (generations.current is not None or generations.staged is not None)

    def shutdown(self) -> None:
        self.stop.set()

        def last_words(current: Generation) -> None:
            self.stores.metrics.publish(self.reporting.samples(current.threads))
            self.stores.store.publish_positions(source_positions(current.threads))

        self.generations.close(last_words)
        self.reporting.log_data_plane(force=True)
        self.drains.join(REDIS_SOCKET_TIMEOUT_S)
        if self.authenticator is not None:
            self.authenticator.stop()
        self.zmq.term()
        log.info("node %s stopped", self.node)


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
