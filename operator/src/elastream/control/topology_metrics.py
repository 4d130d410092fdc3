"""The Prometheus metrics of the operator and of `elastream run`, per topology (the contract of issue 40).

Two kinds. What happens — rescales, recoveries, their durations and pauses — is counted as it happens, in
labelled metrics (`RESCALES`, `RECOVERIES`, ...) whose series are made through `series`, which remembers
them per topology so that `forget_topology` removes them all when the topology is deleted. What a topology
*is* — its phase, conditions, nodes, source backlog, checkpoint age — is read at scrape time by
`TopologyCollector` (no cost per event, and a deleted topology's series vanish with it): from each
topology's last written status and a few facts its controller keeps (`TopologyReading`), mapped to samples by
the pure `topology_samples`, plus the memory of the Redis the operator uses (`RedisMemory`, cached so scrapes
do not hammer it).

Scrapes run on prometheus_client's HTTP thread while reconcile passes run on others: the collector reads
references the passes replace whole (the status writer's last written status, the checkpointer's last
completed round), takes no reconcile lock, and never raises (a topology whose reading fails is skipped and
logged at debug). `elastream run` reads its one controller on its own loop instead (`LocalTopologyMetrics`,
refreshed after each tick) and serves the same collector at 127.0.0.1:P.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from elastream.control.checkpoint_driver import Checkpointer
from elastream.control.metric_series import series
from elastream.core.ports import Clock, EventSink, SystemClock
from elastream.core.status import PHASES, EventReason, StatusFacts, desired_conditions, phase

if TYPE_CHECKING:
    from elastream.control.controller import TopologyController
    from elastream.control.scaling import ScalingRecord

log = logging.getLogger("elastream.metrics")

# ------------------------------------------------------------------------------------- counted as it happens

RESCALES = Counter(
    "elastream_rescales",
    "rescales carried out, by direction (out, in, none), outcome (succeeded, failed, unchanged) and trigger "
    "(request, autoscaler, spec)",
    ["namespace", "topology", "direction", "outcome", "trigger"],
)
RESCALE_SECONDS = Histogram(
    "elastream_rescale_duration_seconds",
    "request to migrated (analysis, plan, prepare, migration)",
    ["namespace", "topology"],
    buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
RESCALE_PAUSE_SECONDS = Histogram(
    "elastream_rescale_pause_seconds",
    "sources held during a rescale's migration (PREPARE sent to sources resumed)",
    ["namespace", "topology"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)
LAST_RESCALE_PAUSE_SECONDS = Gauge(
    "elastream_last_rescale_pause_seconds",
    "the sources' pause of the last rescale that migrated (dashboard annotations)",
    ["namespace", "topology"],
)
RECOVERIES = Counter(
    "elastream_recoveries",
    "rollbacks after a worker died, by outcome",
    ["namespace", "topology", "outcome"],
)


def count_rescale(namespace: str, topology: str, record: ScalingRecord) -> None:
    """Count one rescale (`elastream_rescales_total`), its duration and, when it migrated, its pause."""
    series(RESCALES, namespace, topology, str(record.direction), str(record.outcome), str(record.trigger)).inc()
    if record.finished_at is not None:
        series(RESCALE_SECONDS, namespace, topology).observe(max(0.0, record.finished_at - record.started_at))
    pause = record.report.get("pauseMs")
    if isinstance(pause, int | float) and not isinstance(pause, bool):
        series(RESCALE_PAUSE_SECONDS, namespace, topology).observe(pause / 1000.0)
        series(LAST_RESCALE_PAUSE_SECONDS, namespace, topology).set(pause / 1000.0)


def count_recovery(namespace: str, topology: str, recovery: Mapping[str, Any]) -> None:
    """Count one recovery (`elastream_recoveries_total`) by its outcome."""
    series(RECOVERIES, namespace, topology, str(recovery.get("outcome"))).inc()


# --------------------------------------------------------------------------------------- read at scrape time


@dataclass(frozen=True)
class TopologyReading:
    """What one topology's scrape reads: its last status as written (phase, nodes, readyNodes, conditions,
    vertices) and the facts the status does not hold (spec.nodes, the checkpoint interval, the last completed
    checkpoint's time on the clock's `now()` and its duration)."""

    namespace: str
    name: str
    status: Mapping[str, Any]
    desired_nodes: int | None = None
    checkpoint_interval_s: float | None = None
    checkpoint_completed_at: float | None = None
    checkpoint_duration_s: float | None = None


class Sample(NamedTuple):
    """One sample of a family of `FAMILIES`: its label values in the family's label order."""

    name: str
    labels: tuple[str, ...]
    value: float


