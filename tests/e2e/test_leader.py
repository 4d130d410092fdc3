"""Two operator replicas on the real API server (the chart with `operator.replicas=2` and its leader-election
defaults: lease 15 s, renew deadline 10 s, retry 2 s): exactly one holds the Lease `elastream-operator` and acts
(the other logs that it is standby and never starts kopf; a StreamTopology's worker pods are created once). When
the active pod is deleted it releases the Lease and the standby takes over at once; when the active operator's
process dies (SIGKILL, and its pod is gone, as when its node dies) the standby takes over when the Lease expires,
about a lease duration later and not before. Across both the topology stays Available with the same worker pods
(adopted, not restarted), and the last leader still acts: it scales the topology out.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest
import yaml

from support.manifests import edge, manifest, sink, src, work
from support.paths import REPO
from support.waiting import wait_until

pytestmark = pytest.mark.e2e

RELEASE = "elastream-ha"
SYSTEM = "elastream-ha"
LEASE = "elastream-operator"
OPERATOR = "app.kubernetes.io/component=operator"
LEASE_S, RETRY_S = 15, 2  # the chart's defaults, which this test keeps


def topology(name: str, nodes: int = 2) -> dict[str, Any]:
    vertices = [src("clicks", rate=100, keys=20), work("parse", costMs=1.0), sink("out", type="redis-stream")]
    for vertex in vertices:
        vertex["maxParallelism"] = 8
    return manifest(
        vertices,
        [edge("clicks", "parse"), edge("parse", "out")],
        name=name,
        nodes=nodes,
        slotsPerNode=4,
        scaling={"strategy": "stela", "migration": "ccr", "window": 5},
    )


def get_json(kubectl, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json", quiet=True).stdout)


def lease_holder(kubectl) -> str:
    out = kubectl("get", "lease", LEASE, "-n", SYSTEM, "-o", "jsonpath={.spec.holderIdentity}", check=False, quiet=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def operator_pods(kubectl) -> list[str]:
    """The operator pods that are not being deleted."""
    items = get_json(kubectl, "pods", "-n", SYSTEM, "-l", OPERATOR)["items"]
    return sorted(p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp"))


def wait_holder_change(kubectl, old: str, timeout_s: float) -> tuple[str, float]:
    """The new holder of the Lease and the seconds it took (polled every 0.25 s)."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    while time.monotonic() < deadline:
        holder = lease_holder(kubectl)
        if holder and holder != old:
            return holder, time.monotonic() - t0
        time.sleep(0.25)
    pytest.fail(f"the Lease stayed with {old!r} for {timeout_s:.0f} s", pytrace=False)


def logs(kubelet, pod: str) -> str:
    return kubelet.logs(SYSTEM, pod, markers=False)


def kill_hard(pod: str) -> int:
    """SIGKILL the operator process of `pod` (a container's or a local process's: both are processes of this
    machine, found by the POD_NAME the chart gives it): no SIGTERM, no cleanup, no release of the Lease."""
    candidates: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if f"POD_NAME={pod}".encode() in environ:
            candidates[int(entry)] = parent
    top = [pid for pid, parent in candidates.items() if parent not in candidates]
    assert len(top) == 1, f"the processes of pod {pod}: {candidates} (top: {top})"
    os.kill(top[0], signal.SIGKILL)
    return top[0]


def dump_operator_logs(kubectl, kubelet, lines: int = 200) -> None:
    """The last lines of every operator pod's output (the failure dump of `e2e_namespace` shows only the
    topology's namespace)."""
    print(f"\n---- e2e: the operator pods of {SYSTEM} ----")
    kubectl("get", "pods,lease", "-n", SYSTEM, "-o", "wide", check=False)
    items = json.loads(
        kubectl("get", "pods", "-n", SYSTEM, "-l", OPERATOR, "-o", "json", check=False, quiet=True).stdout or "{}"
    )
    for pod in items.get("items", []):
        text = logs(kubelet, pod["metadata"]["name"]).splitlines()
        print(f"==> {pod['metadata']['name']} (last {lines} of {len(text)} lines) <==")
        print("\n".join(text[-lines:]))


