"""Built-in operators and rate profiles, driven directly (no processes, no sockets)."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest

from elastream.core.schedule import key_group_ranges
from elastream.runtime.operators import SAME, Context
from elastream.runtime.operators.builtin import Count, Filter, Window, Work
from elastream.runtime.operators.sources import RateProfile, Synthetic


def run(operator: object, events: list[tuple[int, object, object, float]], config: dict | None = None) -> list:
    out: list = []
    current: list[tuple[int, object, object, float]] = []
    operator.open(Context("v", 0, 1, 8, config or {}))  # type: ignore[attr-defined]

    def emit(value: object, key: object = SAME, event_id: int | None = None, ts: float | None = None) -> None:
        event = current[-1]
        out.append((event[0] if event_id is None else event_id, event[1] if key is SAME else key, value))

    for event in events:
        current.append(event)
        operator.process(event, emit)  # type: ignore[attr-defined]
    return out


def test_work_selectivity_is_deterministic_per_id() -> None:
    events = [(i, i % 3, i, 0.0) for i in range(10_000)]
    half = run(Work(), events, {"selectivity": 0.5})
    assert 4_700 < len(half) < 5_300
    assert half == run(Work(), events, {"selectivity": 0.5})  # a replay decides the same
    assert len(run(Work(), events, {"selectivity": 2.0})) == 20_000


def test_filter_keeps_a_share_and_never_duplicates() -> None:
    events = [(i, 0, i, 0.0) for i in range(10_000)]
    kept = run(Filter(), events, {"selectivity": 0.25})
    assert 2_300 < len(kept) < 2_700
    assert len({e[0] for e in kept}) == len(kept)


def test_count_counts_per_key_and_its_state_is_per_key_group() -> None:
    events = [(i, f"k{i % 5}", i, 0.0) for i in range(50)]
    operator = Count()
    out = run(operator, events)
    assert [v for _, k, v in out if k == "k3"] == list(range(1, 11))
    state = operator.snapshot_state()
    assert sum(len(keys) for keys in state.values()) == 5
    assert all(operator.context.key_group(k) == g for g, keys in state.items() for k in keys)
    restored = Count()
    restored.open(Context("v", 1, 2, 8, {}))
    restored.restore_state(state)
    assert restored.counts() == {f"k{i}": 10 for i in range(5)}


def stepped_window(monkeypatch) -> tuple[Window, list, list[float], Any]:
    """A 50 ms `Window` on a wall clock the test steps (it starts inside a window, not on its edge), the list
    of what it emits as (key, value, event id), the clock, and its emit function."""
    wall = [1000.01]
    monkeypatch.setattr(Window, "wall_clock", staticmethod(lambda: wall[0]))
    operator = Window()
    operator.open(Context("v", 0, 1, 8, {"sizeMs": 50}))
    out: list = []

    def emit(value: object, key: object = SAME, event_id: object = None, ts: object = None) -> None:
        out.append((key, value, event_id))

    return operator, out, wall, emit


def test_window_emits_count_and_sum_per_key_when_it_closes(monkeypatch) -> None:
    operator, out, wall, emit = stepped_window(monkeypatch)

    def feed(event: tuple) -> None:
        operator.process(event, emit)

    for i in range(6):
        feed((i, "a" if i % 2 else "b", 10, 0.0))
    wall[0] += 0.12  # past the end of the 50 ms window
    feed((99, "a", 1, 0.0))  # opens the next window, flushing the first
    assert sorted(out) == [("a", (3, 30), 5), ("b", (3, 30), 4)]


def test_rate_profiles_integrate_steps_and_csv(tmp_path) -> None:
    steps = RateProfile({"steps": [{"rate": 100, "seconds": 2}, {"rate": 300, "seconds": 1}]})
    assert steps.due(2.0) == pytest.approx(200)
    assert steps.due(3.0) == pytest.approx(500)
    assert steps.due(4.5) == pytest.approx(650)  # repeats: 500 + 1.5 s at 100
    assert steps.rate_at(2.5) == 300
    csv = tmp_path / "rates.csv"
    csv.write_text("# events per second\n10\n20\n")
    profile = RateProfile({"csv": str(csv)})
    assert profile.due(2.0) == pytest.approx(30)


def synthetic(index: int, parallelism: int, **config: object) -> Synthetic:
    source = Synthetic()
    lanes = key_group_ranges(8, parallelism)[index]
    source.open(Context("s", index, parallelism, 8, config, key_groups=lanes))
    return source


def drain(source: Synthetic, into: list[int], at_most: int | None = None) -> None:
    while not source.exhausted() and (at_most is None or len(into) < at_most):
        source.poll(time.time() + 3600, lambda i, k, v: into.append(i), 1 if at_most is not None else 512)


def test_synthetic_sources_split_ids_and_respect_the_limit() -> None:
    seen: list[int] = []
    for index in range(3):
        drain(synthetic(index, 3, limit=100, keys=4), seen)
    assert sorted(seen) == list(range(100))


def test_synthetic_lanes_move_with_their_positions_when_parallelism_changes() -> None:
    seen: list[int] = []
    old = [synthetic(i, 3, limit=500) for i in range(3)]
    for source in old:
        drain(source, seen, at_most=len(seen) + 37)  # each emits some, mid-lane
    merged: dict[int, int] = {}
    for source in old:
        merged.update(source.position())
    for index in range(5):  # scale out 3 -> 5 executors
        source = synthetic(index, 5, limit=500)
        source.seek(merged)
        drain(source, seen)
    assert sorted(seen) == list(range(500))


def test_count_honours_its_key_field_like_the_fields_grouping() -> None:
    events = [(i, "ignored", {"user": f"u{i % 3}", "n": i}, 0.0) for i in range(9)]
    events.append((9, "plain", 7, 0.0))  # no mapping: counted by the event key
    out = run(Count(), events, {"key": "user"})
    assert [v for _, _, v in out] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 1]
    operator = Count()
    run(operator, events, {"key": "user"})
    assert operator.counts() == {"u0": 3, "u1": 3, "u2": 3, "plain": 1}


def test_window_closes_on_the_idle_timer_without_a_later_event(monkeypatch) -> None:
    operator, out, wall, emit = stepped_window(monkeypatch)
    for i in range(4):
        operator.process((i, "k", 5, 0.0), emit)
    operator.timer(emit)
    assert out == []  # the window is still open
    wall[0] += 0.12
    operator.timer(emit)  # what an idle executor calls every ~20 ms
    assert out == [("k", (4, 20), 3)]
    operator.timer(emit)
    assert len(out) == 1  # nothing twice
    operator.close()
    assert len(out) == 1  # close() does not flush: a migration moves the open window with the state


def test_rate_presets_have_the_autoscale_shapes() -> None:
    three = RateProfile({"profile": "autoscale-3-step", "rate": 1000, "stepSeconds": 10, "fluctuation": 0})
    assert three.period == pytest.approx(95)
    assert three.rate_at(5) == 250 and three.rate_at(50) == 1000 and three.rate_at(90) == 250
    ramp = [three.rate_at(t) for t in range(20, 40)]
    assert ramp == sorted(ramp) and 250 < ramp[0] < ramp[-1] < 1000  # a progressive increase
    five = RateProfile({"profile": "autoscale-5-step", "rate": 1000, "stepSeconds": 10, "fluctuation": 0})
    assert [five.rate_at(t) for t in (5, 15, 25, 35, 45)] == [200, 1000, 400, 1000, 200]  # sudden jumps
    assert five.due(50) == pytest.approx(10 * (200 + 1000 + 400 + 1000 + 200))
    noisy = RateProfile({"profile": "autoscale-5-step", "rate": 1000})
    plateau = [noisy.rate_at(t) for t in range(60, 120)]
    assert 950 <= min(plateau) < max(plateau) <= 1050  # small irregular fluctuations, 5 %
    assert plateau == [RateProfile({"profile": "autoscale-5-step", "rate": 1000}).rate_at(t) for t in range(60, 120)]


def test_due_is_the_integral_of_the_rate() -> None:
    profile = RateProfile(
        {"steps": [{"rate": 10, "seconds": 1.5}, {"rate": 0, "seconds": 0.5}, {"rate": 4, "seconds": 1}]}
    )
    for t, expected in ((0.0, 0.0), (1.0, 10.0), (1.5, 15.0), (1.9, 15.0), (2.5, 17.0), (3.0, 19.0), (4.0, 29.0)):
        assert profile.due(t) == pytest.approx(expected), t


class _FlakyRedis:
    def __init__(self) -> None:
        self.calls = 0

    def xread(self, *args: object, **kwargs: object) -> list:
        import redis

        self.calls += 1
        if self.calls <= 2:
            raise redis.ConnectionError("Connection refused")
        return [(b"in", [(b"5-1", {b"key": b"k", b"value": b"v"})])]

    def close(self) -> None:
        pass


def test_redis_stream_source_backs_off_on_connection_errors_instead_of_dying(caplog) -> None:
    from elastream.runtime.operators.sources import RedisStreamSource

    client = _FlakyRedis()
    source = RedisStreamSource(lambda: client, "p:")
    source.open(Context("orders", 0, 1, 8, {"stream": "in"}))
    got: list = []
    now = 1000.0
    assert source.poll(now, lambda *e: got.append(e), 10) == 0  # refused: logged, retried later
    assert source.poll(now + 0.01, lambda *e: got.append(e), 10) == 0  # still backing off: no call
    assert client.calls == 1
    source.poll(now + 0.3, lambda *e: got.append(e), 10)  # refused again: backoff doubles
    source.poll(now + 0.5, lambda *e: got.append(e), 10)
    assert client.calls == 2
    source.poll(now + 1.0, lambda *e: got.append(e), 10)
    assert got == [(5001, "k", "v")] and source.position()[0] == ["5-1", 1]
    assert "source orders#0: cannot read stream p:source:in: Redis unreachable" in caplog.text


def test_metric_stream_cap_holds_an_hour_of_the_actual_executors() -> None:
    from elastream.store.metric_stream import MIN_MAXLEN, metric_stream_maxlen

    assert metric_stream_maxlen(24, 1.0) == 24 * 3600
    assert metric_stream_maxlen(24, 0.5) == 2 * 24 * 3600
    assert metric_stream_maxlen(300, 10.0) == 300 * 360
    assert metric_stream_maxlen(1, 5.0) == MIN_MAXLEN


# --------------------------------------------------------------------------------------------------------
# redis-stream source: lanes of the stream's ordinals, exactly once across any change of parallelism


class _FakeStream:
    """An in-memory Redis stream with what `RedisStreamSource` calls (XREAD, XREVRANGE)."""

    def __init__(self, count: int = 0) -> None:
        self.entries: list[tuple[tuple[int, int], dict[bytes, bytes]]] = []
        self.add(count)

    def add(self, count: int) -> None:
        for _ in range(count):
            n = len(self.entries)
            self.entries.append(((1000 + n // 3, n % 3), {b"key": f"k{n % 5}".encode(), b"value": str(n).encode()}))

    @staticmethod
    def _id(text: str) -> tuple[int, int]:
        ms, seq = text.split("-")
        return int(ms), int(seq)

    def xread(self, streams: dict[str, str], count: int, block: int) -> list:
        ((name, after),) = streams.items()
        items = [(f"{i[0]}-{i[1]}".encode(), f) for i, f in self.entries if i > self._id(after)][:count]
        return [(name.encode(), items)] if items else []

    def xrevrange(self, name: str, max: str, min: str, count: int) -> list:
        items = [(f"{i[0]}-{i[1]}".encode(), f) for i, f in self.entries if i <= self._id(max)]
        return items[::-1][:count]

    def close(self) -> None:
        pass


def stream_source(stream: _FakeStream, index: int, parallelism: int, max_parallelism: int = 8) -> Any:
    from elastream.runtime.operators.sources import RedisStreamSource

    source = RedisStreamSource(lambda: stream, "p:")
    lanes = key_group_ranges(max_parallelism, parallelism)[index]
    source.open(Context("orders", index, parallelism, max_parallelism, {"stream": "in"}, key_groups=lanes))
    return source


def read_some(source: Any, into: list[int], entries: int | None = None, budget: int = 7) -> None:
    """Poll until `entries` more stream entries are read (all of them when None)."""
    stop = None if entries is None else source.read + entries
    while stop is None or source.read < stop:
        before = source.read
        step = budget if stop is None else min(budget, stop - source.read)
        source.poll(time.time(), lambda i, k, v: into.append(int(v)), step)
        if source.read == before:
            break


def merged(sources: list[Any]) -> dict:
    """The migration's merge, through msgpack like the checkpoint store (tuples, int keys)."""
    from elastream.store.codec import pack, unpack

    out: dict = {}
    for source in sources:
        out.update(unpack(pack(source.position())))
    return out


