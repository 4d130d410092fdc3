"""`parse_manifest`: a StreamTopology document to a `Topology`, or `TopologyError` listing every problem, each
naming its field (``spec.vertices[2].parallelism``) and the fix. Nothing downstream re-validates: a
`Topology` is always a DAG whose sources and sinks are known."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import networkx as nx

from elastream.core.rates import MAX_RATE, rate_config_problems, shown
from elastream.core.savepoints import parse_deletion_policy, parse_initial_savepoint
from elastream.core.topology.document import _shape_problem, read_manifest_document
from elastream.core.topology.fields import _bounded_number, _int_field
from elastream.core.topology.limits import (
    _NAME_RE,
    API_VERSION,
    BALANCES,
    COST_MODES,
    DEFAULT_MAX_PARALLELISM,
    DEFAULT_SLOTS_PER_NODE,
    GROUPINGS,
    KIND,
    LOGIC_BUILTINS,
    MAX_COST_MS,
    MAX_EXECUTORS,
    MAX_INTERVAL_SECONDS,
    MAX_KEYS,
    MAX_NODES,
    MAX_PARALLELISM,
    MAX_SELECTIVITY,
    MAX_SLOTS_PER_NODE,
    MAX_STREAMS,
    MAX_VERTICES,
    SINK_DELIVERIES,
    SINK_TYPES,
    SOURCE_TYPES,
    STREAM_NAME_PATTERN,
    STREAM_NAME_RULE,
    Grouping,
    VertexKind,
)
from elastream.core.topology.model import Stream, Topology, TopologyError, Vertex
from elastream.core.topology.scaling import _parse_node_cpu, _parse_scaling


def load_manifest(path: str) -> Topology:
    """Read a YAML file holding one StreamTopology document and parse it."""
    return parse_manifest(read_manifest_document(path))


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
    name, namespace = _parse_header(document, problems)
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
    suspend = _parse_suspend(spec.get("suspend", False), problems)
    initial_savepoint = parse_initial_savepoint(spec.get("initialSavepoint"), namespace, name, problems)
    deletion_policy = parse_deletion_policy(spec.get("deletionPolicy"), problems)

    graph, order = _graph(entries, streams, unresolved, problems)
    problems.extend(_slot_problems(entries, nodes, slots, sizes))
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
        suspend=suspend,
        initial_savepoint=initial_savepoint,
        deletion_policy=deletion_policy,
    )


def _parse_header(document: Mapping[str, Any], problems: list[str]) -> tuple[str, str]:
    """apiVersion and kind checked; metadata's name and namespace ("" and "default" when they are wrong)."""
    if document.get("apiVersion") not in (None, API_VERSION):
        problems.append(f"apiVersion: {shown(document.get('apiVersion'))} is not served; use {API_VERSION}")
    if document.get("kind") not in (None, KIND):
        problems.append(f"kind: {shown(document.get('kind'))} is not {KIND}; set kind: {KIND}")
    metadata = document.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        problems.append("metadata: is not a mapping; write metadata: {name: my-topology}")
        return "", "default"
    raw_name, raw_namespace = metadata.get("name", ""), metadata.get("namespace", "default")
    name = raw_name if isinstance(raw_name, str) else ""
    namespace = raw_namespace if isinstance(raw_namespace, str) and raw_namespace else "default"
    if not isinstance(raw_namespace, str) or not _NAME_RE.match(namespace):
        problems.append(f"metadata.namespace: {shown(raw_namespace)} is not a DNS-1123 label; fix it")
    if not isinstance(raw_name, str):
        problems.append(f"metadata.name: {shown(raw_name)} is not a string; use a DNS-1123 label")
    elif not _NAME_RE.match(name):
        problems.append(f"metadata.name: {shown(name)} is not a DNS-1123 label; use lower-case letters, digits and '-'")
    return name, namespace


def _parse_suspend(suspend: Any, problems: list[str]) -> bool:
    if suspend is None:  # `suspend: null` (or removed by a merge patch) means not suspended
        return False
    if not isinstance(suspend, bool):
        problems.append(f"spec.suspend: {shown(suspend)} is not true/false; set true to suspend, false to resume")
    return suspend is True


def _graph(
    entries: Mapping[str, _Entry], streams: list[Stream], unresolved: _Unresolved, problems: list[str]
) -> tuple[nx.DiGraph, tuple[str, ...]]:
    """The vertices and streams as a DiGraph, its structure checked, and its topological order (manifest
    order among peers; empty when the graph has a cycle)."""
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
    return graph, order


