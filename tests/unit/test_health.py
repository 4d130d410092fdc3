"""Health that GitOps tools read: the Ready / Reconciling / Stalled conditions (kstatus' and Flux's), what
kstatus makes of each status the operator writes, and the Argo CD health check (Lua) run on the same documents.

kstatus is Go (sigs.k8s.io/cli-utils pkg/kstatus/status); `kstatus_compute` below is its generic path for a
custom resource, rule for rule (generic.go `checkGenericProperties`, `checkGeneration`; status.go `Compute`,
which takes a kind without rules of its own as Current when no rule decided). The e2e tier's checker
(tests/e2e/kstatus) runs the real one on the documents `health_cases` writes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastream.core.status import STALL_AFTER_FAILURES, StatusFacts, desired_conditions, phase
from support.health_cases import CASES, REDIS_DOWN, document
from support.paths import REPO

LUA_CHECK = os.path.join(REPO, "deploy", "argocd", "streamtopology-health.lua")


def by_type(facts: StatusFacts) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in desired_conditions(facts)}


def gitops(facts: StatusFacts) -> dict[str, tuple[str, str]]:
    return {k: v for k, v in by_type(facts).items() if k in ("Ready", "Reconciling", "Stalled")}


# ---- the conditions, one state at a time -----------------------------------------------------------------


def test_running_as_specified_is_ready_and_neither_reconciling_nor_stalled() -> None:
    facts = StatusFacts(3, 3, started=True)
    assert gitops(facts) == {"Ready": ("True", "AsExpected")}
    ready = next(c for c in desired_conditions(facts) if c["type"] == "Ready")
    assert ready["message"] == "running as specified: 3 of 3 nodes ready"


def test_starting_is_reconciling() -> None:
    assert gitops(StatusFacts(3, 0)) == {"Ready": ("False", "NodesNotReady"), "Reconciling": ("True", "Starting")}


def test_pods_waiting_for_a_place_are_reconciling_and_ready_says_why() -> None:
    why = "pod t-node-2 cannot be scheduled: 0/3 nodes are available"
    conditions = {c["type"]: c for c in desired_conditions(StatusFacts(3, 2, pending=why))}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "WorkersPending")
    assert why in conditions["Ready"]["message"]
    assert conditions["Reconciling"]["status"] == "True" and "Stalled" not in conditions


def test_scaling_is_reconciling() -> None:
    assert gitops(StatusFacts(3, 3, started=True, scaling=True)) == {
        "Ready": ("False", "Scaling"),
        "Reconciling": ("True", "Scaling"),
    }


def test_redis_briefly_away_is_reconciling_not_stalled() -> None:
    facts = StatusFacts(3, 3, started=True, redis_unavailable=REDIS_DOWN, redis_down_s=5.0)
    assert phase(facts) == "Running"
    assert gitops(facts) == {"Ready": ("False", "RedisUnavailable"), "Reconciling": ("True", "RedisUnavailable")}


def test_redis_away_past_the_grace_is_degraded_and_still_reconciling() -> None:
    facts = StatusFacts(3, 3, started=True, redis_unavailable=REDIS_DOWN, redis_down_s=90.0)
    assert by_type(facts)["Degraded"] == ("True", "RedisUnavailable")
    assert gitops(facts) == {"Ready": ("False", "RedisUnavailable"), "Reconciling": ("True", "RedisUnavailable")}


def test_a_start_that_fails_while_redis_is_away_is_waited_for_not_stalled() -> None:
    facts = StatusFacts(3, 0, redis_unavailable=REDIS_DOWN, start_failures=STALL_AFTER_FAILURES + 5)
    assert gitops(facts)["Reconciling"] == ("True", "RedisUnavailable") and "Stalled" not in gitops(facts)


def test_recovering_from_a_lost_worker_is_reconciling() -> None:
    facts = StatusFacts(3, 2, started=True, worker_lost="pod t-node-1 is gone", recovering=True)
    assert gitops(facts) == {"Ready": ("False", "WorkerLost"), "Reconciling": ("True", "Recovering")}


def test_an_invalid_spec_is_stalled_and_not_ready() -> None:
    facts = StatusFacts(3, 0, invalid_spec="spec.nodes: must be at least 1")
    assert gitops(facts) == {"Ready": ("False", "InvalidSpec"), "Stalled": ("True", "InvalidSpec")}
    stalled = next(c for c in desired_conditions(facts) if c["type"] == "Stalled")
    assert stalled["message"] == "spec.nodes: must be at least 1"
    # also when it ran before the spec was broken
    assert gitops(StatusFacts(3, 3, started=True, invalid_spec="x"))["Stalled"] == ("True", "InvalidSpec")


@pytest.mark.parametrize(
    ("field", "reason"),
    [("state_lost", "StateLost"), ("not_owned", "ObjectNotOwned"), ("redis_user_refused", "RedisUserRefused")],
)
def test_what_only_the_user_can_fix_is_stalled(field: str, reason: str) -> None:
    for started in (True, False):
        facts = StatusFacts(3, 3 if started else 0, started=started, **{field: "what and the fix"})
        assert gitops(facts) == {"Ready": ("False", reason), "Stalled": ("True", reason)}


def test_a_scaling_that_failed_is_retried_then_stalled_after_repeated_failures() -> None:
    failed = "pods not ready after 60 s"
    once = StatusFacts(3, 3, started=True, scaling_failed=failed, scaling_failures=1)
    assert gitops(once) == {"Ready": ("False", "ScalingFailed"), "Reconciling": ("True", "ScalingFailed")}
    reconciling = next(c for c in desired_conditions(once) if c["type"] == "Reconciling")
    assert "retrying" in reconciling["message"] and failed in reconciling["message"]
    again = StatusFacts(3, 3, started=True, scaling_failed=failed, scaling_failures=STALL_AFTER_FAILURES - 1)
    assert "Stalled" not in gitops(again)
    stuck = StatusFacts(3, 3, started=True, scaling_failed=failed, scaling_failures=STALL_AFTER_FAILURES)
    assert gitops(stuck) == {"Ready": ("False", "ScalingFailed"), "Stalled": ("True", "ScalingFailed")}
    assert by_type(stuck)["Available"] == ("True", "AllNodesReady")  # the old schedule runs on
    # the retry under way: reconciling again, not stalled
    retrying = StatusFacts(3, 3, started=True, scaling=True, scaling_failed=failed, scaling_failures=3)
    assert gitops(retrying)["Reconciling"] == ("True", "Scaling") and "Stalled" not in gitops(retrying)


def test_a_start_failing_in_backoff_is_reconciling_then_stalled() -> None:
    error = "pods is forbidden: exceeded quota"
    once = StatusFacts(3, 0, backend_error=error, start_failures=1)
    assert gitops(once) == {"Ready": ("False", "BackendError"), "Reconciling": ("True", "StartFailed")}
    stuck = StatusFacts(3, 0, backend_error=error, start_failures=STALL_AFTER_FAILURES)
    assert gitops(stuck) == {"Ready": ("False", "StartFailed"), "Stalled": ("True", "StartFailed")}
    assert error in next(c for c in desired_conditions(stuck) if c["type"] == "Stalled")["message"]


def test_suspended_is_ready_true_with_reason_suspended_and_neither_reconciling_nor_stalled() -> None:
    facts = StatusFacts(0, 0, started=True, suspended=True, suspended_at="ckpt-12")
    assert phase(facts) == "Suspended"
    assert by_type(facts) == {
        "Available": ("False", "Suspended"),
        "Progressing": ("False", "Suspended"),
        "Degraded": ("False", "Suspended"),
        "Ready": ("True", "Suspended"),
    }
    ready = next(c for c in desired_conditions(facts) if c["type"] == "Ready")
    assert "ckpt-12" in ready["message"]
    never = StatusFacts(0, 0, started=True, suspended=True)
    assert "sources' beginning" in next(c for c in desired_conditions(never) if c["type"] == "Ready")["message"]


def test_suspending_is_reconciling_then_stalled_when_its_checkpoint_keeps_failing() -> None:
    why = "the last checkpoint was not taken: node-2 not answering"
    once = StatusFacts(3, 3, started=True, suspending=why, suspend_failures=1)
    assert phase(once) == "Running"  # nothing was stopped
    assert gitops(once) == {"Ready": ("False", "Suspending"), "Reconciling": ("True", "Suspending")}
    stuck = StatusFacts(3, 3, started=True, suspending=why, suspend_failures=STALL_AFTER_FAILURES)
    assert gitops(stuck) == {"Ready": ("False", "SuspendFailed"), "Stalled": ("True", "SuspendFailed")}
    assert why in next(c for c in desired_conditions(stuck) if c["type"] == "Stalled")["message"]


def test_resuming_is_reconciling_and_redis_away_meanwhile_says_so() -> None:
    assert gitops(StatusFacts(3, 0, started=True, resuming=True))["Reconciling"] == ("True", "Resuming")
    away = StatusFacts(3, 0, started=True, resuming=True, redis_unavailable=REDIS_DOWN, redis_down_s=5.0)
    assert gitops(away)["Reconciling"] == ("True", "RedisUnavailable")


facts_strategy = st.builds(
    StatusFacts,
    desired_nodes=st.integers(0, 4),
    ready_nodes=st.integers(0, 4),
    started=st.booleans(),
    scaling=st.booleans(),
    recovering=st.booleans(),
    invalid_spec=st.sampled_from(["", "spec.nodes: bad"]),
    scaling_failed=st.sampled_from(["", "no slots"]),
    backend_error=st.sampled_from(["", "API down"]),
    worker_lost=st.sampled_from(["", "pod gone"]),
    pending=st.sampled_from(["", "no node fits"]),
    redis_unavailable=st.sampled_from(["", REDIS_DOWN]),
    redis_down_s=st.sampled_from([0.0, 5.0, 90.0]),
    state_lost=st.sampled_from(["", "gone"]),
    not_owned=st.sampled_from(["", "ConfigMap x"]),
    redis_user_refused=st.sampled_from(["", "NOPERM"]),
    scaling_failures=st.integers(0, 5),
    start_failures=st.integers(0, 5),
    suspended=st.booleans(),
    suspending=st.sampled_from(["", "checkpoint failed"]),
    suspend_failures=st.integers(0, 5),
    resuming=st.booleans(),
)


@given(facts_strategy)
def test_the_conditions_keep_kstatus_and_flux_rules_in_every_state(facts: StatusFacts) -> None:
    conditions = {c["type"]: c for c in desired_conditions(facts)}
    ready = conditions["Ready"]["status"] == "True"  # Ready is always there (fluxcd/pkg FAIL0002)
    # one of Reconciling / Stalled present at a time, and only when True (FAIL0005; kstatus reads the first)
    assert not ("Reconciling" in conditions and "Stalled" in conditions)
    assert all(conditions[k]["status"] == "True" for k in ("Reconciling", "Stalled") if k in conditions)
    # Ready True: nothing abnormal (FAIL0001); Ready False: kstatus must not say Current, so one of them is True
    abnormal = [
        k
        for k in ("Reconciling", "Stalled", "Degraded", "Progressing")
        if conditions.get(k, {}).get("status") == "True"
    ]
    suspended = conditions["Ready"]["reason"] == "Suspended"
    if suspended:  # suspended as asked: the spec is reached (kstatus Current), yet no worker serves
        assert ready and phase(facts) == "Suspended" and abnormal == []
        assert conditions["Available"]["status"] == "False"
    elif ready:
        assert abnormal == [] and conditions["Available"]["status"] == "True"
    else:
        assert "Reconciling" in conditions or "Stalled" in conditions
    # Ready says what the three workload conditions say (suspended aside)
    assert suspended or ready == (
        conditions["Available"]["status"] == "True"
        and conditions["Progressing"]["status"] == "False"
        and conditions["Degraded"]["status"] == "False"
    )
    if facts.invalid_spec:
        assert "Stalled" in conditions and conditions["Ready"]["reason"] == "InvalidSpec"


# ---- kstatus' generic rules for a custom resource, on the documents the operator writes -------------------


def kstatus_compute(resource: Mapping[str, Any]) -> tuple[str, str]:
    """(status, message) as sigs.k8s.io/cli-utils' kstatus `status.Compute` gives them for a custom resource."""
    metadata, status = resource.get("metadata") or {}, resource.get("status") or {}
    if metadata.get("deletionTimestamp"):
        return "Terminating", "Resource scheduled for deletion"
    generation, observed = metadata.get("generation"), status.get("observedGeneration")
    if generation is not None and observed is not None and observed != generation:
        kind = resource.get("kind")
        return "InProgress", f"{kind} generation is {generation}, but latest observed generation is {observed}"
    for condition in status.get("conditions") or []:  # the first of them in the list decides
        if condition.get("type") == "Reconciling" and condition.get("status") == "True":
            return "InProgress", str(condition.get("message", ""))
        if condition.get("type") == "Stalled" and condition.get("status") == "True":
            return "Failed", str(condition.get("message", ""))
    return "Current", "Resource is current"


