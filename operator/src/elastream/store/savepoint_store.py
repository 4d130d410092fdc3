"""Redis store of savepoints: retained copies of completed checkpoints, outside every topology's working keys.

Key layout (`S` = `elastream:savepoint:{namespace/topology}:`, the braces the Redis Cluster hash tag of the
topology that took them, so its savepoints live on the shard of its own keys):

    S index                      set: the names of the topology's complete savepoints
    S <name>:meta                hash: `core.savepoint_rules.SavepointMeta.to_redis()`; written last
    S <name>:state:<vertex>      hash: key group -> state bytes (as the checkpoint held them)
    S <name>:position            hash: source executor -> read position

No key has a TTL: a savepoint stays until it is deleted (`delete`). Its meta also records what it holds
(`contents`: the vertices with state and the number of source positions), and `load_data` refuses, as
`StateLost`, a savepoint whose keys no longer hold that (deleted by hand, a partial restore of Redis) rather
than seeding a topology with empty state. `meta` reads the meta alone, so a caller checks who may read a
savepoint before anything of its state is read. A savepoint is complete when its meta
and its index entry exist; both are written after its state and positions, in one transaction, so a copy
cut short (the operator stopped, Redis went away) is never listed nor restored, and the next take of that
name removes what it left. `S` never starts with a topology's prefix (`elastream:{`), so a topology's Redis
user (its ACL patterns are its prefix) cannot read or write any savepoint, its own included: only the
operator's connection copies them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import redis

from elastream.core.ports import StateLost
from elastream.core.savepoint_rules import SavepointMeta
from elastream.core.topology import glob_escape
from elastream.store.checkpoint_store import read_state_and_positions
from elastream.store.codec import text

log = logging.getLogger("elastream.savepoint")


#: the field of a savepoint's meta hash recording what it holds (besides `SavepointMeta.to_redis()`)
CONTENTS = "contents"


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
        contents = {"state": sorted(v for v, groups in state.items() if groups), "positions": len(positions)}
        fields: dict[Any, Any] = {**meta.to_redis(), CONTENTS: json.dumps(contents)}
        pipe.hset(f"{s}:meta", mapping=fields)
        pipe.sadd(self.index_key, meta.name)
        pipe.execute()

    def load(self, name: str) -> tuple[SavepointMeta, dict[str, dict[str, bytes]], dict[str, bytes]] | None:
        """A complete savepoint: its meta, state ({vertex: {key group: bytes}}) and positions; None if absent.
        Raises `StateLost` as `load_data` does. (A restore into another topology checks `meta` first.)"""
        meta = self.meta(name)
        if meta is None:
            return None
        state, positions = self.load_data(meta)
        return meta, state, positions

    def load_data(self, meta: SavepointMeta) -> tuple[dict[str, dict[str, bytes]], dict[str, bytes]]:
        """The state and positions of the savepoint `meta` (read with `meta`): raises `StateLost` when they
        are not what it held when it was taken (its `contents`; for a savepoint taken before those were
        recorded: no state at all although it had some)."""
        s = self._s(meta.name)
        state, positions = read_state_and_positions(self.client, s, sorted(meta.vertices))
        raw = self.client.hget(f"{s}:meta", CONTENTS)
        contents: Any = json.loads(text(raw)) if raw is not None else None
        problems = []
        if isinstance(contents, Mapping):
            gone = sorted(str(v) for v in contents.get("state") or [] if not state.get(str(v)))
            if gone:
                problems.append(f"the state of {', '.join(gone)} is gone")
            wanted = int(contents.get("positions") or 0)
            if len(positions) < wanted:
                problems.append(f"{wanted - len(positions)} of its {wanted} source positions are gone")
        elif meta.state_bytes > 0 and not state:
            problems.append("its state is gone")
        if problems:
            raise StateLost(
                f"savepoint {meta.name} of {meta.namespace}/{meta.topology} no longer holds what it held when it "
                f"was taken ({'; '.join(problems)}): nothing starts from it; take another one, or name another "
                "savepoint in spec.initialSavepoint"
            )
        return state, positions

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
