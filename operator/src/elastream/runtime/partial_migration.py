"""The part of a migration of scope `moving` (`core.migration_scope`) an executor that stays plays when it
sends to executors that move: PREPARE and COMMIT as a *sender* (hold what is addressed to the moving
receivers, COMMIT in-band into them only), REROUTE from its worker's switch (the new schedule's outputs and
upstream; what was held goes to the new receivers), ABORT (what was held goes to the old ones after all); and
which part of its vertex's shared captured list a new executor replays. Nothing here pauses the executor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from elastream.core.migration_protocol import SENDER, ControlType
from elastream.runtime.operators.api import Context
from elastream.runtime.participant import Migration
from elastream.runtime.routing import Router


class Sender(Protocol):
    """What a partial migration touches of an executor that stays: its migration bookkeeping and its router
    (an `executor.ExecutorLoop`, which imports this module: hence a port, not the class)."""

    @property
    def migration(self) -> Migration: ...

    @property
    def router(self) -> Router: ...


def on_sender_control(thread: Sender, message: Mapping[str, Any]) -> bool:
    """The messages of a partial migration to an executor that stays (`core.migration_scope`); True when
    `message` was one. PREPARE (role `sender`): hold what is addressed to the moving receivers, ack. COMMIT
    (role `sender`): COMMIT in-band on the channels into them, ack. REROUTE (from this worker's switch): the
    new schedule's outputs and upstream; what was held goes to the new receivers. Nothing pauses."""
    kind, mid = message.get("type"), str(message.get("mid"))
    migration = thread.migration
    if kind == ControlType.REROUTE:
        if message.get("outputs") is not None:
            for channel in thread.router.reroute(message["outputs"]):
                channel.close(0)
        migration.participant.upstream = frozenset(message["upstream"])
        migration.holding = None
        return True
    if message.get("role") != SENDER:
        return False
    if kind == ControlType.PREPARE:
        migration.holding = mid
        thread.router.hold(message.get("hold") or {})
        migration.ack(mid, "preparing")
    elif kind == ControlType.COMMIT and migration.holding == mid:
        thread.router.send_control_held({"type": ControlType.COMMIT, "mid": mid})
        migration.ack(mid, "committing")
    return True


def release_held(thread: Sender) -> None:
    """A partial migration was aborted: what this executor held goes to the old receivers after all."""
    if thread.migration.holding is not None:
        thread.migration.holding = None
        thread.router.release()


def pending_share(message: Mapping[str, Any], context: Context) -> tuple[int, int]:
    """Which part of its vertex's shared captured list a new executor replays (`MigrationParts.pending_share`):
    its index of the vertex's parallelism, or its rank among the moving executors when some stay."""
    moving = (message.get("partlyMoving") or {}).get(context.vertex)
    if not moving:
        return context.index, context.parallelism
    return sorted(moving).index(context.index), len(moving)
