"""A topology's Redis user (`core.acl`) in Redis: set, checked, deleted, on one Redis or every node of a Redis
Cluster (ACL SETUSER is not propagated by the cluster: primaries and replicas each get it, so a failover
changes nothing), and the URL its workers connect with.

ACL commands the operator's own Redis user may not run (NOPERM; an "unknown command" of a service that has
none) raise `AclRefused`, whose message names the fix and never a password.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from typing import Any
from urllib.parse import unquote_plus

import redis

from elastream.core.acl import topology_acl_rules, topology_user
from elastream.core.topology import glob_escape, topology_prefix
from elastream.store.cluster import is_cluster
from elastream.store.registry import QUERY_PARAMETER, is_secret_parameter

log = logging.getLogger("elastream.store")

#: the fix, for every message about ACL commands refused
ACL_FIX = (
    "grant the operator's Redis user the ACL rights (+acl, for ACL SETUSER/GETUSER/DELUSER on every node), or "
    "turn topology users off (--redis-topology-users off, the chart's redis.topologyUsers: false), so workers "
    "use the operator's Redis identity"
)


class AclRefused(Exception):
    """Redis refused an ACL command of the operator: the topology cannot get its own user. `reason` is
    Redis' word for it (never a password)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def topology_url(url: str, user: str, password: str) -> str:
    """`url` (the operator's Redis URL) with its user info replaced by `user:password`; scheme, hosts (all of a
    `redis+cluster://` URL's), port, database and options as written, but no `username=` query parameter nor
    any secret one (`registry.is_secret_parameter`: `password=`, `ssl_password=`, however cased or
    percent-encoded): redis-py would not let them win, and they are the operator's, never a tenant's. `user`
    and `password` hold no character that needs escaping (`core.acl.topology_user`, a hex password)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("not a Redis URL")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    # as `registry.redacted` reads it: the last @ of the host part ends the user info; an @ after the host
    # part's end means the password holds an unencoded / ? or # (or the URL is unix://user:password@/path):
    # the user info ends at the last @, so none of the operator's password is ever kept
    at = rest.rfind("@", 0, end) if "@" in rest[:end] else rest.rfind("@")
    host_and_rest = rest[at + 1 :] if at >= 0 else rest
    host_and_rest = QUERY_PARAMETER.sub(_without_credentials, host_and_rest)
    # a removed first parameter leaves its ?: joined to the next one, or dropped when none is left
    host_and_rest = re.sub(r"\?[&;]+", "?", host_and_rest)
    host_and_rest = re.sub(r"\?(?=#|$)", "", host_and_rest)
    return f"{scheme}://{user}:{password}@{host_and_rest}"


def _without_credentials(match: re.Match[str]) -> str:
    """A `registry.QUERY_PARAMETER` match, gone when it names the user or holds a secret (its ? kept)."""
    separator, name = match.group(1), match.group(2)
    if unquote_plus(name).lower() == "username" or is_secret_parameter(name):
        return "?" if separator == "?" else ""
    return match.group(0)


def _nodes(client: redis.Redis) -> list[tuple[str, Any]]:
    """(name, how to run a command there) of every node: the one Redis, or every node of the cluster."""
    if not is_cluster(client):
        return [("redis", client.execute_command)]
    cluster: Any = client
    known = {node.name: node for node in cluster.get_nodes()}
    runs: dict[str, Any] = {
        name: (lambda *args, _node=node: cluster.execute_command(*args, target_nodes=_node))
        for name, node in known.items()
    }
    # the client's map holds the nodes CLUSTER SLOTS listed when it was read: a replica still syncing (or added
    # since) is missing from it, and must get the user too; CLUSTER NODES lists every node
    seed = next(iter(known.values()))
    listed = cluster.execute_command("CLUSTER", "NODES", target_nodes=seed)
    for address, flags in _cluster_nodes(listed):
        if address in runs or any(bad in flags for bad in ("fail", "noaddr", "handshake")):
            continue
        host, _, port = address.rpartition(":")
        runs[address] = _direct(seed, host, int(port))
    return sorted(runs.items())


def _cluster_nodes(reply: Any) -> list[tuple[str, str]]:
    """(host:port, flags) of each line of a CLUSTER NODES reply (`<id> <ip:port@bus> <flags> ...`)."""
    text = reply.decode() if isinstance(reply, bytes) else str(reply or "")
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and ":" in fields[1]:
            found.append((fields[1].split("@")[0].split(",")[0], fields[2]))
    return found


def _direct(seed: Any, host: str, port: int) -> Any:
    """Run one command on the node at host:port with the seed node's connection settings (credentials, TLS)."""
    pool = seed.redis_connection.connection_pool
    settings = {k: v for k, v in pool.connection_kwargs.items() if k != "redis_connect_func"}
    settings.update(host=host, port=port)

    def run(*args: Any) -> Any:
        connection = pool.connection_class(**settings)
        try:
            connection.send_command(*args)
            return connection.read_response()
        finally:
            connection.disconnect()

    return run


