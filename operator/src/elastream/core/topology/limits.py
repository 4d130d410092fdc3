"""The StreamTopology's names, defaults and bounds: the API version and kind, the enums, the defaults the CRD
states too, and every maximum (tests/unit/test_crd.py checks the CRD states the same numbers)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal, get_args

# the rate bounds live with the rate profiles; every bound is a name here too
from elastream.core.rates import MAX_RATE, MAX_STEP_SECONDS, MAX_STEPS

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
#: how a running topology moves to a new schedule (`spec.scaling.migration`)
MigrationProtocol = Literal["ccr", "dcr", "restart"]
MIGRATIONS: tuple[MigrationProtocol, ...] = get_args(MigrationProtocol)
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

STREAM_NAME_PATTERN = r"^[A-Za-z0-9._:-]{1,100}$"
STREAM_NAME_RULE = "use 1-100 letters, digits, '.', '_', '-' or ':'"
