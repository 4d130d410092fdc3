"""Key groups that migrate a few at a time, in band (`spec.scaling.migrationScope: keyGroups`), on real worker
processes and a real Redis: every sink receives exactly the ids a correct run delivers and every keyed count
runs 1..n, on the CCR paper's five DAGs scaled out and in, on a change that moves executors, grows one vertex
and shrinks another at once with exactly-once sinks that move; and through faults in the middle of the
batches: a worker SIGKILLed (the topology rolls back to the last periodic checkpoint) and Redis unreachable
for 5 s (the data plane goes on; the migration waits for Redis and completes), both exactly once with exact
keyed counts. Before the first FLIP, the senders' channels to the new instances are open and handshaken (WARM)."""

from __future__ import annotations

import glob
import os
import re
import signal
import time
from typing import Any

import pytest
from test_control_faults import Outage
from test_migration import EVENTS, check_exactly_once, load
from test_migration_faults import ControllerCrash, plan_for
from test_partial_migration import DAGS, mixed_change, partial

from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
from elastream.control.migration import MigrationDriver
from elastream.core.migration_scope import migration_parts
from support.harness import exactly_once, running, with_audit, write_manifest
from support.redis_servers import RedisServer
from support.waiting import wait_until

pytestmark = pytest.mark.integration


def batched(topology: Any, cluster: Any, **options: Any) -> MigrationDriver:
    """A CCR driver of scope `keyGroups`, after the periodic checkpoint that scope needs to fall back on."""
    return partial(topology, cluster, scope="keyGroups", **options)


class KillAfterFirstStep:
    """A driver's `before_step` hook: SIGKILLs the worker of `node` once the first step has flipped (state has
    moved between processes); `killed` holds the pid it killed."""

    def __init__(self, cluster: Any, node: str) -> None:
        self.cluster, self.node = cluster, node
        self.killed: list[int] = []

    def __call__(self, step: int) -> None:
        if step >= 1 and not self.killed:
            pid = self.cluster.workers[self.node].process.pid
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)


def warmed(cluster: Any, migration_id: str) -> list[tuple[int, int]]:
    """(channels opened, handshaken) of every node's WARM in `migration_id`, from the workers' logs (a node
    the migration removed has exited, its log stays)."""
    line = re.compile(rf"(\d+) channels to new instances opened ahead of migration {migration_id}, (\d+) handshaken")
    found = []
    for path in glob.glob(os.path.join(cluster.run_dir, "*.log")):
        with open(path, encoding="utf-8", errors="replace") as handle:
            found += [(int(opened), int(ready)) for opened, ready in line.findall(handle.read())]
    return found


@pytest.mark.parametrize("direction", ["out", "in"])
@pytest.mark.parametrize("name", DAGS)
def test_key_groups_move_in_batches_exactly_once(name: str, direction: str, tmp_path, redis_url: str) -> None:
    doc = with_audit(load(name), EVENTS)
    doc["spec"]["nodes"] = {"ccr-grid": 4, "ccr-traffic": 3}.get(name, 2) + (1 if direction == "in" else 0)
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        new = plan_for(topology, old, len(old.nodes) + (1 if direction == "out" else -1))
        time.sleep(1.5)  # mid-stream
        report = batched(topology, cluster).migrate(new)
        assert report.outcome == "succeeded", report.reason
        assert report.scope == "keyGroups"
        assert cluster.current_schedule() == new
        parts = migration_parts(topology, old, new, "moving")
        moving_vertices = {e.split("#")[0] for e in parts.moving_old} - set(topology.sources)
        assert (report.batches or 0) >= len(moving_vertices)  # at least one batch per vertex whose groups moved
        if report.batches:  # groups moved: their senders' channels were open and handshaken before any FLIP
            warm = warmed(cluster, report.migration_id)
            assert sum(opened for opened, _ in warm) > 0
            assert all(opened == ready for opened, ready in warm), warm
        check_exactly_once(cluster, topology)
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None  # cleaned up


def test_a_mixed_change_with_exactly_once_sinks_that_move_is_exactly_once(tmp_path, redis_url: str) -> None:
    """ccr-diamond with exactly-once sinks and periodic checkpoints: one executor moves node, one vertex
    grows, another shrinks, a sink moves: its processed, uncommitted output goes to its new instance with the
    state of its last batch, which commits it with a later checkpoint."""
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
            report = MigrationDriver(topology, cluster, cluster.client, "ccr", scope="keyGroups").migrate(new)
            assert report.outcome == "succeeded", report.reason
            assert report.scope == "keyGroups"
            assert cluster.current_schedule() == new
            check_exactly_once(cluster, topology)  # the exactly-once sinks commit with the later rounds
        finally:
            checkpointer.stop()


