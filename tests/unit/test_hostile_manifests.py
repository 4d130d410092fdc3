"""Over-large and hostile manifests (issue 21, "bounds and hygiene"): each is refused with one line naming the
field, never a traceback, a hang or a `MemoryError`; and a Hypothesis fuzz of the parser over arbitrary
JSON-like documents and mutations of a valid manifest, which only ever raises `TopologyError`.

The cases go through `check_manifest` (the CRD's schema and rules, then the parser: what every manifest the API
server has not admitted goes through) and, for what only a file can hold (a YAML alias bomb, nesting the
composer would recurse into, a huge file), through `load_manifest` and `elastream validate`. The fuzz drives
both `parse_manifest` (what the operator calls with the spec the API server admitted) and `check_manifest`.
"""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastream.core import topology
from elastream.core.topology import TopologyError, parse_manifest
from elastream.crd import check_manifest, load_manifest
from support.paths import EXAMPLES

with open(os.path.join(EXAMPLES, "demo.yaml"), encoding="utf-8") as _handle:
    DEMO: dict[str, Any] = yaml.safe_load(_handle)

Change = Callable[[dict[str, Any]], object]


def mutated(change: Change) -> dict[str, Any]:
    document = copy.deepcopy(DEMO)
    change(document["spec"])
    return document


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def self_containing() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def shared_bomb() -> list[Any]:
    """What a YAML billion-laughs document loads as: ten lists of ten references to the level below, nine
    levels deep: 10^9 values if walked, ten objects in memory."""
    value: list[Any] = ["lol"]
    for _ in range(9):
        value = [value] * 10
    return value


def all_at(parallelism: int) -> Change:
    def change(spec: dict[str, Any]) -> None:
        for vertex in spec["vertices"]:
            vertex.update(parallelism=parallelism, maxParallelism=parallelism)

    return change


def vertices(n: int) -> Change:
    def change(spec: dict[str, Any]) -> None:
        spec["vertices"] = [{"name": f"v{i}", "logic": {"builtin": "work"}} for i in range(n - 1)] + [
            spec["vertices"][0]
        ]

    return change


def renamed(name: str) -> Change:
    """The sink `out` renamed (and the stream into it), so the name is the one mistake."""

    def change(spec: dict[str, Any]) -> None:
        spec["vertices"][4]["name"] = spec["streams"][3]["to"] = name

    return change


