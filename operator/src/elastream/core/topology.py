"""The StreamTopology manifest as a typed, validated model over a networkx DiGraph.

`parse_manifest` takes the same YAML document users `kubectl apply` and returns a `Topology`, or raises
`TopologyError` listing every problem found, each naming the field (``spec.vertices[2].parallelism``) and
the fix. Nothing downstream re-validates: a `Topology` is always a DAG whose sources and sinks are known.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, cast

import networkx as nx
import yaml

API_VERSION = "elastream.dev/v1alpha1"
KIND = "StreamTopology"
GROUPINGS = ("shuffle", "fields", "all", "global")
Grouping = Literal["shuffle", "fields", "all", "global"]
VertexKind = Literal["source", "logic", "sink"]
DEFAULT_MAX_PARALLELISM = 128
DEFAULT_SLOTS_PER_NODE = 4
STRATEGIES = ("stela", "round-robin", "least-link-load", "random")
MIGRATIONS = ("ccr", "dcr", "restart")
AUTOSCALE_POLICIES = ("autoscale", "rules")
#: the built-in operators of the runtime (`elastream.runtime.operators` implements exactly these)
SOURCE_TYPES = ("synthetic", "redis-stream")
LOGIC_BUILTINS = ("work", "filter", "count", "window")
SINK_TYPES = ("redis-stream", "log", "null")
COST_MODES = ("sleep", "spin")
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CPU_RE = re.compile(r"^(\d+(\.\d+)?)(m?)$")


class TopologyError(ValueError):
    """A manifest is invalid. `problems` holds one line per problem: "<field>: <what>; <fix>"."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems) if self.problems else "invalid topology")

    def __str__(self) -> str:
        return "\n".join(self.problems)


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


@dataclass(frozen=True)
class ScalingSpec:
    strategy: str = "stela"
    migration: str = "ccr"
    congestion_rate: float = 1.2
    window: int = 20
    #: seconds between periodic checkpoints (aligned barriers; what `restart` and a failed worker roll back
    #: to); 0 disables them
    checkpoint_interval_s: int = 10
    auto_enabled: bool = False
    min_nodes: int = 1
    max_nodes: int = 20
    policy: str = "autoscale"


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
    image: str | None = None
    spec: Mapping[str, Any] = field(default_factory=dict)

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
        return f"elastream:{self.namespace}/{self.name}:"

    def with_nodes(self, nodes: int) -> Topology:
        """The same topology asked to run on `nodes` nodes (what a scale request changes)."""
        if nodes < 1:
            raise TopologyError([f"spec.nodes: {nodes} is below 1; ask for at least 1 node"])
        return _replace(self, nodes=nodes)


def _replace(topology: Topology, **changes: Any) -> Topology:
    import dataclasses

    return dataclasses.replace(topology, **changes)


def executor_id(vertex: str, index: int) -> str:
    return f"{vertex}#{index}"


def split_executor_id(executor: str) -> tuple[str, int]:
    vertex, _, index = executor.rpartition("#")
    if not vertex or not index.isdigit():
        raise ValueError(f"executor id {executor!r} is not of the form <vertex>#<index>")
    return vertex, int(index)


def load_manifest(path: str) -> Topology:
    """Read a YAML file holding one StreamTopology document and parse it."""
    try:
        with open(path, encoding="utf-8") as handle:
            documents = [d for d in yaml.safe_load_all(handle) if d is not None]
    except OSError as exc:
        raise TopologyError([f"{path}: cannot read ({exc.strerror}); check the path"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise TopologyError([f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})"]) from None
    kinds = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if len(kinds) != 1:
        raise TopologyError([f"{path}: holds {len(kinds)} {KIND} documents; put exactly one {KIND} in the file"])
    return parse_manifest(kinds[0])


def parse_manifest(document: Mapping[str, Any]) -> Topology:
    """Validate a StreamTopology document (as a dict) and build the model. Raises `TopologyError`."""
    problems: list[str] = []
    if not isinstance(document, Mapping):
        raise TopologyError(["manifest: is not a mapping; write a StreamTopology YAML document"])
    if document.get("apiVersion") not in (None, API_VERSION):
        problems.append(f"apiVersion: {document.get('apiVersion')!r} is not served; use {API_VERSION}")
    if document.get("kind") not in (None, KIND):
        problems.append(f"kind: {document.get('kind')!r} is not {KIND}; set kind: {KIND}")
    metadata = document.get("metadata") or {}
    name = str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""
    namespace = str(metadata.get("namespace", "default")) if isinstance(metadata, Mapping) else "default"
    if not _NAME_RE.match(name):
        problems.append(f"metadata.name: {name!r} is not a DNS-1123 label; use lower-case letters, digits and '-'")
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        raise TopologyError([*problems, "spec: is missing; add spec.vertices and spec.streams"])

    nodes = _int_field(spec, "nodes", "spec.nodes", problems, default=1, minimum=1)
    slots = _int_field(spec, "slotsPerNode", "spec.slotsPerNode", problems, default=DEFAULT_SLOTS_PER_NODE, minimum=1)
    vertices = _parse_vertices(spec.get("vertices"), problems)
    streams = _parse_streams(spec.get("streams"), vertices, problems)
    scaling = _parse_scaling(spec.get("scaling"), problems)
    node_cpu = _parse_node_cpu(spec.get("resources"), problems)

    graph: nx.DiGraph = nx.DiGraph()
    for vertex in vertices.values():
        graph.add_node(vertex.name)
    for stream in streams:
        graph.add_edge(stream.src, stream.dst, stream=stream)
    order: tuple[str, ...] = ()
    if vertices:
        problems.extend(_structure_problems(graph, vertices))
        if nx.is_directed_acyclic_graph(graph):
            position = {name: i for i, name in enumerate(vertices)}
            order = tuple(nx.lexicographical_topological_sort(graph, key=position.__getitem__))
    total = sum(v.parallelism for v in vertices.values())
    if nodes is not None and slots is not None and vertices and total > nodes * slots:
        need_slots = -(-total // nodes)
        need_nodes = -(-total // slots)
        problems.append(
            f"spec.slotsPerNode: {nodes} nodes × {slots} slots = {nodes * slots} slots for {total} executors; "
            f"raise spec.slotsPerNode to {need_slots} or spec.nodes to {need_nodes}"
        )
    if problems:
        raise TopologyError(problems)
    assert nodes is not None and slots is not None
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
        image=cast(str | None, spec.get("image")),
        spec=dict(spec),
    )


def _int_field(
    block: Mapping[str, Any],
    key: str,
    path: str,
    problems: list[str],
    *,
    default: int | None,
    minimum: int,
) -> int | None:
    value = block.get(key, default)
    if value is None:
        problems.append(f"{path}: is missing; set it to an integer ≥ {minimum}")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{path}: {value!r} is not an integer; set it to an integer ≥ {minimum}")
        return None
    if value < minimum:
        problems.append(f"{path}: {value} is below {minimum}; set it to at least {minimum}")
        return None
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _parse_vertices(raw: Any, problems: list[str]) -> dict[str, Vertex]:
    if not isinstance(raw, list) or not raw:
        problems.append("spec.vertices: is missing or empty; list the vertices of the DAG")
        return {}
    vertices: dict[str, Vertex] = {}
    for i, item in enumerate(raw):
        path = f"spec.vertices[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{path}: is not a mapping; write {{name: ..., logic: ...}}")
            continue
        name = item.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            problems.append(f"{path}.name: {name!r} is not a valid name; use lower-case letters, digits, '-'")
            continue
        if name in vertices:
            problems.append(f"{path}.name: duplicate vertex {name!r}; give every vertex a unique name")
            continue
        blocks = [k for k in ("source", "logic", "sink") if k in item]
        if len(blocks) != 1:
            problems.append(f"{path}: vertex {name!r} has {blocks or 'none'} of source/logic/sink; give it exactly one")
            continue
        kind = cast(VertexKind, blocks[0])
        config = item[kind]
        if not isinstance(config, Mapping):
            problems.append(f"{path}.{kind}: is not a mapping; write e.g. {{builtin: work, costMs: 1}}")
            continue
        if kind == "logic" and not ({"builtin", "module"} & set(config)):
            problems.append(f"{path}.logic: names no code; set logic.builtin or logic.module (module:Class)")
        if kind in ("source", "sink") and "type" not in config and "module" not in config:
            problems.append(f"{path}.{kind}: has no type; set {kind}.type (e.g. synthetic, redis-stream)")
        known = {"source": SOURCE_TYPES, "logic": LOGIC_BUILTINS, "sink": SINK_TYPES}[kind]
        name_key = "builtin" if kind == "logic" else "type"
        if name_key in config and config[name_key] not in known:
            problems.append(
                f"{path}.{kind}.{name_key}: {config[name_key]!r} is unknown; use one of: {', '.join(known)} "
                f"or {kind}.module: package.module:Class"
            )
        module = config.get("module")
        if module is not None and (not isinstance(module, str) or not re.match(r"^[\w.]+:[\w]+$", module)):
            problems.append(f"{path}.{kind}.module: {module!r} is not 'package.module:Class'; fix it")
        if config.get("mode", "sleep") not in COST_MODES:
            problems.append(f"{path}.{kind}.mode: {config['mode']!r} is unknown; use one of: {', '.join(COST_MODES)}")
        for number_key, minimum in (("costMs", 0.0), ("selectivity", 0.0), ("rate", 0.0)):
            if number_key in config and (not _number(config[number_key]) or config[number_key] < minimum):
                problems.append(
                    f"{path}.{kind}.{number_key}: {config[number_key]!r} is not a number ≥ {minimum:g}; fix it"
                )
        before = len(problems)
        max_par = _int_field(
            item,
            "maxParallelism",
            f"{path}.maxParallelism",
            problems,
            default=DEFAULT_MAX_PARALLELISM,
            minimum=1,
        )
        par = _int_field(item, "parallelism", f"{path}.parallelism", problems, default=1, minimum=1)
        if len(problems) > before or par is None or max_par is None:
            continue
        if par > max_par:
            problems.append(
                f"{path}.parallelism: {par} exceeds maxParallelism {max_par}; "
                f"lower parallelism or raise maxParallelism to ≥ {par}"
            )
            continue
        stateful = item.get("stateful", False)
        if not isinstance(stateful, bool):
            problems.append(f"{path}.stateful: {stateful!r} is not true/false; fix it")
            continue
        vertices[name] = Vertex(name, kind, par, max_par, stateful, dict(config))
    return vertices


def _parse_streams(raw: Any, vertices: Mapping[str, Vertex], problems: list[str]) -> list[Stream]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        problems.append("spec.streams: is not a list; list the edges as {from, to, grouping}")
        return []
    streams: list[Stream] = []
    seen: set[tuple[str, str]] = set()
    known = ", ".join(vertices) or "none"
    for i, item in enumerate(raw):
        path = f"spec.streams[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{path}: is not a mapping; write {{from: a, to: b, grouping: shuffle}}")
            continue
        src, dst = item.get("from"), item.get("to")
        bad = False
        for end, value in (("from", src), ("to", dst)):
            if value not in vertices:
                problems.append(f"{path}.{end}: unknown vertex {value!r}; use one of: {known}")
                bad = True
        grouping = item.get("grouping", "shuffle")
        if grouping not in GROUPINGS:
            problems.append(f"{path}.grouping: unknown grouping {grouping!r}; use one of: {', '.join(GROUPINGS)}")
            bad = True
        key = item.get("key")
        if grouping == "fields" and not (isinstance(key, str) and key):
            problems.append(f"{path}.key: fields grouping needs a key; set key to the field to partition by")
            bad = True
        if bad:
            continue
        assert isinstance(src, str) and isinstance(dst, str)
        if src == dst:
            problems.append(f"{path}: stream from {src!r} to itself makes a cycle; remove it")
            continue
        if (src, dst) in seen:
            problems.append(f"{path}: duplicate stream {src} -> {dst}; keep one")
            continue
        seen.add((src, dst))
        streams.append(Stream(src, dst, cast(Grouping, grouping), key if grouping == "fields" else None))
    return streams


def _structure_problems(graph: nx.DiGraph, vertices: Mapping[str, Vertex]) -> list[str]:
    problems: list[str] = []
    index = {name: i for i, name in enumerate(vertices)}
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
    for name, vertex in vertices.items():
        path = f"spec.vertices[{index[name]}]"
        has_in, has_out = graph.in_degree(name) > 0, graph.out_degree(name) > 0
        if vertex.kind == "source" and has_in:
            problems.append(f"{path}: source {name!r} has incoming streams; remove them or make it logic")
        if vertex.kind == "sink" and has_out:
            problems.append(f"{path}: sink {name!r} has outgoing streams; remove them or make it logic")
        if vertex.kind != "source" and not has_in:
            problems.append(
                f"{path}: vertex {name!r} is unreachable from every source; add a stream into it or remove it"
            )
        if vertex.kind == "source" and not has_out:
            problems.append(f"{path}: source {name!r} has no outgoing stream; connect it to a vertex")
    if not any(v.kind == "source" for v in vertices.values()):
        problems.append("spec.vertices: no source; add a vertex with a source: block")
    if not any(v.kind != "source" and graph.out_degree(n) == 0 for n, v in vertices.items()):
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
        problems.append(f"spec.scaling.strategy: {strategy!r} is unknown; use one of: {', '.join(STRATEGIES)}")
    migration = raw.get("migration", "ccr")
    if migration not in MIGRATIONS:
        problems.append(f"spec.scaling.migration: {migration!r} is unknown; use one of: {', '.join(MIGRATIONS)}")
    rate = raw.get("congestionRate", 1.2)
    if not _number(rate) or rate < 1.0:
        problems.append(f"spec.scaling.congestionRate: {rate!r} must be a number ≥ 1.0 (the paper uses 1.2)")
        rate = 1.2
    window = _int_field(raw, "window", "spec.scaling.window", problems, default=20, minimum=2) or 20
    checkpoint_interval = _int_field(
        raw, "checkpointIntervalSeconds", "spec.scaling.checkpointIntervalSeconds", problems, default=10, minimum=0
    )
    auto = raw.get("auto") or {}
    if not isinstance(auto, Mapping):
        problems.append("spec.scaling.auto: is not a mapping; write {enabled: true, minNodes: 1, maxNodes: 10}")
        auto = {}
    min_nodes = _int_field(auto, "minNodes", "spec.scaling.auto.minNodes", problems, default=1, minimum=1) or 1
    max_nodes = _int_field(auto, "maxNodes", "spec.scaling.auto.maxNodes", problems, default=20, minimum=1) or 20
    if max_nodes < min_nodes:
        problems.append(f"spec.scaling.auto.maxNodes: {max_nodes} is below minNodes {min_nodes}; raise maxNodes")
    policy = auto.get("policy", "autoscale")
    if policy not in AUTOSCALE_POLICIES:
        problems.append(f"spec.scaling.auto.policy: {policy!r} is unknown; use one of: {', '.join(AUTOSCALE_POLICIES)}")
    return ScalingSpec(
        strategy=str(strategy),
        migration=str(migration),
        congestion_rate=float(rate),
        window=window,
        checkpoint_interval_s=10 if checkpoint_interval is None else checkpoint_interval,
        auto_enabled=bool(auto.get("enabled", False)),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        policy=str(policy),
    )


def parse_cpu(value: Any) -> float:
    """A Kubernetes CPU quantity ("2", "500m", 1.5) in cores. Raises ValueError when it is not one."""
    if _number(value):
        return float(value)
    match = _CPU_RE.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a CPU quantity")
    number = float(match.group(1))
    return number / 1000.0 if match.group(3) else number


def _parse_node_cpu(raw: Any, problems: list[str]) -> float | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append("spec.resources: is not a mapping; write {limits: {cpu: '1'}}")
        return None
    limits = raw.get("limits") or {}
    cpu = limits.get("cpu") if isinstance(limits, Mapping) else None
    if cpu is None:
        return None
    try:
        cores = parse_cpu(cpu)
    except ValueError:
        problems.append(f"spec.resources.limits.cpu: {cpu!r} is not a CPU quantity; write e.g. '2' or '500m'")
        return None
    if cores <= 0:
        problems.append(f"spec.resources.limits.cpu: {cpu!r} must be above 0")
        return None
    return cores
