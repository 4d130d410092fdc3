"""The StreamTopology's names, defaults and the bounds the code relies on: the API version and kind, the model's
literal types, the defaults the CRD states too (tests/unit/test_crd.py checks), and the sizes the parser and the
document reader enforce. Every other enum and maximum is the CRD's alone."""

from __future__ import annotations

import re
from typing import Literal

API_VERSION = "elastream.dev/v1alpha1"
KIND = "StreamTopology"
Grouping = Literal["shuffle", "fields", "all", "global"]
VertexKind = Literal["source", "logic", "sink"]
DEFAULT_MAX_PARALLELISM = 128
DEFAULT_SLOTS_PER_NODE = 4
#: input/processing ratio above which a vertex is congested (Stela's CongestionRate)
DEFAULT_CONGESTION_RATE = 1.2
#: metric intervals per analysis window
DEFAULT_WINDOW = 20
#: the planners of `elastream.core.planner` (the CRD's enum of spec.scaling.strategy)
STRATEGIES = ("stela", "stela-plus", "round-robin", "least-link-load", "random")
#: how a running topology moves to a new schedule (`spec.scaling.migration`)
MigrationProtocol = Literal["ccr", "dcr", "restart"]
#: what a CCR migration pauses (`spec.scaling.migrationScope`): every executor and source, only the executors
#: that move and the channels into them, or nothing but a few key groups at a time (`keyGroups`,
#: `core.keygroup_batches`)
MigrationScope = Literal["all", "moving", "keyGroups"]

# Upper bounds. A topology's author must not be able to take the operator down for everyone: every number
# that sizes memory, work or a loop is bounded, by the CRD's `maximum`s and `maxItems`, and by these where the
# code needs the number itself or the CRD cannot say it (a sum, a quantity's value, the document's size).
#: spec.nodes, spec.scaling.auto.minNodes and maxNodes (the CRD's maximum too; `elastream scale` checks it)
MAX_NODES = 1000
#: the executors of all vertices together (the sum of their parallelism)
MAX_EXECUTORS = 10_000
#: spec.resources.limits.cpu in cores
MAX_NODE_CPU = 1024
#: the smallest CPU quantity Kubernetes takes (1m); a finer one is not a CPU amount it can give
MIN_CPU = 0.001
#: spec.resources.{limits,requests}.memory in bytes: at most 64Ti (more than any machine has), and a limit of at
#: least 16Mi (a worker, a Python interpreter with its libraries, cannot start in less)
MAX_NODE_MEMORY = 64 * 2**40
MIN_NODE_MEMORY = 16 * 2**20
#: the largest integer the API server (int64) and Redis (a long long) take, for counts the CRD bounds below only
MAX_INT64 = 2**63 - 1
#: the manifest as a document: bytes of its file, nesting levels, values (after YAML aliases are expanded)
#: and characters of text; beyond them it is refused before anything walks it
MAX_MANIFEST_BYTES = 1_048_576
MAX_DEPTH = 32
MAX_VALUES = 100_000
MAX_TEXT_CHARS = 4 * 1_048_576
#: the longest problem line and the most problem lines one error carries
MAX_PROBLEM_CHARS = 500
MAX_PROBLEMS = 100
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CPU_RE = re.compile(r"^(\d+(\.\d+)?)(m?)$")
#: a Kubernetes quantity (resource.Quantity's grammar): sign, number, then a binary-SI, decimal-SI or exponent
#: suffix; the exponent an integer, as the API server reads it (the CRD's pattern also lets `1e2.5` through)
_QUANTITY_RE = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:([KMGTPE]i)|([numkMGTPE])|[eE]([+-]?[0-9]+))?")

STREAM_NAME_RULE = "use 1-100 letters, digits, '.', '_', '-' or ':'"
