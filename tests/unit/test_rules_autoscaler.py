"""ARiSto's rules against hand-computed windows, and the autoscaler's safety rules cell by cell (pure, no I/O)."""

from __future__ import annotations

import pytest

from elastream.core.autoscaling.decision import SCALE_IN_VOTES, AutoscalerState, WindowInfo, recommend
from elastream.core.autoscaling.rules_policy import RuleThresholds, evaluate_rules, total_capacity
from elastream.core.metrics import MetricSnapshot, VertexMetrics
from elastream.core.topology import parse_manifest
from support.manifests import edge, manifest, sink, src, work


def topo(policy: str = "rules", nodes: int = 2, **auto):
    return parse_manifest(
        manifest(
            [src("s", 1), work("a", 2), sink("z", 1)],
            [edge("s", "a"), edge("a", "z")],
            nodes=nodes,
            slotsPerNode=4,
            scaling={"auto": {"enabled": True, "policy": policy, "stabilizationSeconds": 30, **auto}},
        )
    )


def snap(busy: dict[str, float], rates: dict[str, tuple[float, float]] | None = None) -> MetricSnapshot:
    rates = rates or {}
    return MetricSnapshot(
        {
            v: VertexMetrics(
                processing_rate=rates.get(v, (100.0, 0.0))[0],
                emit_rate=rates.get(v, (100.0, 0.0))[0],
                executors={"s": 1, "a": 2, "z": 1}[v],
                input_rate=rates.get(v, (100.0, 0.0))[0] if v == "s" else None,
                busy_fraction=b,
                true_processing_rate=rates.get(v, (100.0, 0.0))[1] or None,
            )
            for v, b in busy.items()
        }
    )


PAR = {"s": 1, "a": 2, "z": 1}


def test_total_capacity_is_busy_threads_over_slots() -> None:
    # 0.5 × 1 + 0.9 × 2 + 0.1 × 1 = 2.4 busy threads over 2 × 4 slots
    assert total_capacity({"s": 0.5, "a": 0.9, "z": 0.1}, PAR, 2, 4) == pytest.approx(0.3)


def test_rule_1_and_2_a_busy_vertex_gets_an_executor_and_a_node_when_over_th_e() -> None:
    t = topo()
    verdict = evaluate_rules(t, snap({"s": 0.2, "a": 0.95, "z": 0.1}), PAR, 2)
    assert verdict.over_capacity == ("a",) and verdict.parallelism["a"] == 3 and verdict.node_delta == 0
    # th_e 2 executors per node: 5 executors need 3 nodes
    verdict = evaluate_rules(t, snap({"s": 0.2, "a": 0.95, "z": 0.1}), PAR, 2, RuleThresholds(executors_per_node=2))
    assert verdict.node_delta == 1 and "exceed 2 per node" in verdict.rule


def test_rule_3_and_4_total_capacity_adds_or_removes_a_node() -> None:
    t = topo()
    high = evaluate_rules(t, snap({"s": 0.79, "a": 0.79, "z": 0.79}), PAR, 1)  # 3.16 of 4 slots = 0.79
    assert high.over_capacity == () and high.node_delta == 1 and "over 0.75" in high.rule
    low = evaluate_rules(t, snap({"s": 0.1, "a": 0.2, "z": 0.1}), PAR, 2)  # 0.6 of 8 = 0.075
    assert low.node_delta == -1 and "under 0.25" in low.rule
    middle = evaluate_rules(t, snap({"s": 0.5, "a": 0.5, "z": 0.5}), PAR, 1)  # 2 of 4 = 0.5
    assert middle.node_delta == 0
    assert evaluate_rules(t, snap({"s": 0.0, "a": 0.0, "z": 0.0}), PAR, 1).node_delta == 0  # never below 1 node


WINDOW = WindowInfo(start=100.0, end=120.0, complete=True)


def run(t, s, state=None, now=121.0, nodes=2, window=WINDOW):
    return recommend(t, s, window, PAR, nodes, state or AutoscalerState(), now, period_s=2.0, window_s=20.0)


