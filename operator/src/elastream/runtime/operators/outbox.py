"""Exactly-once output in two phases, for any sink whose system can write a batch and a marker atomically: the
kafka sink's, and a user sink's (`OutboxTarget`, the operator API's two-phase sink).

1. Pre-commit: each sink executor stages its output in Redis with every checkpoint and migration
   (`StagedOutput`), and takes it back when the round is abandoned (abort). The controller's completion moves
   what a checkpoint staged into the sink vertex's outbox stream (`<prefix>outbox:<vertex>`) in the same
   transaction that makes the checkpoint the latest: output is committed exactly when its checkpoint is.
2. Commit: one `OutboxPublisher` per sink vertex (a thread of executor 0, which every parallelism has) forwards
   the outbox to the target in batches. Each batch is written with its marker, the id of its last outbox
   entry, atomically (`OutboxTarget.write`); a publisher that starts (after a crash, a migration of executor
   0, a restart) asks the target for its marker first (`OutboxTarget.start`) and resumes after it, so a batch
   the target has is never written again and one it does not have is written again in full. Entries up to
   the marker are trimmed from the outbox. Nothing is held open across a checkpoint, so nothing is lost with
   a worker, and the executors a rescale removes own nothing that must be finished.

`StagedOutput` is also the Redis sink's first phase (its completion writes its stream directly).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from elastream.core.topology import stream_key
from elastream.store.checkpoint_store import open_transactions_key, transaction_keys
from elastream.store.codec import text
from elastream.store.retry import RedisAttempt, RetryLater, backoff, retry_redis

log = logging.getLogger("elastream.worker")

#: staged sink events of a checkpoint that never completes expire after this
STAGED_TTL_S = 24 * 3600


class StagedOutput:
    """The first phase of an exactly-once sink's two-phase commit, in Redis: one sink executor's output of a
    checkpoint or migration, staged under its transaction id (`store.checkpoint_store.transaction_keys`) for the
    controller's completion to commit into `target` (a redis-stream sink's stream, an outbox), or taken back
    when the round is abandoned. Every call waits out a Redis outage (`retry_redis`) until `stop` is set; a
    repeated call after a lost reply changes nothing.

    Events are staged as text: (id, key, value, ts) with key and value as `str` makes them (a sink whose values
    are not text encodes them before they are staged)."""

    def __init__(self, client: Any, prefix: str, writer: str, target: str, what: str, stop: Any) -> None:
        self.client, self.prefix, self.writer, self.target = client, prefix, writer, target
        self.what, self.stop = what, stop

    def stage(self, txn_id: str, events: list[Any]) -> None:
        """Stage `events` under `txn_id` in one MULTI/EXEC (a retry replaces what an earlier attempt staged)."""
        staging, members = transaction_keys(self.prefix, txn_id, self.writer)
        items: list[Any] = [self.target]
        for event in events:
            items += [event[0], str(event[1]), str(event[2]), repr(event[3])]
        index = open_transactions_key(self.prefix)

        def stage() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(staging)
            pipe.rpush(staging, *items)
            pipe.sadd(members, staging)
            pipe.zadd(index, {txn_id: time.time()}, nx=True)  # the first sink's staging time orders it
            pipe.expire(staging, STAGED_TTL_S)
            pipe.expire(members, STAGED_TTL_S)
            pipe.expire(index, STAGED_TTL_S)
            pipe.execute()

        retry_redis(stage, self.what, self.stop)

    def take_back(self, txn_id: str) -> list[Any]:
        """The events staged under `txn_id` (abandoned), removed from Redis: read, then delete, so each step
        may be repeated after a lost reply without losing them."""
        staging, members = transaction_keys(self.prefix, txn_id, self.writer)

        def drop() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(staging)
            pipe.srem(members, staging)
            pipe.execute()

        items = retry_redis(lambda: list(self.client.lrange(staging, 1, -1)), self.what, self.stop)
        events = [
            (text(items[i]), text(items[i + 1]), text(items[i + 2]), float(text(items[i + 3])))
            for i in range(0, len(items), 4)
        ]
        retry_redis(drop, self.what, self.stop)
        return events


class OutboxEntry(NamedTuple):
    """One committed output event as the outbox holds it: its event id, key and value as text, and its ts."""

    id: str
    key: str
    value: str
    ts: float


class OutboxTarget(Protocol):
    """Where a publisher writes an outbox: a system that can store a batch and its marker atomically. Its
    methods are called on the publisher's thread, one session at a time; an exception ends the session (it is
    logged as the sink's problem, and a new session starts over with `start` after a backoff)."""

    def start(self) -> str:
        """Begin a session: fence any earlier writer if the system can, and return the marker the system has
        (the outbox entry id of the last batch written, "0-0" for none)."""
        ...

    def write(self, marker: str, entries: list[OutboxEntry]) -> None:
        """Write `entries` and `marker` (the last entry's id) so that both are stored or neither is."""
        ...

    def stop(self) -> None:
        """End the session (release clients); called after `start`, however the session ended."""
        ...


class PublisherFenced(Exception):
    """The target says a newer publisher of this sink took over (a new executor 0 started before this one
    stopped): this one stops for good rather than fence it back."""


