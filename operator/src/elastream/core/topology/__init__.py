"""The StreamTopology manifest as a typed, validated model over a networkx DiGraph.

`parse_manifest` takes the same YAML document users `kubectl apply` and returns a `Topology`, or raises
`TopologyError` listing every problem found, each naming the field (``spec.vertices[2].parallelism``) and
the fix. Nothing downstream re-validates: a `Topology` is always a DAG whose sources and sinks are known.

The package's modules, one concern each: `limits` (names, defaults and bounds), `model` (the `Topology`),
`document` (reading a manifest within bounds), `parse` (the parser: vertices, streams, the graph and slots),
`scaling` (spec.scaling and spec.resources) and `fields` (one scalar field's checks). The CRD's schema and CEL
rules are checked outside `core`, by `elastream.crd`, before the parser wherever a manifest enters
through `elastream validate`.
"""

from __future__ import annotations

from elastream.core.topology.document import (
    manifest_document_from_text,
    read_manifest_document,
)
from elastream.core.topology.limits import (
    API_VERSION,
    DEFAULT_CONGESTION_RATE,
    DEFAULT_MAX_PARALLELISM,
    DEFAULT_SLOTS_PER_NODE,
    DEFAULT_WINDOW,
    KIND,
    MAX_DEPTH,
    MAX_EXECUTORS,
    MAX_MANIFEST_BYTES,
    MAX_NODE_CPU,
    MAX_NODE_MEMORY,
    MAX_NODES,
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS,
    MAX_TEXT_CHARS,
    MAX_VALUES,
    MIN_NODE_MEMORY,
    STRATEGIES,
    STREAM_NAME_RULE,
    Grouping,
    VertexKind,
)
from elastream.core.topology.model import (
    AutoScalingSpec,
    ScalingSpec,
    Stream,
    Topology,
    TopologyError,
    Vertex,
    executor_id,
    glob_escape,
    split_executor_id,
    stream_key,
    topology_prefix,
)
from elastream.core.topology.parse import (
    CONTRACT_BROKEN,
    parse_manifest,
)
from elastream.core.topology.scaling import (
    parse_cpu,
    parse_quantity,
)

__all__ = [
    "API_VERSION",
    "CONTRACT_BROKEN",
    "DEFAULT_CONGESTION_RATE",
    "DEFAULT_MAX_PARALLELISM",
    "DEFAULT_SLOTS_PER_NODE",
    "DEFAULT_WINDOW",
    "KIND",
    "MAX_DEPTH",
    "MAX_EXECUTORS",
    "MAX_MANIFEST_BYTES",
    "MAX_NODES",
    "MAX_NODE_CPU",
    "MAX_NODE_MEMORY",
    "MAX_PROBLEMS",
    "MAX_PROBLEM_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_VALUES",
    "MIN_NODE_MEMORY",
    "STRATEGIES",
    "STREAM_NAME_RULE",
    "AutoScalingSpec",
    "Grouping",
    "ScalingSpec",
    "Stream",
    "Topology",
    "TopologyError",
    "Vertex",
    "VertexKind",
    "executor_id",
    "glob_escape",
    "manifest_document_from_text",
    "parse_cpu",
    "parse_manifest",
    "parse_quantity",
    "read_manifest_document",
    "split_executor_id",
    "stream_key",
    "topology_prefix",
]