def rescale(stream: _FakeStream, sources: list[Any], parallelism: int) -> list[Any]:
    """What CCR does to a source vertex: positions merged, every new executor seeks the merged map."""
    position = merged(sources)
    new = [stream_source(stream, i, parallelism) for i in range(parallelism)]
    for source in new:
        source.seek(position)
    return new


def assert_exactly_once(seen: list[int], total: int) -> None:
    counts = Counter(seen)
    assert not [n for n in range(total) if counts[n] == 0], "missing"
    assert not {n: c for n, c in counts.items() if c > 1}, "duplicated"
    assert set(counts) == set(range(total))


@pytest.mark.parametrize(
    "steps",
    [
        [2, 3],  # scale out
        [3, 1],  # scale in to one
        [2, 5],
        [1, 8, 3, 2],  # up to maxParallelism and back
    ],
)
def test_redis_stream_lanes_hand_over_exactly_once_when_parallelism_changes(steps: list[int]) -> None:
    stream = _FakeStream(300)
    seen: list[int] = []
    sources = [stream_source(stream, i, steps[0]) for i in range(steps[0])]
    for parallelism in steps[1:]:
        for i, source in enumerate(sources):
            read_some(source, seen, entries=40 + 23 * i)  # each old executor mid-stream, at its own point
        stream.add(50)  # the stream grows meanwhile
        sources = rescale(stream, sources, parallelism)
    stream.add(60)
    for source in sources:
        read_some(source, seen)
    assert_exactly_once(seen, len(stream.entries))


