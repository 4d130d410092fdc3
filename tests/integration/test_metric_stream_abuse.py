"""A topology's metric stream is written by its workers, which run the tenant's code: on a real Redis, what the
operator reads of it stays bounded and what it cannot use is skipped and counted, never raised.

- A gigabyte-class stream (hundreds of MB of entries too large or with too many fields, old and inside the
  analysis window): the controller's tick, a restarted controller's first tick and the hot-window analysis
  each cost the operator a few MB, not the stream's size, and a restart does not read the stream again.
- Without the scan script (a Redis user that may not run scripts) the same caps hold on plain pages.
- A key of another type where the stream should be is a skipped entry, not Redis being away.
- A running topology on local worker processes, with a NaN, a wrong type, a missing field, a huge value and
  a binary blob added to its stream, still completes checkpoints after them, and the counter and the warning
  event saw them.
"""

from __future__ import annotations

import contextlib
import gc
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY
from test_control_faults import Events, ticking

from elastream.analysis import Analyzer
from elastream.analysis.sources import HotWindow, read_hot_window
from elastream.control.backends.local import LocalCluster
from elastream.control.controller import TopologyController
from elastream.control.local_mode import local_controller
from elastream.control.metrics import MetricArchiver, StreamMetricSource, archive_cursor_key
from elastream.control.monitor import FOLLOW_BUDGET_ENTRIES
from elastream.core.metrics import MetricSample
from elastream.core.topology import Topology, parse_manifest
from elastream.crd import load_manifest
from elastream.store.checkpoint_store import CheckpointStore
from elastream.store.metric_stream import _NO_SCRIPTS, MetricStream, metric_stream_key, read_bytes
from elastream.store.registry import client_for
from support.fakes import DictStatus, FakeBackend, FakeClock, FakeMigrator, ListEvents, ListRequests, SimulatedMetrics
from support.harness import write_manifest
from support.manifests import by_key, count, edge, manifest, sink, src

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
#: what the operator may allocate for one read of a stream of hundreds of MB (its Python heap and its RSS)
BOUND = 32 * MIB


def small_topology(name: str = "flood") -> Topology:
    return parse_manifest(manifest([src("s", 2), sink("z", 1)], [edge("s", "z")], name=name, nodes=1))


#: when every executor of these tests started
STARTED = 1.0e9


def sample(executor: str, at: float, done: int, **changes: Any) -> dict[str, str]:
    """A valid sample's stream fields (`done` events received, processed and emitted), with `changes`
    (strings or bytes) over them."""
    vertex = executor.partition("#")[0]
    base = MetricSample(at, "node-0", vertex, executor, STARTED, done, done, done, 0.1, 0)
    return {k: str(v) for k, v in {**base.to_dict(), **changes}.items()}


def flood(client: redis.Redis, key: str, at_ms: int, huge: int, crowded: int) -> int:
    """Entries with explicit ids at `at_ms`: `huge` samples with a 1 MiB node name, `crowded` samples with 40
    extra fields of 100 bytes (both decode as samples to a reader without caps). Returns the bytes written."""
    written, seq = 0, 0
    pipe = client.pipeline(transaction=False)
    megabyte = "n" * MIB
    for i in range(huge):
        pipe.xadd(key, sample("s#0", at_ms / 1000.0, i, node=megabyte), id=f"{at_ms}-{seq}")
        seq, written = seq + 1, written + MIB
        if i % 16 == 15:
            pipe.execute()
    extra = {f"extra-{j:02d}": "x" * 100 for j in range(40)}
    for i in range(crowded):
        pipe.xadd(key, {**sample("s#1", at_ms / 1000.0, i), **extra}, id=f"{at_ms}-{seq}")  # type: ignore[arg-type]
        seq, written = seq + 1, written + 40 * 109
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    return written


def recent(client: redis.Redis, key: str, now: float, rounds: int = 3) -> None:
    """Valid samples of every executor for the last `rounds` seconds (Redis gives them ids now)."""
    for r in range(rounds):
        ts = now - (rounds - 1 - r)
        for executor in ("s#0", "s#1", "z#0"):
            client.xadd(key, sample(executor, ts, 1000 * (r + 1)))  # type: ignore[arg-type]


