"""Redis Cluster: the URL that names one, the client `store.registry.client_for` makes for it, and the hash
slots keys land in.

A cluster is named by one or more of its nodes, `redis+cluster://[user:password@]host[:port][,host:port...]`
(`rediss+cluster://` for TLS); the client reads the slot map from the first that answers (CLUSTER SLOTS),
sends each command to the primary of its key's slot and follows MOVED/ASK redirections and failovers. Every
key of a topology carries the hash tag `{namespace/name}` (`core.topology.topology_prefix`), so a topology's
scripts, MULTI/EXEC and WATCH run on one slot, and topologies spread over the shards by their tags.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import redis
from redis._parsers import Encoder
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.connection import parse_url
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, SlotNotCoveredError

#: the schemes of a Redis Cluster URL, and the scheme of the URL of each of its nodes
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

#: the URL forms, for messages
URL_FORMS = (
    "redis://[user:password@]host[:port][/db] (one Redis), rediss:// for TLS, unix:///path/to/socket, "
    "redis+cluster://[user:password@]host[:port][,host:port...] (a Redis Cluster: one or more of its nodes), "
    "rediss+cluster:// for TLS"
)


def _split(url: str) -> tuple[str, str, list[str], str] | None:
    """(node scheme, user info with its @ or "", the host:port seeds, the rest: path, query) of a cluster URL."""
    scheme, sep, rest = url.partition("://")
    node_scheme = CLUSTER_SCHEMES.get(scheme.lower()) if sep else None
    if node_scheme is None:
        return None
    at = rest.rfind("@")
    userinfo, hosts_and_rest = (rest[: at + 1], rest[at + 1 :]) if at >= 0 else ("", rest)
    end = min((i for i in (hosts_and_rest.find(c) for c in "/?#") if i >= 0), default=len(hosts_and_rest))
    hosts = [h for h in hosts_and_rest[:end].split(",") if h] or [""]
    return node_scheme, userinfo, hosts, hosts_and_rest[end:]


def cluster_node_url(url: str) -> str | None:
    """The URL of the first node a Redis Cluster URL names (`redis+cluster://` -> `redis://`,
    `rediss+cluster://` -> `rediss://`, the credentials and options kept), None for the URL of one Redis."""
    parts = _split(url)
    if parts is None:
        return None
    node_scheme, userinfo, hosts, tail = parts
    return f"{node_scheme}://{userinfo}{hosts[0]}{tail}"


def cluster_seeds(url: str) -> list[tuple[str, int]]:
    """The other nodes a Redis Cluster URL names after the first (`host:port,host:port`; port 6379 when not
    given, IPv6 in brackets): where the client starts when the first does not answer. ValueError for a port
    that is not a number."""
    parts = _split(url)
    seeds = []
    for host in parts[2][1:] if parts else []:
        name, colon, port = host.rpartition(":") if not host.endswith("]") else ("", "", "")
        if not colon:
            name, port = host, "6379"
        if not port.isdigit():
            raise ValueError("a port of the cluster URL is not a number")
        seeds.append((name.strip("[]"), int(port)))
    return seeds


class ClusterUnavailable(redis.ConnectionError):
    """The Redis Cluster cannot serve now: no node of it answered, or a slot has no primary in the client's map
    (a failover in progress). A `redis.ConnectionError`, so it is waited out wherever one Redis being away is.
    Its cause is the cluster client's exception."""


#: how redis-py's cluster client words "no node answered" and "the slots are not all served yet"
_UNAVAILABLE = ("Redis Cluster cannot be connected", "All slots are not covered")


@contextlib.contextmanager
def unavailable_as_connection_error() -> Iterator[None]:
    """Raise `ClusterUnavailable` for the cluster client's own exceptions that mean "not now"; others (a
    cross-slot transaction, a node that is not in cluster mode) go through unchanged."""
    try:
        yield
    except SlotNotCoveredError as exc:
        raise ClusterUnavailable(f"Redis Cluster: {exc}") from exc
    except RedisClusterException as exc:
        if type(exc) is RedisClusterException and str(exc).startswith(_UNAVAILABLE):
            raise ClusterUnavailable(str(exc).split(". ", 1)[0]) from exc
        raise


