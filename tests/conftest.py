"""Shared fixtures, built from `tests/support` (tests import that, never this file). `redis_url` is a real
redis-server on a free loopback port for the session; `kafka_broker` a real Kafka broker
(`tests/support/kafka_fixtures.py`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from support.kafka_fixtures import kafka_bootstrap, kafka_broker, restartable_kafka  # noqa: F401
from support.redis_servers import LocalRedisCluster, RedisServer


def _server(*extra_args: str) -> RedisServer:
    try:
        return RedisServer(*extra_args)
    except RuntimeError as exc:  # no redis-server: say how to get one, without a traceback
        pytest.fail(f"{exc}; integration tests need it")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = _server().start()
    yield server
    server.remove()


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
    """A Redis of its own that keeps its port and its data across `stop()` and `start()` (append-only file,
    fsync on every write), for tests that take Redis away and bring it back."""
    server = _server("--appendonly", "yes", "--appendfsync", "always").start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A real Redis Cluster for the session: three primaries with one replica each, on loopback ports
    (`tests/support/redis_servers.py`)."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server and redis-cli are not installed: run `make setup`; the cluster tests need them")
    cluster = LocalRedisCluster(masters=3, replicas=1)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: LocalRedisCluster) -> str:
    """The cluster's URL (`redis+cluster://127.0.0.1:PORT`), every primary flushed and the cluster healthy
    (a failover test before may have swapped a primary and its replica)."""
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    return str(redis_cluster.url)
