"""A test-only kubelet stand-in: several Nodes on one machine, pods run as Docker containers or local processes.

There is no kubelet, no container runtime for one, no kube-proxy and no cluster DNS in the e2e tier (see
docs/e2e.md). `KubeletStandIn` plays those parts against the real API server, as the admin, with the
`kubernetes` Python client, from threads of the test process:

- registers several Nodes (by default `e2e-node-a/b/c`, 4 CPU and 8Gi each, zones zone-a/b/c; see `NodeSpec`),
  each Ready with its own declared capacity/allocatable and labels, InternalIP 127.0.0.1, and renews each one's
  Lease in kube-node-lease every 10 s, so kube-controller-manager's node lifecycle controller keeps them healthy;
- binds nothing: the real kube-scheduler (started by controlplane.py) assigns pods to those Nodes;
- runs every pod bound to one of its Nodes, all on this machine: a fresh loopback pod IP each (127.0.0.10, .11, ...;
  hostIP 127.0.0.1), environment (value, fieldRef, resourceFieldRef, secretKeyRef, configMapKeyRef, envFrom, service
  links, `$(VAR)` expansion), volumes (configMap, secret, emptyDir, downwardAPI, hostPath, projected with a real
  TokenRequest for the service-account token, kube-root-ca.crt and the namespace, and persistentVolumeClaim and
  generic ephemeral volumes: the bound PersistentVolume's hostPath or local path), probes (httpGet, tcpSocket, exec;
  startup, liveness, readiness), restarts with back-off, and pod status through the pods/status subresource;
- storage, as kind's local-path-provisioner: a default StorageClass `standard` (WaitForFirstConsumer, Delete) whose
  claims it provisions as hostPath PersistentVolumes under its own workdir (`<workdir>/volumes`), pinned to the
  node the scheduler chose; kube-controller-manager's PV controller binds them, and deletes nothing itself: a
  Released volume of the class is removed by the provisioner (its directory, then the PersistentVolume);
- docker mode: `docker run -d --network host ...` per container; process mode: a local process per container
  (see `_ProcessRuntime` for how a command is found and how mount paths are rewritten);
- graceful deletion: SIGTERM, SIGKILL after terminationGracePeriodSeconds (capped at 10 s), then the pod is
  deleted with gracePeriodSeconds=0, as the kubelet does;
- Services: a userspace TCP forwarder on ClusterIP:port (127.96.0.0/16) to one ready pod matching the selector
  (what kube-proxy's old userspace mode did), names in a per-pod /etc/hosts (docker) or in this machine's
  /etc/hosts between marker comments (process mode);
- serves /containerLogs on 127.0.0.1 (every Node's kubelet endpoint: one server for all), so `kubectl logs`
  works for pods on any node.

Every pod IP is a 127.0.0.x address and every container shares the host's network namespace: a workload that
binds 0.0.0.0:PORT takes PORT on every pod IP at once, so two such pods collide; workloads bind $(POD_IP).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import http.client
import http.server
import json
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from support.paths import REPO

ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
RUNTIME_LABEL = "elastream.dev/e2e-runtime"
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
HOSTS_MARK = "# elastream-e2e"
#: the default StorageClass the stand-in creates and provisions (kind's is named `standard` too)
STORAGE_CLASS = "standard"
PROVISIONER = "e2e.elastream.dev/hostpath"
SELECTED_NODE = "volume.kubernetes.io/selected-node"  # set on a claim by kube-scheduler (WaitForFirstConsumer)
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
LABEL = "elastream.e2e"
MAX_GRACE_S = 10

log = logging.getLogger("e2e.kubelet")


# ---- the nodes -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeSpec:
    """One Node the stand-in registers. The CPUs and memory are declared (what the scheduler counts and what a
    `resourceFieldRef` without a limit reads), not reserved: every node's pods share this one machine."""

    name: str
    cpu: str = "4"  # a quantity: "4", "3500m"
    memory: str = "8Gi"
    zone: str = ""  # topology.kubernetes.io/zone (none when empty)
    labels: dict[str, str] = field(default_factory=dict)  # more labels (may override the defaults)
    pods: int = 110
    taints: tuple[dict[str, str], ...] = ()  # Node.spec.taints, e.g. {"key": "k", "value": "v", "effect": "NoSchedule"}

    def capacity(self) -> dict[str, str]:
        return {"cpu": str(self.cpu), "memory": str(self.memory), "pods": str(self.pods), "ephemeral-storage": "20Gi"}

    def node_labels(self, mode: str) -> dict[str, str]:
        labels = {
            HOSTNAME_LABEL: self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            RUNTIME_LABEL: mode,
        }
        if self.zone:
            labels[ZONE_LABEL] = self.zone
        labels.update(self.labels)
        return labels


NODE_NAMES = ("e2e-node-a", "e2e-node-b", "e2e-node-c")
ZONES = ("zone-a", "zone-b", "zone-c")
DEFAULT_NODES = tuple(NodeSpec(name, zone=zone) for name, zone in zip(NODE_NAMES, ZONES, strict=True))  # 4 CPU, 8Gi


def describe_nodes(nodes: tuple[NodeSpec, ...] | list[NodeSpec]) -> str:
    """E.g. `3 nodes x 4 CPU, 8Gi (e2e-node-a/zone-a, e2e-node-b/zone-b, e2e-node-c/zone-c)`."""
    where = ", ".join(f"{n.name}/{n.zone}" if n.zone else n.name for n in nodes)
    if len({(str(n.cpu), str(n.memory)) for n in nodes}) == 1:
        return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} x {nodes[0].cpu} CPU, {nodes[0].memory} ({where})"
    return f"{len(nodes)} nodes: " + ", ".join(
        f"{n.name} ({n.cpu} CPU, {n.memory}{', ' + n.zone if n.zone else ''})" for n in nodes
    )


