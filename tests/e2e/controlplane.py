"""A real Kubernetes control plane for the e2e tier: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler.

The binaries come from `scripts/k8s-tools.sh` (built from Go modules, cached under ~/.cache/elastream/tools).
Everything listens on 127.0.0.1 on free ports; every file (data, certificates, tokens, kubeconfigs, logs) lives
in `workdir`, so two runs never collide and a failed run leaves its logs behind for reading.

    with ControlPlane(bin_dir, workdir) as cp:
        subprocess.run([f"{bin_dir}/kubectl", "--kubeconfig", cp.kubeconfig, "get", "ns"])

kube-scheduler is the real one with its default profile (resources, node selectors and affinity, pod
(anti-)affinity, topology spread, taints): it binds the pods to the Nodes the kubelet stand-in registers.

The Service range is 127.96.0.0/16 (loopback, on purpose: nothing of ours may send traffic to a private range,
and there is no kube-proxy; the kubelet stand-in forwards ClusterIP:port to pods, see kubelet.py).

kube-apiserver keeps an audit log (JSON lines, `AUDIT_POLICY`: level Metadata for the elastream.dev group, pods
and their subresources, events, configmaps, secrets and leases) in `<workdir>/audit/audit.log`, so tests and
benchmarks can count the API requests something made:

    cp.audit_count(verb="patch", resource="streamtopologies", subresource="status", namespace=ns, name="demo",
                   since=t0)
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from support.harness import log_tail
from support.ports import free_port

SERVICE_CIDR = "127.96.0.0/16"
KCM_CONTROLLERS = "*"  # every default-enabled controller; the cloud ones skip themselves without a cloud
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")

#: kube-apiserver's audit policy: one event per request (ResponseComplete; the RequestReceived and ResponseStarted
#: stages are left out) at level Metadata (who, what, when, the response code; never a request or response body)
#: for what elastream and its tests read and write. First match wins: the nodes' and the API server's own Lease
#: renewals (every 10 s, all session long) are left out, and everything else too.
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
         "namespaces": ["kube-node-lease", "kube-system"]},
        {"level": "Metadata", "resources": [
            {"group": "elastream.dev"},  # every resource and subresource (status, scale) of the group
            {"group": "", "resources": ["pods", "pods/*", "events", "configmaps", "secrets"]},
            {"group": "events.k8s.io", "resources": ["events"]},
            {"group": "coordination.k8s.io", "resources": ["leases"]},  # e.g. the operator's leader election
        ]},
        {"level": "None"},
    ],
}  # fmt: skip
AUDIT_LOG_MAX_MB = 200  # then kube-apiserver rotates it (audit-<time>.log beside it); the counts read them all
AUDIT_LOG_BACKUPS = 20


@dataclass(frozen=True)
class AuditEvent:
    """One API request in kube-apiserver's audit log (its ResponseComplete event)."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    group: str  # "" for the core group
    resource: str  # e.g. "pods", "streamtopologies"
    subresource: str  # e.g. "status", "scale", "log"; "" for the resource itself
    namespace: str
    name: str
    user: str  # e.g. "admin", "system:kube-scheduler", "system:serviceaccount:NS:SA"
    code: int  # the response code (0 when the request did not complete, e.g. a panic)
    received: float  # requestReceivedTimestamp in seconds since the epoch (comparable to time.time())
    uri: str
    user_agent: str

    @classmethod
    def from_json(cls, event: dict[str, Any]) -> AuditEvent:
        ref = event.get("objectRef") or {}
        return cls(
            verb=str(event.get("verb", "")),
            group=str(ref.get("apiGroup", "")),
            resource=str(ref.get("resource", "")),
            subresource=str(ref.get("subresource", "")),
            namespace=str(ref.get("namespace", "")),
            name=str(ref.get("name", "")),
            user=str((event.get("user") or {}).get("username", "")),
            code=int((event.get("responseStatus") or {}).get("code", 0)),
            received=datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp(),
            uri=str(event.get("requestURI", "")),
            user_agent=str(event.get("userAgent", "")),
        )


