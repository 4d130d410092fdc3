"""Kafka benchmark: the kafka source and sink on worker processes, a real one-node broker, beside the raw client.

1. The limit: confluent-kafka (librdkafka) on its own on this machine, against the same broker, with messages
   of the pipeline's size (key `k<i % 13>`, value `<i>`; the ones written carry the sink's `elastream-id`
   header): an idempotent producer's rate (as the at-least-once sink writes), a transactional producer's in
   transactions of `OutboxPublisher.BATCH` messages (as the exactly-once sink's publisher writes), a
   `read_committed` consumer's (assign + consume, as the source reads), and a copy loop of one consumer and
   one idempotent producer in one Python thread (the least a Kafka -> Kafka process does per message).
2. Kafka -> Kafka on ONE worker process (`nodes: 1`): a kafka source -> kafka sink topology, parallelism 1
   each, run by the controller of local mode (`local_controller`, ticked every 0.5 s, a checkpoint every
   second: `checkpointIntervalSeconds: 1`), its input topic pre-filled with N messages. Measured: messages
   visible to a `read_committed` consumer of the output topic, per second, from the moment the worker was
   running to the last one; at-least-once and exactly-once. Beside it in the same run and the same shape: a
   redis-stream source (a Redis stream pre-filled with the same N entries) -> redis-stream sink, its output
   stream's length polled. The order of the four runs alternates between rounds (`--rounds`).
3. The CCR pause with Kafka sources and sinks: source (2 executors) -> sink (2 executors) on 2 worker
   processes, a producer thread writing 2,000 messages/s; after 8 s a CCR migration to 3 processes, every
   vertex gaining a third executor on the new one (`MigrationDriver.migrate`, the controller's own driver).
   Reported: the driver's pause (PREPARE sent -> every source resumed) and phases, and the longest gap in
   the output a reader sees around it, against the longest gap in the steady seconds before; the same for
   redis-stream source and sink, for both deliveries. Lost and duplicated messages are counted against the
   input.

Writes docs/benchmarks/kafka.md and kafka.png; the raw results go to --raw (JSON), from which `--report-only`
writes them again. Takes 6-8 minutes on the shared 2-core machine (`--events`, `--rounds`, `--ccr-rounds` shorten
it).

    python bench/kafka.py                                  # the full run
    python bench/kafka.py --events 50000 --rounds 1 --ccr-rounds 1 --out /tmp/k --raw /tmp/k.json  # a quick look
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))  # support/
sys.path.insert(0, os.path.join(HERE, os.pardir, "operator", "src"))
from support.paths import REPO  # noqa: E402

#: partitions of every topic (input, output, the raw client's)
PARTITIONS = 4
#: message keys: k0..k12, as the integration tests write
KEYS = 13
#: the sink's header carrying an event's id (`kafka.ID_HEADER`)
ID_HEADER = "elastream-id"
#: messages per transaction of the raw transactional producer (the publisher's `OutboxPublisher.BATCH`)
TXN_BATCH = 5000
#: the controller's tick (`LocalCluster(interval_s=...)`, as the integration tests run it) and the checkpoints
TICK_S = 0.5
CHECKPOINT_S = 1
#: the CCR runs: the producer's rate, seconds before the migration and after it
CCR_RATE = 2000.0
CCR_BEFORE_S = 8.0
CCR_AFTER_S = 8.0
#: the steady reference for the output gap: this window before the request (s), the first seconds left out
STEADY_WINDOW = (-6.0, -0.5)
#: the output gap around a migration is looked for from the request to this long after it returned (s)
AFTER_RETURN_S = 4.0
#: what each run is, in the report's words
DELIVERIES = ("at-least-once", "exactly-once")
KINDS = ("kafka", "redis-stream")


def log(message: str) -> None:
    print(f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (every thread), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def event_id(i: int) -> str:
    """The header value the sink writes for input message i: `(partition << 40) | offset`, about its size."""
    return str(((i % PARTITIONS) << 40) | (i // PARTITIONS))


class Quiet:
    """The controller's events, kept (a migration that failed says why) and not printed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.seen.append((reason, message))


# ----------------------------------------------------------------------------------------- the raw client


def produce_all(producer: Any, topic: str, count: int, first: int = 0, header: bool = True) -> None:
    for i in range(first, first + count):
        headers = [(ID_HEADER, event_id(i).encode())] if header else None
        while True:
            try:
                producer.produce(topic, key=f"k{i % KEYS}", value=str(i), headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)


def raw_produce(bootstrap: str, topic: str, n: int, transactional: bool = False, header: bool = True) -> float:
    """Seconds to write `n` messages to `topic` and have every one acknowledged (committed, transactional)."""
    from confluent_kafka import Producer

    from support.kafka_broker import unique_name

    config = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    if transactional:
        config["transactional.id"] = unique_name("raw-txn")
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
    started = time.perf_counter()
    if transactional:
        for first in range(0, n, TXN_BATCH):
            producer.begin_transaction()
            produce_all(producer, topic, min(TXN_BATCH, n - first), first)
            producer.commit_transaction(60)
    else:
        produce_all(producer, topic, n, header=header)
        left = producer.flush(120)
        if left:
            raise RuntimeError(f"raw produce: {left} messages not acknowledged")
    return time.perf_counter() - started


def raw_consumer(bootstrap: str, topic: str) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from support.kafka_broker import unique_name

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("raw"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    return consumer


def raw_consume(bootstrap: str, topic: str, n: int) -> float:
    """Seconds for a `read_committed` consumer (assign, consume in batches) to read `n` messages of `topic`,
    touching each one's key and value as the source does."""
    consumer = raw_consumer(bootstrap, topic)
    started = time.perf_counter()
    count, deadline = 0, time.monotonic() + 300
    while count < n and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=10_000, timeout=0.5):
            if message.error() is None:
                message.key(), message.value(), message.offset()
                count += 1
    took = time.perf_counter() - started
    consumer.close()
    if count < n:
        raise RuntimeError(f"raw consume: {count} of {n} messages in 300 s")
    return took


def raw_copy(bootstrap: str, source: str, target: str, n: int) -> float:
    """Seconds for one thread to read `n` messages of `source` (`read_committed`) and write each to `target`
    with an idempotent producer, with the event-id header, until every one is acknowledged."""
    from confluent_kafka import Producer

    consumer = raw_consumer(bootstrap, source)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    started = time.perf_counter()
    count, deadline = 0, time.monotonic() + 300
    while count < n and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=10_000, timeout=0.5):
            if message.error() is not None:
                continue
            ident = str((message.partition() << 40) | message.offset()).encode()
            while True:
                try:
                    producer.produce(target, key=message.key(), value=message.value(), headers=[(ID_HEADER, ident)])
                    break
                except BufferError:
                    producer.poll(0.05)
            count += 1
        producer.poll(0)
    left = producer.flush(120)
    took = time.perf_counter() - started
    consumer.close()
    if count < n or left:
        raise RuntimeError(f"raw copy: {count} of {n} read, {left} not acknowledged")
    return took


