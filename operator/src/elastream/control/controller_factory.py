"""How the reconcile loop builds the controller of a topology (`ControllerFactory`): over Kubernetes pods,
with its migration and checkpoint drivers, metric source and drain requests in Redis, the autoscaler's
decisions written to `spec.nodes` and the pods that cannot start reported (`ManagedTopology.autoscaled`,
`.report_pending`); or by the `build` hook tests give (over in-memory fakes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from elastream.analysis import Analyzer
from elastream.control.backends.kubernetes import KubernetesBackend
from elastream.control.backends.worker_objects import WorkerPodSettings
from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
from elastream.control.controller import TopologyController
from elastream.control.managed import ManagedTopology
from elastream.control.metrics import StreamMetricSource
from elastream.control.migration import MigrationDriver
from elastream.control.pacing import LoopSettings
from elastream.control.resource_api import NoRequests
from elastream.core.ports import Clock, CoreApi, NetworkingApi, PolicyApi, SystemClock
from elastream.core.topology import Topology
from elastream.store.acl import UserKeeper
from elastream.store.drain_requests import RedisDrainRequests
from elastream.store.epoch import RedisEpoch
from elastream.store.metric_stream import MetricStream

#: `build(owner, topology, metadata, managed)`: a controller of `topology` (tests: over fakes); `owner` is the
#: reconciler that asks
BuildController = Callable[[Any, Topology, Mapping[str, Any], ManagedTopology], TopologyController]


@dataclass
class ControllerFactory:
    """Builds each topology's controller (see the module)."""

    redis_client: redis.Redis
    #: never in a repr (a log line, a traceback's locals): it may hold a password
    redis_url: str = field(repr=False)
    core_api: CoreApi
    analyzer: Analyzer
    settings: WorkerPodSettings = field(default_factory=WorkerPodSettings)
    networking_api: NetworkingApi | None = None
    policy_api: PolicyApi | None = None
    user_keeper: UserKeeper | None = None
    #: the loop's settings: the pods' start timeout, Redis users per topology, the metric interval
    loop: LoopSettings = field(default_factory=LoopSettings)
    clock: Clock = field(default_factory=SystemClock)
    #: builds instead of `over_pods` when it returns a controller (`TopologyReconciler.build`)
    hook: Callable[[Topology, Mapping[str, Any], ManagedTopology], TopologyController | None] | None = None

    def new(self, topology: Topology, metadata: Mapping[str, Any], managed: ManagedTopology) -> TopologyController:
        """A controller of `topology` by the hook (tests: over fakes), else over Kubernetes pods."""
        built = self.hook(topology, metadata, managed) if self.hook is not None else None
        return built if built is not None else self.over_pods(topology, metadata, managed)

    def over_pods(
        self, topology: Topology, metadata: Mapping[str, Any], managed: ManagedTopology
    ) -> TopologyController:
        client = self.redis_client
        backend = KubernetesBackend(
            topology,
            client,
            self.core_api,
            {"name": metadata["name"], "uid": metadata["uid"]},
            self.redis_url,
            self.settings,
            self.loop.start_timeout_s,
            networking=self.networking_api,
            policy=self.policy_api,
            topology_users=self.loop.topology_users,
            user_keeper=self.user_keeper,
            clock=self.clock,
        )
        migrator = MigrationDriver(
            topology,
            backend,
            client,
            topology.scaling.migration,
            events=managed.events,
            clock=self.clock,
            scope=topology.scaling.migration_scope,
            commit_as=backend.topology_connection,
        )
        checkpoints = CheckpointDriver(
            topology,
            backend,
            client,
            identity=migrator.identity,
            clock=self.clock,
            commit_as=backend.topology_connection,
        )
        controller = TopologyController(
            topology=topology,
            backend=backend,
            metrics=StreamMetricSource(client, topology, self.analyzer, self.loop.interval_s),
            migrator=migrator,
            feed=MetricStream(client, topology.redis_prefix),
            requests=NoRequests(),
            status=managed,
            events=managed.events,
            clock=self.clock,
            background=[Checkpointer(checkpoints, float(topology.scaling.checkpoint_interval_s), own_thread=False)],
            checkpoints=checkpoints,
            interval_s=self.loop.interval_s,
            on_nodes_changed=managed.autoscaled,
            epochs=RedisEpoch(client, topology.redis_prefix),
            expected_epoch=managed.state_epoch,
            drains=RedisDrainRequests(client, topology.redis_prefix),
            lags=migrator.store,
        )
        migrator.on_redis = controller.note_store
        migrator.before_claim = checkpoints.abandon_open
        migrator.own_round = checkpoints.open_round
        backend.on_waiting = lambda pending: managed.report_pending(pending, write=True)
        return controller
