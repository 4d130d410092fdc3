"""Phase and conditions of a StreamTopology from what the controller knows, and the worker pod it creates."""

from __future__ import annotations

from elastream.control.backends.worker_objects import WorkerPodSettings, pod_name, selector_for, worker_pod
from elastream.core.status import StatusFacts, desired_conditions, merge_conditions, phase
from elastream.core.topology import parse_manifest
from support.manifests import edge, manifest, sink, src


def by_type(conditions):
    return {c["type"]: (c["status"], c["reason"]) for c in conditions}


def test_running_with_every_node_ready_is_available_stable_not_degraded() -> None:
    facts = StatusFacts(desired_nodes=3, ready_nodes=3, started=True)
    assert phase(facts) == "Running"
    assert by_type(desired_conditions(facts)) == {
        "Available": ("True", "AllNodesReady"),
        "Progressing": ("False", "Stable"),
        "Degraded": ("False", "AsExpected"),
        "Ready": ("True", "AsExpected"),
    }


def test_scaling_starting_and_lost_workers() -> None:
    assert phase(StatusFacts(3, 3, started=True, scaling=True)) == "Scaling"
    assert by_type(desired_conditions(StatusFacts(3, 3, started=True, scaling=True)))["Progressing"] == (
        "True",
        "Scaling",
    )
    assert phase(StatusFacts(3, 0)) == "Pending"
    assert by_type(desired_conditions(StatusFacts(3, 0)))["Progressing"] == ("True", "Starting")
    lost = StatusFacts(3, 2, started=True, worker_lost="pod t-node-1 is gone", recovering=True)
    assert phase(lost) == "Degraded"
    conditions = by_type(desired_conditions(lost))
    assert conditions["Available"] == ("False", "NodesNotReady")
    assert conditions["Degraded"] == ("True", "WorkerLost")
    assert conditions["Progressing"] == ("True", "Recovering")


def test_an_invalid_spec_fails_with_the_fields_named() -> None:
    facts = StatusFacts(3, 0, invalid_spec="spec.slotsPerNode: 2 nodes × 1 slots ...")
    assert phase(facts) == "Failed"
    conditions = desired_conditions(facts)
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "spec.slotsPerNode" in degraded["message"]


def test_a_failed_scaling_degrades_but_stays_available() -> None:
    conditions = by_type(desired_conditions(StatusFacts(3, 3, started=True, scaling_failed="no slots")))
    assert conditions["Available"] == ("True", "AllNodesReady")
    assert conditions["Degraded"] == ("True", "ScalingFailed")


def test_pods_no_node_can_take_are_named_in_the_available_condition() -> None:
    why = "pod demo-node-3 cannot be scheduled: 0/3 nodes are available: 3 Insufficient cpu."
    facts = StatusFacts(4, 3, started=False, pending=why)
    conditions = {c["type"]: c for c in desired_conditions(facts)}
    assert (conditions["Available"]["status"], conditions["Available"]["reason"]) == ("False", "WorkersPending")
    assert conditions["Available"]["message"] == f"3 of 4 nodes ready; {why}"
    assert conditions["Progressing"]["reason"] == "Starting" and phase(facts) == "Pending"
    # once started, a worker pod that lost its place is Degraded, still named
    assert phase(StatusFacts(4, 3, started=True, pending=why)) == "Degraded"


def test_last_transition_time_changes_only_with_the_status() -> None:
    first = merge_conditions(None, desired_conditions(StatusFacts(3, 3, started=True)), "T1", 1)
    same = merge_conditions(first, desired_conditions(StatusFacts(3, 3, started=True)), "T2", 2)
    assert {c["lastTransitionTime"] for c in same} == {"T1"} and {c["observedGeneration"] for c in same} == {2}
    changed = merge_conditions(same, desired_conditions(StatusFacts(3, 3, started=True, scaling=True)), "T3", 3)
    times = {c["type"]: c["lastTransitionTime"] for c in changed}
    assert times == {"Available": "T1", "Progressing": "T3", "Degraded": "T1", "Ready": "T3", "Reconciling": "T3"}
    again = merge_conditions(changed, desired_conditions(StatusFacts(3, 3, started=True, scaling=True)), "T4", 3)
    assert {c["type"]: c["lastTransitionTime"] for c in again} == times  # the same status: the same times


def test_worker_pod_is_owned_labelled_hardened_and_reads_redis_from_the_secret() -> None:
    topology = parse_manifest(manifest([src("s"), sink("z")], [edge("s", "z")], name="pageload", spreadOverNodes=True))
    owner = {"name": "pageload", "uid": "u-1"}
    pod = worker_pod(topology, "node-3", owner, WorkerPodSettings(image="w:1"), staged_version=7)
    assert pod["metadata"]["name"] == pod_name(topology, "node-3") == "pageload-node-3"
    labels = pod["metadata"]["labels"]
    assert labels["elastream.dev/node"] == "node-3" and labels["app.kubernetes.io/instance"] == "pageload"
    assert all(f"{k}={v}" in selector_for(topology) for k, v in labels.items() if k.startswith("app.kubernetes.io"))
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    container = pod["spec"]["containers"][0]
    assert container["image"] == "w:1"
    assert container["args"][-2:] == ["--schedule-version", "7"]
    assert container["args"][5:9] == ["--bind", "0.0.0.0:7000", "--advertise", "$(POD_IP)"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ELASTREAM_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "pageload-redis", "key": "url"}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert not any("redis://" in a for a in container["args"])  # never on a command line
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"]
    assert security["allowPrivilegeEscalation"] is False
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_a_condition_message_longer_than_the_crd_allows_is_cut_with_a_marker() -> None:
    from elastream.core.status import CONDITION_MESSAGE_MAX_BYTES, TRUNCATED, fit_message
    from elastream.crd import openapi_schema

    status = openapi_schema()["properties"]["status"]["properties"]
    assert status["conditions"]["items"]["properties"]["message"]["maxLength"] == CONDITION_MESSAGE_MAX_BYTES
    fits = "x" * CONDITION_MESSAGE_MAX_BYTES
    assert fit_message(fits) == fits  # exactly at the limit: untouched
    long = "spec.vertices[0].name: " + "é" * CONDITION_MESSAGE_MAX_BYTES  # two bytes each
    cut = fit_message(long)
    assert cut.endswith(TRUNCATED) and cut.startswith("spec.vertices[0].name: éé")
    assert len(cut.encode("utf-8")) <= CONDITION_MESSAGE_MAX_BYTES  # bytes, so characters too
    assert len(cut.encode("utf-8")) > CONDITION_MESSAGE_MAX_BYTES - 4  # cut at the limit, not far below
    [available, _, degraded, ready, stalled] = desired_conditions(
        StatusFacts(desired_nodes=1, ready_nodes=0, invalid_spec=long)
    )
    assert available["message"] == degraded["message"] == ready["message"] == stalled["message"] == cut
