"""Redis checkpoint store for migrations: the record, per-key-group state, captured events, source positions
and acks, under the topology's prefix.

Key layout (`P` = `elastream:{namespace/name}:`, braces included, `M` = `P + "mig:" + id`):

    P mig:current                the id of the migration in progress (absent when none)
    P ckpt:latest                hash: id, completedAt, schedule, contents (JSON) of the last complete checkpoint
    P ckpt:durable               the last checkpoint a durable-commit wait was made for (`DurableCommits`)
    P positions                  hash: source executor -> its latest read position (published every interval)
    P lag                        hash: kafka source executor -> its consumer lag per partition (every interval)
    M                            hash: id, protocol, phase, old/new schedule (JSON), started_at, reason
    M :state:<vertex>            hash: key group -> state bytes (msgpack by the caller)
    M :pending:<vertex>:<kg>     list: captured events of one key group, in arrival order
    M :pending:<vertex>:any      list: captured events of shuffle/all/global inputs (no key group)
    M :position                  hash: source executor -> read position
    M :acks:<phase>              hash: executor -> ack info (JSON)
    M :saved:<executor>          the token of the executor's save (a retried save is applied once)

Writes are pipelined (one round trip per executor's checkpoint), every key gets a TTL so an abandoned
migration's keys expire (until a completion makes them the latest checkpoint's: see below), and
`delete_migration` removes them when the migration is done. A periodic
checkpoint `ckpt-<n>` is stored like a migration `M` (state, position, acks; no pending events), so INIT
restores from either the same way; a completed CCR/DCR migration becomes the latest checkpoint.
`P txn:<id>` (a set) and `P txn:<id>:<sink executor>` (lists) hold the exactly-once sinks' events staged with
checkpoint or migration `<id>` until `complete_checkpoint` commits them; `P txn:open` (a sorted set, by when
they were staged) lists the transactions staged and not yet committed, so a round that was abandoned without
its abort reaching the sinks (the controller lost Redis) is committed with the next checkpoint instead of
being left to expire. Values are bytes: the store does not interpret events or state.

Every key the commit touches is derived by the operator, never read out of what the tenant's workers wrote:
the transaction ids of `P txn:open` are taken only in the shapes the
operator itself makes (`ckpt-<n>`, a migration's 12 hex digits), the staging lists are named from the
topology's spec (`P txn:<id>:<v>#<i>` for every exactly-once redis-stream, kafka or user sink `v` and every `i`
below its maxParallelism, so executors a rescale removed are covered) and each list's events go to `v`'s own stream
(`core.topology.stream_key`), whatever stream name the list begins with; the commit also refuses any key
outside the prefix. The set `P txn:<id>` is deleted by name, never read. Where the topology has a Redis user
of its own (`commit_as`), the whole completion runs as that user, the commit as a Redis Function the operator
loads (`store.commit_function`), so Redis' ACLs hold every key of it to the topology's too; otherwise (no
topology users, a Redis before 7.0) it runs on the operator's connection, the commit by EVAL.

The completion that makes a checkpoint the latest removes the TTL of every key of it (`PERSIST`, in the
same transaction), records what it holds (`contents`: the vertices with state, the number of source
positions and of captured-event lists) and deletes the one it replaces, so the latest checkpoint never
expires: a topology suspended for days, or whose later rounds keep failing, still restores from it, and
`missing_state` tells a restore when its keys are gone (deleted by hand, a partial restore of Redis) rather
than letting it start from empty state.

`DurableCommits` (the `ELASTREAM_DURABLE_COMMITS*` settings) makes a completion wait until Redis has written
the commit to its append-only file (`WAITAOF`, Redis 7.2 and later; before 7.2 `WAIT` for replicas): see
docs/rescaling.md ("How durable a commit is") for the guarantee with and without it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from elastream.core.ports import StateLost
from elastream.core.topology import glob_escape, stream_key
from elastream.store.cluster import is_cluster
from elastream.store.codec import as_bytes, text
from elastream.store.commit_function import COMMIT_FUNCTION, COMMIT_SCRIPT, ensure_library
from elastream.store.once import apply_once

if TYPE_CHECKING:
    from elastream.core.topology import Topology

DEFAULT_TTL_S = 24 * 3600
#: how long the sources' published partition lags live unless refreshed (a few metric intervals)
LAG_TTL_S = 60
#: the largest packed partition lag of one executor the operator reads (about 2,000 partitions)
MAX_LAG_BYTES = 16384
ANY = "any"

log = logging.getLogger("elastream.checkpoint")


#: the transaction ids the operator makes: a periodic checkpoint's `ckpt-<n>` (`next_checkpoint_id`, an INCR)
#: and a migration's 12 lower-case hex digits (`control.migration.MigrationDriver.migrate`); an id of any
#: other shape in `P txn:open` was not staged by a sink of this operator and is dropped
TRANSACTION_ID = re.compile(r"ckpt-[1-9][0-9]{0,18}|[0-9a-f]{12}")
#: the most abandoned transactions one completion commits besides its own (oldest first; more wait for the
#: next completion): a real backlog is one or two rounds whose abort never reached the sinks
MAX_LEFTOVERS = 16


def is_transaction_id(value: str) -> bool:
    """Whether `value` has the shape of a transaction id this operator makes (see `TRANSACTION_ID`)."""
    return TRANSACTION_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class ExactlyOnceSink:
    """An exactly-once redis-stream, kafka or user sink as the commit sees it: all derived from the spec."""

    vertex: str
    #: its stream's key (`core.topology.stream_key`: under the topology's prefix); a kafka sink's outbox
    stream: str
    #: its executors are `vertex#0` .. `vertex#<max_parallelism - 1>` at most, whatever rescales did
    max_parallelism: int


@dataclass(frozen=True)
class CheckpointScope:
    """What a checkpoint's completion and restore touch of a topology, derived from its spec (never read from
    Redis): its vertices (whose state a checkpoint may hold) and its exactly-once sinks (whose staged output
    it commits)."""

    vertices: tuple[str, ...] = ()
    sinks: tuple[ExactlyOnceSink, ...] = ()

    @classmethod
    def of(cls, topology: Topology) -> CheckpointScope:
        prefix = topology.redis_prefix
        sinks = []
        for name in topology.order:
            vertex = topology.vertices[name]
            config = vertex.config
            if vertex.kind != "sink" or config.get("delivery", "at-least-once") != "exactly-once":
                continue
            # the stream the sink's own `open` names: a redis-stream sink's stream; a kafka or user sink's outbox
            # (`runtime.operators.outbox`: its publisher forwards what the commit put there to its system)
            if config.get("type") == "redis-stream":
                stream = stream_key(prefix, "sink", str(config.get("stream", name)))
            elif config.get("type") == "kafka" or "module" in config:
                stream = stream_key(prefix, "outbox", name)
            else:
                continue
            sinks.append(ExactlyOnceSink(name, stream, vertex.max_parallelism))
        return cls(tuple(topology.order), tuple(sinks))


@dataclass(frozen=True)
class DurableCommits:
    """Whether a completed checkpoint waits until its commit is on disk before it counts as taken: the one
    settings object of these environment variables (read once, where a controller is built).

    - `ELASTREAM_DURABLE_COMMITS`: `off` (the default) or `on`. On, each completion runs
      `WAITAOF 1 <replicas> <timeout>` on the connection of the Redis node that holds the topology's keys
      (Redis 7.2 and later; Redis must run with `appendonly yes`), so the commit is fsynced to the primary's
      append-only file (and that many replicas'); Redis before 7.2 has no WAITAOF, so it falls back to
      `WAIT <max(replicas, 1)> <timeout>`: the commit reached that many replicas (in memory: no fsync).
      A wait that times out or is refused makes the round failed (the commit is visible, the checkpoint is
      the latest, but a suspend or a savepoint waiting for it tries again), never a silent success.
    - `ELASTREAM_DURABLE_COMMITS_REPLICAS`: replicas that must confirm too (default 0).
    - `ELASTREAM_DURABLE_COMMITS_TIMEOUT_MS`: how long a completion waits (default 1000, at least 1).

    Off, a committed checkpoint is as durable as Redis' own `appendfsync` makes it: with the default
    `everysec`, a Redis crash (not a clean restart) may lose up to about a second of committed output, and a
    restore after it replays that second from the previous checkpoint (so exactly-once holds only as far as
    `appendfsync` does)."""

    enabled: bool = False
    replicas: int = 0
    timeout_ms: int = 1000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DurableCommits:
        env = os.environ if environ is None else environ
        raw = env.get("ELASTREAM_DURABLE_COMMITS", "off").strip().lower()
        if raw not in ("on", "off", "true", "false", "1", "0", ""):
            raise ValueError(f"ELASTREAM_DURABLE_COMMITS={raw[:40]!r}: use on or off")
        numbers = {}
        for name, default, least in (("REPLICAS", 0, 0), ("TIMEOUT_MS", 1000, 1)):
            value = env.get(f"ELASTREAM_DURABLE_COMMITS_{name}", "").strip() or str(default)
            if not value.isdigit() or int(value) < least:
                raise ValueError(
                    f"ELASTREAM_DURABLE_COMMITS_{name}={value[:40]!r}: use a whole number of at least {least}"
                )
            numbers[name] = int(value)
        return cls(raw in ("on", "true", "1"), numbers["REPLICAS"], numbers["TIMEOUT_MS"])


@dataclass(frozen=True)
class Completion:
    """What `complete_checkpoint` did: the checkpoint it replaced (deleted), and why its commit is not known
    to be durable ("" when it is, or when `DurableCommits` is off)."""

    replaced: str | None = None
    not_durable: str = ""


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
    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        ttl_s: int = DEFAULT_TTL_S,
        durability: DurableCommits | None = None,
        commit_as: Callable[[], redis.Redis | None] | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.durability = durability or DurableCommits()
        #: a connection logged in as the topology's own Redis user (None while its password is not known):
        #: a completion runs on it, so Redis' ACLs hold its keys to the topology's (`store.commit_function`)
        self.commit_as = commit_as
        #: whether the server knows WAITAOF (None: not asked yet)
        self._waitaof: bool | None = None
        #: False once the server said it has no functions (before 7.0): the commit goes by EVAL
        self._functions = True

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

        def writes_once(pipe: Any) -> bool:
            touched.clear()
            writes(pipe)
            return bool(touched)

        apply_once(self.client, f"{m}:saved:{checkpoint.executor}", token, self.ttl_s, writes_once)

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

    def complete_checkpoint(self, checkpoint_id: str, info: Mapping[str, Any], scope: CheckpointScope) -> Completion:
        """Make `checkpoint_id` the latest, commit the exactly-once sinks' events staged with it (in the same
        transaction: a reader sees them exactly when they can no longer be replayed), remove the TTL of its
        keys and record what it holds (same transaction), then delete the checkpoint it replaces. A completed
        CCR or DCR migration is a checkpoint too. `scope` (`CheckpointScope.of(topology)`) names every key
        the commit touches: nothing is read out of what the workers wrote.

        Transactions still open from earlier rounds are committed first, in the order they were staged: a
        sink stages what it processed between two of its barriers, so what it staged under an abandoned
        round whose abort it never got (or got before that round's late barrier) precedes, in its input,
        everything this checkpoint commits, and the sources' positions are past it. Left uncommitted, it
        was lost. (A sink that got the abort in time took its staging back: that transaction is empty.)
        Only ids in the operator's own shapes are taken from `P txn:open`; others are dropped from it."""
        previous = self.latest_checkpoint()
        index = open_transactions_key(self.prefix)
        leftovers, forged = self._leftovers(index, checkpoint_id)
        keys, contents = self._contents(checkpoint_id, scope.vertices, info)
        as_topology = self._topology_connection()
        pipe = (as_topology or self.client).pipeline(transaction=True)
        pipe.delete(self.latest_key)
        fields: dict[Any, Any] = {
            "id": checkpoint_id,
            **{k: json.dumps(v) for k, v in info.items()},
            "contents": json.dumps(contents),
        }
        pipe.hset(self.latest_key, mapping=fields)
        for key in keys:
            pipe.persist(key)
        for txn_id in [*leftovers, checkpoint_id]:
            # as the topology's user: FCALL of the function loaded ahead (`_topology_connection`). Otherwise
            # EVAL, not EVALSHA: inside MULTI a script the server does not know (a Redis Cluster's primary that
            # was a replica a moment ago, a restarted Redis) fails alone at EXEC while the rest applies;
            # redis-py loads scripts ahead only for a one-Redis pipeline (and its cluster pipeline has no
            # eval(): the command itself is queued). Every key shares the topology's hash tag: one slot.
            txn_keys, txn_args = self._commit_arguments(txn_id, scope.sinks)
            if as_topology is not None:
                pipe.execute_command("FCALL", COMMIT_FUNCTION, len(txn_keys), *txn_keys, *txn_args)  # type: ignore[no-untyped-call]
            else:
                pipe.execute_command("EVAL", COMMIT_SCRIPT, len(txn_keys), *txn_keys, *txn_args)  # type: ignore[no-untyped-call]
        pipe.zrem(index, checkpoint_id, *leftovers, *forged)
        # applied whole (MULTI); a commit that failed (a sink's stream made into another type) must not keep
        # the replaced checkpoint from being deleted
        results = pipe.execute(raise_on_error=False)
        first = 2 + len(keys)
        commits = results[first : first + len(leftovers) + 1]
        for txn_id, result in zip([*leftovers, checkpoint_id], commits, strict=True):
            if isinstance(result, Exception):
                log.error(
                    "checkpoint %s: the sink output staged under %s was not committed: %s",
                    checkpoint_id,
                    txn_id,
                    result,
                )
        failed = [r for r in [*results[:first], *results[first + len(commits) :]] if isinstance(r, Exception)]
        if failed:
            raise failed[0]
        # the events each leftover moved (0: its sinks took their staging back with the abort)
        moved = {t: int(n) for t, n in zip(leftovers, commits, strict=False) if not isinstance(n, Exception) and int(n)}
        if moved:
            log.warning(
                "checkpoint %s also committed the sink output staged under abandoned rounds whose abort did not "
                "reach every sink: %s",
                checkpoint_id,
                ", ".join(f"{t} ({n} events)" for t, n in moved.items()),
            )
        old = previous.get("id") if previous else None
        if previous and old and old != checkpoint_id:
            self._delete_replaced(previous, scope.vertices)
        return Completion(old, self._await_durable(checkpoint_id))

    def _topology_connection(self) -> redis.Redis | None:
        """The topology's own user's connection for a completion, the commit function loaded where the
        topology's keys are (`store.commit_function.ensure_library`); None (the operator's connection, the
        commit by EVAL) without a user for the topology, before its password is known, or on a Redis with
        no functions (before 7.0) or whose FUNCTION the operator's own user may not run."""
        if self.commit_as is None or not self._functions:
            return None
        connection = self.commit_as()
        if connection is None:
            return None
        try:
            self._functions = ensure_library(self._node_client(self.latest_key))
        except redis.ResponseError as exc:  # the operator's own user may not run FUNCTION
            log.warning("%s: the commit function cannot be loaded (%s); commits run as the operator", self.prefix, exc)
            self._functions = False
        else:
            if not self._functions:
                log.warning("%s: commits run on the operator's connection (no Redis Functions)", self.prefix)
        return connection if self._functions else None

    def _leftovers(self, index: str, checkpoint_id: str) -> tuple[list[str], list[str]]:
        """The abandoned transactions of `P txn:open` to commit before `checkpoint_id` (oldest first, at most
        `MAX_LEFTOVERS`), and the members that are no transaction of this operator (dropped, logged)."""
        members = [text(m) for m in self.client.zrange(index, 0, MAX_LEFTOVERS + 64)]  # type: ignore[arg-type]
        forged = [t for t in members if t != checkpoint_id and not is_transaction_id(t)]
        if forged:
            log.warning(
                "%s: %d entries of %s are no transaction id of this operator; dropped: %s",
                self.prefix,
                len(forged),
                index,
                ", ".join(repr(t[:40]) for t in forged[:5]),
            )
        leftovers = [t for t in members if t != checkpoint_id and is_transaction_id(t)]
        return leftovers[:MAX_LEFTOVERS], forged

    def _commit_arguments(self, txn_id: str, sinks: Sequence[ExactlyOnceSink]) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the commit (`store.commit_function`) for `txn_id`: computed from the prefix and the spec."""
        keys = [f"{self.prefix}txn:{txn_id}"]
        args: list[Any] = [self.prefix]
        for sink in sinks:
            keys.append(sink.stream)
            keys += [
                transaction_keys(self.prefix, txn_id, f"{sink.vertex}#{i}")[0] for i in range(sink.max_parallelism)
            ]
            args.append(sink.max_parallelism)
        return keys, args

    def _contents(
        self, checkpoint_id: str, vertices: Sequence[str], info: Mapping[str, Any]
    ) -> tuple[list[str], dict[str, Any]]:
        """Every key of the checkpoint (to PERSIST) and what it holds (recorded with it, checked by a restore):
        the vertices with state, the number of source positions and of captured-event lists.

        A periodic round's (`ckpt-<n>`, also a seeded savepoint's) keys are named, not searched: its record-less
        layout has state per vertex, positions, acks and each executor's save marker (the executors of the
        schedule in `info`), and no captured events; a completed migration's captured-event lists are found
        by a SCAN of its own keys (`M:*`, as `delete_migration` finds them: rare, not every interval)."""
        m = self._m(checkpoint_id)
        pipe = self.client.pipeline(transaction=False)
        for vertex in vertices:
            pipe.exists(f"{m}:state:{vertex}")
        pipe.hlen(f"{m}:position")
        found = pipe.execute()
        state = [v for v, there in zip(vertices, found[: len(vertices)], strict=True) if there]
        positions = int(found[-1])
        if checkpoint_id.startswith("ckpt-"):
            return self._periodic_keys(checkpoint_id, vertices, info), {
                "state": state,
                "positions": positions,
                "pending": 0,
            }
        keys = {text(k) for k in self.client.scan_iter(match=f"{glob_escape(m)}:*", count=1000)} | {m}
        pending = sum(1 for k in keys if k.startswith(f"{m}:pending:"))
        return sorted(keys), {"state": state, "positions": positions, "pending": pending}

    def _periodic_keys(self, checkpoint_id: str, vertices: Iterable[str], info: Mapping[str, Any]) -> list[str]:
        """The keys a periodic round `checkpoint_id` may have: named from the vertices and the executors of the
        schedule in `info` (its completion's record)."""
        m = self._m(checkpoint_id)
        schedule = info.get("schedule")
        placement = schedule.get("placement") if isinstance(schedule, Mapping) else None
        executors = {str(e) for group in placement.values() for e in group} if isinstance(placement, Mapping) else set()
        keys = {
            m,
            *(f"{m}:state:{v}" for v in vertices),
            f"{m}:position",
            f"{m}:acks:checkpointing",
            *(f"{m}:saved:{e}" for e in executors),
        }
        return sorted(keys)

    def _delete_replaced(self, previous: Mapping[str, Any], vertices: Iterable[str]) -> None:
        """Delete the checkpoint the latest replaced: a periodic round's keys by name (the vertices it recorded
        state for, and today's), anything else (a migration, a record from before `contents`) as
        `delete_migration` finds them."""
        old = str(previous["id"])
        contents = previous.get("contents")
        if not old.startswith("ckpt-") or not isinstance(contents, Mapping):
            self.delete_migration(old)
            return
        recorded = [str(v) for v in contents.get("state") or []]
        self.client.unlink(*self._periodic_keys(old, [*recorded, *vertices], previous))
        current = self.client.get(self.current_key)
        if current is not None and text(current) == old:
            self.client.delete(self.current_key)

    def missing_state(self, checkpoint: Mapping[str, Any], vertices: Iterable[str]) -> str | None:
        """Why the checkpoint `checkpoint` (`latest_checkpoint()`) cannot be restored: what it held when it
        completed (its `contents`) is no longer all there. None when it is. A checkpoint completed before
        `contents` was recorded is taken as lost only when none of its state and positions is left."""
        checkpoint_id = str(checkpoint["id"])
        m = self._m(checkpoint_id)
        contents = checkpoint.get("contents")
        if not isinstance(contents, Mapping):
            names = list(vertices)
            pipe = self.client.pipeline(transaction=False)
            for vertex in names:
                pipe.exists(f"{m}:state:{vertex}")
            pipe.exists(f"{m}:position")
            pipe.exists(f"{m}:acks:checkpointing")
            pipe.exists(m)
            if any(pipe.execute()):
                return None
            return self._lost(checkpoint_id, "none of its state, positions or acks is left")
        state = [str(v) for v in contents.get("state") or []]
        pipe = self.client.pipeline(transaction=False)
        for vertex in state:
            pipe.exists(f"{m}:state:{vertex}")
        pipe.hlen(f"{m}:position")
        found = pipe.execute()
        problems = []
        gone = [v for v, there in zip(state, found[:-1], strict=True) if not there]
        if gone:
            problems.append(f"the state of {', '.join(gone)} is gone")
        positions = int(contents.get("positions") or 0)
        if int(found[-1]) < positions:
            problems.append(f"{positions - int(found[-1])} of its {positions} source positions are gone")
        pending = int(contents.get("pending") or 0)
        if pending:
            left = sum(1 for _ in self.client.scan_iter(match=f"{glob_escape(m)}:pending:*", count=1000))
            if left < pending:
                problems.append(f"{pending - left} of its {pending} lists of captured events are gone")
        return self._lost(checkpoint_id, "; ".join(problems)) if problems else None

    def _lost(self, checkpoint_id: str, what: str) -> str:
        return (
            f"checkpoint {checkpoint_id}, the latest, no longer holds what it held when it completed ({what}): its "
            "keys were deleted, or Redis was restored without them; nothing restarts from it, since empty state "
            "and sources from their beginning would duplicate or lose output. Restore them, or annotate the "
            "topology elastream.dev/restart-from-scratch=true to start over from the sources' beginning"
        )

    def ensure_restorable(self, checkpoint: Mapping[str, Any], vertices: Iterable[str]) -> None:
        """Raise `StateLost` when `missing_state` finds something missing."""
        problem = self.missing_state(checkpoint, vertices)
        if problem is not None:
            raise StateLost(problem)

    def _await_durable(self, checkpoint_id: str) -> str:
        """With `DurableCommits` on: wait until the commit just made is on disk (WAITAOF) or at enough replicas
        (WAIT, before Redis 7.2); "" when it is (or the setting is off), else why not. The wait runs on one
        connection to the node holding the topology's keys, right after a write of its own on that same
        connection (`P ckpt:durable`): WAITAOF and WAIT wait for a connection's own writes, and Redis writes
        and replicates its commands in order, so that write's offset covers the commit."""
        settings = self.durability
        if not settings.enabled:
            return ""
        marker = f"{self.prefix}ckpt:durable"
        try:
            node = self._node_client(marker)
            if self._waitaof is not False:
                pipe = node.pipeline(transaction=False)
                pipe.set(marker, checkpoint_id)
                pipe.execute_command("WAITAOF", 1, settings.replicas, settings.timeout_ms)
                reply = pipe.execute(raise_on_error=False)[-1]
                if isinstance(reply, redis.ResponseError) and "unknown command" in str(reply).lower():
                    self._waitaof = False
                    log.warning("Redis has no WAITAOF (before 7.2): durable commits wait for replicas (WAIT)")
                elif isinstance(reply, Exception):
                    return f"WAITAOF refused: {reply}"
                else:
                    self._waitaof = True
                    local, replicas = (int(n) for n in reply)
                    if local >= 1 and replicas >= settings.replicas:
                        return ""
                    return (
                        f"the commit of {checkpoint_id} was not confirmed on disk within {settings.timeout_ms} ms "
                        f"(WAITAOF: fsynced locally {local}, by {replicas} of {settings.replicas} replicas)"
                    )
            wanted = max(settings.replicas, 1)
            pipe = node.pipeline(transaction=False)
            pipe.set(marker, checkpoint_id)
            pipe.execute_command("WAIT", wanted, settings.timeout_ms)
            acked = int(pipe.execute()[-1])
            if acked >= wanted:
                return ""
            return (
                f"the commit of {checkpoint_id} reached {acked} of {wanted} replicas within {settings.timeout_ms} ms "
                "(WAIT: this Redis is before 7.2, so it has no WAITAOF and only replicas can confirm a commit)"
            )
        except redis.RedisError as exc:
            return f"the durability of the commit of {checkpoint_id} could not be confirmed: {exc}"

    def _node_client(self, key: str) -> Any:
        """A client of the one Redis node that holds `key` (the client itself on a single Redis)."""
        if not is_cluster(self.client):
            return self.client
        cluster = self.client.cluster()  # type: ignore[call-arg]
        return cluster.get_redis_connection(cluster.get_node_from_key(key))

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

    def publish_partition_lag(self, lags: Mapping[str, bytes]) -> None:
        """Each kafka source executor's consumer lag per partition (packed {partition: messages}), beside the
        positions; it expires unless refreshed, so a source that stopped leaves none behind for long."""
        if lags:
            key = f"{self.prefix}lag"
            pipe = self.client.pipeline(transaction=False)
            mapping: dict[Any, Any] = dict(lags)
            pipe.hset(key, mapping=mapping)
            pipe.expire(key, LAG_TTL_S)
            pipe.execute()

    def partition_lag(self, executors: Iterable[str]) -> dict[str, bytes]:
        """The packed lags `publish_partition_lag` wrote for `executors` (named by the caller: HMGET, never the
        whole hash a tenant's workers could grow), values over `MAX_LAG_BYTES` left out."""
        names = list(executors)
        if not names:
            return {}
        values = self.client.hmget(f"{self.prefix}lag", names)
        return {
            name: as_bytes(value)
            for name, value in zip(names, values, strict=True)
            if value is not None and len(value) <= MAX_LAG_BYTES
        }

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
