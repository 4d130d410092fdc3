"""Built-in operators and rate profiles, driven directly (no processes, no sockets)."""

from __future__ import annotations

import time

import pytest

from elastream.core.schedule import key_group_ranges
from elastream.runtime.operators import SAME, Context, Count, Filter, RateProfile, Synthetic, Window, Work


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


def test_window_emits_count_and_sum_per_key_when_it_closes() -> None:
    operator = Window()
    out: list = []
    operator.open(Context("v", 0, 1, 8, {"sizeMs": 50}))

    def feed(event: tuple) -> None:
        operator.process(event, lambda value, key=SAME, event_id=None, ts=None: out.append((key, value, event_id)))

    for i in range(6):
        feed((i, "a" if i % 2 else "b", 10, 0.0))
    time.sleep(0.12)
    feed((99, "a", 1, 0.0))  # opens the next window, flushing the first
    assert sorted(out) == [("a", (3, 30), 5), ("b", (3, 30), 4)]


def test_rate_profiles_integrate_steps_and_csv(tmp_path) -> None:
    steps = RateProfile({"steps": [{"rate": 100, "seconds": 2}, {"rate": 300, "seconds": 1}]}, share=1.0)
    assert steps.due(2.0) == pytest.approx(200)
    assert steps.due(3.0) == pytest.approx(500)
    assert steps.due(4.5) == pytest.approx(650)  # repeats: 500 + 1.5 s at 100
    assert steps.rate_at(2.5) == 300
    csv = tmp_path / "rates.csv"
    csv.write_text("# events per second\n10\n20\n")
    profile = RateProfile({"csv": str(csv)}, share=0.5)
    assert profile.due(2.0) == pytest.approx(15)


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


def test_window_closes_on_the_idle_timer_without_a_later_event() -> None:
    operator = Window()
    out: list = []
    operator.open(Context("v", 0, 1, 8, {"sizeMs": 50}))

    def emit(value: object, key: object = SAME, event_id: object = None, ts: object = None) -> None:
        out.append((key, value, event_id))

    for i in range(4):
        operator.process((i, "k", 5, 0.0), emit)
    operator.timer(emit)
    assert out == []  # the window is still open
    time.sleep(0.12)
    operator.timer(emit)  # what an idle executor calls every ~20 ms
    assert out == [("k", (4, 20), 3)]
    operator.timer(emit)
    assert len(out) == 1  # nothing twice
    operator.close()
    assert len(out) == 1  # close() does not flush: a migration moves the open window with the state


def test_rate_presets_have_the_autoscale_shapes() -> None:
    three = RateProfile({"profile": "autoscale-3-step", "rate": 1000, "stepSeconds": 10, "fluctuation": 0}, 1.0)
    assert three.period == pytest.approx(95)
    assert three.rate_at(5) == 250 and three.rate_at(50) == 1000 and three.rate_at(90) == 250
    ramp = [three.rate_at(t) for t in range(20, 40)]
    assert ramp == sorted(ramp) and 250 < ramp[0] < ramp[-1] < 1000  # a progressive increase
    five = RateProfile({"profile": "autoscale-5-step", "rate": 1000, "stepSeconds": 10, "fluctuation": 0}, 0.5)
    assert [five.rate_at(t) for t in (5, 15, 25, 35, 45)] == [100, 500, 200, 500, 100]  # sudden jumps
    assert five.due(50) == pytest.approx(10 * (100 + 500 + 200 + 500 + 100))
    noisy = RateProfile({"profile": "autoscale-5-step", "rate": 1000}, 1.0)
    plateau = [noisy.rate_at(t) for t in range(60, 120)]
    assert 950 <= min(plateau) < max(plateau) <= 1050  # small irregular fluctuations, 5 %
    assert plateau == [
        RateProfile({"profile": "autoscale-5-step", "rate": 1000}, 1.0).rate_at(t) for t in range(60, 120)
    ]


def test_due_is_the_integral_of_the_rate() -> None:
    profile = RateProfile(
        {"steps": [{"rate": 10, "seconds": 1.5}, {"rate": 0, "seconds": 0.5}, {"rate": 4, "seconds": 1}]}, 1.0
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
    from elastream.runtime.operators import RedisStreamSource

    client = _FlakyRedis()
    source = RedisStreamSource(lambda: client)
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
    assert got == [(5001, "k", "v")] and source.position() == {0: ["5-1", 1]}
    assert "source orders#0: cannot read stream in: Redis unreachable" in caplog.text


def test_metric_stream_cap_holds_an_hour_of_the_actual_executors() -> None:
    from elastream.store.metric_stream import MIN_MAXLEN, metric_stream_maxlen

    assert metric_stream_maxlen(24, 1.0) == 24 * 3600
    assert metric_stream_maxlen(24, 0.5) == 2 * 24 * 3600
    assert metric_stream_maxlen(300, 10.0) == 300 * 360
    assert metric_stream_maxlen(1, 5.0) == MIN_MAXLEN
