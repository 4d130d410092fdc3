"""A worker's Prometheus exposition (`WorkerCollector`) as a scraper reads it: the metric contract of issue 40
(names, types, labels), and a sink's end-to-end latency histogram (`Counters.observe_sink_latencies`)."""

from __future__ import annotations

import random
import threading
import time
from bisect import bisect_left
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from elastream.core.migration_protocol import ExecutorParticipant
from elastream.core.topology import parse_manifest
from elastream.runtime.executor import LATENCY_BUCKETS_S, Counters, ExecutorThread
from elastream.runtime.operators import Context
from elastream.runtime.operators.builtin import Work
from elastream.runtime.operators.sinks import NullSink
from elastream.runtime.participant import Migration
from elastream.runtime.source_thread import SourceThread
from elastream.runtime.transport import DataPlaneStats
from elastream.runtime.worker_metrics import WorkerCollector, source_positions
from elastream.store.codec import unpack
from support.manifests import edge, manifest, sink, src, work
from support.waiting import wait_until

EXECUTOR_LABELS = {"namespace", "topology", "node", "vertex", "executor"}
#: latencies (s) away from any bucket bound, and the bound of the bucket each falls in
KNOWN = [(0.0004, "0.001"), (0.003, "0.005"), (0.003, "0.005"), (0.2, "0.25"), (0.7, "1.0"), (40.0, "+Inf")]


class Store:
    def save(self, mid: str, checkpoint: Any, token: str | None = None) -> None:
        pass

    def ack(self, mid: str, phase: str, executor: str, info: Any = None) -> None:
        pass


class Router:
    """What an executor's router is asked while it processes a batch (nothing goes anywhere)."""

    def route(self, event: Any) -> None:
        pass

    def route_batch(self, events: list[Any]) -> None:
        pass

    def flush(self) -> None:
        pass

    def take_blocked(self) -> float:
        return 0.0


class KafkaLike:
    """A source operator that tells its consumer lag per partition, as the kafka source does."""

    topic = "clicks"

    def partition_lag(self) -> dict[int, int]:
        return {1: 0, 0: 7}


def thread(executor: str, operator: Any, kind: str) -> ExecutorThread | SourceThread:
    vertex = executor.split("#")[0]
    migration = Migration(executor, Store(), ExecutorParticipant(executor, frozenset()))  # type: ignore[arg-type]
    context = Context(vertex, 0, 1, 8, {})
    stop = threading.Event()
    if kind == "source":
        source = SourceThread(executor, operator, context, Router(), stop, migration)  # type: ignore[arg-type]
        source.opened = True
        return source
    operator.open(context)
    return ExecutorThread(executor, operator, context, None, Router(), stop, kind == "sink", migration)  # type: ignore[arg-type]


def worker() -> Any:
    """A worker of topology team-a/pageload on node n2 running a kafka-like source, a middle vertex's executor
    and a sink whose events had the `KNOWN` latencies, with a few data-plane drops."""
    topology = parse_manifest(
        {
            **manifest([src("src"), work("w", 2), sink("out")], [edge("src", "w"), edge("w", "out")], name="pageload"),
            "metadata": {"name": "pageload", "namespace": "team-a"},
        }
    )
    source, middle, out = (
        thread("src#0", KafkaLike(), "source"),
        thread("w#1", Work(), "logic"),
        thread("out#0", NullSink(), "sink"),
    )
    source.counters.received, source.counters.processed, source.counters.queue_len = 50, 40, -1
    middle.counters.received, middle.counters.processed, middle.counters.emitted = 30, 29, 29
    middle.counters.busy_s, middle.counters.errors, middle.counters.queue_len = 0.25, 2, 3
    middle.counters.latency_sum_s, middle.counters.latency_count = 0.5, 10  # a middle vertex's per-event time
    now = time.time()
    out.counters.observe_sink_latencies(now, [(i, 0, 0, now - age) for i, (age, _) in enumerate(KNOWN)])
    out.counters.processed = len(KNOWN)
    data_plane = DataPlaneStats()
    data_plane.drop("malformed")
    data_plane.refuse("auth", 2)
    return SimpleNamespace(topology=topology, node="n2", threads=[source, middle, out], data_plane=data_plane)


def scrape(state: Any) -> tuple[str, dict[str, Any]]:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(WorkerCollector(state))
    text = generate_latest(registry).decode()
    return text, {family.name: family for family in text_string_to_metric_families(text)}


def samples(family: Any, name: str | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if name is None or s.name == name}


def labels(executor: str, **extra: str) -> tuple[tuple[str, str], ...]:
    base = {"namespace": "team-a", "topology": "pageload", "node": "n2", "vertex": executor.split("#")[0]}
    return tuple(sorted({**base, "executor": executor, **extra}.items()))


