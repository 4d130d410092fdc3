"""Savepoints and the deletion policy: the pure rules (names, references, grants, compatibility).

A savepoint is a named, retained copy of one completed checkpoint of a topology (its state per vertex and key
group and its sources' read positions), taken on demand (the annotation `elastream.dev/savepoint=<name>`) and
kept outside the topology's working keys, so deleting the topology (`spec.deletionPolicy: Delete`) leaves it.
`spec.initialSavepoint` starts a topology that has no state of its own from one: the same topology's, another
topology's of the same namespace, or one of another namespace that was shared with this one when it was taken
(`elastream.dev/savepoint-share-with=<ns>,<ns>`, like a Gateway API ReferenceGrant: the owner of the state
grants, the reader cannot take). It may be restored only where the vertex names and every vertex's key space
(`maxParallelism`, the number of key groups the state is split into) agree: state is stored per key group,
so executors and nodes may differ, key groups may not.

This module decides; `store.savepoint_store` keeps them in Redis and `control.savepoint_actions` takes and
restores them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: take a savepoint of this name (removed by the operator once taken, or refused with a Warning event)
SAVEPOINT_ANNOTATION = "elastream.dev/savepoint"
#: the namespaces (comma-separated) a savepoint taken now may be restored in, besides its own
SHARE_ANNOTATION = "elastream.dev/savepoint-share-with"
#: delete the savepoint of this name of this topology (removed by the operator once done)
DELETE_SAVEPOINT_ANNOTATION = "elastream.dev/delete-savepoint"

#: the most savepoints one topology keeps (each is a full copy of its state): a take beyond is refused
MAX_SAVEPOINTS = 20
#: the most namespaces one savepoint may be shared with
MAX_SHARED_NAMESPACES = 20

DELETION_POLICIES = ("Delete", "Retain")
DEFAULT_DELETION_POLICY = "Delete"

_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
NAME_RULE = "a DNS-1123 label: 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit"


def name_problem(name: Any, where: str) -> str | None:
    """Why `name` is not a savepoint (or namespace, topology) name, as a line naming `where`; None if it is."""
    if isinstance(name, str) and _LABEL_RE.match(name):
        return None
    shown = repr(name)[:80]
    return f"{where}: {shown} is not {NAME_RULE}; use e.g. before-upgrade"


def parse_share_with(raw: str | None) -> tuple[tuple[str, ...], str | None]:
    """The namespaces of `elastream.dev/savepoint-share-with` (comma-separated; blank: none), or a problem."""
    if raw is None or not raw.strip():
        return (), None
    names = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    for name in names:
        problem = name_problem(name, f"annotation {SHARE_ANNOTATION}")
        if problem is not None:
            return (), problem + " (a comma-separated list of namespaces)"
    if len(names) > MAX_SHARED_NAMESPACES:
        return (), f"annotation {SHARE_ANNOTATION}: {len(names)} namespaces, more than {MAX_SHARED_NAMESPACES}"
    return names, None


@dataclass(frozen=True)
class SavepointRef:
    """`spec.initialSavepoint`: which savepoint a new topology starts from (topology and namespace default to
    the topology's own)."""

    name: str
    topology: str
    namespace: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.topology}/{self.name}"


def parse_initial_savepoint(raw: Mapping[str, Any] | None, namespace: str, name: str) -> SavepointRef | None:
    """`spec.initialSavepoint` ({name, topology?, namespace?}: its form is the CRD's) as a reference; the topology
    and the namespace default to the topology's own."""
    if raw is None:
        return None
    return SavepointRef(str(raw["name"]), str(raw.get("topology", name)), str(raw.get("namespace", namespace)))


