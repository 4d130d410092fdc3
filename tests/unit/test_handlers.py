"""The kopf handlers (`elastream.handlers.topology`) take what every topology shares from their `memo`: kopf's
operator memo (`OperatorMemo`, which `elastream operator` gives `kopf.run`) shallow-copied into each resource's
memo, as kopf does. The reconcile loop here is a fake that records what it was asked."""

from __future__ import annotations

import asyncio
import contextvars
import copy
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
import pytest

from elastream.handlers import topology as handlers


class Topologies:
    """`TopologyReconciler` as the handlers use it: one pass per call, a topology removed on delete."""

    def __init__(self, stopped: Stopped) -> None:
        self.stopped = stopped
        self.passes: list[dict[str, Any]] = []
        self.removed: list[tuple[str, str, bool]] = []

    def reconcile(self, resource: dict[str, Any]) -> float:
        self.passes.append(resource)
        self.stopped.flag = True  # one pass is enough: the loop ends after it
        return 0.0

    def remove(self, namespace: str, name: str, retain: bool = False) -> None:
        self.removed.append((namespace, name, retain))


class Stopped:
    """kopf's `DaemonStopped`: false until the daemon is told to stop."""

    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag


def body(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "team", "name": "web", "generation": 1}, "spec": spec}


def test_a_resources_memo_is_a_copy_of_the_operator_memo_holding_its_loop_and_pool() -> None:
    stopped = Stopped()
    topologies = Topologies(stopped)
    with ThreadPoolExecutor(1) as pool:
        shared = handlers.OperatorMemo(topologies, pool)  # type: ignore[arg-type]
        memo = copy.copy(shared)  # what kopf hands each resource's handlers
        assert type(memo) is handlers.OperatorMemo and memo.topologies is topologies and memo.pool is pool
        asyncio.run(handlers.reconcile_loop(body=body(nodes=2), memo=memo, stopped=stopped))
        memo["seen"] = "the resource's own"
    assert [p["spec"] for p in topologies.passes] == [{"nodes": 2}]
    assert "seen" not in shared and "wake" in memo and "wake" not in shared  # per-resource keys stay its own


def test_a_delete_removes_the_topology_through_the_memos_loop() -> None:
    topologies = Topologies(Stopped())
    memo = copy.copy(handlers.OperatorMemo(topologies, ThreadPoolExecutor(1)))  # type: ignore[arg-type]
    for deleted in (body(deletionPolicy="Retain"), body()):  # as kopf runs a sync handler: in a copy of the context
        contextvars.copy_context().run(handlers.stop, body=deleted, memo=memo)
    assert topologies.removed == [("team", "web", True), ("team", "web", False)]


def test_the_operator_does_not_start_without_its_memo() -> None:
    """Run without `elastream operator` (say `kopf run` on the module), kopf's memo is a plain `kopf.Memo`:
    the startup handler stops the operator at once with one line, before any resource's handler runs."""
    with pytest.raises(kopf.PermanentError, match=r"not configured \(run it with `elastream operator`\)"):
        handlers.configure(settings=kopf.OperatorSettings(), memo=kopf.Memo())
    settings = kopf.OperatorSettings()
    with ThreadPoolExecutor(1) as pool:
        handlers.configure(settings=settings, memo=handlers.OperatorMemo(Topologies(Stopped()), pool))  # type: ignore[arg-type]
    assert settings.persistence.finalizer == "elastream.dev/finalizer" and not settings.posting.enabled
