"""The e2e tier: a real Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager + kube-scheduler
built from Go modules by scripts/k8s-tools.sh), a kubelet stand-in that registers several Nodes (DEFAULT_NODES:
e2e-node-a/b/c, 4 CPU and 8Gi each, one zone each) and runs the pods the scheduler binds to them as Docker containers
(host network) or as local processes, all on this machine, and the real kubectl and helm. See docs/e2e.md.

Preparation happens once, after collection and outside any test's timeout, when e2e tests are selected:
`scripts/k8s-tools.sh` runs in the background (the tests that do not need helm start as soon as the five
control-plane binaries exist; the `helm` fixture waits for the script to finish), then `scripts/docker-setup.sh`
and `BASE_IMAGE=elastream-base:bookworm scripts/images.sh`. Docker mode is used when `docker info` works
afterwards; otherwise local processes. ELASTREAM_E2E_RUNTIME=docker|process forces one (docker then fails
loudly when it cannot work). Nothing here skips: a missing piece fails the tests with the output that explains it.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from support.paths import REPO

from .controlplane import ControlPlane, ControlPlaneError
from .kubelet import DEFAULT_NODES, KubeletStandIn, describe_nodes

E2E_DIR = os.path.dirname(os.path.abspath(__file__))
CORE_TOOLS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd")
TOOLS_WAIT_S = 60 * 60  # a cold build of everything takes 20-30 min on 2 cores
BASE_IMAGE = "elastream-base:bookworm"


# ---- preparation (once per session, outside test timeouts) -----------------------------------------------------
class _Tools:
    """`bash scripts/k8s-tools.sh` in the background: the bin dir is known as soon as the script names it."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.lines: list[str] = []  # stderr (progress) and stdout, interleaved as they came
        self.stdout: list[str] = []
        self.cache_dir = ""
        self.done = threading.Event()
        self.returncode: int | None = None
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["bash", os.path.join(REPO, "scripts", "k8s-tools.sh")],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_err, daemon=True).start()
        threading.Thread(target=self._read_out, daemon=True).start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.lines.append(line)
            m = re.search(r"(?:holds|cache dir|cached in) (/\S+?)(?:/\.lock)?(?:;|$)", line)
            if m and not self.cache_dir:
                self.cache_dir = m.group(1)
            if "[k8s-tools" in line:  # progress of a build: worth seeing, it can take half an hour
                self.write(f"e2e: {line}")

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))
            self.lines.append(line.rstrip("\n"))
        self.returncode = self.proc.wait()
        self.done.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines[-80:])

    def failed(self) -> bool:
        return self.done.is_set() and (self.returncode != 0 or not self.stdout)

    def bin_dir(self) -> str:
        if self.done.is_set() and self.returncode == 0 and self.stdout:
            return self.stdout[-1].strip()
        return os.path.join(self.cache_dir, "bin") if self.cache_dir else ""

    def core_ready(self) -> bool:
        bin_dir = self.bin_dir()
        return bool(bin_dir) and all(os.access(os.path.join(bin_dir, t), os.X_OK) for t in CORE_TOOLS)

    def wait_core(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.core_ready():
                return self.bin_dir()
            if self.failed():
                break
            self.done.wait(0.5)
        if self.core_ready():
            return self.bin_dir()
        raise RuntimeError(
            f"`bash scripts/k8s-tools.sh` did not provide {', '.join(CORE_TOOLS)} "
            f"(exit {self.returncode}, {time.monotonic() - self.started:.0f} s); its output:\n{self.output}"
        )

    def wait_all(self, timeout: float) -> str:
        self.done.wait(timeout)
        if not self.done.is_set():
            raise RuntimeError(f"`bash scripts/k8s-tools.sh` still running after {timeout:.0f} s:\n{self.output}")
        if self.failed():
            raise RuntimeError(f"`bash scripts/k8s-tools.sh` failed (exit {self.returncode}):\n{self.output}")
        return self.bin_dir()


class _Prep:
    """What the session's preparation found (one instance, PREP)."""

    def __init__(self) -> None:
        self.tools: _Tools | None = None
        self.bin_dir = ""
        self.tools_error = ""
        self.mode = ""
        self.mode_reason = ""
        self.docker_version = ""
        self.docker_error = ""
        self.images_error = ""
        self.k8s_version = ""
        self.timings: dict[str, float] = {}


PREP = _Prep()


def _terminal(config: pytest.Config) -> Callable[[str], None]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def write(line: str) -> None:
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(line)
        else:
            print(line, flush=True)

    return write


def _run_script(argv: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> tuple[int, str]:
    try:
        out = subprocess.run(
            argv, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        return 124, f"timed out after {timeout:.0f} s\n{exc.stdout or ''}{exc.stderr or ''}"
    return out.returncode, (out.stdout + out.stderr).strip()


def _docker_info() -> tuple[bool, str]:
    if shutil.which("docker") is None:
        return False, "no docker client on PATH"
    code, out = _run_script(["docker", "version", "--format", "{{.Server.Version}}"], timeout=60)
    if code != 0:
        return False, out.splitlines()[-1] if out else f"docker version exited {code}"
    code2, out2 = _run_script(["docker", "info"], timeout=60)
    if code2 != 0:
        return False, out2.splitlines()[-1] if out2 else f"docker info exited {code2}"
    return True, out.strip()


def _choose_runtime(write: Callable[[str], None]) -> None:
    forced = os.environ.get("ELASTREAM_E2E_RUNTIME", "").strip().lower()
    if forced not in ("", "docker", "process"):
        PREP.mode, PREP.docker_error = "docker", f"ELASTREAM_E2E_RUNTIME={forced!r}: expected docker or process"
        return
    if forced == "process":
        PREP.mode, PREP.mode_reason = "process", "ELASTREAM_E2E_RUNTIME=process"
        return
    setup = os.path.join(REPO, "scripts", "docker-setup.sh")
    if os.path.exists(setup):
        t0 = time.monotonic()
        write("e2e: $ bash scripts/docker-setup.sh")
        code, out = _run_script(["bash", setup])
        PREP.timings["docker-setup.sh"] = time.monotonic() - t0
        if code != 0:
            write(f"e2e: scripts/docker-setup.sh FAILED (exit {code}):\n{out[-3000:]}")
            PREP.docker_error = f"scripts/docker-setup.sh failed (exit {code}): {out[-3000:]}"
    ok, detail = _docker_info()
    if not ok:
        reason = PREP.docker_error or f"`docker info` failed: {detail}"
        if forced == "docker":
            PREP.mode, PREP.docker_error = "docker", reason
        else:
            PREP.mode, PREP.mode_reason, PREP.docker_error = "process", f"no Docker ({reason})", ""
        return
    PREP.mode, PREP.docker_version, PREP.docker_error = "docker", detail, ""
    images = os.path.join(REPO, "scripts", "images.sh")
    if os.path.exists(images):
        t0 = time.monotonic()
        write(f"e2e: $ BASE_IMAGE={BASE_IMAGE} bash scripts/images.sh operator worker redis")
        # redis: the chart's bundled Redis from the local base (no registry to pull redis:7-bookworm from)
        code, out = _run_script(
            ["bash", images, "operator", "worker", "redis"], env={"BASE_IMAGE": BASE_IMAGE}, timeout=3600
        )
        PREP.timings["images.sh"] = time.monotonic() - t0
        if code != 0:
            PREP.images_error = f"`BASE_IMAGE={BASE_IMAGE} bash scripts/images.sh` failed (exit {code}):\n{out[-4000:]}"
            write(f"e2e: {PREP.images_error}")
        else:
            write(f"e2e: images built in {PREP.timings['images.sh']:.0f} s")


def _helm_version(bin_dir: str) -> str:
    helm = os.path.join(bin_dir, "helm") if bin_dir else ""
    if helm and os.access(helm, os.X_OK):
        code, out = _run_script([helm, "version", "--short"], timeout=60)
        if code == 0:
            return out.strip().splitlines()[-1]
    return "not built yet (scripts/k8s-tools.sh is building it; tests that use helm wait for it)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    e2e = [item for item in items if str(item.path).startswith(E2E_DIR + os.sep)]
    for item in e2e:
        item.add_marker(pytest.mark.e2e)
    # in a session with other tiers (a plain `pytest`), the e2e tier last: its control plane, operator (a Spark
    # JVM) and containers live until the session ends. `make test` runs it in a lane of its own beside the
    # unit and integration tiers (scripts/test-lanes.sh), which must pass on a busy machine anyway (issue 23)
    chosen = set(map(id, e2e))
    items[:] = [item for item in items if id(item) not in chosen] + e2e


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    items = [i for i in session.items if str(i.path).startswith(E2E_DIR + os.sep)]
    if not items or config.option.collectonly or PREP.tools is not None:
        return
    write = _terminal(config)
    t0 = time.monotonic()
    PREP.tools = _Tools(write)
    try:
        PREP.bin_dir = PREP.tools.wait_core(TOOLS_WAIT_S)
    except RuntimeError as exc:
        PREP.tools_error = str(exc)
        write(f"e2e: FAILED to get the Kubernetes binaries: {exc}")
    PREP.timings["k8s-tools (core)"] = time.monotonic() - t0
    if PREP.bin_dir:
        code, out = _run_script([os.path.join(PREP.bin_dir, "kube-apiserver"), "--version"], timeout=60)
        PREP.k8s_version = out.split()[-1] if code == 0 and out else "?"
    _choose_runtime(write)
    helm = _helm_version(PREP.bin_dir)
    if not PREP.tools.done.is_set() or not os.access(os.path.join(PREP.bin_dir, "helm"), os.X_OK):
        for item in items:  # waiting for the helm build is part of those tests' setup: allow for it
            if "helm" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.timeout(TOOLS_WAIT_S))
    if PREP.mode == "docker" and not PREP.docker_error:
        runtime = f"Docker engine {PREP.docker_version} (host network)"
    elif PREP.mode == "docker":
        runtime = f"Docker engine UNAVAILABLE: {PREP.docker_error.splitlines()[0]}"
    else:
        runtime = f"local processes ({PREP.mode_reason}; pods run as processes, not images)"
    line = (
        f"e2e: Kubernetes {PREP.k8s_version or '(binaries missing)'} (kube-apiserver + etcd + "
        f"kube-controller-manager + kube-scheduler from Go modules), {describe_nodes(DEFAULT_NODES)} on one "
        f"machine, {runtime}, Helm {helm}"
    )
    write("=" * min(len(line), 120))
    write(line)
    write("=" * min(len(line), 120))
    config.stash[_HEADER] = line


_HEADER = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    line = config.stash.get(_HEADER, None)
    if line:
        terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# ---- fixtures --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def k8s_bin() -> str:
    """The bin dir of scripts/k8s-tools.sh (its last output line); fails with the script's output otherwise."""
    if PREP.tools is None:  # e.g. the fixture used outside tests/e2e
        PREP.tools = _Tools(lambda line: print(line, flush=True))
        try:
            PREP.bin_dir = PREP.tools.wait_core(TOOLS_WAIT_S)
        except RuntimeError as exc:
            PREP.tools_error = str(exc)
    if PREP.tools_error or not PREP.bin_dir:
        pytest.fail(PREP.tools_error or "scripts/k8s-tools.sh gave no bin dir", pytrace=False)
    return PREP.bin_dir


@pytest.fixture(scope="session")
def e2e_workdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("e2e"))


@pytest.fixture(scope="session")
def control_plane(k8s_bin: str, e2e_workdir: str) -> Iterator[ControlPlane]:
    cp = ControlPlane(k8s_bin, os.path.join(e2e_workdir, "control-plane"))
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    print(
        f"\ne2e: control plane {cp.version.get('gitVersion')} at {cp.server} up in {cp.timings['total']:.1f} s "
        f"(etcd {cp.timings['etcd']:.1f} s, kube-apiserver {cp.timings['kube-apiserver']:.1f} s, "
        f"kube-controller-manager {cp.timings['kube-controller-manager']:.1f} s, "
        f"kube-scheduler {cp.timings['kube-scheduler']:.1f} s); files in {cp.workdir}"
    )
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def runtime_mode() -> str:
    """'docker' or 'process' (decided once per session, see the module docstring)."""
    if not PREP.mode:
        _choose_runtime(lambda line: print(line, flush=True))
    if PREP.docker_error:
        pytest.fail(f"docker mode cannot work: {PREP.docker_error}", pytrace=False)
    if PREP.images_error:
        pytest.fail(PREP.images_error, pytrace=False)
    return PREP.mode


@pytest.fixture(scope="session")
def kubelet(control_plane: ControlPlane, runtime_mode: str, e2e_workdir: str) -> Iterator[KubeletStandIn]:
    stand_in = KubeletStandIn(
        control_plane.kubeconfig,
        os.path.join(e2e_workdir, "kubelet"),
        mode=runtime_mode,
        server=control_plane.server,
        ca_file=control_plane.ca_file,
        nodes=DEFAULT_NODES,
        kubelet_version=str(control_plane.version.get("gitVersion", "v1.34.3")),
    )
    t0 = time.monotonic()
    stand_in.start()
    print(f"\ne2e: {stand_in.describe()} started in {time.monotonic() - t0:.1f} s; files in {stand_in.workdir}")
    yield stand_in
    stand_in.stop()
    if stand_in.errors():
        print("e2e: kubelet stand-in internal errors:\n" + "\n".join(stand_in.errors()))


class CommandRunner:
    """Runs a real binary (kubectl or helm), printing `$ name args` and its output; returns CompletedProcess."""

    def __init__(self, name: str, binary: str, base_args: list[str], env: dict[str, str]) -> None:
        self.name, self.binary, self.base_args, self.env = name, binary, base_args, env

    def __call__(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 600, quiet: bool = False
    ) -> subprocess.CompletedProcess[str]:
        shown = shlex.join([self.name, *args])
        print(f"$ {shown}", flush=True)
        t0 = time.monotonic()
        try:
            out = subprocess.run(
                [self.binary, *self.base_args, *args], input=input, capture_output=True, text=True,
                timeout=timeout, env=self.env, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            pytest.fail(
                f"`{shown}` timed out after {timeout} s (pass timeout= for longer commands); output so far:\n"
                f"{exc.stdout or '(no stdout)'}\n{exc.stderr or '(no stderr)'}",
                pytrace=False,
            )
        if not quiet:
            if out.stdout.strip():
                print(out.stdout.rstrip())
            if out.stderr.strip():
                print(out.stderr.rstrip())
        elapsed = time.monotonic() - t0
        if elapsed > 5:
            print(f"  ({elapsed:.1f} s)")
        if check and out.returncode != 0:
            pytest.fail(f"`{shown}` exited {out.returncode}:\n{out.stdout}\n{out.stderr}", pytrace=False)
        return out


@pytest.fixture(scope="session")
def kubectl(k8s_bin: str, control_plane: ControlPlane) -> CommandRunner:
    env = {**os.environ, "KUBECONFIG": control_plane.kubeconfig}
    return CommandRunner("kubectl", os.path.join(k8s_bin, "kubectl"), ["--kubeconfig", control_plane.kubeconfig], env)


@pytest.fixture(scope="session")
def helm(control_plane: ControlPlane, e2e_workdir: str) -> CommandRunner:
    """The real helm; waits for scripts/k8s-tools.sh to finish building it (only tests that use helm wait)."""
    assert PREP.tools is not None
    try:
        bin_dir = PREP.tools.wait_all(TOOLS_WAIT_S)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    binary = os.path.join(bin_dir, "helm")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"scripts/k8s-tools.sh finished but {binary} is missing:\n{PREP.tools.output}", pytrace=False)
    home = os.path.join(e2e_workdir, "helm")
    env = {
        **os.environ,
        "KUBECONFIG": control_plane.kubeconfig,
        "HELM_CACHE_HOME": os.path.join(home, "cache"),
        "HELM_CONFIG_HOME": os.path.join(home, "config"),
        "HELM_DATA_HOME": os.path.join(home, "data"),
    }
    return CommandRunner("helm", binary, [], env)


@pytest.fixture
def e2e_namespace(request: pytest.FixtureRequest, kubectl: CommandRunner, kubelet: KubeletStandIn) -> Iterator[str]:
    """A fresh namespace per test; on failure, what is in it (objects, events, pod output) is printed."""
    name = f"e2e-{re.sub(r'[^a-z0-9]', '-', request.node.name.lower())[:40].strip('-')}-{secrets.token_hex(2)}"
    kubectl("create", "namespace", name)
    yield name
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"\n---- e2e: state of namespace {name} after the failure ----")
        kubectl("get", "all,events", "-n", name, "-o", "wide", check=False)
        kubectl("get", "nodes", "-o", "wide", check=False)
        pods = kubectl("get", "pods", "-n", name, "-o", "name", check=False, quiet=True).stdout.split()
        for pod in pods:
            print(kubelet.logs(name, pod.split("/", 1)[1]))
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def sleeper(name: str, labels: dict[str, str] | None = None, cpu: str | None = None, **spec: Any) -> dict[str, Any]:
    """A pod that only sleeps (coreutils `sleep`: in the base image and on this machine; PID 1 of a container ignores
    SIGTERM, so the grace period is 1 s). `cpu`: its CPU request; `spec`: more pod spec fields."""
    container: dict[str, Any] = {"name": "sleep", "image": BASE_IMAGE, "command": ["sleep", "600"]}
    if cpu is not None:
        container["resources"] = {"requests": {"cpu": cpu}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [container], **spec},
    }