HOSTILE: list[tuple[str, Change, str]] = [
    # stream names, never raw Redis keys: another topology's key (or a glob) is refused
    (
        "sink-stream-raw-key",
        lambda s: s["vertices"][4]["sink"].update(stream="elastream:{prod/payments}:sink:out"),
        "spec.vertices[4].sink.stream: 'elastream:{prod/payments}:sink:out' is not a stream name: use 1-100 "
        "letters, digits, '.', '_', '-' or ':' (e.g. out); its key is under the topology's own prefix",
    ),
    (
        "source-stream-glob",
        lambda s: s["vertices"][0]["source"].update(stream="orders*"),
        "spec.vertices[0].source.stream: 'orders*' is not a stream name",
    ),
    (
        "source-stream-slash",
        lambda s: s["vertices"][0]["source"].update(stream="prod/payments"),
        "spec.vertices[0].source.stream: 'prod/payments' is not a stream name",
    ),
    ("sink-stream-empty", lambda s: s["vertices"][4]["sink"].update(stream=""), "spec.vertices[4].sink.stream: ''"),
    (
        "sink-stream-long",
        lambda s: s["vertices"][4]["sink"].update(stream="x" * 101),
        "spec.vertices[4].sink.stream:",
    ),
    ("sink-stream-newline", lambda s: s["vertices"][4]["sink"].update(stream="out\n"), "spec.vertices[4].sink.stream:"),
    # sizes that would make initial_schedule exhaust memory, or loop for ever
    ("nodes-billion", lambda s: s.update(nodes=1_000_000_000), "spec.nodes: 1000000000 is above 1000"),
    ("nodes-huge-int", lambda s: s.update(nodes=2**70), "spec.nodes: an integer of about 22 digits is above 1000"),
    ("nodes-inf", lambda s: s.update(nodes=math.inf), "spec.nodes: inf is not an integer"),
    ("slots", lambda s: s.update(slotsPerNode=100_000), "spec.slotsPerNode: 100000 is above 256"),
    (
        "parallelism-2e9",
        lambda s: s["vertices"][1].update(parallelism=2_000_000_000),
        "spec.vertices[1].parallelism: 2000000000 is above 4096",
    ),
    (
        "max-parallelism",
        lambda s: s["vertices"][1].update(maxParallelism=10**9),
        "spec.vertices[1].maxParallelism: 1000000000 is above 4096",
    ),
    ("executors-total", all_at(4096), "spec.vertices: 20480 executors in all"),
    ("vertices-129", vertices(129), "spec.vertices: has 129 items; the CRD allows at most 128"),
    (
        "streams-513",
        lambda s: s.update(streams=s["streams"] * 129),
        "spec.streams: has 516 items; the CRD allows at most 512",
    ),
    # rates and costs: finite and bounded
    ("rate-nan", lambda s: s["vertices"][0]["source"].update(rate=math.nan), "spec.vertices[0].source.rate: nan"),
    ("rate-inf", lambda s: s["vertices"][0]["source"].update(rate=math.inf), "spec.vertices[0].source.rate: inf"),
    ("rate-minus-inf", lambda s: s["vertices"][0]["source"].update(rate=-math.inf), "spec.vertices[0].source.rate"),
    (
        "rate-1e12",
        lambda s: s["vertices"][0]["source"].update(rate=1e12),
        "spec.vertices[0].source.rate: 1000000000000.0 is above 10000000",
    ),
    ("cost-nan", lambda s: s["vertices"][1]["logic"].update(costMs=math.nan), "spec.vertices[1].logic.costMs: nan"),
    (
        "cost-huge",
        lambda s: s["vertices"][1]["logic"].update(costMs=1e308),
        "spec.vertices[1].logic.costMs: 1e+308 is above 60000",
    ),
    (
        "selectivity-inf",
        lambda s: s["vertices"][2]["logic"].update(selectivity=math.inf),
        "spec.vertices[2].logic.selectivity: inf",
    ),
    (
        "window-size-inf",
        lambda s: s["vertices"][3]["logic"].update(sizeMs=math.inf),
        "spec.vertices[3].logic.sizeMs: inf",
    ),
    (
        "keys-1e12",
        lambda s: s["vertices"][0]["source"].update(keys=10**12),
        "spec.vertices[0].source.keys: 1000000000000 is above 10000000",
    ),
    # rate profiles: step lengths and counts
    (
        "steps-10001",
        lambda s: s["vertices"][0]["source"].update(steps=[{"rate": 1, "seconds": 1}] * 10_001),
        "spec.vertices[0].source.steps: has 10001 items; the CRD allows at most 10000",
    ),
    (
        "step-seconds-1e12",
        lambda s: s["vertices"][0]["source"].update(steps=[{"rate": 1, "seconds": 1e12}]),
        "spec.vertices[0].source.steps[0].seconds: 1000000000000.0 is above 86400",
    ),
    (
        "step-rate-nan",
        lambda s: s["vertices"][0]["source"].update(steps=[{"rate": math.nan, "seconds": 1}]),
        "spec.vertices[0].source.steps[0].rate: nan",
    ),
    (
        "profile-step-seconds-1e12",
        lambda s: s["vertices"][0]["source"].update(profile="autoscale-3-step", stepSeconds=1e12),
        "spec.vertices[0].source.stepSeconds: 1000000000000.0 is above 86400",
    ),
    (
        "profile-period-over-a-day",
        lambda s: s["vertices"][0]["source"].update(profile="autoscale-3-step", stepSeconds=86_400),
        "spec.vertices[0].source.stepSeconds: 86400 makes autoscale-3-step 820800 s long, more than a day",
    ),
    (
        "profile-unhashable",
        lambda s: s["vertices"][0]["source"].update(profile=["autoscale-3-step"], rate=100),
        "spec.vertices[0].source.profile: ['autoscale-3-step'] is not a string",
    ),
    (
        "profile-rate-inf",
        lambda s: s["vertices"][0]["source"].update(profile="autoscale-5-step", rate=math.inf),
        "spec.vertices[0].source.rate: inf",
    ),
    # rate files confined to the rate directory
    (
        "csv-absolute",
        lambda s: s["vertices"][0]["source"].update(csv="/etc/passwd"),
        "spec.vertices[0].source.csv: '/etc/passwd' is an absolute path",
    ),
    (
        "csv-dotdot",
        lambda s: s["vertices"][0]["source"].update(csv="../../etc/shadow"),
        "spec.vertices[0].source.csv: '../../etc/shadow' climbs out with ..",
    ),
    (
        "csv-inner-dotdot",
        lambda s: s["vertices"][0]["source"].update(csv="rates/../../x.csv"),
        "spec.vertices[0].source.csv: 'rates/../../x.csv' climbs out with ..",
    ),
    (
        "csv-home",
        lambda s: s["vertices"][0]["source"].update(csv="~/.ssh/id_rsa"),
        "spec.vertices[0].source.csv: '~/.ssh/id_rsa' starts with ~",
    ),
    (
        "csv-nul",
        lambda s: s["vertices"][0]["source"].update(csv="rates.csv\x00.txt"),
        "spec.vertices[0].source.csv: 'rates.csv\\x00.txt' holds a NUL character",
    ),
    # scaling
    ("congestion-nan", lambda s: s["scaling"].update(congestionRate=math.nan), "spec.scaling.congestionRate: nan"),
    (
        "congestion-huge",
        lambda s: s["scaling"].update(congestionRate=1e300),
        "spec.scaling.congestionRate: 1e+300 is above 100; set it to at most 100",
    ),
    ("window-1e9", lambda s: s["scaling"].update(window=10**9), "spec.scaling.window: 1000000000 is above 3600"),
    (
        "checkpoint-interval",
        lambda s: s["scaling"].update(checkpointIntervalSeconds=10**12),
        "spec.scaling.checkpointIntervalSeconds: 1000000000000 is above 86400",
    ),
    (
        "auto-max-nodes",
        lambda s: s["scaling"].update(auto={"maxNodes": 10**6}),
        "spec.scaling.auto.maxNodes: 1000000 is above 1000",
    ),
    (
        "auto-min-nodes",
        lambda s: s["scaling"].update(auto={"minNodes": 5000}),
        "spec.scaling.auto.minNodes: 5000 is above 1000",
    ),
    (
        "auto-stabilization-inf",
        lambda s: s["scaling"].update(auto={"stabilizationSeconds": math.inf}),
        "spec.scaling.auto.stabilizationSeconds: inf",
    ),
    (
        "auto-executors-per-node",
        lambda s: s["scaling"].update(auto={"thresholds": {"executorsPerNode": 10**6}}),
        "spec.scaling.auto.thresholds.executorsPerNode: 1000000 is above 256",
    ),
    (
        "auto-theta-nan",
        lambda s: s["scaling"].update(auto={"thresholds": {"thetaMin": math.nan}}),
        "spec.scaling.auto.thresholds.thetaMin: nan",
    ),
    (
        "cpu-huge",
        lambda s: s["resources"]["limits"].update(cpu="9" * 400),
        "spec.resources.limits.cpu: '99999",
    ),
    ("cpu-nan", lambda s: s["resources"]["limits"].update(cpu=math.nan), "spec.resources.limits.cpu: nan"),
    # quantities no pod can have (issue 38): the CRD's patterns take a sign, a 0 and any exponent
    (
        "memory-limit-negative",
        lambda s: s["resources"]["limits"].update(memory="-1Gi"),
        "spec.resources.limits.memory: '-1Gi' is negative; give the memory one worker may use, e.g. 512Mi",
    ),
    (
        "memory-limit-negative-integer",
        lambda s: s["resources"]["limits"].update(memory=-1),
        "spec.resources.limits.memory: -1 is negative",
    ),
    ("memory-limit-zero", lambda s: s["resources"]["limits"].update(memory="0"), "spec.resources.limits.memory: '0'"),
    (
        "memory-limit-milli",
        lambda s: s["resources"]["limits"].update(memory="512m"),
        "spec.resources.limits.memory: '512m' is below 16Mi, too little for a worker to start (m is milli: write Mi",
    ),
    (
        "memory-limit-exponent",
        lambda s: s["resources"]["limits"].update(memory="1e999999999"),
        "spec.resources.limits.memory: '1e999999999' is above 64Ti; give at most 64Ti",
    ),
    (
        "memory-limit-exabytes",
        lambda s: s["resources"]["limits"].update(memory="8Ei"),
        "spec.resources.limits.memory: '8Ei' is above 64Ti",
    ),
    (
        "memory-limit-fractional-exponent",
        lambda s: s["resources"]["limits"].update(memory="1e2.5"),
        "spec.resources.limits.memory: '1e2.5' is not a Kubernetes quantity; write e.g. 512Mi",
    ),
    (
        "memory-request-negative",
        lambda s: s["resources"]["requests"].update(memory="-128Mi"),
        "spec.resources.requests.memory: '-128Mi' is negative",
    ),
    (
        "memory-request-above-limit",
        lambda s: s["resources"]["requests"].update(memory="1Gi"),
        "spec.resources.requests.memory: '1Gi' is above limits.memory '512Mi' (Kubernetes refuses such a pod); "
        "lower the request or raise the limit",
    ),
    (
        "cpu-request-negative",
        lambda s: s["resources"]["requests"].update(cpu=-1),
        "spec.resources.requests.cpu: -1 is negative",
    ),
    (
        "cpu-request-huge",
        lambda s: s["resources"]["requests"].update(cpu=2**70),
        "spec.resources.requests.cpu: an integer of about 22 digits is above 1024 cores",
    ),
    (
        "cpu-request-above-limit",
        lambda s: s["resources"]["requests"].update(cpu="3"),
        "spec.resources.requests.cpu: '3' is above limits.cpu '2'",
    ),
    ("cpu-limit-zero", lambda s: s["resources"]["limits"].update(cpu="0m"), "spec.resources.limits.cpu: '0m' is 0"),
    (
        "cpu-limit-below-a-millicore",
        lambda s: s["resources"]["limits"].update(cpu="0.5m"),
        "spec.resources.limits.cpu: '0.5m' is below 1m",
    ),
    # the Pod fields of spec.placement, kept as written by the CRD: the numbers a pod may have
    (
        "placement-max-skew-zero",
        lambda s: s.update(placement={"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone"}]}),
        "spec.placement.topologySpreadConstraints[0].maxSkew: 0 is not an integer from 1 to 2147483647",
    ),
    (
        "placement-weight-1000",
        lambda s: s.update(
            placement={
                "affinity": {
                    "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1000}]},
                }
            }
        ),
        "spec.placement.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: 1000 is "
        "not an integer from 1 to 100",
    ),
    (
        "placement-toleration-seconds-huge",
        lambda s: s.update(placement={"tolerations": [{"key": "k", "tolerationSeconds": 10**30}]}),
        "spec.placement.tolerations[0].tolerationSeconds: an integer of about 31 digits is not an integer from",
    ),
    # counts the CRD bounds below only: within an int64, as the API server and Redis take them
    (
        "sink-max-len-huge",
        lambda s: s["vertices"][4]["sink"].update(maxLen=2**63),
        "spec.vertices[4].sink.maxLen: 9223372036854775808 is above 9223372036854775807",
    ),
    (
        "source-limit-huge",
        lambda s: s["vertices"][0]["source"].update(limit=10**30),
        "spec.vertices[0].source.limit: an integer of about 31 digits is above 9223372036854775807",
    ),
    # text that would flood a message, or break it over lines
    (
        "vertex-name-newline",
        renamed("out\nTraceback (most recent call last):"),
        "spec.vertices[4].name: 'out\\nTraceback",
    ),
    # documents too deep or too big to walk (what a YAML alias bomb or a deep spec loads as)
    (
        "deep-placement",
        lambda s: s.update(placement={"affinity": nested(1000)}),
        "spec.placement.affinity.a.a.a",
    ),
    ("self-containing", lambda s: s.update(nodes=self_containing()), "spec.nodes[0][0][0]"),
    ("alias-bomb", lambda s: s["vertices"][0]["source"].update(extra=shared_bomb()), "manifest: holds more than"),
    (
        "text-bomb",
        lambda s: s["vertices"][0]["source"].update(extra=["y" * 1_048_576] * 5),
        "manifest: holds more than 4 Mi characters of text",
    ),
]


