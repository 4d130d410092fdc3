"""What a worker is given and what its parts pass between them: its options (`WorkerOptions`, what
`elastream worker` builds), its generations of executors (`Generation`), its Redis stores once connected
(`RedisStores`) and how its parts wait on Redis (`RedisWaits`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from elastream.core.ports import Clock
from elastream.core.schedule import Schedule
from elastream.runtime.executor import ExecutorThread
from elastream.runtime.operators.api import Context
from elastream.runtime.source_thread import SourceThread
from elastream.runtime.transport import Inbox
from elastream.store.checkpoint_store import CheckpointStore
from elastream.store.metric_stream import MetricStream
from elastream.store.registry import Registry
from elastream.store.retry import REDIS, AnyOf, RedisAttempt, backoff, retry_redis
from elastream.worker_inputs.keys import DataPlaneKeys

log = logging.getLogger("elastream.worker")


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
    #: staged and running beside the current generation: a migration of scope `keyGroups` (OVERLAP)
    overlapping: bool = False

    def by_executor(self) -> dict[str, ExecutorThread | SourceThread]:
        return {thread.executor: thread for thread in self.threads}

    def halt(self) -> None:
        """Stop the generation and every executor of it."""
        self.stop.set()
        for stop in self.stops.values():
            stop.set()


class RedisStores:
    """The worker's Redis client and the stores on it, attached once start-up has connected (`attach`); the
    parts that publish, drain or take readiness back hold this, not the worker."""

    client: redis.Redis
    registry: Registry
    metrics: MetricStream
    store: CheckpointStore

    def __init__(self) -> None:
        self.connected = False

    def attach(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.registry = Registry(client, prefix)
        self.metrics = MetricStream(client, prefix)
        self.store = CheckpointStore(client, prefix)
        self.connected = True


class RedisWaits:
    """How a worker's parts wait on Redis: a probe polled until it answers (`wait_for`), a call retried through
    an outage (`redis_call`); both give up once the worker's `stop` (or the caller's own) is set."""

    def __init__(self, node: str, clock: Clock, stop: threading.Event) -> None:
        self.node = node
        self.clock = clock
        self.stop = stop

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


def _described(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


def _either(first: threading.Event | None, second: threading.Event) -> threading.Event | AnyOf:
    return second if first is None or first is second else AnyOf(first, second)
