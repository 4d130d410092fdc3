"""What a change of a running topology's spec needs: the pure half of stateful upgrades.

`spec_change(running, wanted)` sorts the differences between the spec that runs and the spec asked for:

- **in place** (`nodes`, every vertex's `parallelism`, `scaling.auto`, `suspend`): a migration (or the
  autoscaler's new settings) applies them to the running schedule; nothing restarts;
- **controller** (`scaling` other than `auto`: strategy, migration protocol, congestion rate, window, checkpoint
  interval): the operator's side of the topology is rebuilt and adopts the running pods; nothing restarts;
- **restart** (everything else: image, resources, placement, spreadOverNodes, slotsPerNode, streams, a vertex's
  operator or its config, vertices added or removed): a stateful upgrade. A checkpoint is taken, the old
  pods stop, new ones start from that checkpoint. A kept vertex's key groups carry their state, a removed
  vertex's state is dropped, an added vertex starts empty;
- **refused**: what no checkpoint can carry. A kept stateful vertex or a source whose `maxParallelism`
  changes would split its state (or its source lanes) into another number of key groups: the state of key
  group g would land on other keys. The message names the field and the fix.

Fields this module does not know (added by a later spec version) are restarts: applying a field the operator
does not understand in place would be the silent ignore this replaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastream.core.topology import Topology

#: top-level spec fields a running schedule takes without a restart (spec.scaling is looked into)
IN_PLACE_FIELDS = frozenset({"nodes", "suspend", "deletionPolicy", "initialSavepoint"})
#: a vertex's fields a migration applies (everything else of a kept vertex restarts)
IN_PLACE_VERTEX_FIELDS = frozenset({"parallelism"})


@dataclass(frozen=True)
class SpecChange:
    """The differences between a running spec and a wanted one, by what applying them takes."""

    #: fields whose change needs a checkpoint and new pods (`spec.image`, `spec.vertices[count].logic`, ...)
    restart: tuple[str, ...] = ()
    #: `spec.scaling` fields other than `auto` that changed (the operator side is rebuilt, pods adopted)
    controller: tuple[str, ...] = ()
    #: vertices the wanted spec adds (they start empty) and removes (their state is dropped)
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    #: changes no checkpoint can carry: one line each, naming the field and the fix
    refused: tuple[str, ...] = ()

    @property
    def needs_restart(self) -> bool:
        return bool(self.restart)

    def describe(self) -> str:
        """One line for events and conditions: what changed, and what happens to the vertices' state."""
        parts = [", ".join(self.restart)] if self.restart else []
        if self.added:
            parts.append(f"vertices added (starting empty): {', '.join(self.added)}")
        if self.removed:
            parts.append(f"vertices removed (their state is dropped): {', '.join(self.removed)}")
        return "; ".join(parts)


def spec_change(running: Topology, wanted: Topology) -> SpecChange:
    """What it takes to go from the `running` topology's spec to the `wanted` one's (both validated)."""
    old, new = running.spec, wanted.spec
    restart: list[str] = []
    for name in sorted(set(old) | set(new)):
        if name in IN_PLACE_FIELDS or name in ("vertices", "scaling"):
            continue
        if _normal(old.get(name)) != _normal(new.get(name)):
            restart.append(f"spec.{name}")
    old_scaling, new_scaling = _mapping(old.get("scaling")), _mapping(new.get("scaling"))
    controller = [
        f"spec.scaling.{name}"
        for name in sorted(set(old_scaling) | set(new_scaling))
        if name != "auto" and _normal(old_scaling.get(name)) != _normal(new_scaling.get(name))
    ]
    old_vertices, new_vertices = _vertices(old), _vertices(new)
    added = tuple(v for v in new_vertices if v not in old_vertices)
    removed = tuple(v for v in old_vertices if v not in new_vertices)
    refused: list[str] = []
    for index, (name, raw) in enumerate(new_vertices.items()):
        before = old_vertices.get(name)
        if before is None:
            continue
        for field_name in sorted(set(before) | set(raw)):
            if field_name in IN_PLACE_VERTEX_FIELDS or field_name == "name":
                continue
            if _normal(before.get(field_name)) != _normal(raw.get(field_name)):
                restart.append(f"spec.vertices[{name}].{field_name}")
        kept_old, kept_new = running.vertices.get(name), wanted.vertices.get(name)
        if kept_old is None or kept_new is None or kept_old.max_parallelism == kept_new.max_parallelism:
            continue
        if kept_old.stateful or kept_old.kind == "source":
            what = "its state" if kept_old.stateful else "its source lanes and their read positions"
            refused.append(
                f"spec.vertices[{index}].maxParallelism: {kept_old.max_parallelism} → {kept_new.max_parallelism} "
                f"for the running vertex {name!r} would split {what} into other key groups; keep "
                f"{kept_old.max_parallelism}, or rename the vertex to start it empty (its state is dropped)"
            )
    if added or removed:
        restart.append("spec.vertices (added or removed)")
    return SpecChange(tuple(restart), tuple(controller), added, removed, tuple(refused))


def _normal(value: Any) -> Any:
    """Absent and null are the same (a merge patch removes a field by setting it null)."""
    return None if value == {} or value == [] else value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _vertices(spec: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    raw = spec.get("vertices")
    if not isinstance(raw, list):
        return {}
    return {str(v["name"]): v for v in raw if isinstance(v, Mapping) and isinstance(v.get("name"), str)}