def test_every_worker_series_has_the_contracts_name_type_and_labels() -> None:
    text, families = scrape(worker())
    assert set(families) == {
        "elastream_executor_received",
        "elastream_executor_processed",
        "elastream_executor_emitted",
        "elastream_executor_errors",
        "elastream_executor_busy_seconds",
        "elastream_executor_queued_events",
        "elastream_sink_latency_seconds",
        "elastream_source_partition_lag",
        "elastream_data_plane_dropped_frames",
        "elastream_data_plane_refused_handshakes",
    }
    kinds = {name: family.type for name, family in families.items()}
    assert kinds["elastream_executor_queued_events"] == "gauge"
    assert kinds["elastream_source_partition_lag"] == "gauge"
    assert kinds["elastream_sink_latency_seconds"] == "histogram"
    assert {name for name, kind in kinds.items() if kind == "counter"} == {
        name for name in families if name.startswith(("elastream_executor_", "elastream_data_plane_"))
    } - {"elastream_executor_queued_events"}
    for name in ("received", "processed", "emitted", "errors", "busy_seconds"):
        # counters read `_total` on the wire, once (not `_total_total`)
        assert f'elastream_executor_{name}_total{{executor="w#1",namespace="team-a",' in text
        assert f"_{name}_total_total" not in text
    for name in ("elastream_executor_queue_length", "elastream_executor_latency_ms", "_latency_ms"):
        assert name not in text
    for name, family in families.items():
        extra = {"elastream_source_partition_lag": {"topic", "partition"}}.get(name, set())
        if name.startswith("elastream_data_plane_"):
            expected = {"namespace", "topology", "node", "reason"}
        elif name == "elastream_sink_latency_seconds":
            expected = EXECUTOR_LABELS | {"le"}
        else:
            expected = EXECUTOR_LABELS | extra
        assert {frozenset(s.labels) for s in family.samples if not s.name.endswith(("_sum", "_count"))} == {
            frozenset(expected)
        }, name


def test_the_executor_counters_and_queue_are_each_executors_own() -> None:
    _, families = scrape(worker())
    assert samples(families["elastream_executor_processed"]) == {
        labels("src#0"): 40.0,
        labels("w#1"): 29.0,
        labels("out#0"): float(len(KNOWN)),
    }
    assert samples(families["elastream_executor_received"])[labels("src#0")] == 50.0
    assert samples(families["elastream_executor_errors"])[labels("w#1")] == 2.0
    assert samples(families["elastream_executor_busy_seconds"])[labels("w#1")] == 0.25
    # a negative queue length (a source that overtook its count) is served as 0
    assert samples(families["elastream_executor_queued_events"]) == {
        labels("src#0"): 0.0,
        labels("w#1"): 3.0,
        labels("out#0"): 0.0,
    }


def test_only_a_sink_has_a_latency_histogram_with_the_events_in_their_buckets() -> None:
    _, families = scrape(worker())
    latency = families["elastream_sink_latency_seconds"]
    assert {s.labels["executor"] for s in latency.samples} == {"out#0"}
    buckets = {s.labels["le"]: s.value for s in latency.samples if s.name.endswith("_bucket")}
    assert list(buckets) == [*map(str, LATENCY_BUCKETS_S), "+Inf"]
    expected = {le: float(sum(1 for _, at in KNOWN if float(at) <= float(le))) for le in buckets}
    assert buckets == expected
    assert buckets["0.001"] == 1.0 and buckets["0.005"] == 3.0 and buckets["30.0"] == 5.0
    assert samples(latency, "elastream_sink_latency_seconds_count") == {labels("out#0"): float(len(KNOWN))}
    [total] = samples(latency, "elastream_sink_latency_seconds_sum").values()
    assert total == pytest.approx(sum(age for age, _ in KNOWN), abs=1e-3)


def test_a_kafka_sources_executor_keeps_its_partition_lag_and_the_data_plane_its_reasons() -> None:
    _, families = scrape(worker())
    assert samples(families["elastream_source_partition_lag"]) == {
        labels("src#0", topic="clicks", partition="0"): 7.0,
        labels("src#0", topic="clicks", partition="1"): 0.0,
    }
    node = {"namespace": "team-a", "topology": "pageload", "node": "n2"}
    dropped = samples(families["elastream_data_plane_dropped_frames"])
    assert dropped[tuple(sorted({**node, "reason": "malformed"}.items()))] == 1.0
    assert {dict(key)["reason"] for key in dropped} == {"malformed", "unauthenticated", "sender", "control"}
    refused = samples(families["elastream_data_plane_refused_handshakes"])
    assert refused[tuple(sorted({**node, "reason": "auth"}.items()))] == 2.0