def test_redis_stream_uneven_old_executors_resume_exactly_once() -> None:
    """Old executors far apart (one read almost nothing, one almost everything, one nothing at all)."""
    stream = _FakeStream(400)
    seen: list[int] = []
    old = [stream_source(stream, i, 3) for i in range(3)]
    read_some(old[0], seen, entries=3)
    read_some(old[1], seen, entries=390)
    for parallelism in (2, 4):
        seen_now = list(seen)
        new = rescale(stream, old, parallelism)
        for source in new:
            read_some(source, seen_now)
        assert_exactly_once(seen_now, 400)


def test_redis_stream_positions_are_per_lane_counts_that_replayed_events_reads() -> None:
    from elastream.core.checkpoint_protocol import replayed_events

    stream = _FakeStream(200)
    seen: list[int] = []
    sources = [stream_source(stream, i, 2) for i in range(2)]
    for i, source in enumerate(sources):
        read_some(source, seen, entries=50 + 30 * i)
    checkpointed = [source.position() for source in sources]
    first = checkpointed[0]
    assert first["lanes"] == "ordinal % 8" and set(first) == {"lanes", 0, 1, 2, 3}
    # lane 1 holds ordinals 1, 9, 17, ...: 50 entries read hold 7 of them, the last one ordinal 49
    assert first[1] == ["1016-1", 7]
    emitted = len(seen)
    sources = rescale(stream, sources, 3)
    for source in sources:
        read_some(source, seen, entries=60)
    latest = [source.position() for source in sources]
    assert replayed_events(checkpointed, latest) == len(seen) - emitted  # what going back would emit again
    assert replayed_events(latest, latest) == 0


