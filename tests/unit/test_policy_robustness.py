"""A policy never takes the controller down (issue 38, point 2).

A window the policies cannot decide on (no capacity measured, NaN, infinity, negative rates, an empty
window, no nodes) decides nothing and says why; property tests feed both policies windows with zeros,
gaps and extremes and check they never raise and always stay within [minNodes, maxNodes] or take no
action. The controller's half (an evaluation that raises anyway: the tick survives) is at the
end: `test_an_evaluation_that_raises_decides_nothing_and_the_tick_survives`.
"""

from __future__ import annotations

import logging
import math

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from elastream.control.controller import TopologyController
from elastream.core.autoscaling.autoscale_policy import AutoscaleSettings, evaluate, new_degree
from elastream.core.autoscaling.decision import AutoscalerState, WindowInfo, recommend
from elastream.core.autoscaling.rules_policy import evaluate_rules
from elastream.core.metrics import MetricSnapshot, SnapshotError, VertexMetrics
from elastream.core.topology import Topology, parse_manifest
from elastream.core.window_analysis import Analysis
from support.fakes import (
    DictStatus,
    FakeBackend,
    FakeClock,
    FakeMigrator,
    ListEvents,
    ListFeed,
    ListRequests,
    SimulatedMetrics,
)
from support.manifests import edge, manifest, sink, src, work

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PAR = {"s": 1, "a": 2, "z": 1}
WINDOW = WindowInfo(start=100.0, end=120.0, complete=True)
NOW = 121.0


def topo(policy: str = "autoscale", nodes: int = 2, **auto: object) -> Topology:
    return parse_manifest(
        manifest(
            [src("s", 1), work("a", 2), sink("z", 1)],
            [edge("s", "a"), edge("a", "z")],
            nodes=nodes,
            slotsPerNode=4,
            scaling={"auto": {"enabled": True, "policy": policy, "stabilizationSeconds": 30, **auto}},
        )
    )


def vm(processing: float, true_rate: float | None, executors: int, **extra: float | None) -> VertexMetrics:
    return VertexMetrics(
        processing_rate=processing,
        emit_rate=processing,
        executors=executors,
        true_processing_rate=true_rate,
        **extra,  # type: ignore[arg-type]
    )


def busy_window() -> MetricSnapshot:
    """s offers 1000/s; a (2 executors) measured 300/s each; z is fast."""
    return MetricSnapshot(
        {
            "s": vm(1000.0, 5000.0, 1, input_rate=1000.0),
            "a": vm(600.0, 600.0, 2, queue_length=400.0),
            "z": vm(600.0, 1e4, 1),
        }
    )


# ---- the regression: capacity estimated at 0 with input seen ------------------------------------------------


def test_a_capacity_estimated_at_zero_with_input_seen_decides_nothing_for_that_vertex() -> None:
    # a's per-executor capacity fell from 1000/s to 300/s over the last evaluations: ε of eq. 5 takes the
    # estimate below zero, clamped to 0. Today's code divided by it: GAL inf, "critical", and
    # new_degree raised OverflowError (cannot convert float infinity to integer) out of controller.tick().
    history = {"a": ((0.0, 1000.0), (2.0, 300.0))}
    result = evaluate(topo(), busy_window(), PAR, 10.0, AutoscaleSettings(period_s=2.0), history)
    a = result.vertices["a"]
    assert a.estim_capacity == 0.0
    assert a.decision == "nothing" and a.target == 2 and a.activity is None and a.gal is None
    assert "no capacity estimated for vertex a in the window" in a.reason and "nothing decided" in a.reason
    assert result.changes == {}


