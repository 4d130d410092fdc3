"""AUTOSCALE's formulas against hand-computed values, Table I cell by cell, and Algorithm 1's global pass."""

from __future__ import annotations

import math

import pytest

from elastream.core.autoscaling.autoscale_policy import (
    AutoscaleSettings,
    activity_level,
    capacity,
    capacity_trend,
    combine_estimates,
    decide,
    estim_capacity,
    estim_output,
    evaluate,
    forecast_input,
    new_degree,
)
from elastream.core.metrics import MetricSnapshot, VertexMetrics
from elastream.core.topology import parse_manifest
from support.manifests import edge, manifest, sink, src, work


def test_forecast_input_eq_2_3() -> None:
    # 100/s rising 2/s per second, one 1 s period ahead, over a 20 s window, 50 pending: (100 + 2) × 20 + 50
    assert forecast_input(100.0, 2.0, 1.0, 20.0, 50.0) == 2090.0
    assert forecast_input(10.0, -20.0, 1.0, 20.0, 0.0) == 0.0  # a forecast never goes below zero


def test_capacity_eq_4_5() -> None:
    # 1/Lat = 250 items per busy second per executor, Δ 20 s, 3 executors
    assert capacity(250.0, 20.0, 3) == 15000.0
    assert estim_capacity(15000.0, -500.0) == 14500.0
    assert estim_capacity(100.0, -500.0) == 0.0
    # slope of (0, 100), (1, 110), (2, 120): cov(t, c) / var(t) = 10
    assert capacity_trend([(0.0, 100.0), (1.0, 110.0), (2.0, 120.0)]) == pytest.approx(10.0)
    assert capacity_trend([(5.0, 100.0)]) == 0.0


@pytest.mark.parametrize(
    ("level", "expected"),
    [(0.0, "low"), (0.3, "low"), (0.31, "medium"), (0.8, "medium"), (0.81, "high"), (1.0, "high"), (1.01, "critical")],
)
def test_activity_thresholds(level: float, expected: str) -> None:
    assert activity_level(level, 0.3, 0.8) == expected


@pytest.mark.parametrize(
    ("activity", "trend", "decision"),
    [
        ("low", -1.0, "scale-in"),
        ("low", 0.0, "scale-in"),
        ("low", 1.0, "scale-in"),
        ("medium", -1.0, "nothing"),
        ("medium", 0.0, "nothing"),
        ("medium", 1.0, "nothing"),
        ("high", -1.0, "nothing"),
        ("high", 0.0, "nothing"),  # constant counts as "decreasing or constant"
        ("high", 0.001, "scale-out"),
        ("critical", -1.0, "scale-out"),
        ("critical", 0.0, "scale-out"),
        ("critical", 1.0, "scale-out"),
    ],
)
def test_decision_matrix_table_i(activity: str, trend: float, decision: str) -> None:
    assert decide(activity, trend) == decision  # type: ignore[arg-type]


def test_new_degree_eq_11() -> None:
    assert new_degree(3, 0.9, "high", 128) == 4  # high: one more
    assert new_degree(3, 1.5, "critical", 128) == 5  # ⌈4.5⌉
    # a low vertex is sized for θmax (0.8), not for 100 % busy: ⌈deg × GAL / θmax⌉
    assert new_degree(4, 0.25, "low", 128) == 2  # ⌈1.25⌉
    assert new_degree(4, 0.2, "low", 128) == 1  # ⌈1.0⌉, not 2 from rounding noise
    assert new_degree(8, 0.3, "low", 128, theta_max=0.6) == 4
    assert new_degree(3, 0.01, "low", 128) == 1  # never below 1
    assert new_degree(100, 3.0, "critical", 128) == 128  # bounded by maxParallelism


def test_estim_output_and_combine_eq_8_10() -> None:
    assert estim_output(1000.0, 600.0, 0.5) == 300.0  # min(input, capacity) × SF
    assert combine_estimates(10.0, 30.0, "max") == 30.0
    assert combine_estimates(10.0, 30.0, "min") == 10.0


def chain(rates: dict[str, VertexMetrics], **spec):
    topology = parse_manifest(
        manifest(
            [src("s", 1), work("a", 2), work("b", 2), sink("z", 1)],
            [edge("s", "a"), edge("a", "b"), edge("b", "z")],
            **spec,
        )
    )
    return topology, MetricSnapshot(rates)


