"""Kafka in and out, exactly once, on worker processes, a real Redis and a real Kafka broker: a kafka source
reading an 8-partition topic while a producer writes to it, a keyed count, and two exactly-once kafka sinks
(a copy of the input, the running counts), scaled out and in by CCR and a worker SIGKILLed; a `read_committed`
consumer then sees every input exactly once in the copy and, per key, running counts exactly 1..n. Also a
topic with fewer and with more partitions than the source has executors, rescaled between the two."""

from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from test_control_faults import Events, ticking

from elastream.analysis import Analyzer
from elastream.control.backends.local import LocalCluster
from elastream.core.schedule import Schedule
from elastream.core.topology import split_executor_id
from elastream.crd import load_manifest
from support.harness import controlled, write_manifest
from support.kafka_broker import KafkaBroker, unique_name
from support.kafka_checks import KEYS, check_exactly_once, recovery_seen
from support.manifests import edge, manifest

pytestmark = pytest.mark.integration


class Writer(threading.Thread):
    """Writes `total` messages (key `k<i % KEYS>`, value `i`) to `topic` at about `rate` per second."""

    def __init__(self, bootstrap: str, topic: str, total: int, rate: float, start: int = 0) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self.topic, self.total, self.rate, self.first = topic, total, rate, start
        self.written = 0

    def run(self) -> None:
        began = time.monotonic()
        for i in range(self.first, self.first + self.total):
            self.producer.produce(self.topic, key=f"k{i % KEYS}", value=str(i))
            self.written += 1
            if self.written % 50 == 0:
                self.producer.poll(0)
                ahead = began + self.written / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        assert self.producer.flush(60) == 0


def worker_tail(cluster: LocalCluster) -> str:
    """The last lines of every worker's log (for a failure's message)."""
    tails = []
    for path in sorted(glob.glob(f"{cluster.run_dir}/*.log")):
        with open(path, encoding="utf-8", errors="replace") as handle:
            tails.append(f"--- {path}\n" + "".join(handle.readlines()[-80:]))
    return "\n".join(tails)


def pipeline(name: str, bootstrap: str, topics: dict[str, str], source_parallelism: int, **spec: Any) -> dict:
    kafka = {"bootstrapServers": bootstrap}
    return manifest(
        [
            {
                "name": "orders",
                "parallelism": source_parallelism,
                "maxParallelism": 16,
                "source": {"type": "kafka", "topic": topics["in"], **kafka},
            },
            {
                "name": "count",
                "parallelism": 2,
                "maxParallelism": 16,
                "stateful": True,
                "logic": {"builtin": "count"},
            },
            {
                "name": "copy",
                "maxParallelism": 16,
                "sink": {"type": "kafka", "topic": topics["copy"], "delivery": "exactly-once", **kafka},
            },
            {
                "name": "counts",
                "maxParallelism": 16,
                "sink": {"type": "kafka", "topic": topics["counts"], "delivery": "exactly-once", **kafka},
            },
        ],
        [edge("orders", "count", "fields", key="key"), edge("orders", "copy"), edge("count", "counts")],
        name=name,
        **spec,
    )


def make_topics(broker: KafkaBroker, partitions: int) -> dict[str, str]:
    topics = {role: unique_name(role) for role in ("in", "copy", "counts")}
    broker.create_topic(topics["in"], partitions)
    broker.create_topic(topics["copy"], 3)
    broker.create_topic(topics["counts"], 3)
    return topics


@pytest.mark.timeout(600)
def test_kafka_to_kafka_exactly_once_through_rescales_and_a_killed_worker(
    tmp_path, redis_url: str, kafka_broker: KafkaBroker
) -> None:
    bootstrap = kafka_broker.bootstrap
    topics = make_topics(kafka_broker, 8)
    doc = pipeline(
        unique_name("kafka-eo"),
        bootstrap,
        topics,
        2,
        nodes=2,
        slotsPerNode=4,
        scaling={"checkpointIntervalSeconds": 1},
    )
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    log = Events()
    cluster, controller = controlled(topology, path, redis_url, Analyzer(engine="python"), log)
    total = 9000
    writer = Writer(bootstrap, topics["in"], total, rate=300.0)
    with cluster, controller:
        controller.start()
        writer.start()
        ticking(controller, 5.0)
        for nodes in (3, 2):
            record = controller.scale_to(nodes)
            ticking(controller, 60.0, until=lambda: controller.migrator.unfinished() is None)
            assert record.outcome == "succeeded", record
            assert writer.is_alive(), "the rescales must happen while the producer writes"
            ticking(controller, 3.0)
        victim = cluster.current_schedule().node_of("copy#0")
        os.kill(cluster.workers[victim].process.pid, signal.SIGKILL)  # the copy sink's publisher with it
        recovered = recovery_seen(controller, cluster)
        ticking(controller, 180.0, until=recovered)
        assert recovered(), json.dumps(recovered.recoveries, default=str) + "\n" + worker_tail(cluster)
        writer.join(timeout=120)
        ticking(controller, 8.0)  # the last checkpoints commit what is left
        check_exactly_once({"bootstrap.servers": bootstrap}, topics["copy"], topics["counts"], total)


