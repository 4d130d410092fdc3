"""The e2e harness itself, end to end with the real binaries: API server (and its audit log), controller manager,
scheduler (requests, Pending pods, node selectors, pod anti-affinity, topology spread over the stand-in's three
Nodes), kubelet stand-in (pods, probes, status, service-account tokens, Service forwarders and names, persistent
volumes from its host-path provisioner), kubectl and helm."""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.utils import parse_quantity

from .conftest import BASE_IMAGE, CommandRunner, sleeper
from .controlplane import ControlPlane, ControlPlaneError
from .kubelet import (
    HOSTNAME_LABEL,
    NODE_NAMES,
    PROVISIONED_BY,
    PROVISIONER,
    RUNTIME_LABEL,
    SA_MOUNT,
    STORAGE_CLASS,
    ZONE_LABEL,
    ZONES,
    KubeletStandIn,
)

pytestmark = pytest.mark.e2e

LOOPBACK_POD_IP = re.compile(r"^127\.(0|10[1-9]|11[0-5])\.\d{1,3}\.\d{1,3}$")  # see KubeletStandIn._claim_ip_block


def web_manifest(name: str = "web") -> str:
    """A Deployment serving HTTP on $(POD_IP):8000 with an httpGet readiness probe, and a Service in front of it.

    Docker mode runs it from the local base image; process mode runs the same command as a local process."""
    return textwrap.dedent(f"""\
        apiVersion: apps/v1
        kind: Deployment
        metadata: {{name: {name}}}
        spec:
          replicas: 1
          selector: {{matchLabels: {{app: {name}}}}}
          template:
            metadata: {{labels: {{app: {name}}}}}
            spec:
              terminationGracePeriodSeconds: 2
              containers:
              - name: http
                image: {BASE_IMAGE}
                command: [python3, -m, http.server, --bind, $(POD_IP), "8000"]
                env:
                - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
                ports: [{{name: http, containerPort: 8000}}]
                readinessProbe:
                  httpGet: {{path: /, port: http}}
                  periodSeconds: 1
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: {name}}}
        spec:
          selector: {{app: {name}}}
          ports: [{{name: http, port: 80, targetPort: http}}]
        """)


def require_base_image(kubelet: KubeletStandIn) -> None:
    if kubelet.mode != "docker":
        return
    out = kubelet.runtime.docker("image", "inspect", BASE_IMAGE)
    if out.returncode != 0:
        pytest.fail(f"docker mode needs the local image {BASE_IMAGE} (scripts/docker-setup.sh makes it): {out.stderr}")


def get_json(kubectl: CommandRunner, *args: str) -> dict:
    return json.loads(kubectl("get", *args, "-o", "json", quiet=True).stdout)


def test_api_server_answers_kubectl_version(kubectl: CommandRunner, control_plane: ControlPlane) -> None:
    out = kubectl("version", "-o", "json")
    versions = json.loads(out.stdout)
    assert versions["serverVersion"]["gitVersion"].startswith("v1.34."), versions
    assert versions["clientVersion"]["gitVersion"] == versions["serverVersion"]["gitVersion"]
    assert control_plane.version["gitVersion"] == versions["serverVersion"]["gitVersion"]
    assert "127.0.0.1" in "".join(control_plane.serving_sans)
    kubectl("get", "--raw", "/readyz")
    # the `kubernetes` Service got an address from the loopback service range
    svc = get_json(kubectl, "service", "kubernetes", "-n", "default")
    assert svc["spec"]["clusterIP"].startswith("127.96."), svc["spec"]


def test_a_tool_cache_without_kube_scheduler_is_named(k8s_bin: str, tmp_path: Any) -> None:
    """A cache built before the tier had a scheduler: the control plane says what to run, before starting anything."""
    old_cache = tmp_path / "bin"
    old_cache.mkdir()
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl"):
        (old_cache / name).symlink_to(os.path.join(k8s_bin, name))
    plane = ControlPlane(str(old_cache), str(tmp_path / "cp"))
    with pytest.raises(ControlPlaneError, match=r"kube-scheduler is missing.*Re-run `bash scripts/k8s-tools.sh`"):
        plane.start()
    assert plane.alive() == {}  # nothing was started