def vm(processing: float, true_rate: float | None, executors: int, *, input_rate=None, trend=0.0, queue=0.0, emit=None):
    return VertexMetrics(
        processing_rate=processing,
        emit_rate=processing if emit is None else emit,
        executors=executors,
        input_rate=input_rate,
        true_processing_rate=true_rate,
        input_trend=trend,
        queue_length=queue,
    )


def test_evaluate_hand_computed_window_and_global_pass() -> None:
    # Window 10 s, period 1 s. s offers 1000/s (true 5000/s, 1 executor): LAL 0.2, low.
    # a: 2 executors, true 600/s in all (300/s each), input 1000/s, 400 pending, trend 0:
    #    EstimInput = 1000 × 10 + 400 = 10400; capacity = 300 × 10 × 2 = 6000; LAL 1.7333 -> critical,
    #    degree ⌈2 × 1.7333⌉ = 4; EstimOutput at 4 executors: min(10400, 12000) × (emit 600 / processed 600) = 10400.
    # b: 2 executors, true 1600/s (800/s each), receives a's 600/s: local 6000 -> LAL 6000 / 16000 = 0.375;
    #    its parent is critical: max(6000, 10400) = 10400 -> GAL 0.65, medium, nothing.
    # z: its parent b is not critical: local only; 600/s against 10000/s: low, stays at 1.
    topology, snapshot = chain(
        {
            "s": vm(1000.0, 5000.0, 1, input_rate=1000.0),
            "a": vm(600.0, 600.0, 2, queue=400.0),
            "b": vm(600.0, 1600.0, 2),
            "z": vm(600.0, 10000.0, 1),
        }
    )
    result = evaluate(topology, snapshot, {"s": 1, "a": 2, "b": 2, "z": 1}, 10.0, AutoscaleSettings(period_s=1.0))
    a, b, z = result.vertices["a"], result.vertices["b"], result.vertices["z"]
    assert result.vertices["s"].activity == "low" and result.vertices["s"].target == 1
    assert a.estim_input == 10400.0 and a.capacity == 6000.0
    assert a.lal == pytest.approx(10400.0 / 6000.0) and a.activity == "critical"
    assert a.decision == "scale-out" and a.target == 4
    assert b.lal == pytest.approx(0.375)
    assert b.gal == pytest.approx(0.65) and b.activity == "medium" and b.decision == "nothing" and b.target == 2
    assert "critical parent" in b.reason
    assert z.activity == "low" and z.target == 1 and "critical parent" not in z.reason
    assert result.changes == {"a": (2, 4)}


def test_combine_min_lets_the_child_scale_in_where_max_keeps_it() -> None:
    # b (4 executors, 500/s each) receives a's 600/s: local 6000 of a 20000 capacity, GAL 0.3 with min
    # (low: ⌈4 × 0.3⌉ = 2); a's output at its new degree, 10400, gives 0.52 with max (medium: stays)
    rates = {
        "s": vm(1000.0, 5000.0, 1, input_rate=1000.0),
        "a": vm(600.0, 600.0, 2, queue=400.0),
        "b": vm(100.0, 2000.0, 4),
        "z": vm(100.0, 10000.0, 1),
    }
    topology, snapshot = chain(rates)
    parallelism = {"s": 1, "a": 2, "b": 4, "z": 1}
    maximum = evaluate(topology, snapshot, parallelism, 10.0, AutoscaleSettings(combine="max"))
    minimum = evaluate(topology, snapshot, parallelism, 10.0, AutoscaleSettings(combine="min"))
    assert maximum.vertices["b"].gal == pytest.approx(10400 / 20000)
    assert maximum.vertices["b"].decision == "nothing" and maximum.vertices["b"].target == 4
    assert minimum.vertices["b"].gal == pytest.approx(6000 / 20000)
    assert minimum.vertices["b"].decision == "scale-in" and minimum.vertices["b"].target == math.ceil(4 * 0.3 / 0.8)