@dataclass(frozen=True)
class SavepointMeta:
    """What a savepoint holds besides its state: where it comes from and what it fits."""

    name: str
    namespace: str
    topology: str
    #: the checkpoint it copies (an id of the source topology)
    checkpoint: str
    #: when it was taken (RFC 3339, UTC)
    taken_at: str
    #: every vertex of the source topology -> its maxParallelism (key groups)
    vertices: Mapping[str, int]
    #: namespaces besides its own it may be restored in
    shared_with: tuple[str, ...] = ()
    #: each exactly-once sink's stream -> the id of the last entry committed up to the savepoint ("0-0": none)
    committed_output: Mapping[str, str] = field(default_factory=dict)
    state_bytes: int = 0

    def to_redis(self) -> dict[str, str]:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "topology": self.topology,
            "checkpoint": self.checkpoint,
            "takenAt": self.taken_at,
            "vertices": json.dumps(dict(self.vertices), sort_keys=True),
            "sharedWith": json.dumps(list(self.shared_with)),
            "committedOutput": json.dumps(dict(self.committed_output), sort_keys=True),
            "stateBytes": str(self.state_bytes),
        }

    @classmethod
    def from_redis(cls, fields: Mapping[str, str]) -> SavepointMeta:
        return cls(
            name=fields["name"],
            namespace=fields["namespace"],
            topology=fields["topology"],
            checkpoint=fields["checkpoint"],
            taken_at=fields["takenAt"],
            vertices={str(k): int(v) for k, v in json.loads(fields["vertices"]).items()},
            shared_with=tuple(json.loads(fields.get("sharedWith") or "[]")),
            committed_output=dict(json.loads(fields.get("committedOutput") or "{}")),
            state_bytes=int(fields.get("stateBytes") or 0),
        )

    def to_status(self) -> dict[str, Any]:
        """One entry of `status.savepoints`."""
        entry: dict[str, Any] = {
            "name": self.name,
            "checkpoint": self.checkpoint,
            "takenAt": self.taken_at,
            "stateBytes": self.state_bytes,
        }
        if self.shared_with:
            entry["sharedWith"] = list(self.shared_with)
        if self.committed_output:
            entry["committedOutput"] = dict(self.committed_output)
        return entry


def access_problem(meta: SavepointMeta, namespace: str) -> str | None:
    """Why a topology of `namespace` may not read `meta` (another namespace's, not shared with it); None if
    it may."""
    if meta.namespace == namespace or namespace in meta.shared_with:
        return None
    return (
        f"spec.initialSavepoint: savepoint {meta.name} of {meta.namespace}/{meta.topology} is not shared with "
        f"namespace {namespace}; take it again with the annotation {SHARE_ANNOTATION}={namespace} on "
        f"{meta.namespace}/{meta.topology}"
    )


def compatibility_problems(meta: SavepointMeta, vertices: Mapping[str, int]) -> list[str]:
    """What keeps a topology of these vertices (name -> maxParallelism) from starting from `meta`: the
    vertex names must be the same, and each vertex's key space (maxParallelism)."""
    where = f"spec.initialSavepoint: savepoint {meta.name} of {meta.namespace}/{meta.topology}"
    problems = []
    missing, extra = sorted(set(meta.vertices) - set(vertices)), sorted(set(vertices) - set(meta.vertices))
    if missing:
        problems.append(f"{where} has vertices this topology lacks: {', '.join(missing)}; add them or rename yours")
    if extra:
        problems.append(f"{where} lacks vertices of this topology: {', '.join(extra)}; the vertex names must agree")
    differ = [
        f"{v} {meta.vertices[v]} (here {vertices[v]})"
        for v in sorted(set(meta.vertices) & set(vertices))
        if meta.vertices[v] != vertices[v]
    ]
    if differ:
        problems.append(
            f"{where} has other key spaces: maxParallelism of {', '.join(differ)}; set each vertex's "
            "maxParallelism to the savepoint's"
        )
    return problems


def status_entries(metas: Sequence[SavepointMeta], limit: int = MAX_SAVEPOINTS) -> list[dict[str, Any]]:
    """`status.savepoints`: the newest `limit`, oldest first."""
    ordered = sorted(metas, key=lambda m: (m.taken_at, m.name))
    return [m.to_status() for m in ordered[-limit:]]