def test_nodes_are_registered_and_ready(
    kubectl: CommandRunner, kubelet: KubeletStandIn, control_plane: ControlPlane
) -> None:
    assert kubelet.node_names == NODE_NAMES
    kubectl("get", "nodes", "-o", "wide", "-L", ZONE_LABEL)
    kubectl("wait", "--for=condition=Ready", *(f"node/{name}" for name in NODE_NAMES), "--timeout=30s")
    nodes = {n["metadata"]["name"]: n for n in get_json(kubectl, "nodes")["items"]}
    assert set(NODE_NAMES) <= set(nodes), sorted(nodes)
    for name, zone in zip(NODE_NAMES, ZONES, strict=True):
        node = nodes[name]
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions == {"Ready": "True", "MemoryPressure": "False", "DiskPressure": "False",
                              "PIDPressure": "False"}, conditions  # fmt: skip
        labels = node["metadata"]["labels"]
        assert labels[HOSTNAME_LABEL] == name and labels[ZONE_LABEL] == zone, labels
        assert labels["kubernetes.io/os"] == "linux" and labels[RUNTIME_LABEL] == kubelet.mode, labels
        for key in ("capacity", "allocatable"):
            assert {k: node["status"][key][k] for k in ("cpu", "memory", "pods")} == {
                "cpu": "4", "memory": "8Gi", "pods": "110"
            }, node["status"][key]  # fmt: skip
        assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
        assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.34.")
        assert not node["spec"].get("taints"), node["spec"]  # Ready from the start: no not-ready taint left
        lease = get_json(kubectl, "lease", name, "-n", "kube-node-lease")
        assert lease["spec"]["holderIdentity"] == name
    # the scheduler is up (the tests below show it at work)
    assert control_plane.alive()["kube-scheduler"], control_plane.logs()["kube-scheduler"]


def test_deployment_becomes_available_and_its_service_forwards(
    kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str
) -> None:
    ns = e2e_namespace
    require_base_image(kubelet)
    kubectl("apply", "-n", ns, "-f", "-", input=web_manifest())
    t0 = time.monotonic()
    kubectl("wait", "-n", ns, "--for=condition=Available", "deployment/web", "--timeout=120s")
    print(f"deployment available after {time.monotonic() - t0:.1f} s")
    kubectl("get", "pods,services", "-n", ns, "-o", "wide")

    pods = get_json(kubectl, "pods", "-n", ns, "-l", "app=web")["items"]
    assert len(pods) == 1
    pod = pods[0]
    status = pod["status"]
    assert status["phase"] == "Running"
    assert LOOPBACK_POD_IP.match(status["podIP"]), status["podIP"]
    assert status["hostIP"] == "127.0.0.1"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Ready"] == conditions["ContainersReady"] == conditions["PodScheduled"] == "True"
    (cstatus,) = status["containerStatuses"]
    assert cstatus["ready"] and cstatus["started"] and "running" in cstatus["state"]
    assert pod["spec"]["nodeName"] in kubelet.node_names  # bound by kube-scheduler

    # the pod's own process bound its pod IP (from $(POD_IP))
    with urllib.request.urlopen(f"http://{status['podIP']}:8000/", timeout=5) as resp:
        assert resp.status == 200

    # ClusterIP:port -> the userspace forwarder -> the ready pod's named targetPort
    svc = get_json(kubectl, "service", "web", "-n", ns)
    cluster_ip = svc["spec"]["clusterIP"]
    assert cluster_ip.startswith("127.96."), cluster_ip
    print(f"$ curl http://{cluster_ip}:80/  (from the test process)")
    with urllib.request.urlopen(f"http://{cluster_ip}:80/", timeout=5) as resp:
        assert resp.status == 200
        assert b"Directory listing" in resp.read()

    # kubectl logs reaches the stand-in's kubelet endpoint; the readiness probes show in the server's log
    logs = kubectl("logs", "-n", ns, pod["metadata"]["name"]).stdout
    assert "GET / HTTP/1.1" in logs

    # from inside a pod: the Service's name resolves (per-pod /etc/hosts or this machine's) and answers
    kubectl("apply", "-n", ns, "-f", "-", input=textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: client}}
        spec:
          restartPolicy: Never
          containers:
          - name: client
            image: {BASE_IMAGE}
            command: [python3, -c]
            args:
            - |
              import urllib.request
              for url in ("http://web.{ns}.svc/", "http://web.{ns}.svc.cluster.local:80/", "http://web/"):
                  with urllib.request.urlopen(url, timeout=5) as resp:
                      print(url, resp.status, flush=True)
        """))  # fmt: skip
    wait_phase(kubectl, ns, "client", "Succeeded", kubelet)
    out = kubectl("logs", "-n", ns, "client").stdout
    assert f"http://web.{ns}.svc/ 200" in out
    assert "http://web/ 200" in out
    assert kubelet.errors() == []


def wait_phase(kubectl: CommandRunner, ns: str, pod: str, phase: str, kubelet: KubeletStandIn) -> dict:
    out = kubectl(
        "wait", "-n", ns, f"--for=jsonpath={{.status.phase}}={phase}", f"pod/{pod}", "--timeout=90s", check=False
    )
    if out.returncode != 0:
        print(kubelet.logs(ns, pod))
        kubectl("get", "pod", pod, "-n", ns, "-o", "yaml", check=False)
        pytest.fail(f"pod {ns}/{pod} did not reach phase {phase}")
    return get_json(kubectl, "pod", pod, "-n", ns)


def token_probe_pod(name: str, ns: str) -> str:
    """A pod that calls the API server with its service-account token, verifying TLS with the mounted ca.crt,
    and exits 0 on 200, 3 on 403."""
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}}}
        spec:
          serviceAccountName: reader
          restartPolicy: Never
          containers:
          - name: probe
            image: {BASE_IMAGE}
            command: [python3, -c]
            args:
            - |
              import json, os, ssl, sys, urllib.error, urllib.request
              sa = "{SA_MOUNT}"
              token = open(sa + "/token").read()
              namespace = open(sa + "/namespace").read()
              ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
              host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
              url = f"https://{{host}}:{{port}}/api/v1/namespaces/{{namespace}}/pods"
              req = urllib.request.Request(url, headers={{"Authorization": "Bearer " + token}})
              try:
                  with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                      names = [p["metadata"]["name"] for p in json.load(resp)["items"]]
                      print("status 200", namespace, names, flush=True)
                      sys.exit(0)
              except urllib.error.HTTPError as exc:
                  print("status", exc.code, namespace, exc.read().decode()[:300], flush=True)
                  sys.exit(3 if exc.code == 403 else 4)
        """)  # fmt: skip


