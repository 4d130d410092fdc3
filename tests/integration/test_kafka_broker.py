"""What the Kafka source and sink rely on, asserted against a real broker (Apache Kafka 4.x, one KRaft node, from
support.kafka_broker) with confluent_kafka:

- A transaction of 1,000 messages over a 4-partition topic is read back whole by a read_committed consumer with
  manual `assign` (no group membership).
- The checkpoint's offsets ride in the sink's transaction: `send_offsets_to_transaction` with the group metadata
  of a consumer that never joined its group (generation -1, no member id) is accepted, even an offset far past
  the partition's end ((ms << 20) | n, a checkpoint id rather than a position), and a fresh read_committed
  consumer of that group reads exactly that offset back; an aborted transaction's offset is never visible, and
  while a transaction holding offsets is open a read_committed `committed()` waits (it never sees a half state).
- Fencing: a second producer with the same transactional.id aborts the first one's open transaction at
  `init_transactions`; its messages are never seen, nor do they hold back a read_committed reader, and the
  first producer's next commit is a fatal "fenced" error.
- A broker stopped and started again (a controlled shutdown, then a crash) keeps its topics, messages and
  committed offsets.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from support.kafka_broker import KafkaBroker, unique_name
from support.kafka_fixtures import *  # noqa: F403 (kafka_broker, kafka_bootstrap, restartable_kafka)

pytestmark = pytest.mark.integration

#: a checkpoint's id as the sink would commit it: far past any partition's end offset
CHECKPOINT_OFFSET = (1_800_000_000_000 << 20) | 5


def producer(bootstrap: str, transactional_id: str, **settings: Any) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **settings})
    p.init_transactions(60)  # the first one waits for the transaction-state topic's coordinator to load
    return p


def consumer(bootstrap: str, group: str, isolation: str = "read_committed", **settings: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **settings,
        }
    )


def read_visible(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0) -> list[tuple[int, bytes]]:
    """Every message a read_committed consumer sees in `topic`, up to each partition's end (its last stable
    offset), as (partition, value) in the order read; assigned by hand from the beginning, never joining."""
    c = consumer(bootstrap, unique_name("reader"))
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        seen: list[tuple[int, bytes]] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"read {len(seen)}, partitions at their end: {sorted(at_end)}"
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
            elif err is not None:
                raise KafkaException(err)
            else:
                value = msg.value()
                assert value is not None
                seen.append((msg.partition(), value))
                at_end.discard(msg.partition())
        return seen
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str, partition: int = 0, timeout_s: float = 30.0) -> int:
    """The offset `group` has committed for `topic`/`partition`, as a fresh read_committed consumer of the group
    reads it (it asks for stable offsets only) without subscribing."""
    c = consumer(bootstrap, group)
    try:
        (tp,) = c.committed([TopicPartition(topic, partition)], timeout=timeout_s)
        assert tp.error is None, tp.error
        return int(tp.offset)
    finally:
        c.close()


def never_joined(bootstrap: str) -> tuple[str, Any]:
    """A new group id and the group metadata of a consumer of it that never subscribed nor joined (generation
    -1, no member id), as a sink that assigns its partitions by hand has it. The metadata is a serialized copy:
    it outlives the consumer."""
    group = unique_name("group")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return group, c.consumer_group_metadata()
    finally:
        c.close()


def test_one_transaction_of_1000_messages_over_4_partitions_is_read_back_whole(
    kafka_broker: KafkaBroker, kafka_bootstrap: str
) -> None:
    topic = unique_name("txn-1000")
    kafka_broker.create_topic(topic, partitions=4)
    p = producer(kafka_bootstrap, unique_name("txn"))
    p.begin_transaction()
    for i in range(1000):
        p.produce(topic, key=str(i).encode(), value=f"m-{i:04d}".encode(), partition=i % 4)
    p.commit_transaction(60)

    seen = read_visible(kafka_bootstrap, topic, partitions=4)

    assert sorted(v for _, v in seen) == [f"m-{i:04d}".encode() for i in range(1000)]
    for partition in range(4):  # each partition holds its quarter, in the order produced
        values = [v for p_, v in seen if p_ == partition]
        assert values == [f"m-{i:04d}".encode() for i in range(partition, 1000, 4)]


def test_offsets_sent_in_a_transaction_for_a_group_that_never_joined_are_read_back_exactly(
    kafka_broker: KafkaBroker, kafka_bootstrap: str
) -> None:
    """THE design question: can the sink commit a checkpoint id as the group's offset inside its transaction,
    with the metadata of a consumer that never joined the group (generation -1)? Yes, on Kafka 4.1."""
    group, metadata = never_joined(kafka_bootstrap)
    topic = unique_name("ckpt")
    kafka_broker.create_topic(topic, partitions=1)
    p = producer(kafka_bootstrap, unique_name("sink"))

    # committed: the exact offset, though it is far past the partition's end (10 messages)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"a-{i}".encode(), partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, CHECKPOINT_OFFSET)], metadata, 30)
    p.commit_transaction(30)
    assert committed(kafka_bootstrap, group, topic) == CHECKPOINT_OFFSET

    # open: a read_committed reader of the offsets waits (the broker answers "unstable offset" until the
    # transaction ends), while a read_uncommitted one sees the last committed value
    p.begin_transaction()
    p.produce(topic, value=b"b", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, CHECKPOINT_OFFSET + 1)], metadata, 30)
    p.flush(30)
    waiting = consumer(kafka_bootstrap, group)
    try:
        with pytest.raises(KafkaException) as timed_out:
            waiting.committed([TopicPartition(topic, 0)], timeout=2)
        assert timed_out.value.args[0].code() == KafkaError._TIMED_OUT
    finally:
        waiting.close()
    uncommitted = consumer(kafka_bootstrap, group, isolation="read_uncommitted")
    try:
        (tp,) = uncommitted.committed([TopicPartition(topic, 0)], timeout=10)
        assert tp.offset == CHECKPOINT_OFFSET
    finally:
        uncommitted.close()

    # aborted: its offset is never visible, the last committed one stays
    p.abort_transaction(30)
    assert committed(kafka_bootstrap, group, topic) == CHECKPOINT_OFFSET
    assert [v for _, v in read_visible(kafka_bootstrap, topic, 1)] == [f"a-{i}".encode() for i in range(10)]

    # and the next committed transaction's offset replaces it
    p.begin_transaction()
    p.produce(topic, value=b"c", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, CHECKPOINT_OFFSET + 2)], metadata, 30)
    p.commit_transaction(30)
    assert committed(kafka_bootstrap, group, topic) == CHECKPOINT_OFFSET + 2


def test_offsets_with_generation_minus_1_are_accepted_even_while_the_group_has_a_member(
    kafka_broker: KafkaBroker, kafka_bootstrap: str
) -> None:
    """Not a guard the design can lean on: the broker takes a transactional offset commit without member id
    and generation (what pre-KIP-447 clients send) whatever the group's state, so group membership does not
    fence a zombie sink; only its transactional.id's epoch does (test_a_second_producer_...)."""
    group, metadata = never_joined(kafka_bootstrap)
    topic = unique_name("ckpt-member")
    kafka_broker.create_topic(topic, partitions=1)
    member = consumer(kafka_bootstrap, group, **{"auto.offset.reset": "earliest"})
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while not member.assignment():
            assert time.monotonic() < deadline, "the member got no assignment in 30 s"
            member.poll(0.2)
        p = producer(kafka_bootstrap, unique_name("sink"))
        p.begin_transaction()
        p.produce(topic, value=b"x", partition=0)
        p.send_offsets_to_transaction([TopicPartition(topic, 0, CHECKPOINT_OFFSET)], metadata, 30)
        p.commit_transaction(30)
        assert committed(kafka_bootstrap, group, topic) == CHECKPOINT_OFFSET
    finally:
        member.close()


