"""Graceful drains without processes or Redis: where a drained node's executors go (`core.drain_plan`), and
the controller's handling of drain requests (`control.controller_drains`) over the in-memory fakes of the controller
tests."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from test_kubernetes_backend import FakeCore, backend, someone_elses
from test_topology_controller import setup

from elastream.control.backends.worker_objects import WorkerPodSettings, worker_pod
from elastream.control.controller_drains import DrainOutcome, DrainRunner
from elastream.core.drain_plan import DrainError, drain_deadline, drain_schedule, refill_schedule
from elastream.core.ports import DrainRequest, NotOwned
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.status import EventReason
from elastream.core.topology import parse_manifest
from elastream.runtime.worker import Worker, WorkerOptions
from support.fakes import FakeBackend, FakeClock, FakeMigrator
from support.manifests import edge, manifest, sink, src


def schedule_of(placement: dict[str, list[str]], slots: int) -> Schedule:
    return Schedule.from_placement(placement, slots)


# ------------------------------------------------------------------------------------------------ core


def test_a_drain_moves_the_nodes_executors_to_the_others_emptiest_first() -> None:
    old = schedule_of({"node-0": ["a#0", "b#0"], "node-1": ["a#1"], "node-2": ["b#1", "c#0", "c#1"]}, 3)
    plan = drain_schedule(old, "node-2")
    assert plan.replacement is None
    assert plan.schedule.nodes == ("node-0", "node-1")
    assert plan.schedule.parallelism() == old.parallelism()  # degrees unchanged
    # node-1 has two free slots, node-0 one: node-1 first, round-robin
    assert plan.schedule.placement() == {"node-0": ["a#0", "b#0", "c#0"], "node-1": ["a#1", "b#1", "c#1"]}
    assert {m["executor"]: m["to"] for m in plan.moves(old)} == {"b#1": "node-1", "c#0": "node-0", "c#1": "node-1"}


def test_a_drain_the_others_cannot_hold_goes_to_one_fresh_node() -> None:
    old = schedule_of({"node-0": ["a#0", "b#0"], "node-1": ["a#1", "b#1"], "node-2": ["c#0"]}, 2)
    plan = drain_schedule(old, "node-1")
    assert plan.replacement == "node-3"
    assert plan.schedule.nodes == ("node-0", "node-3", "node-2")
    assert plan.schedule.executors_on("node-3") == ("a#1", "b#1")
    assert plan.schedule.executors_on("node-0") == old.executors_on("node-0")


def test_a_drain_sends_nothing_to_a_node_waiting_for_its_own() -> None:
    old = schedule_of({"node-0": ["a#0"], "node-1": ["a#1"], "node-2": ["b#0"]}, 3)
    plan = drain_schedule(old, "node-0", avoid=frozenset({"node-1"}))
    assert plan.replacement is None and plan.schedule.executors_on("node-2") == ("a#0", "b#0")
    assert plan.schedule.executors_on("node-1") == ("a#1",)
    # nowhere else to go: a fresh node
    assert drain_schedule(old, "node-0", avoid=frozenset({"node-1", "node-2"})).replacement == "node-3"


def test_draining_the_only_node_starts_a_replacement_and_an_unknown_node_is_refused() -> None:
    old = schedule_of({"node-0": ["a#0"]}, 4)
    assert drain_schedule(old, "node-0").replacement == "node-1"
    with pytest.raises(DrainError, match="node-7 is not in the running schedule"):
        drain_schedule(old, "node-7")


def test_a_refill_takes_executors_from_the_fullest_nodes_onto_a_fresh_one() -> None:
    old = schedule_of({"node-0": ["a#0", "b#0", "c#0"], "node-1": ["a#1", "b#1", "c#1"]}, 3)
    refilled = refill_schedule(old, 3)
    assert refilled.nodes == ("node-0", "node-1", "node-2")
    assert refilled.parallelism() == old.parallelism()
    assert sorted(len(refilled.executors_on(n)) for n in refilled.nodes) == [2, 2, 2]
    assert refill_schedule(old, 2) is old


def test_the_drain_deadline_keeps_a_margin_and_no_grace_means_no_drain() -> None:
    assert drain_deadline(30) == 27
    assert drain_deadline(2) == 0
    assert drain_deadline(0) == 0


# ---------------------------------------------------------------------------------------- the controller


class DictDrains:
    def __init__(self) -> None:
        self.requests: dict[str, DrainRequest] = {}

    def ask(self, node: str, at: float, deadline: float) -> None:
        self.requests[node] = DrainRequest(node, at, deadline)

    def pending(self) -> dict[str, DrainRequest]:
        return dict(self.requests)

    def done(self, node: str) -> None:
        self.requests.pop(node, None)


def started(nodes: int = 3, **options):
    drains = DictDrains()
    _topology, backend, migrator, events, status, _requests, controller = setup(nodes, drains=drains, **options)
    controller.start()
    backend.workers.update(backend.current_schedule().nodes)
    return drains, backend, migrator, events, status, controller


def test_a_drain_request_moves_the_executors_off_by_migration_then_refills_without_a_recovery() -> None:
    drains, backend, migrator, events, status, controller = started(3)
    before = backend.current_schedule()
    now = controller.clock.now()
    drains.ask("node-1", now, now + 20)
    controller.tick()
    drained, refilled = migrator.applied
    assert "node-1" not in drained.nodes and len(drained.nodes) == 2
    assert set(drained.assignment) == set(before.assignment)  # nothing dropped, nothing added
    assert len(refilled.nodes) == 3 and "node-1" not in refilled.nodes
    assert refilled.parallelism() == before.parallelism()
    assert migrator.recovered == []
    assert drains.requests == {}
    record = status.fields["lastDrain"][-1]
    assert record["node"] == "node-1" and record["outcome"] == "succeeded" and record["replayed"] == 0
    assert {m["executor"] for m in record["moves"]} == set(before.executors_on("node-1"))
    assert record["refill"]["outcome"] == "succeeded" and record["refill"]["nodes"] == ["node-3"]
    assert [r for r, _, _ in events.events].count(EventReason.DRAINED) == 2
    assert controller.topology.nodes == 3


def test_a_drain_is_taken_before_the_recovery_and_a_departed_node_is_not_lost() -> None:
    drains, backend, migrator, _events, status, controller = started(2)
    now = controller.clock.now()
    drains.ask("node-0", now, now + 20)
    controller.tick()
    # the drained worker exits: its node is in no schedule any more, so nothing is failed or recovered
    assert "node-0" not in backend.current_schedule().nodes
    controller.tick()
    assert migrator.recovered == [] and "lastRecovery" not in status.fields


def test_requests_for_a_dead_a_departed_or_a_late_worker_are_dropped_for_the_recovery() -> None:
    drains, backend, migrator, events, _status, controller = started(3)
    now = controller.clock.now()
    backend.dead = {"node-0": "worker pod t-node-0 is gone"}
    drains.ask("node-0", now, now + 20)  # died mid-drain: rolled back
    drains.ask("node-9", now, now + 20)  # not in the schedule
    drains.ask("node-2", now - 30, now - 1)  # past its deadline
    controller.tick()
    assert migrator.applied == [] and drains.requests == {}
    assert migrator.recovered == [{"node-0": "worker pod t-node-0 is gone"}]
    failures = [m for r, m, _ in events.events if r == EventReason.DRAIN_FAILED]
    assert any("node-0: its worker died" in m for m in failures)
    assert any("node-2: its drain request came too late" in m for m in failures)


def test_a_failed_drain_is_tried_again_while_the_worker_waits() -> None:
    drains, _backend, migrator, events, status, controller = started(3)
    now = controller.clock.now()
    drains.ask("node-2", now, now + 20)
    migrator.outcome = "raise"
    controller.tick()
    assert status.fields["lastDrain"][-1]["outcome"] == "failed"
    assert "node-2" in drains.requests  # kept: tried again on the next tick
    assert any(r == EventReason.DRAIN_FAILED for r, _, _ in events.events)
    migrator.outcome = "succeeded"
    controller.tick()
    assert status.fields["lastDrain"][-1]["outcome"] == "succeeded" and drains.requests == {}


def test_one_drain_per_tick_the_oldest_first() -> None:
    drains, backend, _migrator, _events, status, controller = started(3)
    now = controller.clock.now()
    drains.ask("node-2", now + 1, now + 20)
    drains.ask("node-0", now, now + 20)
    controller.tick()
    first = status.fields["lastDrain"][-1]
    assert first["node"] == "node-0" and set(drains.requests) == {"node-2"}
    assert all(m["to"] != "node-2" for m in first["moves"])  # it goes next
    assert first["refill"]["outcome"] == "deferred"  # node-2's worker has only its grace period
    assert len(backend.current_schedule().nodes) == 2
    controller.tick()
    second = status.fields["lastDrain"][-1]
    assert second["node"] == "node-2" and drains.requests == {}
    assert second["refill"]["outcome"] == "succeeded" and len(second["refill"]["nodes"]) == 2
    assert len(backend.current_schedule().nodes) == 3  # the count before both drains


def test_a_drain_whose_refill_fails_leaves_the_topology_a_node_short() -> None:
    drains, backend, migrator, events, status, controller = started(3)
    now = controller.clock.now()
    drains.ask("node-1", now, now + 20)
    real = migrator.migrate
    calls = []

    def first_only(schedule: Schedule):
        calls.append(schedule)
        if len(calls) > 1:
            migrator.outcome = "aborted"
        return real(schedule)

    migrator.migrate = first_only  # type: ignore[method-assign]
    controller.tick()
    record = status.fields["lastDrain"][-1]
    assert record["outcome"] == "succeeded" and record["refill"]["outcome"] == "failed"
    assert len(backend.current_schedule().nodes) == 2 and controller.topology.nodes == 2
    assert any(r == EventReason.DRAIN_FAILED and "runs on 2 nodes" in m for r, m, _ in events.events)


def test_a_suspended_topology_takes_no_drain() -> None:
    drains, _backend, migrator, _events, _status, controller = started(2)
    controller.suspended = True
    drains.ask("node-0", controller.clock.now(), controller.clock.now() + 20)
    controller.tick()
    assert migrator.applied == [] and "node-0" in drains.requests


def test_the_initial_schedule_drains_a_full_topology_onto_a_replacement() -> None:
    drains, backend, migrator, _events, status, controller = started(2)
    full = initial_schedule(controller.topology)
    # every slot taken: the executors of node-1 cannot go to node-0
    packed = Schedule(full.assignment, full.nodes, max(len(full.executors_on(n)) for n in full.nodes))
    backend.schedule = packed
    drains.ask("node-1", controller.clock.now(), controller.clock.now() + 20)
    controller.tick()
    (moved,) = migrator.applied
    assert status.fields["lastDrain"][-1]["replacement"] == "node-2" and "refill" not in status.fields["lastDrain"][-1]
    assert moved.executors_on("node-2") == packed.executors_on("node-1")


# ------------------------------------------------------------------------- the drain runner, on its own


def runner(nodes: int = 3) -> tuple[DictDrains, FakeBackend, FakeMigrator, DrainRunner]:
    topology, *_ = setup(nodes)
    backend = FakeBackend()
    backend.start(initial_schedule(topology))
    migrator = FakeMigrator(backend)
    drains = DictDrains()
    return drains, backend, migrator, DrainRunner(drains, backend, migrator, FakeClock())


def test_the_runner_changes_nothing_without_requests_but_forgets_a_deferred_refill() -> None:
    _drains, _backend, migrator, drainer = runner()
    assert drainer.take(None) is None
    assert drainer.take(3) == DrainOutcome(target=None)  # the refill's drain never ran: the next scaling sets it
    assert migrator.applied == []


def test_the_runner_returns_the_drain_then_its_refill_as_outcomes() -> None:
    drains, backend, migrator, drainer = runner(3)
    before = backend.current_schedule()
    drains.ask("node-1", 1000.0, 1020.0)
    drained = drainer.take(None)
    assert drained is not None and drained.record is not None
    assert drained.running == migrator.applied[-1] and "node-1" not in drained.running.nodes
    assert drained.record["outcome"] == "succeeded" and "refill" not in drained.record
    assert (drained.target, drained.refill_to, drained.store_error) == (3, 3, "")
    assert [said.reason for said in drained.said] == [EventReason.DRAINED]
    assert drains.requests == {}  # the request is done: the port's, not the controller's
    refilled = drainer.refill(drained)
    assert refilled.running is not None and len(refilled.running.nodes) == 3
    assert refilled.running.parallelism() == before.parallelism()
    assert refilled.target is None and refilled.refill_to is None
    assert refilled.record is not None and refilled.record["node"] == "node-1"
    assert refilled.record["refill"]["outcome"] == "succeeded" and refilled.record["refill"]["nodes"] == ["node-3"]
    assert "refill" not in drained.record  # the drain's own record is not changed by its refill


def test_the_runner_defers_the_refill_while_another_worker_waits() -> None:
    drains, _backend, _migrator, drainer = runner(3)
    drains.ask("node-0", 1000.0, 1020.0)
    drains.ask("node-2", 1001.0, 1020.0)
    outcome = drainer.take(None)
    assert outcome is not None and outcome.record is not None
    assert outcome.record["node"] == "node-0" and outcome.record["refill"]["outcome"] == "deferred"
    assert (outcome.target, outcome.refill_to) == (3, None)


def test_the_runner_says_a_redis_error_and_keeps_the_request() -> None:
    drains, _backend, migrator, drainer = runner(3)
    drains.ask("node-2", 1000.0, 1020.0)

    def away(schedule: Schedule):
        raise redis.ConnectionError("gone")

    migrator.migrate = away  # type: ignore[method-assign]
    outcome = drainer.take(2)
    assert outcome is not None and outcome.record is not None
    assert outcome.running is None and outcome.target == 2  # nothing moved, the refill's count kept
    assert outcome.store_error == "ConnectionError: gone"
    assert outcome.record["outcome"] == "failed" and outcome.record["reason"] == "Redis: gone"
    assert [(said.reason, said.warning) for said in outcome.said] == [(EventReason.DRAIN_FAILED, True)]
    assert "node-2" in drains.requests


def test_the_runner_drops_requests_it_cannot_carry_out_and_only_says_why() -> None:
    drains, backend, migrator, drainer = runner(3)
    backend.dead = {"node-0": "gone"}
    drains.ask("node-0", 1000.0, 1020.0)
    drains.ask("node-9", 1000.0, 1020.0)
    outcome = drainer.take(None)
    assert outcome is not None and outcome.record is None and outcome.running is None
    assert [said.reason for said in outcome.said] == [EventReason.DRAIN_FAILED]
    assert drains.requests == {} and migrator.applied == []


# ------------------------------------------------------------------------------------- the Kubernetes backend


class FakePolicy:
    """An in-memory PolicyV1Api: PodDisruptionBudgets by name."""

    def __init__(self) -> None:
        self.budgets: dict[str, dict[str, Any]] = {}
        self.patches: list[str] = []

    def read_namespaced_pod_disruption_budget(self, name: str, namespace: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        if name not in self.budgets:
            raise ApiException(status=404)
        return SimpleNamespace(metadata=FakeCore._metadata(self.budgets[name]))

    def create_namespaced_pod_disruption_budget(self, namespace: str, body: dict[str, Any]) -> None:
        self.budgets[body["metadata"]["name"]] = body

    def patch_namespaced_pod_disruption_budget(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.budgets[name]["spec"] = body["spec"]
        self.patches.append(name)


def terminating(core: FakeCore, pods: set[str]) -> None:
    """The pods in `pods` are being deleted (deletionTimestamp set), their containers still running."""
    listed = core.list_namespaced_pod

    def listing(namespace: str, label_selector: str) -> Any:
        result = listed(namespace, label_selector)
        for item in result.items:
            if item.metadata.name in pods:
                item.metadata.deletion_timestamp = "2026-11-26T16:00:00Z"
        return result

    core.list_namespaced_pod = listing  # type: ignore[method-assign]


def test_a_pod_being_deleted_is_alive_until_its_worker_stops_then_failed() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    kube.spawn("node-1")
    terminating(core, {"web-node-1"})
    kube._pods_at = 0.0
    # its worker runs through the grace period (a drain moves its executors off): not failed, still running
    assert kube.failed_nodes() == {} and kube.running_nodes() == {"node-0", "node-1"}
    assert kube.terminating_nodes() == {"node-1"}
    core.phase["web-node-1"] = "Failed"  # killed at the end of its grace period, still in the schedule: lost
    kube._pods_at = 0.0
    assert list(kube.failed_nodes()) == ["node-1"] and kube.running_nodes() == {"node-0"}
    del core.pods["web-node-1"]  # gone
    kube._pods_at = 0.0
    assert "is gone" in kube.failed_nodes()["node-1"]


def test_the_backends_own_stop_sends_stop_first_and_the_pod_s_grace_is_the_setting() -> None:
    kube, core = backend()
    sent: list[tuple[list[str], dict[str, Any]]] = []
    kube.control = lambda schedule: SimpleNamespace(  # type: ignore[method-assign]
        send_nodes=lambda nodes, message: sent.append((list(nodes), dict(message)))
    )
    kube.spawn("node-0")
    kube.stop_nodes(["node-0"])
    assert sent == [(["node-0"], {"type": "stop"})] and core.deleted == ["web-node-0"]
    kube.settings = WorkerPodSettings(termination_grace_s=45)
    pod = worker_pod(kube.topology, "node-0", kube.owner, kube.settings)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 45
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["ELASTREAM_DRAIN_GRACE_S"] == "45"
    off = worker_pod(kube.topology, "node-0", kube.owner, WorkerPodSettings(drains=False))
    assert {e["name"]: e.get("value") for e in off["spec"]["containers"][0]["env"]}["ELASTREAM_DRAIN_GRACE_S"] == "0"


def test_each_topology_gets_a_disruption_budget_of_one_worker_kept_as_it_should_be() -> None:
    kube, _ = backend()
    policy = FakePolicy()
    kube.policy = policy
    kube.preflight()
    budget = policy.budgets["web-workers"]
    assert budget["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert budget["spec"]["maxUnavailable"] == 1
    pod = worker_pod(kube.topology, "node-0", kube.owner, kube.settings)
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "web"
    budget["spec"] = {"maxUnavailable": 0}
    kube.preflight()  # a later pass brings it back
    assert policy.budgets["web-workers"]["spec"]["maxUnavailable"] == 1 and policy.patches == ["web-workers"]
    theirs = someone_elses("web-workers")
    policy.budgets["web-workers"] = theirs
    with pytest.raises(NotOwned, match=r"PodDisruptionBudget default/web-workers exists"):
        kube.ensure_disruption_budget()
    kube.settings = WorkerPodSettings(disruption_budget=False)
    kube.policy = None
    kube.ensure_disruption_budget()  # off: no client needed


# ---------------------------------------------------------------------------------------------- the worker


def worker(grace: float) -> Worker:
    topology = parse_manifest(manifest([src("s", 1), sink("z", 1)], [edge("s", "z")], name="w", nodes=1))
    return Worker(topology, WorkerOptions(node="node-0", redis_url="redis://127.0.0.1:1/0", drain_grace_s=grace))


def test_a_worker_asks_for_a_drain_only_with_a_grace_period_executors_and_no_stop_yet() -> None:
    w = worker(30.0)
    try:
        assert not w.drains.wants_drain()  # nothing runs yet (starting, or a staged node): stop at once
        w.stores.attach(object(), w.topology.redis_prefix)  # type: ignore[arg-type]
        w.generations.current = SimpleNamespace()  # type: ignore[assignment]
        assert w.drains.wants_drain()
        w.drains.draining = threading.Thread(target=lambda: None)
        assert not w.drains.wants_drain()  # a second SIGTERM stops at once
        w.drains.draining = None
        w.control.on_node_message({"type": "stop"})  # its backend stops it: the SIGTERM that follows asks for nothing
        assert w.stop.is_set() and w.drains.stopped_by_backend and not w.drains.wants_drain()
    finally:
        w.zmq.term()
    off = worker(0.0)
    try:
        off.stores.attach(object(), off.topology.redis_prefix)  # type: ignore[arg-type]
        off.generations.current = SimpleNamespace()  # type: ignore[assignment]
        assert not off.drains.wants_drain()
    finally:
        off.zmq.term()


def test_a_worker_that_cannot_write_its_drain_request_stops_at_once() -> None:
    import redis as redis_lib

    w = worker(30.0)
    try:
        w.stores.attach(redis_lib.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2), "p:")
        w.drains.drain()
        assert w.stop.is_set()
    finally:
        w.zmq.term()
