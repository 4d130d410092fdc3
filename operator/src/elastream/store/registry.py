"""Where workers and the backend meet in Redis: the current schedule, executor endpoints, readiness.

Keys under the topology's prefix (`elastream:{namespace/name}:`, braces included: the Redis Cluster hash tag):
- `schedule`              JSON ``{"version": n, "schedule": Schedule.to_dict()}``: the running schedule
- `schedule:<version>`    the same JSON for every version, staged ahead of a migration and then activated
- `staged:<version>`      set of nodes that bound the inboxes of a staged version (idle, endpoints registered)
- `endpoints:<version>`   hash executor -> ``tcp://host:port`` of its inbox, written by each worker
- `ready:<version>`       set of nodes whose executors are all running
- `workers`               hash node -> JSON ``{"pid", "host", "metricsPort", "version", "startedAt"}``
- `manifest`              JSON of the running StreamTopology (`store_manifest`), so tools can name it
Versioned keys expire after a day, so abandoned schedules do not pile up.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import parse_qs, parse_qsl, unquote_plus, urlencode, urlsplit, urlunsplit

import redis
from redis.exceptions import RedisClusterException

from elastream.core.schedule import Schedule
from elastream.core.topology import API_VERSION, KIND, Topology, topology_prefix
from elastream.store.cluster import URL_FORMS, ClusterClient, ClusterUnavailable, cluster_node_url, cluster_seeds
from elastream.store.codec import text
from elastream.store.retry import backoff

log = logging.getLogger("elastream.store")

VERSIONED_TTL_S = 24 * 3600


class RedisUnavailable(Exception):
    """Redis cannot be reached; the message says where and why."""


class RedisMisconfigured(RedisUnavailable):
    """Waiting does not help, the configuration must change (the URL is malformed, the password refused)."""


class RedisCredentialsRefused(RedisMisconfigured):
    """Redis answered and refused the password: waiting does not help, the configuration must change."""


#: how long `connect` waits out a refusal of the credentials that follows an outage (a restarted Redis has
#: no users until the operator, or `elastream run`, sets them again: every second or so)
CREDENTIALS_GRACE_S = 30.0


def client_for(url: str, **options: Any) -> redis.Redis:
    """A client for `url` that connects when first used: 2 s to connect and 10 s per reply unless `options`
    say otherwise. A Redis Cluster URL (`redis+cluster://`, `rediss+cluster://`) gives a `ClusterClient`: a
    `redis.cluster.RedisCluster` that follows MOVED/ASK redirections and failovers, with the same commands.
    A malformed URL raises ValueError here, before anything connects."""
    options = {"socket_connect_timeout": 2.0, "socket_timeout": 10.0, **options}
    node_url = cluster_node_url(url)
    if node_url is None:
        return redis.Redis.from_url(url, **options)
    # the commands elastream sends are the same on both (checked against a real cluster by the integration
    # tests); the declared type stays redis.Redis so the adapters need no second signature
    return cast(redis.Redis, ClusterClient(node_url, options, cluster_seeds(url)))


def redacted(url: str) -> str:
    """`url` with its secrets replaced by `***`, everything else as written: what a message, a log line, an
    event or a status may show. The secrets are the user info's password (``redis://user:PASSWORD@host``, also
    when it holds an unencoded / ? # or @, which ends the host part early) and the value of every secret query
    parameter (`is_secret_parameter`: ``password=``, the form redis-py takes for ``unix://`` sockets, and
    ``ssl_password=``, the TLS client key's, however their names are cased or percent-encoded). Plain string
    work, so no URL, however malformed, makes it raise; when in doubt it hides more (the host too, a value up to
    the next parameter even past a #), never less."""
    scheme, sep, rest = url.partition("://")
    if sep:
        netloc_end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
        # an @ after the host part's end: the password holds one of / ? # (unencoded); hide up to the last @
        split = rest.rfind("@", 0, netloc_end) if "@" in rest[:netloc_end] else rest.rfind("@")
        userinfo = rest[:split] if split >= 0 else ""
        if ":" in userinfo:
            url = f"{scheme}://{userinfo.split(':', 1)[0]}:***@{rest[split + 1 :]}"
    return QUERY_PARAMETER.sub(
        lambda m: (
            f"{m.group(1)}{m.group(2)}=***"
            if m.group(3) is not None and is_secret_parameter(m.group(2))
            else m.group(0)
        ),
        url,
    )


#: one query parameter of a URL: its separator (? & or ;), its name as written and `=` with its value (None when
#: it has none); the value runs to the next & or ;, past a # (a secret redis-py cut at a # is hidden whole)
QUERY_PARAMETER = re.compile(r"([?&;])([^=&;#?]*)(=[^&;]*)?")

#: the words that make a URL query parameter a secret: `password` (redis-py's form for unix sockets),
#: `ssl_password` (the TLS client key's), and anything else so named
_SECRET_WORDS = ("password", "passwd", "secret", "token", "credential")


def is_secret_parameter(name: str) -> bool:
    """Whether the URL query parameter `name` (as written) holds a secret: its name, percent-decoded and in any
    case (as redis-py decodes it: `ssl%5Fpassword` is `ssl_password`), says password, secret, token or
    credential. Errs on the side of hiding."""
    decoded = unquote_plus(name).lower()
    return any(word in decoded for word in _SECRET_WORDS)


#: the query parameter of a Redis URL naming the CA file a TLS connection checks the server against
CA_FILE_PARAMETER = "ssl_ca_certs"


def ca_file_of(url: str) -> str | None:
    """The CA file a `rediss://` URL names (`?ssl_ca_certs=/path/ca.crt`), None when it names none."""
    values = parse_qs(urlsplit(url).query).get(CA_FILE_PARAMETER)
    return values[-1] if values else None


def with_ca_file(url: str, path: str) -> str:
    """`url` with its CA file (`ssl_ca_certs`) replaced by `path`, everything else as written: the same
    Redis, checked against the same CA found somewhere else (in a worker pod rather than the operator's)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != CA_FILE_PARAMETER]
    query.append((CA_FILE_PARAMETER, path))
    return urlunsplit(parts._replace(query=urlencode(query, safe="/")))


def connect(
    url: str,
    wait_s: float = 0.0,
    on_retry: Callable[[str, float], None] | None = None,
    **options: Any,
) -> redis.Redis:
    """A client for `url`, checked with PING. Retries with exponential backoff (0.2 s doubling to 5 s) for up
    to `wait_s` seconds, calling `on_retry(reason, delay)` before each wait; then raises `RedisUnavailable`.
    `options` go to the client (they may replace the timeouts: 2 s to connect, 10 s per reply)."""
    deadline = time.monotonic() + wait_s
    try:
        client_for(url, **options)
    except ValueError:
        # not its text: redis-py's reasons quote pieces of the URL ("Port could not be cast to integer value
        # as 'pa'", a piece of a password with an unencoded /)
        raise RedisMisconfigured(
            f"{redacted(url)} is not a Redis URL ({URL_FORMS}); percent-encode : / ? # @ in the password; "
            "fix --redis / ELASTREAM_REDIS_URL"
        ) from None
    cluster = cluster_node_url(url) is not None
    #: when Redis was first seen away in this call, and when it first refused the credentials after that
    away_since: float | None = None
    refused_since: float | None = None

    def refused_after_restart(refusal: str) -> bool:
        """A Redis that restarted has no users until the operator sets them again (within seconds): a
        refusal right after an outage is waited out for `CREDENTIALS_GRACE_S`, one on first contact is not."""
        nonlocal refused_since
        if away_since is None:
            return False
        now = time.monotonic()
        refused_since = refused_since if refused_since is not None else now
        if now - refused_since >= CREDENTIALS_GRACE_S or now >= deadline:
            return False
        if on_retry is not None:
            on_retry(
                f"Redis at {redacted(url)} refused the credentials ({refusal}) right after an outage: "
                "a restarted Redis has no users until they are set again",
                0.2,
            )
        time.sleep(0.2)
        return True

    for delay in backoff():
        try:
            client = client_for(url, **options)
            client.ping()
            if not cluster and _cluster_enabled(client):
                client.close()
                raise RedisMisconfigured(
                    f"Redis at {redacted(url)} is a node of a Redis Cluster: one Redis client would get MOVED "
                    "for most keys; name it as a cluster, redis+cluster://host:port (rediss+cluster:// for TLS)"
                )
            return client
        except redis.AuthenticationError as exc:
            if refused_after_restart(str(exc)):
                continue
            raise RedisCredentialsRefused(
                f"Redis at {redacted(url)} refused the credentials ({exc}); fix the password"
            ) from None
        except RedisClusterException as exc:  # what the cluster client raises that is not an outage
            if "not enabled" in str(exc):  # "Cluster mode is not enabled on this node"
                raise RedisMisconfigured(
                    f"Redis at {redacted(url)} is not a Redis Cluster node (cluster mode is not enabled); "
                    "name one Redis as redis://host:port (rediss:// for TLS)"
                ) from None
            raise
        except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError) as exc:
            refused = _refused_credentials(exc)  # a cluster's nodes refused them (behind its client's errors)
            if refused is not None and refused_after_restart(str(refused)):
                continue
            if refused is not None:
                raise RedisCredentialsRefused(
                    f"Redis Cluster at {redacted(url)} refused the credentials ({refused}); fix the password"
                ) from None
            away_since = away_since if away_since is not None else time.monotonic()
            reason = f"cannot reach Redis at {redacted(url)} ({_one_line(exc)})"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RedisUnavailable(f"{reason}; start Redis or fix --redis / ELASTREAM_REDIS_URL") from None
            delay = min(delay, remaining)
            if on_retry is not None:
                on_retry(reason, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # backoff() never ends


def _cluster_enabled(client: redis.Redis) -> bool:
    """Whether the one Redis `client` reaches runs in cluster mode (False when it does not say: an ACL user
    without INFO, a Redis-compatible server without the section)."""
    try:
        section = client.info("cluster")
    except redis.ResponseError:
        return False
    return bool(int(section.get("cluster_enabled", 0) or 0))


def _refused_credentials(exc: BaseException) -> BaseException | None:
    """The `AuthenticationError` among the causes of `exc`, if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.AuthenticationError):
            return seen
        seen = seen.__cause__
    return None


def _one_line(exc: BaseException) -> str:
    """`exc`'s message, with the underlying error of a cluster that cannot be reached (never the URL: it is in
    neither)."""
    cause = exc.__cause__.__cause__ if isinstance(exc, ClusterUnavailable) and exc.__cause__ else None
    return f"{exc}: {type(cause).__name__}: {cause}" if cause is not None else str(exc)


class Registry:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def stage_schedule(self, schedule: Schedule, after: int = 0) -> int:
        """Store `schedule` as a new version without making it the running one; returns the version. It is
        of the other parity than `after` (the running version), so a node that binds both at once uses
        disjoint port blocks (see `runtime.worker.Worker._port_for`)."""
        version = int(self.client.incr(f"{self.prefix}schedule-version"))
        if after and version % 2 == after % 2:
            version = int(self.client.incr(f"{self.prefix}schedule-version"))
        document = json.dumps({"version": version, "schedule": schedule.to_dict()})
        self.client.set(f"{self.prefix}schedule:{version}", document, ex=VERSIONED_TTL_S)
        return version

    def activate_schedule(self, version: int) -> None:
        """Make a staged version the running one (what a worker that starts from scratch reads)."""
        document = self.client.get(f"{self.prefix}schedule:{version}")
        if document is None:
            raise KeyError(f"schedule version {version} is not in Redis (expired?)")
        self.client.set(f"{self.prefix}schedule", document)

    def publish_schedule(self, schedule: Schedule, after: int = 0) -> int:
        """Store `schedule` as the next version and make it the running one; returns the version number."""
        version = self.stage_schedule(schedule, after)
        self.activate_schedule(version)
        return version

    def schedule(self) -> tuple[int, Schedule] | None:
        return _parse_schedule(self.client.get(f"{self.prefix}schedule"))

    def schedule_version(self, version: int) -> tuple[int, Schedule] | None:
        return _parse_schedule(self.client.get(f"{self.prefix}schedule:{version}"))

    def mark_staged(self, version: int, node: str) -> None:
        self._add_node(f"staged:{version}", node)

    def staged_nodes(self, version: int) -> set[str]:
        return self._nodes(f"staged:{version}")

    def register_endpoints(self, version: int, endpoints: Mapping[str, str]) -> None:
        key = f"{self.prefix}endpoints:{version}"
        pipe = self.client.pipeline(transaction=False)
        if endpoints:
            pipe.hset(key, mapping=dict(endpoints))  # type: ignore[arg-type]
        pipe.expire(key, VERSIONED_TTL_S)
        pipe.execute()

    def endpoints(self, version: int) -> dict[str, str]:
        raw = self.client.hgetall(f"{self.prefix}endpoints:{version}")
        return {text(k): text(v) for k, v in raw.items()}

    def mark_ready(self, version: int, node: str) -> None:
        self._add_node(f"ready:{version}", node)

    def ready_nodes(self, version: int) -> set[str]:
        return self._nodes(f"ready:{version}")

    def unmark_ready(self, version: int, nodes: Sequence[str]) -> None:
        """Forget that `nodes` were ready under `version`: their workers are being restarted, and waiting
        for readiness must wait for the new processes, not return on the dead ones' old marks."""
        if nodes:
            self.client.srem(f"{self.prefix}ready:{version}", *nodes)

    def unmark(self, version: int, node: str) -> None:
        """Take back `node`'s ready and staged marks of `version` (its worker failed and is exiting)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.srem(f"{self.prefix}ready:{version}", node)
        pipe.srem(f"{self.prefix}staged:{version}", node)
        pipe.execute()

    def _add_node(self, name: str, node: str) -> None:
        """Add `node` to the versioned node set `name` (it expires with the version's other keys)."""
        key = f"{self.prefix}{name}"
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(key, node)
        pipe.expire(key, VERSIONED_TTL_S)
        pipe.execute()

    def _nodes(self, name: str) -> set[str]:
        return {text(n) for n in self.client.smembers(f"{self.prefix}{name}")}

    def register_worker(self, node: str, info: Mapping[str, Any]) -> None:
        self.client.hset(f"{self.prefix}workers", node, json.dumps(dict(info)))

    def workers(self) -> dict[str, dict[str, Any]]:
        raw = self.client.hgetall(f"{self.prefix}workers")
        return {text(k): json.loads(v) for k, v in raw.items()}


def _parse_schedule(raw: bytes | str | None) -> tuple[int, Schedule] | None:
    if raw is None:
        return None
    data = json.loads(raw)
    return int(data["version"]), Schedule.from_dict(data["schedule"])


def manifest_key(name: str) -> str:
    """The key of a stored manifest: `name` is NAME (namespace default) or NAMESPACE/NAME."""
    namespace, _, short = name.rpartition("/")
    return f"{topology_prefix(namespace or 'default', short)}manifest"


def store_manifest(client: redis.Redis, topology: Topology) -> None:
    """Keep the topology's manifest (with its current node count) under its prefix, as JSON."""
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": topology.name, "namespace": topology.namespace},
        "spec": {**topology.spec, "nodes": topology.nodes},
    }
    client.set(f"{topology.redis_prefix}manifest", json.dumps(document, default=str))


def stored_manifest(client: redis.Redis, name: str) -> dict[str, Any] | None:
    """The manifest `store_manifest` kept for NAME or NAMESPACE/NAME, None when there is none."""
    raw = client.get(manifest_key(name))
    if raw is None:
        return None
    document: dict[str, Any] = json.loads(raw)
    return document
