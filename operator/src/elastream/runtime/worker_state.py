"""The state every part of a worker shares (`Worker` is made of `WorkerState` and its parts: `worker_control`,
`worker_metrics`, `worker_drains`, `worker_failures`), its options and its generations of executors. The
methods one part calls on another are declared here, so each part is type-checked on its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
import zmq

from elastream.core.ports import Clock, SystemClock
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology
from elastream.runtime.executor import ExecutorLoop, ExecutorThread
from elastream.runtime.operators.api import Context
from elastream.runtime.operators.cpu import NodeCpu
from elastream.runtime.security import PeerAuthenticator
from elastream.runtime.source_thread import SourceThread
from elastream.runtime.transport import DataPlaneStats, Inbox
from elastream.store.checkpoint_store import CheckpointStore
from elastream.store.metric_stream import MetricStream
from elastream.store.registry import Registry
from elastream.worker_inputs.keys import DataPlaneKeys


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
    #: the executors this generation makes (a partial switch: only the moving ones; the kept threads join)
    operators: dict[str, tuple[Any, Context]]
    inboxes: dict[str, Inbox]
    #: each executor's own stop (its thread, router, operator context and Redis waits), so a partial
    #: migration stops the executors that move and leaves the others running
    stops: dict[str, threading.Event]
    #: the generation's own waits (endpoints, readiness); `halt` stops everything
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[ExecutorThread | SourceThread] = field(default_factory=list)
    #: the migration whose INIT the executors wait for before they process anything (None: run at once)
    awaiting: str | None = None
    #: what the previous generation's channels learned (`transport.learned_windows`): new channels start there
    windows: dict[tuple[str, str], int] = field(default_factory=dict)

    def by_executor(self) -> dict[str, ExecutorThread | SourceThread]:
        return {thread.executor: thread for thread in self.threads}

    def halt(self) -> None:
        """Stop the generation and every executor of it."""
        self.stop.set()
        for stop in self.stops.values():
            stop.set()


class WorkerState:
    """What a worker holds, and the methods its parts call on one another (defined by `Worker` and its parts)."""

    #: set by `connect`: the worker's Redis client and the stores on it
    client: redis.Redis
    registry: Registry
    metrics: MetricStream
    store: CheckpointStore

    def __init__(self, topology: Topology, options: WorkerOptions, clock: Clock | None = None) -> None:
        self.topology = topology
        self.clock: Clock = clock or SystemClock()
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

    def redis_call(self, what: str, call: Callable[[], Any], stop: threading.Event | None = None) -> Any:
        raise NotImplementedError

    def stage(self, version: int, schedule: Schedule, keep: Generation | None = None) -> Generation:
        raise NotImplementedError

    def activate(self, generation: Generation) -> bool:
        raise NotImplementedError

    def retire(self, generation: Generation, executors: Iterable[str] | None = None) -> None:
        raise NotImplementedError

    def client_factory(self) -> redis.Redis:
        raise NotImplementedError

    def fail(self, what: str, exc: BaseException | None) -> None:
        raise NotImplementedError

    def executor_failed(self, thread: ExecutorLoop) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError
