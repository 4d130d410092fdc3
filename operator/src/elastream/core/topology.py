"""The StreamTopology manifest as a typed, validated model over a networkx DiGraph.

`parse_manifest` takes the same YAML document users `kubectl apply` and returns a `Topology`, or raises
`TopologyError` listing every problem found, each naming the field (``spec.vertices[2].parallelism``) and
the fix. Nothing downstream re-validates: a `Topology` is always a DAG whose sources and sinks are known.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, cast

import networkx as nx
import yaml

from elastream.core.rates import MAX_RATE, MAX_STEP_SECONDS, MAX_STEPS, is_finite_number, rate_config_problems, shown

# the rate bounds live with the rate profiles (which this module imports); every bound is a name here too
from elastream.core.savepoints import (
    DEFAULT_DELETION_POLICY,
    SavepointRef,
    parse_deletion_policy,
    parse_initial_savepoint,
)

API_VERSION = "elastream.dev/v1alpha1"
KIND = "StreamTopology"
GROUPINGS = ("shuffle", "fields", "all", "global")
Grouping = Literal["shuffle", "fields", "all", "global"]
VertexKind = Literal["source", "logic", "sink"]
DEFAULT_MAX_PARALLELISM = 128
DEFAULT_SLOTS_PER_NODE = 4
#: input/processing ratio above which a vertex is congested (Stela's CongestionRate)
DEFAULT_CONGESTION_RATE = 1.2
#: metric intervals per analysis window
DEFAULT_WINDOW = 20
STRATEGIES = ("stela", "stela-plus", "round-robin", "least-link-load", "random")
#: how a shuffle stream deals events over the receiving executors (`Stream.balance`)
BALANCES = ("load-aware", "round-robin")
MIGRATIONS = ("ccr", "dcr", "restart")
AUTOSCALE_POLICIES = ("autoscale", "rules")
#: AUTOSCALE's `combine` of a vertex's own input estimate with its parents' estimated output
AUTOSCALE_COMBINES = ("max", "min")
#: the built-in operators of the runtime (`elastream.runtime.operators` implements exactly these)
SOURCE_TYPES = ("synthetic", "redis-stream")
LOGIC_BUILTINS = ("work", "filter", "count", "window")
SINK_TYPES = ("redis-stream", "log", "null")
#: a redis-stream sink's guarantee: at-least-once writes every batch at once, exactly-once commits with checkpoints
SINK_DELIVERIES = ("at-least-once", "exactly-once")
COST_MODES = ("sleep", "spin")

# Upper bounds. A topology's author must not be able to take the operator down for everyone: every number
# that sizes memory, work or a loop is bounded, and the CRD's `maximum`s are these same numbers
# (tests/unit/test_crd.py checks). They fit a shared cluster with room to spare: a thousand worker pods,
# a node as big as a large machine's cores, a few thousand executors per vertex.
#: spec.nodes, spec.scaling.auto.minNodes and maxNodes
MAX_NODES = 1000
#: spec.slotsPerNode and spec.scaling.auto.thresholds.executorsPerNode (a 256-core machine, one per core)
MAX_SLOTS_PER_NODE = 256
#: a vertex's parallelism and maxParallelism (its key groups, the lanes of a synthetic source)
MAX_PARALLELISM = 4096
#: the executors of all vertices together (the sum of their parallelism)
MAX_EXECUTORS = 10_000
#: spec.vertices and spec.streams (the CRD's maxItems, which keep its CEL rules within the cost budget)
MAX_VERTICES = 128
MAX_STREAMS = 512
#: costMs of a built-in (a minute per event) and selectivity (events out per event in)
MAX_COST_MS = 60_000
MAX_SELECTIVITY = 1000
#: spec.scaling.congestionRate (the paper uses 1.2)
MAX_CONGESTION_RATE = 100
#: spec.scaling.window: metric samples in the analysis window (an hour of 1 s intervals)
MAX_WINDOW = 3600
#: spec.scaling.checkpointIntervalSeconds and auto.stabilizationSeconds: a day
MAX_INTERVAL_SECONDS = 86_400
#: spec.resources.limits.cpu in cores
MAX_NODE_CPU = 1024
#: a synthetic source's distinct keys
MAX_KEYS = 10_000_000
#: the manifest as a document: bytes of its file, nesting levels, values (after YAML aliases are expanded)
#: and characters of text; beyond them it is refused before anything walks it
MAX_MANIFEST_BYTES = 1_048_576
MAX_DEPTH = 32
MAX_VALUES = 100_000
MAX_TEXT_CHARS = 4 * 1_048_576
#: every maximum of a field, by its path in the CRD's schema (list items as []): the CRD states the same
#: `maximum`s (and `maxItems`), tests/unit/test_crd.py checks both ways; docs/manifest.md tabulates them
MAXIMA: Mapping[str, int] = {
    "spec.nodes": MAX_NODES,
    "spec.slotsPerNode": MAX_SLOTS_PER_NODE,
    "spec.vertices[].parallelism": MAX_PARALLELISM,
    "spec.vertices[].maxParallelism": MAX_PARALLELISM,
    **{f"spec.vertices[].{kind}.rate": MAX_RATE for kind in ("source", "logic", "sink")},
    **{f"spec.vertices[].{kind}.costMs": MAX_COST_MS for kind in ("source", "logic", "sink")},
    **{f"spec.vertices[].{kind}.selectivity": MAX_SELECTIVITY for kind in ("source", "logic", "sink")},
    "spec.vertices[].source.keys": MAX_KEYS,
    "spec.vertices[].source.steps[].rate": MAX_RATE,
    "spec.vertices[].source.steps[].seconds": MAX_STEP_SECONDS,
    "spec.vertices[].source.stepSeconds": MAX_STEP_SECONDS,
    "spec.vertices[].logic.sizeMs": MAX_INTERVAL_SECONDS * 1000,
    "spec.scaling.congestionRate": MAX_CONGESTION_RATE,
    "spec.scaling.window": MAX_WINDOW,
    "spec.scaling.checkpointIntervalSeconds": MAX_INTERVAL_SECONDS,
    "spec.scaling.auto.minNodes": MAX_NODES,
    "spec.scaling.auto.maxNodes": MAX_NODES,
    "spec.scaling.auto.stabilizationSeconds": MAX_INTERVAL_SECONDS,
    "spec.scaling.auto.thresholds.executorsPerNode": MAX_SLOTS_PER_NODE,
}
#: list lengths, the CRD's maxItems
MAX_ITEMS: Mapping[str, int] = {
    "spec.vertices": MAX_VERTICES,
    "spec.streams": MAX_STREAMS,
    "spec.vertices[].source.steps": MAX_STEPS,
}
#: the longest problem line and the most problem lines one error carries
MAX_PROBLEM_CHARS = 500
MAX_PROBLEMS = 100
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CPU_RE = re.compile(r"^(\d+(\.\d+)?)(m?)$")


class TopologyError(ValueError):
    """A manifest is invalid. `problems` holds one line per problem: "<field>: <what>; <fix>"."""

    def __init__(self, problems: Sequence[str]) -> None:
        lines = [_one_line(p) for p in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            lines.append(f"manifest: {len(problems) - MAX_PROBLEMS} more problems; fix the ones above first")
        self.problems = lines
        super().__init__("; ".join(self.problems) if self.problems else "invalid topology")

    def __str__(self) -> str:
        return "\n".join(self.problems)


def _one_line(problem: str) -> str:
    """A problem as one line of at most MAX_PROBLEM_CHARS characters (control characters escaped)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(problem)[: MAX_PROBLEM_CHARS + 1])
    return text if len(text) <= MAX_PROBLEM_CHARS else text[: MAX_PROBLEM_CHARS - 1] + "…"


