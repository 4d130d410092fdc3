"""The reconcile loop's settings, one frozen value each part is handed: how often the loop comes back to a
topology and how it retries (`Pacing`: the seconds between passes of an idle topology, how long a changed spec
must be still before it moves anything, the backoff of a failed start, resume, suspend, upgrade or scaling),
and what the controllers it builds and its status writes and deletes take (`LoopSettings`). Every part of the
pass reads the one value; none is changed on a running loop (a test that wants others builds another
reconciler)."""

from __future__ import annotations

from dataclasses import dataclass, field

from elastream.control.operator_options import OperatorOptions


@dataclass(frozen=True)
class Pacing:
    #: seconds between passes of an idle topology (dead workers, checkpoints, the autoscaler, rates)
    tick_s: float = 2.0
    #: a changed spec is acted on once it has been still this long (a burst of patches moves once)
    settle_s: float = 1.0
    #: a failed attempt at the same desired state is retried after this, doubling up to the cap
    retry_s: float = 5.0
    retry_cap_s: float = 300.0


@dataclass(frozen=True)
class LoopSettings:
    """The settings of the reconcile loop (`control.reconciler.TopologyReconciler.loop`), handed whole to the
    controller factory and the parts of a pass rather than copied keyword by keyword."""

    pacing: Pacing = field(default_factory=Pacing)
    #: seconds between the controller's metric windows (`TopologyController.interval_s`)
    interval_s: float = 1.0
    #: how long worker pods may take to be scheduled, started and ready
    start_timeout_s: float = 180.0
    #: seconds between status writes for the rates alone
    volatile_every_s: float = 15.0
    #: how long a delete waits for a pass in progress (a migration) before it stops the workers anyway
    delete_wait_s: float = 60.0
    #: give each topology's workers a Redis ACL user of its own (`store.acl`); off: the operator's URL
    topology_users: bool = True

    @staticmethod
    def of_options(options: OperatorOptions) -> LoopSettings:
        """The loop's settings as `elastream operator` was started with them (the pacing is the loop's own)."""
        return LoopSettings(
            interval_s=options.interval_s,
            start_timeout_s=options.worker_start_timeout_s,
            volatile_every_s=options.status_every_s,
            topology_users=options.redis_topology_users,
        )
