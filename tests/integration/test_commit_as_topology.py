"""A checkpoint's completion runs as the topology's own Redis user (issue 38), on real Redis servers: so Redis'
ACLs, not only the operator's code, hold the commit to the topology's keys.

- The completion (latest checkpoint, PERSIST, the exactly-once sinks' commit) is carried out on a connection
  logged in as the topology's user: the events staged by A's sink land in A's stream once, and the server's own
  CLIENT LIST shows that user's connection as the one that ran the EXEC. The commit function is loaded by the
  operator's connection (the user may FCALL it, not load one), and loaded again when Redis lost it.
- A bug that derived another topology's stream and passed no prefix to check (both of the code's own guards
  gone, simulated by replacing the derivation) moves nothing into B's stream: Redis refuses the keys (NOPERM).
  The same bug on the operator's admin connection (no topology users) would have written into B: shown too,
  so the test proves the ACL is what stops it.
- Redis 6.2 has no functions: the completion falls back to the operator's connection and EVAL, and commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from test_redis_held import own_server

from elastream.core.acl import topology_user
from elastream.core.topology import topology_prefix
from elastream.store.acl import delete_topology_user, ensure_topology_user, topology_url
from elastream.store.checkpoint_store import (
    CheckpointScope,
    CheckpointStore,
    ExactlyOnceSink,
    open_transactions_key,
    transaction_keys,
)
from elastream.store.commit_function import COMMIT_FUNCTION, LIBRARY
from elastream.store.registry import client_for

pytestmark = pytest.mark.integration

NAMESPACE, NAME = "team-a", "orders"
A = topology_prefix(NAMESPACE, NAME)
B = topology_prefix("team-b", "victim")
PASSWORD = "d" * 64
SINK = ExactlyOnceSink("out", f"{A}sink:out", 2)
SCOPE = CheckpointScope(vertices=("in", "out"), sinks=(SINK,))


@contextlib.contextmanager
def as_topology(url: str) -> Iterator[redis.Redis]:
    """A's Redis user (the operator's own rules) and a connection logged in as it."""
    admin = client_for(url)
    ensure_topology_user(admin, NAMESPACE, NAME, PASSWORD, force=True)
    connection = client_for(topology_url(url, topology_user(NAMESPACE, NAME), PASSWORD))
    try:
        yield connection
    finally:
        connection.close()
        delete_topology_user(admin, NAMESPACE, NAME)
        admin.close()


def stage(client: redis.Redis, txn_id: str, first: int, count: int, executor: int = 0) -> list[bytes]:
    """What an exactly-once sink executor's `pre_commit` writes for `txn_id`; returns the event ids staged."""
    staging, members = transaction_keys(A, txn_id, f"out#{executor}")
    ids = [f"e{i}".encode() for i in range(first, first + count)]
    items: list[Any] = [SINK.stream]
    for i in range(first, first + count):
        items += [f"e{i}", f"k{i}", f"v{i}", repr(1000.0 + i)]
    client.rpush(staging, *items)
    client.sadd(members, staging)
    client.zadd(open_transactions_key(A), {txn_id: 1.0}, nx=True)
    return ids


def committed(client: redis.Redis, stream: str) -> list[bytes]:
    return [fields[b"id"] for _, fields in client.xrange(stream)]


def library_loaded(client: redis.Redis) -> bool:
    return COMMIT_FUNCTION.encode() in repr(client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY)).encode()