#: the gauges read at scrape time: name -> (help, labels after namespace and topology)
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "elastream_topology_phase": (
        "1 for the topology's current phase (status.phase), 0 for every other phase it can take",
        ("phase",),
    ),
    "elastream_topology_condition": (
        "1 when the condition of this type is True, 0 when False, with its current reason",
        ("type", "reason"),
    ),
    "elastream_topology_desired_nodes": ("worker nodes the spec asks for (spec.nodes)", ()),
    "elastream_topology_nodes": ("worker nodes that exist (status.nodes)", ()),
    "elastream_topology_ready_nodes": ("worker nodes ready (status.readyNodes)", ()),
    "elastream_source_backlog_events": (
        "events waiting to be read at a source vertex (status.vertices[].lag: a kafka source's consumer lag)",
        ("vertex",),
    ),
    "elastream_checkpoint_age_seconds": ("seconds since the last completed checkpoint", ()),
    "elastream_checkpoint_duration_seconds": ("how long the last completed checkpoint took", ()),
    "elastream_checkpoint_interval_seconds": ("the checkpoint interval the spec asks for (0: off)", ()),
}


def topology_samples(reading: TopologyReading, now: float) -> list[Sample]:
    """The gauges of one topology at `now` (the clock's `now()`): pure, so every rule is unit-tested. A figure
    the status does not hold (yet) has no sample; a condition that is neither True nor False has none."""
    key = (reading.namespace, reading.name)
    status = reading.status
    samples: list[Sample] = []
    current = status.get("phase")
    if isinstance(current, str) and current:
        for name in (*PHASES, *(() if current in PHASES else (current,))):
            samples.append(Sample("elastream_topology_phase", (*key, name), 1.0 if name == current else 0.0))
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if not isinstance(condition, Mapping) or condition.get("status") not in ("True", "False"):
            continue
        kind, reason = str(condition.get("type") or ""), str(condition.get("reason") or "")
        value = 1.0 if condition["status"] == "True" else 0.0
        samples.append(Sample("elastream_topology_condition", (*key, kind, reason), value))
    if reading.desired_nodes is not None:
        samples.append(Sample("elastream_topology_desired_nodes", key, float(reading.desired_nodes)))
    for field_name, metric in (("nodes", "elastream_topology_nodes"), ("readyNodes", "elastream_topology_ready_nodes")):
        count = _number(status.get(field_name))
        if count is not None:
            samples.append(Sample(metric, key, count))
    vertices = status.get("vertices")
    for vertex in vertices if isinstance(vertices, list) else ():
        lag = _number(vertex.get("lag")) if isinstance(vertex, Mapping) else None
        if lag is not None:
            samples.append(Sample("elastream_source_backlog_events", (*key, str(vertex.get("name"))), lag))
    if reading.checkpoint_completed_at is not None:
        age = max(0.0, now - reading.checkpoint_completed_at)
        samples.append(Sample("elastream_checkpoint_age_seconds", key, age))
    if reading.checkpoint_duration_s is not None:
        samples.append(Sample("elastream_checkpoint_duration_seconds", key, reading.checkpoint_duration_s))
    if reading.checkpoint_interval_s is not None:
        samples.append(Sample("elastream_checkpoint_interval_seconds", key, reading.checkpoint_interval_s))
    return samples


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def checkpoint_facts(controller: TopologyController) -> tuple[float, float | None, float | None]:
    """The checkpoint interval of the controller's topology, and its checkpointer's last completed round:
    when it completed (the clock's `now()`) and how long it took in seconds (None, None before the first)."""
    interval = float(controller.topology.scaling.checkpoint_interval_s)
    for task in controller.background:
        if isinstance(task, Checkpointer):
            done = task.last_completed
            if done is not None:
                duration = None if done.duration_ms is None else done.duration_ms / 1000.0
                return interval, done.completed_at, duration
    return interval, None, None