@pytest.mark.parametrize("name", list(CASES))
def test_kstatus_reads_each_status_as_meant(name: str) -> None:
    case = CASES[name]
    status, message = kstatus_compute(document(name, case))
    assert status == case.kstatus, message
    assert message  # an explanation for `flux` / `kpt` / `kubectl` users


# ---- the Argo CD health check, in a real Lua 5.1 (Argo CD's gopher-lua speaks 5.1) --------------------------


def lua_runtime() -> Any:
    try:
        from lupa import lua51
    except ImportError as exc:  # not a skip: the check ships, so it must be tested
        raise AssertionError(
            "lupa (a Lua interpreter for Python, in operator/pyproject.toml's dev extras) is needed to test "
            f"{LUA_CHECK}: pip install -e 'operator[dev]' ({exc})"
        ) from exc
    return lua51.LuaRuntime(unpack_returned_tuples=True)


def argocd_health(resource: Mapping[str, Any]) -> dict[str, str]:
    """Run the health check as Argo CD does: `obj` a global table, the script's chunk returns `hs`."""
    lua = lua_runtime()

    def table(value: Any) -> Any:
        if isinstance(value, Mapping):
            return lua.table_from({k: table(v) for k, v in value.items()})
        if isinstance(value, list):
            return lua.table_from([table(v) for v in value])
        return value

    lua.globals().obj = table(resource)
    with open(LUA_CHECK, encoding="utf-8") as handle:
        script = handle.read()
    hs = lua.execute(script)
    return {"status": str(hs["status"]), "message": str(hs["message"])}