def test_service_account_token_needs_rbac(kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str) -> None:
    ns = e2e_namespace
    require_base_image(kubelet)
    kubectl("create", "serviceaccount", "reader", "-n", ns)

    kubectl("apply", "-n", ns, "-f", "-", input=token_probe_pod("before-rbac", ns))
    pod = wait_phase(kubectl, ns, "before-rbac", "Failed", kubelet)
    (cstatus,) = pod["status"]["containerStatuses"]
    assert cstatus["state"]["terminated"]["exitCode"] == 3, cstatus
    out = kubectl("logs", "-n", ns, "before-rbac").stdout
    assert f"status 403 {ns}" in out
    assert f"system:serviceaccount:{ns}:reader" in out  # the API server saw the pod's own identity

    kubectl("create", "role", "pod-reader", "-n", ns, "--verb=get,list", "--resource=pods")
    kubectl(
        "create", "rolebinding", "reader-reads-pods", "-n", ns, "--role=pod-reader", f"--serviceaccount={ns}:reader"
    )
    kubectl("auth", "can-i", "list", "pods", "-n", ns, f"--as=system:serviceaccount:{ns}:reader")

    kubectl("apply", "-n", ns, "-f", "-", input=token_probe_pod("after-rbac", ns))
    pod = wait_phase(kubectl, ns, "after-rbac", "Succeeded", kubelet)
    (cstatus,) = pod["status"]["containerStatuses"]
    assert cstatus["state"]["terminated"]["exitCode"] == 0
    assert cstatus["state"]["terminated"]["reason"] == "Completed"
    out = kubectl("logs", "-n", ns, "after-rbac").stdout
    assert f"status 200 {ns}" in out and "before-rbac" in out
    assert kubelet.errors() == []


def test_deleting_a_deployment_garbage_collects_its_pods(
    kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str
) -> None:
    ns = e2e_namespace
    require_base_image(kubelet)
    kubectl("apply", "-n", ns, "-f", "-", input=web_manifest("gc"))
    kubectl("wait", "-n", ns, "--for=condition=Available", "deployment/gc", "--timeout=120s")
    (pod,) = get_json(kubectl, "pods", "-n", ns, "-l", "app=gc")["items"]
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ReplicaSet"

    t0 = time.monotonic()
    kubectl("delete", "deployment", "gc", "-n", ns, "--cascade=background", "--wait=false")
    # kube-controller-manager's garbage collector deletes the ReplicaSet, then its pods; the stand-in stops the
    # container (SIGTERM, then SIGKILL after the grace period) and removes the pod
    kubectl("wait", "-n", ns, "--for=delete", f"pod/{pod['metadata']['name']}", "--timeout=90s")
    print(f"pod garbage-collected and gone after {time.monotonic() - t0:.1f} s")
    assert get_json(kubectl, "replicasets", "-n", ns, "-l", "app=gc")["items"] == []
    assert kubelet.pod_ip(ns, pod["metadata"]["name"]) is None
    assert kubelet.errors() == []


def test_crashing_container_restarts_with_back_off(
    kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str
) -> None:
    ns = e2e_namespace
    require_base_image(kubelet)
    kubectl("run", "crasher", "-n", ns, f"--image={BASE_IMAGE}", "--restart=Always", "--command", "--",
            "python3", "-c", "print('crashing', flush=True); raise SystemExit(7)")  # fmt: skip
    deadline = time.monotonic() + 60
    cstatus: dict = {}
    while time.monotonic() < deadline:
        pod = get_json(kubectl, "pod", "crasher", "-n", ns)
        statuses = pod["status"].get("containerStatuses") or []
        cstatus = statuses[0] if statuses else {}
        if cstatus.get("restartCount", 0) >= 2:
            break
        time.sleep(1)
    kubectl("get", "pod", "crasher", "-n", ns, "-o", "wide")
    assert cstatus.get("restartCount", 0) >= 2, cstatus
    assert cstatus["lastState"]["terminated"]["exitCode"] == 7
    assert pod["status"]["phase"] == "Running"  # restartPolicy Always: never terminal
    assert kubelet.logs(ns, "crasher").count("crashing") >= 2
    assert kubelet.errors() == []


