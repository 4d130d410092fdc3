"""What the Kafka tests check and wait for, shared by the integration and e2e tiers: reading a topic as a
`read_committed` consumer, the exactly-once check of a copy and of keyed running counts, and a controller's
recovery after a worker was killed."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from support.kafka_broker import unique_name

#: the keys the tests' producers write: `k<i % KEYS>` for message i
KEYS = 13


def read_committed(
    client: Mapping[str, Any], topic: str, expected: int, timeout_s: float = 120.0, quiet_s: float = 2.0
) -> list[Any]:
    """Every message of `topic` as a `read_committed` consumer with settings `client` (its bootstrap, its
    credentials) sees it: read until `expected` came and `quiet_s` more (a copy too many would show), at most
    `timeout_s`."""
    consumer = Consumer(
        {
            **client,
            "group.id": unique_name("check"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        consumer.assign([TopicPartition(topic, p, 0) for p in metadata.topics[topic].partitions])
        messages: list[Any] = []
        deadline = time.monotonic() + timeout_s
        quiet_until = None
        while time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    messages.append(message)
            if len(messages) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + quiet_s
            if quiet_until is not None and time.monotonic() > quiet_until:
                break
        return messages
    finally:
        consumer.close()


def check_exactly_once(client: Mapping[str, Any], copy_topic: str, counts_topic: str, total: int) -> list[Any]:
    """Every input 0..total-1 once in `copy_topic` (each with its own event id) and, per key, the running counts
    1..n exactly once in `counts_topic`. Returns the copies."""
    copies = read_committed(client, copy_topic, total, 240)
    values = Counter(int(m.value()) for m in copies)
    missing = sorted(set(range(total)) - set(values))
    twice = sorted(v for v, n in values.items() if n > 1)
    assert not missing and not twice and len(copies) == total, (
        f"copy: {len(copies)} of {total}; missing {len(missing)} {missing[:10]}; twice {len(twice)} {twice[:10]}"
    )
    assert len({dict(m.headers())["elastream-id"] for m in copies}) == total  # (partition << 40) | offset
    counts = read_committed(client, counts_topic, total, 120)
    per_key: dict[str, list[int]] = defaultdict(list)
    for message in counts:
        per_key[message.key().decode()].append(int(message.value()))
    assert len(per_key) == KEYS, sorted(per_key)
    for key, seen in per_key.items():
        n = sum(1 for i in range(total) if f"k{i % KEYS}" == key)
        assert sorted(seen) == list(range(1, n + 1)), f"counts of {key}: {len(seen)} for {n} inputs"
    return copies


def recovery_seen(controller: Any, cluster: Any) -> Callable[[], bool]:
    """A condition for `ticking(..., until=...)`: the controller's latest recovery succeeded and no worker is
    failed. Every recovery it saw is in the condition's `recoveries` (a failed one is retried)."""
    recoveries: list[dict[str, Any]] = []

    def recovered() -> bool:
        if controller.last_recovery is not None and controller.last_recovery not in recoveries:
            recoveries.append(controller.last_recovery)
        return bool(recoveries) and recoveries[-1].get("outcome") == "succeeded" and not cluster.failed_nodes()

    recovered.recoveries = recoveries  # type: ignore[attr-defined]
    return recovered
