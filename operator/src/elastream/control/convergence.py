"""Scaling to the spec, a part of the reconcile pass (`Convergence`): what of a changed spec applies without
moving executors (the autoscaler's settings, the spec's degrees into the running model), the migration to the
spec's node count and degrees once the spec settled (`TopologyController.scale_to`), a failed one retried with
backoff while it is still wanted, and whether what runs is what the spec asks for (`converged`). The
autoscaler's own decisions are the controller's tick's (`control.controller_tick`), written back to
`spec.nodes` (`ManagedTopology.autoscaled`) so that this part then finds nothing to do.

It owns the `ScaleAttempt` of a topology, its record (`control.managed.ConvergenceMemory`: the degrees applied,
which `Lifecycle` and `Upgrades` report through `started` and `upgraded`) and the facts of a scaling (scaling,
scaling_failed); it writes the status once before the migration (phase Scaling)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from elastream.control.attempts import ScaleAttempt, StartAttempt
from elastream.control.managed import ManagedTopology, spec_parallelism
from elastream.control.pacing import Pacing
from elastream.control.pass_context import PassContext
from elastream.control.scaling import ScalingRecord
from elastream.control.topology_metrics import count_rescale
from elastream.core.outcomes import Outcome
from elastream.core.ports import Clock
from elastream.core.status import EventReason
from elastream.core.topology import Topology
from elastream.core.upgrade import spec_change

log = logging.getLogger("elastream.operator")


def degrees_to_apply(
    degrees: Mapping[str, int], applied: Mapping[str, int] | None, autoscaled: bool
) -> dict[str, int] | None:
    """The spec's vertex degrees when they must be migrated to (they changed since the last applied, and the
    autoscaler does not own them), else None."""
    return dict(degrees) if dict(degrees) != applied and not autoscaled else None


def reached(wanted: Topology, running_nodes: int, applied: Mapping[str, int] | None) -> bool:
    """Whether what runs is what `wanted` asks for: its node count, and its degrees unless the autoscaler
    owns them."""
    return wanted.nodes == running_nodes and (
        wanted.scaling.auto.enabled or spec_parallelism(wanted) == (dict(applied) if applied is not None else None)
    )


class Convergence:
    """Scaling each topology to its spec (see the module)."""

    def __init__(self, pacing: Pacing, clock: Clock) -> None:
        self.pacing = pacing
        self.clock = clock

    def apply_settings(self, managed: ManagedTopology, context: PassContext) -> None:
        """What of a changed spec applies without moving executors: `scaling.auto` (the autoscaler's switch,
        bounds and thresholds), now, and the vertices' degrees into the running model (`converge` migrates
        to them). The rest is `Upgrades.apply_spec`'s."""
        controller, wanted = managed.running(), context.wanted
        running = controller.topology
        scaling = dataclasses.replace(running.scaling, auto=wanted.scaling.auto)
        same_shape = [_without_parallelism(v) for v in running.spec.get("vertices") or []] == [
            _without_parallelism(v) for v in wanted.spec.get("vertices") or []
        ]
        if scaling != running.scaling or (same_shape and running.vertices != wanted.vertices):
            controller.topology = dataclasses.replace(
                running,
                scaling=scaling,
                spec={**running.spec, "scaling": wanted.spec.get("scaling"), "vertices": wanted.spec.get("vertices")}
                if same_shape
                else {**running.spec, "scaling": wanted.spec.get("scaling")},
                vertices=wanted.vertices if same_shape else running.vertices,
            )

    def converge(self, managed: ManagedTopology, context: PassContext) -> float:
        """Move what runs (the context's schedule) towards the spec: its node count, and its vertices' degrees
        when the spec's changed. Returns the seconds until this needs another look."""
        wanted, now = context.wanted, context.now
        if context.generation < managed.expect_generation or context.store_error or context.state_lost:
            # our own write of spec.nodes is not seen yet / Redis away / its state gone: nothing may move
            return self.pacing.tick_s
        schedule = context.running_schedule()
        memory = managed.convergence
        parallelism = degrees_to_apply(
            spec_parallelism(wanted), memory.applied_parallelism, wanted.scaling.auto.enabled
        )
        if wanted.nodes == len(schedule.nodes) and parallelism is None:
            if managed.attempt is not None and managed.attempt.target != StartAttempt():
                managed.attempt = None  # undone meanwhile: nothing to retry
                managed.set(scaling_failed="")
            return self.pacing.tick_s
        settle = managed.seen.changed_at + self.pacing.settle_s - now
        if settle > 0:
            return settle
        target = ScaleAttempt.of(wanted.nodes, parallelism)
        wait = managed.waits(target, now)
        if wait is not None:
            return wait
        trigger = "spec" if parallelism is not None and wanted.nodes == len(schedule.nodes) else "request"
        record = self.scale(managed, wanted.nodes, parallelism, trigger)
        if record.outcome == Outcome.FAILED:
            attempt = managed.failed(
                target, record.reason, self.clock.monotonic(), self.pacing.retry_s, self.pacing.retry_cap_s
            )
            managed.events.emit(
                EventReason.SCALING_BACKOFF,
                f"scaling to {wanted.nodes} nodes failed {attempt.failures} time(s); the old schedule runs on; "
                f"retrying in {attempt.delay:.0f} s (a new spec is tried at once)",
                warning=True,
            )
            return attempt.delay
        managed.attempt = None
        if parallelism is not None:
            memory.applied_parallelism = dict(parallelism)
        return self.pacing.tick_s

    def started(self, managed: ManagedTopology, topology: Topology) -> None:
        """A controller of `topology` started (`Lifecycle.start`): its spec's degrees are what runs, unless the
        status already said which ran (an operator restart)."""
        if managed.convergence.applied_parallelism is None:
            managed.convergence.applied_parallelism = spec_parallelism(topology)

    def upgraded(self, managed: ManagedTopology, topology: Topology) -> None:
        """The pods of `topology` started by an upgrade (`Upgrades`): its spec's degrees are what runs."""
        managed.convergence.applied_parallelism = spec_parallelism(topology)

    def scale(
        self,
        managed: ManagedTopology,
        nodes: int,
        parallelism: Mapping[str, int] | None = None,
        trigger: str = "request",
    ) -> ScalingRecord:
        """Analyse, plan, migrate to `nodes` (and `parallelism`); the status shows Scaling meanwhile. The
        record (held back by `ManagedTopology.publish`) goes out with the pass's write at its end, after this
        pass's events."""
        controller = managed.running()
        managed.set(scaling=True)
        managed.write()  # phase Scaling, before the migration holds the pass
        try:
            record = controller.scale_to(nodes, parallelism, trigger)
        finally:
            managed.set(scaling=False)
        managed.note_store()
        managed.set(scaling_failed="" if record.outcome != Outcome.FAILED else record.reason)
        count_rescale(controller.topology.namespace, controller.topology.name, record)
        return record

    def converged(self, managed: ManagedTopology, context: PassContext) -> bool:
        """Whether what runs (the context's schedule, read after `converge`) is the spec: not while the
        autoscaler's own write of spec.nodes is unseen, the state is lost or an upgrade is still to come (Redis
        away, settling)."""
        wanted = context.wanted
        if context.generation < managed.expect_generation or context.state_lost:
            return False
        change = spec_change(managed.running().topology, wanted)
        if change.needs_restart or change.controller:
            return False
        return reached(wanted, len(context.running_schedule().nodes), managed.convergence.applied_parallelism)


def _without_parallelism(vertex: Any) -> Any:
    return {k: v for k, v in vertex.items() if k != "parallelism"} if isinstance(vertex, Mapping) else vertex