def _translating(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with unavailable_as_connection_error():
            result = method(*args, **kwargs)
        return _Pipeline(result) if isinstance(result, ClusterPipeline) else result

    return call


class _Pipeline:
    """A cluster pipeline whose calls raise `ClusterUnavailable` like the client's (`with` works as on the
    pipeline itself)."""

    def __init__(self, pipe: ClusterPipeline) -> None:
        self._pipe = pipe

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pipe, name)
        return _translating(attr) if callable(attr) else attr

    def __enter__(self) -> _Pipeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pipe.reset()  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        return len(self._pipe)


def is_cluster(client: Any) -> bool:
    """Whether `client` talks to a Redis Cluster (a `client_for` of a cluster URL)."""
    return isinstance(client, ClusterClient | RedisCluster)


class ClusterClient:
    """A `redis.cluster.RedisCluster` created on first use, as `redis.Redis` connects on first use: a cluster
    that is away when the client is made (the operator starting beside it) is an error of the first call,
    which the callers' retries wait out, not of the constructor. Every attribute but `get_encoder`,
    `register_script` and `close` is the cluster client's, and its methods (its pipelines' too) raise
    `ClusterUnavailable`, a `redis.ConnectionError`, where the cluster client raises one of its own
    exceptions for a cluster that cannot serve now: every `except redis.RedisError` and every retry of an
    outage handles a cluster's failover as it handles one Redis restarting. `url` is one node's (`redis://`,
    `rediss://`), `seeds` the other nodes the cluster URL names: the client reads the slot map from the first
    that answers (CLUSTER SLOTS), then knows every node and follows their changes. A client made while the
    URL's only node is down cannot start: name several nodes, or a Service in front of them."""

    def __init__(self, url: str, options: Mapping[str, Any], seeds: Sequence[tuple[str, int]] = ()) -> None:
        parsed = parse_url(url)  # type: ignore[no-untyped-call]  # ValueError for a malformed URL, as redis.Redis.from_url raises it
        if "path" in parsed:
            raise ValueError("a Redis Cluster is reached over TCP, not a unix socket")
        if int(parsed.get("db") or 0) != 0:
            raise ValueError("a Redis Cluster has only database 0")
        self._url = url
        self._seeds = list(seeds)
        self._options = dict(options)
        self._where = f"{parsed.get('host')}:{parsed.get('port', 6379)}"
        self._lock = threading.Lock()
        self._client: RedisCluster | None = None

    def cluster(self) -> RedisCluster:
        """The cluster client, created (reading the slots from the node of the URL) on the first call."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                # the URL's node, then the other seeds: whichever answers first gives the slot map
                others = [ClusterNode(host, port) for host, port in self._seeds]  # type: ignore[no-untyped-call]
                self._client = RedisCluster.from_url(self._url, startup_nodes=others, **self._options)
            return self._client

    def __getattr__(self, name: str) -> Any:
        with unavailable_as_connection_error():
            attr = getattr(self.cluster(), name)
        return _translating(attr) if callable(attr) else attr

    def get_encoder(self) -> Encoder:
        """What `register_script` hashes a script with; needs no connection."""
        return Encoder(  # type: ignore[no-untyped-call]
            self._options.get("encoding", "utf-8"),
            self._options.get("encoding_errors", "strict"),
            bool(self._options.get("decode_responses", False)),
        )

    def register_script(self, script: str | bytes) -> Any:
        from redis.commands.core import Script

        return Script(self, script)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __repr__(self) -> str:
        return f"ClusterClient({self._where})"


def hash_tag(key: str) -> str | None:
    """The part of `key` Redis Cluster hashes when it is not the whole key: between the first `{` and the
    first `}` after it, when not empty; None when the whole key is hashed."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    return key[start + 1 : end] if end > start + 1 else None


def slot_of(key: str) -> int:
    """The hash slot (0..16383) of `key` in a Redis Cluster."""
    return int(key_slot(key.encode()))


def slot_mate(key: str, suffix: str) -> str:
    """A key named after `key` + `suffix` that hashes to `key`'s slot, so a script or transaction may use both
    on a Redis Cluster: `key` + `suffix` when `key` has a hash tag, else `{key}` + `suffix` (the tag is then
    the whole of `key`, which is what `key` itself hashes). A `key` with a `}` and no tag keeps `key` +
    `suffix` (no tag can name it)."""
    if hash_tag(key) is not None or "}" in key:
        return f"{key}{suffix}"
    return f"{{{key}}}{suffix}"
