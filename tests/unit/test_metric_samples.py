"""What the operator takes from a topology's metric stream, which the topology's workers (tenant code) write:
`codec.decode_sample` accepts a valid sample and refuses anything else with `SnapshotError` (never another
exception, never a NaN, a negative count or an unbounded value inside a sample); the controller's live read
skips and counts what it refused (`SkippedSamples`: a counter per topology and a warning event at most once a
minute) and its tick goes on; the live view keeps executors of the topology only. Without a Redis: the
stream's reads on a real one are tests/integration/test_metric_stream_abuse.py."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from elastream.control.metrics import SkippedSamples, hot_window_budget
from elastream.control.monitor import LiveRates, SampleFollower
from elastream.core.metrics import MetricSample, SnapshotError
from elastream.core.topology import parse_manifest
from elastream.store.codec import MAX_SAMPLE_COUNT, MAX_SAMPLE_FLOAT, MAX_SAMPLE_TS, decode_sample
from elastream.store.metric_stream import StreamRead, id_order, is_entry_id, stream_start
from support.fakes import FakeClock, ListEvents, ListFeed
from support.manifests import edge, manifest, sink, src

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SAMPLE = MetricSample(
    ts=1_700_000_000.5,
    node="node-0",
    vertex="s",
    executor="s#1",
    started_at=1_699_999_000.25,
    received=10,
    processed=9,
    emitted=8,
    busy_s=0.5,
    queue_len=1,
    latency_ms=2.5,
    errors=0,
)


def fields(sample: MetricSample = SAMPLE, **changes: Any) -> dict[bytes, bytes]:
    """A sample's stream entry as redis-py returns it (bytes), with `changes` (None: the field removed)."""
    data: dict[str, Any] = {**sample.to_dict(), **changes}
    return {k.encode(): (v if isinstance(v, bytes) else str(v).encode()) for k, v in data.items() if v is not None}


def topology():
    return parse_manifest(manifest([src("s", 2), sink("z", 1)], [edge("s", "z")], name="t"))


# ------------------------------------------------------------------------------------------ decoding


def test_a_published_sample_decodes_to_itself_from_bytes_or_text() -> None:
    assert decode_sample(fields()) == SAMPLE
    assert decode_sample({k.decode(): v.decode() for k, v in fields().items()}) == SAMPLE
    # the optional fields default; extra fields are ignored
    assert decode_sample(fields(latency_ms=None, errors=None, extra="x")) == MetricSample(
        **{**SAMPLE.to_dict(), "latency_ms": 0.0, "errors": 0}
    )


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"ts": "nan"}, "ts 'nan' is not between 0"),
        ({"ts": "inf"}, "ts 'inf' is not between 0"),
        ({"ts": "-1"}, "ts '-1' is not between 0"),
        ({"ts": "1e300"}, "ts '1e300' is not between 0"),
        ({"busy_s": "NaN"}, "busy_s 'NaN'"),
        ({"latency_ms": "-0.5"}, "latency_ms '-0.5'"),
        ({"processed": "-3"}, "processed '-3' is not between 0 and 2^53"),
        ({"processed": "1.5"}, "processed '1.5' is not an integer"),
        ({"received": str(2**60)}, "received"),
        ({"emitted": "9" * 5000}, "is not a count"),
        ({"queue_len": "many"}, "queue_len 'many' is not an integer"),
        ({"ts": "yesterday"}, "ts 'yesterday' is not a number"),
        ({"vertex": None}, "has no vertex"),
        ({"ts": None}, "has no ts"),
        ({"executor": ""}, "executor '' is empty"),
        ({"node": "n" * 300}, "characters) is empty or longer than 256"),
        ({"node": b"\xff\xfe"}, "is not UTF-8 text"),
    ],
)
def test_a_malformed_sample_is_refused_with_a_short_reason(change: dict[str, Any], said: str) -> None:
    with pytest.raises(SnapshotError, match="metric sample") as refused:
        decode_sample(fields(**change))
    assert said in str(refused.value)
    assert len(str(refused.value)) < 200  # never the whole value a worker chose


def text_or_bytes() -> st.SearchStrategy[str | bytes]:
    numbers = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.sampled_from(["nan", "-inf", "1e309", "0x10", "", " 7 ", "1_000", "٣"]),
    )
    return st.one_of(st.text(max_size=40), st.binary(max_size=40), numbers)


@SETTINGS
@given(
    changes=st.dictionaries(
        st.sampled_from([*SAMPLE.to_dict(), "other"]), st.one_of(st.none(), text_or_bytes()), max_size=6
    )
)
def test_garbage_decodes_to_a_bounded_sample_or_is_refused(changes: dict[str, Any]) -> None:
    try:
        sample = decode_sample(fields(**changes))
    except SnapshotError:
        return
    for name in ("ts", "started_at"):
        value = getattr(sample, name)
        assert math.isfinite(value) and 0.0 <= value <= MAX_SAMPLE_TS
    for name in ("busy_s", "latency_ms"):
        value = getattr(sample, name)
        assert math.isfinite(value) and 0.0 <= value <= MAX_SAMPLE_FLOAT
    for name in ("received", "processed", "emitted", "queue_len", "errors"):
        assert isinstance(getattr(sample, name), int) and 0 <= getattr(sample, name) <= MAX_SAMPLE_COUNT
    assert all(0 < len(getattr(sample, name)) <= 256 for name in ("node", "vertex", "executor"))