@dataclass(frozen=True)
class Vertex:
    """One vertex (the papers' "operator") of the DAG and how to run it."""

    name: str
    kind: VertexKind
    parallelism: int
    max_parallelism: int
    stateful: bool = False
    #: the `source:`, `logic:` or `sink:` block as written (type/builtin/module and its parameters)
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cost_ms(self) -> float | None:
        """Processing cost per tuple in milliseconds, when the manifest states it (built-ins, benchmarks)."""
        value = self.config.get("costMs")
        return None if value is None else float(value)

    @property
    def selectivity(self) -> float:
        """Tuples emitted per tuple processed (1.0 unless stated)."""
        return float(self.config.get("selectivity", 1.0))

    @property
    def source_rate(self) -> float | None:
        """For a source: the total offered rate in tuples/s over all its executors (None: as fast as it can)."""
        value = self.config.get("rate")
        return None if value is None else float(value)

    def executor_ids(self, parallelism: int | None = None) -> list[str]:
        k = self.parallelism if parallelism is None else parallelism
        return [executor_id(self.name, i) for i in range(k)]


@dataclass(frozen=True)
class Stream:
    """A directed edge from one vertex to another with its grouping."""

    src: str
    dst: str
    grouping: Grouping = "shuffle"
    key: str | None = None
    #: shuffle only: `load-aware` sends each frame to the receiver with the most free credit (the one that
    #: drains fastest), `round-robin` deals events in turn (Storm's plain shuffle)
    balance: str = "load-aware"


@dataclass(frozen=True)
class AutoScalingSpec:
    """`spec.scaling.auto`: the autoscaler's switch, policy, bounds, thresholds and pacing."""

    enabled: bool = False
    policy: str = "autoscale"
    min_nodes: int = 1
    max_nodes: int = 20
    #: AUTOSCALE: activity thresholds θmin/θmax and how a child combines its parents' estimates
    theta_min: float = 0.3
    theta_max: float = 0.8
    combine: str = "max"
    #: rules (ARiSto): th_cc, th_e (None: slotsPerNode), th_high, th_low
    capacity_threshold: float = 0.8
    executors_per_node: int | None = None
    high_threshold: float = 0.75
    low_threshold: float = 0.25
    #: seconds after a change before the next decision (ARiSto's warm-up)
    stabilization_s: float = 30.0
    #: False: recommend only (the decision goes to status and events, nothing changes)
    execute: bool = True


@dataclass(frozen=True)
class ScalingSpec:
    strategy: str = "stela"
    migration: str = "ccr"
    congestion_rate: float = DEFAULT_CONGESTION_RATE
    window: int = DEFAULT_WINDOW
    #: seconds between periodic checkpoints (aligned barriers; what `restart` and a failed worker roll back
    #: to); 0 disables them
    checkpoint_interval_s: int = 10
    auto: AutoScalingSpec = AutoScalingSpec()


@dataclass(frozen=True)
class Topology:
    """A validated topology: vertices in topological order, streams, node layout and scaling settings."""

    name: str
    namespace: str
    nodes: int
    slots_per_node: int
    vertices: Mapping[str, Vertex]
    streams: tuple[Stream, ...]
    graph: nx.DiGraph
    order: tuple[str, ...]
    scaling: ScalingSpec = ScalingSpec()
    #: CPU cores one node may use (the worker pod's CPU limit); None means unlimited
    node_cpu: float | None = None
    spec: Mapping[str, Any] = field(default_factory=dict)
    #: `spec.suspend`: checkpoint and stop the workers, keeping the state; false resumes from that checkpoint
    suspend: bool = False
    #: `spec.initialSavepoint`: the savepoint a topology with no state of its own starts from
    initial_savepoint: SavepointRef | None = None
    #: `spec.deletionPolicy`: Delete (the working state and streams go with the resource) or Retain
    deletion_policy: str = DEFAULT_DELETION_POLICY

    @cached_property
    def sources(self) -> tuple[str, ...]:
        return tuple(v for v in self.order if self.graph.in_degree(v) == 0)

    @cached_property
    def sinks(self) -> tuple[str, ...]:
        return tuple(v for v in self.order if self.graph.out_degree(v) == 0)

    @cached_property
    def position(self) -> Mapping[str, int]:
        """Index of each vertex in the topological order (ties in planners break by it)."""
        return {v: i for i, v in enumerate(self.order)}

    def parents(self, vertex: str) -> list[str]:
        return list(self.graph.predecessors(vertex))

    def children(self, vertex: str) -> list[str]:
        return list(self.graph.successors(vertex))

    def stream(self, src: str, dst: str) -> Stream:
        return cast(Stream, self.graph.edges[src, dst]["stream"])

    @property
    def executors(self) -> int:
        return sum(v.parallelism for v in self.vertices.values())

    @property
    def redis_prefix(self) -> str:
        return topology_prefix(self.namespace, self.name)

    def with_nodes(self, nodes: int) -> Topology:
        """The same topology asked to run on `nodes` nodes (what a scale request changes)."""
        if nodes < 1:
            raise TopologyError([f"spec.nodes: {nodes} is below 1; ask for at least 1 node"])
        if nodes > MAX_NODES:
            raise TopologyError([f"spec.nodes: {nodes} is above {MAX_NODES}, the most allowed; ask for fewer nodes"])
        return _replace(self, nodes=nodes)


