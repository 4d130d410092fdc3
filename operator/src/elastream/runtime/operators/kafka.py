"""The `kafka` source and sink (confluent-kafka, librdkafka in its wheel): reading a topic with partitions the
operator assigns, and writing one at-least-once or exactly once. docs/connectors.md is the user's guide; this
docstring is the design.

Source. A partition belongs to a lane, like a synthetic source's sequence numbers and a keyed vertex's keys:
partition p's lane is the radical inverse of p in base 2 scaled to the vertex's `maxParallelism`
(`partition_lane`), and the executor owning that key group reads it. So the first P partitions spread evenly
over any contiguous split of the lanes (8 partitions over 2 executors: 4 each; over 3: 3, 3, 2), a partition
keeps its lane when the topic gains partitions (each executor finds the new ones it owns when it next looks,
every `partitionDiscoverySeconds`, and reads them from their start), and a rescale moves partitions with
their key groups: the read offsets are the source's position (`{"kafka": topic, p: next offset}`), saved in
every checkpoint and migration and merged on INIT, never the consumer group's. No group membership, no
rebalancing: `assign`, not `subscribe`. An event's id is `(p << 40) | offset` (unique and the same on every
replay), its key the message key and its value the message value as UTF-8 text (`format: json` parses the
value), its ts the message's timestamp. It reads with `isolation.level=read_committed`. Its lag (the high
watermark minus the next offset, per partition) is what it reports as its queue, and what it reports as
offered is what it emitted plus that lag: the analysis and the autoscaler see the rate the topic fills at and
the backlog in it (AUTOSCALE's pending items, the Flink autoscaler's `pendingRecords`).

Sink, at-least-once: every executor writes its batches with an idempotent producer and waits for them to be
acknowledged before a checkpoint counts (`pre_commit` flushes), so a restore may write what follows the
checkpoint again, never lose it.

Sink, exactly-once. librdkafka cannot resume another producer's transaction (Flink's sink does, by producer id
and epoch), so a Kafka transaction held open across a checkpoint would be lost with its worker. Instead the
output goes through the transactional outbox of `runtime.operators.outbox` (staged with each checkpoint,
committed to the sink's outbox stream by the checkpoint's completion, forwarded by executor 0's publisher),
whose target here is `KafkaTarget`: transactional id `elastream.<namespace>.<name>.<vertex>`, each batch one
Kafka transaction that also commits, to the marker consumer group of the same name, the offset
`marker_offset(last entry id)` on the topic's partition 0 (`send_offsets_to_transaction`): the output and the
record of it become visible together or not at all.
A new publisher (after a crash, a migration of executor 0, a restart) first calls `init_transactions`, which
aborts whatever transaction its predecessor left open and fences it, then reads the marker (a
`read_committed` offset fetch waits for pending ones) and resumes after it: a batch committed to Kafka is
never written again, one not committed is written again in full. Entries up to the marker are trimmed from
the outbox. Executors a rescale removes own no transactional id, so none is left open to block
`read_committed` readers; a publisher fenced by a newer one stops (`PublisherFenced`) rather than fence it back.
Output reaches Kafka a publish after its checkpoint completes (milliseconds).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from elastream.core.schedule import key_group_ranges
from elastream.runtime.operators.api import Context, Emit, EmitEvent
from elastream.runtime.operators.cpu import Cost
from elastream.runtime.operators.outbox import OutboxEntry, OutboxOutput, PublisherFenced, encode_value
from elastream.store.codec import text
from elastream.store.retry import RetryLater, backoff
from elastream.worker_inputs.secrets import SecretUnavailable, secret_properties

log = logging.getLogger("elastream.worker")

#: the position's key naming the topic its offsets are of (the other keys are partition numbers)
TOPIC_MARK = "kafka"
#: an event id is `(partition << ID_PARTITION_SHIFT) | offset`: offsets below 2**40 (a trillion per partition)
ID_PARTITION_SHIFT = 40
#: the header that carries an event's id on a kafka sink's messages
ID_HEADER = "elastream-id"
#: client properties the connector sets itself (what its guarantees rest on): a Secret may not change them
RESERVED_PROPERTIES = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "isolation.level",
        "transactional.id",
        "enable.idempotence",
        "auto.offset.reset",
        "enable.partition.eof",
    }
)


class KafkaSettingsError(Exception):
    """A kafka connector's settings cannot make a client: the message names the Secret or property, never a
    value."""


def partition_lane(partition: int, lanes: int) -> int:
    """The lane (key group) of partition `partition` among `lanes`: the base-2 radical inverse of its number
    (0, 1/2, 1/4, 3/4, 1/8, ...) scaled to the lanes. Any P first partitions are spread evenly over contiguous
    key-group ranges, and a partition keeps its lane whatever partitions the topic gains."""
    inverse, weight, p = 0.0, 0.5, partition
    while p:
        if p & 1:
            inverse += weight
        p >>= 1
        weight /= 2
    return min(lanes - 1, int(inverse * lanes))


def topology_identity(prefix: str, vertex: str) -> str:
    """`elastream.<namespace>.<name>.<vertex>` from the topology's key prefix `elastream:{namespace/name}:`: the
    consumer group, transactional id and marker group of a connector (one per topology and vertex)."""
    inner = prefix.removeprefix("elastream:{").removesuffix("}:").replace("/", ".")
    return f"elastream.{inner}.{vertex}"


def client_properties(config: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """The librdkafka properties of a connector: its Secret's (`secretRef`), then `bootstrapServers`, then the
    connector's `own` (which nothing overrides). A Secret naming a property the connector sets is refused,
    naming the property, not its value."""
    properties: dict[str, Any] = {}
    ref = config.get("secretRef")
    if isinstance(ref, Mapping) and ref.get("name"):
        name = str(ref["name"])
        try:
            properties.update(secret_properties(name))
        except SecretUnavailable as exc:
            raise KafkaSettingsError(str(exc)) from None
        taken = sorted(RESERVED_PROPERTIES & set(properties))
        if taken:
            raise KafkaSettingsError(
                f"Secret {name!r} sets {', '.join(taken)}, which the kafka connector sets itself; remove "
                f"{'them' if len(taken) > 1 else 'it'} from the Secret"
            )
    properties["bootstrap.servers"] = str(config["bootstrapServers"])
    properties.update(own)
    return properties


class _Redact(logging.Filter):
    """Takes the values of a client's properties out of what librdkafka logs (its CONFWARN lines quote them,
    and one may be a password)."""

    def __init__(self, values: list[str]) -> None:
        super().__init__()
        self.values = sorted((v for v in values if len(v) >= 3), key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for value in self.values:
            message = message.replace(value, "<hidden>")
        record.msg, record.args = message, ()
        return True


def make_client(kind: type[Any], properties: Mapping[str, Any], what: str) -> Any:
    """A Consumer or Producer of `properties`, logging through `elastream.kafka` with every property's value
    hidden; a property librdkafka refuses is named, its value never (the library's message quotes it, and it
    may be a password)."""
    logger = logging.getLogger(f"elastream.kafka.{what}")
    logger.filters = [
        _Redact([str(v) for k, v in properties.items() if isinstance(v, str) and k != "bootstrap.servers"])
    ]
    try:
        return kind({**properties, "logger": logger})
    except (KafkaException, ValueError, TypeError) as exc:
        bad = [name for name in properties if f'"{name}"' in str(exc)]
        raise KafkaSettingsError(
            f"{what}: the Kafka client refused its settings"
            + (f" (property {', '.join(bad)})" if bad else "")
            + "; check the connector's options and its Secret's keys"
        ) from None


def _text(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None
    return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")


class KafkaSource:
    """`source: {type: kafka, topic, bootstrapServers, startFrom, format, secretRef}` (see the module)."""

    def __init__(self, prefix: str) -> None:
        #: the topology's key prefix: its identity in the default consumer group's name
        self.prefix = prefix

    #: how long one poll of the consumer waits for messages: not at all. librdkafka fetches in its own threads;
    #: a poll takes what they queued, and the source thread idles between empty polls outside its busy time (a
    #: poll that waited would count as busy, and an idle source would look saturated to the autoscaler)
    POLL_S = 0.0
    #: how often the lag is recomputed from the consumer's cached high watermarks
    LAG_EVERY_S = 1.0

    def open(self, context: Context) -> None:
        config = context.config
        self.context = context
        self.name = f"{context.vertex}#{context.index}"
        self.topic = str(config["topic"])
        self.json = config.get("format") == "json"
        self.latest = config.get("startFrom") == "latest"
        self.discover_every = float(config.get("partitionDiscoverySeconds") or 10.0)
        self.commit_offsets = config.get("commitOffsets") is True
        self.stride = context.max_parallelism
        lanes = context.key_groups or key_group_ranges(context.max_parallelism, context.parallelism)[context.index]
        self.lanes = set(lanes)
        self.cost = Cost(config, context.node_cpu)
        group = str(config.get("groupId") or topology_identity(self.prefix, context.vertex))
        self.consumer = make_client(
            Consumer,
            client_properties(
                config,
                {
                    "group.id": group,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "enable.partition.eof": False,
                    "error_cb": self._on_error,
                },
            ),
            f"source {self.name}",
        )
        #: per own partition known: the offset of its next message (OFFSET_BEGINNING: from its start)
        self.next: dict[int, int] = {}
        #: the partitions assigned to the consumer now
        self.assigned: set[int] = set()
        #: when to look for partitions again (now: at the first poll)
        self.discover_at = 0.0
        self.retry = RetryLater(lambda: backoff(0.2, 2.0, 5.0))
        self.emitted = 0
        self.lag: dict[int, int] = {}
        self.lag_at = 0.0
        self.closed = False
        #: the last problem the client or the topic reported (a text without secrets), for the worker's log
        self.problem = ""
        #: the client's last error callback (e.g. "SASL authentication error: ..."), the cause behind a failed call
        self.client_error = ""
        self.decode_errors = 0

    # -- the partitions this executor reads -------------------------------------------------------------------

    def own(self, partition: int) -> bool:
        return partition_lane(partition, self.stride) in self.lanes

    def _discover(self, now: float) -> None:
        """Look up the topic's partitions and assign the ones this executor owns and does not read yet."""
        self.discover_at = now + self.discover_every
        try:
            metadata = self.consumer.list_topics(self.topic, timeout=1.0)
        except KafkaException as exc:
            if not self.assigned:  # serves the client's error callback (an authentication failure says so
                self.consumer.poll(0)  # there only); nothing is assigned, so no message can be taken here
            said = exc.args[0].str() if exc.args else str(exc)
            cause = f"; the client says: {self.client_error}" if self.client_error else ""
            self._problem(f"cannot list topic {self.topic!r}: {said}{cause}")
            self.discover_at = now + 1.0
            return
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            error = topic.error.str() if topic is not None and topic.error is not None else "unknown topic"
            self._problem(f"topic {self.topic!r}: {error}")
            self.discover_at = now + 1.0
            return
        self._fine()
        mine = {p for p in topic.partitions if self.own(p)}
        new = mine - self.assigned
        if not new:
            return
        for p in sorted(new):
            if p not in self.next:
                self.next[p] = self._start_offset(p)
        self.assigned |= new
        self.consumer.assign([TopicPartition(self.topic, p, self.next[p]) for p in sorted(self.assigned)])
        log.info("source %s: reads partitions %s of topic %s", self.name, sorted(self.assigned), self.topic)

    def _start_offset(self, partition: int) -> int:
        """Where a partition without a position starts: its beginning, or (`startFrom: latest`, for the
        partitions there when the source first opened) its end now, as a number, so a checkpoint holds it."""
        if not self.latest or self.assigned or self.emitted:
            return OFFSET_BEGINNING  # a partition the topic gained: all of it is new
        try:
            _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=2.0)
            return int(high)
        except KafkaException:
            return OFFSET_BEGINNING

    # -- polling -------------------------------------------------------------------------------------------

    def poll_batch(self, now: float, emit_events: EmitEvent, budget: int) -> int:
        if now >= self.discover_at:
            self._discover(now)
        if not self.assigned or not self.retry.due(now):
            return self.offered(now)
        try:
            messages = self.consumer.consume(num_messages=max(1, budget), timeout=self.POLL_S)
        except KafkaException as exc:
            self._problem(f"cannot read topic {self.topic!r}: {exc}")
            self.retry.failed(now)
            return self.offered(now)
        self.retry.succeeded()
        events: list[Any] = []
        for message in messages:
            error = message.error()
            if error is not None:
                self._problem(f"topic {self.topic!r}: {error.str()}")
                continue
            p, offset = message.partition(), message.offset()
            if p not in self.assigned or 0 <= offset < self.next.get(p, 0):
                continue  # a message fetched before a seek moved the partition
            self.next[p] = offset + 1
            kind, millis = message.timestamp()
            events.append(
                (
                    (p << ID_PARTITION_SHIFT) | offset,
                    _text(message.key()),
                    self._value(message.value()),
                    millis / 1000.0 if kind != TIMESTAMP_NOT_AVAILABLE else now,
                )
            )
        if events:
            self._fine()
            self.cost.charge(len(events))
            self.emitted += len(events)
            emit_events(events)
        return self.offered(now)

    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        """`poll_batch` for a caller that takes events one at a time (the message timestamps are not kept)."""

        def emit_each(events: Any) -> None:
            for event in events:
                emit_new(event[0], event[1], event[2])

        return self.poll_batch(now, emit_each, budget)

    def _value(self, raw: bytes | None) -> Any:
        value = _text(raw)
        if not self.json or value is None:
            return value
        try:
            return json.loads(value)
        except ValueError:
            self.decode_errors += 1
            if self.decode_errors == 1 or self.decode_errors % 1000 == 0:
                log.warning("source %s: %d messages were not JSON; passed on as text", self.name, self.decode_errors)
            return value

    # -- what it reports -------------------------------------------------------------------------------------

    def backlog(self, now: float) -> int:
        """Messages in the own partitions not read yet (the consumer lag), recomputed every `LAG_EVERY_S`."""
        if now - self.lag_at >= self.LAG_EVERY_S and not self.closed:
            self.lag_at = now
            lag: dict[int, int] = {}
            for p in list(self.assigned):
                try:
                    low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                except (KafkaException, RuntimeError):  # RuntimeError: closed meanwhile (the metrics thread asks)
                    continue
                if high < 0:
                    continue
                nxt = self.next.get(p, OFFSET_BEGINNING)
                lag[p] = max(0, high - (nxt if nxt >= 0 else max(low, 0)))
            self.lag = lag
        return sum(self.lag.values())

    def offered(self, now: float) -> int:
        """What it emitted plus what waits in its partitions: the messages the topic offered it."""
        return self.emitted + self.backlog(now)

    def partition_lag(self) -> dict[int, int]:
        """The lag of each own partition at the last `backlog`."""
        return dict(self.lag)

    # -- position -------------------------------------------------------------------------------------------

    def position(self) -> Any:
        """{"kafka": topic, partition: next offset} for every own partition with a known offset; with
        `commitOffsets`, the offsets are also committed to the consumer group (for dashboards only)."""
        position: dict[Any, Any] = {TOPIC_MARK: self.topic}
        position.update({p: o for p, o in self.next.items() if o >= 0})
        if self.commit_offsets and len(position) > 1 and not self.closed:
            offsets = [TopicPartition(self.topic, p, o) for p, o in self.next.items() if o >= 0]
            try:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            except RuntimeError:  # closed meanwhile (a retiring worker asks for the last position)
                pass
            except KafkaException as exc:
                self._problem(f"cannot commit offsets of topic {self.topic!r}: {exc}")
        return position

    def seek(self, position: Any) -> None:
        """Take the offsets of the partitions this executor owns from `position` (every old executor's,
        merged). A position of another topic or shape is logged and ignored."""
        if not isinstance(position, Mapping) or text_of(position.get(TOPIC_MARK)) != self.topic:
            log.warning("source %s: ignoring a position that is not of topic %s", self.name, self.topic)
            return
        for key, value in position.items():
            if key == TOPIC_MARK:
                continue
            try:
                p, offset = int(key), int(value)
            except (TypeError, ValueError):
                continue
            if self.own(p) and offset >= 0:
                self.next[p] = offset
        if self.assigned:
            self.consumer.assign([TopicPartition(self.topic, p, self.next[p]) for p in sorted(self.assigned)])

    # -- problems -------------------------------------------------------------------------------------------

    def _on_error(self, error: KafkaError) -> None:
        self.client_error = error.str()
        self._problem(f"kafka client: {error.str()}")

    def _problem(self, problem: str) -> None:
        if problem != self.problem:
            log.warning("source %s: %s", self.name, problem)
        self.problem = problem

    def _fine(self) -> None:
        """The topic answered: whatever was wrong is over."""
        self.client_error = ""
        if self.problem:
            log.info("source %s: topic %s answers again", self.name, self.topic)
            self.problem = ""

    def close(self) -> None:
        self.closed = True  # the worker's metrics thread may still ask for the lag: it gets the last one
        self.cost.pay()
        self.consumer.close()


