"""Redis store of savepoints: retained copies of completed checkpoints, outside every topology's working keys.

Key layout (`S` = `elastream:savepoint:{namespace/topology}:`, the braces the Redis Cluster hash tag of the
topology that took them, so its savepoints live on the shard of its own keys):

    S index                      set: the names of the topology's complete savepoints
    S <name>:meta                hash: `core.savepoints.SavepointMeta.to_redis()`; written last
    S <name>:state:<vertex>      hash: key group -> state bytes (as the checkpoint held them)
    S <name>:position            hash: source executor -> read position

No key has a TTL: a savepoint stays until it is deleted (`delete`). A savepoint is complete when its meta
and its index entry exist; both are written after its state and positions, in one transaction, so a copy
cut short (the operator stopped, Redis went away) is never listed nor restored, and the next take of that
name removes what it left. `S` never starts with a topology's prefix (`elastream:{`), so a topology's Redis
user (its ACL patterns are its prefix) cannot read or write any savepoint, its own included: only the
operator's connection copies them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis

from elastream.core.savepoints import SavepointMeta
from elastream.core.topology import glob_escape
from elastream.store.checkpoint import read_state_and_positions
from elastream.store.codec import text

log = logging.getLogger("elastream.savepoint")


def savepoints_prefix(namespace: str, topology: str) -> str:
    return f"elastream:savepoint:{{{namespace}/{topology}}}:"


class SavepointStore:
    def __init__(self, client: redis.Redis, namespace: str, topology: str) -> None:
        self.client = client
        self.namespace = namespace
        self.topology = topology
        self.prefix = savepoints_prefix(namespace, topology)

    @property
    def index_key(self) -> str:
        return f"{self.prefix}index"

    def _s(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def names(self) -> list[str]:
        return sorted(text(n) for n in self.client.smembers(self.index_key))

    def meta(self, name: str) -> SavepointMeta | None:
        """The savepoint's meta; None if there is no complete savepoint of that name."""
        raw = self.client.hgetall(f"{self._s(name)}:meta")
        if not raw:
            return None
        return SavepointMeta.from_redis({text(k): text(v) for k, v in raw.items()})

    def list(self) -> list[SavepointMeta]:
        """Every complete savepoint of the topology (read from Redis: the status is rebuilt from it)."""
        found = []
        for name in self.names():
            meta = self.meta(name)
            if meta is not None:
                found.append(meta)
        return found

    def save(
        self, meta: SavepointMeta, state: Mapping[str, Mapping[str, bytes]], positions: Mapping[str, bytes]
    ) -> None:
        """Write a savepoint: what a cut-short earlier copy of this name left goes first, then its state and
        positions, then (in the same transaction) its meta and its index entry."""
        self._remove_keys(meta.name)
        s = self._s(meta.name)
        pipe = self.client.pipeline(transaction=True)
        for vertex, groups in state.items():
            if groups:
                pipe.hset(f"{s}:state:{vertex}", mapping=dict(groups))  # type: ignore[arg-type]
        if positions:
            pipe.hset(f"{s}:position", mapping=dict(positions))  # type: ignore[arg-type]
        pipe.hset(f"{s}:meta", mapping=meta.to_redis())  # type: ignore[arg-type]
        pipe.sadd(self.index_key, meta.name)
        pipe.execute()

    def load(self, name: str) -> tuple[SavepointMeta, dict[str, dict[str, bytes]], dict[str, bytes]] | None:
        """A complete savepoint: its meta, state ({vertex: {key group: bytes}}) and positions; None if absent."""
        meta = self.meta(name)
        if meta is None:
            return None
        state, positions = read_state_and_positions(self.client, self._s(name), sorted(meta.vertices))
        return meta, state, positions

    def delete(self, name: str) -> bool:
        """Remove a savepoint (unlisted first, so it is never seen half deleted); False if there was none."""
        existed = bool(self.client.srem(self.index_key, name)) or self.client.exists(f"{self._s(name)}:meta") > 0
        self._remove_keys(name)
        return existed

    def _remove_keys(self, name: str) -> int:
        s = self._s(name)
        self.client.srem(self.index_key, name)
        self.client.delete(f"{s}:meta")  # unlisted before its state goes
        keys = list(self.client.scan_iter(match=f"{glob_escape(s)}:*", count=1000))
        return int(self.client.unlink(*keys)) if keys else 0