def topology_prefix(namespace: str, name: str) -> str:
    """The prefix of every Redis key of the topology NAMESPACE/NAME: `elastream:{namespace/name}:`.

    The braces are literal: `{namespace/name}` is the keys' Redis Cluster hash tag, so every key of one
    topology hashes to one slot (its Lua scripts, MULTI/EXEC and WATCH stay on one shard of a Redis Cluster)
    while different topologies spread over the shards by their tags. Both parts are DNS-1123 labels (no
    braces), so the tag always ends where it should. On one Redis the braces change nothing but the names."""
    return f"elastream:{{{namespace}/{name}}}:"


def glob_escape(text: str) -> str:
    """`text` matched literally by a Redis glob (SCAN MATCH, an ACL key or channel pattern): `* ? [ ] \\`
    escaped with a backslash."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


#: what a redis-stream source's or sink's `stream:` may be: a name, never a raw Redis key (no braces, '*', '/'
#: or spaces), so its key always lies under the topology's own prefix (`stream_key`)
STREAM_NAME_PATTERN = r"^[A-Za-z0-9._:-]{1,100}$"
STREAM_NAME_RULE = "use 1-100 letters, digits, '.', '_', '-' or ':'"


def stream_key(prefix: str, kind: str, name: str) -> str:
    """The Redis key of the redis-stream `kind` ("source" or "sink") called `name` of the topology whose keys
    start with `prefix`: `<prefix>source:<name>` or `<prefix>sink:<name>`. A stream's name defaults to its
    vertex's, so a sink's default key is `<prefix>sink:<vertex>`."""
    return f"{prefix}{kind}:{name}"


def _replace(topology: Topology, **changes: Any) -> Topology:
    import dataclasses

    return dataclasses.replace(topology, **changes)


def executor_id(vertex: str, index: int) -> str:
    return f"{vertex}#{index}"


def split_executor_id(executor: str) -> tuple[str, int]:
    vertex, _, index = executor.rpartition("#")
    if not vertex or not index.isdigit():
        raise ValueError(f"executor id {shown(executor)} is not of the form <vertex>#<index>")
    return vertex, int(index)


class _TooDeep(yaml.YAMLError):
    def __init__(self, line: int) -> None:
        super().__init__(f"nested deeper than {MAX_DEPTH} levels")
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a document nested deeper than MAX_DEPTH while it composes it (the
    composer recurses: a deep enough document would end in RecursionError). Aliases are composed as
    references, not copies, so an alias bomb costs what its text does here; `_shape_problem` then counts
    what it would expand to and refuses it before anything walks it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark.line + 1)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def read_manifest_document(path: str) -> Mapping[str, Any]:
    """The one StreamTopology document of a YAML file, read within the bounds (MAX_MANIFEST_BYTES, MAX_DEPTH,
    MAX_VALUES after aliases): `TopologyError` with one line saying what is wrong otherwise."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise TopologyError([f"{path}: cannot read ({exc.strerror}); check the path"]) from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise TopologyError(
            [
                f"{path}: is larger than {MAX_MANIFEST_BYTES // 1024} KiB; a manifest must be smaller "
                "(split the topology)"
            ]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopologyError(
            [f"{path}: byte {exc.start} is not UTF-8 ({exc.reason}); save the manifest as UTF-8"]
        ) from None
    return manifest_document_from_text(text, path)


