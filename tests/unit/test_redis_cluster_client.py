"""Redis Cluster without a server: how a cluster URL is recognised and turned into a client, which keys share a
slot, and which of the cluster client's errors are outages to wait out. The behaviour against a real cluster
is in tests/integration/test_redis_cluster.py."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import (
    ClusterDownError,
    CrossSlotTransactionError,
    MasterDownError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

from elastream.core.topology import topology_prefix
from elastream.store.cluster import (
    ClusterClient,
    ClusterUnavailable,
    cluster_node_url,
    cluster_seeds,
    hash_tag,
    is_cluster,
    slot_mate,
    slot_of,
)
from elastream.store.registry import RedisMisconfigured, RedisUnavailable, client_for, connect, redacted
from elastream.store.retry import is_redis_outage


@pytest.mark.parametrize(
    ("url", "node"),
    [
        ("redis+cluster://127.0.0.1:7000", "redis://127.0.0.1:7000"),
        ("rediss+cluster://app:s3cret@redis.example:6380", "rediss://app:s3cret@redis.example:6380"),
        ("REDIS+CLUSTER://h:1/0", "redis://h:1/0"),
        ("redis://127.0.0.1:6379/0", None),
        ("rediss://h:6380", None),
        ("unix:///run/redis.sock", None),
        ("not a url", None),
    ],
)
def test_a_cluster_url_names_one_node_of_it(url: str, node: str | None) -> None:
    assert cluster_node_url(url) == node


@pytest.mark.parametrize(
    ("url", "node", "seeds"),
    [
        ("redis+cluster://h1:7000,h2:7001,h3", "redis://h1:7000", [("h2", 7001), ("h3", 6379)]),
        (
            "rediss+cluster://app:s3cret@h1:7000,[::1]:7001/0?ssl_cert_reqs=none",
            "rediss://app:s3cret@h1:7000/0?ssl_cert_reqs=none",
            [("::1", 7001)],
        ),
        ("redis+cluster://h1:7000", "redis://h1:7000", []),
    ],
)
def test_a_cluster_url_may_name_several_nodes(url: str, node: str, seeds: list[tuple[str, int]]) -> None:
    # the client starts from whichever answers: a URL naming one node cannot start a new client while that
    # node is down (a primary that crashed), one naming several can
    assert cluster_node_url(url) == node
    assert cluster_seeds(url) == seeds
    assert "s3cret" not in redacted(url)
    with pytest.raises(ValueError):
        cluster_seeds("redis+cluster://h1:7000,h2:port")


def test_a_cluster_url_gives_a_cluster_client_that_connects_on_first_use() -> None:
    # nothing listens on port 1: making the client must not connect (the operator starts beside a cluster
    # that is not up yet), only its first command does
    client = client_for("redis+cluster://app:s3cret@127.0.0.1:1")
    assert isinstance(client, ClusterClient) and is_cluster(client)
    assert "s3cret" not in repr(client)
    script = client.register_script("return 1")  # hashing a script needs no connection either
    assert len(script.sha) == 40
    client.close()
    # a redis.ConnectionError: every `except redis.RedisError` and every retry of an outage waits it out
    with pytest.raises(ClusterUnavailable) as info:
        client.get("k")
    assert isinstance(info.value, redis.ConnectionError) and is_redis_outage(info.value)
    assert "127.0.0.1:1" in str(info.value.__cause__)
    with pytest.raises(ClusterUnavailable):
        client.pipeline(transaction=True)  # the pipeline needs the slot map too
    assert not is_cluster(client_for("redis://127.0.0.1:1/0"))


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://127.0.0.1:notaport", "redis+cluster://127.0.0.1:7000/3", "redis+cluster://h:7000/?db=2"],
)
def test_a_malformed_cluster_url_is_refused_before_anything_connects(url: str) -> None:
    with pytest.raises(ValueError):
        client_for(url)
    with pytest.raises(RedisMisconfigured) as info:
        connect(url)
    assert "redis+cluster://" in str(info.value)  # the message shows the forms a URL may take


def test_an_unreachable_cluster_is_unavailable_and_its_password_never_shown() -> None:
    retries: list[str] = []
    with pytest.raises(RedisUnavailable) as info:
        connect("redis+cluster://app:s3cret@127.0.0.1:1", wait_s=0.3, on_retry=lambda r, d: retries.append(r))
    for message in [str(info.value), *retries]:
        assert "s3cret" not in message and "127.0.0.1:1" in message, message
    assert redacted("rediss+cluster://app:s3cret@h:6380") == "rediss+cluster://app:***@h:6380"


def test_every_key_of_a_topology_is_in_one_slot_and_topologies_spread() -> None:
    prefix = topology_prefix("shop", "orders")
    assert prefix == "elastream:{shop/orders}:"
    assert hash_tag(f"{prefix}mig:ckpt-3:state:count") == "shop/orders"
    keys = [f"{prefix}{k}" for k in ("schedule", "mig:current", "mig:m1:pending:count:7", "txn:open", "sink:out")]
    assert {slot_of(k) for k in keys} == {slot_of("shop/orders")}
    # 100 topologies land on many slots, spread over the three ranges of a 3-primary cluster
    slots = {slot_of(topology_prefix("default", f"t{i}")) for i in range(100)}
    assert len(slots) > 90
    assert {s * 3 // 16384 for s in slots} == {0, 1, 2}


def test_known_slots() -> None:
    # the values `CLUSTER KEYSLOT` gives (Redis' documentation and a real server)
    assert slot_of("foo") == 12182
    assert slot_of("{user1000}.following") == slot_of("{user1000}.followers") == slot_of("user1000")
    assert hash_tag("a{}b") is None and hash_tag("a{b") is None and hash_tag("{x}{y}") == "x"


@pytest.mark.parametrize("stream", ["orders-out", "elastream:{shop/orders}:sink:out", "a{b", "{x}y"])
def test_a_sink_token_key_shares_its_streams_slot(stream: str) -> None:
    token = slot_mate(stream, ":writer:out#0")
    assert token.endswith(":writer:out#0") and slot_of(token) == slot_of(stream)


def test_the_default_sink_token_key_is_named_as_before() -> None:
    stream = "elastream:{shop/orders}:sink:out"
    assert slot_mate(stream, ":writer:out#0") == f"{stream}:writer:out#0"


@pytest.mark.parametrize(
    "exc",
    [
        ClusterDownError("The cluster is down", status_code="CLUSTERDOWN"),
        MasterDownError("Link with MASTER is down", status_code="MASTERDOWN"),
        TryAgainError("Multiple keys request during rehashing of slot", status_code="TRYAGAIN"),
        MovedError("3999 127.0.0.1:6381", status_code="MOVED"),
        # redis-py takes the code off the message: only `status_code` still says READONLY
        ReadOnlyError("You can't write against a read only replica.", status_code="READONLY"),
        SlotNotCoveredError('Slot "42" is not covered by the cluster.'),
        # a BLPOP on a primary that became a replica under it (the control channel's read: nothing popped)
        redis.ResponseError(
            "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)"
        ),
        RedisClusterException("Redis Cluster cannot be connected. Please provide at least one reachable node: x"),
        RedisClusterException("All slots are not covered after query all startup_nodes. 10923 of 16384 covered..."),
    ],
)
def test_a_cluster_failing_over_is_an_outage(exc: Exception) -> None:
    assert is_redis_outage(exc)


@pytest.mark.parametrize(
    "exc",
    [
        CrossSlotTransactionError("All keys involved in a cluster transaction must map to the same slot"),
        RedisClusterException("Cluster mode is not enabled on this node"),
        redis.ResponseError("CROSSSLOT Keys in request don't hash to the same slot"),
    ],
)
def test_a_cluster_mistake_is_not_an_outage(exc: Exception) -> None:
    assert not is_redis_outage(exc)


@pytest.mark.parametrize(
    ("url", "valid"),
    [
        ("redis+cluster://:s3cret@redis-cluster.redis.svc:6379", True),
        ("rediss+cluster://redis-cluster:6380", True),
        ("redis://:s3cret@redis:6379/0", True),
        ("cluster://redis:6379", False),
        ("redis+sentinel://redis:26379", False),
    ],
)
def test_the_charts_external_url_takes_a_cluster_url(url: str, valid: bool) -> None:
    import json
    import os

    import jsonschema

    from support.paths import REPO

    with open(os.path.join(REPO, "charts", "elastream", "values.schema.json"), encoding="utf-8") as handle:
        schema = json.load(handle)["properties"]["redis"]["properties"]["external"]["properties"]["url"]
    assert jsonschema.Draft7Validator(schema).is_valid(url) is valid