def text_of(value: Any) -> str | None:
    return text(value) if isinstance(value, bytes | str) else None


def marker_offset(entry_id: str) -> int:
    """The marker offset of outbox entry `entry_id` ("<ms>-<seq>"): `(ms << 20) | seq`, ordered as the ids are."""
    ms, seq = (int(part) for part in entry_id.split("-"))
    if seq >= 1 << 20:
        raise ValueError(f"outbox entry {entry_id}: sequence number over 2**20")
    return (ms << 20) | seq


def marker_entry(offset: int) -> str:
    """The outbox entry id a marker offset stands for ("0-0" for none)."""
    if offset < 0:
        return "0-0"
    return f"{offset >> 20}-{offset & ((1 << 20) - 1)}"


class KafkaSink:
    """`sink: {type: kafka, topic, bootstrapServers, delivery, secretRef}` (see the module)."""

    batched = True
    #: how long a flush before a checkpoint waits for the broker at a time (it waits again until it is done or
    #: the executor stops)
    FLUSH_WAIT_S = 5.0

    def __init__(self, client_factory: Callable[[], Any], prefix: str) -> None:
        self.client_factory = client_factory
        self.prefix = prefix

    def open(self, context: Context) -> None:
        config = context.config
        self.name = f"{context.vertex}#{context.index}"
        self.topic = str(config["topic"])
        self.exactly_once = config.get("delivery", "at-least-once") == "exactly-once"
        self.cost = Cost(config, context.node_cpu)
        self.stop = context.stop
        self.buffer: list[Any] = []
        self.failed: list[Any] = []
        self.own_problem = ""
        self.output: OutboxOutput | None = None
        if self.exactly_once:
            identity, topic, name = topology_identity(self.prefix, context.vertex), self.topic, self.name
            self.output = OutboxOutput(
                self.client_factory,
                self.prefix,
                context,
                lambda: KafkaTarget(config, topic, identity, name),
                f"publishing to topic {topic!r}",
            )
            return
        self.producer = make_client(
            Producer,
            client_properties(
                config,
                {"enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 300000, "error_cb": self._on_error},
            ),
            f"sink {self.name}",
        )

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        self.buffer.append((event[0], "" if event[1] is None else str(event[1]), encode_value(event[2]), event[3]))

    def process_batch(self, events: Iterator[Any], emit: EmitEvent) -> None:
        charge, append = self.cost.charge, self.buffer.append
        for e in events:
            charge()
            append((e[0], "" if e[1] is None else str(e[1]), encode_value(e[2]), e[3]))

    def flush(self) -> None:
        """At-least-once: hand the batch to the producer (it sends asynchronously); exactly-once: nothing, the
        batch waits for the next checkpoint."""
        if self.exactly_once:
            return
        batch, self.buffer = self.failed + self.buffer, []
        self.failed = []
        for i, (event_id, key, value, _) in enumerate(batch):
            try:
                self.producer.produce(
                    self.topic,
                    key=key.encode(),
                    value=value.encode(),
                    headers=[(ID_HEADER, str(event_id).encode())],
                    on_delivery=self._delivered,
                )
            except BufferError:  # the producer's queue is full: what is left waits for the next flush
                self.producer.poll(0.05)
                self.buffer = batch[i:] + self.buffer
                break
        self.producer.poll(0)

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            if self.own_problem:
                log.info("sink %s: topic %s takes messages again", self.name, self.topic)
                self.own_problem = ""
            return
        # not lost: produced again with the next flush (the broker or the topic may come back)
        self._problem(f"cannot write topic {self.topic!r}: {error.str()}")
        headers = dict(message.headers() or [])
        event_id = int(headers.get(ID_HEADER, b"0"))
        self.failed.append((event_id, _text(message.key()) or "", _text(message.value()) or "", time.time()))

    def pre_commit(self, txn_id: str) -> None:
        """Exactly-once: stage the output since the last checkpoint under `txn_id` (its completion moves it to
        the outbox). At-least-once: wait until everything produced so far is acknowledged, so the checkpoint
        never counts output the broker does not have."""
        if self.output is not None:
            self.output.stage(txn_id, self.buffer)
            self.buffer = []
            return
        while True:
            self.flush()
            left = self.producer.flush(self.FLUSH_WAIT_S)
            if left == 0 and not self.failed and not self.buffer:
                return
            if self.stop is not None and self.stop.is_set():
                return
            self._problem(f"waiting for topic {self.topic!r} to take {left + len(self.failed)} messages")

    def hand_over(self) -> list[Any]:
        if not self.exactly_once:
            return []
        events, self.buffer = self.buffer, []
        return events

    def abort_commit(self, txn_id: str) -> None:
        if self.output is not None:
            self.buffer = self.output.take_back(txn_id) + self.buffer

    def _on_error(self, error: KafkaError) -> None:
        self._problem(f"kafka client: {error.str()}")

    @property
    def problem(self) -> str:
        """What keeps this sink's output from Kafka now: its own (at-least-once) or its publisher's."""
        if self.output is not None and self.output.problem:
            return self.output.problem
        return self.own_problem

    def _problem(self, problem: str) -> None:
        if problem != self.own_problem:
            log.warning("sink %s: %s", self.name, problem)
        self.own_problem = problem

    def close(self) -> None:
        self.cost.pay()
        if self.output is not None:
            self.output.close()
            return
        self.flush()
        left = self.producer.flush(self.FLUSH_WAIT_S)
        if left:
            log.warning("sink %s: closed with %d messages not acknowledged by the broker", self.name, left)


#: the errors that say a newer producer with the same transactional id exists
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


def _fenced_or(exc: KafkaException) -> Exception:
    """`PublisherFenced` when `exc` says a newer publisher took the transactional id over, else `exc`."""
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError) and error.code() in _FENCED_CODES:
        return PublisherFenced(f"a newer publisher of this sink took over ({error.str()})")
    return exc