def test_a_scale_out_acts_at_once_and_says_why() -> None:
    rec, _state = run(topo(), snap({"s": 0.2, "a": 0.95, "z": 0.1}))
    assert rec.action == "scale-out" and rec.parallelism == {"s": 1, "a": 3, "z": 1} and rec.target_nodes == 2
    assert rec.to_status()["decision"] == "scale-out" and "capacity over 0.8 in a" in rec.reason


def test_stabilization_and_overlapping_windows_hold() -> None:
    t = topo()
    busy = snap({"s": 0.2, "a": 0.95, "z": 0.1})
    changed = AutoscalerState().changed(at=110.0, direction="out")
    rec, _ = run(t, busy, changed, now=121.0)
    assert rec.action == "hold" and "stabilizing" in rec.reason and rec.next_allowed_at == 140.0
    rec, _ = run(t, busy, changed, now=141.0)  # the window starts at 100, before the change finished
    assert rec.action == "hold" and "overlaps the last rescale" in rec.reason
    after = WindowInfo(start=116.0, end=136.0, complete=True)
    rec, _ = run(t, busy, changed, now=141.0, window=after)
    assert rec.action == "scale-out"  # not held for the catch-up: a too-small change never catches up
    short = WindowInfo(start=126.0, end=136.0, complete=False)
    rec, _ = run(t, busy, changed, now=141.0, window=short)
    assert rec.action == "hold"


def test_a_scale_in_is_held_through_the_catch_up() -> None:
    t = topo()
    idle = snap({"s": 0.1, "a": 0.2, "z": 0.1})
    changed = AutoscalerState().changed(at=100.0, direction="in")  # after a scale-in: 1 × stabilization
    after = WindowInfo(start=116.0, end=136.0, complete=True)
    rec, _ = run(t, idle, changed, now=141.0, window=after)
    assert rec.action == "hold" and "still catching up" in rec.reason
    rec, _ = run(t, idle, changed.settled(120.0), now=141.0, window=after)
    assert rec.action == "hold" and "overlaps the catch-up" in rec.reason
    rec, _ = run(t, idle, changed.settled(115.0), now=141.0, window=after)
    assert rec.action == "hold" and "1 of 3" in rec.reason  # now only the votes remain


def test_a_scale_in_needs_votes_and_waits_twice_as_long_after_a_scale_out() -> None:
    t = topo()
    idle = snap({"s": 0.1, "a": 0.2, "z": 0.1})
    state = AutoscalerState()
    for vote in range(1, SCALE_IN_VOTES):
        rec, state = run(t, idle, state)
        assert rec.action == "hold" and f"{vote} of {SCALE_IN_VOTES}" in rec.reason
    rec, state = run(t, idle, state)
    assert rec.action == "scale-in" and rec.target_nodes == 1
    # a dip between votes resets them
    state = AutoscalerState()
    _, state = run(t, idle, state)
    _, state = run(t, snap({"s": 0.5, "a": 0.5, "z": 0.5}), state)
    assert state.scale_in_votes == 0
    # after a scale-out, a scale-in waits 2 × stabilization
    out = AutoscalerState().changed(at=100.0, direction="out").settled(101.0)
    late_window = WindowInfo(start=102.0, end=122.0, complete=True)
    rec, _ = run(t, idle, out, now=150.0, window=late_window)
    assert rec.action == "hold" and rec.next_allowed_at == 160.0


def test_bounds_min_and_max_nodes() -> None:
    idle = snap({"s": 0.1, "a": 0.2, "z": 0.1})
    t = topo(minNodes=2)
    state = AutoscalerState()
    for _ in range(SCALE_IN_VOTES):
        rec, state = run(t, idle, state)
    assert rec.action == "none" and rec.target_nodes == 2 and "bounded to 2" in rec.reason
    busy = snap({"s": 0.8, "a": 0.8, "z": 0.8})
    rec, _ = run(topo(maxNodes=2), busy)
    assert rec.action == "none" and rec.target_nodes == 2