# ---- small helpers ---------------------------------------------------------------------------------------------
def rfc3339(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined references are replaced, `$$` escapes, the rest stays as is."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == "$" and i + 1 < n:
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end == -1:
                    out.append(text[i:])
                    break
                name = text[i + 2 : end]
                out.append(env[name] if name and name in env else text[i : end + 1])
                i = end + 1
                continue
            out.append(char + nxt)
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def selector_matches(selector: dict[str, str] | None, labels: dict[str, str] | None) -> bool:
    if not selector:
        return False
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


def pod_is_ready(pod: dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def env_name(service: str) -> str:
    return service.upper().replace("-", "_").replace(".", "_")


class _ConfigError(Exception):
    """A pod cannot start yet (missing ConfigMap/Secret, ...): reported as a waiting reason, retried."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class _StartError(_ConfigError):
    pass


# ---- the API ---------------------------------------------------------------------------------------------------
class _Api:
    """Raw JSON calls through the kubernetes client's ApiClient (dicts in, dicts out, camelCase as in manifests)."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.client = self.new_client()

    def new_client(self) -> k8s_client.ApiClient:
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)
        configuration.connection_pool_maxsize = 32
        return k8s_client.ApiClient(configuration)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.client.call_api(*params, _request_timeout=timeout)
        resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException(http_resp=resp)
        return json.loads(resp.data) if resp.data else None

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def try_get(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch(self, path: str, body: Any, kind: str = "strategic-merge") -> Any:
        return self.request("PATCH", path, body, content_type=f"application/{kind}-patch+json")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


# ---- runtimes --------------------------------------------------------------------------------------------------
@dataclass
class _RunSpec:
    """Everything a runtime needs to start one container."""

    pod_key: str  # ns/name
    namespace: str
    pod: str
    container: str
    image: str
    command: list[str] | None
    args: list[str]
    env: dict[str, str]
    mounts: list[tuple[str, str, bool]]  # (host path, container path, read-only)
    working_dir: str | None
    user: str | None
    group_add: list[str]
    read_only: bool
    no_new_privileges: bool
    cap_add: list[str]
    cap_drop: list[str]
    hosts_file: str
    log_file: str
    scratch_dir: str  # a host dir of the pod (process mode: cwd, HOME)
    host_env: dict[str, str] = field(default_factory=dict)  # process mode: host paths, never rewritten


class _Handle:
    id: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0

    def poll(self) -> int | None:
        raise NotImplementedError

    def stop(self, grace: float) -> None:
        raise NotImplementedError

    def exec(self, command: list[str], timeout: float) -> tuple[int, str]:
        raise NotImplementedError

    def logs(self) -> str:
        raise NotImplementedError

    def follow(self) -> Iterator[bytes]:
        raise NotImplementedError

    def remove(self) -> None:
        """Drop the container (its output stays readable through the pod's log file)."""


def _one_line(argv: list[str]) -> str:
    """A command for a log marker line: one line, whatever the arguments hold."""
    return shlex.join(argv).replace("\n", "\\n")


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _ProcessHandle(_Handle):
    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, log_file: str, rewrite: Callable[[str], str]):
        self.argv, self.env, self.cwd, self.log_file, self._rewrite = argv, env, cwd, log_file, rewrite
        with open(log_file, "ab") as out:
            out.write(f"--- {rfc3339()} start: {_one_line(argv)}\n".encode())
            out.flush()
            try:
                self.proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stop() signals the whole tree
                )
            except OSError as exc:
                raise _StartError("RunContainerError", f"cannot start {argv[0]!r}: {exc}") from exc
        self.id = f"process://{self.proc.pid}"
        self.started_at = time.time()
        self._code: int | None = None

    def poll(self) -> int | None:
        if self._code is None:
            code = self.proc.poll()
            if code is not None:
                self._code = _exit_code(code)
                self.finished_at = time.time()
                # a workload's children (same process group) go with it, as in a container
                with contextlib.suppress(OSError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        return self._code

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float) -> None:
        if self.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=max(grace, 0.1))
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.poll()

    def exec(self, command: list[str], timeout: float) -> tuple[int, str]:
        argv = [self._rewrite(a) for a in command]
        try:
            out = subprocess.run(
                argv, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return 1, "timeout"
        except OSError as exc:
            return 126, str(exc)
        return out.returncode, out.stdout + out.stderr

    def logs(self) -> str:
        return ""  # the output is in the log file already

    def follow(self) -> Iterator[bytes]:
        with open(self.log_file, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            while True:
                chunk = handle.read(65536)
                if chunk:
                    yield chunk
                elif self.poll() is not None:
                    return
                else:
                    time.sleep(0.2)


class _ProcessRuntime:
    """Containers as local processes; images are not needed.

    The executable is `command[0]` (or, without a command, the image's entrypoint from `entrypoints`, by
    default `elastream`), looked up first in the project's venv (`.venv/bin`), then on PATH. Mount paths that
    appear in the arguments, the environment and the working directory are rewritten to the host directories
    that back them (a documented limitation: a path the program builds itself is not rewritten). A process
    gets KUBECONFIG pointing at a kubeconfig with the pod's service-account token file, since in-cluster
    config reads the fixed /var/run/secrets path. runAsUser, readOnlyRootFilesystem and capabilities are not
    applied.
    """

    name = "process"

    def __init__(self, bin_dir: str, entrypoints: dict[str, list[str]] | None = None) -> None:
        self.bin_dir = bin_dir
        self.entrypoints = entrypoints or {}
        self.version = "local processes"
        self.engine_version = f"python{sys.version_info.major}.{sys.version_info.minor}"

    def _entrypoint(self, image: str) -> list[str]:
        repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
        return list(self.entrypoints.get(image) or self.entrypoints.get(repo) or ["elastream"])

    def _resolve(self, exe: str, path: str) -> str:
        if "/" in exe:
            return exe
        local = os.path.join(self.bin_dir, exe)
        if os.access(local, os.X_OK):
            return local
        return shutil.which(exe, path=path) or exe

    def start(self, spec: _RunSpec) -> _Handle:
        mounts = sorted(((c.rstrip("/"), h.rstrip("/")) for h, c, _ro in spec.mounts), key=lambda m: -len(m[0]))
        hosts = dict(mounts)
        # one pass, longest mount first, only at the start of a path: a rewritten host path (which may itself
        # contain a mount path such as /tmp) is never rewritten again
        pattern = (
            re.compile(r"(?<![\w./-])(" + "|".join(re.escape(c) for c, _ in mounts) + r")(?=/|$|[^\w.-])")
            if mounts
            else None
        )

        def rewrite(value: str) -> str:
            if pattern is None:
                return value
            return pattern.sub(lambda m: hosts[m.group(1)], value)

        env = {
            "PATH": f"{self.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": spec.scratch_dir,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        env.update({k: rewrite(v) for k, v in spec.env.items()})
        env.update(spec.host_env)
        argv = list(spec.command) if spec.command else self._entrypoint(spec.image)
        argv = argv + list(spec.args)
        argv = [self._resolve(rewrite(argv[0]), env["PATH"])] + [rewrite(a) for a in argv[1:]]
        cwd = rewrite(spec.working_dir) if spec.working_dir else spec.scratch_dir
        if not os.path.isdir(cwd):
            cwd = spec.scratch_dir
        return _ProcessHandle(argv, env, cwd, spec.log_file, rewrite)


class _DockerHandle(_Handle):
    def __init__(self, runtime: _DockerRuntime, name: str, spec: _RunSpec, container_id: str) -> None:
        self.runtime, self.name, self.spec = runtime, name, spec
        self.id = f"docker://{container_id}"
        self.started_at = time.time()
        self._code: int | None = None
        self._removed = False
        self._waiter = threading.Thread(target=self._wait, name=f"docker-wait-{name}", daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        out = self.runtime.docker("wait", self.name, timeout=None)
        code = out.stdout.strip()
        self.finished_at = time.time()
        self._code = int(code) if out.returncode == 0 and code.lstrip("-").isdigit() else 137

    def poll(self) -> int | None:
        return self._code

    def stop(self, grace: float) -> None:
        if self._code is None:
            self.runtime.docker("stop", "-t", str(max(math.ceil(grace), 0)), self.name, timeout=grace + 30)
            self._waiter.join(timeout=15)

    def exec(self, command: list[str], timeout: float) -> tuple[int, str]:
        try:
            out = self.runtime.docker("exec", self.name, *command, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 1, "timeout"
        return out.returncode, out.stdout + out.stderr

    def logs(self) -> str:
        if self._removed:
            return ""
        out = self.runtime.docker("logs", self.name, timeout=30, merge=True)
        return out.stdout

    def follow(self) -> Iterator[bytes]:
        proc = subprocess.Popen(
            [self.runtime.binary, "logs", "-f", "--tail", "0", self.name],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            assert proc.stdout is not None
            while True:
                chunk = proc.stdout.read1(65536)  # type: ignore[attr-defined]
                if not chunk:
                    return
                yield chunk
        finally:
            proc.kill()
            proc.wait()

    def remove(self) -> None:
        if self._removed:
            return
        text = self.logs()
        with open(self.spec.log_file, "a", encoding="utf-8", errors="replace") as out:
            out.write(f"--- {rfc3339(self.started_at)} {self.id}\n{text}")
        self.runtime.docker("rm", "-f", self.name, timeout=60)
        self._removed = True


class _DockerRuntime:
    """Containers with a real Docker engine, always on the host network (no bridge: see docs/e2e.md)."""

    name = "docker"

    def __init__(self, session: str, binary: str | None = None) -> None:
        found = binary or shutil.which("docker")
        if not found:
            raise RuntimeError("docker mode: no docker client on PATH")
        self.binary = found
        self.session = session
        out = self.docker("version", "--format", "{{.Server.Version}}", timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"docker mode: `docker version` failed: {out.stderr.strip()}")
        self.engine_version = out.stdout.strip()
        self.version = f"Docker engine {self.engine_version}"
        self._cleanup_stale()

    def docker(
        self, *args: str, timeout: float | None = 60, env: dict[str, str] | None = None, merge: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args],
            capture_output=not merge,
            stdout=subprocess.PIPE if merge else None,
            stderr=subprocess.STDOUT if merge else None,
            text=True,
            errors="replace",
            timeout=timeout,
            env=env,
            check=False,
        )

    def _cleanup_stale(self) -> None:
        """Containers of earlier sessions whose test process is gone would hold pod IPs and ports."""
        out = self.docker(
            "ps", "-a", "--filter", f"label={LABEL}.pid", "--format", f'{{{{.ID}}}} {{{{.Label "{LABEL}.pid"}}}}'
        )
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit() and not _pid_alive(int(parts[1])):
                self.docker("rm", "-f", parts[0])

    def start(self, spec: _RunSpec) -> _Handle:
        name = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"e2e_{spec.namespace}_{spec.pod}_{spec.container}")
        owner = self.docker("inspect", "-f", f'{{{{index .Config.Labels "{LABEL}.pid"}}}}', name).stdout.strip()
        if owner.isdigit() and int(owner) != os.getpid() and _pid_alive(int(owner)):
            raise _StartError("RunContainerError", f"container name {name} is used by another running e2e session")
        self.docker("rm", "-f", name, timeout=60)
        argv = [
            "run", "-d", "--name", name, "--network", "host", "--pull", "never",
            "--label", f"{LABEL}.pid={os.getpid()}", "--label", f"{LABEL}.session={self.session}",
            "--label", f"io.kubernetes.pod.namespace={spec.namespace}",
            "--label", f"io.kubernetes.pod.name={spec.pod}",
            "--label", f"io.kubernetes.container.name={spec.container}",
            # names of Services (and the pod's own name): a per-pod hosts file, rewritten in place when
            # Services come and go (a fixed --add-host list could not follow them)
            "-v", f"{spec.hosts_file}:/etc/hosts:ro",
        ]  # fmt: skip
        client_env = {k: v for k, v in os.environ.items() if k.startswith("DOCKER_") or k in ("PATH", "HOME")}
        for key, value in spec.env.items():
            if key.startswith("DOCKER_"):
                argv += ["-e", f"{key}={value}"]
            else:
                argv += ["-e", key]  # the value comes from the client's environment: never on a command line
                client_env[key] = value
        for host, path, read_only in spec.mounts:
            argv += ["-v", f"{host}:{path}{':ro' if read_only else ''}"]
        if spec.user:
            argv += ["--user", spec.user]
        for group in spec.group_add:
            argv += ["--group-add", group]
        if spec.read_only:
            argv.append("--read-only")
        if spec.no_new_privileges:
            argv += ["--security-opt", "no-new-privileges"]
        for cap in spec.cap_add:
            argv += ["--cap-add", cap]
        for cap in spec.cap_drop:
            argv += ["--cap-drop", cap]
        if spec.working_dir:
            argv += ["-w", spec.working_dir]
        rest: list[str] = []
        if spec.command:
            argv += ["--entrypoint", spec.command[0]]
            rest = list(spec.command[1:])
        argv.append(spec.image)
        argv += rest + list(spec.args)
        result = self.docker(*argv, timeout=300, env=client_env)
        if result.returncode != 0:
            err = result.stderr.strip()
            self.docker("rm", "-f", name, timeout=60)
            if "No such image" in err or "Unable to find image" in err:
                raise _StartError(
                    "ErrImageNeverPull",
                    f"image {spec.image!r} is not in the local Docker engine; nothing is pulled here (no registry): "
                    f"build or load it first ({err.splitlines()[-1] if err else ''})",
                )
            raise _StartError("RunContainerError", f"docker run {spec.image}: {err}")
        with open(spec.log_file, "a", encoding="utf-8") as out:
            out.write(f"--- {rfc3339()} docker {_one_line(argv)}\n")
        return _DockerHandle(self, name, spec, result.stdout.strip())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- probes ----------------------------------------------------------------------------------------------------
@dataclass
class _Probe:
    kind: str  # startup | liveness | readiness
    spec: dict[str, Any]
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0

    def reset(self, started: float) -> None:
        self.next_at = started + float(self.spec.get("initialDelaySeconds") or 0)
        self.successes = self.failures = 0

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds") or 10)

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds") or 1)

    @property
    def success_threshold(self) -> int:
        return int(self.spec.get("successThreshold") or 1)

    @property
    def failure_threshold(self) -> int:
        return int(self.spec.get("failureThreshold") or 3)


# ---- one container of a pod ------------------------------------------------------------------------------------
@dataclass
class _Container:
    spec: dict[str, Any]
    init: bool = False
    handle: _Handle | None = None
    restart_count: int = 0
    ever_started: bool = False
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    done: bool = False  # init container succeeded, or a container that will not run again
    next_start: float = 0.0
    start_failures: int = 0
    last_error: str = ""
    probes: dict[str, _Probe] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self) -> dict[str, Any]:
        image = str(self.spec.get("image", ""))
        out: dict[str, Any] = {
            "name": self.name,
            "image": image,
            "imageID": image,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.handle is not None and self.handle.id:
            out["containerID"] = self.handle.id
        elif "terminated" in self.state and self.state["terminated"].get("containerID"):
            out["containerID"] = self.state["terminated"]["containerID"]
        return out


# ---- one pod ---------------------------------------------------------------------------------------------------
class _PodWorker(threading.Thread):
    def __init__(self, kubelet: KubeletStandIn, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.kubelet = kubelet
        self.pod = pod
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.key = f"{self.namespace}/{self.pod_name}"
        self.node: str = pod["spec"]["nodeName"]  # one of the stand-in's Nodes (set by the scheduler, immutable)
        self.wake = threading.Event()
        self.gone = False  # the API object is gone (force deletion): stop without deleting
        self.finished = threading.Event()
        self.host_network = bool(pod["spec"].get("hostNetwork"))
        self.ip = "127.0.0.1" if self.host_network else kubelet._allocate_ip()
        self.dir = os.path.join(kubelet.workdir, "pods", f"{self.namespace}_{self.pod_name}_{self.uid[:8]}")
        os.makedirs(self.dir, exist_ok=True)
        self.hosts_file = os.path.join(self.dir, "hosts")
        self.start_time = time.time()
        self.prepared = False
        self.prepare_error: _ConfigError | None = None
        self.volume_dirs: dict[str, str] = {}
        self.tokens: list[dict[str, Any]] = []  # projected tokens to refresh
        self.kubeconfig_for_processes = ""
        spec = pod["spec"]
        self.restart_policy: str = spec.get("restartPolicy") or "Always"
        self.init_containers = [_Container(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [_Container(c) for c in spec.get("containers") or []]
        for c in self.init_containers + self.containers:
            for kind in ("startup", "liveness", "readiness"):
                probe = c.spec.get(f"{kind}Probe")
                if probe and not (c.init and kind != "startup"):
                    c.probes[kind] = _Probe(kind, probe)
        self.conditions: dict[str, tuple[str, str, str]] = {}  # type -> (status, reason, lastTransitionTime)
        self.last_status: str = ""
        self.events_sent: set[str] = set()

    # ---- from the watch thread ----
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        if self.last_status and _condition_states(pod.get("status")) != _condition_states(json.loads(self.last_status)):
            # someone else changed the pod's conditions: kube-controller-manager's node lifecycle controller marks
            # the pods of a node whose Lease went stale (the API server was away) not ready. A kubelet's status
            # manager puts its own view back (what it sent last is not what the API server holds), and so do we:
            # otherwise the pod stays not ready and its Services have no endpoint
            self.last_status = ""
        self.wake.set()

    def removed(self) -> None:
        self.gone = True
        self.wake.set()

    # ---- main loop ----
    def run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.error("pod %s: worker crashed:\n%s", self.key, traceback.format_exc())
            self.kubelet._error(f"pod {self.key}: worker crashed: {traceback.format_exc()}")
        finally:
            self.finished.set()

    def _loop(self) -> None:
        self._push_status()
        while True:
            if self.kubelet._stopping.is_set():
                return
            if self.gone:
                self._stop_all(min(self._grace(), 2))
                self._cleanup()
                return
            if (self.pod["metadata"]).get("deletionTimestamp"):
                self._terminate()
                return
            if not self.prepared:
                try:
                    self._prepare()
                    self.prepared = True
                    self.prepare_error = None
                except _ConfigError as exc:
                    if self.prepare_error is None or self.prepare_error.message != exc.message:
                        self.kubelet._event(self.pod, "Warning", "FailedMount", exc.message)
                    self.prepare_error = exc
                    for c in self.init_containers + self.containers:
                        c.state = {"waiting": {"reason": exc.reason, "message": exc.message}}
                    self._push_status()
                    self.wake.wait(2)
                    self.wake.clear()
                    continue
            self._step()
            self._refresh_tokens()
            self._push_status()
            self.wake.wait(0.25)
            self.wake.clear()

    def _grace(self) -> float:
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return float(min(max(int(grace), 0), MAX_GRACE_S))

    # ---- preparation: volumes, hosts file ----
    def _prepare(self) -> None:
        spec = self.pod["spec"]
        vol_root = os.path.join(self.dir, "volumes")
        os.makedirs(vol_root, exist_ok=True)
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        self.tokens = []
        for vol in spec.get("volumes") or []:
            path = os.path.join(vol_root, vol["name"])
            self.volume_dirs[vol["name"]] = self._make_volume(vol, path)
            if fs_group is not None and not any(k in vol for k in ("hostPath", "persistentVolumeClaim", "ephemeral")):
                # a claim's volume is a host directory (hostPath, local): its owner is the provisioner's business
                _chgrp_tree(self.volume_dirs[vol["name"]], int(fs_group))
        if self._wants_sa_token():
            path = os.path.join(vol_root, "kube-api-access-e2e")
            self._make_volume(_default_sa_volume(), path)
            self.volume_dirs["kube-api-access-e2e"] = path
        self.kubelet._write_pod_hosts(self)
        # process mode: in-cluster config reads fixed paths, so processes get a kubeconfig with the token file
        token_dir = self._sa_token_dir()
        if token_dir:
            self.kubeconfig_for_processes = os.path.join(self.dir, "serviceaccount.kubeconfig")
            cfg = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "in-cluster", "cluster": {
                    "server": self.kubelet.server, "certificate-authority": os.path.join(token_dir, "ca.crt")}}],
                "users": [{"name": "sa", "user": {"tokenFile": os.path.join(token_dir, "token")}}],
                "contexts": [{"name": "in-cluster", "context": {
                    "cluster": "in-cluster", "user": "sa", "namespace": self.namespace}}],
                "current-context": "in-cluster",
            }  # fmt: skip
            with open(self.kubeconfig_for_processes, "w", encoding="utf-8") as out:
                json.dump(cfg, out)

    def _wants_sa_token(self) -> bool:
        """The ServiceAccount admission plugin normally adds a kube-api-access volume; this covers the rest."""
        spec = self.pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return False
        for c in spec.get("containers") or []:
            for m in c.get("volumeMounts") or []:
                if m.get("mountPath", "").rstrip("/") == SA_MOUNT:
                    return False
        sa = self.kubelet.api.try_get(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{spec.get('serviceAccountName') or 'default'}"
        )
        return not (sa is not None and sa.get("automountServiceAccountToken") is False)

    def _sa_token_dir(self) -> str:
        if "kube-api-access-e2e" in self.volume_dirs:
            return self.volume_dirs["kube-api-access-e2e"]
        for c in self.pod["spec"].get("containers") or []:
            for m in c.get("volumeMounts") or []:
                if m.get("mountPath", "").rstrip("/") == SA_MOUNT and m.get("name") in self.volume_dirs:
                    return self.volume_dirs[m["name"]]
        return ""

    def _make_volume(self, vol: dict[str, Any], path: str) -> str:
        api = self.kubelet.api
        if "emptyDir" in vol:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o777)  # as the kubelet does: any runAsUser can write
            return path
        if "hostPath" in vol:
            host = vol["hostPath"]["path"]
            if vol["hostPath"].get("type") in ("DirectoryOrCreate",) and not os.path.exists(host):
                os.makedirs(host, exist_ok=True)
            return str(host)
        if "persistentVolumeClaim" in vol:
            return self._claim_path(vol["persistentVolumeClaim"]["claimName"])
        if "ephemeral" in vol:
            # a generic ephemeral volume: kube-controller-manager's ephemeral-volume controller creates the claim
            # <pod>-<volume>, owned by the pod
            return self._claim_path(f"{self.pod_name}-{vol['name']}", owner=self.uid)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, exist_ok=True)
        if "configMap" in vol or "secret" in vol:
            self._write_source(path, vol, vol.get("configMap") or vol.get("secret") or {}, "configMap" in vol)
        elif "downwardAPI" in vol:
            src = vol["downwardAPI"]
            for item in src.get("items") or []:
                _write(
                    path, item["path"], self._downward_item(item).encode(), item.get("mode") or src.get("defaultMode")
                )
        elif "projected" in vol:
            proj = vol["projected"]
            mode = proj.get("defaultMode")
            for src in proj.get("sources") or []:
                if "configMap" in src or "secret" in src:
                    ref = src.get("configMap") or src.get("secret") or {}
                    self._write_source(path, {"_mode": mode}, ref, "configMap" in src)
                elif "downwardAPI" in src:
                    for item in src["downwardAPI"].get("items") or []:
                        _write(path, item["path"], self._downward_item(item).encode(), item.get("mode") or mode)
                elif "serviceAccountToken" in src:
                    tok = src["serviceAccountToken"]
                    entry = {
                        "path": os.path.join(path, tok["path"]),
                        "audience": tok.get("audience"),
                        "expirationSeconds": int(tok.get("expirationSeconds") or 3600),
                        "mode": mode,
                    }
                    self._request_token(entry)
                    self.tokens.append(entry)
                else:
                    raise _ConfigError("FailedMount", f"unsupported projected source {sorted(src)}")
        else:
            kind = next((k for k in vol if k != "name"), "?")
            raise _ConfigError("FailedMount", f"volume {vol['name']!r}: {kind} volumes are not supported here")
        # the kubelet's MakeNestedMountpoints (pkg/volume/util/nested_volumes.go, called by the configMap, secret,
        # downwardAPI and projected plugins): these volumes are mounted read-only, so the mount points of volumes
        # nested inside them are made here (a connector's Secret under the worker's /etc/elastream)
        for relative in nested_mountpoints(self.pod, vol["name"]):
            os.makedirs(os.path.join(path, relative), mode=0o755, exist_ok=True)
        _ = api
        return path

    def _claim_path(self, claim_name: str, owner: str = "") -> str:
        """The host directory behind a PersistentVolumeClaim: its bound PersistentVolume's hostPath or local path.
        Until the claim exists and is bound, the pod waits (a FailedMount event, retried), as with a kubelet."""
        api = self.kubelet.api
        claim = api.try_get(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim_name}")
        if claim is None:
            raise _ConfigError("ContainerCreating", f'persistentvolumeclaim "{claim_name}" not found')
        if owner and not any(ref.get("uid") == owner for ref in claim["metadata"].get("ownerReferences") or []):
            raise _ConfigError("ContainerCreating", f'persistentvolumeclaim "{claim_name}" was not created for the pod')
        volume_name = claim["spec"].get("volumeName")
        if not volume_name or (claim.get("status") or {}).get("phase") != "Bound":
            raise _ConfigError("ContainerCreating", f'persistentvolumeclaim "{claim_name}" is not bound')
        volume = api.try_get(f"/api/v1/persistentvolumes/{volume_name}")
        if volume is None:
            raise _ConfigError("ContainerCreating", f'persistentvolume "{volume_name}" not found')
        spec = volume["spec"]
        if "hostPath" in spec:
            host = str(spec["hostPath"]["path"])
            if spec["hostPath"].get("type") == "DirectoryOrCreate":
                os.makedirs(host, exist_ok=True)
        elif "local" in spec:
            host = str(spec["local"]["path"])
        else:
            kind = next((k for k in spec if k not in _PV_COMMON_FIELDS), "?")
            raise _ConfigError(
                "FailedMount", f'persistentvolume "{volume_name}": {kind} volumes are not supported here'
            )
        if not os.path.isdir(host):
            raise _ConfigError("FailedMount", f'persistentvolume "{volume_name}": {host} is not a directory')
        return host

    def _write_source(self, path: str, vol: dict[str, Any], ref: dict[str, Any], is_cm: bool) -> None:
        api = self.kubelet.api
        name = ref.get("name") if is_cm else (ref.get("secretName") or ref.get("name"))
        kind = "configmaps" if is_cm else "secrets"
        obj = api.try_get(f"/api/v1/namespaces/{self.namespace}/{kind}/{name}")
        if obj is None:
            if ref.get("optional"):
                return
            raise _ConfigError(
                "ContainerCreating", f'{"configmap" if is_cm else "secret"} "{name}" not found (volume mount)'
            )
        data: dict[str, bytes] = {}
        for key, value in (obj.get("data") or {}).items():
            data[key] = value.encode() if is_cm else base64.b64decode(value)
        for key, value in (obj.get("binaryData") or {}).items():
            data[key] = base64.b64decode(value)
        default_mode = ref.get("defaultMode", vol.get("_mode"))
        items = ref.get("items")
        if items:
            for item in items:
                if item["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise _ConfigError("ContainerCreating", f"{kind[:-1]} {name}: no key {item['key']!r}")
                _write(path, item["path"], data[item["key"]], item.get("mode") or default_mode)
        else:
            for key, value in data.items():
                _write(path, key, value, default_mode)

    def _request_token(self, entry: dict[str, Any]) -> None:
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [entry["audience"]] if entry.get("audience") else [],
                "expirationSeconds": max(entry["expirationSeconds"], 600),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.uid},
            },
        }
        try:
            out = self.kubelet.api.request(
                "POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{sa}/token", body
            )
        except ApiException as exc:
            message = f"TokenRequest for serviceaccount {sa}: {exc.status} {exc.reason}"
            raise _ConfigError("ContainerCreating", message) from exc
        dirname, base = os.path.split(entry["path"])
        _write(dirname, base, out["status"]["token"].encode(), entry.get("mode"))
        entry["issued"] = time.time()

    def _refresh_tokens(self) -> None:
        for entry in self.tokens:  # the kubelet refreshes at 80 % of the lifetime
            if time.time() - entry.get("issued", 0) > 0.8 * max(entry["expirationSeconds"], 600):
                with contextlib.suppress(_ConfigError):
                    self._request_token(entry)

    # ---- env / field refs ----
    def _field(self, path: str) -> str:
        pod = self.pod
        meta = pod["metadata"]
        simple = {
            "metadata.name": self.pod_name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.node,
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName") or "default",
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }
        if path in simple:
            return simple[path]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['?([^'\]]+)'?\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        if path in ("metadata.labels", "metadata.annotations"):
            items = sorted((meta.get(path.split(".")[1]) or {}).items())
            return "".join(f'{k}="{v}"\n' for k, v in items)
        raise _ConfigError("CreateContainerConfigError", f"unsupported fieldRef {path!r}")

    def _resource(self, ref: dict[str, Any], default_container: str) -> str:
        cname = ref.get("containerName") or default_container
        container = next((c for c in self.pod["spec"].get("containers") or [] if c["name"] == cname), {})
        kind, _, res = ref["resource"].partition(".")
        value = ((container.get("resources") or {}).get(kind) or {}).get(res)
        if value is None and kind == "requests":
            value = ((container.get("resources") or {}).get("limits") or {}).get(res)
        if value is None:  # no limit: the allocatable of the pod's node, as the kubelet reports
            value = self.kubelet.allocatable(self.node).get(res, "0")
        # the API server stores an unset divisor as "0"; the kubelet reads 0 as 1
        divisor = parse_quantity(ref.get("divisor") or "0") or parse_quantity("1")
        return str(math.ceil(parse_quantity(value) / divisor))

    def _downward_item(self, item: dict[str, Any]) -> str:
        if "fieldRef" in item:
            return self._field(item["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in item:
            return self._resource(item["resourceFieldRef"], "")
        raise _ConfigError("CreateContainerConfigError", f"unsupported downwardAPI item {item}")

    def _ref_value(self, kind: str, ref: dict[str, Any]) -> str | None:
        obj = self.kubelet.api.try_get(f"/api/v1/namespaces/{self.namespace}/{kind}/{ref['name']}")
        label = "configmap" if kind == "configmaps" else "secret"
        if obj is None:
            if ref.get("optional"):
                return None
            raise _ConfigError("CreateContainerConfigError", f'{label} "{ref["name"]}" not found')
        data = obj.get("data") or {}
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise _ConfigError(
                "CreateContainerConfigError",
                f"couldn't find key {ref['key']} in {label} {self.namespace}/{ref['name']}",
            )
        value = data[ref["key"]]
        return value if kind == "configmaps" else base64.b64decode(value).decode("utf-8", "replace")

    def _env(self, spec: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        pod_spec = self.pod["spec"]
        if pod_spec.get("enableServiceLinks", True) is not False:
            env.update(self.kubelet._service_env(self.namespace))
        api_port = str(self.kubelet.api_port)
        env.update({
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": api_port,
            "KUBERNETES_SERVICE_PORT_HTTPS": api_port,
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{api_port}",
            f"KUBERNETES_PORT_{api_port}_TCP": f"tcp://127.0.0.1:{api_port}",
            f"KUBERNETES_PORT_{api_port}_TCP_PROTO": "tcp",
            f"KUBERNETES_PORT_{api_port}_TCP_PORT": api_port,
            f"KUBERNETES_PORT_{api_port}_TCP_ADDR": "127.0.0.1",
            "HOSTNAME": self.pod_name,
        })  # fmt: skip
        for src in spec.get("envFrom") or []:
            prefix = src.get("prefix") or ""
            ref = src.get("configMapRef") or src.get("secretRef")
            kind = "configmaps" if "configMapRef" in src else "secrets"
            obj = self.kubelet.api.try_get(f"/api/v1/namespaces/{self.namespace}/{kind}/{ref['name']}")
            if obj is None:
                if ref.get("optional"):
                    continue
                raise _ConfigError("CreateContainerConfigError", f'{kind[:-1]} "{ref["name"]}" not found')
            for key, value in (obj.get("data") or {}).items():
                if re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", prefix + key):
                    env[prefix + key] = (
                        value if kind == "configmaps" else base64.b64decode(value).decode("utf-8", "replace")
                    )
        for item in spec.get("env") or []:
            name = item["name"]
            source = item.get("valueFrom")
            if source is None:
                env[name] = expand(str(item.get("value", "")), env)
            elif "fieldRef" in source:
                env[name] = self._field(source["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in source:
                env[name] = self._resource(source["resourceFieldRef"], spec["name"])
            elif "configMapKeyRef" in source or "secretKeyRef" in source:
                kind = "configmaps" if "configMapKeyRef" in source else "secrets"
                value = self._ref_value(kind, source.get("configMapKeyRef") or source.get("secretKeyRef"))
                if value is not None:
                    env[name] = value
            else:
                raise _ConfigError("CreateContainerConfigError", f"env {name}: unsupported valueFrom {sorted(source)}")
        return env

    def _run_spec(self, c: _Container) -> _RunSpec:
        spec = c.spec
        env = self._env(spec)
        command = [expand(a, env) for a in spec.get("command") or []] or None
        args = [expand(a, env) for a in spec.get("args") or []]
        mounts: list[tuple[str, str, bool]] = []
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        for m in spec.get("volumeMounts") or []:
            host = self.volume_dirs.get(m["name"])
            if host is None:
                raise _ConfigError("CreateContainerConfigError", f"volumeMount {m['name']!r}: no such volume")
            sub = m.get("subPath") or (expand(m["subPathExpr"], env) if m.get("subPathExpr") else "")
            if sub:
                host = os.path.join(host, sub)
                if not os.path.exists(host):
                    os.makedirs(host, exist_ok=True)
            vol = volumes.get(m["name"], {})
            read_only = (
                bool(m.get("readOnly"))
                or any(k in vol for k in ("configMap", "secret", "projected", "downwardAPI"))
                or bool((vol.get("persistentVolumeClaim") or {}).get("readOnly"))
            )
            mounts.append((host, m["mountPath"], read_only))
        if "kube-api-access-e2e" in self.volume_dirs:
            mounts.append((self.volume_dirs["kube-api-access-e2e"], SA_MOUNT, True))
        pod_sc = self.pod["spec"].get("securityContext") or {}
        sc = spec.get("securityContext") or {}
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        user = None if uid is None else (f"{uid}:{gid}" if gid is not None else str(uid))
        groups = [str(g) for g in pod_sc.get("supplementalGroups") or []]
        if pod_sc.get("fsGroup") is not None:
            groups.append(str(pod_sc["fsGroup"]))
        caps = sc.get("capabilities") or {}
        host_env = {}
        if self.kubeconfig_for_processes and "KUBECONFIG" not in env:
            host_env["KUBECONFIG"] = self.kubeconfig_for_processes  # used by process mode only
        return _RunSpec(
            pod_key=self.key,
            namespace=self.namespace,
            pod=self.pod_name,
            container=c.name,
            image=str(spec.get("image", "")),
            command=command,
            args=args,
            env=env,
            mounts=mounts,
            working_dir=spec.get("workingDir"),
            user=user,
            group_add=groups,
            read_only=bool(sc.get("readOnlyRootFilesystem")),
            no_new_privileges=sc.get("allowPrivilegeEscalation") is False,
            cap_add=list(caps.get("add") or []),
            cap_drop=list(caps.get("drop") or []),
            hosts_file=self.hosts_file,
            log_file=self.kubelet._log_file(self.namespace, self.pod_name, c.name),
            scratch_dir=self.dir,
            host_env=host_env,
        )

    # ---- running ----
    def _backoff(self, c: _Container) -> float:
        return float(min(2 ** min(c.restart_count, 10), 10))

    def _start(self, c: _Container) -> None:
        try:
            try:
                run = self._run_spec(c)
            except (urllib3.exceptions.HTTPError, OSError) as exc:  # the API server away: retried, as a kubelet does
                raise _ConfigError("CreateContainerConfigError", f"cannot read the pod's config: {exc}") from None
            c.handle = self.kubelet.runtime.start(run)
        except _ConfigError as exc:
            # like ImagePullBackOff / CreateContainerConfigError: retried with a growing delay, one event per change
            c.start_failures += 1
            c.state = {"waiting": {"reason": exc.reason, "message": exc.message}}
            c.next_start = time.monotonic() + min(2**c.start_failures, 20)
            if exc.message != c.last_error:
                self.kubelet._event(self.pod, "Warning", "Failed", f"container {c.name}: {exc.message}")
            c.last_error = exc.message
            return
        c.start_failures = 0
        c.last_error = ""
        if c.ever_started:
            c.restart_count += 1
        c.ever_started = True
        c.state = {"running": {"startedAt": rfc3339(c.handle.started_at)}}
        c.started = "startup" not in c.probes
        c.ready = c.started and "readiness" not in c.probes and not c.init
        now = time.monotonic()
        for probe in c.probes.values():
            probe.reset(now)
        self.kubelet._event(self.pod, "Normal", "Started", f"Started container {c.name} ({self.kubelet.runtime.name})")

    def _exited(self, c: _Container, code: int) -> None:
        handle = c.handle
        assert handle is not None
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": rfc3339(handle.started_at),
            "finishedAt": rfc3339(handle.finished_at or time.time()),
            "containerID": handle.id,
        }
        handle.remove()
        c.handle = None
        c.ready = False
        c.started = False
        restart = self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)
        if c.init:
            restart = code != 0 and self.restart_policy != "Never"
        if restart:
            delay = self._backoff(c)
            c.last_state = {"terminated": terminated}
            c.state = {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:.0f}s restarting failed container={c.name} pod={self.pod_name}",
            }}  # fmt: skip
            c.next_start = time.monotonic() + delay
            if code != 0:
                self.kubelet._event(self.pod, "Warning", "BackOff", f"Back-off restarting failed container {c.name}")
        else:
            c.state = {"terminated": terminated}
            c.done = True

    def _step(self) -> None:
        now = time.monotonic()
        for c in self.init_containers:
            if c.done and c.state.get("terminated", {}).get("exitCode", 0) == 0:
                continue
            if c.done:  # failed for good (restartPolicy Never)
                return
            if c.handle is None:
                if now >= c.next_start:
                    self._start(c)
                return
            code = c.handle.poll()
            if code is None:
                return
            self._exited(c, code)
            if c.done and code == 0:
                continue
            return
        for c in self.containers:
            if c.handle is None:
                if not c.done and now >= c.next_start:
                    self._start(c)
                continue
            code = c.handle.poll()
            if code is not None:
                self._exited(c, code)
                continue
            self._probe(c, now)

    def _probe(self, c: _Container, now: float) -> None:
        for kind in ("startup", "liveness", "readiness"):
            probe = c.probes.get(kind)
            if probe is None or now < probe.next_at:
                continue
            if kind == "startup" and c.started:
                continue
            if kind != "startup" and not c.started:
                continue
            probe.next_at = now + probe.period
            ok, detail = self._run_probe(c, probe)
            if ok:
                probe.successes += 1
                probe.failures = 0
            else:
                probe.failures += 1
                probe.successes = 0
                self.kubelet._event(self.pod, "Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {detail}")
            if kind == "startup":
                if probe.successes >= 1:
                    c.started = True
                    c.ready = "readiness" not in c.probes
                    for other in c.probes.values():
                        if other.kind != "startup":
                            other.reset(now)
                elif probe.failures >= probe.failure_threshold:
                    self._kill(c, f"Container {c.name} failed startup probe, will be restarted")
                    return
            elif kind == "liveness" and probe.failures >= probe.failure_threshold:
                self._kill(c, f"Container {c.name} failed liveness probe, will be restarted")
                return
            elif kind == "readiness":
                if probe.successes >= probe.success_threshold:
                    c.ready = True
                elif probe.failures >= probe.failure_threshold:
                    c.ready = False

    def _kill(self, c: _Container, message: str) -> None:
        self.kubelet._event(self.pod, "Normal", "Killing", message)
        if c.handle is not None:
            c.handle.stop(self._grace())

    def _run_probe(self, c: _Container, probe: _Probe) -> tuple[bool, str]:
        spec = probe.spec
        try:
            if "httpGet" in spec:
                get = spec["httpGet"]
                host = get.get("host") or self.ip
                port = self._port(c, get.get("port"))
                conn_cls = http.client.HTTPSConnection if get.get("scheme") == "HTTPS" else http.client.HTTPConnection
                kwargs: dict[str, Any] = {"timeout": probe.timeout}
                if conn_cls is http.client.HTTPSConnection:
                    kwargs["context"] = ssl._create_unverified_context()
                conn = conn_cls(host, port, **kwargs)
                try:
                    headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                    headers.setdefault("User-Agent", "kube-probe/1.34")
                    conn.request("GET", get.get("path") or "/", headers=headers)
                    resp = conn.getresponse()
                    resp.read(10240)
                    return 200 <= resp.status < 400, f"HTTP probe failed with statuscode: {resp.status}"
                finally:
                    conn.close()
            if "tcpSocket" in spec:
                host = spec["tcpSocket"].get("host") or self.ip
                port = self._port(c, spec["tcpSocket"].get("port"))
                with socket.create_connection((host, port), timeout=probe.timeout):
                    return True, ""
            if "exec" in spec and c.handle is not None:
                code, out = c.handle.exec(list(spec["exec"].get("command") or []), probe.timeout + 1)
                return code == 0, f"command exited with {code}: {out.strip()[:200]}"
            if "grpc" in spec:
                port = int(spec["grpc"]["port"])
                with socket.create_connection((self.ip, port), timeout=probe.timeout):  # connect only
                    return True, ""
        except (OSError, http.client.HTTPException) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return False, "unsupported probe"

    def _port(self, c: _Container, port: Any) -> int:
        if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise OSError(f"no container port named {port!r}")

    # ---- stopping ----
    def _stop_all(self, grace: float) -> None:
        threads = []
        for c in self.init_containers + self.containers:
            if c.handle is not None and c.handle.poll() is None:
                t = threading.Thread(target=c.handle.stop, args=(grace,), daemon=True)
                t.start()
                threads.append(t)
        for t in threads:
            t.join(timeout=grace + 40)
        for c in self.init_containers + self.containers:
            if c.handle is not None:
                c.handle.poll()
                with contextlib.suppress(Exception):
                    c.handle.remove()

    def _terminate(self) -> None:
        grace = self._grace()
        running = [c.name for c in self.containers if c.handle is not None and c.handle.poll() is None]
        if running:
            self.kubelet._event(self.pod, "Normal", "Killing", f"Stopping container(s) {', '.join(running)}")
        self._stop_all(grace)
        try:
            self.kubelet.api.request(
                "DELETE",
                f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                 "preconditions": {"uid": self.uid}},
            )  # fmt: skip
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s: final delete failed: %s %s", self.key, exc.status, exc.reason)
        self._cleanup()

    def _cleanup(self) -> None:
        self.kubelet._pod_finished(self)

    def stop_for_shutdown(self) -> None:
        self._stop_all(min(self._grace(), 3))

    # ---- status ----
    def _phase(self) -> str:
        containers = self.containers
        if any(
            c.init and c.done and c.state.get("terminated", {}).get("exitCode", 0) != 0 for c in self.init_containers
        ):
            return "Failed"
        if not all(c.done for c in self.init_containers):
            return "Pending"
        if not any(c.ever_started for c in containers):
            return "Pending"
        if all(c.done for c in containers):
            failed = any(c.state.get("terminated", {}).get("exitCode", 0) != 0 for c in containers)
            return "Failed" if failed else "Succeeded"
        return "Running"

    def _condition(self, ctype: str, status: bool, reason: str = "") -> dict[str, Any]:
        value = "True" if status else "False"
        prev = self.conditions.get(ctype)
        if prev is None or prev[0] != value:
            prev = (value, reason, rfc3339())
            self.conditions[ctype] = prev
        # null removes a reason/message left from an earlier state (the status is a strategic merge patch)
        return {
            "type": ctype,
            "status": value,
            "lastProbeTime": None,
            "lastTransitionTime": prev[2],
            "reason": reason or None,
            "message": None,
        }

    def status(self) -> dict[str, Any]:
        phase = self._phase()
        initialized = all(c.done for c in self.init_containers)
        terminal = phase in ("Succeeded", "Failed")
        ready = not terminal and initialized and all(c.ready for c in self.containers)
        not_ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": rfc3339(self.start_time),
            "conditions": [
                self._condition("PodReadyToStartContainers", self.prepared),
                self._condition("Initialized", initialized, "" if initialized else "ContainersNotInitialized"),
                self._condition("ContainersReady", ready, "" if ready else not_ready_reason),
                self._condition("Ready", ready, "" if ready else not_ready_reason),
                self._condition("PodScheduled", True),
            ],
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        status["message"] = self.prepare_error.message if self.prepare_error is not None else None
        status["reason"] = None
        return status

    def _push_status(self) -> None:
        status = self.status()
        encoded = json.dumps(status, sort_keys=True)
        if encoded == self.last_status:
            return
        try:
            self.kubelet.api.patch(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}/status", {"status": status}
            )
            self.last_status = encoded
        except ApiException as exc:
            if exc.status == 404:
                self.gone = True
            else:
                log.warning("pod %s: status patch failed: %s %s", self.key, exc.status, (exc.body or "")[:500])
        except Exception as exc:  # the API server away (a real kubelet runs its pods on): sent again next loop
            log.warning("pod %s: status patch failed: %s", self.key, exc)