def manifest_document_from_text(text: str, where: str) -> Mapping[str, Any]:
    """The one StreamTopology document of YAML `text` (from `where`, named in the errors), within the same
    bounds as `read_manifest_document`."""
    path = where
    if len(text.encode("utf-8")) > MAX_MANIFEST_BYTES:
        raise TopologyError([f"{path}: is larger than {MAX_MANIFEST_BYTES // 1024} KiB; a manifest must be smaller"])
    try:
        documents = [d for d in yaml.load_all(text, Loader=_BoundedLoader) if d is not None]
    except _TooDeep as exc:
        raise TopologyError(
            [f"{path}: line {exc.line} is nested deeper than {MAX_DEPTH} levels; a manifest is never that deep"]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line_at = f" line {mark.line + 1}" if mark is not None else ""
        raise TopologyError([f"{path}:{line_at} is not valid YAML ({getattr(exc, 'problem', exc)})"]) from None
    except (ValueError, OverflowError) as exc:  # a value YAML cannot construct (a 5000-digit integer, 2024-13-01)
        reason = str(exc).split(";")[0].split(":")[0]
        raise TopologyError([f"{path}: holds a value YAML cannot construct ({reason}); fix or quote it"]) from None
    except RecursionError:  # a safety net under the depth bound
        raise TopologyError([f"{path}: is nested too deeply; a manifest is never that deep"]) from None
    kinds = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if len(kinds) != 1:
        raise TopologyError([f"{path}: holds {len(kinds)} {KIND} documents; put exactly one {KIND} in the file"])
    too_big = _shape_problem(kinds[0])
    if too_big is not None:  # before any caller (the schema check, the parser) walks it
        raise TopologyError([too_big])
    return cast(Mapping[str, Any], kinds[0])


def load_manifest(path: str) -> Topology:
    """Read a YAML file holding one StreamTopology document and parse it."""
    return parse_manifest(read_manifest_document(path))


def _shape_problem(document: Any) -> str | None:
    """Why `document` is too big or too deep to be a manifest (MAX_DEPTH, MAX_VALUES, MAX_TEXT_CHARS), or
    None. It walks without recursion and stops at the first bound it crosses, so a YAML alias bomb (a value
    shared a billion times) or a deeply nested spec from the API server is refused in microseconds, before
    anything (the parser, a repr, a comparison) walks it whole."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(document, ())]
    values = chars = 0
    while stack:
        value, path = stack.pop()
        values += 1
        if values > MAX_VALUES:
            return (
                f"manifest: holds more than {MAX_VALUES} values (counting each YAML alias as the copy it stands "
                "for); a topology needs far fewer, remove the repetition"
            )
        if len(path) > MAX_DEPTH:
            return f"{_render(path)}: is nested deeper than {MAX_DEPTH} levels; a manifest is never that deep"
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                chars += len(key) if isinstance(key, str) else 0
                stack.append((item, (*path, key)))
        elif isinstance(value, list | tuple):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
        if chars > MAX_TEXT_CHARS:
            return (
                f"manifest: holds more than {MAX_TEXT_CHARS // 1_048_576} Mi characters of text (counting each "
                "YAML alias as the copy it stands for); shorten it"
            )
    return None


def _render(path: tuple[Any, ...]) -> str:
    """A field path as messages write it (spec.vertices[0].source), its keys cut short."""
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        else:
            key = part if isinstance(part, str) and len(part) <= 40 else shown(part)
            text += f".{key}" if text else key
    return text or "manifest"


@dataclass(frozen=True)
class _Sizes:
    """The size maxima one parse applies (`parse_manifest`'s `bounded`)."""

    nodes: int = MAX_NODES
    slots: int = MAX_SLOTS_PER_NODE
    parallelism: int = MAX_PARALLELISM
    executors: int = MAX_EXECUTORS
    vertices: int = MAX_VERTICES
    streams: int = MAX_STREAMS


_BOUNDED = _Sizes()
#: what a program may build for the simulator and the benchmarks (thousands of vertices): no size maxima
_UNBOUNDED = _Sizes(*(2**63 - 1,) * 6)


def parse_manifest(document: Mapping[str, Any], *, bounded: bool = True) -> Topology:
    """Validate a StreamTopology document (as a dict) and build the model. Raises `TopologyError`.

    `bounded=False` is for topologies a program builds, never for a manifest someone wrote: the simulator's
    and the benchmarks' thousands of vertices. It lifts the size maxima (MAX_NODES, MAX_SLOTS_PER_NODE,
    MAX_PARALLELISM, MAX_EXECUTORS, MAX_VERTICES, MAX_STREAMS) and the document bounds; every number must
    still be finite and every other bound holds.

    One mistake gives one problem line. A vertex whose own fields are wrong (parallelism: 0, a bad cost)
    stays in the graph as a placeholder, and a stream with a bad grouping or a missing key stays as an
    edge, so the streams and structure checks around them see the DAG the user meant and add nothing.
    A stream whose end names no vertex is left out; its missing edge could be the one that makes some
    vertex reachable (or gives a source its outgoing stream), so those two checks stay quiet while a
    stream end is unresolved, and come back once it is fixed. Vertices are named by their manifest
    index (spec.vertices[i]) everywhere."""
    problems: list[str] = []
    if not isinstance(document, Mapping):
        raise TopologyError(["manifest: is not a mapping; write a StreamTopology YAML document"])
    sizes = _BOUNDED if bounded else _UNBOUNDED
    too_big = _shape_problem(document) if bounded else None
    if too_big is not None:
        raise TopologyError([too_big])
    if document.get("apiVersion") not in (None, API_VERSION):
        problems.append(f"apiVersion: {shown(document.get('apiVersion'))} is not served; use {API_VERSION}")
    if document.get("kind") not in (None, KIND):
        problems.append(f"kind: {shown(document.get('kind'))} is not {KIND}; set kind: {KIND}")
    metadata = document.get("metadata") or {}
    name, namespace = "", "default"
    if not isinstance(metadata, Mapping):
        problems.append("metadata: is not a mapping; write metadata: {name: my-topology}")
    else:
        raw_name, raw_namespace = metadata.get("name", ""), metadata.get("namespace", "default")
        name = raw_name if isinstance(raw_name, str) else ""
        namespace = raw_namespace if isinstance(raw_namespace, str) and raw_namespace else "default"
        if not isinstance(raw_namespace, str) or not _NAME_RE.match(namespace):
            problems.append(f"metadata.namespace: {shown(raw_namespace)} is not a DNS-1123 label; fix it")
        if not isinstance(raw_name, str):
            problems.append(f"metadata.name: {shown(raw_name)} is not a string; use a DNS-1123 label")
        elif not _NAME_RE.match(name):
            problems.append(
                f"metadata.name: {shown(name)} is not a DNS-1123 label; use lower-case letters, digits and '-'"
            )
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        raise TopologyError([*problems, "spec: is missing; add spec.vertices and spec.streams"])

    nodes = _int_field(spec, "nodes", "spec.nodes", problems, default=1, minimum=1, maximum=sizes.nodes)
    slots = _int_field(
        spec,
        "slotsPerNode",
        "spec.slotsPerNode",
        problems,
        default=DEFAULT_SLOTS_PER_NODE,
        minimum=1,
        maximum=sizes.slots,
    )
    entries, nameless = _parse_vertices(spec.get("vertices"), problems, sizes)
    streams, unresolved = _parse_streams(spec.get("streams"), entries, nameless, problems, sizes)
    scaling = _parse_scaling(spec.get("scaling"), problems)
    node_cpu = _parse_node_cpu(spec.get("resources"), problems)
    suspend = spec.get("suspend", False)
    if suspend is None:  # `suspend: null` (or removed by a merge patch) means not suspended
        suspend = False
    if not isinstance(suspend, bool):
        problems.append(f"spec.suspend: {shown(suspend)} is not true/false; set true to suspend, false to resume")
    initial_savepoint = parse_initial_savepoint(spec.get("initialSavepoint"), namespace, name, problems)
    deletion_policy = parse_deletion_policy(spec.get("deletionPolicy"), problems)

    graph: nx.DiGraph = nx.DiGraph()
    for vertex_name in entries:
        graph.add_node(vertex_name)
    for stream in streams:
        graph.add_edge(stream.src, stream.dst, stream=stream)
    order: tuple[str, ...] = ()
    if entries:
        problems.extend(_structure_problems(graph, entries, unresolved))
        if nx.is_directed_acyclic_graph(graph):
            position = {n: i for i, n in enumerate(entries)}
            order = tuple(nx.lexicographical_topological_sort(graph, key=position.__getitem__))
    # Executors of the vertices whose parallelism is known: a lower bound when some are not, so a slot
    # shortage reported here is real.
    total = sum(e.parallelism for e in entries.values() if e.parallelism is not None)
    at_least = "at least " if any(e.parallelism is None for e in entries.values()) else ""
    if total > sizes.executors:
        problems.append(
            f"spec.vertices: {at_least}{total} executors in all (the sum of parallelism), more than "
            f"{sizes.executors}; lower the vertices' parallelism"
        )
    elif nodes is not None and slots is not None and entries and total > nodes * slots:
        need_slots = -(-total // nodes)
        need_nodes = -(-total // slots)
        problems.append(
            f"spec.slotsPerNode: {nodes} nodes × {slots} slots = {nodes * slots} slots for {at_least}{total} "
            f"executors; raise spec.slotsPerNode to {at_least}{need_slots} or spec.nodes to {at_least}{need_nodes}"
        )
    if problems:
        raise TopologyError(problems)
    assert nodes is not None and slots is not None
    vertices = {n: e.vertex for n, e in entries.items() if e.vertex is not None}
    return Topology(
        name=name,
        namespace=namespace,
        nodes=nodes,
        slots_per_node=slots,
        vertices={v: vertices[v] for v in order},
        streams=tuple(streams),
        graph=graph,
        order=order,
        scaling=scaling,
        node_cpu=node_cpu,
        spec=dict(spec),
        suspend=suspend is True,
        initial_savepoint=initial_savepoint,
        deletion_policy=deletion_policy,
    )


def _int_field(
    block: Mapping[str, Any],
    key: str,
    path: str,
    problems: list[str],
    *,
    default: int | None,
    minimum: int,
    maximum: int,
) -> int | None:
    value = block.get(key, default)
    if value is None:
        problems.append(f"{path}: is missing; set it to an integer in [{minimum}, {maximum}]")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{path}: {shown(value)} is not an integer; set it to an integer in [{minimum}, {maximum}]")
        return None
    if value < minimum:
        problems.append(f"{path}: {shown(value)} is below {minimum}; set it to at least {minimum}")
        return None
    if value > maximum:
        problems.append(f"{path}: {shown(value)} is above {maximum}, the most allowed; set it to at most {maximum}")
        return None
    return value


def _bounded_number(
    block: Mapping[str, Any], key: str, path: str, problems: list[str], low: float, high: float, *, above: bool = False
) -> bool:
    """Whether `block[key]` (present) is a finite number in [low, high] ((low, high] with `above`); a problem
    line naming the field and the range otherwise."""
    value = block[key]
    low_ok = is_finite_number(value) and (value > low if above else value >= low)
    if low_ok and value <= high:
        return True
    interval = f"{'(' if above else '['}{low}, {high}]"
    if low_ok:
        problems.append(f"{path}: {shown(value)} is above {high}, the most allowed; set it to at most {high}")
    else:
        problems.append(f"{path}: {shown(value)} is not a finite number in {interval}; fix it")
    return False


def _number(value: Any) -> bool:
    return is_finite_number(value)


@dataclass(frozen=True)
class _Entry:
    """A named vertex of the manifest as validation sees it: where it is written, what kind it is (None
    when that is the mistake) and the `Vertex`, or None when one of its own fields is wrong (a
    placeholder: it stays in the graph so nothing around it reports the same mistake again)."""

    index: int
    kind: VertexKind | None
    parallelism: int | None
    vertex: Vertex | None


def _parse_vertices(raw: Any, problems: list[str], sizes: _Sizes) -> tuple[dict[str, _Entry], int]:
    """The named vertices (placeholders included) and how many entries have no usable name."""
    if not isinstance(raw, list) or not raw:
        problems.append("spec.vertices: is missing or empty; list the vertices of the DAG")
        return {}, 0
    if len(raw) > sizes.vertices:
        problems.append(f"spec.vertices: {len(raw)} vertices, more than {sizes.vertices}; split the topology")
        return {}, 0
    entries: dict[str, _Entry] = {}
    nameless = 0
    for i, item in enumerate(raw):
        path = f"spec.vertices[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{path}: is not a mapping; write {{name: ..., logic: ...}}")
            nameless += 1
            continue
        name = item.get("name")
        if name is None:
            problems.append(f"{path}.name: is missing; give the vertex a name (lower-case letters, digits, '-')")
            nameless += 1
            continue
        if not isinstance(name, str):
            problems.append(f"{path}.name: {shown(name)} is not a string; use lower-case letters, digits, '-'")
            nameless += 1
            continue
        if name in entries:
            first = entries[name].index
            problems.append(
                f"{path}.name: duplicate vertex {shown(name)} (also spec.vertices[{first}]); "
                "give every vertex a unique name"
            )
            continue
        before = len(problems)
        if not _NAME_RE.match(name):
            problems.append(f"{path}.name: {shown(name)} is not a valid name; use lower-case letters, digits, '-'")
        kind, config = _vertex_block(item, name, path, problems)
        max_par = _int_field(
            item,
            "maxParallelism",
            f"{path}.maxParallelism",
            problems,
            default=DEFAULT_MAX_PARALLELISM,
            minimum=1,
            maximum=sizes.parallelism,
        )
        par = _int_field(
            item, "parallelism", f"{path}.parallelism", problems, default=1, minimum=1, maximum=sizes.parallelism
        )
        if par is not None and max_par is not None and par > max_par:
            problems.append(
                f"{path}.parallelism: {par} exceeds maxParallelism {max_par}; "
                f"lower parallelism or raise maxParallelism to ≥ {par}"
            )
            par = None
        stateful = item.get("stateful", False)
        if not isinstance(stateful, bool):
            problems.append(f"{path}.stateful: {shown(stateful)} is not true/false; fix it")
        vertex: Vertex | None = None
        if len(problems) == before:
            assert kind is not None and config is not None and par is not None and max_par is not None
            vertex = Vertex(name, kind, par, max_par, stateful, dict(config))
        entries[name] = _Entry(i, kind, par, vertex)
    return entries, nameless


def _vertex_block(
    item: Mapping[str, Any], name: str, path: str, problems: list[str]
) -> tuple[VertexKind | None, Mapping[str, Any] | None]:
    """The vertex's kind and its source/logic/sink block, checked; (kind or None, block or None)."""
    blocks = [k for k in ("source", "logic", "sink") if k in item]
    if len(blocks) != 1:
        problems.append(
            f"{path}: vertex {shown(name)} has {blocks or 'none'} of source/logic/sink; give it exactly one"
        )
        return None, None
    kind = cast(VertexKind, blocks[0])
    config = item[kind]
    if not isinstance(config, Mapping):
        problems.append(f"{path}.{kind}: is not a mapping; write e.g. {{builtin: work, costMs: 1}}")
        return kind, None
    if kind == "logic" and not ({"builtin", "module"} & set(config)):
        problems.append(f"{path}.logic: names no code; set logic.builtin or logic.module (module:Class)")
    if kind in ("source", "sink") and "type" not in config and "module" not in config:
        problems.append(f"{path}.{kind}: has no type; set {kind}.type (e.g. synthetic, redis-stream)")
    known = {"source": SOURCE_TYPES, "logic": LOGIC_BUILTINS, "sink": SINK_TYPES}[kind]
    name_key = "builtin" if kind == "logic" else "type"
    if name_key in config and config[name_key] not in known:
        problems.append(
            f"{path}.{kind}.{name_key}: {shown(config[name_key])} is unknown; use one of: {', '.join(known)} "
            f"or {kind}.module: package.module:Class"
        )
    module = config.get("module")
    if module is not None and (not isinstance(module, str) or not re.match(r"^[\w.]+:[\w]+$", module)):
        problems.append(f"{path}.{kind}.module: {shown(module)} is not 'package.module:Class'; fix it")
    if config.get("mode", "sleep") not in COST_MODES:
        problems.append(f"{path}.{kind}.mode: {shown(config['mode'])} is unknown; use one of: {', '.join(COST_MODES)}")
    for number_key, maximum in (("costMs", MAX_COST_MS), ("selectivity", MAX_SELECTIVITY), ("rate", MAX_RATE)):
        if number_key in config:
            _bounded_number(config, number_key, f"{path}.{kind}.{number_key}", problems, 0, maximum)
    if "sizeMs" in config:
        _bounded_number(config, "sizeMs", f"{path}.{kind}.sizeMs", problems, 0, MAX_INTERVAL_SECONDS * 1000, above=True)
    for int_key, minimum, maximum in (
        ("keys", 1, MAX_KEYS),
        ("limit", 0, 2**63 - 1),
        ("idOffset", 0, 2**63 - 1),
        ("every", 1, 2**31 - 1),
        ("maxLen", 0, 2**63 - 1),
    ):
        if int_key in config:
            _int_field(
                config, int_key, f"{path}.{kind}.{int_key}", problems, default=None, minimum=minimum, maximum=maximum
            )
    if kind == "source" and config.get("type") == "synthetic":
        problems.extend(rate_config_problems(config, f"{path}.source"))
    if kind in ("source", "sink") and "stream" in config:
        stream = config["stream"]
        if not isinstance(stream, str) or not re.fullmatch(STREAM_NAME_PATTERN, stream):
            problems.append(
                f"{path}.{kind}.stream: {shown(stream)} is not a stream name: {STREAM_NAME_RULE} (e.g. out); "
                "its key is under the topology's own prefix"
            )
    if kind == "sink" and "delivery" in config:
        if config.get("type") != "redis-stream":
            problems.append(f"{path}.sink.delivery: only a redis-stream sink has a delivery mode; remove it")
        elif config["delivery"] not in SINK_DELIVERIES:
            problems.append(
                f"{path}.sink.delivery: {shown(config['delivery'])} is unknown; "
                f"use one of: {', '.join(SINK_DELIVERIES)}"
            )
    return kind, config


@dataclass
class _Unresolved:
    """Stream ends that named no vertex: the edges they stand for are missing from the graph."""

    #: some stream's `to` is unknown: an edge into some vertex is missing
    into_unknown: bool = False
    #: some stream's `from` is unknown: an edge out of some vertex is missing
    from_unknown: bool = False
    #: known vertices with a stream out of them to an unknown vertex / into them from one
    has_out: set[str] = field(default_factory=set)
    has_in: set[str] = field(default_factory=set)


def _parse_streams(
    raw: Any, entries: Mapping[str, _Entry], nameless: int, problems: list[str], sizes: _Sizes
) -> tuple[list[Stream], _Unresolved]:
    """Streams as edges (a bad grouping or missing key still makes one) and the ends that named no vertex.
    While some vertex entries have no name, names no vertex has are taken to be theirs and not reported
    again, as long as there are no more distinct such names than nameless entries."""
    unresolved = _Unresolved()
    if raw is None:
        raw = []
    if not isinstance(raw, list) or len(raw) > sizes.streams:
        if isinstance(raw, list):
            problems.append(f"spec.streams: {len(raw)} streams, more than {sizes.streams}; split the topology")
        else:
            problems.append("spec.streams: is not a list; list the edges as {from, to, grouping}")
        unresolved.into_unknown = unresolved.from_unknown = True
        return [], unresolved
    streams: list[Stream] = []
    seen: dict[tuple[str, str], int] = {}
    known = ", ".join(entries) or "none"
    strays = {
        end
        for item in raw
        if isinstance(item, Mapping)
        for end in (item.get("from"), item.get("to"))
        if isinstance(end, str) and end not in entries
    }
    quiet = strays if 0 < len(strays) <= nameless else set()
    for i, item in enumerate(raw):
        path = f"spec.streams[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{path}: is not a mapping; write {{from: a, to: b, grouping: shuffle}}")
            unresolved.into_unknown = unresolved.from_unknown = True
            continue
        src, dst = item.get("from"), item.get("to")
        ends_known = True
        for end, value in (("from", src), ("to", dst)):
            if not entries:
                pass  # spec.vertices is missing or empty, which is reported once
            elif value is None:
                problems.append(f"{path}.{end}: is missing; set it to one of: {known}")
            elif not isinstance(value, str) or value not in entries:
                if not (isinstance(value, str) and value in quiet):
                    problems.append(f"{path}.{end}: unknown vertex {shown(value)}; use one of: {known}")
            else:
                continue
            ends_known = False
        grouping = item.get("grouping", "shuffle")
        if grouping not in GROUPINGS:
            problems.append(f"{path}.grouping: unknown grouping {shown(grouping)}; use one of: {', '.join(GROUPINGS)}")
            grouping = "shuffle"  # a placeholder edge: the structure checks still see the stream
        key = item.get("key")
        if grouping == "fields" and not (isinstance(key, str) and key):
            problems.append(f"{path}.key: fields grouping needs a key; set key to the field to partition by")
        balance = item.get("balance", "load-aware")
        if balance not in BALANCES:
            problems.append(f"{path}.balance: unknown balance {shown(balance)}; use one of: {', '.join(BALANCES)}")
            balance = "load-aware"
        elif "balance" in item and grouping != "shuffle":
            problems.append(
                f"{path}.balance: only a shuffle stream is balanced; remove balance or use grouping shuffle"
            )
        if not ends_known:
            if isinstance(src, str) and src in entries:
                unresolved.has_out.add(src)
            else:
                unresolved.from_unknown = True
            if isinstance(dst, str) and dst in entries:
                unresolved.has_in.add(dst)
            else:
                unresolved.into_unknown = True
            continue
        assert isinstance(src, str) and isinstance(dst, str)
        if src == dst:
            problems.append(f"{path}: stream from {shown(src)} to itself makes a cycle; remove it")
            continue
        if (src, dst) in seen:
            problems.append(f"{path}: duplicate stream {src} -> {dst} (also spec.streams[{seen[src, dst]}]); keep one")
            continue
        seen[src, dst] = i
        streams.append(Stream(src, dst, cast(Grouping, grouping), key if grouping == "fields" else None, balance))
    return streams, unresolved


def _structure_problems(graph: nx.DiGraph, entries: Mapping[str, _Entry], unresolved: _Unresolved) -> list[str]:
    problems: list[str] = []
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = []
    if cycle:
        names = [edge[0] for edge in cycle] + [cycle[0][0]]
        problems.append(
            f"spec.streams: cycle {' -> '.join(names)}; a topology must be a DAG, remove one of these streams"
        )
        return problems
    for name, entry in entries.items():
        path = f"spec.vertices[{entry.index}]"
        kind = entry.kind
        has_in = graph.in_degree(name) > 0 or name in unresolved.has_in
        has_out = graph.out_degree(name) > 0 or name in unresolved.has_out
        if kind == "source" and has_in:
            problems.append(f"{path}: source {shown(name)} has incoming streams; remove them or make it logic")
        if kind == "sink" and has_out:
            problems.append(f"{path}: sink {shown(name)} has outgoing streams; remove them or make it logic")
        if kind in ("logic", "sink") and not has_in and not unresolved.into_unknown:
            problems.append(
                f"{path}: vertex {shown(name)} is unreachable from every source; add a stream into it or remove it"
            )
        if kind == "source" and not has_out and not unresolved.from_unknown:
            problems.append(f"{path}: source {shown(name)} has no outgoing stream; connect it to a vertex")
    kinds = [e.kind for e in entries.values()]
    if "source" not in kinds and None not in kinds:
        problems.append("spec.vertices: no source; add a vertex with a source: block")
    sinks = [
        n for n, e in entries.items() if e.kind != "source" and graph.out_degree(n) == 0 and n not in unresolved.has_out
    ]
    if not sinks and not unresolved.into_unknown:
        problems.append("spec.vertices: no sink; add a vertex with no outgoing stream (e.g. a sink: block)")
    return problems


def _parse_scaling(raw: Any, problems: list[str]) -> ScalingSpec:
    if raw is None:
        return ScalingSpec()
    if not isinstance(raw, Mapping):
        problems.append("spec.scaling: is not a mapping; see the CRD for its fields")
        return ScalingSpec()
    strategy = raw.get("strategy", "stela")
    if strategy not in STRATEGIES:
        problems.append(f"spec.scaling.strategy: {shown(strategy)} is unknown; use one of: {', '.join(STRATEGIES)}")
    migration = raw.get("migration", "ccr")
    if migration not in MIGRATIONS:
        problems.append(f"spec.scaling.migration: {shown(migration)} is unknown; use one of: {', '.join(MIGRATIONS)}")
    rate = raw.get("congestionRate", DEFAULT_CONGESTION_RATE)
    if not _number(rate) or not 1.0 <= rate <= MAX_CONGESTION_RATE:
        problems.append(
            f"spec.scaling.congestionRate: {shown(rate)} must be a number in [1, {MAX_CONGESTION_RATE}] "
            "(the paper uses 1.2)"
        )
        rate = DEFAULT_CONGESTION_RATE
    window = (
        _int_field(
            raw, "window", "spec.scaling.window", problems, default=DEFAULT_WINDOW, minimum=2, maximum=MAX_WINDOW
        )
        or DEFAULT_WINDOW
    )
    checkpoint_interval = _int_field(
        raw,
        "checkpointIntervalSeconds",
        "spec.scaling.checkpointIntervalSeconds",
        problems,
        default=10,
        minimum=0,
        maximum=MAX_INTERVAL_SECONDS,
    )
    return ScalingSpec(
        strategy=str(strategy),
        migration=str(migration),
        congestion_rate=float(rate),
        window=window,
        checkpoint_interval_s=10 if checkpoint_interval is None else checkpoint_interval,
        auto=_parse_auto(raw.get("auto"), problems),
    )


def _parse_auto(raw: Any, problems: list[str]) -> AutoScalingSpec:
    if raw is None:
        return AutoScalingSpec()
    if not isinstance(raw, Mapping):
        problems.append("spec.scaling.auto: is not a mapping; write {enabled: true, minNodes: 1, maxNodes: 10}")
        return AutoScalingSpec()
    path = "spec.scaling.auto"
    default = AutoScalingSpec()
    min_nodes = _int_field(raw, "minNodes", f"{path}.minNodes", problems, default=1, minimum=1, maximum=MAX_NODES) or 1
    max_nodes = (
        _int_field(raw, "maxNodes", f"{path}.maxNodes", problems, default=20, minimum=1, maximum=MAX_NODES) or 20
    )
    if max_nodes < min_nodes:
        problems.append(f"{path}.maxNodes: {max_nodes} is below minNodes {min_nodes}; raise maxNodes")
    policy = raw.get("policy", default.policy)
    if policy not in AUTOSCALE_POLICIES:
        problems.append(f"{path}.policy: {shown(policy)} is unknown; use one of: {', '.join(AUTOSCALE_POLICIES)}")
    combine = raw.get("combine", default.combine)
    if combine not in AUTOSCALE_COMBINES:
        problems.append(
            f"{path}.combine: {shown(combine)} is unknown; use max (never short of capacity) or min (fewest resources)"
        )
    for flag in ("enabled", "execute"):
        if flag in raw and not isinstance(raw[flag], bool):
            problems.append(f"{path}.{flag}: {shown(raw[flag])} is not a boolean; write true or false")
    stabilization = raw.get("stabilizationSeconds", default.stabilization_s)
    if not _number(stabilization) or not 0 <= stabilization <= MAX_INTERVAL_SECONDS:
        problems.append(
            f"{path}.stabilizationSeconds: {shown(stabilization)} must be a number of seconds in "
            f"[0, {MAX_INTERVAL_SECONDS}] (e.g. 30)"
        )
        stabilization = default.stabilization_s
    thresholds = raw.get("thresholds") or {}
    if not isinstance(thresholds, Mapping):
        problems.append(f"{path}.thresholds: is not a mapping; write {{thetaMin: 0.3, thetaMax: 0.8}}")
        thresholds = {}

    def share(key: str, fallback: float) -> float:
        value = thresholds.get(key, fallback)
        if not _number(value) or not 0.0 < value <= 1.0:
            problems.append(f"{path}.thresholds.{key}: {shown(value)} must be a number in (0, 1]")
            return fallback
        return float(value)

    theta_min, theta_max = share("thetaMin", default.theta_min), share("thetaMax", default.theta_max)
    if theta_min >= theta_max:
        problems.append(f"{path}.thresholds.thetaMin: {theta_min:g} is not below thetaMax {theta_max:g}; lower it")
    low, high = share("low", default.low_threshold), share("high", default.high_threshold)
    if low >= high:
        problems.append(f"{path}.thresholds.low: {low:g} is not below high {high:g}; lower it")
    per_node = None
    if "executorsPerNode" in thresholds:
        per_node = _int_field(
            thresholds,
            "executorsPerNode",
            f"{path}.thresholds.executorsPerNode",
            problems,
            default=None,
            minimum=1,
            maximum=MAX_SLOTS_PER_NODE,
        )
    return AutoScalingSpec(
        enabled=bool(raw.get("enabled", False)),
        policy=str(policy),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        theta_min=theta_min,
        theta_max=theta_max,
        combine=str(combine),
        capacity_threshold=share("capacity", default.capacity_threshold),
        executors_per_node=per_node,
        high_threshold=high,
        low_threshold=low,
        stabilization_s=float(stabilization),
        execute=bool(raw.get("execute", True)),
    )


def parse_cpu(value: Any) -> float:
    """A Kubernetes CPU quantity ("2", "500m", 1.5) in cores. Raises ValueError when it is not one."""
    if _number(value):
        return float(value)
    match = _CPU_RE.match(str(value).strip())
    if not match:
        raise ValueError(f"{shown(value)} is not a CPU quantity")
    number = float(match.group(1))
    return number / 1000.0 if match.group(3) else number


def _parse_node_cpu(raw: Any, problems: list[str]) -> float | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append("spec.resources: is not a mapping; write {limits: {cpu: '1'}}")
        return None
    limits = raw.get("limits")
    if limits is None:
        return None
    if not isinstance(limits, Mapping):
        problems.append(f"spec.resources.limits: {shown(limits)} is not a mapping; write limits: {{cpu: '2'}}")
        return None
    cpu = limits.get("cpu")
    if cpu is None:
        return None
    try:
        cores = parse_cpu(cpu)
    except ValueError:
        problems.append(f"spec.resources.limits.cpu: {shown(cpu)} is not a CPU quantity; write e.g. '2' or '500m'")
        return None
    if not math.isfinite(cores) or not 0 < cores <= MAX_NODE_CPU:
        problems.append(f"spec.resources.limits.cpu: {shown(cpu)} must be above 0 and at most {MAX_NODE_CPU} cores")
        return None
    return cores