def _as_epoch(value: float | datetime | None) -> float | None:
    return value.timestamp() if isinstance(value, datetime) else value


def _matches(value: str, wanted: str | Collection[str] | None) -> bool:
    if wanted is None:
        return True
    return value == wanted if isinstance(wanted, str) else value in wanted


class _AuditReader:
    """Reads kube-apiserver's audit log incrementally: the current file and the backups it rotated to (followed by
    inode, so a file renamed by the rotation is read on from where it was left). Only whole lines are taken."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.events: list[AuditEvent] = []
        self._offsets: dict[int, int] = {}  # inode -> bytes consumed
        self._lock = threading.Lock()

    def read(self) -> list[AuditEvent]:
        with self._lock:
            stem, ext = os.path.splitext(self.path)
            backups = sorted(glob.glob(f"{glob.escape(stem)}-*{ext}"))  # audit-2006-01-02T15-04-05.000.log
            for path in [*backups, self.path]:
                try:
                    with open(path, "rb") as handle:
                        inode = os.fstat(handle.fileno()).st_ino
                        handle.seek(self._offsets.get(inode, 0))
                        data = handle.read()
                except FileNotFoundError:
                    continue  # rotated away between the listing and the open: the next read finds it
                end = data.rfind(b"\n") + 1
                if not end:
                    continue
                self._offsets[inode] = self._offsets.get(inode, 0) + end
                for line in data[:end].splitlines():
                    if line.strip():
                        event = json.loads(line)
                        if event.get("stage") in ("ResponseComplete", "Panic"):
                            self.events.append(AuditEvent.from_json(event))
            return list(self.events)


class ControlPlaneError(RuntimeError):
    pass


def _unverified_tls() -> ssl.SSLContext:
    """A TLS context that trusts any certificate: for readiness probes of servers whose serving certificate
    is not known (or not written) yet."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass
class _Proc:
    name: str
    argv: list[str]
    log: str
    popen: subprocess.Popen[bytes] | None = None
    log_handle: Any = field(default=None, repr=False)

    def start(self, env: dict[str, str] | None = None) -> None:
        self.log_handle = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.log_handle.write(f"$ {' '.join(self.argv)}\n".encode())
        self.log_handle.flush()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log_handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C of pytest does not hit it before stop() runs
        )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self.popen = None
        if self.log_handle is not None:
            self.log_handle.close()
            self.log_handle = None


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback, started from `bin_dir`."""

    def __init__(self, bin_dir: str, workdir: str, *, extra_users: Iterable[tuple[str, str]] = ()) -> None:
        """`extra_users`: (user, comma-separated groups) pairs that get a static token (see `tokens`)."""
        self.bin_dir = bin_dir
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.admin_token = secrets.token_hex(16)
        self.kcm_token = secrets.token_hex(16)
        self.scheduler_token = secrets.token_hex(16)
        self.tokens: dict[str, str] = {"admin": self.admin_token}
        self._token_lines = [
            f"{self.admin_token},admin,uid-admin,system:masters",
            # the controller manager's own identity; with --use-service-account-credentials=false every
            # controller runs as it, so it needs all rights (what system:masters gives)
            f"{self.kcm_token},system:kube-controller-manager,uid-kcm,system:masters",
            # the scheduler's own identity, no group: the bootstrap RBAC binds the user system:kube-scheduler to
            # the ClusterRoles system:kube-scheduler and system:volume-scheduler (and lets it read
            # kube-system/extension-apiserver-authentication), exactly what a real cluster gives it
            f"{self.scheduler_token},system:kube-scheduler,uid-kube-scheduler",
        ]
        for user, groups in extra_users:
            token = secrets.token_hex(16)
            self.tokens[user] = token
            self._token_lines.append(f'{token},{user},uid-{user},"{groups}"')
        self.etcd_port = 0
        self.port = 0
        self.kcm_port = 0
        self.scheduler_port = 0
        self.server = ""
        self.ca_file = os.path.join(self.workdir, "ca.crt")
        self.cert_dir = os.path.join(self.workdir, "apiserver-certs")
        self.sa_key = os.path.join(self.workdir, "sa.key")
        self.kubeconfig = os.path.join(self.workdir, "admin.kubeconfig")
        self.audit_policy = os.path.join(self.workdir, "audit-policy.yaml")
        self.audit_log = os.path.join(self.workdir, "audit", "audit.log")
        self._audit = _AuditReader(self.audit_log)
        self.version: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self._procs: list[_Proc] = []

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        t0 = time.monotonic()
        self._check_binaries()
        try:
            self._prepare_files()
            self._start_etcd()
            self.timings["etcd"] = time.monotonic() - t0
            t1 = time.monotonic()
            self._start_apiserver()
            self.timings["kube-apiserver"] = time.monotonic() - t1
            t2 = time.monotonic()
            self._start_controller_manager()
            self.timings["kube-controller-manager"] = time.monotonic() - t2
            t3 = time.monotonic()
            self._start_scheduler()
            self.timings["kube-scheduler"] = time.monotonic() - t3
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0

    def stop(self) -> None:
        for proc in reversed(self._procs):
            proc.stop()
        self._procs.clear()

    def alive(self) -> dict[str, bool]:
        return {proc.name: proc.alive() for proc in self._procs}

    def apiserver_outage(self, seconds: float) -> None:
        """kube-apiserver stopped for `seconds`, then started again on the same port with the same
        certificates (etcd keeps every object): clients see connections refused meanwhile."""
        proc = next(p for p in self._procs if p.name == "kube-apiserver")
        proc.stop()
        time.sleep(seconds)
        proc.start()
        self._await_readyz(proc, lambda: self._get("/readyz", _unverified_tls()), 90, 2000)

    def logs(self) -> dict[str, str]:
        """name -> log file of each process."""
        return {proc.name: proc.log for proc in self._procs}

    # ---- the audit log ---------------------------------------------------------------------------------------
    def audit_events(
        self,
        *,
        verb: str | Collection[str] | None = None,
        resource: str | Collection[str] | None = None,
        subresource: str | Collection[str] | None = None,
        namespace: str | Collection[str] | None = None,
        name: str | Collection[str] | None = None,
        group: str | Collection[str] | None = None,
        user: str | Collection[str] | None = None,
        since: float | datetime | None = None,
        until: float | datetime | None = None,
    ) -> list[AuditEvent]:
        """The requests in kube-apiserver's audit log (see `AUDIT_POLICY` for which are kept), in the order they
        completed. Each filter left at None matches anything; a string must be equal, a collection contain the
        value. `subresource=""` is the resource itself (no subresource); `resource="pods/status"` is short for
        `resource="pods", subresource="status"`. `since` (inclusive) and `until` (exclusive) bound when the
        request was received, as seconds since the epoch (`time.time()`) or a datetime.

        The log is written in blocking mode: a request's event is on disk before its response completes, so a
        request that has returned is already counted."""
        if isinstance(resource, str) and "/" in resource:
            resource, subresource = resource.split("/", 1)
        start, end = _as_epoch(since), _as_epoch(until)
        return [
            e for e in self._audit.read()
            if _matches(e.verb, verb) and _matches(e.resource, resource) and _matches(e.subresource, subresource)
            and _matches(e.namespace, namespace) and _matches(e.name, name) and _matches(e.group, group)
            and _matches(e.user, user) and (start is None or e.received >= start) and (end is None or e.received < end)
        ]  # fmt: skip

    def audit_count(self, **filters: Any) -> int:
        """How many requests match; the filters of `audit_events`, e.g.
        `audit_count(verb="patch", resource="streamtopologies", subresource="status", name="demo", since=t0)`."""
        return len(self.audit_events(**filters))

    # ---- pieces ----------------------------------------------------------------------------------------------
    def _bin(self, name: str) -> str:
        path = os.path.join(self.bin_dir, name)
        if not os.access(path, os.X_OK):
            raise ControlPlaneError(f"{path} is missing: run `bash scripts/k8s-tools.sh`")
        return path

    def _check_binaries(self) -> None:
        """All four, before anything starts: a tool cache built before the tier had a scheduler lacks one."""
        missing = [name for name in BINARIES if not os.access(os.path.join(self.bin_dir, name), os.X_OK)]
        if missing == ["kube-scheduler"]:
            raise ControlPlaneError(
                f"{os.path.join(self.bin_dir, 'kube-scheduler')} is missing: this tool cache was built before the "
                "e2e tier had a scheduler. Re-run `bash scripts/k8s-tools.sh`; it builds only what is missing "
                "(kube-scheduler: a few minutes with the warm build cache)"
            )
        if missing:
            raise ControlPlaneError(
                f"missing from {self.bin_dir}: {', '.join(missing)}: run `bash scripts/k8s-tools.sh` (it builds only "
                "what is missing)"
            )

    def _prepare_files(self) -> None:
        os.makedirs(self.cert_dir, exist_ok=True)
        if not os.path.exists(self.sa_key):
            out = subprocess.run(
                ["openssl", "genrsa", "-out", self.sa_key, "2048"], capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise ControlPlaneError(f"openssl genrsa failed: {out.stderr}")
            os.chmod(self.sa_key, 0o600)
        tokens = os.path.join(self.workdir, "tokens.csv")
        with open(tokens, "w", encoding="utf-8") as handle:
            handle.write("\n".join(self._token_lines) + "\n")
        os.chmod(tokens, 0o600)
        os.makedirs(os.path.dirname(self.audit_log), exist_ok=True)
        with open(self.audit_policy, "w", encoding="utf-8") as handle:
            json.dump(AUDIT_POLICY, handle, indent=2)  # JSON is YAML

    def _spawn(self, name: str, argv: list[str]) -> _Proc:
        proc = _Proc(name, argv, os.path.join(self.workdir, f"{name}.log"))
        proc.start()
        self._procs.append(proc)
        return proc

    def _fail(self, proc: _Proc, what: str) -> ControlPlaneError:
        code = proc.popen.poll() if proc.popen is not None else None
        state = f"exited with {code}" if code is not None else "still running"
        return ControlPlaneError(f"{proc.name} {what} ({state}); last lines of {proc.log}:\n{log_tail(proc.log)}")

    def _start_etcd(self) -> None:
        for _attempt in range(3):  # a free port can be taken between the probe and etcd's bind
            self.etcd_port, peer = free_port(), free_port()
            client = f"http://127.0.0.1:{self.etcd_port}"
            peer_url = f"http://127.0.0.1:{peer}"
            proc = self._spawn(
                "etcd",
                [
                    self._bin("etcd"),
                    "--name", "e2e",
                    "--data-dir", os.path.join(self.workdir, "etcd-data"),
                    "--listen-client-urls", client,
                    "--advertise-client-urls", client,
                    "--listen-peer-urls", peer_url,
                    "--initial-advertise-peer-urls", peer_url,
                    "--initial-cluster", f"e2e={peer_url}",
                    "--unsafe-no-fsync",  # a throw-away test store: no fsync wait on every write
                    "--log-level", "warn",
                ],
            )  # fmt: skip
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.alive():
                try:
                    with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                        if json.loads(resp.read()).get("health") == "true":
                            return
                except (OSError, ValueError):
                    pass
                time.sleep(0.1)
            if proc.alive():
                raise self._fail(proc, "did not become healthy within 30 s")
            if "address already in use" not in log_tail(proc.log, 20):
                raise self._fail(proc, "failed to start")
            self._procs.remove(proc)
            proc.stop()
        raise ControlPlaneError("etcd: no free ports after 3 attempts")

    def _start_apiserver(self) -> None:
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        proc = self._spawn(
            "kube-apiserver",
            [
                self._bin("kube-apiserver"),
                "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
                "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1",
                "--secure-port", str(self.port),
                "--cert-dir", self.cert_dir,
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", self.sa_key,
                "--service-account-signing-key-file", self.sa_key,
                "--token-auth-file", os.path.join(self.workdir, "tokens.csv"),
                "--authorization-mode", "Node,RBAC",
                "--service-cluster-ip-range", SERVICE_CIDR,
                "--service-node-port-range", "30000-32767",
                # the kubelet stand-in serves /containerLogs on the node's InternalIP (127.0.0.1)
                "--kubelet-preferred-address-types", "InternalIP",
                # the audit log: one JSON line per request of AUDIT_POLICY, written before the response completes
                "--audit-policy-file", self.audit_policy,
                "--audit-log-path", self.audit_log,
                "--audit-log-format", "json",
                "--audit-log-mode", "blocking",
                "--audit-log-maxsize", str(AUDIT_LOG_MAX_MB),
                "--audit-log-maxbackup", str(AUDIT_LOG_BACKUPS),
                "--audit-log-maxage", "0",
                "--profiling=false",
                "--v", "1",
            ],
        )  # fmt: skip
        # the serving cert does not exist before the server writes it: readiness is asked without verifying
        self._await_readyz(proc, lambda: self._get("/readyz", _unverified_tls()), 90, 2000)
        self._write_ca()
        self.version = json.loads(self._get("/version"))
        self._write_kubeconfig(self.kubeconfig, self.admin_token, "admin")

    def _write_ca(self) -> None:
        """The self-signed serving certificate file holds the leaf then its CA; in-cluster clients need the CA."""
        bundle = os.path.join(self.cert_dir, "apiserver.crt")
        with open(bundle, encoding="ascii") as handle:
            pem = handle.read()
        blocks = [f"-----BEGIN CERTIFICATE-----{b.split('-----END CERTIFICATE-----')[0]}-----END CERTIFICATE-----\n"
                  for b in pem.split("-----BEGIN CERTIFICATE-----")[1:]]  # fmt: skip
        if len(blocks) < 2:
            raise ControlPlaneError(f"{bundle}: expected a serving certificate and its CA, found {len(blocks)}")
        with open(self.ca_file, "w", encoding="ascii") as handle:
            handle.write(blocks[-1])
        sans = subprocess.run(
            ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", bundle],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        if "IP Address:127.0.0.1" not in sans:
            raise ControlPlaneError(f"{bundle}: 127.0.0.1 is not among the serving certificate's SANs: {sans}")
        self.serving_sans = [s.strip() for s in sans.splitlines()[-1].split(",")]
        check = subprocess.run(
            ["openssl", "verify", "-CAfile", self.ca_file, bundle], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            raise ControlPlaneError(f"{bundle} does not verify against {self.ca_file}: {check.stdout}{check.stderr}")

    def _await_readyz(self, proc: _Proc, fetch: Callable[[], bytes], timeout_s: float, tail: int) -> None:
        """Poll `fetch` (a GET of /readyz) until it answers "ok"; fail with the process's log when it exits or
        `timeout_s` passes, quoting the last `tail` characters it answered."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if not proc.alive():
                raise self._fail(proc, "failed to start")
            try:
                last = fetch().decode(errors="replace")
                if last.strip() == "ok":
                    return
            except urllib.error.HTTPError as exc:
                last = exc.read().decode(errors="replace")
            except OSError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise self._fail(proc, f"was not ready within {timeout_s:.0f} s (last /readyz: {last[-tail:]})")

    def _get(self, path: str, ctx: ssl.SSLContext | None = None, token: str | None = None) -> bytes:
        if ctx is None:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {token or self.admin_token}"}
        )
        with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
            return bytes(resp.read())

    def _write_kubeconfig(self, path: str, token: str, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {"server": self.server, "certificate-authority": self.ca_file}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)  # JSON is YAML: kubectl, helm and client libraries read it
        os.chmod(path, 0o600)

    def kubeconfig_for_token(self, token: str, name: str | None = None) -> str:
        """A kubeconfig file (in workdir) that authenticates with `token`, e.g. one from `kubectl create token`."""
        name = name or f"token-{secrets.token_hex(4)}"
        path = os.path.join(self.workdir, f"{name}.kubeconfig")
        self._write_kubeconfig(path, token, name)
        return path

    def _start_controller_manager(self) -> None:
        kubeconfig = os.path.join(self.workdir, "kube-controller-manager.kubeconfig")
        self._write_kubeconfig(kubeconfig, self.kcm_token, "system:kube-controller-manager")
        self.kcm_port = free_port()
        proc = self._spawn(
            "kube-controller-manager",
            [
                self._bin("kube-controller-manager"),
                "--kubeconfig", kubeconfig,
                "--bind-address", "127.0.0.1",
                "--secure-port", str(self.kcm_port),
                "--cert-dir", os.path.join(self.workdir, "kcm-certs"),
                "--leader-elect=false",
                "--controllers", KCM_CONTROLLERS,
                "--use-service-account-credentials=false",
                "--service-account-private-key-file", self.sa_key,
                "--root-ca-file", self.ca_file,
                "--service-cluster-ip-range", SERVICE_CIDR,
                "--cluster-name", "e2e",
                "--profiling=false",
                "--v", "1",
            ],
        )  # fmt: skip
        ctx = _unverified_tls()
        deadline = time.monotonic() + 60
        healthy = False
        while time.monotonic() < deadline:
            if not proc.alive():
                raise self._fail(proc, "failed to start")
            if not healthy:
                try:
                    with urllib.request.urlopen(f"https://127.0.0.1:{self.kcm_port}/healthz", context=ctx, timeout=2):
                        healthy = True
                except (OSError, urllib.error.HTTPError):
                    pass
            if healthy:
                # the serviceaccount and root-ca-cert-publisher controllers are running once these exist
                try:
                    self._get("/api/v1/namespaces/default/serviceaccounts/default")
                    self._get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
                    return
                except (OSError, urllib.error.HTTPError):
                    pass
            time.sleep(0.2)
        raise self._fail(proc, "did not get healthy (default ServiceAccount, kube-root-ca.crt) within 60 s")

    def _start_scheduler(self) -> None:
        kubeconfig = os.path.join(self.workdir, "kube-scheduler.kubeconfig")
        self._write_kubeconfig(kubeconfig, self.scheduler_token, "system:kube-scheduler")
        # a config file, not the deprecated --kubeconfig flag (ignored next to --config); the default profile and
        # back-off (1 s doubling to 10 s) of kube-scheduler, only the client is ours
        config = os.path.join(self.workdir, "kube-scheduler.yaml")
        with open(config, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": kubeconfig},
                    "leaderElection": {"leaderElect": False},  # one scheduler: no Lease to wait for
                },
                handle,
                indent=2,
            )
        self.scheduler_port = free_port()
        proc = self._spawn(
            "kube-scheduler",
            [
                self._bin("kube-scheduler"),
                "--config", config,
                "--leader-elect=false",
                "--bind-address", "127.0.0.1",
                "--secure-port", str(self.scheduler_port),
                "--cert-dir", os.path.join(self.workdir, "scheduler-certs"),
                "--profiling=false",
                "--v", "1",
            ],
        )  # fmt: skip
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate
        url = f"https://127.0.0.1:{self.scheduler_port}/readyz"

        def readyz() -> bytes:  # serving, and its informers have synced (the check sched-handler-sync)
            with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
                return bytes(resp.read())

        self._await_readyz(proc, readyz, 60, 1000)