def test_the_autoscale_policy_sizes_nodes_to_its_executors() -> None:
    # a (2 × 50/s) against 1000/s offered: LAL 10, ⌈2 × 10⌉ = 20 executors, 22 in all: 6 nodes of 4 slots,
    # bounded by maxNodes 3 -> a gets what fits: 12 - 2 = 10
    t = topo(policy="autoscale", maxNodes=3)
    window = snap({"s": 0.2, "a": 1.0, "z": 0.1}, {"s": (1000.0, 5000.0), "a": (100.0, 100.0), "z": (100.0, 5000.0)})
    rec, _ = run(t, window)
    assert rec.action == "scale-out" and rec.target_nodes == 3
    assert rec.parallelism == {"s": 1, "a": 10, "z": 1}
    assert rec.vertices["a"]["activity"] == "critical"


def test_rule_4_is_checked_before_it_removes_a_node() -> None:
    t = topo()  # 2 nodes × 4 slots
    # 0.2 of 8 slots now would be 0.4 on one node: fine, and 4 executors fit 4 slots
    fine = evaluate_rules(t, snap({"s": 0.4, "a": 0.3, "z": 0.4}), PAR, 2)
    assert fine.node_delta == -1 and fine.parallelism == PAR
    # 6 executors on 2 nodes; one node has 4 slots: a (4 executors, 0.15 busy each -> 0.6 threads) keeps
    # ⌈0.6 / 0.8⌉ = 1, so it gives up two and rule 1 will not want them back
    wide = {"s": 1, "a": 4, "z": 1}
    verdict = evaluate_rules(t, snap({"s": 0.2, "a": 0.15, "z": 0.1}), wide, 2)
    assert (
        verdict.node_delta == -1 and verdict.parallelism == {"s": 1, "a": 2, "z": 1} and "a 4->2 to fit" in verdict.rule
    )
    # a vertex whose busy threads need all its executors: no node goes
    busy_a = {"s": 1, "a": 6, "z": 1}
    held = evaluate_rules(t, snap({"s": 0.05, "a": 0.1, "z": 0.05}), busy_a, 2, RuleThresholds(capacity=0.1, low=0.25))
    assert held.node_delta == 0 and "do not fit 1 nodes" in held.rule
    # one node left would be over th_high
    crowded = evaluate_rules(
        t, snap({"s": 0.9, "a": 0.5, "z": 0.9}), PAR, 2, RuleThresholds(low=0.5, high=0.6, capacity=0.95)
    )
    assert crowded.node_delta == 0 and "would be at" in crowded.rule


def test_a_growing_vertex_is_not_held_by_a_node_scale_in() -> None:
    # a is critical (⌈2 × 2⌉ = 4) while s and z shrink: 6 executors would fit 2 nodes of 4, but the growth is
    # decided now on the current 3 nodes; the spare node waits for a scale-in's votes
    t = topo(policy="autoscale", nodes=3)
    window = snap({"s": 0.2, "a": 1.0, "z": 0.1}, {"s": (200.0, 5000.0), "a": (100.0, 100.0), "z": (100.0, 5000.0)})
    rec, _ = run(t, window, nodes=3)
    assert rec.action == "scale-out" and rec.target_nodes == 3 and rec.parallelism["a"] == 4


def test_the_rules_take_the_busy_fraction_the_offered_load_implies() -> None:
    from elastream.core.autoscaling.rules_policy import load_busy_fractions

    # a measured 100 % busy while catching up, but the source offers 100/s against a's 400/s (2 executors):
    # at that load a is 25 % busy, no rule 1; with nothing measured, the measured busy fraction counts
    t = topo()
    catching_up = snap({"s": 0.1, "a": 1.0, "z": 0.1}, {"s": (100.0, 1000.0), "a": (100.0, 400.0), "z": (100.0, 0.0)})
    busy = load_busy_fractions(t, catching_up)
    assert busy["a"] == pytest.approx(0.25) and busy["s"] == pytest.approx(0.1) and busy["z"] == 0.1
    verdict = evaluate_rules(t, catching_up, PAR, 2)
    assert verdict.over_capacity == () and verdict.parallelism == PAR