def test_a_worker_with_nothing_running_serves_the_data_plane_only() -> None:
    state = worker()
    state.threads = []
    _, families = scrape(state)
    assert {name for name, family in families.items() if family.samples} == {
        "elastream_data_plane_dropped_frames",
        "elastream_data_plane_refused_handshakes",
    }


@pytest.mark.parametrize("size", [1, 2, 7, 64, 512])
def test_the_histogram_counts_each_event_where_a_bisect_of_its_own_latency_puts_it(size: int) -> None:
    """The per-batch counting (sorted stamps, one bisect per bound) agrees with classifying each event alone,
    whatever the order of the batch, over latencies from 0.1 ms to 100 s (and a sink clock behind: < 0)."""
    rng = random.Random(size)
    counters = Counters(latency_buckets=[0] * (len(LATENCY_BUCKETS_S) + 1))
    expected = [0] * (len(LATENCY_BUCKETS_S) + 1)
    now = 1_800_000_000.0
    for _ in range(5):
        ages = [10 ** rng.uniform(-4, 2) for _ in range(size)]
        if size > 1:
            ages[0] = -0.01
        events = [(i, 0, 0, now - age) for i, age in enumerate(ages)]
        rng.shuffle(events)
        counters.observe_sink_latencies(now, events)
        for event in events:
            expected[bisect_left(LATENCY_BUCKETS_S, now - event[3])] += 1
    assert counters.latency_buckets == expected
    assert counters.latency_count == 5 * size


def test_a_sinks_processed_batch_reaches_the_histogram_and_the_intervals_mean() -> None:
    sink_thread = thread("out#0", NullSink(), "sink")
    middle = thread("w#0", Work(), "logic")
    assert isinstance(sink_thread, ExecutorThread) and isinstance(middle, ExecutorThread)
    now = time.time()
    sink_thread.process_batch([(i, 0, 0, now - 0.3) for i in range(4)], "w#0")
    counters = sink_thread.counters
    assert counters.latency_buckets is not None
    assert counters.latency_buckets[LATENCY_BUCKETS_S.index(0.5)] == 4 and sum(counters.latency_buckets) == 4
    assert counters.latency_total_s == pytest.approx(1.2, abs=0.5)
    assert counters.take_latency_ms() == pytest.approx(300.0, abs=150.0)  # what the metric stream carries
    middle.process_batch([(i, 0, 0, now - 0.3) for i in range(4)], "s#0")
    assert middle.counters.latency_buckets is None and middle.counters.latency_count == 4


def test_a_batch_behind_the_source_clock_adds_no_negative_sum() -> None:
    counters = Counters(latency_buckets=[0] * (len(LATENCY_BUCKETS_S) + 1))
    counters.observe_sink_latencies(100.0, [(0, 0, 0, 100.5), (1, 0, 0, 100.2)])
    assert counters.latency_total_s == 0.0 and counters.latency_buckets[0] == 2
    assert counters.latency_sum_s == pytest.approx(-0.7)  # the interval's mean stays what it was
    counters.observe_sink_latencies(100.0, [])
    assert counters.latency_count == 2


class PositionReaders:
    """A source operator (done: it polls nothing) whose position says how often it was read, and by which
    threads."""

    def __init__(self) -> None:
        self.readers: list[int] = []

    def open(self, context: Context) -> None:
        pass

    def close(self) -> None:
        pass

    def exhausted(self) -> bool:
        return True

    def position(self) -> dict[str, int]:
        self.readers.append(threading.get_ident())
        return {"reads": len(self.readers)}


def test_a_running_source_position_is_read_on_its_own_thread_and_a_stopped_one_last():
    """The metrics thread publishes the sources' positions; while a source runs, only its own thread may read
    its operator (`Synthetic.position` settles its lanes: read beside a poll, it made the poll emit a lane's
    last events a second time or fail), so the worker gets the position the source's loop read for it."""
    operator = PositionReaders()
    source = thread("src#0", operator, "source")
    assert isinstance(source, SourceThread)
    source.start()
    try:
        published = wait_until(lambda: source_positions([source]), 5.0, "a position published")
        assert set(published) == {"src#0"}
        assert set(operator.readers) == {source.ident}  # never the metrics thread's
    finally:
        source.stop.set()
        source.join(5.0)
    last = source_positions([source])  # stopped: its operator's own, read here
    assert unpack(last["src#0"]) == {"reads": len(operator.readers)}
    assert operator.readers[-1] == threading.get_ident()
