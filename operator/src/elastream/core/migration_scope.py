"""Which executors take part in a migration: all of them (CCR as the paper has it), or only those that move.

With scope `moving`, an executor is *kept* when the new schedule places it on the same node with the same
key groups (its vertex keeps its parallelism): its thread, inbox, state and channels stay as they are and it
never pauses. Every other executor *moves*: the old instance (on a node it leaves, of a vertex whose
parallelism changes, or removed) captures its input and checkpoints; the new instance is initialised from
that checkpoint. A kept executor that sends to a moving one is a *sender*: from PREPARE it holds what it
emits for the moving receivers (everything else flows on), sends COMMIT in-band on the channels into them
and, once the new schedule is in place, routes what it held to their new instances.

What a sender holds is described per child vertex (`Holds`): None when every executor of the child moves
(its events are routed afresh by the new schedule's parallelism), else the indices of the moving receivers
(their events go to the same index again). Pure: the worker, the coordinator and the tests share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elastream.core.schedule import Schedule
from elastream.core.topology import Topology, split_executor_id
from elastream.core.topology.limits import MigrationScope

#: child vertex -> None (every executor of it moves) or the indices of its moving executors
Holds = Mapping[str, tuple[int, ...] | None]


@dataclass(frozen=True)
class MigrationParts:
    """The executors a migration from `old` to `new` touches (see the module)."""

    #: executors of the old schedule that stop: captured and checkpointed
    moving_old: frozenset[str]
    #: executors of the new schedule that start from the checkpoint (INIT goes to them)
    moving_new: frozenset[str]
    #: executors that run on, untouched, in both schedules
    kept: frozenset[str]
    #: kept executors that send to a moving one -> what each holds
    senders: Mapping[str, Holds]
    #: vertices whose parallelism stays but some executors move -> the indices of the moving new executors
    partly_moving: Mapping[str, tuple[int, ...]]

    @property
    def participants(self) -> frozenset[str]:
        """Who gets PREPARE and COMMIT and acks them: the moving executors of the old schedule and the senders."""
        return self.moving_old | frozenset(self.senders)

    def pending_share(self, executor: str, parallelism: int) -> tuple[int, int]:
        """Which part of its vertex's shared captured list a new executor replays: (its rank, how many share
        it). Only the moving executors of a vertex captured anything, so when some of its executors are kept
        the list is shared by the moving new ones alone; otherwise by all of them, by index."""
        vertex, index = split_executor_id(executor)
        moving = self.partly_moving.get(vertex)
        if moving is None:
            return index, parallelism
        return moving.index(index), len(moving)


def migration_parts(topology: Topology, old: Schedule, new: Schedule, scope: MigrationScope) -> MigrationParts:
    """The parts of a migration from `old` to `new` with `scope` (`all`: every executor moves)."""
    if scope == "all":
        return MigrationParts(
            moving_old=frozenset(old.assignment),
            moving_new=frozenset(new.assignment),
            kept=frozenset(),
            senders={},
            partly_moving={},
        )
    old_k, new_k = old.parallelism(), new.parallelism()
    kept = frozenset(
        e
        for e, node in old.assignment.items()
        if new.assignment.get(e) == node and old_k[split_executor_id(e)[0]] == new_k.get(split_executor_id(e)[0])
    )
    moving_old = frozenset(old.assignment) - kept
    moving_new = frozenset(new.assignment) - kept
    moving_vertices = {split_executor_id(e)[0] for e in moving_old | moving_new}
    partly_moving: dict[str, tuple[int, ...]] = {}
    for vertex in moving_vertices:
        if any(split_executor_id(e)[0] == vertex for e in kept):
            partly_moving[vertex] = _indices(moving_new, vertex)
    senders: dict[str, Holds] = {}
    for executor in sorted(kept):
        holds: dict[str, tuple[int, ...] | None] = {}
        for child in topology.children(split_executor_id(executor)[0]):
            if child not in moving_vertices:
                continue
            if child in partly_moving:
                holds[child] = _indices(moving_old, child)
            else:
                holds[child] = None
        if holds:
            senders[executor] = holds
    return MigrationParts(moving_old, moving_new, kept, senders, partly_moving)


def _indices(executors: frozenset[str], vertex: str) -> tuple[int, ...]:
    return tuple(sorted(split_executor_id(e)[1] for e in executors if split_executor_id(e)[0] == vertex))