def _condition_states(status: dict[str, Any] | None) -> dict[str, str]:
    """type -> status of a pod status's conditions."""
    return {c.get("type", ""): c.get("status", "") for c in (status or {}).get("conditions") or []}


def _write(base: str, rel: str, data: bytes, mode: int | None) -> None:
    path = os.path.join(base, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{secrets.token_hex(3)}"
    with open(tmp, "wb") as out:
        out.write(data)
    os.chmod(tmp, mode if mode is not None else 0o644)
    os.replace(tmp, path)


def _chgrp_tree(path: str, gid: int) -> None:
    for root, dirs, files in os.walk(path):
        for name in [root] + [os.path.join(root, d) for d in dirs] + [os.path.join(root, f) for f in files]:
            with contextlib.suppress(OSError):
                os.chown(name, -1, gid)
                st = os.stat(name)
                os.chmod(name, st.st_mode | 0o060)


#: PersistentVolume spec fields that are not its volume source
_PV_COMMON_FIELDS = {
    "accessModes", "capacity", "claimRef", "persistentVolumeReclaimPolicy", "storageClassName", "mountOptions",
    "volumeMode", "nodeAffinity", "volumeAttributesClassName",
}  # fmt: skip


def _default_sa_volume() -> dict[str, Any]:
    return {
        "name": "kube-api-access-e2e",
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }


# ---- Services: userspace forwarders -----------------------------------------------------------------------------
class _Forwarder(threading.Thread):
    """Listens on ClusterIP:port (and 127.0.0.1:nodePort) and pipes each connection to one ready endpoint."""

    def __init__(self, kubelet: KubeletStandIn, namespace: str, service: str, ip: str, port: int,
                 port_spec: dict[str, Any]) -> None:  # fmt: skip
        super().__init__(name=f"svc-{namespace}/{service}:{port}", daemon=True)
        self.kubelet, self.namespace, self.service = kubelet, namespace, service
        self.address = (ip, port)
        self.port_spec = port_spec
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(self.address)
        self.sock.listen(128)
        self.sock.settimeout(0.5)
        self.closed = False
        self.connections = 0

    def run(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            target = self.kubelet._pick_endpoint(self.namespace, self.service, self.port_spec)
            if target is None:
                # no ready endpoint: reset, as kube-proxy's REJECT rule does
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
                continue
            self.connections += 1
            threading.Thread(target=_pipe_pair, args=(conn, target), daemon=True).start()

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


def _pipe_pair(conn: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=5)
    except OSError:
        conn.close()
        return
    upstream.settimeout(None)
    conn.settimeout(None)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=pump, args=(upstream, conn), daemon=True)
    other.start()
    pump(conn, upstream)
    other.join()
    conn.close()
    upstream.close()


# ---- the kubelet endpoint: /containerLogs for `kubectl logs` ------------------------------------------------------
class _LogServer(threading.Thread):
    def __init__(self, kubelet: KubeletStandIn, workdir: str) -> None:
        super().__init__(name="kubelet-logs", daemon=True)
        self.kubelet = kubelet
        cert, key = os.path.join(workdir, "kubelet.crt"), os.path.join(workdir, "kubelet.key")
        out = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=e2e-kubelet",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"openssl req for the kubelet endpoint failed: {out.stderr}")
        stand_in = kubelet

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("kubelet endpoint: " + fmt, *args)

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                query = urllib.parse.parse_qs(url.query)
                parts = url.path.strip("/").split("/")
                if url.path in ("/healthz", "/readyz", "/livez"):
                    self._send(200, b"ok")
                    return
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._send(404, f"not served by the e2e kubelet stand-in: {url.path}\n".encode())
                    return
                _, ns, pod, container = parts
                if query.get("follow", ["false"])[0] == "true":
                    handle = stand_in._handle(ns, pod, container)
                    if handle is not None:
                        self.send_response(200)
                        self.send_header("Content-Type", "text/plain")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        past = stand_in.logs(ns, pod, container, markers=False).encode()
                        try:
                            if past:
                                self._chunk(past)
                            for chunk in handle.follow():
                                self._chunk(chunk)
                            self.wfile.write(b"0\r\n\r\n")
                        except OSError:
                            pass
                        return
                text = stand_in.logs(ns, pod, container, markers=False)
                tail = query.get("tailLines")
                if tail and tail[0].lstrip("-").isdigit() and int(tail[0]) >= 0:
                    lines = text.splitlines(keepends=True)
                    text = "".join(lines[-int(tail[0]) :]) if int(tail[0]) else ""
                self._send(200, text.encode())

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])

    def run(self) -> None:
        self.server.serve_forever(poll_interval=0.5)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---- the stand-in ----------------------------------------------------------------------------------------------
