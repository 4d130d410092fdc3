"""A plan: the difference between two schedules, the parallelism changes, and the numbers behind them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastream.core.outcomes import Direction
from elastream.core.schedule import Schedule
from elastream.core.topology import split_executor_id

__all__ = ["Direction", "Plan", "PlanningError"]


class PlanningError(ValueError):
    """A scaling request cannot be planned (e.g. the executors do not fit the remaining slots)."""


@dataclass(frozen=True)
class Plan:
    strategy: str
    direction: Direction
    old_schedule: Schedule
    new_schedule: Schedule
    predicted_throughput: float | None = None
    #: what justified each step: ETPs per iteration (scale-out), ETPSums per removal (scale-in)
    steps: Sequence[Mapping[str, Any]] = field(default_factory=list)

    @property
    def from_nodes(self) -> int:
        return len(self.old_schedule.nodes)

    @property
    def to_nodes(self) -> int:
        return len(self.new_schedule.nodes)

    @property
    def added_nodes(self) -> list[str]:
        old = set(self.old_schedule.nodes)
        return [n for n in self.new_schedule.nodes if n not in old]

    @property
    def removed_nodes(self) -> list[str]:
        new = set(self.new_schedule.nodes)
        return [n for n in self.old_schedule.nodes if n not in new]

    @property
    def new_executors(self) -> list[tuple[str, str]]:
        """(executor, node) for executors that did not exist before."""
        old = self.old_schedule.assignment
        return [(e, n) for e, n in self.new_schedule if e not in old]

    @property
    def moves(self) -> list[tuple[str, str, str]]:
        """(executor, from, to) for executors that exist in both schedules on different nodes."""
        new = self.new_schedule.assignment
        return [(e, n, new[e]) for e, n in self.old_schedule if e in new and new[e] != n]

    @property
    def parallelism(self) -> dict[str, int]:
        return self.new_schedule.parallelism()

    @property
    def parallelism_changes(self) -> dict[str, tuple[int, int]]:
        """vertex -> (old, new) degree, for the vertices whose degree changes."""
        old, new = self.old_schedule.parallelism(), self.new_schedule.parallelism()
        return {v: (old.get(v, 0), k) for v, k in new.items() if old.get(v, 0) != k}

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "direction": self.direction,
            "from_nodes": self.from_nodes,
            "to_nodes": self.to_nodes,
            "added_nodes": self.added_nodes,
            "removed_nodes": self.removed_nodes,
            "new_executors": [
                {"executor": e, "vertex": split_executor_id(e)[0], "node": n} for e, n in self.new_executors
            ],
            "moves": [{"executor": e, "from": a, "to": b} for e, a, b in self.moves],
            "parallelism": self.parallelism,
            "predicted_throughput": self.predicted_throughput,
            "steps": list(self.steps),
            "schedule": self.new_schedule.to_dict(),
        }