def test_the_regression_through_recommend_with_the_capacity_history_it_remembers() -> None:
    topology = topo(nodes=2)
    # recommend adds this window's 300/s per executor at t 121 to the history: ε = -234/s × 2 s × 20 s × 2
    # = -18729 against a capacity of 12000 items
    state = AutoscalerState(capacity_history={"a": ((100.0, 5000.0), (110.0, 3000.0), (119.0, 400.0))})
    rec, _state = recommend(topology, busy_window(), WINDOW, PAR, 2, state, 121.0, period_s=2.0, window_s=20.0)
    assert rec.vertices["a"]["decision"] == "nothing" and rec.vertices["a"]["gal"] is None
    assert "no capacity estimated for vertex a" in rec.vertices["a"]["reason"]
    assert "no capacity estimated for vertex a" in rec.reason
    assert rec.parallelism is None or rec.parallelism["a"] == 2


def test_new_degree_is_total() -> None:
    assert new_degree(3, math.inf, "critical", 16) == 16
    assert new_degree(3, math.nan, "critical", 16) == 3
    assert new_degree(3, -math.inf, "low", 16) == 1
    assert new_degree(3, 1e308, "critical", 16) == 16  # 3 × 1e308 overflows to inf


# ---- windows that cannot be decided: the whole evaluation holds -----------------------------------------------


@pytest.mark.parametrize("policy", ["autoscale", "rules"])
@pytest.mark.parametrize(
    ("case", "vertices", "nodes", "window", "window_s", "expected"),
    [
        ("NaN rate", {"a": vm(math.nan, 600.0, 2)}, 2, WINDOW, 20.0, "a.processing_rate is nan"),
        ("inf capacity", {"a": vm(600.0, math.inf, 2)}, 2, WINDOW, 20.0, "a.true_processing_rate is inf"),
        ("negative input", {"s": vm(1000.0, 5e3, 1, input_rate=-5.0)}, 2, WINDOW, 20.0, "s.input_rate is negative"),
        ("NaN trend", {"a": vm(600.0, 600.0, 2, input_trend=math.nan)}, 2, WINDOW, 20.0, "a.input_trend is nan"),
        ("empty window", {}, 2, WindowInfo(120.0, 120.0, True), 20.0, "the window is empty"),
        ("NaN window", {}, 2, WindowInfo(math.nan, 120.0, True), 20.0, "the window is empty"),
        ("zero duration", {}, 2, WINDOW, 0.0, "the window lasts 0 s"),
        ("no nodes", {}, 0, WINDOW, 20.0, "0 nodes run"),
    ],
)
def test_a_window_that_cannot_be_decided_decides_nothing_and_says_why(
    policy: str,
    case: str,
    vertices: dict[str, VertexMetrics],
    nodes: int,
    window: WindowInfo,
    window_s: float,
    expected: str,
) -> None:
    snapshot = MetricSnapshot({**busy_window().vertices, **vertices})
    state = AutoscalerState(scale_in_votes=2)
    rec, after = recommend(topo(policy), snapshot, window, PAR, nodes, state, 121.0, period_s=2.0, window_s=window_s)
    assert rec.action == "none", case
    assert rec.target_nodes == nodes and rec.parallelism is None
    assert expected in rec.reason and "nothing decided" in rec.reason, rec.reason
    assert after.scale_in_votes == 0  # an undecided window breaks a run of scale-in votes


def test_a_degree_of_zero_or_a_missing_vertex_decides_nothing() -> None:
    rec, _ = recommend(topo(), busy_window(), WINDOW, {**PAR, "a": 0}, 2, AutoscalerState(), 121.0, 2.0, 20.0)
    assert rec.action == "none" and "a runs 0 executors" in rec.reason
    partial = MetricSnapshot({v: m for v, m in busy_window().vertices.items() if v != "z"})
    rec, _ = recommend(topo(), partial, WINDOW, PAR, 2, AutoscalerState(), 121.0, 2.0, 20.0)
    assert rec.action == "none" and "no rates for z" in rec.reason


def test_a_non_finite_capacity_is_never_remembered_for_eq_5() -> None:
    snapshot = MetricSnapshot({**busy_window().vertices, "a": vm(600.0, math.inf, 2)})
    _rec, state = recommend(topo(), snapshot, WINDOW, PAR, 2, AutoscalerState(), 121.0, 2.0, 20.0)
    assert "a" not in state.capacity_history