@pytest.fixture(scope="module")
def two_replicas(helm, kubectl, kubelet):
    """The chart in its own namespace with two operator replicas; other elastream operators in the cluster (an
    earlier module's release) are scaled to 0 meanwhile, so that only these two could act, and restored after."""
    paused: list[tuple[str, str, int]] = []
    for item in get_json(kubectl, "deployments", "-A", "-l", OPERATOR)["items"]:
        meta = item["metadata"]
        if meta["namespace"] != SYSTEM and item["spec"].get("replicas", 1):
            paused.append((meta["namespace"], meta["name"], item["spec"]["replicas"]))
            kubectl("scale", "deployment", meta["name"], "-n", meta["namespace"], "--replicas=0")
    for namespace, _, _ in paused:
        kubectl("wait", "--for=delete", "pod", "-l", OPERATOR, "-n", namespace, "--timeout=60s", check=False)
    helm(
        "install", RELEASE, os.path.join(REPO, "charts", "elastream"), "--namespace", SYSTEM, "--create-namespace",
        "--set", "listenOnPodIP=true", "--set", "redis.image=elastream-redis:dev",
        "--set", "operator.image.tag=dev", "--set", "worker.image.tag=dev",
        "--set", "redis.persistence.enabled=false",
        "--set", "operator.replicas=2", "--set", "operator.leaderElection.enabled=true",
        "--wait", "--timeout", "6m",
    )  # fmt: skip
    kubectl("get", "pods,lease", "-n", SYSTEM, "-o", "wide")
    try:
        yield
    finally:
        kubectl("get", "pods,lease", "-n", SYSTEM, "-o", "wide", check=False)
        helm("uninstall", RELEASE, "--namespace", SYSTEM, "--wait", "--timeout", "2m", check=False)
        kubectl("delete", "namespace", SYSTEM, "--wait=false", check=False)
        for namespace, name, replicas in paused:
            kubectl("scale", "deployment", name, "-n", namespace, f"--replicas={replicas}", check=False)


def test_one_of_two_replicas_acts_and_the_standby_takes_over(
    two_replicas, kubectl, kubelet, control_plane, e2e_namespace, tmp_path
):
    try:
        one_acts_then_failovers(kubectl, kubelet, control_plane, e2e_namespace, tmp_path)
    except BaseException:
        dump_operator_logs(kubectl, kubelet)
        raise