def test_redis_stream_previous_versions_positions_are_converted_exactly() -> None:
    """{executor index: [last entry id read, entries read]}: executor i of k emitted the ordinals n < read
    with n % k == i."""
    stream = _FakeStream(300)
    reads = {0: 120, 1: 37, 2: 211}
    seen = [n for i, read in reads.items() for n in range(read) if n % 3 == i]
    ids = [f"{i[0]}-{i[1]}" for i, _ in stream.entries]
    legacy = {i: (ids[read - 1], read) for i, read in reads.items()}
    new = [stream_source(stream, i, 2) for i in range(2)]
    for source in new:
        source.seek(legacy)
        read_some(source, seen, entries=200)  # past every old executor's read point
    stream.add(40)
    for source in rescale(stream, new, 3):  # and the converted positions rescale on
        read_some(source, seen)
    assert_exactly_once(seen, 340)


def test_redis_stream_previous_versions_positions_rescale_on_at_once() -> None:
    """Old executors at the same read point (they all read the whole stream): the converted lane positions
    hold the right entry ids at once, so a checkpoint before anything more is read rescales exactly."""
    stream = _FakeStream(200)
    ids = [f"{i[0]}-{i[1]}" for i, _ in stream.entries]
    seen = list(range(101))
    new = [stream_source(stream, i, 2) for i in range(2)]
    for source in new:
        source.seek({i: (ids[100], 101) for i in range(3)})
    assert merged(new)[5] == ("1031-0", 12)  # lane 5: ordinals 5, 13, ..., 93 emitted; then 101 (not yet)
    for source in rescale(stream, new, 3):
        read_some(source, seen)
    assert_exactly_once(seen, 200)