class WrittenStatus(Protocol):
    @property
    def written(self) -> Mapping[str, Any] | None:
        """The status as last written (None: not known yet)."""
        ...


class ServedTopology(Protocol):
    """What a scrape reads of a topology the reconcile loop serves (`control.managed.ManagedTopology`)."""

    @property
    def key(self) -> str: ...

    @property
    def writer(self) -> WrittenStatus: ...

    @property
    def spec(self) -> Mapping[str, Any] | None: ...

    @property
    def controller(self) -> TopologyController | None: ...


class ServedTopologies(Protocol):
    """The topologies the reconcile loop serves (`control.reconciler.TopologyReconciler`), by key."""

    @property
    def topologies(self) -> Mapping[str, ServedTopology]: ...


def managed_reading(managed: ServedTopology) -> TopologyReading:
    """One operator topology's reading: the status its writer last wrote (not recomputed: that would ask the
    API server and Redis at every scrape), spec.nodes as the last pass saw it, its checkpointer's last round."""
    namespace, _, name = managed.key.partition("/")
    status = managed.writer.written or {}
    spec = managed.spec
    nodes = spec.get("nodes") if spec is not None else None
    controller = managed.controller
    interval, completed_at, duration = checkpoint_facts(controller) if controller is not None else (None, None, None)
    return TopologyReading(
        namespace,
        name,
        status,
        desired_nodes=nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None,
        checkpoint_interval_s=interval,
        checkpoint_completed_at=completed_at,
        checkpoint_duration_s=duration,
    )


def managed_readings(topologies: ServedTopologies) -> list[TopologyReading]:
    """The reading of every topology the operator serves now; one whose reading fails is skipped (debug)."""
    # a copy taken in one C call (the reconcile threads add and remove entries meanwhile)
    entries = list(topologies.topologies.values())
    readings = []
    for managed in entries:
        try:
            readings.append(managed_reading(managed))
        except Exception as exc:
            log.debug("metrics of %s not read: %s", getattr(managed, "key", "?"), exc)
    return readings


@dataclass
class RedisMemory:
    """`INFO memory` of the Redis the operator uses (used_memory, maxmemory), asked at most every `every_s`
    seconds whatever the scrape rate, on a thread of its own: a Redis that hangs (or a client retrying a
    refused connection) holds a scrape `wait_s` at most. A Redis that does not answer gives None (no series),
    and an answer is never served more than `max_age_s` after it came."""

    client: Any
    clock: Clock = field(default_factory=SystemClock)
    every_s: float = 15.0
    max_age_s: float = 60.0
    wait_s: float = 1.0
    _value: tuple[float, float] | None = field(default=None, init=False, repr=False)
    _answered_at: float = field(default=float("-inf"), init=False, repr=False)
    _asked_at: float = field(default=float("-inf"), init=False, repr=False)
    _asking: threading.Thread | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def read(self) -> tuple[float, float] | None:
        """(used bytes, limit bytes; 0: no limit), or None while Redis does not answer."""
        asked = None
        with self._lock:  # concurrent scrapes ask once
            due = self.clock.monotonic() - self._asked_at >= self.every_s
            if due and (self._asking is None or not self._asking.is_alive()):
                self._asked_at = self.clock.monotonic()
                asked = self._asking = threading.Thread(target=self._ask, name="elastream-redis-memory", daemon=True)
                asked.start()
        if asked is not None:
            asked.join(self.wait_s)  # a Redis that answers at once is in this scrape
        with self._lock:
            if self._value is None or self.clock.monotonic() - self._answered_at > self.max_age_s:
                return None
            return self._value

    def _ask(self) -> None:
        try:
            value = memory_of(self.client.info("memory"))
        except Exception as exc:  # Redis away: no series until it answers again
            log.debug("Redis memory not read: %s", exc)
            value = None
        with self._lock:
            self._value, self._answered_at = value, self.clock.monotonic()


