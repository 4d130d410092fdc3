"""Redis checkpoint store for migrations: the record, per-key-group state, captured events, source positions
and acks, under the topology's prefix.

Key layout (`P` = `elastream:{namespace/name}:`, braces included, `M` = `P + "mig:" + id`):

    P mig:current                the id of the migration in progress (absent when none)
    P ckpt:latest                hash: id, completedAt, schedule (JSON) of the last complete periodic checkpoint
    P positions                  hash: source executor -> its latest read position (published every interval)
    M                            hash: id, protocol, phase, old/new schedule (JSON), started_at, reason
    M :state:<vertex>            hash: key group -> state bytes (msgpack by the caller)
    M :pending:<vertex>:<kg>     list: captured events of one key group, in arrival order
    M :pending:<vertex>:any      list: captured events of shuffle/all/global inputs (no key group)
    M :position                  hash: source executor -> read position
    M :acks:<phase>              hash: executor -> ack info (JSON)
    M :saved:<executor>          the token of the executor's save (a retried save is applied once)

Writes are pipelined (one round trip per executor's checkpoint), every key gets a TTL so an abandoned
migration's keys expire, and `delete_migration` removes them when the migration is done. A periodic
checkpoint `ckpt-<n>` is stored like a migration `M` (state, position, acks; no pending events), so INIT
restores from either the same way; a completed CCR/DCR migration becomes the latest checkpoint.
`P txn:<id>` (a set) and `P txn:<id>:<sink executor>` (lists) hold the exactly-once sinks' events staged with
checkpoint or migration `<id>` until `complete_checkpoint` commits them; `P txn:open` (a sorted set, by when
they were staged) lists the transactions staged and not yet committed, so a round that was abandoned without
its abort reaching the sinks (the controller lost Redis) is committed with the next checkpoint instead of
being left to expire. Values are bytes: the store does not interpret events or state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from elastream.store.codec import as_bytes, text

DEFAULT_TTL_S = 24 * 3600
ANY = "any"

log = logging.getLogger("elastream.checkpoint")


#: moves every staging list of a transaction (KEYS[1], a set) into its stream: a list holds the stream name,
#: then id, key, value, ts per event (what `RedisStreamSink.pre_commit` writes)
_COMMIT_TRANSACTION = """
local moved = 0
for _, staging in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local items = redis.call('LRANGE', staging, 0, -1)
  local stream = items[1]
  for i = 2, #items, 4 do
    redis.call('XADD', stream, '*', 'id', items[i], 'key', items[i + 1], 'value', items[i + 2], 'ts', items[i + 3])
    moved = moved + 1
  end
  redis.call('DEL', staging)
