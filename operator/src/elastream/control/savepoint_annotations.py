"""The savepoint annotations of a topology, a part of the reconcile pass (`SavepointAnnotations`): each pass
carries out what its annotations ask (`control.savepoint_actions.SavepointRequests`: take, share, delete,
retried with backoff) and keeps `status.savepoints` (once there is one) as the savepoint store lists them.

It owns each topology's `SavepointRequests` and the `savepoints` record of its status; it acts through the
topology's controller and the savepoint store (`Savepoints`), and removes the annotations it carried out."""

from __future__ import annotations

from collections.abc import Callable

from elastream.control.managed import ManagedTopology
from elastream.control.pacing import Pacing
from elastream.control.pass_context import PassContext
from elastream.control.savepoint_actions import SavepointRequests, Savepoints
from elastream.core.ports import Clock


class SavepointAnnotations:
    """The savepoint annotations of each topology (see the module)."""

    def __init__(self, savepoints: Callable[[], Savepoints], pacing: Pacing, clock: Clock) -> None:
        self.savepoints = savepoints
        self.pacing = pacing
        self.clock = clock

    def reconcile(self, managed: ManagedTopology, context: PassContext) -> None:
        """Carry out the topology's savepoint annotations (as the pass observed them)."""
        if managed.savepoints is None:
            managed.savepoints = SavepointRequests(
                self.savepoints(),
                managed.events,
                managed.resource.remove_annotation,
                retry_s=self.pacing.retry_s,
                retry_cap_s=self.pacing.retry_cap_s,
                clock=self.clock.monotonic,
            )
        managed.savepoints.reconcile(managed.running(), context.seen.annotations)
        entries = managed.savepoints.entries
        if entries is not None and (entries or "savepoints" in managed.published):
            managed.published["savepoints"] = entries
