"""The built-in sinks: `null`, `log`, and `redis-stream`, the transactional Redis sink (at-least-once batches
written once by a token-guarded MULTI/EXEC transaction, or exactly-once through a two-phase commit with the
checkpoints). Nothing here runs a script: a topology's Redis user may not (`core.acl`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from elastream.runtime.operators.api import Context, Emit, EmitEvent
from elastream.runtime.operators.cpu import Cost
from elastream.runtime.operators.outbox import StagedOutput
from elastream.runtime.operators.streams import RedisStreamEnd
from elastream.store.cluster import slot_mate
from elastream.store.once import apply_once
from elastream.store.retry import retry_redis


class NullSink:
    """`sink: {type: "null"}` — counts and drops (with an optional `costMs`)."""

    def open(self, context: Context) -> None:
        self.cost = Cost(context.config, context.node_cpu)

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        cost = self.cost
        if cost.per_event_s > 0.0:
            for _ in events:
                cost.charge()

    def close(self) -> None:
        self.cost.pay()


class LogSink(NullSink):
    """`sink: {type: log}` — prints every `every`-th event (default 1) to the worker's stdout."""

    def open(self, context: Context) -> None:
        super().open(context)
        self.name = f"{context.vertex}#{context.index}"
        self.every = int(context.config.get("every", 1))
        self.seen = 0

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        self.seen += 1
        if self.seen % self.every == 0:
            print(f"{self.name}: id={event[0]} key={event[1]!r} value={event[2]!r}", flush=True)

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        for event in events:
            self.process(event, emit)


def xadd_batch_once(
    client: Any,
    stream: str,
    token_key: str,
    token: str,
    entries: list[Any],
    maxlen: int,
    token_ttl_s: int,
    retry: bool = True,
) -> int:
    """Append `entries` (id, key, value, ts) to `stream` unless `token` is already recorded under `token_key`, and
    record it, in one MULTI/EXEC transaction (`store.once.apply_once`): all the entries land or none, and a
    repeat with the same token (a retry after a lost reply) writes nothing. Returns the entries appended (0 for
    a repeat). `retry` False says that no attempt with this token was ever sent (its first): the token cannot
    be there, and the read is saved. `stream` and `token_key` must share a hash slot (`slot_mate`) on a Redis
    Cluster."""
    fields = [{"id": e[0], "key": str(e[1]), "value": str(e[2]), "ts": repr(e[3])} for e in entries]

    def appends(pipe: Any) -> bool:
        for entry in fields:
            if maxlen > 0:
                pipe.xadd(stream, entry, maxlen=maxlen, approximate=True)
            else:
                pipe.xadd(stream, entry)
        return True

    return len(fields) if apply_once(client, token_key, token, token_ttl_s, appends, look_first=retry) else 0


class RedisStreamSink(RedisStreamEnd):
    """`sink: {type: redis-stream, stream: NAME, delivery: at-least-once | exactly-once}` — appends events
    (fields id, key, value, ts) to the Redis stream `<prefix>sink:<NAME>` (`core.topology.stream_key`; NAME
    defaults to the vertex's name): under the topology's prefix, so also in its hash slot on a Redis Cluster.

    `at-least-once` (the default) writes every processed batch at once: the lowest latency, and CCR and DCR
    migrations never duplicate anything, but after a rollback to a checkpoint (a worker died, or the
    `restart` protocol) the events replayed since that checkpoint reach the stream a second time. A batch is
    written by one MULTI/EXEC transaction that also records the batch's token under a key of this executor
    (`xadd_batch_once`), so it lands all or nothing, and a retry after a lost reply (Redis stopped after
    applying it) writes nothing. While
    Redis is away (refused, timed out, LOADING after a restart) every write waits it out and is retried, never
    skipped (the executor holds its batch and its inputs back-pressure); it gives up only when the executor
    stops.

    `exactly-once` is a two-phase commit, as Flink's transactional sinks do it: processed events stay in the
    executor until its next checkpoint (a periodic one or a migration's COMMIT), which stages them in Redis
    (`pre_commit`); the controller moves every staged event of a checkpoint into the streams in one atomic
    script, in the same transaction that makes it the latest checkpoint. A rollback discards what was not
    committed, so a reader never sees an event twice; the price is up to one checkpoint interval
    (`spec.scaling.checkpointIntervalSeconds`) of extra latency and the buffered events in memory."""

    batched = True
    #: how long a writer's last token is remembered (a retry comes within seconds)
    TOKEN_TTL_S = 3600

    def open(self, context: Context) -> None:
        self.open_stream(context, "sink")
        self.maxlen = int(context.config.get("maxLen") or 0)
        self.exactly_once = context.config.get("delivery", "at-least-once") == "exactly-once"
        self.cost = Cost(context.config, context.node_cpu)
        self.buffer: list[Any] = []
        self.writer = f"{context.vertex}#{context.index}"
        self.what = f"sink {self.writer}: cannot write stream {self.stream}"
        # in the stream's hash slot (the topology's: the stream is under its prefix), which the transaction
        # writes with the stream and an exactly-once commit with the checkpoint, on one shard of a Redis Cluster
        self.token_key = slot_mate(self.stream, f":writer:{self.writer}")
        self.staging = StagedOutput(self.client, self.prefix, self.writer, self.stream, self.what, self.stop)

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        self.buffer.append(event)

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        if self.cost.per_event_s <= 0.0:
            self.buffer += events
            return
        charge, append = self.cost.charge, self.buffer.append
        for event in events:
            charge()
            append(event)

    def flush(self) -> None:
        if not self.buffer or self.exactly_once:  # exactly-once: written when a checkpoint commits
            return
        token = uuid.uuid4().hex  # the same token on every retry of this batch
        batch, attempts = self.buffer, [0]

        def write() -> int:
            attempts[0] += 1  # from the second on, an earlier attempt may have been applied
            return xadd_batch_once(
                self.client, self.stream, self.token_key, token, batch, self.maxlen, self.TOKEN_TTL_S, attempts[0] > 1
            )

        retry_redis(write, self.what, self.stop)
        self.buffer = []

    def pre_commit(self, txn_id: str) -> None:
        """Stage the events processed since the last checkpoint under transaction `txn_id` (the checkpoint's
        or migration's id); the controller commits them with it."""
        if self.exactly_once and self.buffer:
            self.staging.stage(txn_id, self.buffer)
            self.buffer = []

    def hand_over(self) -> list[Any]:
        """The events processed and not yet staged, taken out (exactly-once; at-least-once wrote them): a
        partial migration carries them to this sink's new instance, which commits them with its next
        checkpoint."""
        if not self.exactly_once:
            return []
        events, self.buffer = self.buffer, []
        return events

    def abort_commit(self, txn_id: str) -> None:
        """The checkpoint or migration `txn_id` was abandoned and this executor goes on: take the staged
        events back, ahead of what was processed since (they are committed with the next checkpoint)."""
        if self.exactly_once:
            self.buffer = self.staging.take_back(txn_id) + self.buffer

    def close(self) -> None:
        # exactly-once: what was not staged belongs to no checkpoint; a restore replays it
        self.flush()
        self.cost.pay()
        self.client.close()
