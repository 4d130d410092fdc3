"""`parse_manifest`: a StreamTopology document that satisfies the CRD to a `Topology`, or `TopologyError` listing
every problem, each naming its field (``spec.streams[2].to``) and the fix. Nothing downstream re-validates: a
`Topology` is always a DAG whose sources and sinks are known.

The CRD (its schema and CEL rules) is the contract, and a rule is written once, there: types, ranges, enums,
patterns, "one block per vertex", "fields needs a key", "parallelism within maxParallelism". The API server
checks it for the operator; `elastream.crd.check_manifest` checks it wherever else a manifest enters (the
CLI's files, a worker's topology file, a ConfigMap's spec). This parser keeps what the CRD does not say: the
graph (stream ends naming vertices, cycles, duplicates, reachability, sources and sinks), slots, unique vertex
names, a vertex naming its code, a delivery mode only on a redis-stream, kafka or user sink, rate profiles, the
header, and the savepoint reference. Given a document the CRD refuses, it reports what it finds and never raises
anything but `TopologyError`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import networkx as nx

from elastream.core.rates import rate_config_problems, shown
from elastream.core.savepoint_rules import DEFAULT_DELETION_POLICY, parse_initial_savepoint
from elastream.core.topology.document import shape_problem
from elastream.core.topology.limits import (
    _NAME_RE,
    API_VERSION,
    DEFAULT_MAX_PARALLELISM,
    DEFAULT_SLOTS_PER_NODE,
    KIND,
    MAX_EXECUTORS,
    MAX_INT64,
    Grouping,
    VertexKind,
)
from elastream.core.topology.model import ScalingSpec, Stream, Topology, TopologyError, Vertex
from elastream.core.topology.scaling import _parse_node_cpu, _parse_scaling


def parse_manifest(document: Mapping[str, Any], *, bounded: bool = True) -> Topology:
    """Validate a StreamTopology document (as a dict) and build the model. Raises `TopologyError`.

    `bounded=False` is for topologies a program builds, never for a manifest someone wrote: the simulator's
    and the benchmarks' thousands of vertices. It lifts MAX_EXECUTORS and the document bounds (the CRD's own
    maxima are not checked here).

    One mistake gives one problem line. A vertex whose code is not named stays in the graph as a placeholder,
    so the checks around it see the DAG the user meant and add nothing. A stream whose end names no vertex is
    left out; its missing edge could be the one that makes some vertex reachable (or gives a source its
    outgoing stream), so those two checks stay quiet while a stream end is unresolved, and come back once it
    is fixed. Vertices are named by their manifest index (spec.vertices[i]) everywhere."""
    if not isinstance(document, Mapping):
        raise TopologyError(["manifest: is not a mapping; write a StreamTopology YAML document"])
    too_big = shape_problem(document) if bounded else None
    if too_big is not None:
        raise TopologyError([too_big])
    problems: list[str] = []
    try:
        return _parse(document, problems, MAX_EXECUTORS if bounded else None)
    except TopologyError:
        raise
    except Exception:  # a value the CRD refuses (the contract's check names it): a problem line, never a traceback
        raise TopologyError([*problems, CONTRACT_BROKEN]) from None


def default_nodes(scaling: ScalingSpec) -> int:
    """The node count of a spec without `nodes`: the autoscaler's minimum when it scales the topology (it owns
    the field then, as a HorizontalPodAutoscaler owns a Deployment's replicas, so a GitOps manifest leaves it
    out and never fights it), else one."""
    return scaling.auto.min_nodes if scaling.auto.enabled else 1


#: the parser's line for a document whose values are not what the CRD allows (its own checks could not run)
CONTRACT_BROKEN = (
    "manifest: does not satisfy the StreamTopology CRD; run `elastream validate` on it for the field and the fix"
)


def _parse(document: Mapping[str, Any], problems: list[str], max_executors: int | None) -> Topology:
    name, namespace = _parse_header(document, problems)
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        raise TopologyError([*problems, "spec: is missing; add spec.vertices and spec.streams"])
    slots: int = spec.get("slotsPerNode", DEFAULT_SLOTS_PER_NODE)
    entries = _parse_vertices(spec["vertices"], problems)
    streams, unresolved = _parse_streams(spec.get("streams") or [], entries, problems)
    scaling = _parse_scaling(spec.get("scaling"), problems)
    nodes = default_nodes(scaling) if spec.get("nodes") is None else int(spec["nodes"])
    node_cpu = _parse_node_cpu(spec.get("resources"), problems)
    problems.extend(_placement_count_problems(spec.get("placement")))
    initial_savepoint = parse_initial_savepoint(spec.get("initialSavepoint"), namespace, name)

    graph, order = _graph(entries, streams, unresolved, problems)
    problems.extend(_slot_problems(entries, nodes, slots, max_executors))
    if problems:
        raise TopologyError(problems)
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
        suspend=spec.get("suspend") is True,  # `suspend: null` (or removed by a merge patch): not suspended
        initial_savepoint=initial_savepoint,
        deletion_policy=spec.get("deletionPolicy") or DEFAULT_DELETION_POLICY,
    )


def _parse_header(document: Mapping[str, Any], problems: list[str]) -> tuple[str, str]:
    """apiVersion, kind and metadata.namespace checked (the API server's own checks, not the CRD's; the name's
    pattern is the CRD's); metadata's name and namespace ("default" when it is not given)."""
    if document.get("apiVersion") not in (None, API_VERSION):
        problems.append(f"apiVersion: {shown(document.get('apiVersion'))} is not served; use {API_VERSION}")
    if document.get("kind") not in (None, KIND):
        problems.append(f"kind: {shown(document.get('kind'))} is not {KIND}; set kind: {KIND}")
    metadata = document.get("metadata") or {}
    name, namespace = metadata.get("name", ""), metadata.get("namespace") or "default"
    if not isinstance(namespace, str) or not _NAME_RE.match(namespace):
        problems.append(f"metadata.namespace: {shown(namespace)} is not a DNS-1123 label; fix it")
        namespace = "default"
    return name, namespace


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


def _slot_problems(entries: Mapping[str, _Entry], nodes: int, slots: int, max_executors: int | None) -> list[str]:
    """Too many executors in all, or more than the nodes' slots."""
    total = sum(e.parallelism for e in entries.values())
    if max_executors is not None and total > max_executors:
        return [
            f"spec.vertices: {total} executors in all (the sum of parallelism), more than "
            f"{max_executors}; lower the vertices' parallelism"
        ]
    if not entries or total <= nodes * slots:
        return []
    need_slots = -(-total // nodes)
    need_nodes = -(-total // slots)
    return [
        f"spec.slotsPerNode: {nodes} nodes × {slots} slots = {nodes * slots} slots for {total} "
        f"executors; raise spec.slotsPerNode to {need_slots} or spec.nodes to {need_nodes}"
    ]


def _placement_count_problems(placement: Any) -> list[str]:
    """The numbers of spec.placement that no pod may have (the CRD keeps its Pod fields as written): a
    toleration's tolerationSeconds an integer, a topology spread constraint's maxSkew and minDomains at least 1,
    a preferred affinity term's weight 1 to 100, as the API server checks a pod's, so the spec is refused where it
    is written and not when its pods are created. Which tolerations, labels and affinity the operator allows is
    its policy's (`control.backends.worker_objects.PlacementPolicy`)."""
    if not isinstance(placement, Mapping):
        return []
    problems: list[str] = []

    def check(value: Any, where: str, low: int, high: int, fix: str) -> None:
        if value is None:
            return
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            problems.append(f"{where}: {shown(value)} is not an integer from {low} to {high}; {fix}")

    for i, toleration in enumerate(_list(placement.get("tolerations"))):
        if isinstance(toleration, Mapping):
            check(
                toleration.get("tolerationSeconds"), f"spec.placement.tolerations[{i}].tolerationSeconds",
                -MAX_INT64, MAX_INT64, "give the seconds a pod stays on a node with the taint, or remove it",
            )  # fmt: skip
    for i, constraint in enumerate(_list(placement.get("topologySpreadConstraints"))):
        if isinstance(constraint, Mapping):
            where = f"spec.placement.topologySpreadConstraints[{i}]"
            check(constraint.get("maxSkew"), f"{where}.maxSkew", 1, 2**31 - 1, "give at least 1")
            check(constraint.get("minDomains"), f"{where}.minDomains", 1, 2**31 - 1, "give at least 1, or remove it")
    affinity = placement.get("affinity")
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        block = affinity.get(kind) if isinstance(affinity, Mapping) else None
        terms = block.get("preferredDuringSchedulingIgnoredDuringExecution") if isinstance(block, Mapping) else None
        for i, term in enumerate(_list(terms)):
            if isinstance(term, Mapping):
                where = f"spec.placement.affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution[{i}].weight"
                check(term.get("weight"), where, 1, 100, "give a weight from 1 to 100")
    return problems


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class _Entry:
    """A named vertex of the manifest as validation sees it: where it is written, what kind it is, its
    parallelism and the `Vertex`, or None when it names no code (a placeholder: it stays in the graph so
    nothing around it reports the same mistake again)."""

    index: int
    kind: VertexKind
    parallelism: int
    vertex: Vertex | None


def _parse_vertices(raw: list[Mapping[str, Any]], problems: list[str]) -> dict[str, _Entry]:
    """The named vertices (placeholders included); a second vertex of a name is reported and left out (its
    streams are the first one's)."""
    entries: dict[str, _Entry] = {}
    for i, item in enumerate(raw):
        name = item["name"]
        if name in entries:
            problems.append(
                f"spec.vertices[{i}].name: duplicate vertex {shown(name)} (also spec.vertices[{entries[name].index}]); "
                "give every vertex a unique name"
            )
            continue
        entries[name] = _parse_vertex(item, name, i, problems)
    return entries


def _parse_vertex(item: Mapping[str, Any], name: str, index: int, problems: list[str]) -> _Entry:
    """One named vertex: its `Vertex`, or a placeholder entry when its block is incomplete."""
    # exactly one of the three is the CRD's rule ("one block per vertex")
    kinds: tuple[VertexKind, ...] = ("source", "logic", "sink")
    kind = next(k for k in kinds if k in item)
    config: Mapping[str, Any] = item[kind]
    where = f"spec.vertices[{index}].{kind}"
    before = len(problems)
    _block_code(kind, config, where, problems)
    _block_io(kind, config, where, problems)
    parallelism: int = item.get("parallelism", 1)
    vertex: Vertex | None = None
    if len(problems) == before:
        max_parallelism: int = item.get("maxParallelism", DEFAULT_MAX_PARALLELISM)
        vertex = Vertex(name, kind, parallelism, max_parallelism, item.get("stateful", False) is True, dict(config))
    return _Entry(index, kind, parallelism, vertex)


def _block_code(kind: VertexKind, config: Mapping[str, Any], where: str, problems: list[str]) -> None:
    """What runs the vertex is named: a built-in (logic.builtin, source/sink.type) or a user class (module).
    Which names are known, and a module's form, are the CRD's enum and pattern."""
    if kind == "logic" and not ({"builtin", "module"} & set(config)):
        problems.append(f"{where}: names no code; set logic.builtin or logic.module (module:Class)")
    if kind in ("source", "sink") and "type" not in config and "module" not in config:
        problems.append(f"{where}: has no type; set {kind}.type (e.g. synthetic, redis-stream)")


def _block_io(kind: VertexKind, config: Mapping[str, Any], where: str, problems: list[str]) -> None:
    """A synthetic source's rate profile, a delivery mode only on a redis-stream, kafka or user sink, and the
    counts the CRD bounds below only within what the API server (an int64) and Redis (a long long) take."""
    if kind == "source" and config.get("type") == "synthetic":
        problems.extend(rate_config_problems(config, where))
    if kind == "sink" and "delivery" in config and config.get("type") not in _DELIVERY_SINKS and "module" not in config:
        problems.append(
            f"{where}.delivery: only a redis-stream, kafka or user (module) sink has a delivery mode; remove it"
        )
    for key in _UNBOUNDED_COUNTS[kind]:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_INT64:
            problems.append(
                f"{where}.{key}: {shown(value)} is above {MAX_INT64}, the largest integer the API server and Redis "
                "take; lower it"
            )


#: the built-in sinks with a delivery mode (at-least-once or exactly-once)
_DELIVERY_SINKS = ("redis-stream", "kafka")

#: the integer fields of a vertex's block whose CRD schema has a minimum and no maximum
_UNBOUNDED_COUNTS: dict[VertexKind, tuple[str, ...]] = {
    "source": ("limit", "idOffset"),
    "logic": (),
    "sink": ("maxLen", "every"),
}


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


def _parse_streams(
    raw: list[Mapping[str, Any]], entries: Mapping[str, _Entry], problems: list[str]
) -> tuple[list[Stream], _Unresolved]:
    """Streams as edges, and the ends that named no vertex (a duplicate or a self-loop makes no edge)."""
    unresolved = _Unresolved()
    known = ", ".join(entries) or "none"
    streams: list[Stream] = []
    seen: dict[tuple[str, str], int] = {}
    for i, item in enumerate(raw):
        stream = _parse_stream(item, f"spec.streams[{i}]", entries, known, problems, unresolved)
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
    item: Mapping[str, Any],
    path: str,
    entries: Mapping[str, _Entry],
    known: str,
    problems: list[str],
    unresolved: _Unresolved,
) -> Stream | None:
    """One stream as an edge, or None when it makes none (an unknown end, a self-loop). Its grouping, key and
    balance are as the CRD allows (a fields grouping has its key: the CRD's rule)."""
    src, dst = item.get("from"), item.get("to")
    ends_known = _stream_end(src, f"{path}.from", entries, known, problems)
    ends_known = _stream_end(dst, f"{path}.to", entries, known, problems) and ends_known
    if not ends_known:
        unresolved.note(src, dst, entries)
        return None
    assert isinstance(src, str) and isinstance(dst, str)  # both name a vertex (`_stream_end`)
    if src == dst:
        problems.append(f"{path}: stream from {shown(src)} to itself makes a cycle; remove it")
        return None
    grouping = cast(Grouping, item.get("grouping", "shuffle"))
    key = item.get("key") if grouping == "fields" else None
    return Stream(src, dst, grouping, key, item.get("balance", "load-aware"))


def _stream_end(value: Any, path: str, entries: Mapping[str, _Entry], known: str, problems: list[str]) -> bool:
    """Whether a stream end names a vertex; a problem line naming the known ones when it does not (the CRD's
    rule says it of the whole list; this names the entry)."""
    if isinstance(value, str) and value in entries:
        return True
    if value is None:
        problems.append(f"{path}: is missing; set it to one of: {known}")
    else:
        problems.append(f"{path}: unknown vertex {shown(value)}; use one of: {known}")
    return False


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
    if "source" not in kinds:
        problems.append("spec.vertices: no source; add a vertex with a source: block")
    sinks = [
        n for n, e in entries.items() if e.kind != "source" and graph.out_degree(n) == 0 and n not in unresolved.has_out
    ]
    if not sinks and not unresolved.into_unknown:
        problems.append("spec.vertices: no sink; add a vertex with no outgoing stream (e.g. a sink: block)")
    return problems