# ---- storage: a host-path provisioner, as kind's local-path-provisioner -------------------------------------------
class _HostPathProvisioner:
    """Dynamic provisioning for the StorageClass `standard` (provisioner `e2e.elastream.dev/hostpath`), the part
    kind's local-path-provisioner plays on a kind cluster, with the external-provisioner protocol of Kubernetes:

    - kube-controller-manager's PV controller marks a claim of the class with `volume.kubernetes.io/
      storage-provisioner` (for WaitForFirstConsumer, once kube-scheduler has put the pod's node in
      `volume.kubernetes.io/selected-node`);
    - this provisioner then creates a PersistentVolume `pvc-<claim uid>`: a hostPath directory (mode 0777, as
      local-path-provisioner makes it) under `<kubelet workdir>/volumes`, pre-bound to the claim (`claimRef`),
      with the claim's size and access modes, the class's reclaim policy and, for a selected node, a node affinity
      to it (so a re-created pod is scheduled where its data is);
    - the PV controller binds the claim; the kubelet stand-in mounts the PersistentVolume's path;
    - when the claim is deleted the PV controller marks the volume Released, and (reclaim policy Delete) this
      provisioner removes the directory and the PersistentVolume.

    Nothing outside `root` is ever created or removed."""

    def __init__(self, kubelet: KubeletStandIn) -> None:
        self.kubelet = kubelet
        self.root = os.path.join(kubelet.workdir, "volumes")
        os.makedirs(self.root, exist_ok=True)
        self._done: set[str] = set()  # claim uids provisioned, volume names deleted

    @property
    def api(self) -> _Api:
        assert self.kubelet.api is not None
        return self.kubelet.api

    def storage_class(self) -> dict[str, Any]:
        return {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
        }

    def create_storage_class(self) -> None:
        try:
            self.api.request("POST", "/apis/storage.k8s.io/v1/storageclasses", self.storage_class())
        except ApiException as exc:
            if exc.status != 409:
                raise

    # ---- claims ----
    def sync_claims(self, items: list[dict[str, Any]]) -> None:
        for claim in items:
            self.on_claim("ADDED", claim)

    def on_claim(self, etype: str, claim: dict[str, Any]) -> None:
        meta, spec = claim["metadata"], claim.get("spec") or {}
        annotations = meta.get("annotations") or {}
        provisioner = annotations.get("volume.kubernetes.io/storage-provisioner") or annotations.get(
            "volume.beta.kubernetes.io/storage-provisioner"
        )
        if etype == "DELETED" or meta.get("deletionTimestamp") or spec.get("volumeName") or provisioner != PROVISIONER:
            return
        if meta["uid"] in self._done:
            return
        try:
            self._provision(claim)
        except Exception as exc:
            log.warning("provisioning %s/%s failed: %s", meta["namespace"], meta["name"], exc)
            self._event(claim, "Warning", "ProvisioningFailed", f"failed to provision volume: {exc}")

    def _provision(self, claim: dict[str, Any]) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        cls = self.api.try_get(f"/apis/storage.k8s.io/v1/storageclasses/{spec.get('storageClassName') or ''}")
        if cls is None or cls.get("provisioner") != PROVISIONER:
            return
        node = (meta.get("annotations") or {}).get(SELECTED_NODE, "")
        if cls.get("volumeBindingMode") == "WaitForFirstConsumer" and not node:
            return  # the PV controller waits for the scheduler too; the next update carries the node
        if (spec.get("volumeMode") or "Filesystem") != "Filesystem":
            raise ValueError("only volumeMode Filesystem is supported")
        name = f"pvc-{meta['uid']}"
        path = os.path.join(self.root, f"{name}_{meta['namespace']}_{meta['name']}")
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)  # any runAsUser may write, as local-path-provisioner's directories
        volume: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {PROVISIONED_BY: PROVISIONER}},
            "spec": {
                "capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": cls.get("reclaimPolicy") or "Delete",
                "storageClassName": cls["metadata"]["name"],
                "volumeMode": "Filesystem",
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                             "name": meta["name"], "uid": meta["uid"]},
                "hostPath": {"path": path, "type": "DirectoryOrCreate"},
            },
        }  # fmt: skip
        if node:
            volume["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}]}}  # fmt: skip
        try:
            self.api.request("POST", "/api/v1/persistentvolumes", volume)
        except ApiException as exc:
            if exc.status != 409:  # 409: provisioned already (a repeated event)
                raise
        self._done.add(meta["uid"])
        log.info("provisioned %s for claim %s/%s at %s (node %s)", name, meta["namespace"], meta["name"], path,
                 node or "any")  # fmt: skip
        self._event(claim, "Normal", "ProvisioningSucceeded", f"Successfully provisioned volume {name}")

    # ---- volumes ----
    def sync_volumes(self, items: list[dict[str, Any]]) -> None:
        for volume in items:
            self.on_volume("ADDED", volume)

    def on_volume(self, etype: str, volume: dict[str, Any]) -> None:
        meta, spec = volume["metadata"], volume.get("spec") or {}
        if etype == "DELETED" or (meta.get("annotations") or {}).get(PROVISIONED_BY) != PROVISIONER:
            return
        if (volume.get("status") or {}).get("phase") != "Released" or meta["name"] in self._done:
            return
        if spec.get("persistentVolumeReclaimPolicy") != "Delete":
            return  # Retain: the volume and its directory stay until someone deletes them
        path = os.path.realpath((spec.get("hostPath") or {}).get("path", ""))
        if os.path.dirname(path) != os.path.realpath(self.root):
            log.warning("not deleting %s: its path %s is not one of the provisioner's", meta["name"], path)
            return
        shutil.rmtree(path, ignore_errors=True)
        try:
            self.api.request("DELETE", f"/api/v1/persistentvolumes/{meta['name']}")
        except ApiException as exc:
            if exc.status != 404:
                log.warning("deleting %s: %s %s", meta["name"], exc.status, exc.reason)
                return
        self._done.add(meta["name"])
        log.info("deleted %s (released) and %s", meta["name"], path)

    def _event(self, claim: dict[str, Any], etype: str, reason: str, message: str) -> None:
        self.kubelet._event(claim, etype, reason, message, component=PROVISIONER, kind="PersistentVolumeClaim")


class KubeletStandIn:
    """See the module docstring. `start()`/`stop()`, or use it as a context manager."""

    def __init__(
        self,
        kubeconfig: str,
        workdir: str,
        mode: str = "docker",
        *,
        server: str,
        ca_file: str,
        nodes: tuple[NodeSpec, ...] | list[NodeSpec] = DEFAULT_NODES,
        kubelet_version: str = "v1.34.3",
        bin_dir: str | None = None,
        entrypoints: dict[str, list[str]] | None = None,
        docker_binary: str | None = None,
        storage: bool = True,
    ) -> None:
        """`storage`: create the default StorageClass `standard` and provision its claims (`_HostPathProvisioner`)."""
        if mode not in ("docker", "process"):
            raise ValueError(f"mode must be 'docker' or 'process', not {mode!r}")
        self.kubeconfig = kubeconfig
        self.workdir = os.path.abspath(workdir)
        os.makedirs(os.path.join(self.workdir, "pods"), exist_ok=True)
        os.makedirs(os.path.join(self.workdir, "logs"), exist_ok=True)
        self.mode = mode
        self.server = server
        self.api_port = int(urllib.parse.urlparse(server).port or 443)
        self.ca_file = ca_file
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        if not self.nodes:
            raise ValueError("at least one node")
        if len({n.name for n in self.nodes}) != len(self.nodes):
            raise ValueError(f"node names must be unique: {[n.name for n in self.nodes]}")
        self.node_names: tuple[str, ...] = tuple(n.name for n in self.nodes)
        self._node_specs = {n.name: n for n in self.nodes}
        self.node_uids: dict[str, str] = {}
        self.kubelet_version = kubelet_version
        self.session = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.bin_dir = bin_dir or os.path.join(REPO, ".venv", "bin")
        self._entrypoints = entrypoints
        self._docker_binary = docker_binary
        self.runtime: Any = None
        self.api: _Api | None = None  # type: ignore[assignment]
        self._stopping = threading.Event()
        self._lock = threading.RLock()
        self._ip_counter = 10
        self._ip_octet = 0
        self._ip_lock: Any = None
        self._workers: dict[str, _PodWorker] = {}  # uid -> worker
        self._done_uids: set[str] = set()
        self._pods: dict[str, dict[str, Any]] = {}  # "ns/name" -> latest pod (all nodes)
        self._services: dict[str, dict[str, Any]] = {}  # "ns/name" -> service
        self._forwarders: dict[tuple[str, str, int], _Forwarder] = {}  # (ns/name, ip, port)
        self._rr: dict[str, int] = {}
        self._threads: list[threading.Thread] = []
        self._watches: list[k8s_watch.Watch] = []
        self._hosts_dirty = threading.Event()
        self._etc_hosts_lines: list[str] = []
        self._errors: list[str] = []
        self._log_server: _LogServer | None = None
        self._log_handler: logging.Handler | None = None
        self.provisioner: _HostPathProvisioner | None = _HostPathProvisioner(self) if storage else None

    # ---- lifecycle ----
    def __enter__(self) -> KubeletStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def runtime_version(self) -> str:
        return self.runtime.version if self.runtime is not None else "?"

    def describe(self) -> str:
        return f"kubelet stand-in ({self.mode} mode: {self.runtime_version}) for {describe_nodes(self.nodes)}"

    def node(self, name: str) -> NodeSpec:
        return self._node_specs[name]

    def allocatable(self, node: str) -> dict[str, str]:
        """What Node `node` declares (capacity = allocatable: nothing is reserved)."""
        return self._node_specs[node].capacity()

    def start(self) -> None:
        handler = logging.FileHandler(os.path.join(self.workdir, "kubelet.log"))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
        self._log_handler = handler
        if self.mode == "docker":
            self.runtime = _DockerRuntime(self.session, self._docker_binary)
        else:
            self.runtime = _ProcessRuntime(self.bin_dir, self._entrypoints)
        self._claim_ip_block()
        log.info("starting: %s; pod IPs 127.%s.0.10 and up", self.describe(), self._ip_octet)
        self.api = _Api(self.kubeconfig)
        self._cleanup_stale_hosts()
        self._log_server = _LogServer(self, self.workdir)
        self._log_server.start()
        self._register_nodes()
        targets: list[tuple[Callable[[], None], str]] = [
            (self._watch_services, "watch-services"), (self._watch_pods, "watch-pods"),
            (self._housekeeping, "housekeeping"),
        ]  # fmt: skip
        if self.provisioner is not None:
            self.provisioner.create_storage_class()
            targets += [(self._watch_claims, "watch-claims"), (self._watch_volumes, "watch-volumes")]
        for target, name in targets:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        for w in self._watches:
            w.stop()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.wake.set()
        for worker in workers:
            worker.finished.wait(timeout=15)
        stoppers = [threading.Thread(target=w.stop_for_shutdown, daemon=True) for w in workers]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(timeout=60)
        with self._lock:
            for fwd in self._forwarders.values():
                fwd.close()
            self._forwarders.clear()
        self._set_etc_hosts([])
        if self._log_server is not None:
            self._log_server.close()
        if self.api is not None:
            self.api.close()
        if self._ip_lock is not None:
            self._ip_lock.close()  # releases the flock: the block is free for the next session
            self._ip_lock = None
        log.info("stopped")
        if self._log_handler is not None:
            log.removeHandler(self._log_handler)
            self._log_handler.close()

    # ---- public helpers for tests ----
    def logs(self, namespace: str, pod: str, container: str | None = None, markers: bool = True) -> str:
        """The output of a pod's containers (all restarts; docker logs or the process log file)."""
        names = [container] if container else self._container_names(namespace, pod)
        parts = []
        for name in names:
            path = self._log_file(namespace, pod, name)
            text = ""
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as handle:
                    text = handle.read()
            handle_ = self._handle(namespace, pod, name)
            if handle_ is not None:
                text += handle_.logs()
            if not markers:
                text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("--- "))
            parts.append(text if container else f"==> {namespace}/{pod} [{name}] <==\n{text}")
        return "".join(parts) if container else "\n".join(parts)

    def pod_ip(self, namespace: str, pod: str) -> str | None:
        with self._lock:
            for worker in self._workers.values():
                if worker.namespace == namespace and worker.pod_name == pod:
                    return worker.ip
        return None

    def errors(self) -> list[str]:
        """Internal failures of the stand-in (worker crashes); a test may assert this is empty."""
        return list(self._errors)

    # ---- internals: bookkeeping ----
    def _error(self, message: str) -> None:
        self._errors.append(message)

    def _allocate_ip(self) -> str:
        with self._lock:
            n = self._ip_counter
            self._ip_counter += 1
            if self._ip_counter % 256 == 255:
                self._ip_counter += 2  # skip x.x.x.255 and x.x.x.0
        return f"127.{self._ip_octet}.{n // 256}.{n % 256}"

    def _claim_ip_block(self) -> None:
        """Pod IPs 127.0.0.10, .11, ... for the first session on this machine; a concurrent session (another
        pytest run) takes 127.101.0.10, ..., the next 127.102.0.10, ...: a flock held for the session decides."""
        for k in range(16):
            handle = open(os.path.join(tempfile.gettempdir(), f"elastream-e2e-pod-ips-{k}.lock"), "a+")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            self._ip_lock = handle
            self._ip_octet = 0 if k == 0 else 100 + k
            return
        raise RuntimeError("all 16 pod IP blocks are held by running e2e sessions")

    def _log_file(self, namespace: str, pod: str, container: str) -> str:
        return os.path.join(self.workdir, "logs", f"{namespace}_{pod}_{container}.log")

    def _container_names(self, namespace: str, pod: str) -> list[str]:
        obj = self._pods.get(f"{namespace}/{pod}")
        if obj is not None:
            spec = obj.get("spec") or {}
            return [c["name"] for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])]
        prefix = f"{namespace}_{pod}_"
        return sorted(
            f[len(prefix) : -4] for f in os.listdir(os.path.join(self.workdir, "logs")) if f.startswith(prefix)
        )

    def _handle(self, namespace: str, pod: str, container: str) -> _Handle | None:
        with self._lock:
            for worker in self._workers.values():
                if worker.namespace == namespace and worker.pod_name == pod:
                    for c in worker.init_containers + worker.containers:
                        if c.name == container and c.handle is not None:
                            return c.handle
        return None

    def _pod_finished(self, worker: _PodWorker) -> None:
        with self._lock:
            self._workers.pop(worker.uid, None)
            self._done_uids.add(worker.uid)
        self._hosts_dirty.set()

    def _event(self, pod: dict[str, Any], etype: str, reason: str, message: str,
               component: str = "kubelet", kind: str = "Pod") -> None:  # fmt: skip
        """An event about `pod` (or another namespaced core object of `kind`, e.g. a PersistentVolumeClaim)."""
        meta = pod["metadata"]
        now = micro_time()
        host = (pod.get("spec") or {}).get("nodeName") or self.node_names[0]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": kind, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": reason,
            "message": message[:1024],
            "type": etype,
            "source": {"component": component, "host": host},
            "reportingComponent": component,
            "reportingInstance": host,
            "firstTimestamp": rfc3339(),
            "lastTimestamp": rfc3339(),
            "eventTime": now,
            "action": reason,
            "count": 1,
        }  # fmt: skip
        log.info("event %s/%s %s %s: %s", meta["namespace"], meta["name"], etype, reason, message[:300])
        try:
            assert self.api is not None
            self.api.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body)
        except ApiException as exc:
            log.debug("event not recorded: %s", exc.status)
        except Exception as exc:  # the API server away: the event is lost, the pod's worker goes on
            log.debug("event not recorded: %s", exc)

    # ---- nodes ----
    def _register_nodes(self) -> None:
        for spec in self.nodes:
            self._register_node(spec)

    def _node_status(self, spec: NodeSpec) -> dict[str, Any]:
        assert self._log_server is not None
        now = rfc3339()
        cond = lambda t, s, r, m: {  # noqa: E731
            "type": t,
            "status": s,
            "reason": r,
            "message": m,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        uname = os.uname()
        return {
            "capacity": spec.capacity(),
            "allocatable": spec.capacity(),
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", f"e2e kubelet stand-in is posting ready status ({self.mode})"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": spec.name},
            ],
            # one endpoint for every node: /containerLogs finds a pod by namespace and name
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self._log_server.port}},
            "nodeInfo": {
                "machineID": "e2e", "systemUUID": f"e2e-{spec.name}", "bootID": self.session,
                "kernelVersion": uname.release, "osImage": "elastream e2e kubelet stand-in",
                "containerRuntimeVersion": f"{self.mode}://{self.runtime.engine_version}",
                "kubeletVersion": self.kubelet_version, "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        }  # fmt: skip

    def _register_node(self, spec: NodeSpec) -> None:
        assert self.api is not None
        status = self._node_status(spec)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": spec.name, "labels": spec.node_labels(self.mode)},
            "spec": {"taints": [dict(t) for t in spec.taints]} if spec.taints else {},
            "status": status,  # Ready from the start, as a kubelet registers: no window with a not-ready taint
        }
        try:
            node = self.api.request("POST", "/api/v1/nodes", body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            node = self.api.patch(f"/api/v1/nodes/{spec.name}", {"metadata": body["metadata"], "spec": body["spec"]})
        self.node_uids[spec.name] = node["metadata"]["uid"]
        self.api.patch(f"/api/v1/nodes/{spec.name}/status", {"status": status})
        self._renew_lease(spec.name)

    def _keep_node_ready(self, name: str) -> None:
        """The Node's status posted again when it does not say Ready: the node lifecycle controller sets Ready to
        Unknown (and taints the Node unreachable) when the Lease went stale, as it does after the API server was
        away for longer than the grace period; a kubelet's periodic node status sync puts Ready back."""
        assert self.api is not None
        node = self.api.get(f"/api/v1/nodes/{name}")
        ready = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
        if ready and ready[0].get("status") == "True":
            return
        self.api.patch(f"/api/v1/nodes/{name}/status", {"status": self._node_status(self._node_specs[name])})
        log.info("node %s: Ready was %s; posted Ready again", name, ready[0].get("status") if ready else "missing")

    def _renew_lease(self, name: str) -> None:
        assert self.api is not None
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        try:
            self.api.patch(path, {"spec": {"renewTime": micro_time(), "holderIdentity": name}}, "merge")
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.api.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self.node_uids[name]}]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_time()},
            })  # fmt: skip

    def _housekeeping(self) -> None:
        next_lease = time.monotonic() + 10
        while not self._stopping.is_set():
            if self._hosts_dirty.wait(timeout=1):
                self._hosts_dirty.clear()
                try:
                    self._update_hosts()
                except Exception:
                    log.error("hosts update failed:\n%s", traceback.format_exc())
            if time.monotonic() >= next_lease:
                next_lease = time.monotonic() + 10
                for name in self.node_names:
                    try:
                        self._renew_lease(name)
                        self._keep_node_ready(name)
                    except Exception as exc:
                        if not self._stopping.is_set():
                            log.warning("lease renewal or node status of %s failed: %s", name, exc)

    # ---- watches ----
    def _watch(self, list_fn: Callable[..., Any], on_sync: Callable[[list[dict[str, Any]]], None],
               on_event: Callable[[str, dict[str, Any]], None]) -> None:  # fmt: skip
        assert self.api is not None
        api_client = self.api.new_client()
        core = k8s_client.CoreV1Api(api_client)
        fn = getattr(core, list_fn.__name__)
        rv = ""
        while not self._stopping.is_set():
            try:
                if not rv:
                    resp = fn(_preload_content=False, _request_timeout=60)
                    data = json.loads(resp.data)
                    rv = data["metadata"]["resourceVersion"]
                    on_sync(data.get("items") or [])
                w = k8s_watch.Watch()
                self._watches.append(w)
                for event in w.stream(fn, resource_version=rv, timeout_seconds=30, allow_watch_bookmarks=True,
                                      deserialize=False):  # fmt: skip
                    if self._stopping.is_set():
                        break
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        on_event(event["type"], obj)
                self._watches.remove(w)
            except ApiException as exc:
                if exc.status == 410:
                    rv = ""  # expired: list again
                    continue
                if not self._stopping.is_set():
                    log.warning("watch %s: %s %s", list_fn.__name__, exc.status, exc.reason)
                    time.sleep(1)
            except Exception as exc:
                # The client raises KeyError('raw_object') on a watch's ERROR event when deserialize=False (a
                # 410 Gone after kube-apiserver restarted: our resourceVersion is older than its watch cache).
                # Watching again from the same version fails the same way forever, so anything unexpected
                # lists afresh: the sync handlers make a re-list idempotent.
                rv = ""
                if not self._stopping.is_set():
                    log.warning("watch %s: %r; listing afresh", list_fn.__name__, exc)
                    time.sleep(1)
        api_client.close()

    def _watch_pods(self) -> None:
        self._watch(k8s_client.CoreV1Api.list_pod_for_all_namespaces, self._sync_pods, self._on_pod)

    def _watch_services(self) -> None:
        self._watch(k8s_client.CoreV1Api.list_service_for_all_namespaces, self._sync_services, self._on_service)

    def _watch_claims(self) -> None:
        assert self.provisioner is not None
        self._watch(k8s_client.CoreV1Api.list_persistent_volume_claim_for_all_namespaces,
                    self.provisioner.sync_claims, self.provisioner.on_claim)  # fmt: skip

    def _watch_volumes(self) -> None:
        assert self.provisioner is not None
        self._watch(k8s_client.CoreV1Api.list_persistent_volume, self.provisioner.sync_volumes,
                    self.provisioner.on_volume)  # fmt: skip

    def _sync_pods(self, items: list[dict[str, Any]]) -> None:
        seen = set()
        for pod in items:
            seen.add(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
            self._on_pod("ADDED", pod)
        for key in list(self._pods):
            if key not in seen:
                self._on_pod("DELETED", self._pods[key])

    def _sync_services(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._services = {f"{s['metadata']['namespace']}/{s['metadata']['name']}": s for s in items}
        self._reconcile_forwarders()

    def _on_service(self, etype: str, svc: dict[str, Any]) -> None:
        key = f"{svc['metadata']['namespace']}/{svc['metadata']['name']}"
        with self._lock:
            if etype == "DELETED":
                self._services.pop(key, None)
            else:
                self._services[key] = svc
        self._reconcile_forwarders()

    def _on_pod(self, etype: str, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        with self._lock:
            old = self._pods.get(key)
            if etype == "DELETED":
                self._pods.pop(key, None)
            else:
                self._pods[key] = pod
        if old is None or etype == "DELETED" or pod_is_ready(old) != pod_is_ready(pod):
            self._hosts_dirty.set()  # headless Services' names follow ready pods
        if etype == "DELETED":
            with self._lock:
                worker = self._workers.get(meta["uid"])
            if worker is not None:
                worker.removed()
            return
        if spec.get("nodeName") not in self._node_specs:
            return  # not scheduled yet (kube-scheduler binds it), or bound to a Node that is not ours
        with self._lock:
            if meta["uid"] in self._done_uids:
                return  # a late event for a pod this stand-in already ran and deleted
            worker = self._workers.get(meta["uid"])
            if worker is None:
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed") and not meta.get("deletionTimestamp"):
                    return  # finished before this stand-in started: nothing to run
                worker = _PodWorker(self, pod)
                self._workers[meta["uid"]] = worker
                worker.start()
                return
        worker.update(pod)

    # ---- services ----
    def _reconcile_forwarders(self) -> None:
        wanted: dict[tuple[str, str, int], tuple[str, str, dict[str, Any]]] = {}
        with self._lock:
            services = list(self._services.values())
        for svc in services:
            meta, spec = svc["metadata"], svc.get("spec") or {}
            ip = spec.get("clusterIP")
            if not ip or ip == "None" or spec.get("type") == "ExternalName":
                continue
            for port in spec.get("ports") or []:
                if (port.get("protocol") or "TCP") != "TCP":
                    continue
                key = f"{meta['namespace']}/{meta['name']}"
                wanted[(key, ip, int(port["port"]))] = (meta["namespace"], meta["name"], port)
                if port.get("nodePort"):
                    wanted[(key, "127.0.0.1", int(port["nodePort"]))] = (meta["namespace"], meta["name"], port)
        with self._lock:
            for fkey in list(self._forwarders):
                if fkey not in wanted or self._forwarders[fkey].port_spec != wanted[fkey][2]:
                    self._forwarders.pop(fkey).close()
            for fkey, (ns, name, port) in wanted.items():
                if fkey in self._forwarders or self._stopping.is_set():
                    continue
                try:
                    fwd = _Forwarder(self, ns, name, fkey[1], fkey[2], port)
                except OSError as exc:
                    log.warning("service %s/%s: cannot listen on %s:%s: %s", ns, name, fkey[1], fkey[2], exc)
                    continue
                self._forwarders[fkey] = fwd
                fwd.start()
                log.info("service %s/%s: forwarding %s:%s", ns, name, fkey[1], fkey[2])
        self._hosts_dirty.set()

    def _pick_endpoint(self, namespace: str, service: str, port_spec: dict[str, Any]) -> tuple[str, int] | None:
        with self._lock:
            svc = self._services.get(f"{namespace}/{service}")
            pods = list(self._pods.values())
        if svc is None:
            return None
        if namespace == "default" and service == "kubernetes":
            return ("127.0.0.1", self.api_port)  # the API server (its Endpoints cannot hold a loopback address)
        spec = svc.get("spec") or {}
        selector = spec.get("selector")
        publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
        target = port_spec.get("targetPort", port_spec["port"])
        candidates: list[tuple[str, int]] = []
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            meta, status = pod["metadata"], pod.get("status") or {}
            if meta["namespace"] != namespace or meta.get("deletionTimestamp"):
                continue
            if not selector_matches(selector, meta.get("labels")) or not status.get("podIP"):
                continue
            if not (publish_not_ready or (status.get("phase") == "Running" and pod_is_ready(pod))):
                continue
            port = _resolve_target_port(pod, target)
            if port is not None:
                candidates.append((status["podIP"], port))
        if not candidates:
            return None
        with self._lock:
            n = self._rr.get(f"{namespace}/{service}", 0)
            self._rr[f"{namespace}/{service}"] = n + 1
        return candidates[n % len(candidates)]

    def _service_env(self, namespace: str) -> dict[str, str]:
        """The docker-link style variables the kubelet gives for each Service of the namespace."""
        env: dict[str, str] = {}
        with self._lock:
            services = [s for s in self._services.values() if s["metadata"]["namespace"] == namespace]
        for svc in services:
            spec = svc.get("spec") or {}
            ip = spec.get("clusterIP")
            ports = [p for p in spec.get("ports") or [] if p.get("port")]
            if not ip or ip == "None" or not ports:
                continue
            name = env_name(svc["metadata"]["name"])
            first = ports[0]
            env[f"{name}_SERVICE_HOST"] = ip
            env[f"{name}_SERVICE_PORT"] = str(first["port"])
            env[f"{name}_PORT"] = f"{(first.get('protocol') or 'TCP').lower()}://{ip}:{first['port']}"
            for p in ports:
                proto = p.get("protocol") or "TCP"
                if p.get("name"):
                    env[f"{name}_SERVICE_PORT_{env_name(p['name'])}"] = str(p["port"])
                prefix = f"{name}_PORT_{p['port']}_{proto}"
                env[prefix] = f"{proto.lower()}://{ip}:{p['port']}"
                env[f"{prefix}_PROTO"] = proto.lower()
                env[f"{prefix}_PORT"] = str(p["port"])
                env[f"{prefix}_ADDR"] = ip
        return env

    # ---- names: hosts files ----
    def _service_host_lines(self, namespace: str | None) -> list[str]:
        """hosts lines for every Service; short names for `namespace` only (None: names unique cluster-wide)."""
        with self._lock:
            services = list(self._services.values())
            pods = list(self._pods.values())
        counts: dict[str, int] = {}
        for svc in services:
            counts[svc["metadata"]["name"]] = counts.get(svc["metadata"]["name"], 0) + 1
        lines = []
        for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
            meta, spec = svc["metadata"], svc.get("spec") or {}
            ns, name = meta["namespace"], meta["name"]
            names = [f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}.svc", f"{name}.{ns}"]
            short = ns == namespace if namespace is not None else counts[name] == 1
            if short:
                names.append(name)
            ip = spec.get("clusterIP")
            if ip and ip != "None":
                lines.append(f"{ip} {' '.join(names)}")
            elif ip == "None":  # headless: the ready pods themselves
                for pod in pods:
                    pmeta, status = pod["metadata"], pod.get("status") or {}
                    if pmeta["namespace"] != ns or not selector_matches(spec.get("selector"), pmeta.get("labels")):
                        continue
                    if not status.get("podIP") or not (pod_is_ready(pod) or spec.get("publishNotReadyAddresses")):
                        continue
                    lines.append(f"{status['podIP']} {' '.join(names)}")
                    hostname = (pod.get("spec") or {}).get("hostname") or pmeta["name"]
                    if (pod.get("spec") or {}).get("subdomain") == name:
                        lines.append(
                            f"{status['podIP']} {hostname}.{name}.{ns}.svc.cluster.local {hostname}.{name}.{ns}.svc"
                        )
        return lines

    def _write_pod_hosts(self, worker: _PodWorker) -> None:
        base = [ln for ln in _read_etc_hosts() if HOSTS_MARK not in ln]
        lines = [*base, f"{worker.ip} {worker.pod_name}", *self._service_host_lines(worker.namespace)]
        text = "\n".join(lines) + "\n"
        try:
            with open(worker.hosts_file, encoding="utf-8") as handle:
                if handle.read() == text:
                    return
        except OSError:
            pass
        # in place (same inode): the file is bind-mounted into running containers
        with open(worker.hosts_file, "a+", encoding="utf-8") as handle:
            handle.seek(0)
            handle.truncate()
            handle.write(text)

    def _update_hosts(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            if worker.prepared:
                self._write_pod_hosts(worker)
        if self.mode == "process":
            self._set_etc_hosts(self._service_host_lines(None))

    def _set_etc_hosts(self, lines: list[str]) -> None:
        mark = f"{HOSTS_MARK} {self.session}"
        if lines == self._etc_hosts_lines:
            return
        try:
            current = _read_etc_hosts()
            kept = [ln for ln in current if not ln.endswith(mark)]
            text = "\n".join(kept + [f"{ln} {mark}" for ln in lines]) + "\n"
            with open("/etc/hosts", "r+", encoding="utf-8") as handle:
                handle.seek(0)
                handle.truncate()
                handle.write(text)
            self._etc_hosts_lines = lines
        except OSError as exc:
            log.warning("cannot update /etc/hosts: %s", exc)

    def _cleanup_stale_hosts(self) -> None:
        """Lines of earlier sessions whose test process is gone."""
        current = _read_etc_hosts()
        kept = []
        for line in current:
            m = re.search(re.escape(HOSTS_MARK) + r" (\d+)-\w+$", line)
            if m and not _pid_alive(int(m.group(1))):
                continue
            kept.append(line)
        if kept != current:
            with contextlib.suppress(OSError), open("/etc/hosts", "r+", encoding="utf-8") as handle:
                handle.seek(0)
                handle.truncate()
                handle.write("\n".join(kept) + "\n")


def _resolve_target_port(pod: dict[str, Any], target: Any) -> int | None:
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target:
                return int(p["containerPort"])
    return None


def _read_etc_hosts() -> list[str]:
    try:
        with open("/etc/hosts", encoding="utf-8") as handle:
            return handle.read().splitlines()
    except OSError:
        return ["127.0.0.1 localhost"]


def nested_mountpoints(pod: dict[str, Any], volume: str) -> list[str]:
    """The kubelet's getNestedMountpoints: the mount paths of other volumes directly beneath where `volume` is
    mounted in any of the pod's containers, relative to that place (one level: /dir/a, not /dir/a/b as well)."""
    found: list[str] = []
    spec = pod["spec"]
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        mounts = [(m["name"], os.path.normpath(m["mountPath"])) for m in container.get("volumeMounts") or []]
        every = sorted(path for _, path in mounts)
        for name, mine in mounts:
            if name != volume:
                continue
            seen: list[str] = []
            for path in every:
                if not path.startswith(mine + "/") or any(path.startswith(prev) for prev in seen):
                    continue
                seen.append(path + "/")
                found.append(path[len(mine) + 1 :])
    return found