@SETTINGS
@given(entry=st.dictionaries(st.one_of(st.text(max_size=12), st.binary(max_size=12)), text_or_bytes(), max_size=16))
def test_any_entry_at_all_decodes_or_is_refused_never_raises_otherwise(entry: dict[Any, Any]) -> None:
    with contextlib.suppress(SnapshotError):
        decode_sample(entry)


# ------------------------------------------------------------------------------------------ stream ids


def test_stream_bounds_are_ordered_and_a_cursor_must_be_an_entry_id() -> None:
    assert stream_start(None) == "-" and stream_start(float("nan")) == "-" and stream_start(-5.0) == "-"
    assert stream_start(1.5) == "1500-0"
    assert stream_start(1e30) == f"{2**64 - 1}-0"
    assert id_order("-") < id_order("5-0") < id_order("(5-0") < id_order("5-1") < id_order("+")
    assert is_entry_id("1712-3")
    for cursor in ("(1712-3", "-", "+", "1712", "x-1", "1712-3\n", f"{2**64}-0", "1" * 30 + "-0"):
        assert not is_entry_id(cursor), cursor
    with pytest.raises(ValueError, match="not a stream id"):
        id_order("garbage")


# ------------------------------------------------------------------------------------------ reporting


def counted(reason: str, name: str = "t") -> float:
    value = REGISTRY.get_sample_value(
        "elastream_metric_samples_skipped_total", {"namespace": "default", "topology": name, "reason": reason}
    )
    return value or 0.0


def test_skipped_entries_are_counted_and_told_at_most_once_a_minute_with_the_count_since() -> None:
    events, clock = ListEvents(), FakeClock()  # every clock read moves it 0.5 s on
    report = SkippedSamples(topology(), events, clock)
    before = counted("malformed"), counted("oversized")
    report(StreamRead(malformed=2, oversized=1, problem="entry 1-0: metric sample ts 'nan' is not between 0"))
    assert [(e[0], e[2]) for e in events.events] == [("MetricSamplesSkipped", True)]
    assert "skipped 2 malformed, 1 oversized" in events.events[0][1] and "ts 'nan'" in events.events[0][1]
    for _ in range(10):  # 5 s of reads that each skip one: counted at once, told later
        report(StreamRead(malformed=1, problem="entry 2-0: metric sample has no ts"))
    report(StreamRead())  # a read that skipped nothing tells nothing by itself
    assert len(events.events) == 1
    assert counted("malformed") - before[0] == 12 and counted("oversized") - before[1] == 1
    clock.t += 60.0
    report(StreamRead())  # the minute is over: the next read tells what is pending
    assert len(events.events) == 2
    assert "skipped 10 malformed" in events.events[1][1] and "in the last" in events.events[1][1]
    assert "has no ts" in events.events[1][1]
    clock.t += 120.0
    report(StreamRead())
    assert len(events.events) == 2  # nothing pending: no event
    report(StreamRead(truncated=True))
    assert "backlog" in events.events[-1][1]


def test_the_tick_reads_by_time_from_a_feed_without_entry_ids_and_a_nan_timestamp_does_not_stop_it() -> None:
    feed = ListFeed([SAMPLE, MetricSample(**{**SAMPLE.to_dict(), "ts": float("nan")})])
    follower = SampleFollower()
    assert len(follower.read(feed)) == 2
    feed.samples.append(MetricSample(**{**SAMPLE.to_dict(), "ts": SAMPLE.ts + 1}))
    assert [s.ts for s in follower.read(feed)] == [SAMPLE.ts + 1]  # resumed after the newest finite ts
    assert follower.read(feed) == []


def test_the_live_view_keeps_executors_of_the_topology_only() -> None:
    live = LiveRates(topology())
    names = [("s", "s#0"), ("s", "s#15"), ("s", "s#128"), ("x", "x#0"), ("s", "z#0"), ("s", "s"), ("z", "z#0")]
    for i, (vertex, executor) in enumerate(names * 2):
        live.add([MetricSample(**{**SAMPLE.to_dict(), "vertex": vertex, "executor": executor, "ts": 1e9 + i})])
    assert set(live.newest) == {"s#0", "s#15", "z#0"}  # s's maxParallelism is 128: s#128 is no executor of s


def test_the_hot_window_budget_follows_the_topology_within_bounds() -> None:
    small = topology()
    assert hot_window_budget(small, window=20, interval_s=1.0) == 10_000
    big = parse_manifest(manifest([src("s", 500), sink("z", 500)], [edge("s", "z")], nodes=100, slotsPerNode=10))
    assert hot_window_budget(big, window=20, interval_s=1.0) == 2 * 1000 * (40 + 30 + 2)
    assert hot_window_budget(big, window=20, interval_s=0.01) == 1_000_000