@pytest.mark.parametrize("name", list(CASES))
def test_the_argocd_health_check_reads_each_status_as_meant(name: str) -> None:
    case = CASES[name]
    resource = document(name, case)
    health = argocd_health(resource)
    assert health["status"] == case.argocd, health
    assert health["message"]
    conditions = {c["type"]: c for c in resource["status"]["conditions"]}
    if case.observed == case.generation and "Stalled" in conditions:
        assert conditions["Stalled"]["message"] in health["message"]


def test_the_argocd_health_check_without_a_status_waits() -> None:
    bare = {"apiVersion": "elastream.dev/v1alpha1", "kind": "StreamTopology", "metadata": {"generation": 1}}
    assert argocd_health(bare)["status"] == "Progressing"
    old = {**bare, "status": {"observedGeneration": 1, "conditions": [{"type": "Available", "status": "True"}]}}
    assert argocd_health(old)["status"] == "Progressing"  # an operator before Ready: not Healthy by mistake


def test_the_docs_show_the_argocd_check_as_shipped() -> None:
    with open(LUA_CHECK, encoding="utf-8") as handle:
        script = handle.read()
    with open(os.path.join(REPO, "docs", "operations.md"), encoding="utf-8") as handle:
        docs = handle.read()
    assert "resource.customizations.health.elastream.dev_StreamTopology: |" in docs
    body = "\n".join("    " + line if line else "" for line in script.splitlines())
    assert body in docs, "docs/operations.md's argocd-cm snippet differs from deploy/argocd/streamtopology-health.lua"
