"""Day two on the real API server, with the real kube-scheduler and the chart as installed: an image change
applied by a stateful upgrade (a checkpoint, the old pods stopped, new ones started from it) with every event
exactly once; an upgrade whose pods cannot start rolled back, the topology running on exactly once; suspend and
resume with exactly once and exact keyed counts. kstatus (sigs.k8s.io/cli-utils, what Flux runs; built by
scripts/kstatus-tool.sh) reads the live resource in each phase: Current when running as specified or
suspended, InProgress while observedGeneration lags a scale-out or an upgrade, Failed once an upgrade is rolled
back or on an invalid spec (which, fixed in place, starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from typing import Any

import pytest
import redis
import yaml

from .conftest import REPO
from .test_operator import (
    EVENTS,
    apply_topology,
    check_exactly_once_and_counts,
    event_reasons,
    pods_of,
    sink_ids,
    topology_manifest,
    worker_pods,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def kstatus_bin() -> str:
    """The kstatus checker, built (once, cached by version) by scripts/kstatus-tool.sh."""
    done = subprocess.run(
        ["bash", os.path.join(REPO, "scripts", "kstatus-tool.sh")], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"the kstatus checker did not build:\n{done.stderr[-3000:]}"
    return os.path.join(done.stdout.strip().splitlines()[-1], "kstatus")


def resource(kubectl, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(kubectl("get", "topo", name, "-n", namespace, "-o", "json", quiet=True).stdout)


def kstatus(binary: str, document: dict[str, Any]) -> tuple[str, str]:
    """(status, message) kstatus computes for the resource as `kubectl get -o json` gave it."""
    done = subprocess.run([binary], input=json.dumps(document), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    _, computed, message = done.stdout.rstrip("\n").split("\t", 2)
    return computed, message


def watch(kubectl, binary: str, namespace: str, name: str, until, timeout_s: float, what: str) -> dict[str, Any]:
    """Poll the resource until `until(document)`, recording what kstatus said on the way (in `seen`) and whether
    observedGeneration lagged the generation at any point."""
    deadline = time.monotonic() + timeout_s
    seen: Counter[str] = Counter()
    lagged = False
    document: dict[str, Any] = {}
    while time.monotonic() < deadline:
        document = resource(kubectl, namespace, name)
        state = document.get("status") or {}
        lagged |= int(state.get("observedGeneration") or 0) < int(document["metadata"]["generation"])
        seen[kstatus(binary, document)[0]] += 1
        if until(document):
            return {"document": document, "seen": seen, "lagged": lagged}
        time.sleep(0.3)
    pytest.fail(f"{what} not reached in {timeout_s:.0f} s; status: {json.dumps(document.get('status'))[:3000]}")


def images_of(kubectl, namespace: str, name: str) -> set[str]:
    return {p["spec"]["containers"][0]["image"] for p in pods_of(kubectl, namespace, name)}


def test_an_image_change_is_applied_through_a_checkpoint_with_every_event_exactly_once(
    installed, kubectl, e2e_namespace, tmp_path, runtime_mode, kstatus_bin
):
    client: redis.Redis = installed["redis"]
    name = "upgraded"
    apply_topology(kubectl, e2e_namespace, tmp_path, topology_manifest(name))
    assert kstatus(kstatus_bin, resource(kubectl, e2e_namespace, name))[0] == "Current"
    (image,) = images_of(kubectl, e2e_namespace, name)
    new_image = image.rsplit(":", 1)[0] + ":e2e-v2"
    if runtime_mode == "docker":  # a second tag of the worker image: new user code, as far as Kubernetes knows
        subprocess.run(["docker", "tag", image, new_image], check=True, timeout=60)
    time.sleep(5)  # a checkpoint or two commit some output first

    # a scale-out as kstatus sees it live: InProgress (observedGeneration lagging) until the third node runs
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"nodes":3}}')
    generation = int(resource(kubectl, e2e_namespace, name)["metadata"]["generation"])
    done = watch(
        kubectl, kstatus_bin, e2e_namespace, name,
        lambda d: (d.get("status") or {}).get("lastScaling", {}).get("toNodes") == 3
        and d["status"].get("observedGeneration") == generation,
        240, "the scale-out to 3 nodes",
    )  # fmt: skip
    assert done["document"]["status"]["lastScaling"]["outcome"] == "succeeded", done["document"]["status"]
    assert done["lagged"] and done["seen"]["InProgress"] > 0, done["seen"]
    assert kstatus(kstatus_bin, resource(kubectl, e2e_namespace, name))[0] == "Current"

    patch = json.dumps({"spec": {"image": new_image}})
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", patch)
    generation = int(resource(kubectl, e2e_namespace, name)["metadata"]["generation"])
    done = watch(
        kubectl, kstatus_bin, e2e_namespace, name,
        lambda d: (d.get("status") or {}).get("lastUpgrade", {}).get("generation") == generation
        and d["status"].get("observedGeneration") == generation,
        300, "the upgrade to the new image",
    )  # fmt: skip
    state = done["document"]["status"]
    assert state["lastUpgrade"]["outcome"] == "Upgraded", state["lastUpgrade"]
    assert state["lastUpgrade"]["checkpoint"].startswith("ckpt-")
    assert done["lagged"] and done["seen"]["InProgress"] > 0, done["seen"]  # GitOps tools waited for it
    kubectl("wait", "--for=condition=Ready", f"topo/{name}", "-n", e2e_namespace, "--timeout=120s")
    assert kstatus(kstatus_bin, resource(kubectl, e2e_namespace, name))[0] == "Current"
    assert images_of(kubectl, e2e_namespace, name) == {new_image}
    reasons = event_reasons(kubectl, e2e_namespace, name)
    assert "UpgradeStarted" in reasons and "Upgraded" in reasons and "WorkerLost" not in reasons
    check_exactly_once_and_counts(client, e2e_namespace, name)


def test_an_upgrade_whose_pods_cannot_start_is_rolled_back_and_runs_on_exactly_once(
    installed, kubectl, e2e_namespace, tmp_path, runtime_mode, kstatus_bin
):
    client: redis.Redis = installed["redis"]
    name = "rollback"
    apply_topology(kubectl, e2e_namespace, tmp_path, topology_manifest(name))
    (image,) = images_of(kubectl, e2e_namespace, name)
    time.sleep(5)
    if runtime_mode == "docker":  # no such image here, and nothing is pulled: ErrImageNeverPull
        broken: dict[str, Any] = {"image": image.rsplit(":", 1)[0] + ":does-not-exist"}
    else:  # local processes need no image: a pod no node can take never starts either
        broken = {"resources": {"requests": {"cpu": "64"}, "limits": {"cpu": "64"}}}
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", json.dumps({"spec": broken}))
    generation = int(resource(kubectl, e2e_namespace, name)["metadata"]["generation"])
    done = watch(
        kubectl, kstatus_bin, e2e_namespace, name,
        lambda d: (d.get("status") or {}).get("lastUpgrade", {}).get("outcome") == "RolledBack",
        420, "the rollback of the upgrade",
    )  # fmt: skip
    assert done["lagged"] and done["seen"]["InProgress"] > 0, done["seen"]
    kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=120s")
    document = resource(kubectl, e2e_namespace, name)
    state = document["status"]
    stalled = {c["type"]: c for c in state["conditions"]}["Stalled"]
    assert stalled["status"] == "True" and stalled["reason"] == "UpgradeFailed", stalled
    assert state["observedGeneration"] == generation  # judged, so kstatus does not wait forever
    assert kstatus(kstatus_bin, document)[0] == "Failed"
    assert images_of(kubectl, e2e_namespace, name) == {image}  # the previous spec's pods
    assert "UpgradeRolledBack" in event_reasons(kubectl, e2e_namespace, name)
    check_exactly_once_and_counts(client, e2e_namespace, name)


def test_suspend_then_resume_keeps_every_event_exactly_once_and_keyed_counts_exact(
    installed, kubectl, e2e_namespace, tmp_path, kstatus_bin
):
    client: redis.Redis = installed["redis"]
    name = "suspended"
    apply_topology(kubectl, e2e_namespace, tmp_path, topology_manifest(name))
    time.sleep(5)
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"suspend":true}}')
    watch(kubectl, kstatus_bin, e2e_namespace, name,
          lambda d: (d.get("status") or {}).get("phase") == "Suspended", 180, "Suspended")  # fmt: skip
    deadline = time.monotonic() + 60
    while worker_pods(kubectl, e2e_namespace, name) and time.monotonic() < deadline:
        time.sleep(1)
    assert worker_pods(kubectl, e2e_namespace, name) == []
    assert kstatus(kstatus_bin, resource(kubectl, e2e_namespace, name))[0] == "Current"  # suspended as asked
    frozen = sum(sink_ids(client, e2e_namespace, name, "out").values())
    assert 0 < frozen < EVENTS
    time.sleep(5)
    assert sum(sink_ids(client, e2e_namespace, name, "out").values()) == frozen  # nothing runs

    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"suspend":false}}')
    kubectl("wait", "--for=condition=Ready", f"topo/{name}", "-n", e2e_namespace, "--timeout=240s")
    assert len(worker_pods(kubectl, e2e_namespace, name)) == 2
    reasons = event_reasons(kubectl, e2e_namespace, name)
    assert "Suspended" in reasons and "Resumed" in reasons
    check_exactly_once_and_counts(client, e2e_namespace, name)


def test_an_invalid_spec_is_failed_for_kstatus_and_fixed_in_place_it_starts(
    installed, kubectl, e2e_namespace, tmp_path, kstatus_bin
):
    """A spec the API server accepts and the operator cannot run (more executors than slots) is Stalled with
    InvalidSpec, observedGeneration on it (kstatus: Failed); fixing it in place starts the topology, with no
    operator restart."""
    name = "fixed"
    manifest = topology_manifest(name)
    manifest["spec"]["slotsPerNode"] = 1  # 6 executors on 2 nodes of 1 slot
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    kubectl("apply", "-n", e2e_namespace, "-f", str(path))
    binary = kstatus_bin
    done = watch(kubectl, binary, e2e_namespace, name,
                 lambda d: kstatus(binary, d)[0] == "Failed", 120, "kstatus Failed on the invalid spec")  # fmt: skip
    state = done["document"]["status"]
    stalled = {c["type"]: c for c in state["conditions"]}["Stalled"]
    assert stalled["reason"] == "InvalidSpec" and "spec.slotsPerNode" in stalled["message"], stalled
    assert worker_pods(kubectl, e2e_namespace, name) == []
    kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"slotsPerNode":6}}')
    kubectl("wait", "--for=condition=Ready", f"topo/{name}", "-n", e2e_namespace, "--timeout=240s")
    assert kstatus(binary, resource(kubectl, e2e_namespace, name))[0] == "Current"
    assert len(worker_pods(kubectl, e2e_namespace, name)) == 2