def test_a_high_vertex_grows_only_on_an_increasing_input() -> None:
    base = {"s": vm(1000.0, 5000.0, 1, input_rate=1000.0), "b": vm(900.0, 2000.0, 2), "z": vm(900.0, 1e5, 1)}
    # a: 900/s against 1000/s capacity -> LAL 0.9 (high)
    steady = {**base, "a": vm(900.0, 1000.0, 2)}
    rising = {**base, "a": vm(900.0, 1000.0, 2, trend=0.5)}
    topology, _snapshot = chain(steady)
    parallelism = {"s": 1, "a": 2, "b": 2, "z": 1}
    # the source offers 900/s, so a's demand is 900/s
    s_snap = MetricSnapshot({**steady, "s": vm(900.0, 5000.0, 1, input_rate=900.0)})
    assert evaluate(topology, s_snap, parallelism, 10.0).vertices["a"].decision == "nothing"
    r_snap = MetricSnapshot({**rising, "s": vm(900.0, 5000.0, 1, input_rate=900.0)})
    result = evaluate(topology, r_snap, parallelism, 10.0, AutoscaleSettings(period_s=0.0))
    assert result.vertices["a"].activity == "high" and result.vertices["a"].decision == "scale-out"
    assert result.vertices["a"].target == 3  # high: +1


def test_unmeasured_and_global_fed_vertices() -> None:
    topology = parse_manifest(
        manifest(
            [src("s", 1), work("g", 1), sink("z", 1)],
            [edge("s", "g", grouping="global"), edge("g", "z")],
        )
    )
    snapshot = MetricSnapshot(
        {
            "s": vm(1000.0, 5000.0, 1, input_rate=1000.0),
            "g": vm(200.0, 200.0, 1),  # LAL 5: critical, but every event goes to executor 0
            "z": vm(200.0, None, 1),  # no busy time measured, input 200/s: left alone
        }
    )
    result = evaluate(topology, snapshot, {"s": 1, "g": 1, "z": 1}, 10.0)
    assert result.vertices["g"].activity == "critical" and result.vertices["g"].decision == "nothing"
    assert "global input" in result.vertices["g"].reason
    assert result.vertices["z"].activity is None and result.vertices["z"].target == 1
    assert "unmeasured" in result.vertices["z"].reason


def test_a_catch_up_is_not_load() -> None:
    # s is offered 200/s but emits 400/s draining the backlog of a rescale's pause; a (one executor, 333/s)
    # measured 400/s in: on that, critical, scale-out; on the load the source offers, 0.6: medium, nothing
    topology = parse_manifest(manifest([src("s", 1), work("a", 1), sink("z", 1)], [edge("s", "a"), edge("a", "z")]))
    snapshot = MetricSnapshot(
        {
            "s": vm(400.0, 5000.0, 1, input_rate=200.0),
            "a": vm(400.0, 333.0, 1, input_rate=400.0),
            "z": vm(400.0, 1e5, 1, input_rate=400.0),
        }
    )
    result = evaluate(topology, snapshot, {"s": 1, "a": 1, "z": 1}, 5.0)
    assert result.vertices["a"].estim_input == pytest.approx(200.0 * 5.0)
    assert result.vertices["a"].activity == "medium" and result.changes == {}


def test_a_backlog_held_at_the_source_by_back_pressure_is_pending_for_the_bottleneck() -> None:
    # the sink does 12.5/s on one executor against 22.5/s offered; its queue is bounded (4 items), the other
    # 90 wait at the source, which it holds back: eq. 3's pending is 94, not 4, and the sink is sized for
    # (22.5 × 5 + 94) / (12.5 × 5) = 3.3 of its capacity: 4 executors, not ⌈1.86⌉ = 2
    topology = parse_manifest(manifest([src("s", 1), sink("z", 1)], [edge("s", "z")]))
    snapshot = MetricSnapshot(
        {
            "s": vm(12.5, 5000.0, 1, input_rate=22.5, queue=90.0),
            "z": vm(12.5, 12.5, 1, input_rate=12.5, queue=4.0, emit=0.0),
        }
    )
    from elastream.core.metrics import waiting_load

    assert waiting_load(topology, snapshot) == {"s": 90.0, "z": 94.0}
    result = evaluate(topology, snapshot, {"s": 1, "z": 1}, 5.0)
    z = result.vertices["z"]
    assert z.estim_input == pytest.approx(22.5 * 5 + 94.0) and z.activity == "critical" and z.target == 4
