"""Real redis-server processes on loopback for tests and benchmarks: `RedisServer`, one server on a free
port (restartable, for fault tests), and `LocalRedisCluster`, processes started with `--cluster-enabled yes`
on free ports, joined by `redis-cli --cluster create`, each primary with its replicas.

Every wait is bounded and says what it waited for. The cluster bus of each node gets a port of its own
(`--cluster-port`), so no node depends on port + 10000 being free.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

import redis

from support.ports import free_port
from support.waiting import wait_until

#: what every server here runs with unless told otherwise: nothing written to disk
NO_PERSISTENCE = ("--save", "", "--appendonly", "no")


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run `make setup` (it installs it)")
    return binary


def spawn_redis(binary: str, port: int, directory: str, *args: str) -> subprocess.Popen[bytes]:
    """One redis-server on 127.0.0.1:`port` in `directory`, persistence off unless `args` turn it on (the
    later of two equal options wins in redis-server)."""
    return subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, *NO_PERSISTENCE, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class RedisServer:
    """A real redis-server process in a temporary directory on a free port; `stop()` and `start()` again
    keep its port and directory (with `--appendonly yes` its data too), for fault tests."""

    def __init__(self, *extra_args: str) -> None:
        self.extra_args = list(extra_args)
        self.binary = redis_server_binary()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="elastream-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.proc = spawn_redis(self.binary, self.port, self.dir, *self.extra_args)
        node = Node(port=self.port, bus_port=0, dir=self.dir, proc=self.proc)
        wait_until(lambda: _answers(node), timeout_s, f"redis-server on port {self.port} to answer")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def remove(self) -> None:
        """Stop it and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Node:
    port: int
    bus_port: int
    dir: str
    proc: subprocess.Popen[bytes] | None = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=2.0, socket_timeout=10.0)


