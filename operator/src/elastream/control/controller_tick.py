"""The running topology's upkeep, a part of the reconcile pass (`ControllerTick`): the pods that cannot start
or died, then one tick of its controller (`TopologyController.tick`: dead workers recovered, checkpoint rounds
begun and polled, drain requests carried out, the autoscaler's decision, the rates), what it did counted in
the operator's metrics (`control.topology_metrics`).

It owns the facts of the pods (pending, worker_lost, recovering) and of the tick (Redis, a lost state); it
writes the status once before a tick that recovers dead workers (it may wait for their pods)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from elastream.control.managed import ManagedTopology
from elastream.control.topology_metrics import count_recovery, count_rescale

log = logging.getLogger("elastream.operator")


class ControllerTick:
    """One tick of each running topology (see the module)."""

    def tick(self, managed: ManagedTopology) -> None:
        controller = managed.running()
        before, before_scaling = controller.last_recovery, controller.last_scaling
        managed.report_pending(look(managed.backend.pending_nodes, {}))
        failed = look(managed.backend.failed_nodes, {})
        if failed:
            managed.set(worker_lost="; ".join(failed.values()), recovering=True)
            managed.write()  # WorkerLost, before the tick's recovery waits for new pods
        controller.tick()
        managed.note_store()
        managed.set(state_lost=controller.state_lost, backend_error="")  # this pass went through
        recovery = controller.last_recovery
        if recovery is not None and recovery is not before:
            count_recovery(controller.topology.namespace, controller.topology.name, recovery)
        if controller.last_scaling is not None and controller.last_scaling is not before_scaling:
            # the autoscaler's rescale, carried out by the tick (`Convergence.scale` counts the spec's)
            count_rescale(controller.topology.namespace, controller.topology.name, controller.last_scaling)
        if not look(managed.backend.failed_nodes, failed):
            managed.set(worker_lost="", recovering=False)


def look(read: Callable[[], dict[str, str]], default: dict[str, str]) -> dict[str, str]:
    """What `read` says about the pods, or `default` while the API server or Redis cannot answer (the
    controller's own tick notes that and retries)."""
    try:
        return read()
    except Exception as exc:
        log.debug("pods not read: %s", exc)
        return default