def session_start_ms(bootstrap: str, topic: str) -> float:
    """What a new exactly-once publisher does before its first transaction (`OutboxPublisher._session`): a
    transactional producer and `init_transactions`, a consumer and the marker's committed-offset fetch; ms."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from support.kafka_broker import unique_name

    identity = unique_name("session")
    started = time.perf_counter()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": identity, "enable.idempotence": True, "linger.ms": 5}
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": identity,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    producer.init_transactions(30)
    consumer.committed([TopicPartition(topic, 0)], timeout=30)
    took = (time.perf_counter() - started) * 1000.0
    consumer.close()
    producer.flush(1)
    return took


def limit_rows(broker: Any, n: int, input_topic: str) -> dict[str, Any]:
    """The raw client's rates; `input_topic` is filled with `n` messages (the pipelines read it)."""
    from support.kafka_broker import unique_name

    bootstrap = broker.bootstrap
    rows: dict[str, Any] = {}
    prefill = raw_produce(bootstrap, input_topic, n, header=False)
    rows["prefill"] = {"seconds": prefill, "per_s": n / prefill}
    log(f"  pre-filled {input_topic} with {n:,} messages (key + value): {n / prefill:,.0f}/s")
    for label, transactional in (("produce", False), ("produce-transactional", True)):
        topic = unique_name(f"raw-{label}")
        broker.create_topic(topic, PARTITIONS)
        took = raw_produce(bootstrap, topic, n, transactional=transactional)
        rows[label] = {"seconds": took, "per_s": n / took}
        log(f"  raw {label}: {n:,} messages in {took:.2f} s, {n / took:,.0f}/s")
    took = raw_consume(bootstrap, input_topic, n)
    rows["consume"] = {"seconds": took, "per_s": n / took}
    log(f"  raw consume (read_committed): {n:,} messages in {took:.2f} s, {n / took:,.0f}/s")
    topic = unique_name("raw-copy")
    broker.create_topic(topic, PARTITIONS)
    took = raw_copy(bootstrap, input_topic, topic, n)
    rows["copy"] = {"seconds": took, "per_s": n / took}
    log(f"  raw copy loop (consume + produce, one thread): {n:,} messages in {took:.2f} s, {n / took:,.0f}/s")
    sessions = [session_start_ms(bootstrap, topic) for _ in range(3)]
    rows["session"] = {"ms": sessions, "median_ms": statistics.median(sessions)}
    shown = ", ".join(f"{ms:.0f}" for ms in sessions)
    log(f"  a publisher's session start (init_transactions, marker fetch): {shown} ms")
    return rows


# ------------------------------------------------------------------------------------------ output readers


class Reader(threading.Thread):
    """Watches what a sink made visible: `batches` holds (wall time, messages that became visible), `values`
    (when kept) every message's value."""

    def __init__(self, keep_values: bool = False) -> None:
        super().__init__(daemon=True)
        self.keep_values = keep_values
        self.batches: list[tuple[float, int]] = []
        self.values: collections.Counter[int] = collections.Counter()
        self.count = 0
        self.halt = threading.Event()
        self.failure = ""

    def seen(self, n: int) -> None:
        if n:
            self.batches.append((time.time(), n))
            self.count += n

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)

    def wait_for(self, n: int, timeout_s: float, abort: Callable[[], str] | None = None) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.count < n and time.monotonic() < deadline:
            problem = abort() if abort is not None else ""
            if problem:
                raise RuntimeError(problem)
            time.sleep(0.05)
        return self.count >= n


class KafkaReader(Reader):
    """A `read_committed` consumer of every partition of `topic`, from its start."""

    def __init__(self, bootstrap: str, topic: str, keep_values: bool = False) -> None:
        super().__init__(keep_values)
        self.consumer = raw_consumer(bootstrap, topic)

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                messages = self.consumer.consume(num_messages=10_000, timeout=0.05)
                good = [m for m in messages if m.error() is None]
                if self.keep_values:
                    self.values.update(int(m.value()) for m in good)
                self.seen(len(good))
        except Exception as exc:  # the run's result says so
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self.consumer.close()


class StreamReader(Reader):
    """A Redis stream's length polled every 10 ms (its values read at the end when kept)."""

    def __init__(self, url: str, key: str, keep_values: bool = False) -> None:
        super().__init__(keep_values)
        import redis

        self.client = redis.Redis.from_url(url)
        self.key = key

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                length = int(self.client.xlen(self.key))
                self.seen(length - self.count)
                self.halt.wait(0.01)
            if self.keep_values:
                start = "-"
                while True:
                    page = self.client.xrange(self.key, start, "+", count=10_000)
                    self.values.update(int(fields[b"value"]) for _, fields in page)
                    if len(page) < 10_000:
                        break
                    last = page[-1][0]
                    start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self.client.close()


# ---------------------------------------------------------------------------------------------- topologies


def topology_doc(
    name: str, kind: str, delivery: str, nodes: int, parallelism: int, topics: Mapping[str, str], bootstrap: str
) -> dict[str, Any]:
    """source `in` -> sink `out`, `parallelism` executors each, on `nodes` worker processes."""
    if kind == "kafka":
        kafka = {"bootstrapServers": bootstrap}
        source: dict[str, Any] = {"type": "kafka", "topic": topics["in"], **kafka}
        sink: dict[str, Any] = {"type": "kafka", "topic": topics["out"], "delivery": delivery, **kafka}
    else:
        source = {"type": "redis-stream", "stream": "in"}
        sink = {"type": "redis-stream", "delivery": delivery}
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name},
        "spec": {
            "nodes": nodes,
            "slotsPerNode": 4,
            "scaling": {"checkpointIntervalSeconds": CHECKPOINT_S},
            "vertices": [
                {"name": "in", "parallelism": parallelism, "maxParallelism": 16, "source": source},
                {"name": "out", "parallelism": parallelism, "maxParallelism": 16, "sink": sink},
            ],
            "streams": [{"from": "in", "to": "out"}],
        },
    }


class Context:
    """What every run shares: the broker, Redis, a scratch directory."""

    def __init__(self, broker: Any, redis_server: Any, directory: str) -> None:
        self.broker, self.redis, self.directory = broker, redis_server, directory
        self.runs = 0

    def name(self, what: str) -> str:
        self.runs += 1
        return f"{what}-{self.runs}"


def short(delivery: str) -> str:
    return "eo" if delivery == "exactly-once" else "alo"


def prefill_stream(url: str, key: str, n: int) -> None:
    import redis

    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(key, {"key": f"k{i % KEYS}", "value": str(i)})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    client.close()


@contextlib.contextmanager
def running(ctx: Context, doc: dict[str, Any]) -> Any:
    """The topology of `doc` on worker processes with its controller, ticked in the background."""
    from elastream.analysis import Analyzer
    from elastream.control.backends.local import LocalCluster
    from elastream.control.local_mode import local_controller
    from elastream.crd import load_manifest
    from support.harness import write_manifest

    path = write_manifest(ctx.directory, doc)
    topology = load_manifest(path)
    cluster = LocalCluster(topology, path, ctx.redis.url, interval_s=TICK_S)
    events = Quiet()
    controller = local_controller(topology, cluster, Analyzer(engine="python"), events=events)
    with cluster, controller:
        yield topology, cluster, controller, events