def test_redis_stream_positions_of_another_max_parallelism_are_converted_exactly() -> None:
    stream = _FakeStream(150)
    seen: list[int] = []
    old = [stream_source(stream, i, 2, max_parallelism=4) for i in range(2)]
    read_some(old[0], seen, entries=90)
    read_some(old[1], seen, entries=33)
    position = merged(old)
    assert position["lanes"] == "ordinal % 4"
    new = [stream_source(stream, i, 3, max_parallelism=8) for i in range(3)]
    for source in new:
        source.seek(position)
        read_some(source, seen)
    assert_exactly_once(seen, 150)


@pytest.mark.parametrize(
    "position",
    ["1000-0", {"lanes": "bytes % 8", 0: ("1000-0", 1)}, {0: "garbage"}, {"lanes": "ordinal % 8", 0: ("x", 2)}],
)
def test_redis_stream_positions_it_cannot_read_are_ignored_not_fatal(position: Any, caplog) -> None:
    stream = _FakeStream(20)
    source = stream_source(stream, 0, 1)
    source.seek(position)
    seen: list[int] = []
    read_some(source, seen)
    assert sorted(seen) == list(range(20))  # from the start
    assert "ignoring a read position it cannot use" in caplog.text


def test_redis_stream_executors_report_what_they_emit_not_the_whole_stream() -> None:
    # three executors each read all 300 entries; offered counts (the executor's `received`, the analysis's
    # input rate and queue) must add up to the stream, not to 3 × the stream
    stream = _FakeStream(300)
    sources = [stream_source(stream, i, 3) for i in range(3)]
    due, seen = [], []
    for source in sources:
        read_some(source, seen)
        due.append(source.poll(time.time(), lambda *e: None, 10))
    assert sum(due) == 300 and len(seen) == 300
    assert all(d > 0 for d in due)


