"""Manifest validation: every rule names the field and the fix."""

from __future__ import annotations

import math

import pytest

from elastream.core.topology import TopologyError, parse_cpu, parse_manifest, parse_quantity
from elastream.crd import check_manifest, load_manifest
from support.manifests import edge, manifest, sink, src, work


def valid() -> dict:
    return manifest(
        [src("spout", 2, rate=100), work("parse", 2, costMs=1), sink("out")],
        [edge("spout", "parse"), edge("parse", "out", "fields", key="user")],
    )


def problems(doc: dict) -> list[str]:
    """What a command reading the manifest reports: the CRD's CEL rules, then the parser (the cross-field rules,
    such as parallelism within maxParallelism, are written once, in the CRD)."""
    with pytest.raises(TopologyError) as info:
        check_manifest(doc)
    return info.value.problems


def test_valid_manifest_builds_a_dag_in_topological_order() -> None:
    topology = parse_manifest(valid())
    assert topology.order == ("spout", "parse", "out")
    assert topology.sources == ("spout",) and topology.sinks == ("out",)
    assert topology.stream("parse", "out").key == "user"
    assert topology.executors == 5
    assert topology.redis_prefix == "elastream:{default/t}:"  # the braces: one hash tag per topology


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
            "at least 0",
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
    into_a_source = manifest([src("a"), src("b"), work("c")], [edge("a", "c"), edge("c", "b")])
    found = problems(into_a_source)
    assert any("source 'b' has incoming streams" in p for p in found)
    assert any("no sink" in p for p in found)
    assert any("has no outgoing stream" in p for p in found)


def test_all_problems_are_reported_at_once() -> None:
    doc = valid()
    doc["spec"]["nodes"] = 0
    doc["spec"]["vertices"][1]["stateful"] = "yes"
    assert [p.split(":")[0] for p in problems(doc)] == ["spec.nodes", "spec.vertices[1].stateful"]
    doc = valid()  # the parser's own, in one go too
    doc["spec"]["streams"] += [edge("out", "nowhere"), edge("parse", "parse")]
    assert [p.split(":")[0] for p in problems(doc)] == ["spec.streams[2].to", "spec.streams[3]"]


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


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512Mi", 512 * 2**20),
        ("2Gi", 2 * 2**30),
        ("1.5Ki", 1536),
        ("+1k", 1000),
        ("1G", 1e9),
        ("1e9", 1e9),
        ("1E3", 1000),
        (".5", 0.5),
        ("5.", 5),
        ("500m", 0.5),
        ("-1Gi", -(2**30)),
        ("-0", 0),
        (1073741824, 2**30),
        ("1e999999999", math.inf),
        ("9" * 400, math.inf),
        (10**400, math.inf),
    ],
)
def test_memory_quantities(text: object, value: float) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["1e2.5", "Gi", "1 Gi", " 1Gi", "1Gib", "1\n", "", "2 cores", True, None, [1]])
def test_what_is_not_a_quantity(text: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_an_absurd_exponent_is_refused_at_once() -> None:
    # 1e(a million digits) is never computed: refused as above the bound, within the parser's time
    huge = valid()
    huge["spec"]["resources"] = {"limits": {"memory": "1e" + "9" * 1_000_000}}
    with pytest.raises(TopologyError, match=r"^spec.resources.limits.memory: '1e9999.*' is above 64Ti"):
        parse_manifest(huge)


def test_quantities_that_fit_a_worker_pass() -> None:
    doc = valid()
    doc["spec"]["resources"] = {
        "requests": {"cpu": 0, "memory": 0},
        "limits": {"cpu": "1m", "memory": "16Mi"},
    }
    assert parse_manifest(doc).node_cpu == 0.001
    doc["spec"]["resources"] = {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"cpu": 2, "memory": 2 * 2**30}}
    assert check_manifest(doc).node_cpu == 2.0


def test_unknown_builtin_and_bad_module_are_named() -> None:
    doc = manifest([src("s"), {"name": "w", "logic": {"builtin": "wrk"}}, sink("o")], [edge("s", "w"), edge("w", "o")])
    with pytest.raises(TopologyError, match=r"spec.vertices\[1\].logic.builtin: 'wrk' is unknown; use one of: work"):
        check_manifest(doc)
    doc = manifest(
        [src("s"), {"name": "w", "logic": {"module": "no-colon"}}, sink("o")], [edge("s", "w"), edge("w", "o")]
    )
    with pytest.raises(TopologyError, match=r"logic.module: 'no-colon' is not 'package.module:Class'"):
        check_manifest(doc)