def dead_workers(cluster: Any) -> Callable[[], str]:
    def check() -> str:
        failed = cluster.failed_nodes()
        return f"a worker exited: {failed}" if failed else ""

    return check


def throughput_run(ctx: Context, kind: str, delivery: str, n: int, input_topic: str) -> dict[str, Any]:
    """One source -> sink run over `n` pre-filled messages on one worker process."""
    from elastream.core.topology import stream_key, topology_prefix
    from support.harness import ticking
    from support.kafka_broker import unique_name

    name = ctx.name(f"tput-{'kafka' if kind == 'kafka' else 'redis'}-{short(delivery)}")
    topics = {"in": input_topic, "out": unique_name("out")}
    doc = topology_doc(name, kind, delivery, 1, 1, topics, ctx.broker.bootstrap)
    prefix = topology_prefix("default", name)
    reader: Reader
    if kind == "kafka":
        ctx.broker.create_topic(topics["out"], PARTITIONS)
        reader = KafkaReader(ctx.broker.bootstrap, topics["out"])
    else:
        prefill_stream(ctx.redis.url, stream_key(prefix, "source", "in"), n)
        reader = StreamReader(ctx.redis.url, stream_key(prefix, "sink", "out"))
    reader.start()
    broker_pid = ctx.broker.proc.pid
    redis_pid = ctx.redis.proc.pid
    with running(ctx, doc) as (topology, cluster, controller, _):
        assert topology.redis_prefix == prefix, (topology.redis_prefix, prefix)
        started = time.time()
        controller.start()
        ready = time.time()
        (worker,) = cluster.workers.values()
        cpu0 = {
            "worker": cpu_seconds(worker.process.pid),
            "broker": cpu_seconds(broker_pid),
            "redis": cpu_seconds(redis_pid),
            "bench": time.process_time(),
        }
        with ticking(controller):
            done = reader.wait_for(n, timeout_s=60.0 + n / 500.0, abort=dead_workers(cluster))
        cpu = {
            "worker": cpu_seconds(worker.process.pid) - cpu0["worker"],
            "broker": cpu_seconds(broker_pid) - cpu0["broker"],
            "redis": cpu_seconds(redis_pid) - cpu0["redis"],
            "bench": time.process_time() - cpu0["bench"],
        }
        checkpoints = controller._started[0].completed if controller._started else None
    time.sleep(0.5)  # an extra copy would show
    reader.stop()
    if kind != "kafka":  # the next runs' Redis as small as this one's was
        import redis

        client = redis.Redis.from_url(ctx.redis.url)
        client.delete(stream_key(prefix, "source", "in"), stream_key(prefix, "sink", "out"))
        client.close()
    if not done:
        raise RuntimeError(f"{name}: {reader.count} of {n} messages visible in time ({reader.failure})")
    first, last = reader.batches[0][0], reader.batches[-1][0]
    row = {
        "kind": kind,
        "delivery": delivery,
        "events": n,
        "visible": reader.count,
        "start_s": ready - started,
        "first_s": first - ready,
        "seconds": last - ready,
        "per_s": n / (last - ready),
        "first_to_last_per_s": n / (last - first) if last > first else None,
        "cpu_s": cpu,
        "checkpoints": checkpoints,
        # messages made visible per 0.5 s from the worker running
        "timeline": bucketed(reader.batches, ready, 0.0, last - ready + 0.5, 0.5),
    }
    log(
        f"  {kind:<12} {delivery:<13}: {n:,} visible in {row['seconds']:.2f} s after the worker ran "
        f"({row['per_s']:,.0f}/s; first after {row['first_s']:.2f} s), worker CPU {cpu['worker']:.1f} s, "
        f"broker {cpu['broker']:.1f} s, redis {cpu['redis']:.1f} s"
        + (f"; {reader.count - n} more than written" if reader.count != n else "")
    )
    return row


# ----------------------------------------------------------------------------------------------- CCR runs


class KafkaWriter(threading.Thread):
    """Writes `total` messages (values 0..total-1) to `topic` at `rate` per second."""

    def __init__(self, bootstrap: str, topic: str, total: int, rate: float) -> None:
        from confluent_kafka import Producer

        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self.topic, self.total, self.rate = topic, total, rate
        self.written = 0

    def run(self) -> None:
        began = time.monotonic()
        for i in range(0, self.total, 50):
            produce_all(self.producer, self.topic, min(50, self.total - i), i, header=False)
            self.producer.poll(0)
            self.written = min(self.total, i + 50)
            ahead = began + self.written / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        self.producer.flush(60)


class StreamWriter(threading.Thread):
    """Appends `total` entries (values 0..total-1) to the Redis stream `key` at `rate` per second."""

    def __init__(self, url: str, key: str, total: int, rate: float) -> None:
        import redis

        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.key, self.total, self.rate = key, total, rate
        self.written = 0

    def run(self) -> None:
        began = time.monotonic()
        for first in range(0, self.total, 50):
            pipe = self.client.pipeline(transaction=False)
            for i in range(first, min(self.total, first + 50)):
                pipe.xadd(self.key, {"key": f"k{i % KEYS}", "value": str(i)})
            pipe.execute()
            self.written = min(self.total, first + 50)
            ahead = began + self.written / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        self.client.close()


def scaled_out(old: Any) -> Any:
    """`old` with one more node holding one more executor of every vertex (a scale-out by one worker)."""
    from elastream.core.schedule import Schedule, fresh_node_names
    from elastream.core.topology import executor_id, split_executor_id

    (node,) = fresh_node_names(old.nodes, 1)
    assignment = dict(old.assignment)
    degrees = collections.Counter(split_executor_id(e)[0] for e in old.assignment)
    for vertex, degree in sorted(degrees.items()):
        assignment[executor_id(vertex, degree)] = node
    return Schedule(assignment, (*old.nodes, node), old.slots_per_node)


def longest_gap(batches: Sequence[tuple[float, int]], start: float, end: float, past_end: bool = True) -> float | None:
    """The longest time (s) without output in [start, end]: between two visible outputs, the last one before
    the window and the first one after it counting as its edges (`past_end` False: the window's end is its
    last edge instead, so a gap that begins in the window and ends after it counts only up to `end`)."""
    times = [t for t, _ in batches]
    inside = [t for t in times if start <= t <= end]
    before = [t for t in times if t < start]
    after = [t for t in times if t > end]
    points = ([before[-1]] if before else []) + inside
    if past_end:
        points += [after[0]] if after else []
    elif points:
        points.append(end)
    if len(points) < 2:
        return None
    return max(b - a for a, b in itertools.pairwise(points))