@pytest.mark.parametrize("recovery", [False, True], ids=["migration", "recovery"])
def test_a_steps_profile_continues_through_a_rescale_with_its_clock_in_the_position(monkeypatch, recovery) -> None:
    # 100/s for 10 s, then 400/s: one executor runs 6 s, then two take its lanes over (at 7 s) and run on
    steps = [{"rate": 100, "seconds": 10}, {"rate": 400, "seconds": 100}]
    seen: list[int] = []
    start = 1000.0
    wall = [start]
    monkeypatch.setattr(Synthetic, "wall_clock", staticmethod(lambda: wall[0]))
    old = synthetic(0, 1, steps=steps)
    assert old.clock_start == start
    old.poll(start + 6.0, lambda i, k, v: seen.append(i), 10_000)
    assert len(seen) == 600
    position = old.position()
    assert position[Synthetic.CLOCK] == start
    wall[0] = start + 7.0
    new = [synthetic(i, 2, steps=steps) for i in range(2)]
    for source in new:
        source.seek(position)
        if recovery:
            source.pace_replay()
        assert source.clock_start == start
    # they take over 1 s later (the pause): a migration owes what fell due meanwhile (100: 600..699, of which
    # lanes 0..3 hold 52 and lanes 4..7 48) and emits it first; a recovery paces its lanes from the takeover,
    # nothing owed at once
    owed = [0, 0] if recovery else [52, 48]
    assert [source.offered(start + 7.0) for source in new] == [0, 0]
    assert [source.backlog(start + 7.0) for source in new] == owed
    for source in new:
        source.poll(start + 15.0, lambda i, k, v: seen.append(i), 10_000)
    # the profile went on at its clock: 7..10 s at 100/s, 10..15 s at 400/s (each executor half of it);
    # restarted at the rescale it would still be in its first step, at 100/s: 800 more, not 2300
    assert len(seen) == 600 + sum(owed) + 300 + 2000 and len(set(seen)) == len(seen)  # nothing twice
    if not recovery:  # exactly the events due by 15 s: 1000 in the first step, 2000 in the second
        assert sorted(seen) == list(range(3000))
    # 1500 each by 15 s (375 rounds of 4 lanes each), 352 and 348 of them by 7 s
    assert [source.offered(start + 15.0) for source in new] == [1148, 1152]
    assert [source.backlog(start + 15.0) for source in new] == [0, 0]


@pytest.mark.parametrize("executors", [1, 2, 3, 5])
def test_synthetic_executors_emit_exactly_the_events_due_on_the_vertex_clock(executors: int) -> None:
    # event s falls due when the vertex's profile has offered more than s events, whichever executor owns its
    # lane: at every poll the executors together have emitted exactly 0..due-1. Paced at their share of the
    # rate instead, the executor with lanes 4..7 of two emitted 4 and 5 when only 0..3 were due (and the one
    # with lanes 0..3 emitted 2 and 3 half a round late), after every scale-out, for good
    sources = [synthetic(i, executors, rate=80) for i in range(executors)]
    for source in sources[1:]:
        source.clock_start = sources[0].clock_start  # one topology clock (the position carries it)
    start = sources[0].clock_start
    seen: list[int] = []
    for tick in range(1, 41):  # every 12.5 ms for half a second: due goes 1, 2, ..., 40
        for source in sources:
            source.poll(start + tick / 80 + 1e-6, lambda i, k, v: seen.append(i), 10_000)
        assert sorted(seen) == list(range(tick)), tick


def test_a_synthetic_source_emits_in_sequence_order_across_takeovers(monkeypatch) -> None:
    # back-pressure lets 13 events through per poll (a round of 8 lanes and a part of the next), and every
    # poll ends in a rescale: the events still leave in the order they fall due. Round-robin over the lanes,
    # restarted at each takeover, let lanes 0..4 run ahead and 5..7 fall behind for good
    wall = [1000.0]
    monkeypatch.setattr(Synthetic, "wall_clock", staticmethod(lambda: wall[0]))
    source = synthetic(0, 1, rate=100)
    seen: list[int] = []
    for step in range(1, 7):
        wall[0] = 1000.0 + step
        source.poll(wall[0], lambda i, k, v: seen.append(i), 13)
        position = source.position()
        source = synthetic(0, 1, rate=100)
        source.seek(position)
    assert seen == list(range(6 * 13))


def test_a_migration_inherits_what_back_pressure_held_at_the_old_executor(monkeypatch) -> None:
    start = 1000.0
    wall = [start]
    monkeypatch.setattr(Synthetic, "wall_clock", staticmethod(lambda: wall[0]))
    old = synthetic(0, 1, rate=200)
    old.poll(start + 2.0, lambda *e: None, 100)  # back-pressure let 100 of 400 through
    assert old.backlog(start + 2.0) == 300
    wall[0] = start + 2.5  # a 0.5 s pause: 100 more fell due
    new = synthetic(0, 1, rate=200)
    new.seek(old.position())
    assert new.offered(start + 2.5) == 0 and new.backlog(start + 2.5) == 400  # not a spike of its load
    seen: list[int] = []
    assert new.poll(start + 3.0, lambda i, k, v: seen.append(i), 10_000) == 100  # offered since the takeover
    # the 400 owed and the 100 due since: all 500 at once, none twice, in order within a round of the 8 lanes
    assert len(set(seen)) == 500 and min(seen) >= 100 and set(range(100, 600 - 8)) <= set(seen)
    assert new.backlog(start + 3.0) == 0


