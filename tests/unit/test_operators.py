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