# ---- property tests: zeros, gaps and extremes ----------------------------------------------------------------

#: what a window's numbers can be on a busy machine or a broken one
EXTREMES = st.one_of(
    st.just(0.0),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 1e-300, 5e-324, 1e300, 1.7e308]),
    st.floats(min_value=0.0, max_value=1e6),
    st.floats(allow_nan=True, allow_infinity=True),
)
#: numbers a window that passes `window_check` can hold: zeros, the tiniest and the hugest floats
FINITE = st.one_of(
    st.just(0.0),
    st.sampled_from([5e-324, 1e-300, 1e-9, 1e300, 1.7e308]),
    st.floats(min_value=0.0, max_value=1e6),
)
SLOPES = st.one_of(FINITE, FINITE.map(lambda x: -x))


@st.composite
def windows(draw: st.DrawFn, finite: bool | None = None) -> MetricSnapshot:
    """Three vertices' rates with gaps (None); `finite`: only numbers a policy is given (zeros and
    extremes), False: anything, None: either (drawn)."""
    if finite is None:
        finite = draw(st.booleans())
    values, slopes = (FINITE, SLOPES) if finite else (EXTREMES, EXTREMES)
    vertices = {}
    for v, executors in (("s", 1), ("a", 2), ("z", 1)):
        vertices[v] = VertexMetrics(
            processing_rate=draw(values),
            emit_rate=draw(values),
            executors=draw(st.sampled_from([executors, 0, 1, 64])),
            input_rate=draw(st.none() | values),
            busy_fraction=draw(st.none() | values),
            true_processing_rate=draw(st.none() | values),
            queue_growth=draw(st.none() | slopes),
            input_trend=draw(st.none() | slopes),
            queue_length=draw(st.none() | values),
        )
    return MetricSnapshot(vertices)


@st.composite
def histories(draw: st.DrawFn) -> dict[str, tuple[tuple[float, float], ...]]:
    points = st.tuples(st.one_of(st.floats(0.0, 110.0), st.sampled_from([math.nan, math.inf])), EXTREMES)
    return {v: tuple(draw(st.lists(points, max_size=4))) for v in ("s", "a", "z")}


PARALLELISMS = st.fixed_dictionaries({"s": st.integers(0, 8), "a": st.integers(0, 20), "z": st.integers(0, 8)})


@SETTINGS
@given(
    policy=st.sampled_from(["autoscale", "rules"]),
    snapshot=windows(),
    parallelism=PARALLELISMS,
    nodes=st.integers(0, 12),
    bounds=st.tuples(st.integers(1, 4), st.integers(0, 8)),
    window_s=st.one_of(st.sampled_from([0.0, 1e-9, 20.0, 1e12, math.nan, math.inf, -5.0]), st.floats(0.0, 600.0)),
    start=st.one_of(st.sampled_from([math.nan, 120.0]), st.floats(0.0, 200.0)),
    history=histories(),
    votes=st.integers(0, 2),
)
def test_recommend_never_raises_and_stays_within_the_bounds(
    policy: str,
    snapshot: MetricSnapshot,
    parallelism: dict[str, int],
    nodes: int,
    bounds: tuple[int, int],
    window_s: float,
    start: float,
    history: dict[str, tuple[tuple[float, float], ...]],
    votes: int,
) -> None:
    min_nodes, extra = bounds
    topology = topo(policy, nodes=max(1, nodes), minNodes=min_nodes, maxNodes=min_nodes + extra)
    state = AutoscalerState(capacity_history=history, scale_in_votes=votes)
    window = WindowInfo(start, 120.0, complete=True)
    rec, after = recommend(topology, snapshot, window, parallelism, nodes, state, NOW, 2.0, window_s)
    assert rec.action in ("none", "hold", "scale-out", "scale-in")
    assert isinstance(rec.reason, str) and rec.reason
    if rec.action in ("scale-out", "scale-in"):
        assert min_nodes <= rec.target_nodes <= min_nodes + extra
        for v, degree in (rec.parallelism or {}).items():
            assert 1 <= degree <= topology.vertices[v].max_parallelism
    for points in after.capacity_history.values():  # only finite, positive capacities are remembered
        assert all(math.isfinite(c) and c > 0.0 for t, c in points if t == NOW)
    rec.to_status()  # publishable as it is


