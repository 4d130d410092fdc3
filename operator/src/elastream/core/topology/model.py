"""The validated model of a StreamTopology: `Topology` (a DAG over networkx), its vertices, streams and
scaling settings, `TopologyError`, and the names derived from a topology (Redis key prefix, executor ids)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import networkx as nx

from elastream.core.rates import shown
from elastream.core.savepoint_rules import DEFAULT_DELETION_POLICY, SavepointRef
from elastream.core.topology.limits import (
    DEFAULT_CONGESTION_RATE,
    DEFAULT_WINDOW,
    MAX_NODES,
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS,
    Grouping,
    MigrationProtocol,
    MigrationScope,
    VertexKind,
)


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
    migration: MigrationProtocol = "ccr"
    #: what a CCR migration pauses (`core.migration_scope`)
    migration_scope: MigrationScope = "all"
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