def test_pod_environment_and_volumes(kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str) -> None:
    """What a pod sees: env from values, the downward API, ConfigMaps and Secrets; `$(VAR)` expansion;
    configMap/secret/emptyDir/downwardAPI volumes (items honoured); exit code 0 -> Succeeded."""
    ns = e2e_namespace
    require_base_image(kubelet)
    kubectl("create", "configmap", "settings", "-n", ns, "--from-literal=mode=fast", "--from-literal=b.txt=bee")
    kubectl("create", "secret", "generic", "creds", "-n", ns, "--from-literal=password=s3cret")
    manifest = textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: envcheck, labels: {{team: streams}}}}
        spec:
          restartPolicy: Never
          containers:
          - name: check
            image: {BASE_IMAGE}
            command: [python3, -c]
            args:
            - |
              import json, os, sys
              keys = ["POD_NAME", "POD_NS", "NODE", "SA", "POD_IP", "MODE", "PASSWORD", "CPU_M", "GREETING",
                      "ESCAPED", "CFG_mode", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"]
              # a list, not a dict keyed by path: process mode rewrites mount paths in arguments
              paths = ["/etc/cfg/nested/b", "/etc/creds/password", "/etc/podinfo/labels", "/etc/podinfo/name"]
              files = [open(path).read() for path in paths]
              open("/scratch/written", "w").write("ok")
              print(json.dumps({{"env": {{k: os.environ.get(k) for k in keys}}, "files": files,
                                 "arg": sys.argv[1:]}}), flush=True)
            - $(POD_NAME)-arg
            env:
            - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
            - {{name: POD_NS, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
            - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
            - {{name: SA, valueFrom: {{fieldRef: {{fieldPath: spec.serviceAccountName}}}}}}
            - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
            - {{name: MODE, valueFrom: {{configMapKeyRef: {{name: settings, key: mode}}}}}}
            - {{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: creds, key: password}}}}}}
            - name: CPU_M
              valueFrom: {{resourceFieldRef: {{resource: limits.cpu, divisor: 1m}}}}
            - {{name: GREETING, value: "hello-$(POD_NAME)"}}
            - {{name: ESCAPED, value: "$$(POD_NAME)"}}
            envFrom:
            - {{prefix: CFG_, configMapRef: {{name: settings}}}}
            resources: {{limits: {{cpu: 250m, memory: 64Mi}}}}
            volumeMounts:
            - {{name: cfg, mountPath: /etc/cfg}}
            - {{name: creds, mountPath: /etc/creds}}
            - {{name: podinfo, mountPath: /etc/podinfo}}
            - {{name: scratch, mountPath: /scratch}}
          volumes:
          - name: cfg
            configMap: {{name: settings, items: [{{key: b.txt, path: nested/b}}]}}
          - {{name: creds, secret: {{secretName: creds}}}}
          - name: podinfo
            downwardAPI:
              items:
              - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
              - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
          - {{name: scratch, emptyDir: {{}}}}
        """)  # fmt: skip
    kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    pod = wait_phase(kubectl, ns, "envcheck", "Succeeded", kubelet)
    line = [ln for ln in kubectl("logs", "-n", ns, "envcheck").stdout.splitlines() if ln.startswith("{")][-1]
    seen = json.loads(line)
    env, files = seen["env"], seen["files"]
    assert env["POD_NAME"] == "envcheck" and env["POD_NS"] == ns
    assert env["NODE"] == pod["spec"]["nodeName"] and env["NODE"] in kubelet.node_names
    assert env["SA"] == "default"
    assert env["POD_IP"] == pod["status"]["podIP"] and LOOPBACK_POD_IP.match(env["POD_IP"])
    assert env["MODE"] == "fast" and env["CFG_mode"] == "fast" and env["PASSWORD"] == "s3cret"
    assert env["CPU_M"] == "250"
    assert env["GREETING"] == "hello-envcheck" and env["ESCAPED"] == "$(POD_NAME)"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == str(kubelet.api_port)
    assert seen["arg"] == ["envcheck-arg"]
    assert files == ["bee", "s3cret", 'team="streams"\n', "envcheck"]
    assert kubelet.errors() == []


def test_failing_liveness_probe_restarts_the_container(
    kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str
) -> None:
    ns = e2e_namespace
    require_base_image(kubelet)
    kubectl("apply", "-n", ns, "-f", "-", input=textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: unhealthy}}
        spec:
          terminationGracePeriodSeconds: 1
          containers:
          - name: sleeper
            image: {BASE_IMAGE}
            command: [python3, -c, "import time; print('up', flush=True); time.sleep(600)"]
            livenessProbe:
              exec: {{command: [python3, -c, "raise SystemExit(1)"]}}
              periodSeconds: 1
              failureThreshold: 2
        """))  # fmt: skip
    deadline = time.monotonic() + 60
    cstatus: dict = {}
    while time.monotonic() < deadline:
        statuses = get_json(kubectl, "pod", "unhealthy", "-n", ns)["status"].get("containerStatuses") or []
        cstatus = statuses[0] if statuses else {}
        if cstatus.get("restartCount", 0) >= 1:
            break
        time.sleep(1)
    kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=unhealthy")
    assert cstatus.get("restartCount", 0) >= 1, cstatus
    assert cstatus["lastState"]["terminated"]["exitCode"] in (137, 143), cstatus
    events = get_json(kubectl, "events", "-n", ns, "--field-selector", "involvedObject.name=unhealthy")["items"]
    reasons = {e["reason"] for e in events}
    assert {"Unhealthy", "Killing"} <= reasons, reasons
    assert kubelet.errors() == []