def assert_one_line(exc: TopologyError, expected: str) -> None:
    message = str(exc)
    assert len(exc.problems) == 1, exc.problems
    assert "\n" not in message and "\r" not in message
    assert "Traceback (most recent call last):\n" not in message
    assert len(message) <= topology.MAX_PROBLEM_CHARS
    assert message.startswith(expected), message
    assert re.match(r"^\S+: ", message), message  # names the field (the file, the manifest as a whole) first


def test_there_are_at_least_thirty_hostile_cases() -> None:
    assert len(HOSTILE) >= 30
    assert len({name for name, _, _ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_manifest_is_refused_in_one_line_naming_the_field(change: Change, expected: str) -> None:
    with pytest.raises(TopologyError) as info:
        check_manifest(mutated(change))
    assert_one_line(info.value, expected)


def test_a_megabyte_name_is_refused_where_it_is_written_in_short_lines() -> None:
    # the vertex and the stream into it both hold the megabyte name: each field is named, neither floods a line
    with pytest.raises(TopologyError) as info:
        check_manifest(mutated(renamed("x" * 1_000_000)))
    assert info.value.problems == [
        "spec.streams[3].to: is 1000000 characters long; shorten it to at most 63",
        "spec.vertices[4].name: is 1000000 characters long; shorten it to at most 63",
    ]


def test_stream_names_map_to_keys_under_the_topologys_prefix() -> None:
    from elastream.core.topology import stream_key, topology_prefix

    topology = parse_manifest(mutated(lambda s: s["vertices"][4]["sink"].update(stream="out.v2:eu_1-a")))
    assert topology.vertices["out"].config["stream"] == "out.v2:eu_1-a"
    prefix = topology_prefix("default", "demo")
    assert stream_key(prefix, "sink", "out.v2:eu_1-a") == "elastream:{default/demo}:sink:out.v2:eu_1-a"
    assert stream_key(prefix, "source", "orders") == "elastream:{default/demo}:source:orders"


def test_the_demo_itself_is_fine() -> None:
    assert parse_manifest(mutated(lambda s: None)).name == "demo"


def test_the_largest_allowed_sizes_parse() -> None:
    # at the bounds, not above them: 1000 nodes, 256 slots, 10,000 executors
    def change(spec: dict[str, Any]) -> None:
        spec.update(nodes=topology.MAX_NODES, slotsPerNode=256)  # the CRD's maxima
        for vertex in spec["vertices"]:
            vertex.update(parallelism=2000, maxParallelism=4096)

    parsed = parse_manifest(mutated(change))
    assert parsed.executors == topology.MAX_EXECUTORS and parsed.nodes == topology.MAX_NODES


# ---------------------------------------------------------------------------------------------------------
# YAML files: what only text can be


BILLION_LAUGHS = """\
apiVersion: elastream.dev/v1alpha1
kind: StreamTopology
metadata: {name: lol}
spec:
  nodes: 1
  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
  h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
  i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
  vertices: *i
"""

HEAD = "apiVersion: elastream.dev/v1alpha1\nkind: StreamTopology\nmetadata: {name: t}\n"

YAML_FILES: list[tuple[str, str, str]] = [
    ("billion-laughs", BILLION_LAUGHS, "manifest: holds more than 100000 values"),
    ("deep-flow", HEAD + "spec: " + "[" * 100_000 + "]" * 100_000 + "\n", "{path}: line 4 is nested deeper than 32"),
    (
        "deep-block",
        HEAD + "spec:\n" + "".join(f"{'  ' * (i + 1)}k{i}:\n" for i in range(200)),
        "{path}: line 35 is nested deeper than 32",
    ),
    ("recursive-alias", HEAD + "spec: {nodes: &n [*n]}\n", "spec.nodes[0][0]"),
    ("digits", HEAD + "spec: {nodes: " + "9" * 5000 + "}\n", "{path}: holds a value YAML cannot construct"),
    ("huge-file", HEAD + "spec: {image: '" + "x" * (topology.MAX_MANIFEST_BYTES + 1) + "'}\n", "{path}: is larger"),
    ("two-topologies", HEAD + "spec: {}\n---\n" + HEAD + "spec: {}\n", "{path}: holds 2 StreamTopology documents"),
    ("not-yaml", HEAD + "spec: {nodes: [}\n", "{path}: line 4 is not valid YAML"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in YAML_FILES], ids=[c[0] for c in YAML_FILES])
def test_a_hostile_yaml_file_is_refused_in_one_line(tmp_path: Any, text: str, expected: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError) as info:
        load_manifest(str(path))
    assert_one_line(info.value, expected.format(path=path))


def validate(tmp_path: Any, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-m", "elastream", "validate", str(path)], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BILLION_LAUGHS, "error: manifest: holds more than 100000 values"),
        (HEAD + "spec: " + "[" * 10_000 + "]" * 10_000 + "\n", "error: {path}: line 4 is nested deeper than 32"),
        (yaml.safe_dump(DEMO).replace("nodes: 4", "nodes: .nan"), "error: spec.nodes: nan is not a finite number"),
        (
            yaml.safe_dump(DEMO).replace("memory: 512Mi", "memory: -1Gi"),
            "error: spec.resources.limits.memory: '-1Gi' is negative; give the memory one worker may use",
        ),
    ],
    ids=["billion-laughs", "deep", "nan", "negative-memory"],
)
def test_validate_refuses_a_hostile_file_in_one_line(tmp_path: Any, text: str, expected: str) -> None:
    proc = validate(tmp_path, text)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == expected.format(path=tmp_path / "t.yaml") or lines[0].startswith(
        expected.format(path=tmp_path / "t.yaml")
    ), lines
    assert "MemoryError" not in proc.stderr and "RecursionError" not in proc.stderr


# ---------------------------------------------------------------------------------------------------------
# fuzz: the parser only ever raises TopologyError, quickly

FUZZ = settings(max_examples=150, deadline=1000, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["", "..", "~", "/", "a\nb", "source", "logic", "sink", "shuffle", "fields", "demo"])
)
json_like = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)
#: keys the parser reads, so drawn mappings reach past the first checks
KEYS = [
    "apiVersion", "kind", "metadata", "name", "namespace", "spec", "nodes", "slotsPerNode", "vertices", "streams",
    "scaling", "resources", "limits", "cpu", "source", "logic", "sink", "type", "builtin", "module", "rate",
    "parallelism", "maxParallelism", "stateful", "from", "to", "grouping", "key", "balance", "steps", "csv",
    "profile", "stepSeconds", "seconds", "auto", "thresholds", "costMs", "selectivity", "delivery", "mode",
]  # fmt: skip
manifest_like = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEYS), children, max_size=6),
    max_leaves=40,
)