def _server_major(run: Any) -> int:
    """The major version of the Redis `run` talks to (INFO server's redis_version; 7 when it says none)."""
    try:
        info = run("INFO", "server")
    except redis.ResponseError:  # INFO refused to the operator's user: assume a current Redis
        return 7
    text = info.decode() if isinstance(info, bytes) else str(info)
    if isinstance(info, dict):
        text = f"redis_version:{info.get('redis_version', '')}"
    found = re.search(r"redis_version:(\d+)\.", text)
    return int(found.group(1)) if found else 7


def _refused(command: str, exc: redis.ResponseError) -> AclRefused:
    # NOPERM and "unknown command" texts name the command, never an argument; any other error of ACL SETUSER
    # may quote a rule (the password among them): not shown
    said = str(exc)
    plain = re.match(r"(?i)(this user has no permissions|unknown (sub)?command|NOPERM)", said)
    shown = said if plain else type(exc).__name__
    return AclRefused(f"Redis refused ACL {command} ({shown}): {ACL_FIX}", f"ACL {command}: {shown}")


def _is_current(found: Any, namespace: str, name: str, password: str) -> bool:
    """Whether ACL GETUSER's reply `found` is the topology's user as `topology_acl_rules` makes it."""
    if not found:
        return False
    reply = _decoded(found)
    flags = reply.get("flags") or []
    passwords = reply.get("passwords") or []
    keys = reply.get("keys") or ""
    pattern = f"~{glob_escape(topology_prefix(namespace, name))}*"
    digest = hashlib.sha256(password.encode()).hexdigest()
    keys_text = keys if isinstance(keys, str) else " ".join(keys)
    return "on" in flags and list(passwords) == [digest] and keys_text == pattern


def _decoded(value: Any) -> Any:
    """ACL GETUSER's reply (a flat list of names and values, bytes) as a dict of text."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, dict):
        return {_decoded(k): _decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_decoded(v) for v in value]
        if len(items) % 2 == 0 and all(isinstance(k, str) for k in items[::2]) and items and items[0] == "flags":
            return dict(zip(items[::2], items[1::2], strict=True))
        return items
    return value


def ensure_topology_user(
    client: redis.Redis, namespace: str, name: str, password: str, force: bool = False
) -> list[str]:
    """Make sure the topology's user exists as it must (on every node of a cluster): one ACL GETUSER per node,
    and ACL SETUSER where it is missing or differs (a Redis restarted without an ACL file lost it, another
    password or key pattern); with `force`, ACL SETUSER everywhere (the first time a process looks: rules of
    an older version are replaced; its clients stay connected). Returns the nodes where it was set (empty: it
    was there everywhere). Raises `AclRefused` when Redis refuses, a `redis.RedisError` (e.g.
    `ConnectionError`) when it cannot answer."""
    user = topology_user(namespace, name)
    set_on = []
    for node, run in _nodes(client):
        try:
            found = run("ACL", "GETUSER", user)
        except redis.ResponseError as exc:
            raise _refused("GETUSER", exc) from None
        if not force and _is_current(found, namespace, name, password):
            continue
        _set_user(run, namespace, name, password, _server_major(run))
        set_on.append(node)
    if set_on:
        log.info("Redis user %s set on %s", user, ", ".join(set_on))
    return set_on


def _set_user(run: Any, namespace: str, name: str, password: str, server_major: int) -> None:
    """ACL SETUSER the topology's user on one node, with the rules for its Redis version; `AclRefused` when
    the node refuses."""
    rules = topology_acl_rules(namespace, name, password, server_major)
    try:
        run("ACL", "SETUSER", topology_user(namespace, name), *rules)
    except redis.ResponseError as exc:
        raise _refused("SETUSER", exc) from None


def delete_topology_user(client: redis.Redis, namespace: str, name: str) -> None:
    """ACL DELUSER the topology's user on every node (which also disconnects its clients); none is fine."""
    user = topology_user(namespace, name)
    for _, run in _nodes(client):
        try:
            run("ACL", "DELUSER", user)
        except redis.ResponseError as exc:
            raise _refused("DELUSER", exc) from None


