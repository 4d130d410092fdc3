"""Faults injected into worker processes at a chosen moment of a migration, for the integration tiers."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastream.control.backends.local import LocalCluster
from elastream.control.checkpoints import CheckpointDriver, CheckpointResult
from elastream.control.migration import MigrationDriver
from elastream.core.migration import Action, ActionKind, MigrationCoordinator, MigrationReport
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology


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
    cluster: LocalCluster, topology: Topology, new: Schedule, executor: str, checkpoint: bool
) -> KilledDuringCapture:
    """A CCR migration to `new`, mid-stream, whose worker running `executor` is killed during capture; with
    `checkpoint`, a checkpoint is taken (and must complete) half a second before the migration starts, so
    that there are events after it for the rollback to replay."""
    victim = cluster.current_schedule().node_of(executor)
    time.sleep(1.0)  # mid-stream
    taken: CheckpointResult | None = None
    if checkpoint:
        taken = CheckpointDriver(topology, cluster, cluster.client).take()
        assert taken.outcome == "completed", taken.reason
    time.sleep(0.5)
    driver = MigrationDriver(
        topology, cluster, cluster.client, "ccr", before_action=kill_during_capture(cluster, victim)
    )
    return KilledDuringCapture(victim, taken, driver.migrate(new))
