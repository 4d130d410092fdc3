"""An executor's part in a migration of scope `keyGroups` (`core.keygroup_batches`): key groups move a few at a
time, in band, and nothing pauses.

- As a **sender** (any executor feeding a vertex whose groups move) it gets FLIP from the controller: its router
  sends MARKER behind what went to each donor and routes the step's groups to their recipients from then on
  (`Router.flip`).
- As a **donor** (an old instance) it processes its input as always; once a batch's MARKER has come from every
  upstream executor, it takes the batch's key groups' state out of its operator and ships it to the recipient
  in band (STATE), with what an exactly-once sink processed and did not commit yet. From its first MARKER its
  timers stay quiet: what they would emit belongs to state that is moving, and the recipient emits it.
- As a **recipient** (a new instance, started beside the old one) it processes at once what it owns already
  and holds, per key group, the events of the groups still to come; STATE installs a batch (the operator's
  `restore_state` merges it), the held events are processed in arrival order, and the batch is acked in Redis
  for the controller, on a thread of its own: the data never waits for Redis. Input from a stream
  that is not keyed is held whole until every group it awaits is installed, by a stateful operator only: a
  stateless one has no state for it to wait for, and such a stream orders nothing across its receivers.

Nothing here is written to Redis on the data's path but the recipient's ack. What a failure needs is the last
periodic checkpoint: a worker that dies during the migration rolls the topology back to it
(`control.batched_migration`), so no batch is ever half installed where it counts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from elastream.core.keygroup_batches import Donor, Recipient
from elastream.core.migration_protocol import ControlType
from elastream.core.schedule import key_group_of
from elastream.core.topology import split_executor_id
from elastream.runtime.participant import Migration
from elastream.runtime.routing import FlipOrder, Router, grouping_key
from elastream.runtime.transport import Channel
from elastream.store.codec import pack, unpack
from elastream.store.retry import RetryCancelled

log = logging.getLogger("elastream.worker")

#: the message kinds of this migration that arrive on the data plane (MARKER from upstream, STATE from a donor)
IN_BAND_BATCHING = frozenset((ControlType.MARKER, ControlType.STATE))


@dataclass
class Batching:
    """One executor's bookkeeping in a migration of scope `keyGroups`: the donor's markers (from its first one),
    the recipient's awaited groups and held input (a new instance: from its start), the channels to recipients
    a donor ships on."""

    recipient: Recipient | None = None
    #: whether input from streams that are not keyed waits for every awaited group (a stateful operator)
    hold_unkeyed: bool = True
    #: (sender, events) of streams that are not keyed, held until every awaited group is installed
    unkeyed_held: list[tuple[str, list[Any]]] = field(default_factory=list)
    donor: Donor | None = None
    shipping: dict[tuple[str, str], Channel] = field(default_factory=dict)

    def receiving(self) -> bool:
        return self.recipient is not None and bool(self.recipient.awaited)

    def donating(self) -> bool:
        return self.donor is not None

    def close(self) -> None:
        for channel in self.shipping.values():
            channel.close()
        self.shipping.clear()


def is_stateful(operator: Any) -> bool:
    """Whether `operator` keeps state that moves (a user operator says so by defining `snapshot_state`)."""
    return callable(getattr(operator, "snapshot_state", None)) and getattr(operator, "stateful", True) is not False


class BatchingExecutor(Protocol):
    """What the migration touches of an executor (an `executor.ExecutorThread`, which imports this module:
    hence a port)."""

    executor: str
    operator: Any
    batching: Batching

    @property
    def migration(self) -> Migration: ...

    @property
    def router(self) -> Router: ...

    def process_batch(self, events: Sequence[Any], sender: str | None = None) -> None: ...


def on_flip(executor: str, router: Router, message: Mapping[str, Any]) -> None:
    """FLIP from the controller to a sender: MARKER behind what went to each donor, then the step's key groups
    (or the whole stream) to their recipients."""
    mid = str(message.get("mid"))
    channels = message.get("channels")
    order = FlipOrder(
        vertex=str(message["vertex"]),
        batches=list(message["batches"]),
        channels=None if channels is None else [(str(r), str(e)) for r, e in channels],
    )

    def marker(batches: list[Mapping[str, Any]]) -> dict[str, Any]:
        return {
            "type": ControlType.MARKER,
            "mid": mid,
            "batches": [
                {"n": b["n"], "recipient": b["recipient"], "endpoint": b["endpoint"], "groups": b["groups"]}
                for b in batches
            ],
        }

    router.flip(executor, order, marker)


def accepts(thread: BatchingExecutor, sender: str, message: Mapping[str, Any]) -> bool:
    """Whether an in-band MARKER or STATE may be taken: MARKER from an upstream executor (as COMMIT), STATE from
    an executor of this one's own vertex (its donor) while this one awaits key groups."""
    kind = message.get("type")
    if kind == ControlType.MARKER:
        return sender in thread.migration.participant.upstream
    if kind == ControlType.STATE:
        return thread.batching.recipient is not None and split_executor_id(sender)[0] == thread.migration.vertex
    return False


