"""The Kubernetes adapter's reconcile loop (`control.reconciler.TopologyReconciler`) and its one status writer,
over in-memory fakes: a custom-objects API that applies merge patches to a stored resource and counts
them, a core API that records events, and controllers over the fakes of `tests/support/fakes.py`. No kopf, no
cluster, no Redis; a fake clock, so backoff and settling are exact."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest

from elastream.control.controller import TopologyController
from elastream.control.managed import ManagedTopology
from elastream.control.pacing import LoopSettings
from elastream.control.reconciler import TopologyReconciler
from elastream.control.resource_api import KubernetesEvents
from elastream.control.status_writer import StatusWriter, merge_patch, stable_part
from elastream.core.status import CONDITION_MESSAGE_MAX_BYTES
from elastream.core.topology import Topology, topology_prefix
from support.fakes import (
    FakeBackend,
    FakeCheckpoints,
    FakeClock,
    FakeMigrator,
    FakeSavepoints,
    ListFeed,
    SimulatedMetrics,
)
from support.manifests import edge, manifest, sink, src, work
from support.operator_fakes import apply_merge_patch

# ------------------------------------------------------------------------------------------- the fakes


class FakeCustomApi:
    """One StreamTopology: status patches are applied and counted, spec patches raise the generation."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.status_patches: list[dict[str, Any]] = []
        #: the whole status after each patch: what a reader (`kubectl get -o json`) could have seen
        self.statuses: list[dict[str, Any]] = []
        self.down = False
        #: the field manager of each spec patch (the autoscaler names itself, so GitOps tools can ignore it)
        self.spec_managers: list[str | None] = []

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body, **_) -> None:
        if self.down:
            raise ConnectionRefusedError("API server away")
        self.status_patches.append(copy.deepcopy(body["status"]))
        apply_merge_patch(self.body.setdefault("status", {}), body["status"])
        self.statuses.append(copy.deepcopy(self.body["status"]))

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body, **kw) -> dict[str, Any]:
        if "spec" in body:
            self.spec_managers.append(kw.get("field_manager"))
            apply_merge_patch(self.body["spec"], body["spec"])
            self.body["metadata"]["generation"] += 1
        apply_merge_patch(self.body["metadata"], body.get("metadata", {}))
        return copy.deepcopy(self.body)


class FakeCoreApi:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def create_namespaced_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.events.append(event)


class Clock(FakeClock):
    """Time that moves only when the test moves it (`FakeClock.now` moves on by 0.5 s at each read)."""

    def now(self) -> float:
        return self.t


class Analyzer:
    def start_warm_up(self, topology: Topology) -> None:
        pass


def resource(nodes: int = 3, **spec: Any) -> dict[str, Any]:
    document = manifest(
        [src("s", 2, rate=4000), work("parse", 2, costMs=2), sink("z", 1, costMs=0.05)],
        [edge("s", "parse"), edge("parse", "z")],
        nodes=nodes,
        slotsPerNode=6,
    )
    document["metadata"].update(namespace="default", uid="u-1", generation=1)
    document["spec"].update(spec)
    return document


class World:
    """A reconciler over fakes, and the resource it serves."""

    def __init__(self, nodes: int = 3, **spec: Any) -> None:
        self.body = resource(nodes, **spec)
        self.custom, self.core = FakeCustomApi(self.body), FakeCoreApi()
        self.clock = Clock()
        self.backends: list[FakeBackend] = []
        #: the "Redis" of this world: the epoch key lives here
        self.keys: dict[str, str] = {}
        self.migrators: list[FakeMigrator] = []
        self.checkpoints: list[FakeCheckpoints] = []
        #: the nodes whose worker pod exists (pods outlive an operator: share it with the next World)
        self.pods: set[str] = set()
        #: checkpoints in "Redis" (outlive an operator too)
        self.checkpoint_keys: dict[str, str] = {}
        #: the spec the pods run (the topology's ConfigMap: outlives an operator too); None: no ConfigMap
        self.running_doc: dict[str, Any] | None = None
        #: the rest of that ConfigMap (the record of an upgrade in flight)
        self.configmap: dict[str, Any] = {}
        #: images whose pods never start (their restore fails, as a pod stuck in ErrImagePull times out)
        self.broken_images: set[str] = set()
        #: the spec.image of every controller built, in order ("" for none)
        self.built_images: list[str] = []
        #: savepoints in "Redis" (`FakeSavepoints`); the topology's checkpoint and epoch keys are its store
        self.savepoints = FakeSavepoints()
        self.savepoints.stores[topology_prefix("default", "t")] = self.checkpoint_keys
        self.savepoints.epochs[topology_prefix("default", "t")] = self.keys
        self.topologies = TopologyReconciler(
            redis_client=None,  # type: ignore[arg-type]
            redis_url="redis://unused",
            core_api=self.core,
            custom_api=self.custom,
            analyzer=Analyzer(),
            build=self.build,
            running_schedule=lambda topology: None,
            running_spec=lambda topology, metadata: (self.running_doc, self.configmap.get("previous")),
            clock=self.clock,
            savepoint_service=self.savepoints,
        )

    def build(self, owner: TopologyReconciler, topology: Topology, metadata: Any, managed: ManagedTopology):
        self.built_images.append(str(topology.spec.get("image") or ""))
        backend = FakeBackend()
        backend.keys = self.keys  # type: ignore[attr-defined]
        backend.workers = self.pods
        backend.configmap = self.configmap
        migrator = FakeMigrator(backend)
        if topology.spec.get("image") in self.broken_images:
            migrator.recover_failures = 1_000_000
            migrator.recover_error = f"nodes node-0 not ready after 180 s (image {topology.spec['image']})"
        checkpoints = FakeCheckpoints(backend, self.checkpoint_keys)
        self.running_doc = {"spec": copy.deepcopy(dict(topology.spec))}  # what the backend's ConfigMap says
        self.backends.append(backend)
        self.migrators.append(migrator)
        self.checkpoints.append(checkpoints)
        return TopologyController(
            topology=topology,
            backend=backend,  # type: ignore[arg-type]
            metrics=SimulatedMetrics(topology, backend),
            migrator=migrator,
            feed=ListFeed(),
            requests=_NoRequests(),
            status=managed,
            events=managed.events,
            clock=self.clock,
            on_nodes_changed=lambda nodes: managed.autoscaled(nodes),
            epochs=DictEpochs(self.keys),
            expected_epoch=managed.state_epoch,
            checkpoints=checkpoints,
        )

    def rewire(self, **changes: Any) -> None:
        """Another reconciler with these settings or wiring, over the same topologies (a reconciler's parts are
        built once, from what it was made with)."""
        self.topologies = dataclasses.replace(self.topologies, **changes)

    def patch_spec(self, **spec: Any) -> None:
        self.body["spec"].update(spec)
        self.body["metadata"]["generation"] += 1

    def reconcile(self) -> float:
        return self.topologies.reconcile(copy.deepcopy(self.body))

    def run_for(self, seconds: float) -> None:
        """Passes as the daemon makes them, for `seconds` of fake time."""
        end = self.clock.t + seconds
        while self.clock.t < end:
            delay = self.reconcile()
            self.clock.t += max(0.05, delay)

    @property
    def backend(self) -> FakeBackend:
        return self.backends[-1]

    @property
    def migrator(self) -> FakeMigrator:
        return self.migrators[-1]

    @property
    def status(self) -> dict[str, Any]:
        return self.body.get("status", {})

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.core.events]

    def redis_away(self) -> Callable[[], None]:
        """The running controller's reads of Redis are refused from now on; returns what brings Redis back."""
        controller = self.topologies.topologies["default/t"].controller
        assert controller is not None
        feed, controller.feed = controller.feed, _AwayFeed()

        def back() -> None:
            controller.feed = feed

        return back

    def starts_fail(self) -> list[int]:
        """Every controller built from now on fails to start (a quota refuses its pods); returns the list a
        build appends to (its length: the builds so far)."""
        calls: list[int] = []

        def broken(owner, topology, metadata, managed):
            controller = self.build(owner, topology, metadata, managed)
            calls.append(1)

            def no_start(schedule=None):
                from elastream.core.ports import BackendError

                raise BackendError("pod t-node-0 not created: Forbidden: exceeded quota: pods")

            controller.start = no_start  # type: ignore[method-assign]
            return controller

        self.rewire(build=broken)
        return calls