# ---- scheduling: the real kube-scheduler over the stand-in's three Nodes (4 CPU, 8Gi, one zone each) ----------
def sleepers(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    """A Deployment of `sleeper` pods labelled app=<name>."""
    pod = sleeper(name, labels={"app": name}, **spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]},
        },
    }


def apply(kubectl: CommandRunner, ns: str, *objects: dict[str, Any]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(items, indent=1))


def pod_scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's PodScheduled condition ({} before the scheduler looked at it)."""
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {})


def split(pods: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(bound to a node, Unschedulable: the scheduler tried and found no node)."""
    bound = [p for p in pods if p["spec"].get("nodeName")]
    unschedulable = [
        p
        for p in pods
        if not p["spec"].get("nodeName")
        and pod_scheduled(p).get("status") == "False"
        and pod_scheduled(p).get("reason") == "Unschedulable"
    ]
    return bound, unschedulable


def counts(bound: int, unschedulable: int) -> Callable[[list[dict[str, Any]]], bool]:
    def done(pods: list[dict[str, Any]]) -> bool:
        b, u = split(pods)
        return len(pods) == bound + unschedulable and (len(b), len(u)) == (bound, unschedulable)

    return done


def wait_for_pods(
    kubectl: CommandRunner,
    ns: str,
    done: Callable[[list[dict[str, Any]]], bool],
    what: str,
    selector: str | None = None,
    timeout: float = 30,
) -> list[dict[str, Any]]:
    """Polls the namespace's pods (`-l selector`) until `done(pods)`; prints them with their nodes."""
    args = ["pods", "-n", ns, *(["-l", selector] if selector else [])]
    t0 = time.monotonic()
    while True:
        pods = get_json(kubectl, *args)["items"]
        if done(pods):
            break
        if time.monotonic() - t0 > timeout:
            kubectl("get", *args, "-o", "wide", check=False)
            kubectl("get", "events", "-n", ns, check=False)
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.3)
    print(f"{what}: after {time.monotonic() - t0:.1f} s")
    kubectl("get", *args, "-o", "wide")
    return pods


def wait_event(kubectl: CommandRunner, ns: str, pod: str, reason: str, timeout: float = 20) -> dict[str, Any]:
    """The newest event of `reason` about `pod` (the scheduler records them asynchronously)."""
    t0 = time.monotonic()
    while True:
        selector = f"involvedObject.name={pod},reason={reason}"
        events = get_json(kubectl, "events", "-n", ns, "--field-selector", selector)["items"]
        if events:
            event = events[-1]
            print(f"event {reason} for {pod}: {event.get('message')}")
            return event
        if time.monotonic() - t0 > timeout:
            kubectl("get", "events", "-n", ns, check=False)
            pytest.fail(f"no {reason} event for pod {ns}/{pod} within {timeout:.0f} s")
        time.sleep(0.3)