def memory_of(info: Any) -> tuple[float, float] | None:
    """(used_memory, maxmemory) of an `INFO memory` reply; a Redis Cluster client's reply (one per node) sums
    its nodes. None when the reply holds neither."""
    if not isinstance(info, Mapping):
        return None
    if "used_memory" in info:
        used, limit = _number(info.get("used_memory")), _number(info.get("maxmemory"))
        return None if used is None else (used, limit or 0.0)
    nodes = [memory_of(reply) for reply in info.values() if isinstance(reply, Mapping)]
    known = [n for n in nodes if n is not None]
    if not known:
        return None
    return sum(u for u, _ in known), sum(limit for _, limit in known)


class TopologyCollector:
    """The gauges of `FAMILIES` for every topology `readings()` returns, and the Redis memory gauges; read at
    scrape time. Never raises: a failing reading or mapping is skipped and logged at debug."""

    def __init__(
        self,
        readings: Callable[[], Iterable[TopologyReading]],
        clock: Clock | None = None,
        redis_memory: RedisMemory | None = None,
    ) -> None:
        self.readings = readings
        self.clock = clock or SystemClock()
        self.redis_memory = redis_memory

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (what the registry checks names with, so registering reads nothing)."""
        yield from self._families().values()
        if self.redis_memory is not None:
            yield from _redis_families(None)

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        try:
            readings = list(self.readings())
            now = self.clock.now()
        except Exception as exc:
            log.debug("topology metrics not read: %s", exc)
            readings, now = [], 0.0
        for reading in readings:
            try:
                samples = topology_samples(reading, now)
            except Exception as exc:
                log.debug("metrics of %s/%s not mapped: %s", reading.namespace, reading.name, exc)
                continue
            for sample in samples:
                families[sample.name].add_metric(list(sample.labels), sample.value)
        yield from families.values()
        if self.redis_memory is not None:
            try:
                memory = self.redis_memory.read()
            except Exception as exc:
                log.debug("Redis memory not read: %s", exc)
                memory = None
            yield from _redis_families(memory)

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {
            name: GaugeMetricFamily(name, doc, labels=["namespace", "topology", *labels])
            for name, (doc, labels) in FAMILIES.items()
        }


def _redis_families(memory: tuple[float, float] | None) -> Iterator[Metric]:
    used = GaugeMetricFamily("elastream_redis_memory_used_bytes", "INFO memory used_memory of the Redis used")
    limit = GaugeMetricFamily("elastream_redis_memory_limit_bytes", "its maxmemory (0: no limit)")
    if memory is not None:
        used.add_metric([], memory[0])
        limit.add_metric([], memory[1])
    yield used
    yield limit


def register_topology_metrics(
    topologies: ServedTopologies,
    redis_client: Any,
    registry: CollectorRegistry = REGISTRY,
    clock: Clock | None = None,
) -> TopologyCollector:
    """Serve the gauges of every topology the operator manages, and its Redis' memory, from `registry` (the
    one `prometheus_client.start_http_server` serves by default)."""
    clock = clock or SystemClock()
    collector = TopologyCollector(lambda: managed_readings(topologies), clock, RedisMemory(redis_client, clock))
    registry.register(collector)
    return collector


# ------------------------------------------------------------------------------------------------ local mode


@dataclass
class LocalTopologyMetrics:
    """`elastream run`'s metrics of its one topology. Local mode has no status subresource: `refresh` (called
    on the run loop after each tick, and when a rescale is planned) builds the same reading from the
    controller — phase and conditions by `core.status` from what it knows, nodes from the backend's schedule,
    the source backlog from its live rates — and `after_tick` counts the rescale and the recovery the tick
    carried out. The collector (HTTP thread) reads the last reading only.

    It is also the controller's event sink (passing every event on to `events`): a planned rescale shows as
    phase Scaling until the tick carrying it out ends. `attach` gives it the controller."""

    events: EventSink
    controller: TopologyController | None = None
    reading: TopologyReading | None = None
    scaling: bool = False
    _recovery: Any = field(default=None, init=False, repr=False)

    def attach(self, controller: TopologyController) -> LocalTopologyMetrics:
        self.controller = controller
        self._recovery = controller.last_recovery
        return self

    def readings(self) -> list[TopologyReading]:
        reading = self.reading
        return [] if reading is None else [reading]

    def after_tick(self, record: ScalingRecord | None) -> None:
        """Count what the tick did (the rescale it returns, a new recovery), then read the controller again."""
        controller = self.controller
        if controller is None:
            return
        topology = controller.topology
        if record is not None:
            count_rescale(topology.namespace, topology.name, record)
        recovery = controller.last_recovery
        if recovery is not None and recovery is not self._recovery:
            count_recovery(topology.namespace, topology.name, recovery)
        self._recovery = recovery
        self.scaling = False
        self.refresh()

    def refresh(self, started: bool = True) -> None:
        """Read the controller now (on the thread that drives it); a failed read keeps the last reading."""
        if self.controller is None:
            return
        try:
            self.reading = local_reading(self.controller, started=started, scaling=self.scaling)
        except Exception as exc:
            log.debug("metrics of %s not read: %s", self.controller.topology.name, exc)

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.emit(reason, message, warning)
        if reason == EventReason.SCALING_PLANNED:
            self.scaling = True
            self.refresh()


def local_reading(controller: TopologyController, started: bool = True, scaling: bool = False) -> TopologyReading:
    """The reading of a local topology from its controller: the facts `core.status` turns into the phase and
    conditions (as the operator's status has them), nodes from the backend's schedule (ready: its worker
    process runs), each source's backlog from the live rates."""
    topology = controller.topology
    schedule = controller.backend.current_schedule() if started else None
    nodes = set(schedule.nodes) if schedule is not None else set()
    ready = len(nodes & controller.backend.running_nodes()) if nodes else 0
    if controller.suspended:
        nodes, ready = set(), 0
    down_since = controller.store_down_since
    facts = StatusFacts(
        desired_nodes=len(nodes),
        ready_nodes=ready,
        started=started,
        scaling=scaling,
        redis_unavailable=controller.store_error,
        redis_down_s=0.0 if down_since is None else max(0.0, controller.clock.now() - down_since),
        state_lost=controller.state_lost,
        suspended=controller.suspended,
        suspended_at=controller.resume_point or "",
        connector_error=controller.connectors.error,
    )
    backlog = controller.live.source_backlog()
    status = {
        "phase": phase(facts),
        "nodes": len(nodes),
        "readyNodes": ready,
        "conditions": desired_conditions(facts),
        "vertices": [{"name": v, "lag": backlog[v]} for v in topology.order if v in backlog],
    }
    interval, completed_at, duration = checkpoint_facts(controller)
    return TopologyReading(
        topology.namespace,
        topology.name,
        status,
        desired_nodes=topology.nodes,
        checkpoint_interval_s=interval,
        checkpoint_completed_at=completed_at,
        checkpoint_duration_s=duration,
    )


def serve_local_metrics(
    metrics: LocalTopologyMetrics, port: int, redis_client: Any, registry: CollectorRegistry = REGISTRY
) -> Callable[[], None]:
    """Serve `metrics` (and the counters above, and the Redis memory) at http://127.0.0.1:`port`/metrics;
    returns what stops the server. Raises OSError when the port cannot be bound."""
    from prometheus_client import start_http_server

    clock = metrics.controller.clock if metrics.controller is not None else SystemClock()
    collector = TopologyCollector(metrics.readings, clock, RedisMemory(redis_client, clock))
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    except Exception:
        registry.unregister(collector)
        raise

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5.0)
        registry.unregister(collector)

    return stop