class _AwayFeed(ListFeed):
    def read_since(self, since_ts=None):
        import redis

        raise redis.ConnectionError("Connection refused")


EPOCHS = itertools.count(1)


class DictEpochs:
    def __init__(self, keys: dict[str, str]) -> None:
        self.keys = keys

    def read(self) -> str | None:
        return self.keys.get("epoch")

    def create(self) -> str:
        self.keys["epoch"] = f"e{next(EPOCHS)}"
        return self.keys["epoch"]


class _NoRequests:
    def take(self) -> None:
        return None


def restarted_operator(world: World, adopting: bool = False) -> World:
    """A new operator over the same resource, pods, Redis and ConfigMap (the old one is gone); `adopting`: it
    finds in Redis the schedule the pods run."""
    again = World(3)
    again.body, again.custom.body = world.body, world.body
    again.pods, again.keys, again.checkpoint_keys = world.pods, world.keys, world.checkpoint_keys
    again.running_doc, again.configmap = world.running_doc, world.configmap
    again.broken_images = world.broken_images
    again.rewire(custom_api=world.custom)
    if adopting:
        schedule = world.backend.schedule
        again.rewire(running_schedule=lambda topology: schedule)
    return again


def running(nodes: int = 3, **spec: Any) -> World:
    world = World(nodes, **spec)
    world.reconcile()
    assert world.status["phase"] == "Running" and world.status["nodes"] == nodes
    return world


# --------------------------------------------------------------------------------------------- the loop


def test_a_new_resource_is_started_and_reported_running() -> None:
    world = running(3)
    assert world.status["readyNodes"] == 3 and world.status["observedGeneration"] == 1
    assert world.condition("Available")["status"] == "True"
    assert world.status["appliedParallelism"] == {"s": 2, "parse": 2, "z": 1}


def test_a_patch_of_spec_nodes_migrates_once_the_spec_settled() -> None:
    world = running(3)
    world.patch_spec(nodes=4)
    assert world.reconcile() <= world.topologies.pacing.settle_s  # too fresh: wait for the burst to end
    assert world.migrator.applied == []
    world.run_for(2.0)
    assert [len(s.nodes) for s in world.migrator.applied] == [4]
    assert world.status["nodes"] == 4 and world.status["phase"] == "Running"
    assert world.status["lastScaling"]["outcome"] == "succeeded"


def test_a_burst_of_patches_converges_on_the_last_value_without_the_stale_ones() -> None:
    world = running(3)
    for nodes in (3, 4, 2, 5):  # within a second
        world.patch_spec(nodes=nodes)
        world.reconcile()
        world.clock.t += 0.2
    world.run_for(5.0)
    assert [len(s.nodes) for s in world.migrator.applied] == [5]
    for nodes in (4, 2, 5):  # and back to what runs: nothing moves at all
        world.patch_spec(nodes=nodes)
        world.reconcile()
    world.run_for(5.0)
    assert [len(s.nodes) for s in world.migrator.applied] == [5]


def test_a_failed_scale_out_leaves_the_old_schedule_running_and_retries_with_backoff() -> None:
    world = running(3)
    world.migrator.outcome = "raise"  # the new pods never become ready
    world.patch_spec(nodes=5)
    world.run_for(2.0)
    assert world.status["phase"] == "Running" and world.status["nodes"] == 3 and world.status["readyNodes"] == 3
    assert world.condition("Available")["status"] == "True"
    degraded = world.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ScalingFailed"
    assert "not ready after 60 s" in degraded["message"]
    assert world.status["lastScaling"]["outcome"] == "failed"
    assert "ScalingBackoff" in world.reasons() and "ScalingFailed" in world.reasons()
    assert world.reasons().count("ScalingFailed") == 1  # the same failure again is not posted again
    world.run_for(3.0)  # inside the first backoff (5 s): not retried
    assert world.reasons().count("ScalingBackoff") == 1
    world.run_for(60.0)  # 5, 10, 20 s later: three more tries, not thirty
    assert world.reasons().count("ScalingBackoff") == 4
    world.migrator.outcome = "succeeded"
    world.patch_spec(nodes=4)  # a new value is tried at once (after settling), not after the backoff
    world.run_for(2.0)
    assert world.status["nodes"] == 4 and world.condition("Degraded")["status"] == "False"


