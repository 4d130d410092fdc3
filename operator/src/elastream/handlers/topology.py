"""kopf handlers for StreamTopology resources: thin, every decision is in `elastream.control.reconciler`.

- a daemon per resource runs its level-triggered reconcile loop: each pass (`TopologyReconciler.reconcile`,
  on the operator's reconcile pool, so a thousand topologies are a thousand asyncio tasks, not a thousand
  threads; a pass that waits for pods gives its slot back: `control.reconcile_slots`) compares the
  resource's spec with what runs and acts; it sleeps until the next pass is due or the resource changes;
- a change of the resource (its spec or annotations: a new generation) only wakes the loop;
- delete: kopf's finalizer keeps the resource until a migration in flight stopped (bounded), the pods are
  stopped and its Redis keys deleted.
The status has one writer (the loop's); these handlers write nothing.

What every topology's handlers share (the reconcile loop and the pool its passes run on) reaches them through
kopf's memo, never a module global: `elastream operator` hands kopf an `OperatorMemo` holding both
(`kopf.run(memo=...)`), and kopf starts each resource's memo as a shallow copy of it, so each handler finds them
in its own `memo` argument, beside the resource's own keys (`wake`, `seen`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from concurrent.futures import Executor
from typing import Any

import kopf

from elastream.control.reconciler import TopologyReconciler
from elastream.control.resource_api import GROUP, PLURAL, VERSION
from elastream.log_format import CURRENT_TOPOLOGY


class OperatorMemo(kopf.Memo):
    """kopf's operator memo as `elastream operator` fills it (`handlers.main.run`): kopf shallow-copies it into
    each resource's memo, so the handlers read these two from their `memo` argument, typed."""

    #: the reconcile loop of every topology (`control.reconciler`)
    topologies: TopologyReconciler
    #: the threads passes run on (`control.reconcile_slots.ReconcilePool`: every topology shares its slots; a
    #: pass that waits gives its slot back)
    pool: Executor

    def __init__(self, topologies: TopologyReconciler, pool: Executor) -> None:
        super().__init__(topologies=topologies, pool=pool)


def _concerns(body: kopf.Body) -> tuple[str, str]:
    """(namespace, name) of the resource, for the log lines about it."""
    return body["metadata"].get("namespace") or "default", body["metadata"]["name"]


def _wake_event(memo: kopf.Memo) -> asyncio.Event:
    """The resource's own wake-up (a key of its memo, never of the operator memo it was copied from)."""
    wake = memo.get("wake")
    if not isinstance(wake, asyncio.Event):
        wake = memo["wake"] = asyncio.Event()
    return wake


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def reconcile_loop(body: kopf.Body, memo: OperatorMemo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """The resource's loop: a pass, then sleep until it is due or the resource changes."""
    # the daemon's task has a context of its own, which the pool copies into each pass's thread: every line
    # of this loop and its passes names the topology (`elastream.log_format`)
    CURRENT_TOPOLOGY.set(_concerns(body))
    wake = _wake_event(memo)
    loop = asyncio.get_running_loop()
    while not stopped:
        wake.clear()
        resource = copy.deepcopy(dict(body))  # the live view changes under a pass: it reads one version
        delay = await loop.run_in_executor(memo.pool, memo.topologies.reconcile, resource)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=max(0.05, delay))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A new generation (spec) or new annotations: wake the loop (our own status writes do not)."""
    obj = event.get("object") or {}
    metadata = obj.get("metadata") or {}
    seen = (metadata.get("generation"), tuple(sorted((metadata.get("annotations") or {}).items())))
    if memo.get("seen") != seen:
        memo["seen"] = seen
        _wake_event(memo).set()


@kopf.on.delete(GROUP, VERSION, PLURAL)
def stop(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    CURRENT_TOPOLOGY.set(_concerns(body))  # kopf runs a sync handler in a copy of the context: this call's own
    retain = (body.get("spec") or {}).get("deletionPolicy") == "Retain"
    memo.topologies.remove(body["metadata"].get("namespace", "default"), body["metadata"]["name"], retain=retain)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # here (the operator memo) rather than in every resource's handler: without it no handler could act
    if not isinstance(memo, OperatorMemo):
        raise kopf.PermanentError("the operator is not configured (run it with `elastream operator`)")
    # our events are posted by `KubernetesEvents`, once per fact; kopf's own log lines would bury them
    settings.posting.enabled = False
    settings.persistence.finalizer = "elastream.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="elastream.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="elastream.dev")
    settings.watching.server_timeout = 60