end
redis.call('DEL', KEYS[1])
return moved
"""


def transaction_keys(prefix: str, txn_id: str, writer: str) -> tuple[str, str]:
    """(the staging list of one sink executor, the set of a transaction's staging lists)."""
    return f"{prefix}txn:{txn_id}:{writer}", f"{prefix}txn:{txn_id}"


def open_transactions_key(prefix: str) -> str:
    """The sorted set of the transactions staged and not committed yet (score: when they were staged)."""
    return f"{prefix}txn:open"


def read_state_and_positions(
    client: redis.Redis, base: str, vertices: Iterable[str]
) -> tuple[dict[str, dict[str, bytes]], dict[str, bytes]]:
    """The state ({vertex: {key group: bytes}}, vertices without state left out) and the sources' positions
    ({executor: bytes}) kept under `base` (`base:state:<vertex>`, `base:position`: a checkpoint's or a
    savepoint's layout), read in one pipelined round trip."""
    names = list(vertices)
    pipe = client.pipeline(transaction=False)
    for vertex in names:
        pipe.hgetall(f"{base}:state:{vertex}")
    pipe.hgetall(f"{base}:position")
    results = pipe.execute()
    state = {
        vertex: {text(k): as_bytes(v) for k, v in raw.items()}
        for vertex, raw in zip(names, results[:-1], strict=True)
        if raw
    }
    return state, {text(k): as_bytes(v) for k, v in results[-1].items()}


@dataclass(frozen=True)
class ExecutorCheckpoint:
    """What one executor persists at COMMIT."""

    executor: str
    vertex: str
    state: Mapping[int, bytes] = field(default_factory=dict)  # key group -> state
    pending: Mapping[str, Sequence[bytes]] = field(default_factory=dict)  # key group (str) or "any" -> events
    position: bytes | None = None  # a source's read position


class CheckpointStore:
    def __init__(self, client: redis.Redis, prefix: str, ttl_s: int = DEFAULT_TTL_S) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_s = ttl_s

    # ---- keys -------------------------------------------------------------------------------------------
    def _m(self, migration_id: str) -> str:
        return f"{self.prefix}mig:{migration_id}"

    @property
    def current_key(self) -> str:
        return f"{self.prefix}mig:current"

    # ---- the record -------------------------------------------------------------------------------------
    def begin(self, migration_id: str, record: Mapping[str, Any]) -> bool:
        """Claim the topology for this migration and write its record. False if another one is in progress."""
        if not self.client.set(self.current_key, migration_id, nx=True, ex=self.ttl_s):
            return False
        self.update_record(migration_id, record)
        return True

    def claim(self, checkpoint_id: str, ttl_s: int) -> bool:
        """Claim the topology for a periodic checkpoint (no record; a short TTL in case its controller dies)."""
        return bool(self.client.set(self.current_key, checkpoint_id, nx=True, ex=ttl_s))

    def release(self, owner_id: str) -> None:
        """Release the claim if `owner_id` holds it."""
        current = self.client.get(self.current_key)
        if current is not None and text(current) == owner_id:
            self.client.delete(self.current_key)

    def current(self) -> str | None:
        value = self.client.get(self.current_key)
        return None if value is None else text(value)

    def update_record(self, migration_id: str, fields: Mapping[str, Any]) -> None:
        key = self._m(migration_id)
        if not fields:
            fields = {"id": migration_id}
        encoded: dict[Any, Any] = {
            k: v if isinstance(v, str | bytes | int | float) else json.dumps(v) for k, v in fields.items()
        }
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping=encoded)
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def record(self, migration_id: str) -> dict[str, str]:
        raw = self.client.hgetall(self._m(migration_id))
        return {text(k): text(v) for k, v in raw.items()}

    # ---- checkpoints ------------------------------------------------------------------------------------
    def save(self, migration_id: str, checkpoint: ExecutorCheckpoint, token: str | None = None) -> None:
        """Persist one executor's state, captured events and position in a single pipelined round trip.

        With a `token` (the same on every retry of one save) the save is a transaction applied at most once:
        it records the token under `M:saved:<executor>` and a retry that finds it there writes nothing, so a
        reply lost to a Redis outage never appends the captured events twice."""
        m = self._m(migration_id)
        touched: list[str] = []

        def writes(pipe: Any) -> None:
            if checkpoint.state:
                key = f"{m}:state:{checkpoint.vertex}"
                pipe.hset(key, mapping={str(kg): blob for kg, blob in checkpoint.state.items()})
                touched.append(key)
            for group, events in checkpoint.pending.items():
                if events:
                    key = f"{m}:pending:{checkpoint.vertex}:{group}"
                    pipe.rpush(key, *events)
                    touched.append(key)
            if checkpoint.position is not None:
                key = f"{m}:position"
                pipe.hset(key, checkpoint.executor, checkpoint.position)
                touched.append(key)
            for key in touched:
                pipe.expire(key, self.ttl_s)

        if token is None:
            pipe = self.client.pipeline(transaction=False)
            writes(pipe)
            if touched:
                pipe.execute()
            return
        marker = f"{m}:saved:{checkpoint.executor}"
        while True:
            with self.client.pipeline(transaction=True) as watched:
                try:
                    watched.watch(marker)  # type: ignore[no-untyped-call]
                    applied = watched.get(marker)
                    if applied is not None and text(applied) == token:
                        return  # an earlier attempt of this save was applied (its reply was lost)
                    watched.multi()
                    touched.clear()
                    writes(watched)
                    if not touched:
                        return
                    watched.set(marker, token, ex=self.ttl_s)
                    watched.execute()
                    return
                except redis.WatchError:  # an earlier attempt landed meanwhile: look again
                    continue

    def load_state(self, migration_id: str, vertex: str, key_groups: Iterable[int]) -> dict[int, bytes]:
        groups = list(key_groups)
        if not groups:
            return {}
        values = self.client.hmget(f"{self._m(migration_id)}:state:{vertex}", [str(g) for g in groups])
        return {g: as_bytes(v) for g, v in zip(groups, values, strict=True) if v is not None}

    def load_pending(
        self, migration_id: str, vertex: str, key_groups: Iterable[int], index: int, parallelism: int
    ) -> list[bytes]:
        """The captured events the new executor `index` of `parallelism` must replay: those of its key groups
        (in key-group order, each group in arrival order) and every `parallelism`-th event of the shared
        list starting at `index`, so each event goes to exactly one new executor."""
        m = self._m(migration_id)
        pipe = self.client.pipeline(transaction=False)
        groups = list(key_groups)
        for group in groups:
            pipe.lrange(f"{m}:pending:{vertex}:{group}", 0, -1)
        pipe.lrange(f"{m}:pending:{vertex}:{ANY}", 0, -1)
        results = pipe.execute()
        events: list[bytes] = []
        for chunk in results[:-1]:
            events.extend(chunk)
        events.extend(results[-1][index::parallelism])
        return events

    def load_positions(self, migration_id: str) -> dict[str, bytes]:
        raw = self.client.hgetall(f"{self._m(migration_id)}:position")
        return {text(k): as_bytes(v) for k, v in raw.items()}

    def pending_count(self, migration_id: str) -> int:
        total = 0
        for key in self.client.scan_iter(match=f"{self._m(migration_id)}:pending:*", count=500):
            total += int(self.client.llen(key))
        return total

    # ---- periodic checkpoints ------------------------------------------------------------------------------
    @property
    def latest_key(self) -> str:
        return f"{self.prefix}ckpt:latest"

    def next_checkpoint_id(self) -> str:
        return f"ckpt-{int(self.client.incr(f'{self.prefix}ckpt:seq'))}"

    def complete_checkpoint(self, checkpoint_id: str, info: Mapping[str, Any]) -> str | None:
        """Make `checkpoint_id` the latest, commit the exactly-once sinks' events staged with it (in the same
        transaction: a reader sees them exactly when they can no longer be replayed) and delete the
        checkpoint it replaces (returned). A completed CCR or DCR migration is a checkpoint too.

        Transactions still open from earlier rounds are committed first, in the order they were staged: a
        sink stages what it processed between two of its barriers, so what it staged under an abandoned
        round whose abort it never got (or got before that round's late barrier) precedes, in its input,
        everything this checkpoint commits, and the sources' positions are past it. Left uncommitted, it
        was lost. (A sink that got the abort in time took its staging back: that transaction is empty.)"""
        previous = self.latest_checkpoint()
        index = open_transactions_key(self.prefix)
        open_ids = [text(m) for m in self.client.zrange(index, 0, -1)]  # type: ignore[arg-type]
        leftovers = [t for t in open_ids if t != checkpoint_id]
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.latest_key)
        pipe.hset(self.latest_key, mapping={"id": checkpoint_id, **{k: json.dumps(v) for k, v in info.items()}})
        for txn_id in [*leftovers, checkpoint_id]:
            # EVAL, not EVALSHA: inside MULTI a script the server does not know (a Redis Cluster's primary
            # that was a replica a moment ago, a restarted Redis) fails alone at EXEC while the rest applies;
            # redis-py loads scripts ahead only for a one-Redis pipeline (and its cluster pipeline has no
            # eval(): the command itself is queued)
            pipe.execute_command("EVAL", _COMMIT_TRANSACTION, 1, f"{self.prefix}txn:{txn_id}")  # type: ignore[no-untyped-call]
        pipe.zrem(index, checkpoint_id, *leftovers)
        results = pipe.execute()
        # the events each leftover moved (0: its sinks took their staging back with the abort)
        moved = {t: int(n) for t, n in zip(leftovers, results[2 : 2 + len(leftovers)], strict=True) if int(n)}
        if moved:
            log.warning(
                "checkpoint %s also committed the sink output staged under abandoned rounds whose abort did not "
                "reach every sink: %s",
                checkpoint_id,
                ", ".join(f"{t} ({n} events)" for t, n in moved.items()),
            )
        old = previous.get("id") if previous else None
        if old and old != checkpoint_id:
            self.delete_migration(old)
        return old

    def discard_transactions(self) -> int:
        """Drop every staged, uncommitted sink transaction (a rollback replays what they held)."""
        keys = list(self.client.scan_iter(match=f"{self.prefix}txn:*", count=1000))
        return int(self.client.unlink(*keys)) if keys else 0

    def latest_checkpoint(self) -> dict[str, Any] | None:
        """{"id", and the info given at completion (decoded)} of the last complete checkpoint, or None."""
        raw = self.client.hgetall(self.latest_key)
        if not raw:
            return None
        fields = {text(k): text(v) for k, v in raw.items()}
        return {k: (v if k == "id" else json.loads(v)) for k, v in fields.items()}

    def publish_positions(self, positions: Mapping[str, bytes]) -> None:
        if positions:
            mapping: dict[Any, Any] = dict(positions)
            self.client.hset(f"{self.prefix}positions", mapping=mapping)

    def source_positions(self) -> dict[str, bytes]:
        raw = self.client.hgetall(f"{self.prefix}positions")
        return {text(k): as_bytes(v) for k, v in raw.items()}

    def clear_source_positions(self) -> None:
        self.client.delete(f"{self.prefix}positions")

    # ---- export and import (savepoints) -------------------------------------------------------------------
    def export_checkpoint(
        self, checkpoint_id: str, vertices: Iterable[str]
    ) -> tuple[dict[str, dict[str, bytes]], dict[str, bytes]]:
        """A completed checkpoint's state ({vertex: {key group: bytes}}, vertices without state left out) and
        its sources' positions ({executor: bytes}), read in one pipelined round trip."""
        return read_state_and_positions(self.client, self._m(checkpoint_id), vertices)

    def import_checkpoint(
        self, checkpoint_id: str, state: Mapping[str, Mapping[str, bytes]], positions: Mapping[str, bytes]
    ) -> None:
        """Write a checkpoint's state and positions as `checkpoint_id` (what `export_checkpoint` read, e.g. of a
        savepoint), in one transaction; `complete_checkpoint` then makes it the latest."""
        m = self._m(checkpoint_id)
        pipe = self.client.pipeline(transaction=True)
        for vertex, groups in state.items():
            if groups:
                key = f"{m}:state:{vertex}"
                pipe.delete(key)
                pipe.hset(key, mapping=dict[Any, Any](groups))
                pipe.expire(key, self.ttl_s)
        pipe.delete(f"{m}:position")
        if positions:
            pipe.hset(f"{m}:position", mapping=dict[Any, Any](positions))
            pipe.expire(f"{m}:position", self.ttl_s)
        pipe.execute()

    # ---- acks -------------------------------------------------------------------------------------------
    def ack(self, migration_id: str, phase: str, executor: str, info: Mapping[str, Any] | None = None) -> None:
        key = f"{self._m(migration_id)}:acks:{phase}"
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(key, executor, json.dumps(dict(info or {})))
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def acks(self, migration_id: str, phase: str) -> dict[str, dict[str, Any]]:
        raw = self.client.hgetall(f"{self._m(migration_id)}:acks:{phase}")
        return {text(k): json.loads(text(v)) for k, v in raw.items()}

    # ---- cleanup ----------------------------------------------------------------------------------------
    def delete_migration(self, migration_id: str) -> int:
        """Remove every key of the migration and release the topology; returns how many keys went."""
        m = self._m(migration_id)
        keys = [m, *self.client.scan_iter(match=f"{m}:*", count=1000)]
        removed = int(self.client.unlink(*keys)) if keys else 0
        current = self.client.get(self.current_key)
        if current is not None and text(current) == migration_id:
            self.client.delete(self.current_key)
        return removed