def wait_for_free_cpu(kubectl: CommandRunner, kubelet: KubeletStandIn, millicores: int, timeout: float = 60) -> None:
    """Until every node has `millicores` not requested by a pod (pods of earlier tests may still be terminating)."""
    t0 = time.monotonic()
    while True:
        used = dict.fromkeys(NODE_NAMES, 0)
        for pod in get_json(kubectl, "pods", "-A")["items"]:
            node = pod["spec"].get("nodeName")
            if node not in used or pod["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            for c in pod["spec"]["containers"]:
                cpu = ((c.get("resources") or {}).get("requests") or {}).get("cpu")
                used[node] += int(parse_quantity(cpu) * 1000) if cpu else 0
        free = {n: int(parse_quantity(kubelet.allocatable(n)["cpu"]) * 1000) - m for n, m in used.items()}
        if all(m >= millicores for m in free.values()):
            return
        if time.monotonic() - t0 > timeout:
            kubectl("get", "pods", "-A", "-o", "wide", check=False)
            pytest.fail(f"CPU not requested per node {free} (millicores): less than {millicores}m on some node")
        time.sleep(0.5)


def test_pod_larger_than_every_node_stays_pending(
    kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str
) -> None:
    ns = e2e_namespace
    apply(kubectl, ns, sleeper("huge", cpu="5"))  # every node declares 4 CPUs
    (pod,) = wait_for_pods(kubectl, ns, counts(0, 1), "pod huge Unschedulable")
    cond = pod_scheduled(pod)
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable"), cond
    assert "0/3 nodes are available" in cond["message"] and "3 Insufficient cpu" in cond["message"], cond
    event = wait_event(kubectl, ns, "huge", "FailedScheduling")
    assert event["type"] == "Warning" and "Insufficient cpu" in event["message"], event
    assert event.get("reportingComponent") == "default-scheduler", event
    time.sleep(1)  # stays so: not bound, no pod IP, nothing run by the stand-in
    pod = get_json(kubectl, "pod", "huge", "-n", ns)
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName"), pod["status"]
    assert kubelet.pod_ip(ns, "huge") is None
    assert kubelet.errors() == []


def test_cpu_requests_spread_pods_and_queue_the_rest(
    kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str
) -> None:
    """2.5 CPU each on 4-CPU nodes: no two share a node, three fill the three nodes, the fourth waits
    (Unschedulable: Insufficient cpu) until one of the three is deleted, then gets its node."""
    ns = e2e_namespace
    require_base_image(kubelet)
    wait_for_free_cpu(kubectl, kubelet, 2500)
    apply(kubectl, ns, *(sleeper(f"cpu-{i}", labels={"app": "cpu"}, cpu="2500m") for i in range(4)))
    pods = wait_for_pods(kubectl, ns, counts(3, 1), "3 pods bound, 1 Unschedulable")
    bound, (waiting,) = split(pods)
    assert sorted(p["spec"]["nodeName"] for p in bound) == sorted(NODE_NAMES)
    assert "Insufficient cpu" in pod_scheduled(waiting)["message"], pod_scheduled(waiting)
    waiting_name = waiting["metadata"]["name"]
    assert kubelet.pod_ip(ns, waiting_name) is None
    # the stand-in runs what the scheduler bound, on whichever node
    running = [f"pod/{p['metadata']['name']}" for p in bound]
    kubectl("wait", "-n", ns, "--for=jsonpath={.status.phase}=Running", *running, "--timeout=60s")

    victim = bound[0]
    kubectl("delete", "pod", victim["metadata"]["name"], "-n", ns, "--timeout=60s")
    t0 = time.monotonic()
    pods = wait_for_pods(kubectl, ns, counts(3, 0), f"{waiting_name} bound once {victim['metadata']['name']} is gone")
    print(f"bound {time.monotonic() - t0:.1f} s after the deletion")
    (now,) = [p for p in pods if p["metadata"]["name"] == waiting_name]
    assert now["spec"]["nodeName"] == victim["spec"]["nodeName"]
    assert pod_scheduled(now)["status"] == "True"
    kubectl("wait", "-n", ns, "--for=jsonpath={.status.phase}=Running", f"pod/{waiting_name}", "--timeout=60s")
    # give the CPU back before the next test (the namespace itself is deleted without waiting)
    kubectl("delete", "pods", "--all", "-n", ns, "--timeout=60s")
    assert kubelet.errors() == []


def test_node_selector_on_the_zone_label(kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str) -> None:
    """zone-b -> e2e-node-b, whose name and declared resources the pod sees; a zone no node has -> Pending."""
    ns = e2e_namespace
    require_base_image(kubelet)
    shows = sleeper("in-zone-b", restartPolicy="Never", nodeSelector={ZONE_LABEL: "zone-b"})
    container = shows["spec"]["containers"][0]
    container["command"] = ["sh", "-c", 'echo "node=$NODE cpu=$CPU mem=$MEM"']
    container["env"] = [
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        # no limits: the node's allocatable, as the kubelet gives
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
    ]
    nowhere = sleeper("in-zone-x", labels={"app": "nowhere"}, nodeSelector={ZONE_LABEL: "zone-x"})
    apply(kubectl, ns, shows, nowhere)

    pod = wait_phase(kubectl, ns, "in-zone-b", "Succeeded", kubelet)
    assert pod["spec"]["nodeName"] == "e2e-node-b"
    assert "node=e2e-node-b cpu=4 mem=8192" in kubectl("logs", "-n", ns, "in-zone-b").stdout
    event = wait_event(kubectl, ns, "in-zone-b", "Scheduled")
    assert event["message"] == f"Successfully assigned {ns}/in-zone-b to e2e-node-b", event
    assert event.get("reportingComponent") == "default-scheduler", event

    (pending,) = wait_for_pods(kubectl, ns, counts(0, 1), "in-zone-x Unschedulable", selector="app=nowhere")
    assert "3 node(s) didn't match Pod's node affinity/selector" in pod_scheduled(pending)["message"]
    assert kubelet.errors() == []


def test_required_pod_anti_affinity_puts_one_replica_per_node(
    kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str
) -> None:
    ns = e2e_namespace
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "anti"}}, "topologyKey": HOSTNAME_LABEL}]}}  # fmt: skip
    apply(kubectl, ns, sleepers("anti", 4, affinity=affinity))
    pods = wait_for_pods(kubectl, ns, counts(3, 1), "3 replicas on 3 nodes, the 4th Unschedulable", "app=anti")
    bound, (waiting,) = split(pods)
    assert sorted(p["spec"]["nodeName"] for p in bound) == sorted(NODE_NAMES)
    assert "didn't match pod anti-affinity rules" in pod_scheduled(waiting)["message"], pod_scheduled(waiting)
    assert kubelet.errors() == []