def restore_missing_users(client: redis.Redis, users: dict[tuple[str, str], str]) -> list[str]:
    """Set again, on every node, each of `users` ((namespace, name) -> password) that the node lacks: one ACL
    USERS per node however many users, ACL SETUSER only for a missing one. Returns "user on node" for each one
    set. Raises `AclRefused` or a `redis.RedisError` as `ensure_topology_user` does."""
    restored = []
    for node, run in _nodes(client):
        try:
            present = {_decoded(user) for user in run("ACL", "USERS") or []}
        except redis.ResponseError as exc:
            raise _refused("USERS", exc) from None
        missing = {key: password for key, password in users.items() if topology_user(*key) not in present}
        if not missing:
            continue
        server_major = _server_major(run)  # once per node, however many users it lost
        for (namespace, name), password in missing.items():
            _set_user(run, namespace, name, password, server_major)
            restored.append(f"{topology_user(namespace, name)} on {node}")
    if restored:
        log.info("Redis users set again (Redis had lost them): %s", ", ".join(restored))
    return restored


class UserKeeper:
    """Looks at the topology users it keeps every `every_s` seconds, all of them on one thread with one ACL USERS
    per node, and sets again those Redis lost: whatever the controllers are doing meanwhile (a migration or a
    checkpoint waiting for its workers' acks), workers locked out by a Redis restarted without an ACL file get
    back in within a tick. One keeper serves every topology of a process (the operator's thousand topologies
    cost one call per node per tick, not a thread and a call each). No error ends the thread. Redis away or
    ACL refused is logged at DEBUG (the reconcile passes report them) and the next tick tries again: that is
    when users are lost, and the keeper must look again as soon as Redis is back. Anything else (a bug, a reply
    nobody expected) is logged as a WARNING naming its type and where it was raised, never its text (which may
    quote a password), and backed off: each such failure in a row doubles the wait before the next look, up to
    `max_backoff_s`; the first look that does not fail so brings it back to `every_s`."""

    def __init__(self, client: redis.Redis, every_s: float = 2.0, max_backoff_s: float = 60.0) -> None:
        self.client = client
        self.every_s = every_s
        self.max_backoff_s = max(max_backoff_s, every_s)
        #: looks that failed with an unexpected error in a row (what the backoff counts), and every failed look
        #: since the keeper started (those of Redis away or ACL refused too)
        self.failures = 0
        self.failed_looks = 0
        self._users: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def keep(self, namespace: str, name: str, password: str) -> None:
        """Keep the user of NAMESPACE/NAME (from now on; the thread starts with the first user)."""
        with self._lock:
            self._users[(namespace, name)] = password
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="redis-user-keeper", daemon=True)
                self._thread.start()

    def forget(self, namespace: str, name: str) -> None:
        """Stop keeping the user of NAMESPACE/NAME (its workers are gone, or it is deleted)."""
        with self._lock:
            self._users.pop((namespace, name), None)

    def kept(self) -> dict[tuple[str, str], str]:
        with self._lock:
            return dict(self._users)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self._delay()):
            self.look()

    def _delay(self) -> float:
        """The wait before the next look: `every_s`, doubled by each unexpected failure in a row, at most
        `max_backoff_s`."""
        return min(self.every_s * 2.0 ** min(self.failures, 32), self.max_backoff_s)

    def look(self) -> bool:
        """One look at every kept user (what each tick of the thread does); never raises. False when it failed."""
        users = self.kept()
        if not users:
            return True
        try:
            restore_missing_users(self.client, users)
        except (AclRefused, redis.RedisError) as exc:  # their messages never hold a password
            self.failed_looks += 1
            self.failures = 0  # not a bug: looked at again next tick, as soon as Redis is back
            log.debug("Redis users not checked: %s", exc)
            return False
        except Exception as exc:  # a bug, or a reply nobody expected: said, backed off, and the keeper goes on
            self.failed_looks += 1
            self.failures += 1
            log.warning(
                "Redis users not checked: %s at %s (failure %d in a row; next look in %.0f s)",
                type(exc).__name__, _raised_at(exc), self.failures, self._delay(),
            )  # fmt: skip
            return False
        self.failures = 0
        return True


def _raised_at(exc: BaseException) -> str:
    """Where `exc` was raised (file:line of the innermost frame): enough to find the bug, and no part of its text
    or of any frame's variables, where a password could be."""
    tb = exc.__traceback__
    if tb is None:
        return "an unknown place"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"