def ccr_run(ctx: Context, kind: str, delivery: str) -> dict[str, Any]:
    """A CCR scale-out 2 -> 3 processes of source -> sink under a steady producer (see the module)."""
    from elastream.core.topology import stream_key, topology_prefix
    from support.harness import ticking
    from support.kafka_broker import unique_name

    name = ctx.name(f"ccr-{'kafka' if kind == 'kafka' else 'redis'}-{short(delivery)}")
    topics = {"in": unique_name("ccr-in"), "out": unique_name("ccr-out")}
    doc = topology_doc(name, kind, delivery, 2, 2, topics, ctx.broker.bootstrap)
    prefix = topology_prefix("default", name)
    total = int(CCR_RATE * (CCR_BEFORE_S + CCR_AFTER_S))
    reader: Reader
    writer: KafkaWriter | StreamWriter
    if kind == "kafka":
        for topic in topics.values():
            ctx.broker.create_topic(topic, PARTITIONS)
        reader = KafkaReader(ctx.broker.bootstrap, topics["out"], keep_values=True)
        writer = KafkaWriter(ctx.broker.bootstrap, topics["in"], total, CCR_RATE)
    else:
        reader = StreamReader(ctx.redis.url, stream_key(prefix, "sink", "out"), keep_values=True)
        writer = StreamWriter(ctx.redis.url, stream_key(prefix, "source", "in"), total, CCR_RATE)
    reader.start()
    with running(ctx, doc) as (_, cluster, controller, events):
        controller.start()
        writer.start()
        with ticking(controller):
            time.sleep(CCR_BEFORE_S)
        new = scaled_out(cluster.current_schedule())
        requested = time.time()
        report = controller.migrator.migrate(new).to_status()
        returned = time.time()
        with ticking(controller):
            writer.join(timeout=CCR_AFTER_S + 60.0)
            caught_up = reader.wait_for(total, timeout_s=60.0, abort=dead_workers(cluster))
            time.sleep(1.0)  # an extra copy would show
    reader.stop()
    lost = sum(1 for i in range(total) if reader.values[i] == 0)
    duplicated = sum(c - 1 for c in reader.values.values() if c > 1)
    resumed = requested + ((report.get("prepareMs") or 0.0) + (report.get("pauseMs") or 0.0)) / 1000.0
    gap = longest_gap(reader.batches, requested, returned + AFTER_RETURN_S)
    # the steady window ends before the request: a gap running into the migration counts up to its end only
    steady_gap = longest_gap(reader.batches, requested + STEADY_WINDOW[0], requested + STEADY_WINDOW[1], past_end=False)
    phases = report.get("phases") or {}
    row = {
        "kind": kind,
        "delivery": delivery,
        "outcome": report.get("outcome"),
        "reason": report.get("reason"),
        "pauseMs": report.get("pauseMs"),
        "prepareMs": report.get("prepareMs"),
        "phases": phases,
        "capturedEvents": report.get("capturedEvents"),
        "pausedExecutors": report.get("pausedExecutors"),
        "executors": report.get("executors"),
        "migrateMs": (returned - requested) * 1000.0,
        # the first output after the pause (PREPARE is sent after `prepare`, and the sources resume `pause` after
        # it; both approximately: the migration's record is written between): exactly-once, the output its COMMIT
        # staged, which its completion commits as the migration ends
        "outputAfterPauseMs": next((1000.0 * (t - resumed) for t, _ in reader.batches if t >= resumed), None),
        "gapMs": None if gap is None else gap * 1000.0,
        "steadyGapMs": None if steady_gap is None else steady_gap * 1000.0,
        "written": total,
        "visible": reader.count,
        "caughtUp": caught_up,
        "lost": lost,
        "duplicated": duplicated,
        "events": [m for _, m in events.seen if "fail" in m.lower()][:5],
        "returnedS": returned - requested,
        "resumedS": resumed - requested,
        # output per 0.1 s from 3 s before the request to 6 s after it, and every batch the reader saw from 8 s
        # before it to 12 s after it: [s since the request, messages]
        "timeline": bucketed(reader.batches, requested, -3.0, 6.0, 0.1),
        "batches": [[round(t - requested, 3), n] for t, n in reader.batches if -8.0 <= t - requested <= 12.0],
    }
    log(
        f"  {kind:<12} {delivery:<13}: {row['outcome']}, pause {fmt(row['pauseMs'])} ms (prepare "
        f"{fmt(row['prepareMs'])} ms, before it), output gap {fmt(row['gapMs'])} ms vs {fmt(row['steadyGapMs'])} "
        f"ms steady; lost {lost}, duplicated {duplicated}"
    )
    return row


