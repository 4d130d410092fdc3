"""Migrations under faults, on real worker processes and a real Redis: a controller that dies after COMMIT, a
new node that never comes up, Redis restarted between migrations, a worker killed during capture."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from typing import Any

import pytest
from test_migration import EVENTS, check_exactly_once, load

from elastream.control.backends.local import LocalCluster, WorkerProcess
from elastream.control.migration import MigrationDriver
from elastream.core.migration_protocol import Action, ActionKind, MigrationCoordinator
from elastream.core.planner import make_plan
from elastream.core.schedule import initial_schedule
from elastream.core.simulate import simulate, snapshot_from_simulation
from elastream.crd import load_manifest
from support.faults import migrate_killing_a_worker_during_capture
from support.harness import running, with_audit, write_manifest
from support.redis_servers import RedisServer

pytestmark = pytest.mark.integration


class ControllerCrash(Exception):
    pass


def plan_for(topology, schedule, nodes: int):
    snapshot = snapshot_from_simulation(topology, schedule, simulate(topology, schedule))
    return make_plan(topology, schedule, snapshot, nodes, "stela").new_schedule


def test_a_new_controller_finishes_a_migration_whose_controller_died_after_commit(tmp_path, redis_url: str) -> None:
    path = write_manifest(str(tmp_path), with_audit(load("ccr-diamond"), EVENTS))
    with running(path, redis_url) as (cluster, topology):
        new = plan_for(topology, cluster.current_schedule(), topology.nodes + 1)
        time.sleep(1.5)

        def crash(action: Action, coordinator: MigrationCoordinator) -> None:
            if action.kind == ActionKind.APPLY_SCHEDULE:  # every COMMIT is acked: state is in Redis
                raise ControllerCrash

        dead = MigrationDriver(
            topology, cluster, cluster.client, "ccr", before_action=crash, identity="a-dead-controller", owner_ttl_s=3
        )
        with pytest.raises(ControllerCrash):
            dead.migrate(new)
        assert cluster.current_schedule() != new  # the old workers still wait, checkpointed
        successor = MigrationDriver(topology, cluster, cluster.client, "ccr", identity="a-new-controller")
        # while the dead controller's owner lease runs, it counts as alive: not pre-empted
        assert successor.unfinished() is None and successor.resume() is None
        deadline = time.monotonic() + 15.0
        while dead.owner.holder() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert successor.unfinished() is not None
        report = successor.resume()
        assert report is not None and report.outcome == "succeeded"
        assert cluster.current_schedule() == new
        check_exactly_once(cluster, topology)


def test_checkpoints_and_acks_lost_at_commit_are_saved_again_on_a_resent_commit(tmp_path, redis_url: str) -> None:
    """A Redis primary that fails before its replica has its last writes loses writes it acknowledged
    (replication is asynchronous): here the source's and t5's saves at COMMIT and their acks vanish as the
    controller would have read the acks. COMMIT is resent to both after `commit_resend_s`; each saves the same
    checkpoint again and acks again, so the migration completes exactly once instead of aborting at 60 s."""
    path = write_manifest(str(tmp_path), with_audit(load("ccr-diamond"), EVENTS))
    lost = {"source#0", "t5#0"}  # t5 has one executor: its captured events are all of pending:t5:*
    with running(path, redis_url) as (cluster, topology):
        new = plan_for(topology, cluster.current_schedule(), topology.nodes + 1)
        time.sleep(1.5)
        driver = MigrationDriver(topology, cluster, cluster.client, "ccr")
        store, client = driver.store, cluster.client
        read_acks = store.acks
        dropped: dict[str, int] = {}

        def acks_losing_the_first_of_the_lost(mid: str, phase: str) -> dict[str, dict[str, Any]]:
            acks = read_acks(mid, phase)
            if phase != "committing":
                return acks
            m = store._m(mid)
            for executor in sorted(lost & acks.keys() - dropped.keys()):
                # everything its save and its ack wrote: gone, as with the primary that had them
                keys = [f"{m}:acks:committing", f"{m}:saved:{executor}"]
                if executor == "source#0":
                    dropped[executor] = int(client.hdel(f"{m}:position", executor))
                else:
                    captured = list(client.scan_iter(match=f"{m}:pending:t5:*"))
                    dropped[executor] = int(client.delete(*captured)) if captured else 0
                client.hdel(keys[0], executor)
                assert client.delete(keys[1]) == 1  # the save's token: the executor saved once
                del acks[executor]
            return acks

        store.acks = acks_losing_the_first_of_the_lost  # type: ignore[method-assign]
        report = driver.migrate(new)
        assert report.outcome == "succeeded", report.reason
        assert dropped.keys() == lost and dropped["source#0"] == 1, dropped
        assert dropped["t5#0"] >= 1, "t5 captured nothing to lose: the test shows nothing of its pending list"
        assert report.phases_ms["commitMs"] >= 5000.0  # acked only after the resend, 5 s into COMMIT
        assert cluster.current_schedule() == new
        check_exactly_once(cluster, topology)


class NodeNeverUp(LocalCluster):
    """A backend whose node `never` starts a process that never registers (a pod stuck in Pending)."""

    def __init__(self, *args: Any, never: str, **options: Any) -> None:
        super().__init__(*args, **options)
        self.never = never

    def _spawn(self, node: str, staged_version: int = 0) -> WorkerProcess:
        if node != self.never:
            return super()._spawn(node, staged_version)
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        return WorkerProcess(node, process, "/dev/null")


def test_a_new_node_that_never_comes_up_fails_the_migration_before_anything_is_paused(tmp_path, redis_url: str) -> None:
    path = write_manifest(str(tmp_path), with_audit(load("ccr-linear"), EVENTS))
    planned = load_manifest(path)
    old = initial_schedule(planned)  # what `running` starts
    new = plan_for(planned, old, planned.nodes + 1)
    with running(path, redis_url, backend=functools.partial(NodeNeverUp, never=new.nodes[-1])) as (cluster, topology):
        assert cluster.current_schedule() == old
        cluster.start_timeout_s = 8.0  # for the nodes the migration adds (the first start had 60 s)
        time.sleep(1.5)
        paused: list[Action] = []
        driver = MigrationDriver(topology, cluster, cluster.client, "ccr", before_action=lambda a, c: paused.append(a))
        report = driver.migrate(new)
        assert report.outcome == "failed"
        assert f"nodes {new.nodes[-1]} not staged after 8 s" in report.reason
        assert "nothing was paused" in report.reason and paused == []
        assert cluster.current_schedule() == old
        assert new.nodes[-1] not in cluster.workers  # the stuck node was stopped again
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None
        check_exactly_once(cluster, topology)


def test_redis_restarted_between_migrations(tmp_path) -> None:
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    try:
        path = write_manifest(str(tmp_path), with_audit(load("ccr-star"), EVENTS))
        with running(path, server.url) as (cluster, topology):
            time.sleep(1.0)
            first = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(
                plan_for(topology, cluster.current_schedule(), topology.nodes + 1)
            )
            assert first.outcome == "succeeded"
            server.stop()  # sources keep running; workers retry Redis (metrics, sinks) until it is back
            time.sleep(1.0)
            server.start()
            time.sleep(1.0)
            second = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(
                plan_for(topology, cluster.current_schedule(), topology.nodes)
            )
            assert second.outcome == "succeeded", second.reason
            check_exactly_once(cluster, topology)
    finally:
        server.stop()


def test_a_worker_killed_during_capture_before_any_checkpoint_aborts_and_goes_on(tmp_path, redis_url: str) -> None:
    path = write_manifest(str(tmp_path), with_audit(load("ccr-traffic"), 1_000_000))
    with running(path, redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        new = plan_for(topology, old, topology.nodes + 1)
        # aborted, not rolled back (no checkpoint yet), the old schedule running
        killed = migrate_killing_a_worker_during_capture(cluster, topology, new, "segment-count#0", checkpoint=False)
        report, victim = killed.report, killed.victim
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None  # cleaned up, not stuck
        assert report.phases_ms["captureMs"] is not None and report.phases_ms["rebalanceMs"] is None
        assert cluster.workers[victim].process.poll() is None  # restarted under the old schedule
        # The abort returned once the new process was ready, not on the killed one's stale ready mark.
        assert cluster.registry.workers()[victim]["pid"] == cluster.workers[victim].process.pid
        sink = f"{topology.redis_prefix}sink:sink"
        before = int(cluster.client.xlen(sink))
        deadline = time.monotonic() + 20.0
        while int(cluster.client.xlen(sink)) <= before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert int(cluster.client.xlen(sink)) > before  # the old schedule goes on, every node running
        # What the killed process held (its queues, its executors' state) is gone: with no periodic
        # checkpoint taken yet nothing can bring it back, and the abort says so. With one, the topology
        # rolls back to it and nothing is lost: test_checkpoints.py checks that.