def with_source_parallelism(old: Schedule, parallelism: int) -> Schedule:
    """`old` with `orders#0..orders#<parallelism-1>`, the executors it adds round-robin over the nodes."""
    assignment = {e: n for e, n in old.assignment.items() if split_executor_id(e)[0] != "orders"}
    load = Counter(assignment.values())
    for index in range(parallelism):
        executor = f"orders#{index}"
        node = old.assignment.get(executor) or min(old.nodes, key=lambda n: (load[n], n))
        assignment[executor] = node
        load[node] += 1
    return Schedule(assignment, old.nodes, old.slots_per_node)


@pytest.mark.timeout(400)
def test_fewer_and_more_partitions_than_source_executors_move_by_ccr_exactly_once(
    tmp_path, redis_url: str, kafka_broker: KafkaBroker
) -> None:
    bootstrap = kafka_broker.bootstrap
    topics = make_topics(kafka_broker, 3)  # 3 partitions: 5 executors leave 2 idle, then 2 read 2 and 1
    doc = pipeline(
        unique_name("kafka-par"),
        bootstrap,
        topics,
        5,
        nodes=2,
        slotsPerNode=6,
        scaling={"checkpointIntervalSeconds": 1},
    )
    doc["spec"]["vertices"][0]["source"].update(commitOffsets=True, groupId="orders-dashboard")
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    cluster, controller = controlled(topology, path, redis_url, Analyzer(engine="python"), Events())
    total = 4000
    writer = Writer(bootstrap, topics["in"], total, rate=400.0)
    with cluster, controller:
        controller.start()
        writer.start()
        ticking(controller, 3.0)
        report = controller.migrator.migrate(with_source_parallelism(cluster.current_schedule(), 2))
        assert report.outcome == "succeeded", report.reason
        assert cluster.current_schedule().parallelism()["orders"] == 2
        assert writer.is_alive(), "the rescale must happen while the producer writes"
        writer.join(timeout=60)
        ticking(controller, 8.0)
        check_exactly_once({"bootstrap.servers": bootstrap}, topics["copy"], topics["counts"], total)
        # commitOffsets: the offsets went to the consumer group too (for dashboards), up to the topic's end
        group = Consumer({"bootstrap.servers": bootstrap, "group.id": "orders-dashboard"})
        try:
            committed = group.committed([TopicPartition(topics["in"], p) for p in range(3)], timeout=10)
            ends = [group.get_watermark_offsets(TopicPartition(topics["in"], p), timeout=10)[1] for p in range(3)]
        finally:
            group.close()
        assert [tp.offset for tp in committed] == ends


@pytest.mark.timeout(900)
@pytest.mark.parametrize("away_s", [8.0, 60.0], ids=["broker-away-8s", "broker-away-60s"])
def test_the_broker_restarted_mid_checkpoint_and_during_a_migration_loses_and_repeats_nothing(
    tmp_path, redis_url: str, restartable_kafka: KafkaBroker, away_s: float
) -> None:
    """The broker stopped as a checkpoint round reads its acks, for `away_s` (60 s: the sources wait, the
    publisher's transactions fail and start over from the marker, the producer's messages wait in its queue),
    then again as a scale-out begins."""
    broker = restartable_kafka
    bootstrap = broker.bootstrap
    topics = make_topics(broker, 8)
    doc = pipeline(
        unique_name("kafka-away"),
        bootstrap,
        topics,
        2,
        nodes=2,
        slotsPerNode=4,
        scaling={"checkpointIntervalSeconds": 1},
    )
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    cluster, controller = controlled(topology, path, redis_url, Analyzer(engine="python"), Events())
    total = 6000
    writer = Writer(bootstrap, topics["in"], total, rate=250.0)
    outages: list[threading.Thread] = []
    failures: list[str] = []

    def outage(seconds: float) -> None:
        """The broker stopped now (SIGTERM) and started again `seconds` later, same ports and data."""
        broker.stop()

        def back() -> None:
            time.sleep(seconds)
            try:
                broker.start()
            except Exception as exc:
                failures.append(f"{exc}\n{broker.log_tail()}")

        thread = threading.Thread(target=back, daemon=True)
        thread.start()
        outages.append(thread)

    with cluster, controller:
        controller.start()
        writer.start()
        ticking(controller, 4.0)
        # mid-checkpoint: a round's CHECKPOINT went out and its acks are being read when the broker stops
        store = controller._started[0].driver.store
        acks, armed = store.acks, [True]

        def acks_with_the_broker_stopping(*args: Any) -> Any:
            if armed[0]:
                armed[0] = False
                outage(away_s)
            return acks(*args)

        store.acks = acks_with_the_broker_stopping
        ticking(controller, 30.0, until=lambda: not armed[0])
        store.acks = acks
        assert not armed[0], "no checkpoint round ran"
        ticking(controller, away_s + 60.0, until=lambda: not outages[-1].is_alive())
        outages[-1].join(timeout=120)
        assert not failures, failures
        ticking(controller, 5.0)
        # during a migration: stopped as the scale-out begins, back while it runs
        outage(6.0)
        record = controller.scale_to(3)
        ticking(controller, 90.0, until=lambda: controller.migrator.unfinished() is None)
        assert record.outcome in ("succeeded", "failed") and (record.outcome == "succeeded" or record.reason)
        outages[-1].join(timeout=120)
        assert not failures, failures
        writer.join(timeout=180)
        ticking(controller, 10.0)
        check_exactly_once({"bootstrap.servers": bootstrap}, topics["copy"], topics["counts"], total)