class KafkaTarget:
    """A kafka sink's outbox target (`outbox.OutboxTarget`): each batch one Kafka transaction of its messages and
    its marker, the offset `marker_offset(batch's last entry id)` committed to the marker group (the sink's
    identity) on the topic's partition 0 by `send_offsets_to_transaction`. `start` is a new producer's
    `init_transactions` (which aborts and fences whatever its predecessor left open) and a `read_committed`
    offset fetch of the marker (it waits for a pending one)."""

    #: how long one Kafka call may take before the session counts as failed
    CALL_TIMEOUT_S = 30.0

    def __init__(self, config: Mapping[str, Any], topic: str, identity: str, name: str) -> None:
        self.topic = topic
        self.producer = make_client(
            Producer,
            client_properties(
                config,
                {
                    "transactional.id": identity,
                    "enable.idempotence": True,
                    "transaction.timeout.ms": 30000,
                    "linger.ms": 5,
                },
            ),
            f"sink {name}",
        )
        self.consumer = make_client(
            Consumer,
            client_properties(
                config, {"group.id": identity, "enable.auto.commit": False, "isolation.level": "read_committed"}
            ),
            f"sink {name}",
        )

    def start(self) -> str:
        try:
            self.producer.init_transactions(self.CALL_TIMEOUT_S)
        except KafkaException as exc:
            raise _fenced_or(exc) from None
        committed = self.consumer.committed([TopicPartition(self.topic, 0)], timeout=self.CALL_TIMEOUT_S)[0]
        self.group = self.consumer.consumer_group_metadata()
        return marker_entry(committed.offset if committed.offset != OFFSET_INVALID else -1)

    def write(self, marker: str, entries: list[OutboxEntry]) -> None:
        producer = self.producer
        producer.begin_transaction()
        try:
            for entry in entries:
                while True:
                    try:
                        producer.produce(
                            self.topic, key=entry.key, value=entry.value, headers=[(ID_HEADER, entry.id.encode())]
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, 0, marker_offset(marker))], self.group, self.CALL_TIMEOUT_S
            )
            self._commit()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.txn_requires_abort():
                producer.abort_transaction(self.CALL_TIMEOUT_S)
            raise _fenced_or(exc) from None

    def _commit(self) -> None:
        """Commit, repeating a commit whose outcome the library says may be retried (bounded)."""
        for attempt in range(5):
            try:
                self.producer.commit_transaction(self.CALL_TIMEOUT_S)
                return
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not (isinstance(error, KafkaError) and error.retriable()) or attempt == 4:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        self.consumer.close()
        self.producer.flush(1.0)