@SETTINGS
@given(snapshot=windows(), parallelism=PARALLELISMS, window_s=st.floats(0.0, 1e9), history=histories())
def test_the_autoscale_policy_never_raises_and_every_target_is_a_degree(
    snapshot: MetricSnapshot, parallelism: dict[str, int], window_s: float, history: dict
) -> None:
    topology = topo()
    degrees = {v: max(1, d) for v, d in parallelism.items()}
    result = evaluate(topology, snapshot, degrees, window_s, AutoscaleSettings(period_s=2.0), history)
    for v, e in result.vertices.items():
        assert 1 <= e.target <= topology.vertices[v].max_parallelism
        if e.decision == "nothing":
            assert e.target == degrees[v]
        e.to_status()


@SETTINGS
@given(snapshot=windows(), parallelism=PARALLELISMS, nodes=st.integers(1, 12))
def test_the_rules_policy_never_raises_and_removes_one_node_at_most(
    snapshot: MetricSnapshot, parallelism: dict[str, int], nodes: int
) -> None:
    topology = topo("rules")
    degrees = {v: max(1, d) for v, d in parallelism.items()}
    verdict = evaluate_rules(topology, snapshot, degrees, nodes)
    for v, degree in verdict.parallelism.items():
        assert 1 <= degree <= max(degrees[v], topology.vertices[v].max_parallelism)
    assert verdict.node_delta >= -1 and (nodes + verdict.node_delta) >= 1


# ---- the controller: an evaluation that raises anyway decides nothing, and the tick survives ----------------


class WindowedMetrics(SimulatedMetrics):
    """The simulator's snapshot as a full window ending now; `fail` makes the analysis raise it."""

    def __init__(self, topology: Topology, backend: FakeBackend, clock: FakeClock) -> None:
        super().__init__(topology, backend)
        self.clock = clock
        self.fail: Exception | None = None

    def analyse(self, window: int) -> Analysis:
        if self.fail is not None:
            raise self.fail
        end = self.clock.t
        return Analysis(SimulatedMetrics.snapshot(self, window), {}, {}, {}, end - window, end, 100)


def autoscaled() -> tuple[FakeMigrator, DictStatus, TopologyController]:
    # parse: 2 executors × 500/s against 4000/s offered: critical, the autoscaler scales it out to 8
    topology = parse_manifest(
        manifest(
            [src("s", 2, rate=4000), work("parse", 2, costMs=2), sink("z", 1, costMs=0.05)],
            [edge("s", "parse"), edge("parse", "z")],
            nodes=2,
            slotsPerNode=6,
            scaling={"auto": {"enabled": True, "stabilizationSeconds": 30}},
        )
    )
    backend, clock = FakeBackend(), FakeClock()
    migrator, status = FakeMigrator(backend), DictStatus()
    controller = TopologyController(
        topology=topology,
        backend=backend,  # type: ignore[arg-type]
        metrics=WindowedMetrics(topology, backend, clock),  # type: ignore[arg-type]
        migrator=migrator,  # type: ignore[arg-type]
        feed=ListFeed(),
        requests=ListRequests(),  # type: ignore[arg-type]
        status=status,
        events=ListEvents(),
        clock=clock,  # type: ignore[arg-type]
    )
    controller.start()
    return migrator, status, controller


def errors(policy: str = "autoscale") -> float:
    """The evaluation errors counted for the topology `autoscaled()` runs (default/t)."""
    labels = {"namespace": "default", "topology": "t", "policy": policy}
    return REGISTRY.get_sample_value("elastream_autoscaler_evaluation_errors_total", labels) or 0.0