def test_the_completion_runs_as_the_topology_user_and_commits_once(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    with as_topology(redis_url) as tenant:
        store = CheckpointStore(admin, A, commit_as=lambda: tenant)
        staged = stage(admin, "ckpt-1", 0, 5) + stage(admin, "ckpt-1", 5, 3, executor=1)
        store.complete_checkpoint("ckpt-1", {}, SCOPE)
        assert sorted(committed(admin, SINK.stream)) == sorted(staged)
        assert admin.exists(*(transaction_keys(A, "ckpt-1", f"out#{i}")[0] for i in range(2))) == 0
        assert library_loaded(admin)
        # the server saw the EXEC on the topology user's connection
        clients = [c for c in admin.client_list() if c.get("user") == topology_user(NAMESPACE, NAME)]
        assert [c["cmd"] for c in clients] == ["exec"], clients
        assert store.latest_checkpoint() is not None and store.latest_checkpoint()["id"] == "ckpt-1"  # type: ignore[index]

        # Redis lost the function (FUNCTION FLUSH, as a restart without its data would): loaded again, and the
        # next completion commits what was staged under it
        admin.execute_command("FUNCTION", "FLUSH")
        more = stage(admin, "ckpt-2", 100, 4)
        store.complete_checkpoint("ckpt-2", {}, SCOPE)
        assert sorted(committed(admin, SINK.stream)) == sorted(staged + more)
        assert library_loaded(admin)
        # the topology's user may call the operator's function, never load one of its own
        with pytest.raises(redis.ResponseError, match=r"(?i)no permissions|noperm"):
            tenant.execute_command("FUNCTION", "LOAD", "REPLACE", "#!lua name=x\nredis.register_function('x', 1)")
    admin.close()


def wrong_derivation(store: CheckpointStore) -> None:
    """Replace the store's derivation of the commit's keys by one with a bug that names B's stream and passes
    no prefix to check (so the commit's own prefix check lets every key through)."""
    right = store._commit_arguments

    def wrong(txn_id: str, sinks: Any) -> tuple[list[str], list[Any]]:
        keys, args = right(txn_id, sinks)
        return [keys[0], f"{B}source:in", *keys[2:]], ["", *args[1:]]

    store._commit_arguments = wrong  # type: ignore[method-assign]


def test_redis_refuses_a_commit_the_code_got_wrong(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    b_entries = [admin.xadd(f"{B}source:in", {"id": i}) for i in range(3)]
    with as_topology(redis_url) as tenant:
        store = CheckpointStore(admin, A, commit_as=lambda: tenant)
        wrong_derivation(store)
        stage(admin, "ckpt-1", 0, 5)
        admin.acl_log_reset()
        with contextlib.suppress(redis.RedisError):  # refused whole (EXECABORT) or the commit alone
            store.complete_checkpoint("ckpt-1", {}, SCOPE)
        assert [e for e, _ in admin.xrange(f"{B}source:in")] == b_entries  # B untouched
        # refused by Redis' ACL: the log names A's user and B's key
        refusals = admin.acl_log()
        assert any(
            r.get("username") == topology_user(NAMESPACE, NAME) and r.get("object") == f"{B}source:in" for r in refusals
        ), refusals

    # the same bug on the operator's own connection (topology users off): the code's guards were all there was
    admin.delete(*admin.keys(f"{glob(A)}*"))
    store = CheckpointStore(admin, A)
    wrong_derivation(store)
    stage(admin, "ckpt-1", 0, 5)
    store.complete_checkpoint("ckpt-1", {}, SCOPE)
    assert len(admin.xrange(f"{B}source:in")) == len(b_entries) + 5  # written into B: what the ACL stopped
    admin.close()


def glob(prefix: str) -> str:
    from elastream.core.topology import glob_escape

    return glob_escape(prefix)


def test_redis_without_functions_commits_on_the_operator_connection() -> None:
    with own_server("6.2") as server:
        admin = redis.Redis(port=server.port)
        with as_topology(server.url) as tenant:
            store = CheckpointStore(admin, A, commit_as=lambda: tenant)
            staged = stage(admin, "ckpt-1", 0, 4)
            store.complete_checkpoint("ckpt-1", {}, SCOPE)
            assert sorted(committed(admin, SINK.stream)) == sorted(staged)
            assert store.latest_checkpoint()["id"] == "ckpt-1"  # type: ignore[index]
        admin.close()


def test_the_completion_runs_as_the_topology_user_on_a_cluster(redis_cluster_url: str) -> None:
    """The same on a real Redis Cluster: the function loaded on the primary of the topology's slot (its replicas
    get it by replication), the FCALL routed by its keys (one hash tag, one slot)."""
    admin = client_for(redis_cluster_url)
    with as_topology(redis_cluster_url) as tenant:
        store = CheckpointStore(admin, A, commit_as=lambda: tenant)
        staged = stage(admin, "ckpt-1", 0, 5) + stage(admin, "ckpt-1", 5, 2, executor=1)
        store.complete_checkpoint("ckpt-1", {}, SCOPE)
        assert sorted(committed(admin, SINK.stream)) == sorted(staged)
        assert store.latest_checkpoint()["id"] == "ckpt-1"  # type: ignore[index]
        assert library_loaded(store._node_client(store.latest_key))
    for key in [SINK.stream, store.latest_key, open_transactions_key(A)]:
        admin.delete(key)
    admin.close()
