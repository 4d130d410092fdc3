"""Congestion and ETP, checked against the Stela paper's Figure 2 and its definition."""

from __future__ import annotations

import pytest

from elastream.core.planner.etp import congested_vertices, etp_map, etp_sums, etp_table, is_congested
from elastream.core.topology import parse_manifest
from support.manifests import edge, manifest, sink, snapshot, src, work

FIG2_EDGES = [(1, 2), (1, 3), (2, 4), (3, 5), (3, 6), (5, 7), (5, 8), (6, 9), (6, 10)]
FIG2_SINKS = {4: 2000.0, 7: 1000.0, 8: 1000.0, 9: 250.0, 10: 250.0}
FIG2_CONGESTED = {1, 3, 4, 6}


def figure2():
    vertices = []
    for i in range(1, 11):
        if i == 1:
            vertices.append(src(f"v{i}"))
        elif i in FIG2_SINKS:
            vertices.append(sink(f"v{i}"))
        else:
            vertices.append(work(f"v{i}"))
    topology = parse_manifest(manifest(vertices, [edge(f"v{a}", f"v{b}") for a, b in FIG2_EDGES], nodes=3))
    rows = {}
    for i in range(1, 11):
        rate = FIG2_SINKS.get(i, 1000.0)
        # Congested vertices receive twice what they process (ratio 2 > 1.2); the others keep up.
        rows[f"v{i}"] = (rate * 2 if i in FIG2_CONGESTED else rate, rate, rate)
    return topology, snapshot(rows)


def test_figure2_etp_and_priority() -> None:
    topology, snap = figure2()
    table = etp_table(topology, snap, 1.2)
    assert table.throughput == 4500.0
    assert {v for v, row in table.vertices.items() if row.congested} == {f"v{i}" for i in FIG2_CONGESTED}
    etp = {v: row.etp for v, row in table.vertices.items()}
    assert etp["v3"] == pytest.approx(2000 / 4500)
    assert etp["v4"] == pytest.approx(2000 / 4500)
    assert etp["v6"] == pytest.approx(500 / 4500)
    assert etp["v1"] == 0.0
    assert table.priority() == ["v3", "v4", "v6", "v1"]


def test_diamond_counts_a_sink_once() -> None:
    # s -> a -> z and s -> b -> z: Algorithm 1's path sum would give ETP(s) = 2.
    topology = parse_manifest(
        manifest(
            [src("s"), work("a"), work("b"), sink("z")],
            [edge("s", "a"), edge("s", "b"), edge("a", "z"), edge("b", "z")],
        )
    )
    etp = etp_map(topology, {"s": 10.0, "a": 5.0, "b": 5.0, "z": 10.0}, frozenset({"s"}))
    assert etp["s"] == 1.0
    # One congested branch leaves the other path open: still 1, not 0.5.
    etp = etp_map(topology, {"s": 10.0, "a": 5.0, "b": 5.0, "z": 10.0}, frozenset({"a"}))
    assert etp["s"] == 1.0
    # Both branches congested: no un-congested path.
    etp = etp_map(topology, {"s": 10.0, "a": 5.0, "b": 5.0, "z": 10.0}, frozenset({"a", "b"}))
    assert etp["s"] == 0.0


def test_congestion_rule_edges() -> None:
    assert is_congested(121.0, 100.0, 1.2)
    assert not is_congested(120.0, 100.0, 1.2)  # equal to the threshold is not above it
    assert is_congested(1.0, 0.0, 1.2)  # nothing processed while input arrives
    assert not is_congested(0.0, 0.0, 1.2)  # idle


def test_zero_total_throughput_gives_zero_etp() -> None:
    topology, _ = figure2()
    etp = etp_map(topology, dict.fromkeys(topology.order, 0.0), frozenset())
    assert set(etp.values()) == {0.0}


def test_etp_sums_add_executor_etps_per_node() -> None:
    sums = etp_sums({"a": 0.5, "b": 0.25}, {"n0": ["a#0", "a#1"], "n1": ["b#0"], "n2": []})
    assert sums == {"n0": 1.0, "n1": 0.25, "n2": 0}


def test_congested_vertices_from_rates() -> None:
    topology, snap = figure2()
    inputs = {v: m.input_rate or 0.0 for v, m in snap.vertices.items()}
    processing = {v: m.processing_rate for v, m in snap.vertices.items()}
    assert congested_vertices(topology, inputs, processing, 1.2) == {f"v{i}" for i in FIG2_CONGESTED}
    assert congested_vertices(topology, inputs, processing, 2.5) == frozenset()
