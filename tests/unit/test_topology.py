"""Manifest validation: every rule names the field and the fix."""

from __future__ import annotations

import pytest

from elastream.core.topology import TopologyError, load_manifest, parse_cpu, parse_manifest
from helpers import edge, manifest, sink, src, work


def valid() -> dict:
    return manifest(
        [src("spout", 2, rate=100), work("parse", 2, costMs=1), sink("out")],
        [edge("spout", "parse"), edge("parse", "out", "fields", key="user")],
    )


def problems(doc: dict) -> list[str]:
    with pytest.raises(TopologyError) as info:
        parse_manifest(doc)
    return info.value.problems


def test_valid_manifest_builds_a_dag_in_topological_order() -> None:
    topology = parse_manifest(valid())
    assert topology.order == ("spout", "parse", "out")
    assert topology.sources == ("spout",) and topology.sinks == ("out",)
    assert topology.stream("parse", "out").key == "user"
    assert topology.executors == 5
    assert topology.redis_prefix == "elastream:default/t:"


def test_cycle_is_named() -> None:
    doc = manifest(
        [src("s"), work("a"), work("b"), sink("z")],
        [edge("s", "a"), edge("a", "b"), edge("b", "a"), edge("b", "z")],
    )
    (problem,) = problems(doc)
    assert problem.startswith("spec.streams: cycle")
    assert "a -> b -> a" in problem or "b -> a -> b" in problem


@pytest.mark.parametrize(
    ("mutate", "field", "hint"),
    [
        (
            lambda d: d["spec"]["streams"].append(edge("parse", "ghost")),
            "spec.streams[2].to",
            "unknown vertex",
        ),
        (lambda d: d["spec"]["vertices"].append(work("parse")), "spec.vertices[3].name", "duplicate"),
        (
            lambda d: d["spec"]["streams"].__setitem__(0, edge("spout", "parse", "hash")),
            "spec.streams[0].grouping",
            "shuffle, fields, all, global",
        ),
        (
            lambda d: d["spec"]["streams"].__setitem__(0, edge("spout", "parse", "fields")),
            "spec.streams[0].key",
            "needs a key",
        ),
        (
            lambda d: d["spec"]["vertices"][1].__setitem__("parallelism", 0),
            "spec.vertices[1].parallelism",
            "at least 1",
        ),
        (
            lambda d: d["spec"]["vertices"][1].update(parallelism=9, maxParallelism=4),
            "spec.vertices[1].parallelism",
            "maxParallelism",
        ),
        (lambda d: d["spec"].__setitem__("nodes", 0), "spec.nodes", "at least 1"),
        (
            lambda d: d["spec"].__setitem__("slotsPerNode", 2),
            "spec.slotsPerNode",
            "raise spec.slotsPerNode to 3",
        ),
        (lambda d: d["spec"]["vertices"].append(work("lonely")), "spec.vertices[3]", "unreachable"),
        (
            lambda d: d["spec"]["scaling"] if False else d["spec"].__setitem__("scaling", {"strategy": "magic"}),
            "spec.scaling.strategy",
            "stela",
        ),
        (
            lambda d: d["spec"].__setitem__("resources", {"limits": {"cpu": "lots"}}),
            "spec.resources.limits.cpu",
            "500m",
        ),
        (
            lambda d: d["spec"]["vertices"][1]["logic"].__setitem__("costMs", -1),
            "spec.vertices[1].logic.costMs",
            "number",
        ),
    ],
)
def test_each_rule_names_field_and_fix(mutate, field: str, hint: str) -> None:
    doc = valid()
    mutate(doc)
    found = problems(doc)
    assert any(p.startswith(field + ":") and hint in p for p in found), found


def test_no_source_and_no_sink() -> None:
    doc = manifest([work("a"), work("b")], [edge("a", "b")])
    found = problems(doc)
    assert any("no source" in p for p in found)
    only_sources = manifest([src("a"), src("b")], [])
    found = problems(only_sources)
    assert any("no sink" in p for p in found)
    assert any("has no outgoing stream" in p for p in found)


def test_all_problems_are_reported_at_once() -> None:
    doc = valid()
    doc["spec"]["nodes"] = 0
    doc["spec"]["streams"].append(edge("out", "nowhere"))
    assert len(problems(doc)) >= 2


def test_load_manifest_reports_unreadable_and_bad_yaml(tmp_path) -> None:
    with pytest.raises(TopologyError, match="cannot read"):
        load_manifest(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_manifest(str(bad))
    empty = tmp_path / "empty.yaml"
    empty.write_text("kind: ConfigMap\n")
    with pytest.raises(TopologyError, match="exactly one StreamTopology"):
        load_manifest(str(empty))


def test_cpu_quantities() -> None:
    assert parse_cpu("500m") == 0.5
    assert parse_cpu("2") == 2.0
    assert parse_cpu(1.5) == 1.5
    with pytest.raises(ValueError):
        parse_cpu("two")


def test_unknown_builtin_and_bad_module_are_named() -> None:
    doc = manifest([src("s"), {"name": "w", "logic": {"builtin": "wrk"}}, sink("o")], [edge("s", "w"), edge("w", "o")])
    with pytest.raises(TopologyError, match=r"spec.vertices\[1\].logic.builtin: 'wrk' is unknown; use one of: work"):
        parse_manifest(doc)
    doc = manifest(
        [src("s"), {"name": "w", "logic": {"module": "no-colon"}}, sink("o")], [edge("s", "w"), edge("w", "o")]
    )
    with pytest.raises(TopologyError, match=r"logic.module: 'no-colon' is not 'package.module:Class'"):
        parse_manifest(doc)
