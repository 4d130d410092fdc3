"""CCR that pauses only what moves (`spec.scaling.migrationScope: moving`), on real worker processes and a real
Redis: an executor that neither moves nor receives from a moving one processes events throughout the
migration; every sink receives exactly the ids a correct run delivers and every keyed count runs 1..n, on
the CCR paper's five DAGs scaled out and in, on a change that moves executors, grows one vertex and shrinks
another at once, and with exactly-once sinks that move (their uncommitted output is handed over)."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from test_migration import EVENTS, check_exactly_once, check_nothing_lost, load
from test_migration_faults import ControllerCrash, plan_for

from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
from elastream.control.migration import MigrationDriver
from elastream.core.migration_protocol import Action, ActionKind, MigrationCoordinator
from elastream.core.migration_scope import migration_parts
from elastream.core.schedule import Schedule
from elastream.core.topology.limits import MigrationScope
from support.faults import migrate_killing_a_worker_during_capture
from support.harness import exactly_once, running, sink_events, with_audit, write_manifest
from support.manifests import edge, manifest, sink, src, work
from support.waiting import wait_until

pytestmark = pytest.mark.integration

DAGS = ["ccr-linear", "ccr-diamond", "ccr-star", "ccr-grid", "ccr-traffic"]


def partial(topology: Any, cluster: Any, scope: MigrationScope = "moving", **options: Any) -> MigrationDriver:
    """A CCR driver of `scope` (`moving`, or `keyGroups`), after the periodic checkpoint either scope needs to
    fall back on."""
    assert CheckpointDriver(topology, cluster, cluster.client).take().outcome == "completed"
    return MigrationDriver(topology, cluster, cluster.client, "ccr", scope=scope, **options)


@pytest.mark.parametrize("direction", ["out", "in"])
@pytest.mark.parametrize("name", DAGS)
def test_a_partial_migration_is_exactly_once(name: str, direction: str, tmp_path, redis_url: str) -> None:
    doc = with_audit(load(name), EVENTS)
    doc["spec"]["nodes"] = {"ccr-grid": 4, "ccr-traffic": 3}.get(name, 2) + (1 if direction == "in" else 0)
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        new = plan_for(topology, old, len(old.nodes) + (1 if direction == "out" else -1))
        time.sleep(1.5)  # mid-stream
        report = partial(topology, cluster).migrate(new)
        assert report.outcome == "succeeded", report.reason
        assert cluster.current_schedule() == new
        parts = migration_parts(topology, old, new, "moving")
        assert report.scope == ("moving" if parts.kept else "all")
        check_exactly_once(cluster, topology)
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None  # cleaned up


def two_pipelines() -> dict[str, Any]:
    """Two independent pipelines in one topology: `steady` (src1 -> w1 -> out1) and `moved` (src2 -> w2 ->
    out2), sources finite, sinks at-least-once redis streams (CCR replays nothing: exactly once all the same)."""
    return manifest(
        [
            src("src1", rate=300, limit=EVENTS),
            work("w1", 2),
            sink("out1", type="redis-stream"),
            src("src2", rate=300, limit=EVENTS),
            work("w2", 2),
            sink("out2", type="redis-stream"),
        ],
        [edge("src1", "w1"), edge("w1", "out1"), edge("src2", "w2"), edge("w2", "out2")],
        nodes=2,
        slotsPerNode=4,
    )


def test_an_executor_that_does_not_move_processes_events_while_the_moving_ones_are_captured(
    tmp_path, redis_url: str
) -> None:
    path = write_manifest(str(tmp_path), two_pipelines())
    placement = {"node-0": ["src1#0", "w1#0", "w1#1", "out1#0"], "node-1": ["src2#0", "w2#0", "w2#1", "out2#0"]}
    old = Schedule.from_placement(placement, 4)
    with running(path, redis_url, schedule=old) as (cluster, topology):

        def count(sink_name: str) -> int:
            return len(sink_events(cluster.client, topology, sink_name))

        seen: dict[str, tuple[int, int]] = {}

        def while_captured(action: Action, coordinator: MigrationCoordinator) -> None:
            # COMMIT is done: w2#1 is captured and checkpointed and its sender src2 holds what is w2#1's.
            # Nothing moves on until this returns: the steady pipeline must go on meanwhile.
            if action.kind == ActionKind.APPLY_SCHEDULE:
                steady = count("out1")
                wait_until(lambda: count("out1") >= steady + 50, 60, "out1 to advance while w2#1 is captured")
                seen["out1"] = (steady, count("out1"))

        wait_until(lambda: count("out1") > 100 and count("out2") > 100, 60, "both pipelines to flow")
        new = Schedule.from_placement({**placement, "node-1": ["src2#0", "w2#0", "out2#0"], "node-2": ["w2#1"]}, 4)
        report = partial(topology, cluster, before_action=while_captured).migrate(new)
        assert report.outcome == "succeeded", report.reason
        assert report.scope == "moving"
        before, during = seen["out1"]
        assert during >= before + 50  # w1 (kept, fed by nobody moving) processed events throughout
        check_exactly_once(cluster, topology)


def test_a_mixed_change_with_exactly_once_sinks_that_move_is_exactly_once(tmp_path, redis_url: str) -> None:
    """ccr-diamond with exactly-once sinks and periodic checkpoints: one executor moves node, one vertex
    grows, another shrinks, a sink moves: its processed, uncommitted output goes to its new instance, which
    commits it with a later checkpoint."""
    doc = exactly_once(with_audit(load("ccr-diamond"), EVENTS), checkpoint_s=1, nodes=3)
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        k = old.parallelism()
        grow, shrink = sorted(v for v in k if topology.vertices[v].kind == "logic" and k[v] > 1)[:2] or (None, None)
        new = mixed_change(topology, old, grow, shrink)
        checkpointer = Checkpointer(CheckpointDriver(topology, cluster, cluster.client), interval_s=1.0).start()
        try:
            wait_until(lambda: checkpointer.completed >= 1, 60, "a periodic checkpoint")
            time.sleep(1.0)
            report = MigrationDriver(topology, cluster, cluster.client, "ccr", scope="moving").migrate(new)
            assert report.outcome == "succeeded", report.reason
            assert report.scope == "moving"
            assert cluster.current_schedule() == new
            check_exactly_once(cluster, topology)  # the exactly-once sinks commit with the later rounds
        finally:
            checkpointer.stop()


def mixed_change(topology: Any, old: Schedule, grow: str | None, shrink: str | None) -> Schedule:
    """`old` with the last executor of `grow` doubled onto a new node, `shrink`'s last executor removed, and
    one sink executor moved to the new node: moves, a parallelism up and one down in one migration."""
    placement = {node: list(executors) for node, executors in old.placement().items()}
    placement["node-3"] = []
    k = old.parallelism()
    if grow is not None:
        placement["node-3"].append(f"{grow}#{k[grow]}")
    if shrink is not None:
        last = f"{shrink}#{k[shrink] - 1}"
        for executors in placement.values():
            if last in executors:
                executors.remove(last)
    sinks = sorted(e for e in old.assignment if topology.vertices[e.split("#")[0]].kind == "sink")
    moved = sinks[0]
    for executors in placement.values():
        if moved in executors:
            executors.remove(moved)
    placement["node-3"].append(moved)
    return Schedule.from_placement(placement, old.slots_per_node, [*old.nodes, "node-3"])


# ---- faults in every phase: a controller that dies, a worker killed before and after COMMIT ----------------


def test_a_partial_migration_whose_controller_died_after_commit_is_finished_by_a_new_one(
    tmp_path, redis_url: str
) -> None:
    path = write_manifest(str(tmp_path), with_audit(load("ccr-diamond"), EVENTS))
    with running(path, redis_url) as (cluster, topology):
        new = plan_for(topology, cluster.current_schedule(), topology.nodes + 1)
        time.sleep(1.5)

        def crash(action: Action, coordinator: MigrationCoordinator) -> None:
            if action.kind == ActionKind.APPLY_SCHEDULE:  # the moving executors are checkpointed, senders hold
                raise ControllerCrash

        dead = partial(topology, cluster, before_action=crash, identity="a-dead-controller", owner_ttl_s=3)
        with pytest.raises(ControllerCrash):
            dead.migrate(new)
        successor = MigrationDriver(topology, cluster, cluster.client, "ccr", identity="a-new-controller")
        wait_until(lambda: successor.unfinished() is not None, 30, "the dead controller's lease to run out")
        report = successor.resume()  # the scope is the record's, not the successor's
        assert report is not None and report.outcome == "succeeded", report
        assert report.scope == "moving"
        assert cluster.current_schedule() == new
        check_exactly_once(cluster, topology)


def test_a_worker_killed_during_a_partial_capture_aborts_and_rolls_back_to_the_checkpoint(
    tmp_path, redis_url: str
) -> None:
    path = write_manifest(str(tmp_path), with_audit(load("ccr-traffic"), EVENTS))
    with running(path, redis_url) as (cluster, topology):
        new = plan_for(topology, cluster.current_schedule(), topology.nodes + 1)
        migrate_killing_a_worker_during_capture(
            cluster, topology, new, "segment-count#0", checkpoint=True, scope="moving"
        )
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None
        check_nothing_lost(cluster, topology)  # what the killed worker held came back through the replay


def test_a_worker_killed_after_a_partial_commit_rolls_back_to_the_checkpoint_and_loses_nothing(
    tmp_path, redis_url: str
) -> None:
    """After COMMIT the old schedule cannot be put back (a kept executor's state is in its process only):
    the new schedule does not come up without the killed worker, and the topology rolls back to the last
    periodic checkpoint, its sources replaying what came after it."""
    path = write_manifest(str(tmp_path), with_audit(load("ccr-diamond"), EVENTS))
    with running(path, redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        new = plan_for(topology, old, topology.nodes + 1)
        kept = migration_parts(topology, old, new, "moving").kept
        victim = old.node_of(sorted(kept)[0])
        time.sleep(1.0)

        def kill_after_commit(action: Action, coordinator: MigrationCoordinator) -> None:
            if action.kind == ActionKind.APPLY_SCHEDULE:
                cluster.workers[victim].process.send_signal(signal.SIGKILL)
                cluster.workers[victim].process.wait(10)

        report = partial(topology, cluster, before_action=kill_after_commit).migrate(new)
        assert report.outcome == "aborted", report
        assert "rolling back" not in report.reason and "rolled back to checkpoint" in report.reason, report.reason
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None
        check_nothing_lost(cluster, topology)
