"""Workers live through a rescale, and through the death of one of them, on real processes and a real Redis.

- CCR and DCR never restart a worker that stays (same process ids before and after); the nodes a scale-out
  adds run and have bound their inboxes before PREPARE; the nodes a scale-in removes are still running at
  COMMIT and stop after it. Every event is delivered exactly once and every keyed count is exact.
- A worker killed outside any migration, or during a migration's capture, is recovered by the topology
  controller from the last periodic checkpoint, in place (the survivors keep their processes); the record
  says what the sources replayed, nothing is lost, and with `delivery: exactly-once` sinks no reader sees an
  event twice.
"""

from __future__ import annotations

import time

import pytest
from test_migration import EVENTS, check_exactly_once, load
from test_migration_faults import plan_for

from elastream.analysis import Analyzer
from elastream.control.backends.local import LocalCluster
from elastream.control.local_mode import local_controller
from elastream.control.migration import MigrationDriver
from elastream.control.scaling import PrintEvents
from elastream.core.migration_protocol import Action, ActionKind, MigrationCoordinator
from elastream.crd import load_manifest
from elastream.store.checkpoint_store import CheckpointStore
from support.faults import migrate_killing_a_worker_during_capture
from support.harness import exactly_once, expected_copies, running, sink_events, ticking, with_audit, write_manifest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("protocol", ["ccr", "dcr"])
@pytest.mark.parametrize("direction", ["out", "in"])
def test_no_surviving_worker_restarts_and_nodes_come_and_go_around_the_pause(
    direction: str, protocol: str, tmp_path, redis_url: str
) -> None:
    doc = with_audit(load("ccr-diamond"), EVENTS)
    doc["spec"]["nodes"] = 2 if direction == "out" else 3
    path = write_manifest(str(tmp_path), doc)
    with running(path, redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        new = plan_for(topology, old, len(old.nodes) + (1 if direction == "out" else -1))
        added, removed = set(new.nodes) - set(old.nodes), set(old.nodes) - set(new.nodes)
        assert added if direction == "out" else removed, "the plan must add or remove a node"
        pids = {node: worker.process.pid for node, worker in cluster.workers.items()}
        removed_processes = {node: cluster.workers[node].process for node in removed}
        seen: dict[str, object] = {}

        def observe(action: Action, coordinator: MigrationCoordinator) -> None:
            if action.kind == ActionKind.PAUSE_SOURCES:  # the first step of the pause
                assert cluster.prepared is not None and cluster.prepared[0] == new
                seen["staged"] = cluster.registry.staged_nodes(cluster.prepared[1])
                seen["added running"] = {n: cluster.workers[n].process.poll() is None for n in added}
            elif action.kind == ActionKind.APPLY_SCHEDULE:  # every COMMIT is acked
                seen["removed running at commit"] = {n: p.poll() is None for n, p in removed_processes.items()}

        time.sleep(1.5)  # mid-stream
        report = MigrationDriver(topology, cluster, cluster.client, protocol, before_action=observe).migrate(new)
        assert report.outcome == "succeeded", report.reason
        assert cluster.current_schedule() == new
        assert seen["staged"] >= set(new.nodes)  # every node of the new schedule bound its inboxes first
        assert all(seen["added running"].values())  # type: ignore[union-attr]
        assert all(seen["removed running at commit"].values())  # type: ignore[union-attr]
        for node in set(old.nodes) & set(new.nodes):
            assert cluster.workers[node].process.pid == pids[node], f"{node} was restarted"
        for node, process in removed_processes.items():
            assert process.wait(15) == 0, f"{node} did not stop cleanly after COMMIT"
        assert report.pause_ms is not None and report.prepare_ms is not None
        check_exactly_once(cluster, topology)
        # a completed migration is the latest checkpoint (what a later failure rolls back to)
        assert CheckpointStore(cluster.client, topology.redis_prefix).latest_checkpoint()["id"] == report.migration_id


def exactly_once_doc(name: str, interval_s: int = 1) -> dict:
    return exactly_once(with_audit(load(name), EVENTS), checkpoint_s=interval_s)


def wait_for(predicate, timeout_s: float, tick=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        if tick is not None:
            tick()
        time.sleep(0.2)


def test_a_worker_killed_outside_a_migration_is_recovered_from_the_checkpoint_exactly_once(
    tmp_path, redis_url: str
) -> None:
    path = write_manifest(str(tmp_path), exactly_once_doc("ccr-linear", interval_s=3))
    topology = load_manifest(path)
    cluster = LocalCluster(topology, path, redis_url, interval_s=0.5)
    controller = local_controller(topology, cluster, Analyzer(engine="python"), events=PrintEvents())
    store = CheckpointStore(cluster.client, topology.redis_prefix)
    with cluster, controller:
        controller.start()
        wait_for(lambda: (store.latest_checkpoint() or {}).get("id", "").startswith("ckpt-"), 30, tick=controller.tick)
        time.sleep(1.2)  # events flow past the checkpoint: the rollback replays them
        victim = cluster.current_schedule().node_of("t3#0")  # the keyed count: its state must come back
        pids = {node: worker.process.pid for node, worker in cluster.workers.items()}
        cluster.kill(victim)
        wait_for(lambda: controller.last_recovery is not None, 60, tick=controller.tick)
        recovery = controller.last_recovery
        assert recovery is not None and recovery["outcome"] == "succeeded", recovery
        assert recovery["nodes"] == [victim] and str(recovery["restoredFrom"]).startswith("ckpt-")
        assert recovery["replayed"] > 0  # the sources emitted again what came after the checkpoint
        assert cluster.workers[victim].process.pid != pids[victim]
        for node in set(pids) - {victim}:  # the survivors reloaded in place
            assert cluster.workers[node].process.pid == pids[node]
        with ticking(controller):  # exactly-once sinks commit with the checkpoints the controller's ticks take
            check_exactly_once(cluster, topology)  # nothing lost, and with exactly-once sinks nothing twice


def test_a_worker_killed_during_capture_rolls_back_and_no_reader_sees_an_event_twice(tmp_path, redis_url: str) -> None:
    path = write_manifest(str(tmp_path), exactly_once_doc("ccr-traffic", interval_s=0))
    with running(path, redis_url) as (cluster, topology):
        new = plan_for(topology, cluster.current_schedule(), topology.nodes + 1)
        # aborted, rolled back to the checkpoint taken before it, the old schedule running
        migrate_killing_a_worker_during_capture(cluster, topology, new, "segment-count#0", checkpoint=True)
        # sinks commit with checkpoints: keep taking them until every event is through
        from elastream.control.checkpoint_driver import CheckpointDriver

        checkpoints = CheckpointDriver(topology, cluster, cluster.client)

        totals = {sink: sum(copies.values()) for sink, copies in expected_copies(topology, range(EVENTS)).items()}

        def through() -> bool:
            checkpoints.take()
            return all(len(sink_events(cluster.client, topology, s)) >= n for s, n in totals.items())

        wait_for(through, 90)
        check_exactly_once(cluster, topology)


def test_a_controller_started_after_a_crash_past_commit_finishes_the_migration(tmp_path, redis_url: str) -> None:
    """The controller dies right after every COMMIT is acked and its local workers die with it; a new
    controller on the same Redis starts the target schedule's workers and finishes the migration from the
    state in Redis: nothing lost, nothing twice."""
    from test_migration_faults import ControllerCrash

    path = write_manifest(str(tmp_path), with_audit(load("ccr-diamond"), EVENTS))
    topology = load_manifest(path)
    with running(path, redis_url) as (cluster, _):
        new = plan_for(topology, cluster.current_schedule(), topology.nodes + 1)
        time.sleep(1.5)

        def crash(action: Action, coordinator: MigrationCoordinator) -> None:
            if action.kind == ActionKind.APPLY_SCHEDULE:
                raise ControllerCrash

        with pytest.raises(ControllerCrash):
            MigrationDriver(topology, cluster, cluster.client, "ccr", before_action=crash).migrate(new)
    # the first controller and its workers are gone; a new one starts on the same Redis
    cluster = LocalCluster(topology, path, redis_url, interval_s=0.5)
    controller = local_controller(topology, cluster, Analyzer(engine="python"), events=PrintEvents())
    with cluster, controller:
        controller.start()
        assert cluster.current_schedule() == new
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None  # finished and released
        with ticking(controller):
            check_exactly_once(cluster, topology)
