"""Local mode's wiring of a `TopologyController` (`elastream run`, `elastream demo`): a `LocalCluster` runs the
workers, Redis carries the scale requests (`<prefix>scale-request`, written by `elastream scale`) and the status
fields (`<prefix>last-scaling`, ...), the checkpointer and the metric archiver run in the background."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from elastream.control.controller import TopologyController
from elastream.control.scaling import PrintEvents
from elastream.core.ports import (
    EventSink,
    ScaleRequest,
)
from elastream.core.topology import Topology

if TYPE_CHECKING:
    from elastream.analysis import Analyzer
    from elastream.control.backends.local import LocalCluster

log = logging.getLogger("elastream.control")


def scale_request_key(topology: Topology) -> str:
    return f"{topology.redis_prefix}scale-request"


def status_key(topology: Topology, field_name: str) -> str:
    """Where local mode keeps a status field: `lastScaling` -> `<prefix>last-scaling`."""
    return topology.redis_prefix + "".join(f"-{c.lower()}" if c.isupper() else c for c in field_name)


@dataclass
class RedisScaleRequests:
    """Local mode's requests: `elastream scale` writes {"nodes": N, "parallelism": {vertex: k}} as JSON to
    `<prefix>scale-request` (a bare number, as older versions wrote, is a node count)."""

    client: redis.Redis
    topology: Topology

    def take(self) -> ScaleRequest | None:
        raw = self.client.getdel(scale_request_key(self.topology))
        if raw is None:
            return None
        data = json.loads(raw)
        if isinstance(data, int):
            return ScaleRequest(data)
        parallelism = data.get("parallelism")
        return ScaleRequest(
            int(data["nodes"]), {str(v): int(k) for v, k in parallelism.items()} if parallelism else None
        )


@dataclass
class RedisStatus:
    """Local mode's status: each field as JSON under the topology's prefix (`elastream scale` waits on
    `<prefix>last-scaling`)."""

    client: redis.Redis
    topology: Topology
    #: fields not written yet (Redis away), written by the next `publish` or `flush`
    unsent: dict[str, str] = field(default_factory=dict)

    def publish(self, field: str, status: dict[str, Any]) -> None:
        self.unsent[field] = json.dumps(status, default=str)
        self.flush()

    def flush(self) -> None:
        try:
            for name in list(self.unsent):
                self.client.set(status_key(self.topology, name), self.unsent[name])
                del self.unsent[name]
        except redis.RedisError as exc:
            log.warning("status not written to Redis yet (%s); written when it is back", exc)


def local_controller(
    topology: Topology,
    cluster: LocalCluster,
    analyzer: Analyzer,
    events: EventSink | None = None,
    archive: str | None = None,
    archive_every_s: float = 10.0,
    archive_client: redis.Redis | None = None,
) -> TopologyController:
    """Wire a controller for local mode: `cluster` (a `LocalCluster`) runs the workers, Redis carries
    requests and status, the checkpointer and (with `archive`) the metric archiver run in the background."""
    from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
    from elastream.control.metrics import MetricArchiver, StreamMetricSource
    from elastream.control.migration import MigrationDriver
    from elastream.store.metric_stream import MetricStream

    events = events or PrintEvents()
    client = cluster.client
    driver = MigrationDriver(
        topology, cluster, client, topology.scaling.migration, events=events, scope=topology.scaling.migration_scope
    )
    checkpoints = CheckpointDriver(topology, cluster, client, identity=driver.identity)
    checkpointer = Checkpointer(checkpoints, float(topology.scaling.checkpoint_interval_s), own_thread=False)
    archiver = (
        MetricArchiver(archive_client or client, topology, archive, analyzer, every_s=archive_every_s)
        if archive
        else None
    )
    from elastream.store.drain_requests import RedisDrainRequests
    from elastream.store.epoch import RedisEpoch

    controller = TopologyController(
        topology=topology,
        backend=cluster,
        metrics=StreamMetricSource(client, topology, analyzer, cluster.interval_s),
        migrator=driver,
        feed=MetricStream(client, topology.redis_prefix),
        requests=RedisScaleRequests(client, topology),
        status=RedisStatus(client, topology),
        events=events,
        background=[checkpointer],
        checkpoints=checkpoints,
        archiver=archiver,
        interval_s=cluster.interval_s,
        epochs=RedisEpoch(client, topology.redis_prefix),
        drains=RedisDrainRequests(client, topology.redis_prefix),
        lags=driver.store,
    )
    driver.on_redis = controller.note_store
    driver.before_claim = checkpoints.abandon_open
    driver.own_round = checkpoints.open_round
    return controller
