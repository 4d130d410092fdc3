"""The StreamTopology CRD: one file (the chart's and the package's are symlinks to it), a schema every example
passes and bad manifests fail, CEL rules that compile and catch what they say, defaults and enums that agree
with the parser, and `elastream validate` reporting schema and rule problems in one line each.

The schema is checked with `jsonschema` after `elastream.crd.to_json_schema` maps the few OpenAPI
keywords that differ; the CEL rules (`x-kubernetes-validations`) run in the `cel` library (`elastream.crd.cel`),
from the CRD's own text: no rule is repeated here. (kube-apiserver 1.34 accepted this CRD, all the examples,
and rejected each bad case below with the rule's message.)
"""

from __future__ import annotations

import copy
import glob
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, get_args

import jsonschema
import pytest
import yaml

from elastream.cli import main
from elastream.core import rates, savepoint_rules, status, topology
from elastream.core.topology.limits import MigrationProtocol, MigrationScope
from elastream.crd import (
    all_rules,
    cel_problems,
    check_manifest,
    compiled,
    crd_text,
    json_schema,
    merge_problems,
    openapi_schema,
    schema_problems,
    to_json_schema,
)
from support.paths import EXAMPLES, REPO

CRD_PATHS = {
    "crds": os.path.join(REPO, "crds", "streamtopology.yaml"),
    "chart": os.path.join(REPO, "charts", "elastream", "crds", "streamtopology.yaml"),
    "package": os.path.join(REPO, "operator", "src", "elastream", "crd", "streamtopology.yaml"),
}
MANIFESTS = sorted(glob.glob(os.path.join(EXAMPLES, "*.yaml")))