def one_acts_then_failovers(kubectl, kubelet, control_plane, e2e_namespace: str, tmp_path) -> None:
    # exactly one holds the Lease and starts kopf; the other waits
    pods = wait_until(
        lambda: (p := operator_pods(kubectl)) and len(p) == 2 and p, 120, "two running operator pods", poll_s=0.5
    )
    first = wait_until(lambda: lease_holder(kubectl), 60, "a holder of the Lease", poll_s=0.5)
    assert first in pods, (first, pods)
    [standby] = [p for p in pods if p != first]
    wait_until(lambda: "is standby" in logs(kubelet, standby), 30, "the standby's log line", poll_s=0.5)
    lease = get_json(kubectl, "lease", LEASE, "-n", SYSTEM)["spec"]
    assert lease["leaseDurationSeconds"] == LEASE_S, lease
    assert f"leader election: {first} acquired the Lease {SYSTEM}/{LEASE}" in logs(kubelet, first)

    # a topology is started once, by the leader only
    name = "failover"
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology(name)))
    t_create = time.time()
    kubectl("apply", "-n", e2e_namespace, "-f", str(path))
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=240s")
    workers = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in get_json(kubectl, "pods", "-n", e2e_namespace)["items"]
    }
    assert len(workers) == 2, workers
    assert (
        control_plane.audit_count(
            verb="create", resource="pods", subresource="", namespace=e2e_namespace, since=t_create
        )
        == 2
    )
    standby_log = logs(kubelet, standby)
    assert "acquired the Lease" not in standby_log and "watching StreamTopology" not in standby_log
    assert name not in standby_log and e2e_namespace not in standby_log

    # the active pod is deleted: it releases the Lease on its way out, the standby takes over at once
    kubectl("delete", "pod", first, "-n", SYSTEM, "--wait=false")
    second, released_s = wait_holder_change(kubectl, first, LEASE_S + 3 * RETRY_S + 10)
    print(f"  takeover after the leader's pod was deleted: {released_s:.1f} s ({first} -> {second})")
    # the standby, nearly always: it retries every 2 s, the Deployment's replacement needs a container start first
    assert second == standby or second in operator_pods(kubectl), (second, standby)
    assert f"released the Lease {SYSTEM}/{LEASE}" in logs(kubelet, first)
    assert released_s < LEASE_S, f"{released_s:.1f} s: the deleted leader did not release the Lease"

    # the active operator's process dies and its pod is gone (a node lost): a standby (the Deployment's
    # replacement for the deleted pod, or the one for the killed pod) takes over when the Lease expires, not before
    def replacement_on_standby() -> str | None:
        fresh = [p for p in operator_pods(kubectl) if p not in (first, second)]
        return next((p for p in fresh if "is standby" in logs(kubelet, p)), None)

    third_standby = wait_until(replacement_on_standby, 180, "the replacement operator pod on standby", poll_s=0.5)
    wait_until(lambda: "watching StreamTopology" in logs(kubelet, second), 60, "the new leader working", poll_s=0.5)
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=120s")
    renewed = get_json(kubectl, "lease", LEASE, "-n", SYSTEM)["spec"]["renewTime"]
    pid = kill_hard(second)
    t_kill = time.monotonic()
    kubectl("delete", "pod", second, "-n", SYSTEM, "--grace-period=0", "--force", "--wait=false")
    print(f"  killed {second} (pid {pid}); its last renewTime {renewed}")
    third, _ = wait_holder_change(kubectl, second, LEASE_S + 3 * RETRY_S + 15)
    expired_s = time.monotonic() - t_kill
    print(f"  takeover after the leader died: {expired_s:.1f} s ({second} -> {third})")
    # the standby that was waiting, or the Deployment's replacement for the force-deleted pod (it starts at once
    # and waits too): whichever polls first after the expiry wins, as with client-go
    replacements = [p for p in operator_pods(kubectl) if p not in (first, second, third_standby)]
    assert third == third_standby or third in replacements, (third, third_standby, replacements)
    # the standby counts a lease duration from its last sight of a renew, which was at most one retry period
    # before the kill (and it sees it at most one retry period later): 13 s .. 19 s, plus polling
    assert LEASE_S - RETRY_S - 0.5 <= expired_s <= LEASE_S + 2 * RETRY_S + 3, expired_s
    third_log = wait_until(
        lambda: (text := logs(kubelet, third)) and "watching" in text and text, 60, "the third leader's log", poll_s=0.5
    )
    assert f"took the Lease {SYSTEM}/{LEASE} over from {second}" in third_log

    # the topology kept its worker pods (adopted by each new leader, none restarted) and the last leader acts
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=120s")
    now = get_json(kubectl, "pods", "-n", e2e_namespace)["items"]
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in now} == workers
    assert all(c.get("restartCount", 0) == 0 for p in now for c in p["status"].get("containerStatuses", []))
    assert get_json(kubectl, "topo", name, "-n", e2e_namespace)["status"]["phase"] == "Running"
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"nodes":3}}')
    wait_until(
        lambda: (
            (s := get_json(kubectl, "topo", name, "-n", e2e_namespace).get("status") or {}).get("readyNodes") == 3
            and s.get("nodes") == 3
        ),
        180,
        "three ready nodes, scaled by the third leader",
        poll_s=1.0,
    )
    assert (
        control_plane.audit_count(
            verb="create", resource="pods", subresource="", namespace=e2e_namespace, since=t_create
        )
        == 3
    )
    kubectl("get", "pods,topo", "-n", e2e_namespace, "-o", "wide")
    kubectl("delete", "topo", name, "-n", e2e_namespace, "--timeout=120s")