# ---- faults in the middle of the batches ----------------------------------------------------------------------


def test_a_worker_killed_in_the_middle_of_the_batches_rolls_back_exactly_once(tmp_path, redis_url: str) -> None:
    """A worker SIGKILLed once some steps have flipped (state has moved between processes): the migration
    ends, the topology rolls back to the last periodic checkpoint (the staged instances stop, the dead worker
    starts again), the exactly-once sinks discard what they had not committed, and every count is exact."""
    doc = exactly_once(with_audit(load("ccr-diamond"), EVENTS), checkpoint_s=0, nodes=3)
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        new = plan_for(topology, old, topology.nodes - 1)  # a scale-in of ccr-diamond moves groups in 10 steps
        time.sleep(1.5)
        kill = KillAfterFirstStep(cluster, new.nodes[0])
        driver = batched(topology, cluster, before_step=kill)
        report = driver.migrate(new)
        if not kill.killed:
            pytest.fail(f"the plan has one step only: nothing to kill in the middle of ({report})")
        assert report.outcome == "aborted", report
        assert "rolled back to checkpoint" in report.reason, report.reason
        assert cluster.current_schedule() == old
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None
        committing(topology, cluster)


def test_a_key_group_migration_whose_controller_died_is_rolled_back_by_a_new_one(tmp_path, redis_url: str) -> None:
    """The controller dies once some steps have flipped: the record stays in Redis; the next controller cannot
    finish it (the state that moved lives only in the processes), so it rolls the topology back to the last
    periodic checkpoint, exactly once."""
    doc = exactly_once(with_audit(load("ccr-diamond"), EVENTS), checkpoint_s=0, nodes=3)
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        new = plan_for(topology, old, topology.nodes - 1)
        time.sleep(1.5)

        def crash(step: int) -> None:
            if step >= 1:
                raise ControllerCrash

        dead = batched(topology, cluster, before_step=crash, identity="a-dead-controller", owner_ttl_s=3)
        with pytest.raises(ControllerCrash):
            dead.migrate(new)
        successor = MigrationDriver(topology, cluster, cluster.client, "ccr", identity="a-new-controller")
        wait_until(lambda: successor.unfinished() is not None, 30, "the dead controller's lease to run out")
        report = successor.resume()
        assert report is not None and report.outcome == "succeeded", report
        assert report.protocol == "restart" and report.restored_from, report  # the rollback to the checkpoint
        assert cluster.current_schedule() == old
        committing(topology, cluster)


def test_redis_unreachable_for_5_s_in_the_middle_of_the_batches_is_exactly_once(
    tmp_path, restartable_redis: RedisServer
) -> None:
    """Redis stopped for 5 s once a step has flipped: the data plane keeps going (markers and state travel
    in band), the controller waits for Redis, and the migration completes, exactly once."""
    doc = exactly_once(with_audit(load("ccr-diamond"), EVENTS), checkpoint_s=0, nodes=3)
    outage = Outage(restartable_redis, 5.0)
    with running(write_manifest(str(tmp_path), doc), restartable_redis.url) as (cluster, topology):
        old = cluster.current_schedule()
        new = plan_for(topology, old, topology.nodes - 1)
        time.sleep(1.5)
        outage.arm()

        def outage_after_first_step(step: int) -> None:
            if step >= 1:
                outage.begin_once()

        report = batched(topology, cluster, before_step=outage_after_first_step).migrate(new)
        outage.over()
        assert outage.count == 1, "the plan has one step only: no outage in the middle of it"
        assert report.outcome == "succeeded", report.reason
        assert cluster.current_schedule() == new
        committing(topology, cluster)


def committing(topology: Any, cluster: Any) -> None:
    """Periodic checkpoints from now on (the exactly-once sinks commit with them) until every sink holds exactly
    what a correct run delivers."""
    checkpointer = Checkpointer(CheckpointDriver(topology, cluster, cluster.client), interval_s=1.0).start()
    try:
        check_exactly_once(cluster, topology)
    finally:
        checkpointer.stop()