def test_a_second_producer_with_the_same_transactional_id_aborts_the_first_ones_open_transaction(
    kafka_broker: KafkaBroker, kafka_bootstrap: str
) -> None:
    group, metadata = never_joined(kafka_bootstrap)
    topic = unique_name("fence")
    kafka_broker.create_topic(topic, partitions=2)
    transactional_id = unique_name("sink")

    zombie = producer(kafka_bootstrap, transactional_id)
    zombie.begin_transaction()
    for i in range(20):
        zombie.produce(topic, value=f"zombie-{i}".encode(), partition=i % 2)
    zombie.send_offsets_to_transaction([TopicPartition(topic, 0, CHECKPOINT_OFFSET)], metadata, 30)
    zombie.flush(30)  # its messages are in the partitions' logs, ahead of anything later

    successor = producer(kafka_bootstrap, transactional_id)  # init_transactions: aborts the zombie's transaction
    successor.begin_transaction()
    for i in range(6):
        successor.produce(topic, value=f"successor-{i}".encode(), partition=i % 2)
    successor.send_offsets_to_transaction([TopicPartition(topic, 0, CHECKPOINT_OFFSET + 1)], metadata, 30)
    successor.commit_transaction(30)

    # the reader is not held back at the zombie's first offset: it reaches every partition's end
    seen = sorted(v for _, v in read_visible(kafka_bootstrap, topic, partitions=2))
    assert seen == sorted(f"successor-{i}".encode() for i in range(6))
    assert committed(kafka_bootstrap, group, topic) == CHECKPOINT_OFFSET + 1

    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(30)
    error = fenced.value.args[0]
    assert error.fatal(), error
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), error


def test_a_restarted_broker_keeps_its_topics_messages_and_committed_offsets(restartable_kafka: KafkaBroker) -> None:
    broker = restartable_kafka
    bootstrap = broker.bootstrap
    group, metadata = never_joined(bootstrap)
    topic = unique_name("durable")
    broker.create_topic(topic, partitions=3)
    p = producer(bootstrap, unique_name("sink"))
    p.begin_transaction()
    for i in range(300):
        p.produce(topic, value=f"m-{i}".encode(), partition=i % 3)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, CHECKPOINT_OFFSET)], metadata, 30)
    p.commit_transaction(30)
    expected = sorted(f"m-{i}".encode() for i in range(300))

    for take_down in (broker.stop, broker.kill):  # a controlled shutdown, then a crash
        take_down()
        broker.start()
        assert broker.bootstrap == bootstrap
        broker.wait_partitions(topic, 3)
        assert sorted(v for _, v in read_visible(bootstrap, topic, partitions=3)) == expected
        assert committed(bootstrap, group, topic) == CHECKPOINT_OFFSET

    # the producer of before the restarts carries on (its transactional id and epoch were kept)
    p.begin_transaction()
    p.produce(topic, value=b"after", partition=0)
    p.commit_transaction(60)
    assert len(read_visible(bootstrap, topic, partitions=3)) == 301