def chain() -> dict:
    """spout -> parse -> enrich -> out, each vertex the only way to the next (mistakes would cascade)."""
    return manifest(
        [src("spout", 2, rate=100), work("parse", 2, costMs=1), work("enrich"), sink("out")],
        [edge("spout", "parse"), edge("parse", "enrich", "fields", key="user"), edge("enrich", "out")],
    )


def _vertices(d: dict) -> list:
    return d["spec"]["vertices"]


def _streams(d: dict) -> list:
    return d["spec"]["streams"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: _vertices(d)[1].__setitem__("parallelism", 0), "spec.vertices[1].parallelism: 0 is below 1"),
        (lambda d: _vertices(d)[0].__setitem__("parallelism", 0), "spec.vertices[0].parallelism: 0 is below 1"),
        (lambda d: _vertices(d)[3].__setitem__("parallelism", "two"), "spec.vertices[3].parallelism: 'two'"),
        (
            lambda d: _vertices(d)[2].update(parallelism=9, maxParallelism=4),
            "spec.vertices[2].parallelism: parallelism exceeds maxParallelism (the vertex's key groups)",
        ),
        (lambda d: _vertices(d)[2]["logic"].__setitem__("costMs", -1), "spec.vertices[2].logic.costMs: -1"),
        (
            lambda d: _vertices(d)[1].__setitem__("logic", "work"),
            "spec.vertices[1].logic: 'work' is not a mapping",
        ),
        (lambda d: _vertices(d)[1]["logic"].__setitem__("builtin", "wrk"), "spec.vertices[1].logic.builtin: 'wrk'"),
        (lambda d: _vertices(d)[2].__setitem__("stateful", "yes"), "spec.vertices[2].stateful: 'yes'"),
        (lambda d: _vertices(d)[3].__setitem__("logic", {"builtin": "work"}), "spec.vertices[3]: one block per vertex"),
        (lambda d: _vertices(d)[0].__setitem__("logic", {"builtin": "work"}), "spec.vertices[0]: one block per vertex"),
        (
            lambda d: _vertices(d)[3].pop("sink"),
            "spec.vertices[3]: one block per vertex: a vertex has",
        ),
        (lambda d: _vertices(d)[2].pop("name"), "spec.vertices[2].name: is missing"),
        (
            lambda d: (
                _vertices(d)[1].__setitem__("name", "Parse"),
                _streams(d)[0].__setitem__("to", "Parse"),
                _streams(d)[1].__setitem__("from", "Parse"),
            ),
            "spec.vertices[1].name: 'Parse' is not a DNS-1123 label",
        ),
        (
            lambda d: _streams(d)[1].__setitem__("grouping", "hash"),
            "spec.streams[1].grouping: 'hash' is unknown",
        ),
        (lambda d: _streams(d)[1].pop("key"), "spec.streams[1].key: fields grouping needs a key"),
        (
            lambda d: _streams(d)[0].__setitem__("balance", "fastest"),
            "spec.streams[0].balance: 'fastest' is unknown",
        ),
        (lambda d: _streams(d)[1].__setitem__("balance", "round-robin"), "spec.streams[1].balance: only a shuffle"),
        (lambda d: _streams(d)[2].pop("from"), "spec.streams[2].from: is missing; add it"),
        (lambda d: _streams(d)[2].__setitem__("to", "otu"), "spec.streams[2].to: unknown vertex 'otu'"),
        (lambda d: _streams(d)[0].__setitem__("from", "sput"), "spec.streams[0].from: unknown vertex 'sput'"),
        (
            lambda d: _streams(d).__setitem__(1, ["parse", "enrich"]),
            "spec.streams[1]: ['parse', 'enrich'] is not",
        ),
        (
            lambda d: d["spec"].__setitem__("resources", {"limits": ["cpu", "2"]}),
            "spec.resources.limits: ['cpu', '2'] is not a mapping",
        ),
        (lambda d: d.__setitem__("metadata", ["t"]), "metadata: ['t'] is not a mapping"),
        (lambda d: d["spec"].pop("vertices"), "spec.vertices: is missing; add it"),
    ],
)
def test_one_mistake_is_one_problem(mutate, expected: str) -> None:
    """A vertex with a field error stays as a placeholder and a stream with a bad grouping stays as an edge,
    so nothing downstream reports "unknown vertex", "unreachable", "no outgoing stream" or "no source"."""
    doc = chain()
    mutate(doc)
    found = problems(doc)
    assert len(found) == 1, found
    assert found[0].startswith(expected), found


