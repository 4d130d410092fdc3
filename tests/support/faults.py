"""Faults injected into worker processes at a chosen moment of a migration, for the integration tiers."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastream.control.backends.local import LocalCluster
from elastream.control.checkpoint_driver import CheckpointDriver, CheckpointResult
from elastream.control.migration import MigrationDriver
from elastream.core.migration_protocol import Action, ActionKind, MigrationCoordinator, MigrationReport
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology
from elastream.core.topology.limits import MigrationScope


def kill_during_capture(cluster: LocalCluster, node: str) -> Callable[[Action, MigrationCoordinator], None]:
    """A `MigrationDriver(before_action=...)` hook that SIGKILLs `node`'s worker (and reaps it) just before
    START_COMMIT: every executor has acked PREPARE and is capturing."""

    def hook(action: Action, coordinator: MigrationCoordinator) -> None:
        if action.kind == ActionKind.START_COMMIT:
            cluster.workers[node].process.send_signal(signal.SIGKILL)
            cluster.workers[node].process.wait(10)

    return hook


@dataclass(frozen=True)
class KilledDuringCapture:
    victim: str  #: the node whose worker was killed
    checkpoint: CheckpointResult | None  #: the checkpoint taken before the migration, if one was
    report: MigrationReport


def migrate_killing_a_worker_during_capture(
    cluster: LocalCluster,
    topology: Topology,
    new: Schedule,
    executor: str,
    checkpoint: bool,
    scope: MigrationScope = "all",
) -> KilledDuringCapture:
    """A CCR migration to `new`, mid-stream, whose worker running `executor` is killed during capture; with
    `checkpoint`, a checkpoint is taken (and must complete) half a second before the migration starts, so
    that there are events after it for the rollback to replay. The migration must abort, name the killed
    worker and leave the old schedule running, rolled back to that checkpoint if there is one (else not).
    `scope`: the migration's (`moving` pauses only what moves)."""
    old = cluster.current_schedule()
    victim = old.node_of(executor)
    time.sleep(1.0)  # mid-stream
    taken: CheckpointResult | None = None
    if checkpoint:
        taken = CheckpointDriver(topology, cluster, cluster.client).take()
        assert taken.outcome == "completed", taken.reason
    time.sleep(0.5)
    driver = MigrationDriver(
        topology, cluster, cluster.client, "ccr", before_action=kill_during_capture(cluster, victim), scope=scope
    )
    report = driver.migrate(new)
    assert report.outcome == "aborted", report
    assert f"worker {victim} exited with code -9" in report.reason, report.reason
    if taken is not None:
        assert f"rolled back to checkpoint {taken.checkpoint_id}" in report.reason, report.reason
    else:
        assert "rolled back" not in report.reason, report.reason
    assert cluster.current_schedule() == old  # nothing was applied
    return KilledDuringCapture(victim, taken, report)