@pytest.mark.parametrize("outcome", ["succeeded", "raise"])
def test_a_finished_scaling_shows_its_record_phase_and_conditions_in_one_write(outcome: str) -> None:
    # a reader that waits for lastScaling's outcome must find the phase and Degraded that go with it
    # (and, after a failure, the events that say what happens next)
    world = running(3)
    world.migrator.outcome = outcome
    events_at_write: list[list[str]] = []  # the events posted by the time of each status write
    patch = world.custom.patch_namespaced_custom_object_status

    def recording(*args: Any, **kwargs: Any) -> None:
        patch(*args, **kwargs)
        events_at_write.append(world.reasons())

    world.custom.patch_namespaced_custom_object_status = recording  # type: ignore[method-assign]
    world.patch_spec(nodes=5)
    world.run_for(2.0)
    seen = list(zip(world.custom.statuses[-len(events_at_write) :], events_at_write, strict=True))
    assert any(s.get("phase") == "Scaling" for s, _ in seen)
    finished = [(s, e) for s, e in seen if (s.get("lastScaling") or {}).get("outcome") in ("succeeded", "failed")]
    assert finished, seen
    for status, events in finished:
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        failed = status["lastScaling"]["outcome"] == "failed"
        assert status["phase"] == "Running", status
        assert (degraded["status"], degraded.get("reason") == "ScalingFailed") == (
            ("True", True) if failed else ("False", False)
        ), degraded
        assert not failed or {"ScalingFailed", "ScalingBackoff"} <= set(events), events


def test_a_scale_out_undone_before_its_retry_clears_the_failure() -> None:
    world = running(3)
    world.migrator.outcome = "raise"
    world.patch_spec(nodes=5)
    world.run_for(2.0)
    world.patch_spec(nodes=3)
    world.run_for(2.0)
    assert world.condition("Degraded")["status"] == "False" and world.status["nodes"] == 3


def test_an_idle_topology_writes_its_status_a_few_times_a_minute_at_most() -> None:
    world = running(3)
    controller = world.topologies.topologies["default/t"].controller
    assert controller is not None
    controller.live.throughput = lambda: world.clock.t % 97  # type: ignore[method-assign]  # moves every pass
    before = len(world.custom.status_patches)
    world.run_for(60.0)
    # only the rates change: they are written every 15 s, not every pass (30 passes here)
    assert 3 <= len(world.custom.status_patches) - before <= 5


def test_a_scaling_writes_its_status_a_handful_of_times() -> None:
    world = running(3)
    world.run_for(1.0)
    before = len(world.custom.status_patches)
    world.patch_spec(nodes=4)
    world.run_for(3.0)
    writes = world.custom.status_patches[before:]
    assert 2 <= len(writes) <= 5
    assert any(w.get("phase") == "Scaling" for w in writes) and world.status["phase"] == "Running"


def test_a_vertex_degree_changed_in_the_spec_is_migrated_to_once() -> None:
    world = running(3)
    vertices = copy.deepcopy(world.body["spec"]["vertices"])
    vertices[1]["parallelism"] = 4
    world.patch_spec(vertices=vertices)
    world.run_for(3.0)
    assert world.migrator.applied[-1].parallelism()["parse"] == 4
    assert world.status["appliedParallelism"]["parse"] == 4
    applied = len(world.migrator.applied)
    world.run_for(5.0)  # Stela's later choices are not undone: only a change of the spec moves degrees
    assert len(world.migrator.applied) == applied


def test_the_autoscalers_own_write_of_spec_nodes_is_not_undone_by_the_stale_resource() -> None:
    world = running(3)
    managed = world.topologies.topologies["default/t"]
    stale = copy.deepcopy(world.body)
    managed.autoscaled(4)  # the controller moved to 4 and wrote spec.nodes
    world.backend.schedule = world.backend.schedule  # what runs is unchanged in this fake
    assert world.body["spec"]["nodes"] == 4 and managed.expect_generation == 2
    # as its own field manager: Argo CD's ignoreDifferences.managedFieldsManagers names it (docs/operations.md)
    assert world.custom.spec_managers == ["elastream-autoscaler"]
    world.clock.t += 5
    world.topologies.reconcile(stale)  # the watch has not shown the write yet
    assert world.migrator.applied == []


def test_an_invalid_spec_is_failed_once_with_the_field_named_and_no_retry_storm() -> None:
    world = World(3, slotsPerNode=1)  # 5 executors on 3 nodes of 1 slot
    world.run_for(10.0)
    assert world.status["phase"] == "Failed"
    degraded = world.condition("Degraded")
    assert degraded["reason"] == "InvalidSpec" and "spec." in degraded["message"]
    assert world.reasons().count("InvalidSpec") == 1
    assert world.backends == []  # nothing was started
    world.patch_spec(slotsPerNode=6)
    world.run_for(2.0)
    assert world.status["phase"] == "Running"


