"""Graceful drains: where the executors of a node whose worker is told to stop (SIGTERM: a pod evicted, a
cluster node drained, `kubectl delete pod`) go, so that a CCR migration moves them off before it exits.

No metric analysis on this path: it must fit in the worker's grace period (seconds), and the drained node is
forced, not chosen by ETPSum. `drain_schedule` moves the node's executors onto the remaining nodes, the
emptiest first (round-robin over them, as Stela's scale-in deals a removed node's executors), or, when
their free slots cannot hold them, onto one fresh node (`replacement`) that takes exactly its executors.
`refill_schedule` is the move back once the drained worker is gone: a fresh node takes executors from the
fullest nodes until the load is even again, so the topology has its node count back with every vertex's
degree unchanged (a Stela scale-out would add executors instead). `drain_deadline` is the worker's side:
how long it keeps serving after SIGTERM before it gives up on a drain and exits (then it is a lost worker,
rolled back to the last checkpoint, as without drains).
"""

from __future__ import annotations

from dataclasses import dataclass

from elastream.core.schedule import Schedule, fresh_node_names, node_index
from elastream.core.simulate import move_off_nodes

#: seconds of a worker's grace period kept for its own shutdown after the drain (threads joined, the last
#: metrics and positions written) and for the controller to notice a drain it cannot finish in time
DRAIN_MARGIN_S = 3.0


class DrainError(ValueError):
    """A node cannot be drained: it is not in the schedule, or it is the only one with nothing to go to."""


@dataclass(frozen=True)
class DrainPlan:
    """The schedule a drain migrates to: `node` removed, its executors on the remaining nodes or on
    `replacement` (a fresh node the migration starts first; None when the others hold them)."""

    node: str
    schedule: Schedule
    replacement: str | None = None

    def moves(self, old: Schedule) -> list[dict[str, str]]:
        """The executors that move, where to (a status record's shape)."""
        new = self.schedule.assignment
        return [{"executor": e, "from": self.node, "to": new[e]} for e in old.executors_on(self.node) if e in new]


def drain_schedule(schedule: Schedule, node: str, avoid: frozenset[str] = frozenset()) -> DrainPlan:
    """Move every executor of `node` off it: onto the remaining nodes (those with the most free slots
    first, dealt round-robin; never those in `avoid`, which are being drained too) when their free slots
    hold them, else onto one fresh node. Raises `DrainError` when `node` is not in the schedule."""
    if node not in schedule.nodes:
        raise DrainError(f"node {node} is not in the running schedule ({', '.join(schedule.nodes)})")
    moving = schedule.executors_on(node)
    remaining = [n for n in schedule.nodes if n != node and n not in avoid]
    free = sum(schedule.free_slots(n) for n in remaining)
    if remaining and free >= len(moving):
        receivers = sorted(remaining, key=lambda n: (-schedule.free_slots(n), node_index(n), n))
        return DrainPlan(node, move_off_nodes(schedule, [node], receivers))
    (replacement,) = fresh_node_names(schedule.nodes, 1)
    assignment = {e: (replacement if n == node else n) for e, n in schedule.assignment.items()}
    nodes = tuple(replacement if n == node else n for n in schedule.nodes)
    return DrainPlan(node, Schedule(assignment, nodes, schedule.slots_per_node), replacement)


def refill_schedule(schedule: Schedule, nodes: int) -> Schedule:
    """Add fresh nodes until there are `nodes`, each taking executors from the fullest nodes (highest node
    number first among equals) until no node holds more than one executor above another; degrees and the
    executors that stay do not change. The schedule as it is when it has `nodes` already."""
    if len(schedule.nodes) >= nodes:
        return schedule
    added = fresh_node_names(schedule.nodes, nodes - len(schedule.nodes))
    all_nodes = (*schedule.nodes, *added)
    placement = {n: list(schedule.executors_on(n)) for n in schedule.nodes} | {n: [] for n in added}
    while True:
        fullest = max(all_nodes, key=lambda n: (len(placement[n]), node_index(n)))
        emptiest = min(added, key=lambda n: (len(placement[n]), node_index(n)))
        if len(placement[fullest]) - len(placement[emptiest]) <= 1:
            break  # even (and an added node never fills past a node that stays: those hold at most its slots)
        placement[emptiest].append(placement[fullest].pop())
    return Schedule.from_placement(placement, schedule.slots_per_node, all_nodes)


def drain_deadline(grace_s: float, margin_s: float = DRAIN_MARGIN_S) -> float:
    """How long a worker waits for its drain after SIGTERM, given its grace period: the grace period less
    the margin, or 0 (no drain: stop at once) when the grace period leaves no time for one."""
    return max(0.0, grace_s - margin_s)
