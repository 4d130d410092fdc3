"""The StreamTopology CRD: one file in three places, a schema every example passes and bad manifests fail,
defaults and enums that agree with the parser, and `elastream validate` reporting schema problems in one line
each.

The schema is checked with `jsonschema` after `elastream.resources.to_json_schema` converts the OpenAPI
schema (x-kubernetes-* keys dropped). `jsonschema` cannot run the CEL rules (`x-kubernetes-validations`), so
`CEL_RULES` re-implements each one in Python, keyed by its exact text: a rule added to or changed in the CRD
fails `test_every_cel_rule_has_a_python_twin` until it has a twin here. CEL itself only runs in a real API
server (kube-apiserver 1.34 accepted this CRD, all the examples, and rejected each bad case below with the rule's
message).
"""

from __future__ import annotations

import copy
import glob
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonschema
import pytest
import yaml

from elastream.cli import main
from elastream.core import rates, savepoints, status, topology
from elastream.resources import crd_text, json_schema, merge_problems, openapi_schema, schema_problems
from support.paths import EXAMPLES, REPO

CRD_PATHS = {
    "crds": os.path.join(REPO, "crds", "streamtopology.yaml"),
    "chart": os.path.join(REPO, "charts", "elastream", "crds", "streamtopology.yaml"),
    "package": os.path.join(REPO, "operator", "src", "elastream", "resources", "streamtopology.yaml"),
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
# one file, three places


def test_the_three_copies_are_identical() -> None:
    contents = {}
    for where, path in CRD_PATHS.items():
        with open(path, "rb") as handle:
            contents[where] = handle.read()
    assert contents["chart"] == contents["crds"], "copy crds/streamtopology.yaml to charts/elastream/crds/"
    assert contents["package"] == contents["crds"], "copy crds/streamtopology.yaml to operator/src/elastream/resources/"


def test_the_package_ships_the_crd() -> None:
    with open(CRD_PATHS["crds"], encoding="utf-8") as handle:
        assert crd_text() == handle.read()


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

    from elastream.core.topology import STREAM_NAME_PATTERN, TopologyError, parse_manifest

    vertex = spec_schema(schema)["properties"]["vertices"]["items"]["properties"]
    for kind in ("source", "sink"):
        stream = vertex[kind]["properties"]["stream"]
        assert stream["pattern"] == STREAM_NAME_PATTERN and stream["maxLength"] == 100
    for name, ok in (("out", True), ("a.b:c_d-e", True), ("elastream:{prod/payments}:sink:out", False), ("*", False)):
        assert bool(re.fullmatch(STREAM_NAME_PATTERN, name)) is ok  # the API server's (ECMA) reading is the same
        doc = copy.deepcopy(demo)
        sink = next(v for v in doc["spec"]["vertices"] if "sink" in v)
        sink["sink"]["stream"] = name
        if ok:
            parse_manifest(doc)
        else:
            with pytest.raises(TopologyError):
                parse_manifest(doc)


def test_the_crd_maxima_are_the_parsers_bounds(schema: dict[str, Any]) -> None:
    # every maximum and maxItems of the spec is one of core.topology's named bounds, and every bound is in the
    # CRD: the API server refuses what the parser would, with the same number (the [0, 1] shares and the
    # fluctuation are ranges, not sizes)
    spec_nodes = [(f"spec.{path}" if path else "spec", node) for path, node in walk(spec_schema(schema))]
    maxima = {path: node["maximum"] for path, node in spec_nodes if "maximum" in node and node["maximum"] != 1}
    assert maxima == dict(topology.MAXIMA)
    items = {path: node["maxItems"] for path, node in spec_nodes if "maxItems" in node and "placement" not in path}
    assert items == dict(topology.MAX_ITEMS)
    assert topology.MAXIMA["spec.nodes"] == topology.MAX_NODES == 1000
    assert topology.MAXIMA["spec.vertices[].source.steps[].rate"] == rates.MAX_RATE


def test_the_parser_refuses_one_above_each_crd_maximum(demo: dict[str, Any]) -> None:
    # the other direction: at a CRD maximum the parser's bound holds, one above it the parser names the field
    where = {
        "spec.nodes": lambda s, v: s.update(nodes=v),
        "spec.slotsPerNode": lambda s, v: s.update(slotsPerNode=v),
        "spec.vertices[].parallelism": lambda s, v: s["vertices"][1].update(parallelism=v, maxParallelism=v),
        "spec.scaling.window": lambda s, v: s["scaling"].update(window=v),
        "spec.scaling.auto.maxNodes": lambda s, v: s["scaling"].update(auto={"maxNodes": v}),
        "spec.vertices[].source.rate": lambda s, v: s["vertices"][0]["source"].update(rate=v),
    }
    for path, change in where.items():
        maximum = topology.MAXIMA[path]
        with pytest.raises(topology.TopologyError) as info:
            topology.parse_manifest(mutated(demo, lambda s, c=change, m=maximum: c(s, m + 1)))
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
    assert "nodes" in spec_schema(schema)["required"]
    assert found == {
        "spec.slotsPerNode": topology.DEFAULT_SLOTS_PER_NODE,
        "spec.suspend": False,
        "spec.deletionPolicy": savepoints.DEFAULT_DELETION_POLICY,
        "spec.spreadOverNodes": False,
        "spec.vertices[].parallelism": 1,
        "spec.vertices[].maxParallelism": topology.DEFAULT_MAX_PARALLELISM,
        "spec.vertices[].stateful": False,
        "spec.streams[].grouping": "shuffle",
        "spec.scaling": {},
        "spec.scaling.strategy": scaling.strategy,
        "spec.scaling.migration": scaling.migration,
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


def test_enums_are_the_parsers(schema: dict[str, Any]) -> None:
    enums = {path: tuple(node["enum"]) for path, node in walk(schema) if "enum" in node}
    vertex = "spec.vertices[]"
    assert enums == {
        f"{vertex}.source.type": topology.SOURCE_TYPES,
        f"{vertex}.source.mode": topology.COST_MODES,
        f"{vertex}.source.profile": tuple(rates.PRESETS),
        f"{vertex}.logic.builtin": topology.LOGIC_BUILTINS,
        f"{vertex}.logic.mode": topology.COST_MODES,
        f"{vertex}.sink.type": topology.SINK_TYPES,
        f"{vertex}.sink.mode": topology.COST_MODES,
        f"{vertex}.sink.delivery": topology.SINK_DELIVERIES,
        "spec.streams[].grouping": topology.GROUPINGS,
        "spec.streams[].balance": topology.BALANCES,
        "spec.scaling.strategy": topology.STRATEGIES,
        "spec.scaling.migration": topology.MIGRATIONS,
        "spec.scaling.auto.policy": topology.AUTOSCALE_POLICIES,
        "spec.scaling.auto.combine": topology.AUTOSCALE_COMBINES,
        "spec.deletionPolicy": savepoints.DELETION_POLICIES,
        "status.phase": status.PHASES,
        "status.conditions[].status": ("True", "False", "Unknown"),
    }


def test_operator_blocks_keep_their_own_keys_and_type_the_known_ones(schema: dict[str, Any]) -> None:
    blocks = vertex_schema(schema)["properties"]
    for kind in ("source", "logic", "sink"):
        assert blocks[kind]["x-kubernetes-preserve-unknown-fields"] is True
        assert blocks[kind]["properties"]["costMs"] == {
            "description": blocks[kind]["properties"]["costMs"]["description"],
            "type": "number",
            "minimum": 0,
            "maximum": topology.MAX_COST_MS,
        }
    assert schema["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True


# ---------------------------------------------------------------------------------------------------------
# CEL rules, re-implemented


def apply_defaults(node: Mapping[str, Any], value: Any) -> Any:
    """The API server's defaulting: a missing field with a default gets it, then its own fields theirs."""
    if isinstance(value, dict) and "properties" in node:
        for name, sub in node["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [apply_defaults(node["items"], item) for item in value]
    return value


def _names(spec: Mapping[str, Any]) -> set[str]:
    return {v.get("name") for v in spec.get("vertices", [])}


#: CRD rule text -> (where it applies, a Python twin that returns True when the object passes)
CEL_RULES: dict[str, tuple[str, Callable[[Mapping[str, Any]], bool]]] = {
    "!has(self.streams) || self.streams.all(s, self.vertices.exists(v, v.name == s.from))": (
        "spec",
        lambda spec: all(s["from"] in _names(spec) for s in spec.get("streams", [])),
    ),
    "!has(self.streams) || self.streams.all(s, self.vertices.exists(v, v.name == s.to))": (
        "spec",
        lambda spec: all(s["to"] in _names(spec) for s in spec.get("streams", [])),
    ),
    "(has(self.source) ? 1 : 0) + (has(self.logic) ? 1 : 0) + (has(self.sink) ? 1 : 0) == 1": (
        "vertex",
        lambda vertex: sum(kind in vertex for kind in ("source", "logic", "sink")) == 1,
    ),
    "!has(self.parallelism) || !has(self.maxParallelism) || self.parallelism <= self.maxParallelism": (
        "vertex",
        lambda vertex: vertex["parallelism"] <= vertex["maxParallelism"],
    ),
    "self.grouping != 'fields' || (has(self.key) && size(self.key) > 0)": (
        "stream",
        lambda stream: stream["grouping"] != "fields" or bool(stream.get("key")),
    ),
    "!has(self.balance) || !has(self.grouping) || self.grouping == 'shuffle'": (
        "stream",
        lambda stream: "balance" not in stream or stream["grouping"] == "shuffle",
    ),
    "!has(self.minNodes) || !has(self.maxNodes) || self.minNodes <= self.maxNodes": (
        "auto",
        lambda auto: auto["minNodes"] <= auto["maxNodes"],
    ),
}


def crd_rules(schema: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["rule"]: rule for _, node in walk(schema) for rule in node.get("x-kubernetes-validations", [])}


def test_every_cel_rule_has_a_python_twin(schema: dict[str, Any]) -> None:
    assert set(crd_rules(schema)) == set(CEL_RULES)
    for rule in crd_rules(schema).values():
        # the message names the rule before the colon: "<rule>: <what is wrong>"
        assert ": " in rule["message"] and len(rule["message"].split(": ")[0]) > 5


def cel_violations(document: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Messages of the CEL rules `document` (defaults applied) breaks, each prefixed with where."""
    doc = apply_defaults(schema, copy.deepcopy(dict(document)))
    rules = crd_rules(schema)
    spec = doc["spec"]
    targets: list[tuple[str, str, Mapping[str, Any]]] = [("spec", "spec", spec)]
    targets += [("vertex", f"spec.vertices[{i}]", v) for i, v in enumerate(spec.get("vertices", []))]
    targets += [("stream", f"spec.streams[{i}]", s) for i, s in enumerate(spec.get("streams", []))]
    targets.append(("auto", "spec.scaling.auto", spec["scaling"]["auto"]))
    found = []
    for text, (where, check) in CEL_RULES.items():
        for kind, path, value in targets:
            if kind == where and not check(value):
                found.append(f"{path}: {rules[text]['message']}")
    return found


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
            "spec.vertices[2].parallelism: 'x' is not of type 'integer'; fix it",
        ),
        (lambda s: s.pop("nodes"), "spec.nodes: is missing; add it"),
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
        (lambda s: s["vertices"][0]["source"].update(type="kafka"), "spec.vertices[0].source.type: 'kafka' is unknown"),
        (lambda s: s["vertices"][4]["sink"].update(type="s3"), "spec.vertices[4].sink.type: 's3' is unknown"),
        (lambda s: s["vertices"][1]["logic"].update(costMs=-1), "spec.vertices[1].logic.costMs: -1 is below 0"),
        (lambda s: s["vertices"][1].update(name="Parse_1"), "spec.vertices[1].name: 'Parse_1' does not match"),
        (
            lambda s: s["vertices"][1].update(paralellism=3),
            "spec.vertices[1].paralellism: unknown field; remove it or fix its name",
        ),
        (lambda s: s["vertices"][1].update(stateful="yes"), "spec.vertices[1].stateful: 'yes' is not of type"),
        (lambda s: s.update(suspend="yes"), "spec.suspend: 'yes' is not of type 'boolean'"),
        (lambda s: s.update(vertices=[]), "spec.vertices: has 0 items; give at least 1"),
        (
            lambda s: s["resources"]["limits"].update(cpu=1.5),
            "spec.resources.limits.cpu: 1.5 is not of type 'integer', 'string'",
        ),
        (lambda s: s["resources"]["limits"].update(cpu="2 cores"), "spec.resources.limits.cpu: '2 cores' does not"),
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


def test_the_parser_rejects_what_the_schema_rejects_on_the_same_field(demo: dict[str, Any]) -> None:
    # the checks both make agree on the field they blame
    for change in (
        lambda s: s["streams"][0].update(grouping="hash"),
        lambda s: s.update(nodes=0),
        lambda s: s["vertices"][2].update(parallelism="x"),
        lambda s: s["scaling"].update(window=1),
        lambda s: s["scaling"].update(congestionRate=0.5),
        lambda s: s["vertices"][1]["logic"].update(builtin="map"),
        lambda s: s.update(suspend="true"),
    ):
        document = mutated(demo, change)
        [problem] = schema_problems(document)
        with pytest.raises(topology.TopologyError) as info:
            topology.parse_manifest(document)
        field = problem.split(": ")[0]
        assert any(line.startswith(f"{field}: ") for line in info.value.problems), (problem, info.value.problems)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda s: s["streams"][0].update({"from": "ghost"}), "spec: streams reference vertices: every stream's from"),
        (lambda s: s["streams"][0].update(to="ghost"), "spec: streams reference vertices: every stream's to"),
        (lambda s: s["vertices"][1].update(parallelism=17), "spec.vertices[1]: parallelism within maxParallelism"),
        (
            lambda s: s["vertices"][1].pop("maxParallelism") and s["vertices"][1].update(parallelism=129),
            "spec.vertices[1]: parallelism within maxParallelism",
        ),
        (lambda s: s["streams"][2].pop("key"), "spec.streams[2]: fields grouping needs a key"),
        (lambda s: s["streams"][2].update(balance="round-robin"), "spec.streams[2]: only a shuffle stream"),
        (lambda s: s["scaling"].update(auto={"minNodes": 5, "maxNodes": 3}), "spec.scaling.auto: autoscaler bounds"),
        (lambda s: s["scaling"].update(auto={"minNodes": 21}), "spec.scaling.auto: autoscaler bounds"),
        (lambda s: s["vertices"][1].update(sink={"type": "log"}), "spec.vertices[1]: one block per vertex"),
        (lambda s: s["vertices"][1].pop("logic"), "spec.vertices[1]: one block per vertex"),
    ],
)
def test_bad_manifests_break_a_cel_rule(
    demo: dict[str, Any], schema: dict[str, Any], change: Any, expected: str
) -> None:
    document = mutated(demo, change)
    assert schema_problems(document) == []  # only the CEL rule catches it
    violations = cel_violations(document, schema)
    assert len(violations) == 1 and violations[0].startswith(expected), violations
    with pytest.raises(topology.TopologyError):
        topology.parse_manifest(document)  # and so does the parser


# ---------------------------------------------------------------------------------------------------------
# elastream validate


def test_merge_keeps_the_parsers_words_for_a_field_it_checks() -> None:
    schema = ["spec.nodes: 0 is below 1; set it to at least 1", "spec.image: 5 is not of type 'string'; fix it"]
    parser = ["spec.nodes: 0 is below 1; set it to at least 1", "spec.streams: cycle a -> b -> a; remove one"]
    assert merge_problems(schema, parser) == [schema[1], *parser]


def validate(tmp_path: Any, document: Any) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(document))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-m", "elastream", "validate", str(path)], capture_output=True, text=True, env=env, timeout=60
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
    assert "error: spec.image: 5 is not of type 'string'; fix it" in lines
    assert any(line.startswith("error: spec.vertices[0].paralellism: unknown field") for line in lines), lines
    # parallelism 'x' is a field the parser checks too: reported once, in the parser's words
    assert [line for line in lines if "spec.vertices[2].parallelism" in line] == [
        "error: spec.vertices[2].parallelism: 'x' is not an integer; "
        f"set it to an integer in [1, {topology.MAX_PARALLELISM}]"
    ]


def test_validate_names_a_value_the_parser_cannot_handle_without_a_traceback(
    tmp_path: Any, demo: dict[str, Any]
) -> None:
    proc = validate(tmp_path, mutated(demo, lambda s: s["vertices"][0]["source"].update(profile=["a"])))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    # the parser names it itself now (it tested a list against the presets' dict, a TypeError, before): one
    # line for the field, in the parser's words
    assert proc.stderr.splitlines() == [
        "error: spec.vertices[0].source.profile: ['a'] is unknown; use one of: autoscale-3-step, autoscale-5-step"
    ], proc.stderr


def test_validate_requires_nodes_as_the_api_server_does(tmp_path: Any, demo: dict[str, Any]) -> None:
    proc = validate(tmp_path, mutated(demo, lambda s: s.pop("nodes")))
    assert proc.returncode == 1
    assert "error: spec.nodes: is missing; add it" in proc.stderr.splitlines()


@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_validate_accepts_every_example(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", path]) == 0
    assert ": valid — topology" in capsys.readouterr().out