def load(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return load(CRD_PATHS["crds"])


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return openapi_schema()


def spec_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    return schema["properties"]["spec"]


def vertex_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    return spec_schema(schema)["properties"]["vertices"]["items"]


# ---------------------------------------------------------------------------------------------------------
# one file: the chart's and the package's CRD resolve to crds/streamtopology.yaml


@pytest.mark.parametrize("where", ["chart", "package"])
def test_the_derived_crds_are_symlinks_to_the_one_file(where: str) -> None:
    path = CRD_PATHS[where]
    assert os.path.islink(path), f"{path} must be a relative symlink to crds/streamtopology.yaml, not a copy"
    assert not os.path.isabs(os.readlink(path)), "a relative link: it must resolve in a checkout and an image"
    assert os.path.realpath(path) == os.path.realpath(CRD_PATHS["crds"])


def test_the_package_ships_the_crd() -> None:
    with open(CRD_PATHS["crds"], encoding="utf-8") as handle:
        assert crd_text() == handle.read()


def test_the_image_build_context_holds_the_crd_the_package_links_to() -> None:
    # the images COPY operator/src (symlinks stay symlinks) and pip-install it: the link's target must be in
    # the build context (.dockerignore) and copied to where the link points before the package is installed
    with open(os.path.join(REPO, ".dockerignore"), encoding="utf-8") as handle:
        assert "!crds/streamtopology.yaml" in handle.read().splitlines()
    link = CRD_PATHS["package"]
    target = os.path.normpath(os.path.join("/src/operator/src/elastream/crd", os.readlink(link)))
    assert target == "/src/crds/streamtopology.yaml"
    for dockerfile in glob.glob(os.path.join(REPO, "images", "*", "Dockerfile")):
        with open(dockerfile, encoding="utf-8") as handle:
            lines = [line.strip() for line in handle]
        for i, line in enumerate(lines):
            if line == "COPY operator/src /src/operator/src":
                assert lines[i - 1] == f"COPY crds/streamtopology.yaml {target}", dockerfile


# ---------------------------------------------------------------------------------------------------------
# the resource's shape


def test_names_scope_and_version(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "streamtopologies.elastream.dev"
    spec = crd["spec"]
    assert spec["group"] == "elastream.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "StreamTopology" == topology.KIND
    assert spec["names"]["plural"] == "streamtopologies"
    assert spec["names"]["singular"] == "streamtopology"
    assert spec["names"]["shortNames"] == ["topo"]
    [version] = spec["versions"]
    assert f"{spec['group']}/{version['name']}" == topology.API_VERSION
    assert version["served"] is True and version["storage"] is True


def test_subresources_and_printer_columns(crd: dict[str, Any]) -> None:
    [version] = crd["spec"]["versions"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.nodes",
            "statusReplicasPath": ".status.nodes",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Nodes": ("integer", ".spec.nodes"),
        "Ready": ("integer", ".status.readyNodes"),
        "Phase": ("string", ".status.phase"),
        "Throughput": ("number", ".status.throughput"),
        "Last Scaling": ("string", ".status.lastScalingSummary"),
        "Age": ("date", ".metadata.creationTimestamp"),
    }
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for _, path in columns.values():
        root, field = path.split(".")[1:3]
        if root == "status":
            assert field in status, f"printer column {path} is not a documented status field"


def test_the_status_phases_are_the_operators(crd: dict[str, Any]) -> None:
    from elastream.core.status import PHASES

    [version] = crd["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert tuple(status["phase"]["enum"]) == PHASES
    phase_column = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Phase")
    assert all(p in phase_column["description"] for p in PHASES)


def walk(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema node with its field path (list items as [], map values as {})."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), Mapping):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_every_field_has_a_description(schema: dict[str, Any]) -> None:
    # The API server refuses a description on metadata itself (only metadata.name may be restricted).
    missing = [path or "<root>" for path, node in walk(schema) if "description" not in node and path != "metadata"]
    assert missing == []


def test_the_schema_is_structural(schema: dict[str, Any]) -> None:
    # Every node has a type, except int-or-string quantities; no value validation under a missing type.
    untyped = [
        path
        for path, node in walk(schema)
        if "type" not in node and not node.get("x-kubernetes-int-or-string") and path != ""
    ]
    assert untyped == []
    assert schema["type"] == "object"


def test_lists_and_strings_that_cel_reads_are_bounded(schema: dict[str, Any]) -> None:
    spec = spec_schema(schema)["properties"]
    assert spec["vertices"]["maxItems"] <= 128 and spec["streams"]["maxItems"] <= 512
    assert spec["vertices"]["items"]["properties"]["name"]["maxLength"] == 63
    for end in ("from", "to", "key"):
        assert "maxLength" in spec["streams"]["items"]["properties"][end]


def test_a_stream_name_has_the_parsers_pattern_in_the_crd(schema: dict[str, Any], demo: dict[str, Any]) -> None:
    import copy
    import re

    from elastream.core.topology import TopologyError

    vertex = spec_schema(schema)["properties"]["vertices"]["items"]["properties"]
    patterns = {vertex[kind]["properties"]["stream"]["pattern"] for kind in ("source", "sink")}
    assert len(patterns) == 1  # one rule for a stream's name, whichever end it is
    (pattern,) = patterns
    for name, ok in (("out", True), ("a.b:c_d-e", True), ("elastream:{prod/payments}:sink:out", False), ("*", False)):
        assert bool(re.fullmatch(pattern, name)) is ok  # the API server's (ECMA) reading is the same
        doc = copy.deepcopy(demo)
        sink = next(v for v in doc["spec"]["vertices"] if "sink" in v)
        sink["sink"]["stream"] = name
        if ok:
            check_manifest(doc)
        else:
            with pytest.raises(TopologyError):
                check_manifest(doc)


def crd_maxima(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Every maximum of the spec by its field path (list items as [])."""
    return {f"spec.{path}": node["maximum"] for path, node in walk(spec_schema(schema)) if "maximum" in node}


def test_the_bounds_the_code_needs_are_the_crds(schema: dict[str, Any]) -> None:
    # the CRD holds every maximum; the few the code reads itself are the same numbers
    maxima = crd_maxima(schema)
    assert maxima["spec.nodes"] == maxima["spec.scaling.auto.maxNodes"] == topology.MAX_NODES
    assert maxima["spec.vertices[].source.steps[].rate"] == maxima["spec.vertices[].source.rate"] == rates.MAX_RATE
    assert maxima["spec.vertices[].source.steps[].seconds"] == rates.MAX_STEP_SECONDS
    items = {path: node["maxItems"] for path, node in walk(spec_schema(schema)) if "maxItems" in node}
    assert items["vertices[].source.steps"] == rates.MAX_STEPS


def test_one_above_each_crd_maximum_is_refused_naming_the_field(schema: dict[str, Any], demo: dict[str, Any]) -> None:
    # the other direction: one above a CRD maximum, a manifest the API server has not seen is refused too
    where = {
        "spec.nodes": lambda s, v: s.update(nodes=v),
        "spec.slotsPerNode": lambda s, v: s.update(slotsPerNode=v),
        "spec.vertices[].parallelism": lambda s, v: s["vertices"][1].update(parallelism=v, maxParallelism=v),
        "spec.scaling.window": lambda s, v: s["scaling"].update(window=v),
        "spec.scaling.auto.maxNodes": lambda s, v: s["scaling"].update(auto={"maxNodes": v}),
        "spec.vertices[].source.rate": lambda s, v: s["vertices"][0]["source"].update(rate=v),
    }
    for path, change in where.items():
        maximum = crd_maxima(schema)[path]
        with pytest.raises(topology.TopologyError) as info:
            check_manifest(mutated(demo, lambda s, c=change, m=maximum: c(s, m + 1)))
        field = path.replace("[]", "[1]" if "parallelism" in path else "[0]")
        assert any(p.startswith(f"{field}: {maximum + 1} is above {maximum}") for p in info.value.problems), (
            path,
            info.value.problems,
        )


def defaults(schema: Mapping[str, Any]) -> dict[str, Any]:
    """field path -> default, for every field that has one."""
    return {path: node["default"] for path, node in walk(schema) if "default" in node}


def test_defaults_are_the_parsers(schema: dict[str, Any]) -> None:
    found = defaults(schema)
    scaling = topology.ScalingSpec()
    assert "default" not in spec_schema(schema)["properties"]["nodes"]
    # spec.nodes may be left out (the parser's `default_nodes`: the autoscaler's minimum, else 1), and has no
    # default in the CRD: a default would be written into the object, which a GitOps tool then fights over
    assert "nodes" not in spec_schema(schema)["required"]
    assert found == {
        "spec.slotsPerNode": topology.DEFAULT_SLOTS_PER_NODE,
        "spec.suspend": False,
        "spec.deletionPolicy": savepoint_rules.DEFAULT_DELETION_POLICY,
        "spec.spreadOverNodes": False,
        "spec.vertices[].parallelism": 1,
        "spec.vertices[].maxParallelism": topology.DEFAULT_MAX_PARALLELISM,
        "spec.vertices[].stateful": False,
        "spec.streams[].grouping": "shuffle",
        "spec.scaling": {},
        "spec.scaling.strategy": scaling.strategy,
        "spec.scaling.migration": scaling.migration,
        "spec.scaling.migrationScope": scaling.migration_scope,
        "spec.scaling.congestionRate": scaling.congestion_rate,
        "spec.scaling.window": scaling.window,
        "spec.scaling.checkpointIntervalSeconds": scaling.checkpoint_interval_s,
        "spec.scaling.auto": {},
        "spec.scaling.auto.enabled": scaling.auto.enabled,
        "spec.scaling.auto.minNodes": scaling.auto.min_nodes,
        "spec.scaling.auto.maxNodes": scaling.auto.max_nodes,
        "spec.scaling.auto.policy": scaling.auto.policy,
        "spec.scaling.auto.combine": scaling.auto.combine,
        "spec.scaling.auto.stabilizationSeconds": scaling.auto.stabilization_s,
        "spec.scaling.auto.execute": scaling.auto.execute,
        "spec.scaling.auto.thresholds": {},
        "spec.scaling.auto.thresholds.thetaMin": scaling.auto.theta_min,
        "spec.scaling.auto.thresholds.thetaMax": scaling.auto.theta_max,
        "spec.scaling.auto.thresholds.capacity": scaling.auto.capacity_threshold,
        "spec.scaling.auto.thresholds.high": scaling.auto.high_threshold,
        "spec.scaling.auto.thresholds.low": scaling.auto.low_threshold,
    }


def test_the_crds_enums_are_what_the_code_implements(schema: dict[str, Any]) -> None:
    # an enum is written once, in the CRD; where the code has a registry or a type of the same names, they agree
    # (modes, deliveries, balances and combine are compared as strings where they are used)
    from elastream.runtime.operators.builtin import LOGIC_BUILTINS

    enums = {path: tuple(node["enum"]) for path, node in walk(schema) if "enum" in node}
    vertex = "spec.vertices[]"
    assert set(enums[f"{vertex}.logic.builtin"]) == set(LOGIC_BUILTINS)
    assert enums[f"{vertex}.source.profile"] == tuple(rates.PRESETS)
    assert enums["spec.streams[].grouping"] == get_args(topology.Grouping)
    assert enums["spec.scaling.strategy"] == topology.STRATEGIES
    assert enums["spec.scaling.migration"] == get_args(MigrationProtocol)
    assert enums["spec.scaling.migrationScope"] == get_args(MigrationScope)
    assert enums["spec.deletionPolicy"] == savepoint_rules.DELETION_POLICIES
    assert enums["status.phase"] == status.PHASES


def test_operator_blocks_keep_their_own_keys_and_type_the_known_ones(schema: dict[str, Any]) -> None:
    blocks = vertex_schema(schema)["properties"]
    for kind in ("source", "logic", "sink"):
        assert blocks[kind]["x-kubernetes-preserve-unknown-fields"] is True
        assert blocks[kind]["properties"]["costMs"] == {
            "description": blocks[kind]["properties"]["costMs"]["description"],
            "type": "number",
            "minimum": 0,
            "maximum": 60_000,
        }
    assert schema["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True


def test_the_structural_keywords_are_mapped_and_the_rest_kept_as_written() -> None:
    node = {
        "type": "object",
        "x-kubernetes-validations": [{"rule": "true", "message": "m: n"}],
        "properties": {
            "q": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
            "n": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": False},
            "s": {"type": "string", "nullable": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"a": {}}},
        },
    }
    mapped = to_json_schema(node)
    assert mapped["x-kubernetes-validations"] == node["x-kubernetes-validations"]  # ignored by jsonschema
    assert mapped["additionalProperties"] is False and "additionalProperties" not in mapped["properties"]["free"]
    assert mapped["properties"]["q"] == {"x-kubernetes-int-or-string": True, "type": ["integer", "string"]}
    assert mapped["properties"]["n"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 5}
    assert mapped["properties"]["s"]["type"] == ["string", "null"]
    validator = jsonschema.Draft202012Validator(mapped)
    assert validator.is_valid({"q": "2", "n": 5, "s": None, "free": {"b": 1}})
    assert not validator.is_valid({"n": 0}) and not validator.is_valid({"q": 1.5}) and not validator.is_valid({"x": 1})


# ---------------------------------------------------------------------------------------------------------
# CEL rules, run from the CRD's text


def crd_rules(schema: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["rule"]: rule for _, node in walk(schema) for rule in node.get("x-kubernetes-validations", [])}


def test_every_cel_rule_compiles(schema: dict[str, Any]) -> None:
    rules = all_rules(schema)
    assert len(rules) == len(crd_rules(schema)) == 11
    for rule in rules:
        compiled(rule.text)  # raises RuleError naming the rule when the CEL library cannot compile it
        # no messageExpression: kube-apiserver 1.34 estimated each one this CRD had (values turned into strings)
        # as over its CEL cost budget and refused the whole CRD; the e2e tier's helm install is the real judge
        assert not rule.message_expression, rule.text
        # the message says what is wrong, then the fix: "<what>: <why or fix>" or "<what>; <fix>"
        assert (": " in rule.message or "; " in rule.message) and len(rule.message) > 20


def cel_violations(document: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """The messages of the CEL rules `document` breaks (defaults applied), each prefixed with its field."""
    return cel_problems(document, schema)


# ---------------------------------------------------------------------------------------------------------
# the examples pass, bad manifests fail


@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_every_example_passes_the_schema_and_the_rules(path: str, schema: dict[str, Any]) -> None:
    document = load(path)
    jsonschema.Draft202012Validator(json_schema()).validate(document)
    assert schema_problems(document) == []
    assert cel_violations(document, schema) == []
    topology.parse_manifest(document)  # and the parser agrees


def test_there_are_examples() -> None:
    assert len(MANIFESTS) >= 10


@pytest.fixture
def demo() -> dict[str, Any]:
    return load(os.path.join(EXAMPLES, "demo.yaml"))


def mutated(document: dict[str, Any], change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    document = copy.deepcopy(document)
    change(document["spec"])
    return document


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda s: s["streams"][0].update(grouping="hash"),
            "spec.streams[0].grouping: 'hash' is unknown; use one of: shuffle, fields, all, global",
        ),
        (lambda s: s.update(nodes=0), "spec.nodes: 0 is below 1; set it to at least 1"),
        (
            lambda s: s["vertices"][2].update(parallelism="x"),
            "spec.vertices[2].parallelism: 'x' is not an integer; set it to an integer in [1, 4096]",
        ),
        (lambda s: s.pop("vertices"), "spec.vertices: is missing; add it"),
        (lambda s: s.update(slotsPerNode=0), "spec.slotsPerNode: 0 is below 1"),
        (lambda s: s["vertices"][1].update(maxParallelism=0), "spec.vertices[1].maxParallelism: 0 is below 1"),
        (lambda s: s["scaling"].update(congestionRate=0.5), "spec.scaling.congestionRate: 0.5 is below 1"),
        (lambda s: s["scaling"].update(window=1), "spec.scaling.window: 1 is below 2"),
        (
            lambda s: s["scaling"].update(checkpointIntervalSeconds=-1),
            "spec.scaling.checkpointIntervalSeconds: -1 is below 0",
        ),
        (lambda s: s["scaling"].update(strategy="fastest"), "spec.scaling.strategy: 'fastest' is unknown"),
        (lambda s: s["scaling"].update(migration="teleport"), "spec.scaling.migration: 'teleport' is unknown"),
        (lambda s: s["scaling"].update(auto={"policy": "magic"}), "spec.scaling.auto.policy: 'magic' is unknown"),
        (lambda s: s["vertices"][1]["logic"].update(builtin="map"), "spec.vertices[1].logic.builtin: 'map' is unknown"),
        (lambda s: s["vertices"][0]["source"].update(type="pulsar"), "spec.vertices[0].source.type: 'pulsar'"),
        (
            lambda s: s["vertices"][0].update(source={"type": "kafka", "topic": "a b", "bootstrapServers": "k:9092"}),
            "spec.vertices[0].source.topic: 'a b'",
        ),
        (lambda s: s["vertices"][4]["sink"].update(type="s3"), "spec.vertices[4].sink.type: 's3' is unknown"),
        (lambda s: s["vertices"][1]["logic"].update(costMs=-1), "spec.vertices[1].logic.costMs: -1 is below 0"),
        (lambda s: s["vertices"][1].update(name="Parse_1"), "spec.vertices[1].name: 'Parse_1' is not a DNS-1123 label"),
        (
            lambda s: s["vertices"][1].update(paralellism=3),
            "spec.vertices[1].paralellism: unknown field; remove it or fix its name",
        ),
        (
            lambda s: s["vertices"][1].update(stateful="yes"),
            "spec.vertices[1].stateful: 'yes' is not true/false; set true or false",
        ),
        (lambda s: s.update(suspend="yes"), "spec.suspend: 'yes' is not true/false"),
        (lambda s: s.update(vertices=[]), "spec.vertices: has 0 items; give at least 1"),
        (
            lambda s: s["resources"]["limits"].update(cpu=1.5),
            "spec.resources.limits.cpu: 1.5 is not a CPU quantity; write e.g. '2' or '500m'",
        ),
        (
            lambda s: s["resources"]["limits"].update(cpu="2 cores"),
            "spec.resources.limits.cpu: '2 cores' is not a CPU quantity",
        ),
        (
            lambda s: s["vertices"][0]["source"].update(steps=[{"rate": 1, "seconds": 0}]),
            "spec.vertices[0].source.steps[0].seconds: 0 is not above 0",
        ),
    ],
)
def test_bad_manifests_fail_the_schema_naming_the_field(demo: dict[str, Any], change: Any, expected: str) -> None:
    problems = schema_problems(mutated(demo, change))
    assert len(problems) == 1, problems
    assert problems[0].startswith(expected), problems


def test_the_parser_does_not_repeat_what_the_schema_says(demo: dict[str, Any]) -> None:
    # a rule is written once: a document only the schema refuses is no problem of the parser's own (it builds a
    # model or, where a value breaks it, says the document does not satisfy the CRD), never a line on the field
    for change in (
        lambda s: s["streams"][0].update(grouping="hash"),
        lambda s: s.update(nodes=0),
        lambda s: s["vertices"][2].update(parallelism="x"),
        lambda s: s["scaling"].update(window=1),
        lambda s: s["scaling"].update(congestionRate=0.5),
        lambda s: s["vertices"][1]["logic"].update(builtin="map"),
        lambda s: s.update(suspend="true"),
        lambda s: s["vertices"][1].update(stateful="yes"),
    ):
        document = mutated(demo, change)
        [problem] = schema_problems(document)
        field = problem.split(": ")[0]
        try:
            topology.parse_manifest(document)
        except topology.TopologyError as exc:
            assert not any(line.startswith(f"{field}: ") for line in exc.problems), (problem, exc.problems)
        with pytest.raises(topology.TopologyError) as info:
            check_manifest(document)
        assert info.value.problems == [problem]


#: the CRD's static messages (no messageExpression: the API server estimates one built from values as over its
#: CEL cost budget and refuses the CRD); a field the parser also checks keeps the parser's line, with the values
PARALLELISM_LINE = (
    "spec.vertices[1].parallelism: parallelism exceeds maxParallelism (the vertex's key groups); lower parallelism "
    "or raise maxParallelism"
)
BOUNDS_LINE = "spec.scaling.auto.maxNodes: maxNodes is below minNodes; raise maxNodes to at least minNodes"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda s: s["streams"][0].update({"from": "ghost"}),
            "spec.streams: streams reference vertices: every stream's from",
        ),
        (lambda s: s["streams"][0].update(to="ghost"), "spec.streams: streams reference vertices: every stream's to"),
        (lambda s: s["vertices"][1].update(parallelism=17), PARALLELISM_LINE),
        (
            lambda s: s["vertices"][1].pop("maxParallelism") and s["vertices"][1].update(parallelism=129),
            PARALLELISM_LINE,
        ),
        (lambda s: s["streams"][2].pop("key"), "spec.streams[2].key: fields grouping needs a key"),
        (lambda s: s["streams"][2].update(balance="round-robin"), "spec.streams[2].balance: only a shuffle stream"),
        (lambda s: s["scaling"].update(auto={"minNodes": 5, "maxNodes": 3}), BOUNDS_LINE),
        (lambda s: s["scaling"].update(auto={"minNodes": 21}), BOUNDS_LINE),
        (lambda s: s["vertices"][1].update(sink={"type": "log"}), "spec.vertices[1]: one block per vertex"),
        (lambda s: s["vertices"][1].pop("logic"), "spec.vertices[1]: one block per vertex"),
        (
            lambda s: s["vertices"][0].update(source={"type": "kafka", "topic": "clicks"}),
            "spec.vertices[0].source: a kafka source reads source.topic from source.bootstrapServers; set both",
        ),
        (
            lambda s: s["vertices"][4].update(sink={"type": "kafka", "bootstrapServers": "kafka:9092"}),
            "spec.vertices[4].sink: a kafka sink writes sink.topic to sink.bootstrapServers; set both",
        ),
        (
            lambda s: s.update(podTemplate={"labels": {"example.com/" + "k" * 400: "v"}}),
            "spec.podTemplate.labels: a label key is too long: at most 317 characters",
        ),
        (
            lambda s: s.update(podTemplate={"annotations": {"a" * 318: "v"}}),
            "spec.podTemplate.annotations: an annotation key is too long: at most 317 characters",
        ),
    ],
)
def test_bad_manifests_break_a_cel_rule(
    demo: dict[str, Any], schema: dict[str, Any], change: Any, expected: str
) -> None:
    document = mutated(demo, change)
    assert schema_problems(document) == []  # only the CEL rule catches it
    violations = cel_violations(document, schema)
    assert len(violations) == 1 and violations[0].startswith(expected), violations
    # and so does every command reading a manifest (`run`, `plan`...): one line, on that field or, for a rule
    # about a whole list, on the entry that breaks it (the parser's line, which names the entry and the fix)
    with pytest.raises(topology.TopologyError) as info:
        check_manifest(document)
    field = violations[0].split(": ")[0]
    assert [line.split(": ")[0] for line in info.value.problems] in ([field], [f"{field}[0].from"], [f"{field}[0].to"])


# ---------------------------------------------------------------------------------------------------------
# elastream validate


def test_merge_gives_a_list_rule_to_the_parsers_entries_and_drops_its_echoes() -> None:
    schema = ["spec.image: 5 is not a string; quote it"]
    rules = ["spec.streams: streams reference vertices: every stream's to must name a vertex of spec.vertices"]
    parser = ["spec.streams[2].to: unknown vertex 'otu'; use one of: a, b", "spec.vertices[1]: 'b' is unreachable"]
    assert merge_problems(schema, rules, parser) == [schema[0], parser[0]]
    assert merge_problems([], rules, parser) == [parser[0]]  # its other lines could only echo the rule's mistake
    assert merge_problems([], [], parser) == parser
    assert merge_problems(schema, [], parser) == schema


def validate(tmp_path: Any, document: Any, *options: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(document))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-m", "elastream", "validate", str(path), *options],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_validate_reports_schema_problems_one_line_each(tmp_path: Any, demo: dict[str, Any]) -> None:
    def change(spec: dict[str, Any]) -> None:
        spec["image"] = 5
        spec["vertices"][2]["parallelism"] = "x"
        spec["vertices"][0]["paralellism"] = 2

    proc = validate(tmp_path, mutated(demo, change))
    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert all(line.startswith("error: ") for line in lines), lines
    assert "error: spec.image: 5 is not a string; quote it" in lines
    assert any(line.startswith("error: spec.vertices[0].paralellism: unknown field") for line in lines), lines
    # the schema's line words the type and the range
    assert [line for line in lines if "spec.vertices[2].parallelism" in line] == [
        "error: spec.vertices[2].parallelism: 'x' is not an integer; set it to an integer in [1, 4096]"
    ]


def test_validate_names_a_value_the_parser_cannot_handle_without_a_traceback(
    tmp_path: Any, demo: dict[str, Any]
) -> None:
    proc = validate(tmp_path, mutated(demo, lambda s: s["vertices"][0]["source"].update(profile=["a"])))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    # the schema names it (the parser once tested a list against the presets' dict, a TypeError): one line
    assert proc.stderr.splitlines() == ["error: spec.vertices[0].source.profile: ['a'] is not a string; quote it"], (
        proc.stderr
    )


def test_a_spec_without_nodes_starts_at_the_autoscalers_minimum_or_one(tmp_path: Any, demo: dict[str, Any]) -> None:
    # GitOps manifests of autoscaled topologies leave spec.nodes out (the autoscaler owns it): valid, and the
    # count is the autoscaler's minimum, or 1 without autoscaling
    without = mutated(demo, lambda s: [s.pop("nodes"), s.update(slotsPerNode=12)])
    assert validate(tmp_path, without).returncode == 0
    assert topology.parse_manifest(without).nodes == 1
    autoscaled = mutated(
        without, lambda s: s.setdefault("scaling", {}).update(auto={"enabled": True, "minNodes": 3, "maxNodes": 6})
    )
    assert topology.parse_manifest(autoscaled).nodes == 3
    assert topology.parse_manifest(mutated(autoscaled, lambda s: s.update(nodes=5))).nodes == 5


@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_validate_accepts_every_example(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", path]) == 0
    assert ": valid — topology" in capsys.readouterr().out


def crd_copy(tmp_path: Any, *changes: tuple[str, str]) -> str:
    """A copy of the CRD with pieces of rules' text (or messages) changed, each found exactly once."""
    with open(CRD_PATHS["crds"], encoding="utf-8") as handle:
        text = handle.read()
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / "crd.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


#: the autoscaler rule's message as the CRD writes it
BOUNDS_MESSAGE = 'message: "maxNodes is below minNodes; raise maxNodes to at least minNodes"'


def test_validate_follows_a_changed_cel_rule_in_the_crd(tmp_path: Any, demo: dict[str, Any]) -> None:
    # minNodes == maxNodes: the CRD's rule (<=) accepts it; a CRD whose rule says < refuses it, on the rule's
    # fieldPath with the rule's (changed) message: validate runs the CRD's text, not a twin
    document = mutated(demo, lambda s: s["scaling"].update(auto={"minNodes": 3, "maxNodes": 3}))
    assert validate(tmp_path, document).returncode == 0
    changed = crd_copy(
        tmp_path,
        ("self.minNodes <= self.maxNodes", "self.minNodes < self.maxNodes"),
        (BOUNDS_MESSAGE, 'message: "maxNodes is not above minNodes; raise maxNodes above minNodes"'),
    )
    proc = validate(tmp_path, document, "--crd", changed)
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.splitlines() == [
        "error: spec.scaling.auto.maxNodes: maxNodes is not above minNodes; raise maxNodes above minNodes"
    ]
    # a messageExpression, where a CRD has one, gives the line its values
    expression = "messageExpression: \"string(self.maxNodes) + ' is not above minNodes ' + string(self.minNodes)\""
    changed = crd_copy(
        tmp_path,
        ("self.minNodes <= self.maxNodes", "self.minNodes < self.maxNodes"),
        (BOUNDS_MESSAGE, f"{BOUNDS_MESSAGE}\n{' ' * 26}{expression}"),
    )
    proc = validate(tmp_path, document, "--crd", changed)
    assert proc.stderr.splitlines() == ["error: spec.scaling.auto.maxNodes: 3 is not above minNodes 3"]
    # and the packaged CRD, named explicitly, still accepts it
    assert validate(tmp_path, document, "--crd", CRD_PATHS["crds"]).returncode == 0


def test_validate_names_a_rule_that_does_not_compile(tmp_path: Any, demo: dict[str, Any]) -> None:
    broken = crd_copy(tmp_path, ("self.minNodes <= self.maxNodes", "self.minNodes <="))
    proc = validate(tmp_path, demo, "--crd", broken)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.splitlines()
    assert (
        line.startswith("error: --crd ") and "'!has(self.minNodes) || !has(self.maxNodes) || self.minNodes <='" in line
    )


def test_validate_refuses_a_crd_file_that_is_not_one(tmp_path: Any, demo: dict[str, Any]) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("kind: ConfigMap\n")
    proc = validate(tmp_path, demo, "--crd", str(other))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: --crd {other}: {other}: is not a CustomResourceDefinition; name a CRD file"
    ]


def test_cel_rules_see_the_schemas_defaults(demo: dict[str, Any], schema: dict[str, Any]) -> None:
    # grouping defaults to shuffle (so a stream without one needs no key) and maxParallelism to 128: the rules
    # run on the object the API server stores, not on what was sent
    document = mutated(demo, lambda s: [s["streams"][0].pop("grouping", None), s["vertices"][1].pop("maxParallelism")])
    assert cel_problems(document, schema) == []
    document = mutated(
        demo, lambda s: s["vertices"][1].pop("maxParallelism") and s["vertices"][1].update(parallelism=129)
    )
    assert cel_problems(document, schema) == [PARALLELISM_LINE]


def test_validate_reports_a_broken_rule_beside_a_schema_problem_elsewhere(tmp_path: Any, demo: dict[str, Any]) -> None:
    # a schema problem in spec.image does not hide the autoscaler rule (its node, spec.scaling.auto, is sound),
    # while a rule on a node the schema found a problem under is not run (its values are not the declared types)
    changed = crd_copy(tmp_path, ("self.minNodes <= self.maxNodes", "self.minNodes < self.maxNodes"))
    document = mutated(demo, lambda s: [s.update(image=5), s["scaling"].update(auto={"minNodes": 3, "maxNodes": 3})])
    proc = validate(tmp_path, document, "--crd", changed)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: spec.image: 5 is not a string; quote it",
        f"error: {BOUNDS_LINE}",
    ]
    auto_broken = mutated(demo, lambda s: s["scaling"].update(auto={"minNodes": "3", "maxNodes": 3}))
    assert cel_problems(auto_broken, openapi_schema(), ["spec.scaling.auto.minNodes"]) == []


def test_the_rules_hold_at_the_crds_maxitems() -> None:
    # 128 vertices and 512 streams: the from/to rules are streams × vertices evaluations; all pass on a valid
    # DAG, and one stream naming no vertex is one line, on that stream (the parser's words)
    from elastream.crd import check_manifest

    vertices: list[dict[str, Any]] = [{"name": "v0", "source": {"type": "synthetic", "rate": 10}}]
    vertices += [{"name": f"v{i}", "logic": {"builtin": "work"}} for i in range(1, 127)]
    vertices.append({"name": "v127", "sink": {"type": "log"}})
    pairs = [(i, i + 1) for i in range(127)] + [(i, j) for i in range(126) for j in range(i + 2, 128)]
    streams = [{"from": f"v{i}", "to": f"v{j}"} for i, j in pairs[:512]]
    document = {
        "apiVersion": topology.API_VERSION,
        "kind": topology.KIND,
        "metadata": {"name": "big"},
        "spec": {"nodes": 32, "slotsPerNode": 4, "vertices": vertices, "streams": streams},
    }
    assert len(streams) == 512 and len(check_manifest(document).streams) == 512
    streams[300]["to"] = "ghost"
    with pytest.raises(topology.TopologyError) as info:
        check_manifest(document)
    assert [line.split(": ")[0] for line in info.value.problems] == ["spec.streams[300].to"]