def on_in_band(thread: BatchingExecutor, sender: str, message: Mapping[str, Any]) -> bool:
    """MARKER (a donor) or STATE (a recipient); True when `message` was one of them."""
    kind = message.get("type")
    if kind == ControlType.MARKER:
        on_marker(thread, sender, message)
        return True
    if kind == ControlType.STATE:
        on_state(thread, message)
        return True
    return False


def on_marker(thread: BatchingExecutor, sender: str, message: Mapping[str, Any]) -> None:
    batching = thread.batching
    if batching.donor is None:
        batching.donor = Donor(frozenset(thread.migration.participant.upstream))
    for batch in message.get("batches") or []:
        if batching.donor.on_marker(int(batch["n"]), sender):
            ship(thread, str(message.get("mid")), batch)


def ship(thread: BatchingExecutor, mid: str, batch: Mapping[str, Any]) -> None:
    """Every event of the batch's key groups routed here is processed: their state (and what an exactly-once
    sink processed and did not commit) goes to the recipient, in band."""
    groups = [int(g) for g in batch["groups"]]
    state: dict[str, bytes] = {}
    snapshot = getattr(thread.operator, "snapshot_state", None)
    if callable(snapshot):
        wanted = set(groups)
        state = {str(g): pack(v) for g, v in snapshot().items() if int(g) in wanted}
    hand_over = getattr(thread.operator, "hand_over", None)
    handed = [list(e) for e in hand_over()] if callable(hand_over) else []
    receiver, endpoint = str(batch["recipient"]), str(batch["endpoint"])
    channel = thread.batching.shipping.get((receiver, endpoint))
    if channel is None:
        opener = thread.router.opener
        if opener is None:
            raise RuntimeError(f"{thread.executor}: cannot open a channel to {receiver} to ship its key groups")
        channel = thread.batching.shipping[(receiver, endpoint)] = opener(thread.executor, receiver, endpoint)
    message = {"type": ControlType.STATE, "mid": mid, "n": int(batch["n"]), "groups": groups, "state": state}
    if handed:
        message["handover"] = handed
    channel.send_control(message, thread.migration.stop or threading.Event())
    log.debug("executor %s: batch %s shipped to %s (%d key groups)", thread.executor, batch["n"], receiver, len(groups))


def on_state(thread: BatchingExecutor, message: Mapping[str, Any]) -> None:
    """A batch's STATE: install it, process what was held for its groups (and, once nothing more is awaited,
    what came on streams that are not keyed), then ack the batch."""
    batching, migration = thread.batching, thread.migration
    recipient = batching.recipient
    if recipient is None:
        return
    groups = [int(g) for g in message.get("groups") or []]
    restore = getattr(thread.operator, "restore_state", None)
    blobs = message.get("state") or {}
    if blobs and callable(restore):
        restore({int(g): unpack(b) for g, b in blobs.items()})
    handed = [tuple(e) for e in message.get("handover") or []]
    if handed:
        thread.process_batch(handed)  # an exactly-once sink's output the donor processed: committed from here
    released = recipient.on_state(groups)
    if released:
        thread.process_batch(released)
    if not recipient.awaited:
        held, batching.unkeyed_held = batching.unkeyed_held, []
        for sender, events in held:
            thread.process_batch(events, sender)
    mid, number = str(message.get("mid")), int(message.get("n", -1))
    # the ack goes on its own thread: with Redis away it waits for Redis, not the events behind this one
    threading.Thread(
        target=ack_quietly, args=(migration, mid, number), name=f"ack-{thread.executor}-{number}", daemon=True
    ).start()


def ack_quietly(migration: Migration, mid: str, number: int) -> None:
    """Ack a batch, waiting out a Redis outage until the executor stops (then the controller times the step
    out or the topology is being stopped anyway)."""
    try:
        migration.ack_batch(mid, number)
    except RetryCancelled:
        log.info("executor %s: stopped before batch %d of %s was acked", migration.executor, number, mid)


def hold_or_pass(thread: BatchingExecutor, sender: str, events: Sequence[Any]) -> list[Any]:
    """What of `events` (from `sender`) to process now; the rest is held: events of a key group still to
    come, and everything from a stream that is not keyed while any group is still to come."""
    recipient, migration = thread.batching.recipient, thread.migration
    if recipient is None or not recipient.awaited:
        return list(events)
    grouping, key_field = migration.inputs.get(split_executor_id(sender)[0], ("shuffle", None))
    if grouping != "fields":
        if not thread.batching.hold_unkeyed:
            return list(events)
        thread.batching.unkeyed_held.append((sender, list(events)))
        return []
    passed: list[Any] = []
    max_parallelism = migration.max_parallelism
    for event in events:
        group = key_group_of(grouping_key(event, key_field), max_parallelism)
        if recipient.holds(group):
            recipient.hold(group, event)
        else:
            passed.append(event)
    return passed
