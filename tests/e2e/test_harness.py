"""The e2e harness itself, end to end with the real binaries: API server, controller manager, kubelet stand-in
(pods, probes, status, service-account tokens, Service forwarders and names), kubectl and helm."""

from __future__ import annotations

import json
import re
import textwrap
import time
import urllib.request

import pytest

from .conftest import BASE_IMAGE, CommandRunner
from .controlplane import ControlPlane
from .kubelet import SA_MOUNT, KubeletStandIn

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


def test_node_is_registered_and_ready(kubectl: CommandRunner, kubelet: KubeletStandIn) -> None:
    kubectl("get", "nodes", "-o", "wide")
    kubectl("wait", "--for=condition=Ready", f"node/{kubelet.node_name}", "--timeout=30s")
    node = get_json(kubectl, "node", kubelet.node_name)
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.34.")


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
    assert pod["spec"]["nodeName"] == kubelet.node_name

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
    assert env["POD_NAME"] == "envcheck" and env["POD_NS"] == ns and env["NODE"] == kubelet.node_name
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


def test_helm_reaches_the_api_server(helm: CommandRunner, kubectl: CommandRunner, e2e_namespace: str) -> None:
    version = helm("version", "--short").stdout.strip()
    assert version.startswith("v"), version
    helm("list", "-n", e2e_namespace)