def _slot_problems(entries: Mapping[str, _Entry], nodes: int | None, slots: int | None, sizes: _Sizes) -> list[str]:
    """Too many executors in all, or more than the nodes' slots. Counted over the vertices whose parallelism
    is known: a lower bound when some are not, so a slot shortage reported here is real."""
    total = sum(e.parallelism for e in entries.values() if e.parallelism is not None)
    at_least = "at least " if any(e.parallelism is None for e in entries.values()) else ""
    if total > sizes.executors:
        return [
            f"spec.vertices: {at_least}{total} executors in all (the sum of parallelism), more than "
            f"{sizes.executors}; lower the vertices' parallelism"
        ]
    if nodes is None or slots is None or not entries or total <= nodes * slots:
        return []
    need_slots = -(-total // nodes)
    need_nodes = -(-total // slots)
    return [
        f"spec.slotsPerNode: {nodes} nodes × {slots} slots = {nodes * slots} slots for {at_least}{total} "
        f"executors; raise spec.slotsPerNode to {at_least}{need_slots} or spec.nodes to {at_least}{need_nodes}"
    ]


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
        name, unnamed = _vertex_name(item, path, entries, problems)
        nameless += unnamed
        if name is not None:
            entries[name] = _parse_vertex(item, name, i, problems, sizes)
    return entries, nameless


def _vertex_name(item: Any, path: str, entries: Mapping[str, _Entry], problems: list[str]) -> tuple[str | None, bool]:
    """The entry's name, or None when it has no usable one (then whether it counts as nameless: a duplicate
    name does not, its streams are the first vertex's)."""
    if not isinstance(item, Mapping):
        problems.append(f"{path}: is not a mapping; write {{name: ..., logic: ...}}")
        return None, True
    name = item.get("name")
    if name is None:
        problems.append(f"{path}.name: is missing; give the vertex a name (lower-case letters, digits, '-')")
        return None, True
    if not isinstance(name, str):
        problems.append(f"{path}.name: {shown(name)} is not a string; use lower-case letters, digits, '-'")
        return None, True
    if name in entries:
        problems.append(
            f"{path}.name: duplicate vertex {shown(name)} (also spec.vertices[{entries[name].index}]); "
            "give every vertex a unique name"
        )
        return None, False
    return name, False


def _parse_vertex(item: Mapping[str, Any], name: str, index: int, problems: list[str], sizes: _Sizes) -> _Entry:
    """One named vertex: its `Vertex`, or a placeholder entry when one of its own fields is wrong."""
    path = f"spec.vertices[{index}]"
    before = len(problems)
    if not _NAME_RE.match(name):
        problems.append(f"{path}.name: {shown(name)} is not a valid name; use lower-case letters, digits, '-'")
    kind, config = _vertex_block(item, name, path, problems)
    par, max_par = _parallelism(item, path, problems, sizes)
    stateful = item.get("stateful", False)
    if not isinstance(stateful, bool):
        problems.append(f"{path}.stateful: {shown(stateful)} is not true/false; fix it")
    vertex: Vertex | None = None
    if len(problems) == before:
        assert kind is not None and config is not None and par is not None and max_par is not None
        vertex = Vertex(name, kind, par, max_par, stateful, dict(config))
    return _Entry(index, kind, par, vertex)


def _parallelism(
    item: Mapping[str, Any], path: str, problems: list[str], sizes: _Sizes
) -> tuple[int | None, int | None]:
    """parallelism and maxParallelism (None when wrong; parallelism too when it exceeds maxParallelism). The
    CRD's CEL rule says it too, without the values (a messageExpression with them costs more than the API server
    allows): the model needs it, since the slot count and the key groups read a vertex's parallelism."""
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
    return par, max_par


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
    where = f"{path}.{kind}"
    _block_code(kind, config, where, problems)
    _block_numbers(config, where, problems)
    _block_io(kind, config, where, problems)
    return kind, config


def _block_code(kind: VertexKind, config: Mapping[str, Any], where: str, problems: list[str]) -> None:
    """What runs the vertex: a built-in (logic.builtin, source/sink.type) or a user class (module)."""
    if kind == "logic" and not ({"builtin", "module"} & set(config)):
        problems.append(f"{where}: names no code; set logic.builtin or logic.module (module:Class)")
    if kind in ("source", "sink") and "type" not in config and "module" not in config:
        problems.append(f"{where}: has no type; set {kind}.type (e.g. synthetic, redis-stream)")
    known = {"source": SOURCE_TYPES, "logic": LOGIC_BUILTINS, "sink": SINK_TYPES}[kind]
    name_key = "builtin" if kind == "logic" else "type"
    if name_key in config and config[name_key] not in known:
        problems.append(
            f"{where}.{name_key}: {shown(config[name_key])} is unknown; use one of: {', '.join(known)} "
            f"or {kind}.module: package.module:Class"
        )
    module = config.get("module")
    if module is not None and (not isinstance(module, str) or not re.match(r"^[\w.]+:[\w]+$", module)):
        problems.append(f"{where}.module: {shown(module)} is not 'package.module:Class'; fix it")


#: a block's integer settings with their bounds
_BLOCK_INTS = (
    ("keys", 1, MAX_KEYS),
    ("limit", 0, 2**63 - 1),
    ("idOffset", 0, 2**63 - 1),
    ("every", 1, 2**31 - 1),
    ("maxLen", 0, 2**63 - 1),
)


def _block_numbers(config: Mapping[str, Any], where: str, problems: list[str]) -> None:
    """The block's cost mode and its bounded numbers."""
    if config.get("mode", "sleep") not in COST_MODES:
        problems.append(f"{where}.mode: {shown(config['mode'])} is unknown; use one of: {', '.join(COST_MODES)}")
    for number_key, maximum in (("costMs", MAX_COST_MS), ("selectivity", MAX_SELECTIVITY), ("rate", MAX_RATE)):
        if number_key in config:
            _bounded_number(config, number_key, f"{where}.{number_key}", problems, 0, maximum)
    if "sizeMs" in config:
        _bounded_number(config, "sizeMs", f"{where}.sizeMs", problems, 0, MAX_INTERVAL_SECONDS * 1000, above=True)
    for int_key, minimum, maximum in _BLOCK_INTS:
        if int_key in config:
            _int_field(config, int_key, f"{where}.{int_key}", problems, default=None, minimum=minimum, maximum=maximum)


def _block_io(kind: VertexKind, config: Mapping[str, Any], where: str, problems: list[str]) -> None:
    """A synthetic source's rate profile, a source's or sink's Redis stream and a sink's delivery mode."""
    if kind == "source" and config.get("type") == "synthetic":
        problems.extend(rate_config_problems(config, where))
    if kind in ("source", "sink") and "stream" in config:
        stream = config["stream"]
        if not isinstance(stream, str) or not re.fullmatch(STREAM_NAME_PATTERN, stream):
            problems.append(
                f"{where}.stream: {shown(stream)} is not a stream name: {STREAM_NAME_RULE} (e.g. out); "
                "its key is under the topology's own prefix"
            )
    if kind == "sink" and "delivery" in config:
        if config.get("type") != "redis-stream":
            problems.append(f"{where}.delivery: only a redis-stream sink has a delivery mode; remove it")
        elif config["delivery"] not in SINK_DELIVERIES:
            problems.append(
                f"{where}.delivery: {shown(config['delivery'])} is unknown; use one of: {', '.join(SINK_DELIVERIES)}"
            )


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

    def everything(self) -> None:
        """Any edge may be missing (the streams could not be read at all)."""
        self.into_unknown = self.from_unknown = True

    def note(self, src: Any, dst: Any, entries: Mapping[str, _Entry]) -> None:
        """A stream with an unknown end: its known end keeps the edge it has, the unknown one may be any."""
        if isinstance(src, str) and src in entries:
            self.has_out.add(src)
        else:
            self.from_unknown = True
        if isinstance(dst, str) and dst in entries:
            self.has_in.add(dst)
        else:
            self.into_unknown = True


@dataclass(frozen=True)
class _StreamContext:
    """What every stream of one manifest is checked against."""

    entries: Mapping[str, _Entry]
    #: the known vertex names, as problem lines list them
    known: str
    #: unknown names taken to be those of nameless vertex entries, not reported again
    quiet: set[str]


def _stream_context(raw: list[Any], entries: Mapping[str, _Entry], nameless: int) -> _StreamContext:
    strays = {
        end
        for item in raw
        if isinstance(item, Mapping)
        for end in (item.get("from"), item.get("to"))
        if isinstance(end, str) and end not in entries
    }
    quiet = strays if 0 < len(strays) <= nameless else set()
    return _StreamContext(entries, ", ".join(entries) or "none", quiet)


def _parse_streams(
    raw: Any, entries: Mapping[str, _Entry], nameless: int, problems: list[str], sizes: _Sizes
) -> tuple[list[Stream], _Unresolved]:
    """Streams as edges (a bad grouping or missing key still makes one) and the ends that named no vertex.
    While some vertex entries have no name, names no vertex has are taken to be theirs and not reported
    again, as long as there are no more distinct such names than nameless entries."""
    unresolved = _Unresolved()
    raw = [] if raw is None else raw
    if not isinstance(raw, list):
        problems.append("spec.streams: is not a list; list the edges as {from, to, grouping}")
        unresolved.everything()
        return [], unresolved
    if len(raw) > sizes.streams:
        problems.append(f"spec.streams: {len(raw)} streams, more than {sizes.streams}; split the topology")
        unresolved.everything()
        return [], unresolved
    context = _stream_context(raw, entries, nameless)
    streams: list[Stream] = []
    seen: dict[tuple[str, str], int] = {}
    for i, item in enumerate(raw):
        stream = _parse_stream(item, f"spec.streams[{i}]", context, problems, unresolved)
        if stream is None:
            continue
        if (stream.src, stream.dst) in seen:
            first = seen[stream.src, stream.dst]
            problems.append(
                f"spec.streams[{i}]: duplicate stream {stream.src} -> {stream.dst} (also spec.streams[{first}]); "
                "keep one"
            )
            continue
        seen[stream.src, stream.dst] = i
        streams.append(stream)
    return streams, unresolved


def _parse_stream(
    item: Any, path: str, context: _StreamContext, problems: list[str], unresolved: _Unresolved
) -> Stream | None:
    """One stream as an edge, or None when it makes none (an unknown end, a self-loop, not a mapping)."""
    if not isinstance(item, Mapping):
        problems.append(f"{path}: is not a mapping; write {{from: a, to: b, grouping: shuffle}}")
        unresolved.everything()
        return None
    src, dst = item.get("from"), item.get("to")
    ends_known = _stream_end(src, f"{path}.from", context, problems)
    ends_known = _stream_end(dst, f"{path}.to", context, problems) and ends_known
    grouping, key, balance = _stream_options(item, path, problems)
    if not ends_known:
        unresolved.note(src, dst, context.entries)
        return None
    assert isinstance(src, str) and isinstance(dst, str)
    if src == dst:
        problems.append(f"{path}: stream from {shown(src)} to itself makes a cycle; remove it")
        return None
    return Stream(src, dst, grouping, key, balance)


def _stream_end(value: Any, path: str, context: _StreamContext, problems: list[str]) -> bool:
    """Whether a stream end names a vertex; a problem line when it does not (none while spec.vertices is
    missing or empty, which is reported once, or for a name taken to be a nameless vertex's)."""
    if isinstance(value, str) and value in context.entries:
        return True
    if not context.entries:
        pass
    elif value is None:
        problems.append(f"{path}: is missing; set it to one of: {context.known}")
    elif not (isinstance(value, str) and value in context.quiet):
        problems.append(f"{path}: unknown vertex {shown(value)}; use one of: {context.known}")
    return False


def _stream_options(item: Mapping[str, Any], path: str, problems: list[str]) -> tuple[Grouping, str | None, str]:
    """A stream's grouping, key (fields grouping only) and balance; a bad grouping or balance becomes the
    default, so the stream still stands as a (placeholder) edge for the structure checks."""
    grouping = item.get("grouping", "shuffle")
    if grouping not in GROUPINGS:
        problems.append(f"{path}.grouping: unknown grouping {shown(grouping)}; use one of: {', '.join(GROUPINGS)}")
        grouping = "shuffle"
    key = item.get("key")
    if grouping == "fields" and not (isinstance(key, str) and key):
        problems.append(f"{path}.key: fields grouping needs a key; set key to the field to partition by")
    balance = item.get("balance", "load-aware")
    if balance not in BALANCES:  # that only a shuffle stream has one is the CRD's CEL rule
        problems.append(f"{path}.balance: unknown balance {shown(balance)}; use one of: {', '.join(BALANCES)}")
        balance = "load-aware"
    return cast(Grouping, grouping), key if grouping == "fields" else None, balance


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