def test_a_synthetic_source_offers_at_its_rate_whatever_it_emitted() -> None:
    source = synthetic(0, 1, rate=200)
    start = source.clock_start
    source.poll(start + 1.0, lambda *e: None, 50)  # back-pressure let 50 of 200 through
    assert source.offered(start + 1.0) == 200 and source.backlog(start + 1.0) == 150
    assert source.offered(start + 2.0) == 400 and source.backlog(start + 2.0) == 350


def leveled(index: int, parallelism: int, heap_only: bool, **config: Any) -> Synthetic:
    """`synthetic`, level runs and all (`Synthetic.cursor`), or (`heap_only`) the lane-by-lane heap alone."""
    source = Synthetic()
    if heap_only:  # the reference
        source._level = lambda: False  # type: ignore[method-assign]
    source.open(Context("s", index, parallelism, 8, config, key_groups=key_group_ranges(8, parallelism)[index]))
    return source


def drive(steps: list[tuple[int, list[int]]], heap_only: bool, limit: int | None) -> tuple[list[Any], list[Any]]:
    """Run `steps` (executors, budgets of their polls) one after the other, each step's sources seeking the
    merged position of the last; what they emitted and their positions (less the clock) after each poll."""
    now = time.time() + 3600
    seen: list[Any] = []
    positions: list[Any] = []
    merged: dict[Any, Any] | None = None
    for executors, budgets in steps:
        sources = [leveled(i, executors, heap_only, limit=limit, keys=5) for i in range(executors)]
        for source in sources:
            if merged is not None:
                source.seek(merged)
        for budget in budgets:
            for source in sources:
                if budget % 2:
                    source.poll(now, lambda i, k, v: seen.append((i, k, v)), budget)
                else:
                    source.poll_batch(now, lambda events: seen.extend(e[:3] for e in events), budget)
                positions.append({k: v for k, v in source.position().items() if k != "clock"})
        merged = {}
        for source in sources:
            merged.update(source.position())
    return seen, positions


@pytest.mark.parametrize("limit", [None, 301])
@pytest.mark.parametrize("seed", range(4))
def test_level_runs_emit_what_the_lane_heap_emits_across_takeovers(limit: int | None, seed: int) -> None:
    rng = random.Random(seed)
    steps = [(rng.choice((1, 2, 3, 5)), [rng.choice((1, 5, 13, 64, 200)) for _ in range(6)]) for _ in range(4)]
    emitted, positions = drive(steps, heap_only=False, limit=limit)
    assert (emitted, positions) == drive(steps, heap_only=True, limit=limit)
    ids = [e[0] for e in emitted]
    assert len(ids) == len(set(ids))  # nothing twice
    assert all(e == (e[0], e[0] % 5, e[0]) for e in emitted)


def test_a_level_run_stamps_its_events_with_the_poll_time_and_reports_what_was_due() -> None:
    source = leveled(0, 1, heap_only=False, rate=1000)
    start = source.clock_start
    events: list[Any] = []
    assert source.poll_batch(start + 1.0, events.extend, 300) == 1000
    assert [e[0] for e in events] == list(range(300)) and {e[3] for e in events} == {start + 1.0}
    assert source.backlog(start + 1.0) == 700 and source.position()[0] == 38  # lane 0: 0, 8, ..., 296


def test_a_level_run_numbers_its_events_from_the_id_offset() -> None:
    source = leveled(1, 2, heap_only=False, idOffset=10_000, keys=7)
    events: list[Any] = []
    source.poll_batch(time.time() + 3600, events.extend, 6)
    assert [e[:3] for e in events] == [(10_000 + s, s % 7, s) for s in (4, 5, 6, 7, 12, 13)]  # lanes 4..7 of 8