# ---- the chart, installed once for the test_operator* modules ---------------------------------------------------
RELEASE = "elastream"
SYSTEM = "elastream-system"


@pytest.fixture(scope="session")
def installed(helm, kubectl, kubelet) -> dict[str, Any]:
    """`helm install` the chart (operator, CRD, RBAC, bundled Redis) with its defaults and wait for it, once for
    the modules whose names start with test_operator (they run after test_leader.py, which installs and removes
    a release of its own: two operators must never serve the same topologies). Some
    values differ, all for what this tier is, not for elastream: pods share the host's network (one port
    space: everything listens on its pod IP) and no registry can be reached (the bundled Redis comes from the
    local base image, the operator and worker images are the `dev` ones this tier builds)."""
    helm(
        "install", RELEASE, os.path.join(REPO, "charts", "elastream"), "--namespace", SYSTEM, "--create-namespace",
        "--set", "listenOnPodIP=true", "--set", "operator.logLevel=DEBUG",
        "--set", "redis.image=elastream-redis:dev",
        # the images this tier builds and loads (the chart's default tag is its appVersion, a released image)
        "--set", "operator.image.tag=dev", "--set", "worker.image.tag=dev",
        # a worker pod that cannot be placed fails its scaling after a minute here, not the default three
        "--set", "operator.workerStartTimeoutSeconds=60",
        "--wait", "--timeout", "6m",
    )  # fmt: skip
    kubectl("get", "pods,svc", "-n", SYSTEM, "-o", "wide")
    kubectl("wait", "--for=condition=Available", "deployment", "-l", "app.kubernetes.io/component=operator",
            "-n", SYSTEM, "--timeout=240s")  # fmt: skip
    secret = kubectl("get", "secret", f"{RELEASE}-redis", "-n", SYSTEM, "-o", "jsonpath={.data.password}", quiet=True)

    password = base64.b64decode(secret.stdout).decode()
    ip = kubectl("get", "svc", f"{RELEASE}-redis", "-n", SYSTEM, "-o", "jsonpath={.spec.clusterIP}", quiet=True)
    # the chart's default: Redis speaks TLS only, with a certificate of the chart's CA for its Service's names; the
    # test reaches it by ClusterIP, so it checks the chain but not the host name (the operator and workers do both)
    ca = kubectl(
        "get", "secret", f"{RELEASE}-redis-tls", "-n", SYSTEM, "-o", "jsonpath={.data.ca\\.crt}", quiet=True
    )  # fmt: skip
    ca_pem = base64.b64decode(ca.stdout).decode()
    client = redis.Redis(
        host=ip.stdout.strip(), port=6379, password=password, socket_timeout=10,
        ssl=True, ssl_ca_data=ca_pem, ssl_check_hostname=False,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    return {"redis": client, "host": ip.stdout.strip(), "password": password, "ca": ca_pem}