def check(document: Any) -> None:
    for parse in (parse_manifest, check_manifest):
        try:
            parse(document)
        except TopologyError as exc:
            assert exc.problems, "a TopologyError names at least one problem"
            for problem in exc.problems:
                assert problem and "\n" not in problem and len(problem) <= topology.MAX_PROBLEM_CHARS, problem


@FUZZ
@given(json_like)
def test_fuzz_arbitrary_json_like_documents(document: Any) -> None:
    check(document)


@FUZZ
@given(
    st.fixed_dictionaries({"apiVersion": scalars, "kind": scalars, "metadata": manifest_like, "spec": manifest_like})
)
def test_fuzz_documents_shaped_like_manifests(document: dict[str, Any]) -> None:
    check(document)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document a value sits at (keys of mappings, indexes of lists)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*prefix, i))
    return found


DEMO_PATHS = paths(DEMO)[1:]


#: what an edit may add to a mapping of the demo: every key the parser or a built-in reads
ADDED_KEYS = [*KEYS, "keys", "limit", "idOffset", "every", "maxLen", "sizeMs", "fluctuation", "minNodes", "maxNodes"]
edits = st.tuples(
    st.sampled_from(DEMO_PATHS), st.sampled_from(["set", "delete", "add"]), st.sampled_from(ADDED_KEYS), json_like
)
#: a synthetic source's rate profile, drawn whole, for the edits to spoil
profiles = st.fixed_dictionaries(
    {"type": st.just("synthetic")},
    optional={
        "profile": st.sampled_from(["autoscale-3-step", "autoscale-5-step"]) | json_like,
        "stepSeconds": scalars,
        "rate": scalars,
        "fluctuation": scalars,
        "steps": st.lists(st.fixed_dictionaries({"rate": scalars, "seconds": scalars}), max_size=3) | json_like,
        "csv": scalars,
    },
)