def bucketed(batches: Sequence[tuple[float, int]], at: float, start: float, end: float, width: float) -> list[int]:
    counts = [0] * round((end - start) / width)
    for t, n in batches:
        index = int((t - at - start) // width)
        if 0 <= index < len(counts):
            counts[index] += n
    return counts


# ---------------------------------------------------------------------------------------------- the report


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def median_rate(rows: Sequence[Mapping[str, Any]], kind: str, delivery: str) -> float | None:
    return median_of(rows, kind, delivery, "per_s")


def median_of(rows: Sequence[Mapping[str, Any]], kind: str, delivery: str, key: str) -> float | None:
    values = [r[key] for r in rows if r["kind"] == kind and r["delivery"] == delivery and r.get(key) is not None]
    return statistics.median(values) if values else None


def succeeded(ccr: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in ccr if r["outcome"] == "succeeded"]


def medians(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers the ratios and the findings are made of: medians over the runs."""
    limit, runs, ccr = raw["limit"], raw["throughput"], raw["ccr"]
    ok = succeeded(ccr)
    return {
        "rate": {(k, d): median_rate(runs, k, d) for k in KINDS for d in DELIVERIES},
        "steady": {(k, d): median_of(runs, k, d, "first_to_last_per_s") for k in KINDS for d in DELIVERIES},
        "first": {(k, d): median_of(runs, k, d, "first_s") for k in KINDS for d in DELIVERIES},
        "pause": {(k, d): median_of(ok, k, d, "pauseMs") for k in KINDS for d in DELIVERIES},
        "gap": {(k, d): median_of(ok, k, d, "gapMs") for k in KINDS for d in DELIVERIES},
        "rebalance": {
            (k, d): statistics.median(r["phases"].get("rebalanceMs") or 0.0 for r in mine)
            for k in KINDS
            for d in DELIVERIES
            if (mine := [r for r in ok if r["kind"] == k and r["delivery"] == d])
        },
        "after": {(k, d): median_of(ok, k, d, "outputAfterPauseMs") for k in KINDS for d in DELIVERIES},
        "produce": limit.get("produce", {}).get("per_s"),
        "txn": limit.get("produce-transactional", {}).get("per_s"),
        "consume": limit.get("consume", {}).get("per_s"),
        "copy": limit.get("copy", {}).get("per_s"),
        "session": limit.get("session", {}).get("median_ms"),
    }


def render(raw: Mapping[str, Any]) -> str:
    meta, limit, runs, ccr = raw["meta"], raw["limit"], raw["throughput"], raw["ccr"]
    n = meta["events"]
    m = medians(raw)
    rate, steady = m["rate"], m["steady"]
    copy, produce, consume, txn = m["copy"], m["produce"], m["consume"], m["txn"]
    session = limit.get("session", {}).get("ms") or []
    lines = [
        "# Kafka source and sink: throughput, the cost of exactly-once, the CCR pause",
        "",
        f"Produced by `{meta['command']}` in {meta['took_s']:.0f} s on {meta['date']}, at {meta['code']}, on",
        f"{meta['machine']}; one Kafka {meta['kafka']} broker (KRaft, one node, `tests/support/kafka_broker.py`:",
        "its JVM at `-Xmx512m`, SerialGC, C1 only, 2 network and 2 I/O threads) and one redis-server (no",
        f"persistence), both on loopback; confluent-kafka {meta['confluent_kafka']} (librdkafka",
        f"{meta['librdkafka']}). Every process (broker, Redis, workers, the benchmark's producers and readers)",
        "shares the machine's two cores, so a number here is what the pieces manage *together* on two cores,",
        "not what a worker would do beside a broker of its own; single runs vary by 10-20 %."
        + (
            f" The machine's 5-minute load average was {meta['load'][0]:.1f} when the run began and"
            f" {meta['load'][1]:.1f} when it ended: other jobs ran beside it."
            if meta.get("load") and max(meta["load"]) > 2.5
            else ""
        ),
        "",
        "## The limit: the raw client on this machine",
        "",
        f"{n:,} messages of the pipeline's size (key `k<i % 13>`, value `<i>`, and the sink's `elastream-id`",
        f"header on those written) on {PARTITIONS}-partition topics, `linger.ms` 5 as the sink sets it, one",
        "Python thread each, as the worker's source and sink are.",
        "",
        "| client | what | seconds | messages/s |",
        "|---|---|---:|---:|",
        f"| idempotent producer | produce, until every message is acknowledged | "
        f"{fmt(limit['produce']['seconds'], 2)} | {fmt(produce)} |",
        f"| transactional producer | produce in transactions of {TXN_BATCH:,} (the publisher's batch), "
        f"each committed | {fmt(limit['produce-transactional']['seconds'], 2)} | {fmt(txn)} |",
        f"| `read_committed` consumer | assign every partition, consume in batches of 10,000 | "
        f"{fmt(limit['consume']['seconds'], 2)} | {fmt(consume)} |",
        f"| copy loop, one thread | consume, produce each (idempotent), until acknowledged | "
        f"{fmt(limit['copy']['seconds'], 2)} | {fmt(copy)} |",
    ]
    if session:
        lines += [
            "",
            "A new exactly-once publisher's start (a transactional producer's `init_transactions` and the",
            f"marker's committed-offset fetch, what `OutboxPublisher._session` does before its first transaction): "
            f"{', '.join(fmt(x) for x in session)} ms.",
        ]
    lines += [
        "",
        "## Source -> sink on one worker process",
        "",
        f"`in` (source, 1 executor) -> `out` (sink, 1 executor), `nodes: 1`, over {n:,} messages already in",
        f"the input (a {PARTITIONS}-partition topic; a Redis stream for redis-stream), a checkpoint every",
        f"{CHECKPOINT_S} s (`checkpointIntervalSeconds`; the controller ticked every {TICK_S} s, as the",
        "integration tests run `local_controller`) for both deliveries. *messages/s*: messages visible to a",
        "reader (a `read_committed` consumer of every output partition; the output stream's length polled every",
        "10 ms) over the time from the worker running (`controller.start()` returned) to the last one: the",
        "worker's start (a process, imports, connections) is not counted, the first output's wait is. *first ->",
        "last*: the same messages over the time from the first visible one to the last (for exactly-once, the",
        "rate output is committed and published at once the pipeline is going). "
        f"{meta['rounds']} round(s), the order of the",
        "four runs reversed every other round; the median is shown, every run in the raw JSON.",
        "",
        "| source -> sink | delivery | messages/s (runs) | median | first -> last (median) "
        "| first visible after (s) | worker CPU µs per message | worker cores | broker / Redis CPU (s) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        for delivery in DELIVERIES:
            mine = [r for r in runs if r["kind"] == kind and r["delivery"] == delivery]
            if not mine:
                continue
            per_message = statistics.median(1e6 * r["cpu_s"]["worker"] / r["events"] for r in mine)
            broker = statistics.median(r["cpu_s"]["broker"] for r in mine)
            redis_cpu = statistics.median(r["cpu_s"]["redis"] for r in mine)
            lines.append(
                f"| {kind} -> {kind} | {delivery} | {', '.join(fmt(r['per_s']) for r in mine)} | "
                f"{fmt(rate[(kind, delivery)])} | {fmt(steady[(kind, delivery)])} | "
                f"{fmt(m['first'][(kind, delivery)], 2)} | {per_message:.1f} | "
                f"{statistics.median(cores(r) for r in mine):.2f} | {broker:.1f} / {redis_cpu:.1f} |"
            )
    kafka_alo, kafka_eo = rate[("kafka", "at-least-once")], rate[("kafka", "exactly-once")]
    redis_alo, redis_eo = rate[("redis-stream", "at-least-once")], rate[("redis-stream", "exactly-once")]
    lines += [
        "",
        "| ratio (medians) | at-least-once | exactly-once |",
        "|---|---:|---:|",
        f"| Kafka pipeline ÷ raw copy loop | {ratio(kafka_alo, copy)} | {ratio(kafka_eo, copy)} |",
        f"| Kafka pipeline ÷ raw consume | {ratio(kafka_alo, consume)} | {ratio(kafka_eo, consume)} |",
        f"| Kafka pipeline ÷ raw produce (idempotent; transactional for exactly-once) | {ratio(kafka_alo, produce)} | "
        f"{ratio(kafka_eo, txn)} |",
        f"| Kafka ÷ redis-stream | {ratio(kafka_alo, redis_alo)} | {ratio(kafka_eo, redis_eo)} |",
        "",
        f"Exactly-once ÷ at-least-once: Kafka {ratio(kafka_eo, kafka_alo)} (first -> last: "
        f"{ratio(steady[('kafka', 'exactly-once')], steady[('kafka', 'at-least-once')])}), redis-stream "
        f"{ratio(redis_eo, redis_alo)} (first -> last: "
        f"{ratio(steady[('redis-stream', 'exactly-once')], steady[('redis-stream', 'at-least-once')])}).",
        "",
        "## The CCR pause with Kafka sources and sinks",
        "",
        f"`in` (2 executors) -> `out` (2 executors) on 2 worker processes, {PARTITIONS}-partition topics, a",
        f"producer thread writing {CCR_RATE:,.0f} messages/s (values 0, 1, 2, ...) for "
        f"{CCR_BEFORE_S + CCR_AFTER_S:.0f} s; after {CCR_BEFORE_S:.0f} s a",
        "CCR migration (`controller.migrator.migrate`, scope `all`, the controller not ticking meanwhile, as",
        "when its own tick runs a scaling) to 3 processes, each vertex gaining a third executor on the new",
        "one (the Kafka source's partitions and the stream source's lanes are shared out again). *pause*: the",
        "driver's `pauseMs` (PREPARE sent -> every source resumed), with its phases; *prepare*: starting the",
        "new process and staging the new schedule before that, while everything runs. *output gap*: the",
        "longest time between two outputs a reader saw from the request to 4 s after the migration returned;",
        f"*steady gap*: the longest in the {-STEADY_WINDOW[0]:.0f}-{-STEADY_WINDOW[1]:.1f} s before the request"
        " (exactly-once output",
        "comes a checkpoint at a time, so its steady gap is about the checkpoint period). *after the pause*: the",
        "first output after the sources resumed (request + prepare + pause; exactly-once: what the migration's",
        "COMMIT staged, committed by its completion).",
        "Lost and duplicated: every input value against what the reader saw at the end.",
        "",
        "| source -> sink | delivery | outcome | pause (ms) | capture / commit / rebalance / restore (ms) "
        "| prepare (ms) | output gap (ms) | steady gap (ms) | output after the pause (ms) | lost | duplicated |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(ccr, key=lambda r: (KINDS.index(r["kind"]), DELIVERIES.index(r["delivery"]))):
        p = r["phases"]
        phases = " / ".join(fmt(p.get(k)) for k in ("captureMs", "commitMs", "rebalanceMs", "restoreMs"))
        outcome = r["outcome"] if r["outcome"] == "succeeded" else f"**{r['outcome']}**"
        lines.append(
            f"| {r['kind']} -> {r['kind']} | {r['delivery']} | {outcome} | {fmt(r['pauseMs'])} | {phases} | "
            f"{fmt(r['prepareMs'])} | {fmt(r['gapMs'])} | {fmt(r['steadyGapMs'])} | "
            f"{fmt(r.get('outputAfterPauseMs'))} | {r['lost']:,} | {r['duplicated']:,} |"
        )
    failed = [r for r in ccr if r["outcome"] != "succeeded"]
    for r in failed:
        reason = " ".join(str(r.get("reason") or "").split())
        lines += ["", f"{r['kind']} {r['delivery']}, {r['outcome']}: {reason[:400]}"]
    ccr_ratios = [
        f"{d}: pause {ratio(m['pause'][('kafka', d)], m['pause'][('redis-stream', d)])}, output gap "
        f"{ratio(m['gap'][('kafka', d)], m['gap'][('redis-stream', d)])}"
        for d in DELIVERIES
    ]
    lines += ["", "Kafka ÷ redis-stream (medians of the migrations that succeeded), " + "; ".join(ccr_ratios) + "."]
    found = findings(raw)
    if found:
        lines += ["", "## What the numbers mean", "", *found]
    lines += [
        "",
        "## Caveats",
        "",
        "- Two cores for everything: during a Kafka run the broker's JVM, the worker (its source and sink",
        "  threads, librdkafka's threads, for exactly-once the publisher thread), Redis (checkpoints; for",
        "  exactly-once the staged output and the outbox) and the benchmark's reader compete for them. The CPU",
        "  columns say where the time went; a broker on machines of its own would leave the worker more.",
        "- One broker, replication 1: no replication latency, which a production cluster adds to every",
        "  acknowledgement and every transaction commit (the exactly-once publisher commits one transaction per",
        f"  {TXN_BATCH:,} messages, one after the other).",
        "- The kafka source runs with `commitOffsets` off (the default: its offsets live in the checkpoints only)",
        "  and the sink with the connector's own producer settings (`linger.ms` 5, idempotent).",
        "- Nothing is compressed (`compression.type` none, the client's default) and the messages are tiny: per",
        "  message costs dominate; larger messages would move the limit to bytes, not messages.",
        "- The throughput runs read a pre-filled input: the source reads as fast as it can, so exactly-once",
        "  output waits in the sink's buffer, Redis and the outbox, and its rate is the publisher's. The CCR",
        f"  runs are at a steady {CCR_RATE:,.0f} messages/s, where the outbox is near empty when the migration",
        "  starts; one with a backlog in the outbox pauses longer: the old publisher drains it as its executor",
        "  closes, inside the pause, up to the 5 s a worker waits for a closing executor.",
        "",
        f"Raw results: `{meta['raw']}`; `python bench/kafka.py --report-only --raw {meta['raw']}` writes this",
        "page and the plot again.",
    ]
    return "\n".join(lines) + "\n"


def span(rows: Sequence[Mapping[str, Any]], kind: str, delivery: str, key: str) -> str:
    """`min-max` of a key over the runs of (kind, delivery), or the one value."""
    values = [r[key] for r in rows if r["kind"] == kind and r["delivery"] == delivery and r.get(key) is not None]
    if not values:
        return "-"
    low, high = min(values), max(values)
    return fmt(low) if round(low) == round(high) else f"{fmt(low)}-{fmt(high)}"


def cores(row: Mapping[str, Any]) -> float:
    """The worker's CPU seconds over the run's seconds: the share of a core it got."""
    return float(row["cpu_s"]["worker"]) / float(row["seconds"]) if row["seconds"] else 0.0


def findings(raw: Mapping[str, Any]) -> list[str]:
    """What the numbers say, written from the numbers (so `--report-only` of another run says it of that run)."""
    m = medians(raw)
    runs, ccr = raw["throughput"], raw["ccr"]
    rate, steady = m["rate"], m["steady"]
    out: list[str] = []

    def cpu_us(kind: str, delivery: str) -> float | None:
        mine = [
            1e6 * r["cpu_s"]["worker"] / r["events"] for r in runs if (r["kind"], r["delivery"]) == (kind, delivery)
        ]
        return statistics.median(mine) if mine else None

    def core_share(kind: str, delivery: str) -> str:
        mine = [cores(r) for r in runs if (r["kind"], r["delivery"]) == (kind, delivery)]
        return f"{min(mine):.2f}-{max(mine):.2f}" if len(mine) > 1 else (f"{mine[0]:.2f}" if mine else "-")

    alo, eo = rate[("kafka", "at-least-once")], rate[("kafka", "exactly-once")]
    us = cpu_us("kafka", "at-least-once")
    if alo and m["copy"] and us:
        against = "above" if alo >= m["copy"] else "below"
        out.append(
            f"- **At-least-once Kafka -> Kafka: {fmt(alo)} messages/s on one worker process** (runs "
            f"{span(runs, 'kafka', 'at-least-once', 'per_s')}), {alo / m['copy']:.2f}x the raw copy loop"
            f" ({against} it). The worker spends {us:.1f} µs of CPU per message (source and sink together), so a"
            f" whole core would carry about {fmt(round(1e6 / us, -3))} messages/s; it got"
            f" {core_share('kafka', 'at-least-once')}"
            " of a core (CPU seconds over the run's seconds): the broker, Redis, the benchmark's reader and, on"
            " this shared machine, other jobs had the rest."
            + (
                " The source and the sink are two threads and librdkafka does its I/O in threads of its own"
                " without the GIL, so the worker goes faster than one thread that reads and writes."
                if alo >= m["copy"]
                else ""
            )
        )
    if alo and eo:
        publisher = steady[("kafka", "exactly-once")]
        out.append(
            f"- **Exactly-once ÷ at-least-once, Kafka: {eo / alo:.2f}** ({fmt(eo)} vs {fmt(alo)} messages/s). The"
            " source reads as fast as with at-least-once; the output goes the long way: the sink's buffer is"
            " staged in Redis at each checkpoint, the checkpoint's completion moves it into the outbox, then"
            " one publisher thread (of sink executor 0, in the same process) reads it back and writes it in"
            f" {TXN_BATCH:,}-message transactions one after the other (read, decode, produce, flush and commit,"
            f" trim: nothing overlaps), at {fmt(publisher)} messages/s from its first output to its last, against"
            f" {fmt(m['txn'])}/s for the raw transactional producer. It costs the worker"
            f" {fmt(cpu_us('kafka', 'exactly-once'), 1)} µs of CPU per message against {fmt(us, 1)}, and Redis"
            " the staging and the outbox. The first output is visible"
            f" {fmt(m['first'][('kafka', 'exactly-once')], 1)} s after the worker runs: the first checkpoint"
            " stages everything read by then, and the publisher starts on it after the completion."
        )
    ralo, reo = rate[("redis-stream", "at-least-once")], rate[("redis-stream", "exactly-once")]
    rus = cpu_us("redis-stream", "at-least-once")
    if alo and ralo and eo and reo and rus:
        text = (
            f"- **Kafka ÷ redis-stream: {alo / ralo:.2f} at-least-once, {eo / reo:.2f} exactly-once.** The"
            " redis-stream source and sink read, decode and write in Python (redis-py): the worker spends"
            f" {rus:.1f} µs of CPU per message with them against {fmt(us, 1)} µs with Kafka's (librdkafka, C)."
        )
        if reo >= ralo:
            text += (
                f" Their exactly-once is faster than their at-least-once ({fmt(reo)} vs {fmt(ralo)}): at-least-once"
                " writes every batch in a transaction of its own with a token against repeats"
                " (`xadd_batch_once`), exactly-once stages a checkpoint's output at once and the completion"
                f" appends it in one script ({fmt(cpu_us('redis-stream', 'exactly-once'), 1)} µs of worker CPU per"
                " message); and it has no publisher after the commit, which is where Kafka's exactly-once loses."
            )
        else:
            text += " Their exactly-once has no publisher after the commit: the completion writes the stream."
        out.append(text)
    pause_k, pause_r = m["pause"][("kafka", "at-least-once")], m["pause"][("redis-stream", "at-least-once")]
    eo_k, eo_r = m["pause"][("kafka", "exactly-once")], m["pause"][("redis-stream", "exactly-once")]
    ok = succeeded(ccr)

    def phase(kind: str, delivery: str, name: str) -> float | None:
        mine = [r["phases"].get(name) for r in ok if r["kind"] == kind and r["delivery"] == delivery]
        values = [v for v in mine if v is not None]
        return statistics.median(values) if values else None

    if pause_k and pause_r and eo_k and eo_r:
        close = 0.75 <= pause_k / pause_r <= 1.34 and 0.75 <= eo_k / eo_r <= 1.34
        others = ("captureMs", "commitMs", "restoreMs")
        rest_k = sum(phase("kafka", d, p) or 0.0 for d in DELIVERIES for p in others) / 2
        rest_r = sum(phase("redis-stream", d, p) or 0.0 for d in DELIVERIES for p in others) / 2
        reb = {(k, d): phase(k, d, "rebalanceMs") for k in KINDS for d in DELIVERIES}
        out.append(
            f"- **The CCR pause with Kafka source and sink: {fmt(pause_k)} ms at-least-once, {fmt(eo_k)} ms"
            f" exactly-once (medians), against {fmt(pause_r)} and {fmt(eo_r)} ms with redis-stream**"
            + (" — about the same. " if close else f" ({pause_k / pause_r:.2f}x and {eo_k / eo_r:.2f}x). ")
            + "A Kafka source's position is an offset per partition and its sink holds little at COMMIT"
            " (at-least-once flushes its producer, exactly-once stages its buffer): capture, commit and restore"
            f" together take {fmt(rest_k)} ms with Kafka and {fmt(rest_r)} ms with redis-stream (medians, averaged"
            " over the deliveries). The difference is the *rebalance* phase, in which every executor of a"
            " scope-`all` migration closes and opens again: "
            f"{fmt(reb[('kafka', 'at-least-once')])} vs {fmt(reb[('redis-stream', 'at-least-once')])} ms"
            " at-least-once (where the Kafka clients are closed, the producer flushed, and new ones made),"
            f" {fmt(reb[('kafka', 'exactly-once')])} vs {fmt(reb[('redis-stream', 'exactly-once')])} ms"
            " exactly-once (the publisher too: next point). Starting the new process (*prepare*) takes longer"
            " than the pause, but before it, while everything runs."
        )
    eo_rebalance = m["rebalance"].get(("kafka", "exactly-once"))
    alo_rebalance = m["rebalance"].get(("kafka", "at-least-once"))
    if eo_rebalance is not None and alo_rebalance is not None:
        out.append(
            "- Closing sink executor 0 with exactly-once stops its publisher (`OutboxPublisher.close`: it"
            " ends the batch being written, waits out its outbox read (up to 50 ms) and closes its Kafka"
            " clients; what the outbox still holds is the next publisher's) inside the"
            f" pause: rebalance {fmt(eo_rebalance)} ms against {fmt(alo_rebalance)} ms at-least-once here. The"
            " new executor 0's publisher then starts a session (`init_transactions`, the marker:"
            f" {fmt(m['session'])} ms, median of the three above) before the migration's own output goes out:"
            f" {fmt(m['after'][('kafka', 'exactly-once')])} ms after the pause, against"
            f" {fmt(m['after'][('redis-stream', 'exactly-once')])} ms for redis-stream, whose completion writes"
            " the stream itself."
        )
    gap_eo, gap_reo = m["gap"][("kafka", "exactly-once")], m["gap"][("redis-stream", "exactly-once")]
    if gap_eo and gap_reo:
        out.append(
            f"- With exactly-once the output gap ({fmt(gap_eo)} ms Kafka, {fmt(gap_reo)} ms redis-stream) is"
            " several times the pause: the controller takes no periodic checkpoint while a migration runs,"
            " its *prepare* (the new process starting) included, so output stops from the last checkpoint"
            " before the request until the migration's completion commits what its COMMIT staged."
        )
    failed = [r for r in ccr if r["outcome"] != "succeeded"]
    exact = all(r["lost"] == 0 and r["duplicated"] == 0 for r in ccr)
    if ccr:
        out.append(
            "- "
            + (
                f"{len(failed)} of {len(ccr)} migrations did not succeed (the reason is under the table); they are"
                " left out of the medians. "
                if failed
                else ""
            )
            + (
                "No migration lost or duplicated a message."
                if exact
                else "Some run lost or duplicated messages: see the table."
            )
        )
    return out


def plot(raw: Mapping[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = medians(raw)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    bars: list[tuple[str, float | None, str]] = [
        ("raw\nproduce", m["produce"], "C7"),
        ("raw txn\nproduce", m["txn"], "C7"),
        ("raw\nconsume", m["consume"], "C7"),
        ("raw copy\nloop", m["copy"], "C7"),
    ]
    for kind, colour in (("kafka", "C0"), ("redis-stream", "C1")):
        for delivery in DELIVERIES:
            name = "Kafka" if kind == "kafka" else "redis-\nstream"
            bars.append((f"{name}\n{short(delivery)}", m["rate"][(kind, delivery)], colour))
    shown = [(label, value or 0.0, colour) for label, value, colour in bars]
    xs = range(len(shown))
    left.bar(xs, [v for _, v, _ in shown], color=[c for _, _, c in shown])
    runs = raw["throughput"]
    tops = [value for _, value, _ in shown]
    for x, (kind, delivery) in enumerate(((k, d) for k in KINDS for d in DELIVERIES), start=4):
        mine = [r["per_s"] for r in runs if r["kind"] == kind and r["delivery"] == delivery]
        left.scatter([x] * len(mine), mine, color="black", s=10, zorder=3, label="a run" if x == 4 else None)
        tops[x] = max([tops[x], *mine])
    pad = 0.015 * max(tops, default=1.0)
    for x, ((_, value, _), top) in enumerate(zip(shown, tops, strict=True)):
        left.text(x, top + pad, f"{value / 1000:,.1f}k", ha="center", va="bottom", fontsize=8)
    left.legend(fontsize=8)
    left.set_xticks(list(xs), [label for label, _, _ in shown], fontsize=8)
    left.set_ylabel("messages/s")
    left.set_title("Raw client (grey) and source -> sink on one worker process (medians)", fontsize=10)
    left.grid(axis="y", alpha=0.3)
    pairs = [(k, d) for k in KINDS for d in DELIVERIES if m["pause"][(k, d)] is not None]
    labels = [f"{'Kafka' if k == 'kafka' else 'redis-stream'}\n{short(d)}" for k, d in pairs]
    ok = succeeded(raw["ccr"])
    xs = range(len(pairs))
    width = 0.27
    right.bar([x - width for x in xs], [m["pause"][p] or 0 for p in pairs], width, label="pause (driver)")
    right.bar(xs, [m["gap"][p] or 0 for p in pairs], width, label="output gap")
    right.bar(
        [x + width for x in xs],
        [median_of(ok, k, d, "steadyGapMs") or 0 for k, d in pairs],
        width,
        label="steady gap",
    )
    right.set_xticks(list(xs), labels, fontsize=8)
    right.set_ylabel("ms")
    right.set_title("CCR scale-out 2 -> 3 processes (medians)", fontsize=10)
    right.legend(fontsize=8)
    right.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(raw: Mapping[str, Any], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "kafka.md"), "w", encoding="utf-8") as handle:
        handle.write(render(raw))
    plot(raw, os.path.join(out, "kafka.png"))


# -------------------------------------------------------------------------------------------------- main


def machine() -> str:
    memory = ""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", encoding="utf-8") as handle:
        memory = f", {int(handle.readline().split()[1]) / 1024 / 1024:.0f} GiB of memory"
    java = "?"
    with contextlib.suppress(Exception):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20).stderr
        java = out.splitlines()[0].split('"')[1]
    return (
        f"a shared {platform.machine()} machine with {os.cpu_count()} cores{memory}, Python "
        f"{platform.python_version()}, Java {java}"
    )


def code_version() -> str:
    with contextlib.suppress(Exception):
        head = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", REPO, "status", "--short", "--", "operator/src"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
        return f"commit {head}" + (f" with {len(changed)} uncommitted files under operator/src" if changed else "")
    return "an unknown commit"


def kafka_version() -> str:
    from support.kafka_broker import kafka_lib_dir

    with contextlib.suppress(Exception):
        for jar in sorted(os.listdir(kafka_lib_dir())):
            if jar.startswith("kafka_2.13-") and jar.endswith(".jar"):
                return jar.removeprefix("kafka_2.13-").removesuffix(".jar")
    return "?"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from support.kafka_broker import KafkaBroker, unique_name
    from support.redis_servers import RedisServer

    directory = tempfile.mkdtemp(prefix="elastream-bench-kafka-")
    broker = KafkaBroker()
    redis_server = RedisServer()
    try:
        log(f"starting a Kafka broker and a redis-server (scratch: {directory})")
        broker.start()
        redis_server.start()
        log(f"  broker on {broker.bootstrap} answered after {broker.last_start_s:.1f} s; Redis on {redis_server.url}")
        ctx = Context(broker, redis_server, directory)
        input_topic = unique_name("input")
        broker.create_topic(input_topic, PARTITIONS)
        log(f"[1/3] the raw client's rates, {args.events:,} messages")
        limit = limit_rows(broker, args.events, input_topic)
        log(f"[2/3] source -> sink on one worker process, {args.events:,} messages, {args.rounds} round(s)")
        order = [(k, d) for k in KINDS for d in DELIVERIES]
        runs = []
        for round_ in range(args.rounds):
            for kind, delivery in order if round_ % 2 == 0 else list(reversed(order)):
                runs.append(throughput_run(ctx, kind, delivery, args.events, input_topic))
        ccr = []
        if args.ccr_rounds:
            log(f"[3/3] CCR scale-out 2 -> 3 processes at {CCR_RATE:,.0f} messages/s, {args.ccr_rounds} round(s)")
            for round_ in range(args.ccr_rounds):
                for kind, delivery in order if round_ % 2 == 0 else list(reversed(order)):
                    ccr.append(ccr_run(ctx, kind, delivery))
    finally:
        broker.remove()
        redis_server.remove()
        shutil.rmtree(directory, ignore_errors=True)
    return {"limit": limit, "throughput": runs, "ccr": ccr}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000, help="messages per throughput run (500,000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the four throughput runs (2)")
    parser.add_argument("--ccr-rounds", type=int, default=2, help="rounds of the four CCR runs (2; 0: none)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks"))
    parser.add_argument("--raw", default=os.path.join(REPO, "docs", "benchmarks", "kafka.json"))
    parser.add_argument("--report-only", action="store_true", help="write the report from --raw, run nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        with open(args.raw, encoding="utf-8") as handle:
            write_report(json.load(handle), args.out)
        log(f"wrote {args.out}/kafka.md and kafka.png from {args.raw}")
        return 0
    import confluent_kafka

    started = time.monotonic()
    load_before = os.getloadavg()[1]
    code_before = code_version()  # the workers run the tree as it is on disk, which may change during the run
    results = measure(args)
    code_after = code_version()
    shown = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    raw_path = os.path.relpath(args.raw, REPO) if os.path.abspath(args.raw).startswith(REPO) else args.raw
    meta = {
        "command": f"python bench/kafka.py{' ' + shown if shown else ''}",
        "took_s": time.monotonic() - started,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "code": code_before if code_before == code_after else f"{code_before} (at the end: {code_after})",
        "kafka": kafka_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "events": args.events,
        "rounds": args.rounds,
        "ccr_rounds": args.ccr_rounds,
        # the machine's 5-minute load average when the run began and when it ended (2 cores: above 2, other
        # work was waiting for them too)
        "load": [round(load_before, 1), round(os.getloadavg()[1], 1)],
        "raw": raw_path,
    }
    raw = {"meta": meta, **results}
    os.makedirs(os.path.dirname(os.path.abspath(args.raw)), exist_ok=True)
    with open(args.raw, "w", encoding="utf-8") as handle:
        json.dump(raw, handle, separators=(",", ":"))
    write_report(raw, args.out)
    log(f"wrote {args.out}/kafka.md and kafka.png (raw: {args.raw}) in {meta['took_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
