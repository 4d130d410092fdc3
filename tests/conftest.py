"""Shared fixtures. `redis_url` starts a real redis-server on a free loopback port for the session."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A real redis-server process in a temporary directory (restartable, for fault tests)."""

    def __init__(self, *extra_args: str) -> None:
        self.extra_args = list(extra_args)
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run `make setup` (it installs it); integration tests need it")
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="elastream-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A URL to a real, empty Redis database (flushed before each test)."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def restartable_redis() -> Iterator[RedisServer]:
    """A Redis of its own on a fixed port that keeps its data across `stop()` and `start()` (append-only file,
    fsync on every write), for tests that take Redis away and bring it back."""
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A real Redis Cluster for the session: three primaries with one replica each, on loopback ports
    (`tests/redis_cluster.py`)."""
    from redis_cluster import LocalRedisCluster

    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server and redis-cli are not installed: run `make setup`; the cluster tests need them")
    cluster = LocalRedisCluster(masters=3, replicas=1)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: Any) -> str:
    """The cluster's URL (`redis+cluster://127.0.0.1:PORT`), every primary flushed and the cluster healthy
    (a failover test before may have swapped a primary and its replica)."""
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    return str(redis_cluster.url)