def test_topology_spread_over_zones(kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str) -> None:
    ns = e2e_namespace
    spread = [{"maxSkew": 1, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "zones"}}}]  # fmt: skip
    apply(kubectl, ns, sleepers("zones", 6, topologySpreadConstraints=spread))
    pods = wait_for_pods(kubectl, ns, counts(6, 0), "6 replicas bound", "app=zones")
    per_zone = Counter(kubelet.node(p["spec"]["nodeName"]).zone for p in pods)
    assert per_zone == dict.fromkeys(ZONES, 2), per_zone
    assert kubelet.errors() == []


def test_helm_reaches_the_api_server(helm: CommandRunner, kubectl: CommandRunner, e2e_namespace: str) -> None:
    version = helm("version", "--short").stdout.strip()
    assert version.startswith("v"), version
    helm("list", "-n", e2e_namespace)


# ---- persistent volumes: the default StorageClass, the stand-in's provisioner, kube-controller-manager's binder ----
def keeper_manifest() -> dict[str, Any]:
    """A StatefulSet whose pod writes its own uid to /data/first on a claim from its volumeClaimTemplate, or, when
    the file is there already, prints what an earlier pod wrote; as a non-root user (the chart's Redis runs as 999)."""
    script = textwrap.dedent("""\
        import os, sys, time
        path, uid = sys.argv[1], sys.argv[2]
        if os.path.exists(path):
            print("found", open(path).read(), flush=True)
        else:
            with open(path, "w") as out:
                out.write(uid)
            print("wrote", uid, flush=True)
        time.sleep(600)
        """)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "keeper"},
        "spec": {
            "serviceName": "keeper",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "keeper"}},
            "template": {
                "metadata": {"labels": {"app": "keeper"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "securityContext": {"runAsUser": 999, "runAsGroup": 999, "fsGroup": 999},
                    "containers": [{
                        "name": "keeper",
                        "image": BASE_IMAGE,
                        # a mount path in the arguments: process mode rewrites it to the volume's directory
                        "command": ["python3", "-c", script, "/data/first", "$(POD_UID)"],
                        "env": [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}},
            }],
        },
    }  # fmt: skip


def running_pod(kubectl: CommandRunner, ns: str, name: str, not_uid: str = "", timeout: float = 90) -> dict[str, Any]:
    """Pod `name` once Ready (and, with `not_uid`, a different pod than that one: the StatefulSet's re-creation)."""
    t0 = time.monotonic()
    while True:
        out = kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False, quiet=True)
        if out.returncode == 0:
            pod = json.loads(out.stdout)
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
            if ready and pod["metadata"]["uid"] != not_uid and not pod["metadata"].get("deletionTimestamp"):
                print(f"pod {name} ({pod['metadata']['uid']}) ready after {time.monotonic() - t0:.1f} s")
                return pod
        if time.monotonic() - t0 > timeout:
            kubectl("get", "pods,pvc,events", "-n", ns, "-o", "wide", check=False)
            kubectl("get", "pv", check=False)
            pytest.fail(f"pod {ns}/{name} not ready within {timeout:.0f} s")
        time.sleep(0.5)