@dataclass
class LocalRedisCluster:
    """`masters` primaries with `replicas` replicas each, on loopback; `url` names it (redis+cluster://)."""

    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 2000
    nodes: list[Node] = field(default_factory=list)
    root: str = ""

    @property
    def url(self) -> str:
        """Every node as a seed: a client made while one is down (a primary that crashed) starts from another."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout_s: float = 60.0) -> LocalRedisCluster:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None or cli is None:
            raise RuntimeError("redis-server and redis-cli are needed: run `make setup` (it installs them)")
        self.root = tempfile.mkdtemp(prefix="elastream-redis-cluster-")
        ports: set[int] = set()
        while len(ports) < 2 * self.masters * (1 + self.replicas):
            ports.add(free_port())
        pairs = sorted(ports)
        for i in range(self.masters * (1 + self.replicas)):
            directory = f"{self.root}/node-{i}"
            subprocess.run(["mkdir", "-p", directory], check=True)
            self.nodes.append(Node(port=pairs[2 * i], bus_port=pairs[2 * i + 1], dir=directory))
        for node in self.nodes:
            self._spawn(server, node)
        for node in self.nodes:
            wait_until(lambda node=node: _answers(node), timeout_s, f"redis-server on port {node.port} to answer")
        create = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-2000:]} {create.stderr[-2000:]}")
        self.wait_healthy(timeout_s)
        return self

    def _spawn(self, server: str, node: Node) -> None:
        node.proc = spawn_redis(
            server,
            node.port,
            node.dir,
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-port", str(node.bus_port), "--cluster-node-timeout", str(self.node_timeout_ms)),
            *("--logfile", "redis.log", "--repl-diskless-sync-delay", "0"),
        )

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        """Every live node says cluster_state:ok, sees every slot served, every primary has its replicas and
        every replica's link to its primary is up (its first sync done: a replica that never synced does not
        take over)."""

        def healthy() -> bool:
            for node in self.live_nodes():
                try:
                    info = node.client().cluster("info")
                    if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_ok", 0)) != 16384:
                        return False
                except redis.RedisError:
                    return False
            primaries = self.primaries()
            replicas = [r for p in primaries for r in self.replicas_of(p)]
            return (
                len(primaries) == self.masters
                and len(replicas) == self.masters * self.replicas
                and all(r.client().info("replication").get("master_link_status") == "up" for r in replicas)
                and all(_online_replicas(p) == self.replicas for p in primaries)
            )

        wait_until(
            healthy, timeout_s, "the cluster to be ok with every slot served and every replica attached and in sync"
        )

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def _view(self) -> list[dict[str, Any]]:
        """CLUSTER NODES as one live node sees it: per node its id, port, role and primary's id."""
        raw = self.live_nodes()[0].client().execute_command("CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        rows = []
        for line in text.strip().splitlines():
            parts = line.split()
            flags = parts[2].split(",")
            rows.append(
                {
                    "id": parts[0],
                    "port": parts[1].split("@")[0].rsplit(":", 1)[1],
                    "role": "master" if "master" in flags else "slave",
                    "master": parts[3],
                    "failed": "fail" in flags or "fail?" in flags,
                    "slots": " ".join(parts[8:]),
                }
            )
        return rows

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def primaries(self) -> list[Node]:
        return [
            self.node(int(r["port"])) for r in self._view() if r["role"] == "master" and not r["failed"] and r["slots"]
        ]

    def replicas_of(self, primary: Node) -> list[Node]:
        rows = self._view()
        primary_id = next(r["id"] for r in rows if int(r["port"]) == primary.port)
        return [self.node(int(r["port"])) for r in rows if r["master"] == primary_id and not r["failed"]]

    def primary_of_key(self, key: str) -> Node:
        """The node serving `key`'s slot now (asked of the cluster, not computed)."""
        client = self.live_nodes()[0].client()
        slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return self.node(int(primary[1]))
        raise AssertionError(f"slot {slot} of {key!r} is served by no node")

    def failover(self, primary: Node, timeout_s: float = 60.0) -> Node:
        """A manual failover (CLUSTER FAILOVER on a replica of `primary`): the replica waits until it has
        everything the primary acknowledged, then takes its slots; the old primary becomes its replica.
        Returns the new primary once every node agrees."""
        replica = self.replicas_of(primary)[0]
        replica.client().execute_command("CLUSTER", "FAILOVER")
        wait_until(
            lambda: replica in self.primaries() and primary not in self.primaries(),
            timeout_s,
            f"replica {replica.port} to take over from primary {primary.port}",
        )
        self.wait_healthy(timeout_s)
        return replica

    def crash(self, primary: Node, timeout_s: float = 60.0) -> Node:
        """Kill `primary` (SIGKILL: no goodbye to its replica or its clients) and wait until its replica has
        been elected in its place; then start the dead node again from its nodes.conf, so it rejoins as the
        new primary's replica and the cluster is whole for what comes next. Returns the new primary."""
        replica = self.replicas_of(primary)[0]
        assert primary.proc is not None
        primary.proc.kill()
        primary.proc.wait(timeout=10)
        primary.proc = None
        wait_until(
            lambda: replica in self.primaries(), timeout_s, f"replica {replica.port} to be elected for {primary.port}"
        )
        server = shutil.which("redis-server")
        assert server is not None
        self._spawn(server, primary)
        wait_until(lambda: _answers(primary), timeout_s, f"redis-server on port {primary.port} to answer again")
        self.wait_healthy(timeout_s)
        return replica

    def flush(self) -> None:
        for node in self.primaries():
            node.client().flushall()

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None:
                node.proc.terminate()
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait(timeout=10)
                node.proc = None
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)


def _online_replicas(primary: Node) -> int:
    """How many replicas the primary itself counts as online (their first sync done)."""
    info = primary.client().info("replication")
    states = [v.get("state") for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return states.count("online")


def _answers(node: Node) -> bool:
    try:
        return bool(node.client().ping())
    except (redis.RedisError, OSError):
        return False
