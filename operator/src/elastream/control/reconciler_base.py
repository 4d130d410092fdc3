"""What every part of the reconcile loop shares (`ReconcilerBase`): the operator's settings, the topologies it
serves (`entry` makes one on first sight, primed with the status it has), how a topology's controller is
built over Kubernetes pods (`_build`), its savepoint annotations, the autoscaler's write of `spec.nodes` and
the pods that cannot start. `control.lifecycle`, `control.upgrades` and `control.resources` build on it, one
concern each."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from elastream.analysis import Analyzer
from elastream.control.backends.kubernetes import KubernetesBackend
from elastream.control.backends.worker_objects import WorkerPodSettings
from elastream.control.controller import TopologyController
from elastream.control.managed import (
    UPGRADE_ROLLED_BACK,
    ManagedTopology,
)
from elastream.control.reconcile_slots import ReconcileSlots
from elastream.control.resource_api import (
    KubernetesEvents,
    NoRequests,
    ResourceApi,
)
from elastream.control.savepoint_actions import RedisSavepoints, SavepointRequests, Savepoints
from elastream.control.status_writer import StatusWriter
from elastream.core.ports import Clock, CoreApi, CustomObjectsApi, NetworkingApi, PolicyApi, SystemClock
from elastream.core.schedule import Schedule
from elastream.core.status import (
    EventReason,
)
from elastream.core.topology import (
    Topology,
)
from elastream.store.acl import UserKeeper
from elastream.store.drain_requests import RedisDrainRequests
from elastream.store.epoch import RedisEpoch
from elastream.store.registry import Registry

log = logging.getLogger("elastream.operator")


@dataclass
class ReconcilerBase:
    """The settings, wiring and topologies of the operator's reconcile loop (`control.resources.ManagedTopologies`
    is the loop itself)."""

    redis_client: redis.Redis
    #: never in a repr (a log line, a traceback's locals): it may hold a password
    redis_url: str = field(repr=False)
    core_api: CoreApi
    custom_api: CustomObjectsApi
    #: the one analysis session (Spark) of every topology: warmed up at a start, analyses each window
    analyzer: Analyzer
    settings: WorkerPodSettings = field(default_factory=WorkerPodSettings)
    #: the worker images a topology's spec.image may name (`core.images`); empty: any
    allowed_images: tuple[str, ...] = ()
    #: a `kubernetes.client.NetworkingV1Api`, for each topology's NetworkPolicy (`settings.network_policy`)
    networking_api: NetworkingApi | None = None
    #: a `kubernetes.client.PolicyV1Api`, for each topology's PodDisruptionBudget (`settings.disruption_budget`)
    policy_api: PolicyApi | None = None
    #: give each topology's workers a Redis ACL user of its own (`store.acl`); off: the operator's URL
    topology_users: bool = True
    #: sets those users again within a tick when Redis lost them, for every topology on one thread (None: only
    #: the reconcile passes look)
    user_keeper: UserKeeper | None = None
    interval_s: float = 1.0
    #: how long worker pods may take to be scheduled, started and ready
    start_timeout_s: float = 180.0
    #: seconds between passes of an idle topology (dead workers, checkpoints, the autoscaler, rates)
    tick_s: float = 2.0
    #: a changed spec is acted on once it has been still this long (a burst of patches moves once)
    settle_s: float = 1.0
    #: seconds between status writes for the rates alone
    volatile_every_s: float = 15.0
    #: a failed scaling or start of the same desired state is retried after this, doubling up to the cap
    retry_s: float = 5.0
    retry_cap_s: float = 300.0
    #: how long a delete waits for a pass in progress (a migration) before it stops the workers anyway
    delete_wait_s: float = 60.0
    #: builds the controller of a topology (tests replace it with one over in-memory fakes)
    build: Callable[[ReconcilerBase, Topology, Mapping[str, Any], ManagedTopology], TopologyController] | None = None
    #: where savepoints are kept (None: in Redis, through `redis_client`)
    savepoint_service: Savepoints | None = None
    #: the schedule the workers of a topology run, from Redis (after an operator restart: adopted)
    running_schedule: Callable[[Topology], Schedule | None] | None = None
    #: the spec the pods of a topology run (its ConfigMap's), None when there are none (tests replace it)
    running_spec: (
        Callable[[Topology, Mapping[str, Any]], tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]] | None
    ) = None
    #: every deadline, backoff, settling and wait of the loop and of the controllers it builds (tests: fake)
    clock: Clock = field(default_factory=SystemClock)
    #: how many passes do work at once (`control.reconcile_slots`); a pass that waits gives its slot back
    #: (None: as many as call `reconcile`, e.g. tests that drive one topology)
    slots: ReconcileSlots | None = None
    topologies: dict[str, ManagedTopology] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.slots is not None:
            # every wait of a pass goes through this clock (the controllers and backends it builds get it):
            # waiting, a pass gives its slot back to the passes of other topologies
            self.clock = self.slots.clock(self.clock)

    def key(self, namespace: str, name: str) -> str:
        return f"{namespace}/{name}"

    def get(self, namespace: str, name: str) -> ManagedTopology | None:
        return self.topologies.get(self.key(namespace, name))

    def entry(self, body: Mapping[str, Any]) -> ManagedTopology:
        """The topology of this resource (made on first sight, its writer primed with the status it has)."""
        metadata = body["metadata"]
        namespace, name = metadata.get("namespace", "default"), metadata["name"]
        key = self.key(namespace, name)
        with self._lock:
            managed = self.topologies.get(key)
            if managed is None:
                resource = ResourceApi(self.custom_api, namespace, name)
                writer = StatusWriter(
                    resource.patch_status, volatile_every_s=self.volatile_every_s, clock=self.clock.monotonic
                )
                writer.prime(body.get("status"))
                managed = ManagedTopology(
                    key, writer, KubernetesEvents(self.core_api, body, clock=self.clock), resource
                )
                managed.conditions = list((body.get("status") or {}).get("conditions") or [])
                managed.state_epoch = (body.get("status") or {}).get("stateEpoch") or None
                applied = (body.get("status") or {}).get("appliedParallelism")
                if isinstance(applied, Mapping):
                    managed.applied_parallelism = {str(v): int(k) for v, k in applied.items()}
                observed = (body.get("status") or {}).get("observedGeneration")
                managed.observed_generation = observed if isinstance(observed, int) else 0
                upgrade = (body.get("status") or {}).get("lastUpgrade")
                if isinstance(upgrade, Mapping):  # a rolled-back generation is not tried again after a restart
                    managed.published["lastUpgrade"] = dict(upgrade)
                    if upgrade.get("outcome") == UPGRADE_ROLLED_BACK and isinstance(upgrade.get("generation"), int):
                        managed.rolled_back_generation = upgrade["generation"]
                self.topologies[key] = managed
        return managed

    def _note_store(self, managed: ManagedTopology) -> None:
        controller = managed.controller
        if controller is None:
            return
        down_since = controller.store_down_since
        managed.set(
            redis_unavailable=controller.store_error,
            redis_down_s=0.0 if down_since is None else max(0.0, controller.clock.now() - down_since),
        )

    def _registry_schedule(self, topology: Topology) -> Schedule | None:
        found = Registry(self.redis_client, topology.redis_prefix).schedule()
        return found[1] if found is not None else None

    def _new_controller(
        self, topology: Topology, metadata: Mapping[str, Any], managed: ManagedTopology
    ) -> TopologyController:
        """A controller of `topology` by `build` (tests: over fakes), else over Kubernetes pods (`_build`)."""
        return (self.build or ReconcilerBase._build)(self, topology, metadata, managed)

    def _build(self, topology: Topology, metadata: Mapping[str, Any], managed: ManagedTopology) -> TopologyController:
        from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
        from elastream.control.metrics import StreamMetricSource
        from elastream.control.migration import MigrationDriver
        from elastream.store.metric_stream import MetricStream

        client = self.redis_client
        backend = KubernetesBackend(
            topology,
            client,
            self.core_api,
            {"name": metadata["name"], "uid": metadata["uid"]},
            self.redis_url,
            self.settings,
            self.start_timeout_s,
            networking=self.networking_api,
            policy=self.policy_api,
            topology_users=self.topology_users,
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
            metrics=StreamMetricSource(client, topology, self.analyzer, self.interval_s),
            migrator=migrator,
            feed=MetricStream(client, topology.redis_prefix),
            requests=NoRequests(),
            status=managed,
            events=managed.events,
            clock=self.clock,
            background=[Checkpointer(checkpoints, float(topology.scaling.checkpoint_interval_s), own_thread=False)],
            checkpoints=checkpoints,
            interval_s=self.interval_s,
            on_nodes_changed=lambda nodes: self._autoscaled(managed, nodes),
            epochs=RedisEpoch(client, topology.redis_prefix),
            expected_epoch=managed.state_epoch,
            drains=RedisDrainRequests(client, topology.redis_prefix),
            lags=migrator.store,
        )
        migrator.on_redis = controller.note_store
        migrator.before_claim = checkpoints.abandon_open
        migrator.own_round = checkpoints.open_round
        backend.on_waiting = lambda pending: self.report_pending(managed, pending, write=True)
        return controller

    def savepoints(self) -> Savepoints:
        return self.savepoint_service or RedisSavepoints(self.redis_client, self.clock)

    def _savepoints(self, managed: ManagedTopology, metadata: Mapping[str, Any]) -> None:
        """Carry out the savepoint annotations (`control.savepoint_actions.SavepointRequests`) and keep
        `status.savepoints` (once there is one) as Redis lists them."""
        if managed.savepoints is None:
            managed.savepoints = SavepointRequests(
                self.savepoints(),
                managed.events,
                managed.resource.remove_annotation,
                retry_s=self.retry_s,
                retry_cap_s=self.retry_cap_s,
                clock=self.clock.monotonic,
            )
        assert managed.controller is not None
        managed.savepoints.reconcile(managed.controller, metadata.get("annotations") or {})
        entries = managed.savepoints.entries
        if entries is not None and (entries or "savepoints" in managed.published):
            managed.published["savepoints"] = entries

    def _autoscaled(self, managed: ManagedTopology, nodes: int) -> None:
        """The autoscaler moved the topology: write its node count to spec.nodes, and remember the generation
        that write made (until the watch shows it, the resource seen still asks for the old count)."""
        generation = managed.resource.patch_spec_nodes(nodes)
        managed.expect_generation = generation or managed.generation + 1

    def report_pending(self, managed: ManagedTopology, pending: Mapping[str, str], write: bool = False) -> None:
        """Worker pods that cannot start (the scheduler's or the kubelet's reason) go into the Available
        condition and a Warning event; with `write`, the status is written at once (a start or migration
        waiting for them holds the pass that would write it)."""
        message = "; ".join(pending[n] for n in sorted(pending))
        changed = message != managed.facts.pending
        managed.set(pending=message)
        if message:
            managed.events.emit(EventReason.WORKERS_PENDING, message, warning=True)
        if write and changed:
            managed.write()