def test_structural_problems_use_the_manifest_index_after_a_duplicate() -> None:
    doc = chain()
    _vertices(doc).insert(1, work("spout"))  # spec.vertices[1] is a duplicate and is dropped
    _vertices(doc).append(work("lonely"))  # spec.vertices[5], the 5th vertex that is kept
    assert problems(doc) == [
        "spec.vertices[1].name: duplicate vertex 'spout' (also spec.vertices[0]); give every vertex a unique name",
        "spec.vertices[5]: vertex 'lonely' is unreachable from every source; add a stream into it or remove it",
    ]


def test_two_mistakes_are_two_problems() -> None:
    doc = chain()
    _vertices(doc)[1]["parallelism"] = 0
    _streams(doc)[2]["grouping"] = "hash"
    found = problems(doc)
    assert [p.split(":")[0] for p in found] == ["spec.streams[2].grouping", "spec.vertices[1].parallelism"]


def test_a_real_structural_problem_is_still_found_next_to_a_placeholder() -> None:
    doc = chain()
    _vertices(doc)[2]["logic"] = {"costMs": 1}  # names no code: a placeholder that keeps its streams
    _vertices(doc).append(sink("orphan"))
    found = problems(doc)
    assert [p.split(":")[0] for p in found] == ["spec.vertices[2].logic", "spec.vertices[4]"]
    assert "'orphan' is unreachable" in found[1]


def test_the_crds_problems_come_alone_and_a_list_rule_is_named_at_its_entry() -> None:
    # a document the CRD refuses is not judged by the parser too (its lines could only echo the CRD's)...
    doc = chain()
    _vertices(doc)[2]["parallelism"] = 0
    _vertices(doc).append(sink("orphan"))
    assert problems(doc) == ["spec.vertices[2].parallelism: 0 is below 1; set it to at least 1"]
    # ...but a CEL rule about the whole stream list gives way to the parser's line naming the entry
    doc = chain()
    _streams(doc)[2]["to"] = "otu"
    assert problems(doc) == ["spec.streams[2].to: unknown vertex 'otu'; use one of: spout, parse, enrich, out"]


def test_non_utf8_manifest_is_one_problem(tmp_path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("metadata: {name: caf\xe9}\n".encode("latin-1"))
    with pytest.raises(TopologyError, match=r"is not UTF-8 .*; save the manifest as UTF-8") as info:
        load_manifest(str(path))
    assert len(info.value.problems) == 1


def test_sink_delivery_is_checked() -> None:
    good = manifest(
        [src("s"), {"name": "z", "sink": {"type": "redis-stream", "delivery": "exactly-once"}}], [edge("s", "z")]
    )
    assert parse_manifest(good).vertices["z"].config["delivery"] == "exactly-once"
    bad = manifest([src("s"), {"name": "z", "sink": {"type": "redis-stream", "delivery": "twice"}}], [edge("s", "z")])
    with pytest.raises(TopologyError) as err:
        check_manifest(bad)
    assert "spec.vertices[1].sink.delivery: 'twice' is unknown; use one of: at-least-once, exactly-once" in str(
        err.value
    )
    wrong = manifest([src("s"), {"name": "z", "sink": {"type": "null", "delivery": "exactly-once"}}], [edge("s", "z")])
    with pytest.raises(TopologyError, match="only a redis-stream, kafka or user \\(module\\) sink has a delivery mode"):
        check_manifest(wrong)


def test_spec_suspend_is_a_boolean_off_by_default() -> None:
    document = manifest([src("s", 1), sink("z", 1)], [edge("s", "z")])
    assert parse_manifest(document).suspend is False
    document["spec"]["suspend"] = True
    assert parse_manifest(document).suspend is True
    document["spec"]["suspend"] = None  # a merge patch's null: not suspended
    assert parse_manifest(document).suspend is False
    document["spec"]["suspend"] = "yes"
    assert problems(document) == ["spec.suspend: 'yes' is not true/false; set true or false"]