class OutboxPublisher(threading.Thread):
    """Forwards a sink vertex's outbox to its `OutboxTarget` exactly once (see the module): a daemon thread of
    the sink's executor 0. Every wait is bounded and retried until `close`; a session that fails ends, and the
    next one starts over from the target's marker."""

    #: outbox entries per batch
    BATCH = 5000
    #: how long `close` waits for the batch being written to end (a target's call is bounded by its own timeouts)
    STOP_S = 60.0
    #: how long one read of the outbox waits for entries (a `close` is noticed within it)
    READ_BLOCK_MS = 50

    def __init__(
        self, client_factory: Callable[[], Any], outbox: str, target: Callable[[], OutboxTarget], name: str, what: str
    ) -> None:
        super().__init__(name=f"publisher {name}", daemon=True)
        self.client_factory, self.outbox, self.target, self.label, self.what = (
            client_factory,
            outbox,
            target,
            name,
            what,
        )
        #: set by `close`: stop once the batch being written (if any) is written
        self.halt = threading.Event()
        #: the outbox entry id through which the target has the output (its marker), "0-0" before the first
        self.published = "0-0"
        #: entries this publisher wrote to the target
        self.messages = 0
        #: sessions that failed (each starts over from the marker: what was not written is written again)
        self.retries = 0
        #: why the last session failed ("" once a batch got through again)
        self.problem = ""
        self.lock = threading.Lock()

    def run(self) -> None:
        redis_client = self.client_factory()
        pause = RetryLater(lambda: backoff(0.2, 2.0, 5.0))
        try:
            while not self.halt.is_set():
                try:
                    if self._session(redis_client):
                        return  # closed
                except PublisherFenced as exc:
                    log.info("sink %s: %s; this publisher stops", self.label, exc)
                    return
                except Exception as exc:  # the target's (a user's) exceptions too: the session starts over
                    self._problem(f"{self.what} failed, starting over from its marker: {type(exc).__name__}: {exc}")
                    self.retries += 1
                    pause.failed(time.monotonic())
                    while not pause.due(time.monotonic()) and not self.halt.is_set():
                        self.halt.wait(0.05)
        finally:
            redis_client.close()

    def _session(self, redis_client: Any) -> bool:
        """One session of the target: its marker, then batches, until `close`. True when it ends so."""
        target = self.target()
        try:
            cursor = target.start()
            with self.lock:
                self.published = cursor
            self._trim(redis_client, cursor)
            while not self.halt.is_set():
                items: list[Any] = []
                with RedisAttempt(f"sink {self.label}: cannot read its outbox") as attempt:
                    read = redis_client.xread({self.outbox: cursor}, count=self.BATCH, block=self.READ_BLOCK_MS) or []
                    items = [item for _, found in read for item in found]
                if attempt.failure is not None:
                    self.halt.wait(0.5)
                    continue
                if not items:
                    continue
                last = text(items[-1][0])
                target.write(last, [_entry(fields) for _, fields in items])
                cursor = last
                with self.lock:
                    self.published = last
                    self.messages += len(items)
                if self.problem:
                    log.info("sink %s: %s again", self.label, self.what.replace("publishing", "publishes"))
                    self.problem = ""
                self._trim(redis_client, last)
            return True
        finally:
            target.stop()

    def _trim(self, redis_client: Any, through: str) -> None:
        """Drop the outbox entries the target has (up to and including `through`); a trim lost to an outage is
        made by the next one."""
        if through == "0-0":
            return
        ms, seq = (int(part) for part in through.split("-"))
        with RedisAttempt(f"sink {self.label}: cannot trim its outbox"):
            redis_client.xtrim(self.outbox, minid=f"{ms}-{seq + 1}", approximate=False)

    def _problem(self, problem: str) -> None:
        if problem != self.problem:
            log.warning("sink %s: %s", self.label, problem)
        self.problem = problem

    def close(self) -> None:
        """Stop once the batch being written is written (never in the middle of one: a target without fencing
        must not see two publishers at once). What the outbox still holds is published by the next executor 0
        (after a migration, a restore or a resume): not draining it here keeps a migration's pause short."""
        self.halt.set()
        self.join(self.STOP_S)


class OutboxOutput:
    """An exactly-once outbox sink executor's part (the kafka sink's, a user's two-phase sink's): its staging
    and, on executor 0, the vertex's publisher to `target`. The sink keeps its output since the last
    checkpoint and hands it to `stage` at each checkpoint."""

    def __init__(
        self,
        client_factory: Callable[[], Any],
        prefix: str,
        context: Any,
        target: Callable[[], OutboxTarget],
        what: str,
    ) -> None:
        self.name = f"{context.vertex}#{context.index}"
        self.client = client_factory()
        outbox = stream_key(prefix, "outbox", context.vertex)
        where = f"sink {self.name}: cannot stage its output"
        self.staging = StagedOutput(self.client, prefix, self.name, outbox, where, context.stop)
        self.publisher: OutboxPublisher | None = None
        if context.index == 0:
            self.publisher = OutboxPublisher(client_factory, outbox, target, self.name, what)
            self.publisher.start()

    def stage(self, txn_id: str, events: list[Any]) -> None:
        if events:
            self.staging.stage(txn_id, events)

    def take_back(self, txn_id: str) -> list[Any]:
        return self.staging.take_back(txn_id)

    @property
    def problem(self) -> str:
        return self.publisher.problem if self.publisher is not None else ""

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        self.client.close()


def _entry(fields: Any) -> OutboxEntry:
    decoded = {text(k): text(v) for k, v in fields.items()}
    try:
        ts = float(decoded.get("ts", "0"))
    except ValueError:
        ts = 0.0
    return OutboxEntry(decoded.get("id", ""), decoded.get("key", ""), decoded.get("value", ""), ts)


def encode_value(value: Any) -> str:
    """An output value as staged text: a text as it is, anything else as JSON (what JSON cannot take, as its
    text)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str, separators=(",", ":"))