@pytest.mark.parametrize("hostile", ["deep", "bomb", "huge"])
def test_a_hostile_spec_from_the_api_server_is_one_invalid_spec_line_not_an_internal_error(
    hostile: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the kopf path gets the spec as a dict: too deep for a recursive comparison, a shared-list bomb, or
    # enough problems to overflow a condition message; each is one InvalidSpec condition, nothing started
    world = World(3)
    if hostile == "deep":

        def deep() -> dict[str, Any]:
            value: dict[str, Any] = {}
            for _ in range(5000):  # deeper than Python's recursion limit: a recursive walk or == would fail
                value = {"a": value}
            return value

        # each pass gets a new body, as kopf decodes one from every event (deepcopy itself would recurse)
        world.reconcile = lambda: world.topologies.reconcile(  # type: ignore[method-assign]
            {**world.body, "spec": {**world.body["spec"], "placement": {"affinity": deep()}}}
        )
    elif hostile == "bomb":
        bomb: list[Any] = ["lol"]
        for _ in range(9):
            bomb = [bomb] * 10
        world.patch_spec(placement={"tolerations": bomb})
    else:
        world.patch_spec(vertices=[{"name": "v" * 60 + str(i), "logic": {"builtin": "?" * 400}} for i in range(128)])
    world.run_for(65.0)  # several passes: an invalid spec is looked at again every 30 s
    degraded = world.condition("Degraded")
    assert world.status["phase"] == "Failed", degraded
    assert degraded["reason"] == "InvalidSpec" and degraded["message"].startswith(("spec.", "manifest: "))
    assert "internal error" not in degraded["message"] and "\n" not in degraded["message"]
    assert len(degraded["message"].encode()) <= CONDITION_MESSAGE_MAX_BYTES
    assert world.backends == []
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []  # no pass failed


def test_redis_away_shows_in_progressing_then_degrades_past_the_grace_and_recovers_by_itself() -> None:
    world = running(3)
    redis_back = world.redis_away()
    world.run_for(10.0)
    assert world.condition("Progressing")["reason"] == "RedisUnavailable"
    assert world.status["phase"] == "Running"
    world.run_for(60.0)
    assert world.status["phase"] == "Degraded" and world.condition("Degraded")["reason"] == "RedisUnavailable"
    assert world.reasons().count("RedisUnavailable") == 1
    redis_back()
    world.run_for(3.0)
    assert world.status["phase"] == "Running" and world.condition("Degraded")["status"] == "False"
    assert "RedisAvailable" in world.reasons()


def test_the_api_server_away_loses_no_status_change() -> None:
    world = running(3)
    world.custom.down = True
    world.patch_spec(nodes=4)
    world.run_for(3.0)
    assert world.backend.schedule is not None and len(world.backend.schedule.nodes) == 4  # workers moved on
    world.custom.down = False
    world.run_for(2.0)
    assert world.status["nodes"] == 4 and world.status["lastScaling"]["toNodes"] == 4


def test_a_failed_start_backs_off_and_says_so() -> None:
    world = World(3)
    calls = world.starts_fail()
    world.run_for(30.0)
    assert 2 <= len(calls) <= 4  # 5, 10, 20 s apart: not one per pass
    assert world.status["phase"] == "Pending"
    assert world.reasons().count("StartFailed") == len(calls)
    assert "exceeded quota" in world.condition("Degraded")["message"]


def test_a_spec_image_outside_the_allow_list_is_invalid_and_creates_nothing() -> None:
    world = World(3, image="evil.example/miner:1")
    world.rewire(allowed_images=("registry.example.com/streams/",))
    world.run_for(65.0)
    assert world.backends == []  # never built: no pod, no ConfigMap, no Secret
    assert world.status["phase"] == "Failed"
    available = world.condition("Available")
    assert available["reason"] == "InvalidSpec"
    assert available["message"] == (
        "spec.image: 'evil.example/miner:1' is not an allowed worker image (the operator allows "
        "registry.example.com/streams/); use an image the list allows, or have the operator's "
        "worker.allowedImages extended"
    )
    assert world.reasons() == ["InvalidSpec"]  # once, not once per pass
    world.patch_spec(image="registry.example.com/streams/worker:1.0")
    world.run_for(2.0)
    assert world.status["phase"] == "Running" and len(world.backends) == 1


def test_an_object_in_the_way_is_degraded_object_not_owned_and_cleared_once_it_is_gone() -> None:
    from elastream.core.ports import NotOwned

    world = World(3)
    refusal = "Secret default/t-redis exists and is not this StreamTopology's (it has no owner); " + (
        "the operator leaves it untouched: delete or rename it"
    )
    in_the_way = [True]

    def blocked(owner, topology, metadata, managed):
        controller = world.build(owner, topology, metadata, managed)
        start = controller.start

        def refuse_or_start(schedule=None):
            if in_the_way[0]:
                raise NotOwned(refusal)
            start(schedule)

        controller.start = refuse_or_start  # type: ignore[method-assign]
        return controller

    world.rewire(build=blocked)
    world.run_for(30.0)
    assert world.status["phase"] == "Degraded"
    degraded = world.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ObjectNotOwned"
    assert degraded["message"] == refusal
    assert "ObjectNotOwned" in world.reasons() and "StartFailed" not in world.reasons()
    in_the_way[0] = False  # the user deleted it: the next retry starts the topology
    world.run_for(400.0)
    assert world.status["phase"] == "Running" and world.condition("Degraded")["reason"] == "AsExpected"


def test_delete_completes_while_a_pass_holds_the_topology() -> None:
    world = running(3)
    world.rewire(loop=LoopSettings(delete_wait_s=0.2))
    managed = world.topologies.topologies["default/t"]
    managed.lock.acquire()  # a migration in flight
    deleted = threading.Event()

    def delete() -> None:
        world.topologies.remove("default", "t")
        deleted.set()

    world.rewire(redis_client=_NoKeys())
    thread = threading.Thread(target=delete)
    thread.start()
    thread.join(timeout=10.0)
    assert deleted.is_set() and "workers stopped" in world.backend.log
    assert world.migrator.cancelled.is_set()
    managed.lock.release()


def test_every_pass_checks_the_topologys_redis_user_so_a_lost_one_is_set_again() -> None:
    world = running(3)
    before = world.backend.redis_user_checks
    world.run_for(10.0)
    assert world.backend.redis_user_checks - before >= 4  # one check per pass (a tick every 2 s)


def test_acl_commands_refused_are_degraded_redis_user_refused_with_the_fix_and_one_event() -> None:
    from elastream.store.acl import ACL_FIX, AclRefused

    world = running(3)
    refusal = AclRefused(
        f"Redis refused ACL GETUSER (this user has no permissions to run the 'acl|getuser' command): {ACL_FIX}"
    )
    world.backend.redis_user_error = refusal
    world.run_for(20.0)
    degraded = world.condition("Degraded")
    assert world.status["phase"] == "Degraded"
    assert degraded["status"] == "True" and degraded["reason"] == "RedisUserRefused"
    assert "+acl" in degraded["message"] and "--redis-topology-users off" in degraded["message"]
    assert world.reasons().count("RedisUserRefused") == 1  # said once, not every pass
    assert "internal error" not in str(world.status)  # never a traceback's text
    world.backend.redis_user_error = None  # the operator's user was granted +acl
    world.run_for(4.0)
    assert world.status["phase"] == "Running" and world.condition("Degraded")["reason"] == "AsExpected"


def test_a_start_refused_acl_commands_starts_no_worker_and_says_the_fix() -> None:
    from elastream.store.acl import ACL_FIX, AclRefused

    world = World(3)

    def refusing(owner, topology, metadata, managed):
        controller = world.build(owner, topology, metadata, managed)

        def refuse(schedule=None):
            raise AclRefused(f"Redis refused ACL SETUSER (unknown command 'ACL'): {ACL_FIX}")

        controller.start = refuse  # type: ignore[method-assign]
        return controller

    world.rewire(build=refusing)
    world.run_for(30.0)
    assert world.status["phase"] == "Degraded" and world.condition("Degraded")["reason"] == "RedisUserRefused"
    assert "RedisUserRefused" in world.reasons() and "StartFailed" not in world.reasons()
    assert all(not b.started for b in world.backends)


class _NoKeys:
    def __init__(self) -> None:
        self.commands: list[tuple[str, ...]] = []

    def scan_iter(self, match: str, count: int):
        return iter(())

    def execute_command(self, *args: str) -> None:
        self.commands.append(args)


class _Keys:
    """Records the patterns it is scanned for and holds one key under each prefix form."""

    def __init__(self, *keys: str) -> None:
        self.keys = set(keys)
        self.patterns: list[str] = []
        self.commands: list[tuple[str, ...]] = []

    def scan_iter(self, match: str, count: int):
        import fnmatch

        self.patterns.append(match)
        return iter([k for k in sorted(self.keys) if fnmatch.fnmatchcase(k, match.replace("\\", ""))])

    def unlink(self, *keys: str) -> int:
        self.keys -= set(keys)
        return len(keys)

    def execute_command(self, *args: str) -> None:
        self.commands.append(args)


def test_delete_without_a_controller_removes_the_keys_under_the_braced_prefix() -> None:
    # a resource deleted before any controller ran: the keys are found by the prefix alone, which must be
    # the topology's (hash-tagged) one, not the unbraced form of before
    world = running(3)
    world.topologies.topologies.pop("default/t")
    client = _Keys("elastream:{default/t}:schedule", "elastream:default/t:old", "elastream:{default/u}:schedule")
    world.rewire(redis_client=client)
    world.topologies.remove("default", "t")
    assert client.keys == {"elastream:default/t:old", "elastream:{default/u}:schedule"}
    # and its Redis user, before the keys (its clients are disconnected with it)
    assert client.commands == [("ACL", "DELUSER", "elastream.default.t")]


# ------------------------------------------------------------------------------------------ the writer


def test_merge_patch_replaces_records_and_drops_what_is_gone() -> None:
    old = {"phase": "Scaling", "lastScaling": {"outcome": "pending", "reason": "x", "plan": {"a": 1}}}
    new = {"phase": "Running", "lastScaling": {"outcome": "succeeded", "plan": {"a": 1}}}
    assert merge_patch(old, new) == {"phase": "Running", "lastScaling": {"outcome": "succeeded", "reason": None}}
    assert merge_patch(new, new) == {}


def test_the_writer_sends_changes_at_once_and_rates_alone_every_15_s() -> None:
    sent: list[dict[str, Any]] = []
    clock = Clock()
    writer = StatusWriter(sent.append, clock=lambda: clock.t)
    writer.prime({})
    vertices = [{"name": "a", "parallelism": 1, "processingRate": 1.0}]
    status = {"phase": "Running", "throughput": 10.0, "vertices": vertices}
    assert writer.write(status) and len(sent) == 1
    assert not writer.write({**status, "throughput": 11.0})
    clock.t += 16
    assert writer.write({**status, "throughput": 12.0}) and sent[-1] == {"throughput": 12.0}
    assert writer.write({**status, "throughput": 12.0, "phase": "Scaling"})  # news: at once
    assert stable_part(status) == {"phase": "Running", "vertices": [{"name": "a", "parallelism": 1}]}


def test_a_failed_write_is_sent_again_with_the_next_change() -> None:
    sent: list[dict[str, Any]] = []
    failing = [True]

    def send(patch: dict[str, Any]) -> None:
        if failing[0]:
            raise ConnectionRefusedError("away")
        sent.append(patch)

    writer = StatusWriter(send)
    writer.prime({"phase": "Running"})
    assert not writer.write({"phase": "Scaling"})
    failing[0] = False
    assert writer.write({"phase": "Scaling"}) and sent == [{"phase": "Scaling"}]


def test_events_of_the_same_fact_are_posted_once_within_the_repeat_window() -> None:
    core = FakeCoreApi()
    events = KubernetesEvents(core, resource(), repeat_s=300.0)
    for _ in range(3):
        events.emit("WorkersPending", "pod t-node-3 cannot be scheduled", warning=True)
    events.emit("WorkersPending", "pod t-node-4 cannot be scheduled", warning=True)
    assert [e["message"] for e in core.events] == [
        "pod t-node-3 cannot be scheduled",
        "pod t-node-4 cannot be scheduled",
    ]
    assert core.events[0]["type"] == "Warning"


def test_an_event_suppressed_within_the_repeat_window_is_posted_again_after_it_on_the_loops_clock() -> None:
    core, clock = FakeCoreApi(), Clock()
    events = KubernetesEvents(core, resource(), repeat_s=300.0, clock=clock)
    events.emit("WorkersPending", "pod t-node-3 cannot be scheduled", warning=True)
    clock.t += 299
    events.emit("WorkersPending", "pod t-node-3 cannot be scheduled", warning=True)
    clock.t += 2
    events.emit("WorkersPending", "pod t-node-3 cannot be scheduled", warning=True)
    assert len(core.events) == 2


def test_an_events_timestamps_are_the_loops_clocks_wall_time() -> None:
    core, clock = FakeCoreApi(), Clock()
    clock.t = 1_700_000_000.75  # 2023-11-14T22:13:20.75Z: written to the second
    KubernetesEvents(core, resource(), clock=clock).emit("Scaled", "3 -> 4 nodes")
    assert core.events[0]["firstTimestamp"] == core.events[0]["lastTimestamp"] == "2023-11-14T22:13:20Z"


@pytest.mark.timeout(30)
def test_a_delete_while_redis_is_away_gives_up_at_its_bound_on_the_loops_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The keys' deletion retries Redis for 30 s on the loop's clock: a retry that slept with `time.sleep`
    would hold this test for those 30 s of real time at least."""
    import redis

    class Away:
        def scan_iter(self, **_: Any) -> Any:
            raise redis.ConnectionError("refused")

    clock = Clock()
    topologies = TopologyReconciler(
        redis_client=Away(),  # type: ignore[arg-type]
        redis_url="redis://unused",
        core_api=FakeCoreApi(),
        custom_api=None,
        analyzer=Analyzer(),
        loop=LoopSettings(topology_users=False),
        clock=clock,
    )
    topologies.remove("default", "t")
    assert clock.t >= 1030.0
    assert "not deleted (Redis: refused); they stay under" in caplog.text


@pytest.mark.parametrize("nodes", [1, 4])
def test_kubectl_scale_to_what_runs_moves_nothing(nodes: int) -> None:
    world = running(nodes)
    world.patch_spec(nodes=nodes)
    world.run_for(3.0)
    assert world.migrator.applied == []


# ------------------------------------------------------------------------------------------ state lost


def test_a_redis_emptied_under_a_running_topology_is_state_lost_not_a_silent_restart() -> None:
    world = running(3)
    epoch = world.status["stateEpoch"]
    assert world.keys == {"epoch": epoch}
    world.keys.clear()  # FLUSHALL, a new volume
    world.backend.dead = {"node-1": "worker pod t-node-1 is gone"}  # and a worker dies meanwhile
    world.run_for(10.0)
    assert world.status["phase"] == "Degraded" and world.condition("Degraded")["reason"] == "StateLost"
    assert "restart-from-scratch" in world.condition("Degraded")["message"]
    assert world.migrator.recovered == []  # nothing restarted from the empty store
    assert world.reasons().count("StateLost") == 1
    world.patch_spec(nodes=4)
    world.run_for(5.0)
    assert world.migrator.applied == []  # nor scaled over it


def test_an_operator_restarting_on_an_emptied_redis_does_not_start_the_topology_over() -> None:
    world = running(3)
    world.keys.clear()
    restarted = World(3)
    restarted.body, restarted.custom.body = world.body, world.body  # the resource, with its status
    restarted.reconcile()
    assert world.status["phase"] == "Degraded" and world.condition("Degraded")["reason"] == "StateLost"
    assert restarted.backends[-1].started == []  # no worker started from nothing


def test_restart_from_scratch_answers_state_lost_and_removes_the_annotation() -> None:
    world = running(3)
    old_epoch = world.status["stateEpoch"]
    world.keys.clear()
    world.run_for(3.0)
    world.rewire(redis_client=_NoKeys())
    world.body["metadata"]["annotations"] = {"elastream.dev/restart-from-scratch": "true"}
    world.run_for(3.0)
    assert world.status["phase"] == "Running" and world.status["stateEpoch"] != old_epoch
    assert "workers stopped" in world.backends[0].log and len(world.backends) == 2
    assert "elastream.dev/restart-from-scratch" not in world.body["metadata"]["annotations"]
    assert "StateReset" in world.reasons()


def test_an_internal_error_of_one_pass_is_reported_then_cleared_by_the_next() -> None:
    world = running(3)
    controller = world.topologies.topologies["default/t"].controller
    assert controller is not None
    tick = controller.tick

    def broken() -> None:
        raise RuntimeError("a bug")

    controller.tick = broken  # type: ignore[method-assign]
    world.reconcile()
    degraded = world.condition("Degraded")
    assert degraded["reason"] == "BackendError" and "internal error: RuntimeError: a bug" in degraded["message"]
    controller.tick = tick  # type: ignore[method-assign]
    world.clock.t += 5
    world.reconcile()
    assert world.condition("Degraded")["status"] == "False" and world.status["phase"] == "Running"


def test_the_operator_starts_while_redis_is_away_and_never_logs_its_password(caplog) -> None:
    """Redis restarting beside the operator does not stop it (a crash loop would take the topologies' status
    with it): it starts with a client that connects when Redis is back, and says so without the password."""
    import redis

    from elastream.handlers.main import redis_at_start

    caplog.set_level("WARNING", logger="elastream.operator")
    client = redis_at_start("redis://:s3cret-pw@127.0.0.1:1/0", wait_s=0.3)  # nothing listens on port 1
    assert isinstance(client, redis.Redis)
    assert "starting anyway" in caplog.text and "redis://:***@127.0.0.1:1/0" in caplog.text
    assert "s3cret-pw" not in caplog.text
    with pytest.raises(redis.ConnectionError):
        client.ping()


@pytest.mark.parametrize("url", ["redis://app:s3c/ret@127.0.0.1:1/0", "redis://app:s3cret@127.0.0.1:port/0"])
def test_the_operator_exits_on_a_malformed_redis_url_in_one_line_without_the_password(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # a malformed URL is a configuration error like a refused password: no "starting anyway" with a client
    # that would raise redis-py's ValueError (which quotes pieces of the URL) in a traceback
    from elastream.handlers.main import redis_at_start
    from elastream.store.registry import RedisMisconfigured

    with pytest.raises(RedisMisconfigured) as info:
        redis_at_start(url, wait_s=0.3)
    assert "is not a Redis URL" in str(info.value) and "\n" not in str(info.value)
    assert "s3c" not in str(info.value) + caplog.text


def gitops_conditions(world: World) -> dict[str, tuple[str, str]]:
    return {
        c["type"]: (c["status"], c["reason"])
        for c in world.status["conditions"]
        if c["type"] in ("Ready", "Reconciling", "Stalled")
    }


def test_a_scaling_failing_again_and_again_stalls_and_a_new_value_unstalls_it() -> None:
    world = running(3)
    assert gitops_conditions(world) == {"Ready": ("True", "AsExpected")}
    world.migrator.outcome = "raise"
    world.patch_spec(nodes=5)
    world.run_for(2.0)  # one failure: retried with backoff, still reconciling
    assert gitops_conditions(world) == {"Ready": ("False", "ScalingFailed"), "Reconciling": ("True", "ScalingFailed")}
    world.run_for(40.0)  # 5 and 10 s later: three failures in a row
    assert world.reasons().count("ScalingBackoff") >= 3
    assert gitops_conditions(world) == {"Ready": ("False", "ScalingFailed"), "Stalled": ("True", "ScalingFailed")}
    world.migrator.outcome = "succeeded"
    world.patch_spec(nodes=4)
    world.run_for(2.0)
    assert world.status["nodes"] == 4 and gitops_conditions(world) == {"Ready": ("True", "AsExpected")}


def test_a_start_failing_again_and_again_stalls() -> None:
    world = World(3)
    world.starts_fail()
    world.run_for(1.0)
    assert gitops_conditions(world) == {"Ready": ("False", "BackendError"), "Reconciling": ("True", "StartFailed")}
    world.run_for(30.0)  # 5 and 10 s later: three failures in a row
    assert gitops_conditions(world) == {"Ready": ("False", "StartFailed"), "Stalled": ("True", "StartFailed")}
    assert "exceeded quota" in world.condition("Stalled")["message"]


# ------------------------------------------------------------------------------------ suspend and resume


def suspended(nodes: int = 3) -> World:
    world = running(nodes)
    world.patch_spec(suspend=True)
    world.run_for(1.0)
    assert world.status["phase"] == "Suspended"
    return world


def test_suspend_takes_a_checkpoint_then_stops_the_workers_and_says_suspended() -> None:
    world = running(3)
    world.patch_spec(suspend=True)
    world.reconcile()  # no settling: a suspend is not a burst of scalings
    assert world.backend.log == ["checkpoint ckpt-1", "workers stopped"]  # the checkpoint first, then the stop
    assert world.pods == set()
    status = world.status
    assert (status["phase"], status["nodes"], status["readyNodes"]) == ("Suspended", 0, 0)
    assert {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]} == {
        "Available": ("False", "Suspended"),
        "Progressing": ("False", "Suspended"),
        "Degraded": ("False", "Suspended"),
        "Ready": ("True", "Suspended"),
    }  # no Reconciling, no Stalled: kstatus reads it as Current
    assert "ckpt-1" in world.condition("Ready")["message"]
    assert world.reasons().count("Suspended") == 1
    world.run_for(120.0)  # nothing more happens while suspended: no checkpoint, no recovery, no start
    assert world.backend.log == ["checkpoint ckpt-1", "workers stopped"] and world.migrator.recovered == []
    assert world.reasons().count("Suspended") == 1 and len(world.backends) == 1


def test_resume_restores_the_suspends_checkpoint_by_the_recovery_path() -> None:
    world = suspended(3)
    world.patch_spec(suspend=False)
    world.reconcile()
    assert world.migrator.recovered == [{n: "resuming after a suspend" for n in ("node-0", "node-1", "node-2")}]
    assert world.backend.started == [world.backend.started[0]]  # not started afresh: restored
    assert world.pods == {"node-0", "node-1", "node-2"}
    assert world.status["phase"] == "Running" and world.status["nodes"] == 3
    assert gitops_conditions(world) == {"Ready": ("True", "AsExpected")}
    resumed = [e["message"] for e in world.core.events if e["reason"] == "Resumed"]
    assert resumed == ["resumed from checkpoint ckpt-7: 321 events replayed"]  # the fake restore's report
    world.run_for(30.0)
    assert world.migrator.recovered[1:] == []  # resumed once


def test_scaling_asked_while_suspended_waits_and_applies_on_resume() -> None:
    world = suspended(3)
    controller = world.topologies.topologies["default/t"].controller
    assert controller is not None
    evaluations: list[float] = []
    controller.autoscale = lambda: evaluations.append(1.0)  # type: ignore[method-assign,assignment,return-value]
    world.patch_spec(nodes=5)  # kubectl scale while suspended
    world.patch_spec(scaling={"auto": {"enabled": True, "minNodes": 1, "maxNodes": 8}})
    world.run_for(60.0)
    assert world.migrator.applied == [] and evaluations == []  # recorded, not acted on; no autoscaler
    assert world.status["phase"] == "Suspended" and world.body["spec"]["nodes"] == 5
    world.patch_spec(suspend=False)
    world.reconcile()  # restored to the schedule it had, then migrated to spec.nodes in the same pass
    assert len(world.migrator.recovered) == 1
    assert len(world.migrator.applied) == 1 and len(world.migrator.applied[0].nodes) == 5
    assert world.status["nodes"] == 5 and world.status["phase"] == "Running"


def test_suspend_asked_during_a_scaling_waits_for_it_to_finish() -> None:
    world = running(3)
    migrate = world.migrator.migrate

    def migrate_while_the_user_suspends(schedule, load=None):
        world.patch_spec(suspend=True)  # the patch lands while the migration moves executors
        world.backend.log.append("migration done")
        return migrate(schedule, load)

    world.migrator.migrate = migrate_while_the_user_suspends  # type: ignore[method-assign]
    world.patch_spec(nodes=4)
    world.run_for(5.0)
    assert world.backend.log == ["migration done", "checkpoint ckpt-1", "workers stopped"]
    assert world.status["phase"] == "Suspended"


def test_a_migration_left_unfinished_is_finished_before_the_suspends_checkpoint() -> None:
    world = running(3)
    world.migrator.left = "m-left"  # Redis went away in the middle of it: nobody drives it
    world.patch_spec(suspend=True)
    world.reconcile()
    assert world.migrator.resumed >= 1 and world.migrator.left is None
    assert world.backend.log == ["checkpoint ckpt-1", "workers stopped"]


def test_a_failed_checkpoint_stops_nothing_and_is_retried_with_backoff_then_stalls() -> None:
    world = running(3)
    checkpoints = world.checkpoints[-1]
    checkpoints.failure = "checkpoint ckpt-1 timed out: node-2 did not ack"
    world.patch_spec(suspend=True)
    world.reconcile()
    assert world.pods == {"node-0", "node-1", "node-2"} and "workers stopped" not in world.backend.log
    assert world.status["phase"] == "Running"
    assert gitops_conditions(world) == {"Ready": ("False", "Suspending"), "Reconciling": ("True", "Suspending")}
    assert "did not ack" in world.condition("Progressing")["message"]
    assert world.reasons().count("SuspendBackoff") == 1
    world.run_for(3.0)  # inside the backoff (5 s): not retried
    assert world.reasons().count("SuspendBackoff") == 1
    world.run_for(20.0)  # 5 and 10 s later: three failures in a row
    assert gitops_conditions(world) == {"Ready": ("False", "SuspendFailed"), "Stalled": ("True", "SuspendFailed")}
    assert world.pods == {"node-0", "node-1", "node-2"}  # still nothing stopped
    checkpoints.failure = ""
    world.run_for(30.0)
    assert world.status["phase"] == "Suspended" and world.pods == set()
    assert world.backend.log[-2:] == [f"checkpoint {checkpoints.taken[-1]}", "workers stopped"]


def test_a_suspend_given_up_while_its_checkpoint_fails_leaves_the_topology_running() -> None:
    world = running(3)
    world.checkpoints[-1].failure = "Redis: connection refused"
    world.patch_spec(suspend=True)
    world.run_for(2.0)
    world.patch_spec(suspend=False)
    world.run_for(2.0)
    assert world.status["phase"] == "Running" and gitops_conditions(world) == {"Ready": ("True", "AsExpected")}
    assert world.migrator.recovered == []  # it was never stopped: nothing to restore


def test_suspending_with_every_worker_gone_records_the_last_checkpoint_as_the_resume_point() -> None:
    world = running(3)
    world.checkpoint_keys["ckpt:latest"] = "ckpt-4"  # the last periodic one
    world.backend.dead = {n: f"worker pod t-{n} is gone" for n in ("node-0", "node-1", "node-2")}
    world.patch_spec(suspend=True)
    world.reconcile()
    assert world.checkpoints[-1].taken == []  # none can complete without workers; none is waited for
    assert world.status["phase"] == "Suspended" and "ckpt-4" in world.condition("Ready")["message"]
    assert world.migrator.recovered == []  # no recovery of the dead ones while suspending


def test_an_operator_restarted_in_the_middle_of_a_suspend_checkpoints_and_stops_the_pods() -> None:
    world = running(3)
    world.patch_spec(suspend=True)  # ... and the operator dies before its next pass
    restarted = restarted_operator(world, adopting=True)
    schedule = world.backend.schedule
    restarted.reconcile()
    backend = restarted.backend
    assert backend.started == [schedule]  # the running pods adopted, not started anew ...
    assert backend.log == ["checkpoint ckpt-1", "workers stopped"]  # ... then checkpointed and stopped
    assert world.pods == set() and world.status["phase"] == "Suspended"


def test_an_operator_restarted_while_suspended_starts_nothing_and_resumes_from_the_checkpoint() -> None:
    world = suspended(3)
    restarted = restarted_operator(world, adopting=True)
    restarted.run_for(10.0)
    backend = restarted.backend
    assert backend.started == [] and backend.log == ["assumed"] and restarted.pods == set()
    assert world.status["phase"] == "Suspended" and "ckpt-1" in restarted.condition("Ready")["message"]
    restarted.patch_spec(suspend=False)
    restarted.reconcile()
    assert len(restarted.migrator.recovered) == 1 and restarted.pods == {"node-0", "node-1", "node-2"}
    assert world.status["phase"] == "Running"


def test_a_topology_created_suspended_starts_from_the_beginning_on_resume() -> None:
    world = World(3, suspend=True)
    world.run_for(5.0)
    assert world.status["phase"] == "Suspended" and world.pods == set() and world.backend.started == []
    assert "sources' beginning" in world.condition("Ready")["message"]
    assert world.status["stateEpoch"]  # its state in Redis is proven from the first pass
    world.patch_spec(suspend=False)
    world.reconcile()
    assert len(world.backend.started) == 1 and world.migrator.recovered == []  # never checkpointed: a fresh start
    assert world.checkpoints[-1].discarded == 1  # nothing staged before is committed by the first checkpoint
    assert world.status["phase"] == "Running"


def test_a_redis_emptied_while_suspended_is_state_lost_before_the_resume() -> None:
    world = suspended(3)
    world.keys.clear()
    world.run_for(60.0)
    assert world.condition("Stalled")["reason"] == "StateLost" and world.status["phase"] == "Degraded"
    assert world.reasons().count("StateLost") == 1 and world.pods == set()


def test_resume_on_an_emptied_redis_is_state_lost_not_a_start_from_nothing() -> None:
    world = suspended(3)
    world.keys.clear()  # FLUSHALL while suspended
    world.patch_spec(suspend=False)
    world.run_for(10.0)
    assert world.condition("Stalled")["reason"] == "StateLost"
    assert world.migrator.recovered == [] and world.pods == set()


def test_redis_away_during_resume_is_redis_unavailable_and_retried() -> None:
    import redis

    world = suspended(3)
    recover = world.migrator.recover
    calls = {"n": 0}

    def recover_with_redis_away(failed):
        calls["n"] += 1
        if calls["n"] == 1:
            raise redis.ConnectionError("Error 111 connecting to redis:6379. Connection refused.")
        return recover(failed)

    world.migrator.recover = recover_with_redis_away  # type: ignore[method-assign]
    world.patch_spec(suspend=False)
    world.reconcile()
    assert world.condition("Progressing")["reason"] == "RedisUnavailable"
    assert gitops_conditions(world)["Reconciling"] == ("True", "RedisUnavailable")
    assert world.status["phase"] == "Pending" and world.pods == set()
    world.run_for(10.0)  # the retry after the backoff
    assert world.status["phase"] == "Running" and calls["n"] == 2
    assert gitops_conditions(world) == {"Ready": ("True", "AsExpected")}


def test_an_operator_restarted_after_every_pod_went_restores_the_checkpoint_not_an_empty_start() -> None:
    world = running(3)
    world.checkpoint_keys["ckpt:latest"] = "ckpt-9"  # the last periodic checkpoint
    world.pods.clear()  # a node drain while the operator was away: every worker pod is gone
    restarted = restarted_operator(world, adopting=True)
    restarted.reconcile()
    backend = restarted.backend
    assert backend.started == [] and backend.log == ["assumed"]  # not started empty ...
    assert len(restarted.migrator.recovered) == 1  # ... restored by the recovery's rollback to the checkpoint
    assert restarted.pods == {"node-0", "node-1", "node-2"} and world.status["phase"] == "Running"
    assert "Recovered" in restarted.reasons()


def test_a_suspend_over_a_lost_state_stops_nothing_and_stalls_on_state_lost() -> None:
    world = running(3)
    world.keys.clear()
    world.patch_spec(suspend=True)
    world.run_for(30.0)
    assert world.pods == {"node-0", "node-1", "node-2"} and world.checkpoints[-1].taken == []
    assert world.condition("Stalled")["reason"] == "StateLost" and "SuspendBackoff" not in world.reasons()
