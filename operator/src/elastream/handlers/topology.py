"""kopf handlers for StreamTopology resources: thin, every decision is in `elastream.control`.

- create / resume: validate, start (or adopt) the worker pods, finish a migration an earlier operator left;
- a change of `spec.nodes` (`kubectl patch`, `kubectl scale`, an HPA): analyse, plan, migrate;
- a change of a vertex's `parallelism`: migrate to those degrees; of `spec.scaling.auto`: applied at once
  (the autoscaler runs in the timer's tick and writes its node count back to `spec.nodes`);
- a timer: dead workers recovered from the last checkpoint, status (rates, conditions) refreshed;
- delete: kopf's finalizer keeps the resource until the pods are stopped and its Redis keys deleted;
- a worker pod deleted or failed outside a migration is seen by the timer (`failed_nodes`) and replaced.
A spec the API server accepted but that cannot run (graph and slot checks) becomes Degraded/InvalidSpec with
an event naming the field: no crash loop, no stuck finalizer.
"""

from __future__ import annotations

import time
from typing import Any

import kopf

from elastream.control.resources import (
    GROUP,
    PLURAL,
    VERSION,
    KubernetesEvents,
    ManagedTopologies,
)
from elastream.core.ports import BackendError
from elastream.core.status import StatusFacts, desired_conditions, merge_conditions
from elastream.core.topology import TopologyError

#: set by `elastream operator` before kopf starts
TOPOLOGIES: ManagedTopologies | None = None
#: seconds between status refreshes (and dead-worker checks) per topology
TICK_S = 2.0


_EVENTS: dict[str, KubernetesEvents] = {}


def events_for(body: Any) -> KubernetesEvents:
    """The event sink of this resource (one per resource, so repeats are recognised across handlers)."""
    key = f"{body['metadata'].get('namespace')}/{body['metadata']['name']}"
    sink = _EVENTS.get(key)
    if sink is None:
        sink = _EVENTS[key] = topologies().events_for(body)
    return sink


def topologies() -> ManagedTopologies:
    if TOPOLOGIES is None:
        raise kopf.PermanentError("the operator is not configured (run it with `elastream operator`)")
    return TOPOLOGIES


def invalid(body: Any, patch: Any, exc: TopologyError) -> None:
    """A spec that cannot run: Degraded/InvalidSpec with the fields named, an event; nothing is retried."""
    message = "; ".join(exc.problems)
    facts = StatusFacts(int((body.get("spec") or {}).get("nodes") or 0), 0, invalid_spec=message)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = merge_conditions(
        (body.get("status") or {}).get("conditions"),
        desired_conditions(facts),
        now,
        body["metadata"].get("generation", 0),
    )
    patch.status.update(phase="Failed", conditions=conditions, observedGeneration=body["metadata"].get("generation", 0))
    events_for(body).emit("InvalidSpec", message, warning=True)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
def start(body: Any, patch: Any, **_: Any) -> None:
    try:
        managed = topologies().ensure(body, events_for(body))
    except TopologyError as exc:
        invalid(body, patch, exc)
        return
    except BackendError as exc:
        events_for(body).emit("StartFailed", f"{exc}; retrying in 10 s", warning=True)
        raise kopf.TemporaryError(str(exc), delay=10) from None
    running = len(managed.controller.backend.current_schedule().nodes)
    if running != managed.topology.nodes:  # spec.nodes changed while no operator ran
        topologies().scale(managed, managed.topology.nodes, body["metadata"].get("generation", 0), events_for(body))
    patch.status.update(managed.status())


@kopf.on.field(GROUP, VERSION, PLURAL, field="spec.nodes")
def nodes_changed(body: Any, old: Any, new: Any, patch: Any, **_: Any) -> None:
    if old is None or new is None or old == new:
        return  # creation is `start`'s
    managed = topologies().get(body["metadata"].get("namespace", "default"), body["metadata"]["name"])
    if managed is None:
        raise kopf.TemporaryError("the topology is not running yet", delay=5)
    if int(new) == len(managed.controller.backend.current_schedule().nodes):
        # the autoscaler wrote what already runs (or a request was undone meanwhile): nothing to move
        managed.controller.topology = managed.controller.topology.with_nodes(int(new))
        patch.status.update(managed.status())
        return
    record = topologies().scale(managed, int(new), body["metadata"].get("generation", 0), events_for(body))
    patch.status.update(managed.status())
    if record.outcome == "failed":
        # the old schedule runs on; the record and the Degraded condition say why
        return


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def spec_changed(body: Any, diff: Any, **_: Any) -> None:
    """`spec.scaling.auto` applies at once, a vertex's `parallelism` by a migration; other changes are
    reported, not applied (`spec.nodes` is `nodes_changed`'s)."""
    others = [".".join(str(p) for p in path) for _, path, _, _ in diff if tuple(path)[:1] != ("nodes",)]
    if not others:
        return
    managed = topologies().get(body["metadata"].get("namespace", "default"), body["metadata"]["name"])
    if managed is None:
        raise kopf.TemporaryError("the topology is not running yet", delay=5)
    try:
        ignored = topologies().apply_spec(managed, body, events_for(body))
    except TopologyError as exc:
        events_for(body).emit("InvalidSpec", "; ".join(exc.problems), warning=True)
        return
    if ignored:
        events_for(body).emit(
            "SpecChangeIgnored",
            f"{', '.join(ignored)} changed: only spec.nodes, spec.scaling.auto and vertices' parallelism apply to a "
            "running topology (delete and re-create the topology to apply the rest)",
            warning=True,
        )


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_S, idle=0, sharp=True)
def refresh(body: Any, patch: Any, **_: Any) -> None:
    managed = topologies().get(body["metadata"].get("namespace", "default"), body["metadata"]["name"])
    if managed is None:
        return
    status = topologies().tick(managed, events_for(body))
    if status is not None:
        patch.status.update(status)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def stop(body: Any, **_: Any) -> None:
    topologies().remove(body["metadata"].get("namespace", "default"), body["metadata"]["name"])
    _EVENTS.pop(f"{body['metadata'].get('namespace')}/{body['metadata']['name']}", None)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # our events are posted by `KubernetesEvents`, once per fact; kopf's own log lines ("Handler succeeded"
    # every timer tick) would bury them
    settings.posting.enabled = False
    settings.persistence.finalizer = "elastream.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="elastream.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="elastream.dev")
    settings.watching.server_timeout = 60