def test_a_statefulset_pod_keeps_its_volume_when_re_created(
    kubectl: CommandRunner, kubelet: KubeletStandIn, e2e_namespace: str
) -> None:
    """The default StorageClass `standard` (WaitForFirstConsumer): the StatefulSet controller creates the claim,
    kube-scheduler picks the node, the stand-in's provisioner creates a hostPath PersistentVolume under its workdir
    pinned to that node, kube-controller-manager's PV controller binds it, the pod writes to it. The pod deleted,
    its replacement is scheduled to the same node and reads what the first one wrote. Deleting the claim deletes
    the volume and its directory (reclaim policy Delete)."""
    ns = e2e_namespace
    require_base_image(kubelet)
    storage_class = get_json(kubectl, "storageclass", STORAGE_CLASS)
    assert storage_class["provisioner"] == PROVISIONER and storage_class["volumeBindingMode"] == "WaitForFirstConsumer"
    assert storage_class["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"

    apply(kubectl, ns, keeper_manifest())
    first = running_pod(kubectl, ns, "keeper-0")
    node = first["spec"]["nodeName"]
    claim = get_json(kubectl, "pvc", "data-keeper-0", "-n", ns)
    assert claim["status"]["phase"] == "Bound" and claim["spec"]["storageClassName"] == STORAGE_CLASS, claim
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node  # by kube-scheduler
    volume = get_json(kubectl, "pv", claim["spec"]["volumeName"])
    assert volume["metadata"]["annotations"][PROVISIONED_BY] == PROVISIONER
    assert volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert volume["spec"]["capacity"] == {"storage": "16Mi"}
    [term] = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]
    directory = volume["spec"]["hostPath"]["path"]
    assert directory.startswith(os.path.join(kubelet.workdir, "volumes") + os.sep), directory  # never a system path
    wait_event(kubectl, ns, "data-keeper-0", "ProvisioningSucceeded")
    assert f"wrote {first['metadata']['uid']}" in kubectl("logs", "-n", ns, "keeper-0").stdout
    with open(os.path.join(directory, "first"), encoding="utf-8") as handle:
        assert handle.read() == first["metadata"]["uid"]

    kubectl("delete", "pod", "keeper-0", "-n", ns, "--wait=true", "--timeout=60s")
    second = running_pod(kubectl, ns, "keeper-0", not_uid=first["metadata"]["uid"])
    assert second["spec"]["nodeName"] == node  # the volume's node affinity
    assert f"found {first['metadata']['uid']}" in kubectl("logs", "-n", ns, "keeper-0").stdout

    # the claim outlives the StatefulSet; deleting it (once no pod uses it) releases and deletes the volume
    kubectl("delete", "statefulset", "keeper", "-n", ns, "--wait=true", "--timeout=60s")
    kubectl("wait", "-n", ns, "--for=delete", "pod/keeper-0", "--timeout=60s")
    kubectl("delete", "pvc", "data-keeper-0", "-n", ns, "--wait=true", "--timeout=60s")
    kubectl("wait", "--for=delete", f"pv/{volume['metadata']['name']}", "--timeout=60s")
    assert not os.path.exists(directory)
    assert kubelet.errors() == []


# ---- the API server's audit log ------------------------------------------------------------------------------------
def test_the_audit_log_counts_a_pod_status_patch(
    kubectl: CommandRunner, control_plane: ControlPlane, e2e_namespace: str
) -> None:
    """`ControlPlane.audit_count` counts requests by verb, resource, subresource, namespace, name, user and time:
    a pod created, the scheduler's status patch (it fits no node), and one status patch of ours."""
    ns = e2e_namespace
    t0 = time.time()
    apply(kubectl, ns, sleeper("audited", nodeSelector={"elastream.dev/no-such-node": "x"}))
    kubectl("wait", "-n", ns, "--for=condition=PodScheduled=False", "pod/audited", "--timeout=30s")
    before = time.time()
    kubectl(
        "patch", "pod", "audited", "-n", ns, "--subresource=status", "--type=strategic",
        "-p", json.dumps({"status": {"conditions": [{"type": "e2e.elastream.dev/Audited", "status": "True"}]}}),
    )  # fmt: skip
    after = time.time()
    pod = dict(namespace=ns, name="audited")
    # counted as soon as the request returned (the log is written in blocking mode)
    assert control_plane.audit_count(verb="patch", resource="pods", subresource="status", user="admin", **pod) == 1
    assert control_plane.audit_count(verb="patch", resource="pods/status", user="admin", since=before, **pod) == 1
    assert control_plane.audit_count(verb="patch", resource="pods/status", user="admin", until=before, **pod) == 0
    assert control_plane.audit_count(verb="patch", resource="pods/status", user="admin", since=after, **pod) == 0
    # kube-scheduler's PodScheduled=False went through the same subresource, as its own user
    assert control_plane.audit_count(verb="patch", resource="pods/status", user="system:kube-scheduler", **pod) >= 1
    assert control_plane.audit_count(verb="patch", resource="pods/status", since=t0, **pod) >= 2
    # the object itself: created once (kubectl apply), never patched; reads are counted too
    assert control_plane.audit_count(verb="create", resource="pods", subresource="", user="admin", **pod) == 1
    assert control_plane.audit_count(verb="patch", resource="pods", subresource="", **pod) == 0
    assert control_plane.audit_count(verb={"get", "list", "watch"}, resource="pods", namespace=ns, since=t0) >= 1
    [event] = control_plane.audit_events(verb="patch", resource="pods", subresource="status", user="admin", **pod)
    assert event.code == 200 and event.group == "" and before <= event.received <= after + 1, event
    assert "/status" in event.uri and event.user_agent.startswith("kubectl"), event
    # outside the policy: not in the log
    assert control_plane.audit_count(resource="namespaces", name=ns) == 0