@FUZZ
@given(st.lists(edits, max_size=4), st.none() | profiles)
def test_fuzz_mutations_of_a_valid_manifest(edits: list[tuple[tuple[Any, ...], str, str, Any]], source: Any) -> None:
    document = copy.deepcopy(DEMO)
    if source is not None:
        document["spec"]["vertices"][0]["source"] = source
    for path, action, key, value in edits:
        parent: Any = document
        for part in path[:-1]:
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                break
        else:
            try:
                if action == "delete":
                    del parent[path[-1]]
                elif action == "set":
                    parent[path[-1]] = value
                elif isinstance(parent[path[-1]], dict):
                    parent[path[-1]][key] = value
            except (KeyError, IndexError, TypeError):
                pass
    check(document)


def test_a_program_built_topology_may_be_larger_than_a_manifest() -> None:
    # the simulator and the benchmarks build thousands of vertices (bounded=False); a manifest may not: the CRD's
    # maxItems refuses it, and the parser's own bound on executors holds unless lifted
    import random

    from elastream.sim.workloads import random_manifest, random_topology

    document = random_manifest(random.Random(7), 1000, nodes=50)
    with pytest.raises(TopologyError) as info:
        check_manifest(document)
    assert "spec.vertices: has 1000 items; the CRD allows at most 128" in info.value.problems
    assert len(random_topology(random.Random(7), 1000, nodes=50).vertices) == 1000
    for vertex in document["spec"]["vertices"]:
        vertex["parallelism"] = 11  # 11,000 executors
    document["spec"]["slotsPerNode"] = 256
    with pytest.raises(TopologyError, match=r"^spec\.vertices: 11000 executors in all"):
        parse_manifest(document)
    assert parse_manifest(document, bounded=False).nodes == 50