def controller_over(client: redis.Redis, topology: Topology) -> tuple[TopologyController, ListEvents]:
    """A controller whose metric feed is the real stream (the rest in memory)."""
    backend, events = FakeBackend(), ListEvents()
    controller = TopologyController(
        topology=topology,
        backend=backend,  # type: ignore[arg-type]
        metrics=SimulatedMetrics(topology, backend),
        migrator=FakeMigrator(backend),
        feed=MetricStream(client, topology.redis_prefix),
        requests=ListRequests(),
        status=DictStatus(),
        events=events,
        clock=FakeClock(),
    )
    return controller, events


@contextlib.contextmanager
def allocated() -> Iterator[Callable[[], tuple[int, int]]]:
    """While the block runs, the Python heap's peak growth (tracemalloc) and the process' peak RSS growth
    (VmHWM after resetting it through /proc/self/clear_refs; 0 where that is not allowed)."""
    gc.collect()
    rss = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        reset = True
    except OSError:
        reset = False
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result: list[int] = [0, 0]
    try:
        yield lambda: (result[0], result[1])
    finally:
        result[0] = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        result[1] = max(0, _status("VmHWM") - rss) if reset else 0


def _status(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.timeout(300)
def test_a_gigabyte_class_metric_stream_costs_the_operator_a_bounded_read(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    topology = small_topology()
    key = metric_stream_key(topology.redis_prefix)
    now_s, _ = client.time()  # type: ignore[misc]
    now_ms = int(now_s) * 1000
    client.xadd(key, sample("s#0", now_ms / 1000.0 - 700, 1), id=f"{now_ms - 700_000}-0")  # type: ignore[arg-type]
    # an old flood (10 minutes ago) and one inside the analysis window (20 s ago), then valid samples
    written = flood(client, key, now_ms - 600_000, huge=128, crowded=0)
    written += flood(client, key, now_ms - 20_000, huge=64, crowded=30_000)
    recent(client, key, time.time())
    assert written > 300 * MIB
    try:
        # a controller adopting the topology after an operator restart (no position): the stream's last
        # seconds only, the floods never read
        adopting, _ = controller_over(client, topology)
        with allocated() as grew:
            adopting.tick()
        heap, rss = grew()
        read = adopting.follower.last
        assert read is not None and read.scanned <= 9 and read.scanned_bytes < MIB, read
        assert heap < BOUND and rss < 2 * BOUND, (heap, rss)
        assert adopting.live.throughput() > 0  # and the live view has what it needs

        # a controller that started before the floods: its next read stops at the budget and skips the
        # backlog to the stream's last seconds, unread; the read after has the newest samples
        running, events = controller_over(client, topology)
        running.start()  # its position: the (fake) start time, long before every entry
        with allocated() as grew:
            running.tick()
        heap, rss = grew()
        read = running.follower.last
        assert read is not None and read.truncated and read.oversized > 0, read
        assert read.scanned_bytes <= read_bytes(FOLLOW_BUDGET_ENTRIES) + MIB  # one entry past the budget at most
        assert heap < BOUND and rss < 2 * BOUND, (heap, rss)
        running.tick()
        assert running.live.throughput() > 0
        skipped = [e for e in events.events if e[0] == "MetricSamplesSkipped"]
        assert len(skipped) == 1 and skipped[0][2] and "oversized" in skipped[0][1], events.events

        # the analysis reads from the window's computed start id (the old flood is never read) and at most
        # its budget of the flood inside the window, newest first
        source = StreamMetricSource(client, topology, Analyzer("python"), interval_s=1.0)
        with allocated() as grew:
            analysis = source.analyse(window=5)
        heap, rss = grew()
        assert heap < BOUND and rss < 2 * BOUND, (heap, rss)
        assert analysis.snapshot.vertices["s"].processing_rate > 0
    finally:
        client.delete(key)
        client.close()


def test_without_the_scan_script_plain_pages_keep_the_caps(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    topology = small_topology("plain")
    key = metric_stream_key(topology.redis_prefix)
    admin.acl_setuser("noscripts", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@scripting"])
    now_s, _ = admin.time()  # type: ignore[misc]
    written = flood(admin, key, int(now_s) * 1000 - 60_000, huge=0, crowded=2000)
    written += flood(admin, key, int(now_s) * 1000 - 30_000, huge=48, crowded=0)
    recent(admin, key, time.time())
    host, port = admin.connection_pool.connection_kwargs["host"], admin.connection_pool.connection_kwargs["port"]
    client = redis.Redis(host=host, port=port, username="noscripts", password="pw")
    try:
        stream = MetricStream(client, topology.redis_prefix)
        with allocated() as grew:
            samples = stream.read_since(None)
        heap, _ = grew()
        assert {s.executor for s in samples} == {"s#0", "s#1", "z#0"} and len(samples) == 9
        read = stream.last_read
        assert read.oversized == 48 + 2000 and read.malformed == 0 and not read.truncated, read
        # plain pages shrink to the entries seen: the first holds 16 entries, the next about PAGE_SCAN_BYTES of
        # them. A weaker bound than the script's (which never returns an oversized entry): a page of small
        # entries grows, and the next may hold that many large ones
        assert heap < 40 * MIB, heap
    finally:
        admin.delete(key)
        admin.acl_deluser("noscripts")
        admin.close()
        client.close()


def test_a_key_of_another_type_is_a_skipped_entry_and_the_tick_goes_on(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    topology = small_topology("wrongtype")
    client.set(metric_stream_key(topology.redis_prefix), "not a stream")
    controller, events = controller_over(client, topology)
    controller.start()
    try:
        for _ in range(3):
            controller.tick()
        assert controller.store_error == ""  # Redis answers: it is not away
        assert [e[0] for e in events.events].count("MetricSamplesSkipped") == 1
        assert "is not a stream" in next(e[1] for e in events.events if e[0] == "MetricSamplesSkipped")
        source = StreamMetricSource(client, topology, Analyzer("python"), interval_s=1.0)
        assert source.analyse(window=5).samples_used == 0
    finally:
        client.delete(metric_stream_key(topology.redis_prefix))
        client.close()


def test_the_archive_resumes_by_entry_id_and_a_garbage_cursor_starts_over(tmp_path, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    topology = small_topology("archive")
    key = metric_stream_key(topology.redis_prefix)
    recent(client, key, time.time())
    client.xadd(key, sample("s#0", time.time(), 5, ts="nan"))  # type: ignore[arg-type]
    path = str(tmp_path / "archive")
    try:
        archiver = MetricArchiver(client, topology, path, batch=2)
        assert archiver.archive_once() == 9  # the NaN sample skipped
        recent(client, key, time.time() + 10, rounds=1)
        assert archiver.archive_once() == 3  # only what came after the cursor
        client.set(archive_cursor_key(topology, path), "(garbage")
        assert archiver.archive_once() == 12  # a cursor that is no entry id: from the start (at least once)
    finally:
        client.delete(key)
        client.close()


# ------------------------------------------------------------------------ a running topology


def skipped_total(topology: Topology, reason: str) -> float:
    labels = {"namespace": topology.namespace, "topology": topology.name, "reason": reason}
    return REGISTRY.get_sample_value("elastream_metric_samples_skipped_total", labels) or 0.0


@pytest.mark.timeout(300)
def test_a_malformed_sample_is_skipped_counted_and_the_topology_still_checkpoints(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [src("s", 1, rate=100, keys=8), count("c", 1), sink("z", 1)],
        [by_key("s", "c"), edge("c", "z")],
        name="garbage",
        nodes=1,
        slotsPerNode=4,
        scaling={"checkpointIntervalSeconds": 1},
    )
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    events = Events()
    cluster = LocalCluster(topology, path, redis_url, interval_s=0.5)
    controller = local_controller(topology, cluster, Analyzer(engine="python"), events=events)
    store = CheckpointStore(cluster.client, topology.redis_prefix)

    def latest() -> str | None:
        found = store.latest_checkpoint()
        return None if found is None else str(found["id"])

    before = skipped_total(topology, "malformed"), skipped_total(topology, "oversized")
    with cluster, controller:
        controller.start()
        ticking(controller, 60.0, until=lambda: latest() is not None)
        first = latest()
        assert first is not None, events.seen
        key = metric_stream_key(topology.redis_prefix)
        now = time.time()
        garbage: list[dict[str, Any]] = [
            sample("s#0", now, 10, ts="nan"),
            sample("s#0", now, 10, processed="a lot"),
            {k: v for k, v in sample("c#0", now, 10).items() if k != "vertex"},
            sample("z#0", now, 10, received=str(10**30)),
            {"ts": b"\x00\xff\xfe", "blob": b"\x89PNG" * 10},
            sample("s#0", now, 10, node="n" * 100_000),
            {f"f{i}": "1" for i in range(64)},
        ]
        for entry in garbage:
            cluster.client.xadd(key, entry)  # type: ignore[arg-type]
        injected = cluster.client.xrevrange(key, count=1)[0][0]
        ticking(controller, 60.0, until=lambda: (latest() or "") != first and controller.follower.last is not None)
        # at least one checkpoint completed after the garbage was read (a round that began before it may end
        # first: wait for a second one)
        seen_after = latest()
        ticking(controller, 60.0, until=lambda: latest() != seen_after)
        assert latest() not in (first, seen_after), events.seen
    assert controller.store_error == ""
    assert skipped_total(topology, "malformed") - before[0] == 5
    assert skipped_total(topology, "oversized") - before[1] == 2
    told = [message for reason, message in events.seen if reason == "MetricSamplesSkipped"]
    assert len(told) == 1 and "skipped 5 malformed, 2 oversized" in told[0], events.seen
    assert "ts 'nan'" in told[0]
    assert injected


def test_the_kept_hot_window_reads_each_entry_once_and_agrees_with_a_fresh_read(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    topology = small_topology("hot")
    stream = MetricStream(client, topology.redis_prefix)
    hot = HotWindow(stream, budget=10_000)
    base = 1_700_000_000.0
    try:
        for batch in range(4):
            samples = [
                MetricSample(base + t, "node-0", e.partition("#")[0], e, base, 10 * t, 10 * t, 10 * t, 0.1 * t, 0)
                for t in range(15 * batch, 15 * (batch + 1))
                for e in ("s#0", "s#1", "z#0")
            ]
            stream.publish(samples)
            kept = hot.read(10, 1.0)
            if batch:  # the entries added since the last read, no more
                assert stream.last_read.scanned == len(samples)
            fresh = read_hot_window(MetricStream(client, topology.redis_prefix), 10, 1.0)
            assert kept == fresh and len(kept) == 3 * min(21, 15 * (batch + 1)), batch  # ts >= newest - 20 s
        # a window that grew is read afresh; one cut off by not_before is empty
        assert hot.read(20, 1.0) == read_hot_window(MetricStream(client, topology.redis_prefix), 20, 1.0)
        assert hot.read(10, 1.0, not_before=base + 100.0) == []
        # the stream replaced by one whose entries lie before the position: read afresh
        client.delete(stream.key)
        client.xadd(stream.key, sample("s#0", base + 1, 2), id="1-1")  # type: ignore[arg-type]
        assert [s.ts for s in hot.read(10, 1.0)] == [base + 1]
    finally:
        client.delete(stream.key)
        client.close()


def test_the_scan_script_reads_a_stream_on_a_redis_cluster(redis_cluster_url: str) -> None:
    client = client_for(redis_cluster_url)
    topology = small_topology("clustered")
    stream = MetricStream(client, topology.redis_prefix)
    try:
        recent(client, stream.key, time.time())
        client.xadd(stream.key, sample("s#0", time.time(), 1, node="n" * 1000))  # type: ignore[arg-type]
        assert len(stream.read_since(None)) == 9 and stream.last_read.oversized == 1
        assert client not in _NO_SCRIPTS  # the script ran, on the primary that holds the topology's slot
        read = stream.read_forward("-", max_entries=4)
        assert read.truncated and len(read.samples) == 4
        assert len(stream.read_forward(read.next_start).samples) == 5
    finally:
        client.delete(stream.key)
        client.close()