def test_the_issue_38_window_through_the_controller_decides_nothing_for_parse() -> None:
    # what killed `elastream run`: a capacity that fell fast enough over the last evaluations for eq. 5 to
    # estimate 0, with input seen. The tick runs, parse keeps its 2 executors and its reason says why.
    migrator, status, controller = autoscaled()
    falling = ((controller.clock.t - 10.0, 1e5), (controller.clock.t - 5.0, 5e4))
    controller.autoscaler = AutoscalerState(capacity_history={"parse": falling})
    before = errors()
    assert controller.tick() is None
    evaluation = status.fields["autoscaler"][-1]
    assert evaluation["vertices"]["parse"]["decision"] == "nothing"
    assert evaluation["vertices"]["parse"]["target"] == 2 and evaluation["vertices"]["parse"]["gal"] is None
    assert "no capacity estimated for vertex parse in the window" in evaluation["vertices"]["parse"]["reason"]
    assert "no capacity estimated for vertex parse" in evaluation["reason"]
    assert all(s.parallelism()["parse"] == 2 for s in migrator.applied)
    assert errors() == before  # decided (nothing for parse) by the policy itself: no error to count


def test_an_evaluation_that_raises_decides_nothing_and_the_tick_survives(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    migrator, status, controller = autoscaled()
    applied = len(migrator.applied)

    def broken(*args: object, **kwargs: object) -> object:
        raise OverflowError("cannot convert float infinity to integer\n(in a policy)")

    monkeypatch.setattr("elastream.control.autoscaler.recommend", broken)
    controller.autoscaler = AutoscalerState(scale_in_votes=2)
    before = errors()
    with caplog.at_level(logging.ERROR, logger="elastream.control"):
        assert controller.tick() is None
    assert errors() == before + 1
    assert len(migrator.applied) == applied  # nothing scaled
    evaluation = status.fields["autoscaler"][-1]
    assert evaluation["decision"] == "none" and evaluation["targetNodes"] == 2 and evaluation["parallelism"] is None
    assert evaluation["reason"] == (
        "the evaluation failed (OverflowError: cannot convert float infinity to integer (in a policy)): nothing decided"
    )
    assert controller.last_evaluation is not None and controller.last_evaluation.action == "none"
    assert controller.autoscaler.scale_in_votes == 0
    # logged with the window on one line: span, samples, per-vertex rates
    (record,) = [r for r in caplog.records if "autoscaler evaluation" in r.getMessage()]
    line = record.getMessage()
    assert "\n" not in line and "100 samples" in line and "window " in line
    assert "parse in - proc " in line and " cap " in line and "x2" in line and record.exc_info is not None

    # the topology keeps running: the next evaluation, with the policy back, scales parse out
    monkeypatch.undo()
    controller.clock.t += 60.0
    record_after = controller.tick()
    assert record_after is not None and record_after.outcome == "succeeded"
    assert migrator.applied[-1].parallelism()["parse"] == 8


def test_an_analysis_that_raises_decides_nothing_too(caplog: pytest.LogCaptureFixture) -> None:
    _migrator, status, controller = autoscaled()
    controller.metrics.fail = SnapshotError("metric sample {'ts': nan} is malformed")  # type: ignore[attr-defined]
    before = errors()
    with caplog.at_level(logging.ERROR, logger="elastream.control"):
        assert controller.tick() is None
    assert errors() == before + 1
    evaluation = status.fields["autoscaler"][-1]
    assert evaluation["decision"] == "none" and "SnapshotError: metric sample" in evaluation["reason"]
    assert any("window not analysed" in r.getMessage() for r in caplog.records)


def test_redis_away_during_the_analysis_is_still_redis_away() -> None:
    _migrator, status, controller = autoscaled()
    controller.metrics.fail = redis.ConnectionError("gone")  # type: ignore[attr-defined]
    before = errors()
    assert controller.tick() is None
    assert controller.store_error.startswith("ConnectionError")
    assert errors() == before and "autoscaler" not in status.fields
