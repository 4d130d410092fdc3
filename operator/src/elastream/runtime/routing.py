"""Routing: how an executor's output reaches the executors downstream of it.

`Router` implements the groupings of DESIGN.md over the schedule's parallelism: shuffle, fields (key -> key
group -> owning executor, contiguous key-group ranges as `key_group_owner` says), all (broadcast) and global
(executor 0). A shuffle stream is load-aware by default: events collect in one buffer and each full frame
goes to the receiver whose channel has the most free credit, i.e. the one draining fastest (Storm's answer
to the same problem, its load-aware shuffle), so a vertex goes at the sum of its executors' speeds instead
of k times its slowest one's. `balance: round-robin` keeps the plain deal in turn. Either way a channel
stays FIFO and every event goes down exactly one channel, so the migration protocols' in-band markers and
exactly-once accounting see no difference.

During a migration that pauses only what moves (`core.migration_scope`), a router *holds* what is addressed
to the moving receivers (`hold`): a shuffle stream sends to the receivers that stay, a keyed, broadcast or
global one keeps the events for a moving receiver aside; COMMIT goes in-band on the held channels only
(`send_control_held`); once the new schedule is in place `reroute` swaps in its outputs and sends what was
held to the new receivers (or `release` sends it to the old ones after all, when the migration aborted).

During a migration of scope `keyGroups` (`core.keygroup_batches`) nothing is held here: `flip` sends MARKER
behind what went to each donor and from then on routes the step's key groups to their recipients (a keyed
stream: a per-key-group table of channels, the recipients' channels added), or sends the whole stream to the
vertex's new instances (any other grouping).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from elastream.core.schedule import key_group_of, key_group_owner
from elastream.core.topology import Stream, Topology, split_executor_id
from elastream.runtime.transport import BLOCKED_LOG_S, MAX_BATCH, Channel, wait_for_any_credit

log = logging.getLogger("elastream.worker")

#: how an executor opens the channel from one of its executors to a receiver: (sender, receiver, endpoint)
OpenChannel = Callable[[str, str, str], Channel]
#: events a router holds for moving receivers before its executor stops taking input (back-pressure)
HOLD_LIMIT = 4 * MAX_BATCH


def grouping_key(event: Any, field: str | None) -> Any:
    """The key a fields grouping hashes: the value's `field` when the value is a mapping holding it, else the
    event's key."""
    value = event[2]
    return value[field] if isinstance(value, Mapping) and field in value else event[1]


class OutputStream:
    """One output stream of an executor: its grouping and a channel per downstream executor (by index).

    A load-aware shuffle stream has one buffer, `pending`, sent as a whole frame to the channel `choose`
    picks; every other stream has a buffer per channel."""

    def __init__(self, stream: Stream, max_parallelism: int, channels: Sequence[Channel]) -> None:
        self.stream = stream
        self.grouping = stream.grouping
        self.field = stream.key
        self.max_parallelism = max_parallelism
        self.channels = list(channels)
        self.buffers: list[list[Any]] = [[] for _ in channels]
        self.next_index = 0
        self.load_aware = stream.grouping == "shuffle" and stream.balance == "load-aware" and len(channels) > 1
        self.pending: list[Any] = []
        #: the pending buffer goes out when it holds this many events: the frame limit of the channel with
        #: the most free credit when the last frame went (the likely next target)
        self.pending_limit = self.channels[0].frame_limit if self.channels else MAX_BATCH
        #: during a partial migration: the indices of the moving receivers, and whether all of them move
        self.held: frozenset[int] = frozenset()
        self.held_whole = False
        #: what is held for them: (event, receiver index, or None to be routed afresh by the new schedule)
        self.held_events: list[tuple[Any, int | None]] = []
        #: during a migration of scope `keyGroups`, a keyed stream's owner of each key group (an index into
        #: `channels`, which then holds the recipients' channels after the old ones); None: by the ranges
        self.owners: list[int] | None = None

    def choose(self, n: int, stop: threading.Event) -> tuple[Channel, float]:
        """The channel for the next frame of `n` events: the one with the most free credit, ties going to the
        channel after the last one chosen (so equal receivers are dealt in turn). When no channel has room
        for the frame, waits until one has (the seconds waited are returned: blocked, not busy)."""
        blocked = 0.0
        k = len(self.channels)
        while True:
            best, best_free = self.next_index, -1
            for offset in range(k):
                index = (self.next_index + offset) % k
                free = self.channels[index].free_credit()
                if free > best_free:
                    best, best_free = index, free
            channel = self.channels[best]
            if best_free >= n or channel.in_flight == 0 or stop.is_set():
                self.next_index = (best + 1) % k
                return channel, blocked
            waited = wait_for_any_credit(self.channels, stop)
            if int((blocked + waited) / BLOCKED_LOG_S) > int(blocked / BLOCKED_LOG_S):
                log.warning(
                    "blocked on all %d channels of %s -> %s for %.0f s: none has room for %d events",
                    k,
                    self.channels[0].sender,
                    self.stream.dst,
                    blocked + waited,
                    n,
                )
            blocked += waited

    def send_pending(self, stop: threading.Event, n: int | None = None) -> float:
        """Send the pending buffer (its first `n` events) as one frame to the channel `choose` picks; returns
        the seconds blocked."""
        if n is None or n >= len(self.pending):
            events, self.pending = self.pending, []
        else:
            events, self.pending = self.pending[:n], self.pending[n:]
        channel, blocked = self.choose(len(events), stop)
        blocked += channel.send_events(events, stop)
        self.pending_limit = max(self.channels, key=Channel.free_credit).frame_limit
        return blocked

    def targets(self, event: Any) -> Sequence[int]:
        k = len(self.channels)
        if self.grouping == "shuffle":
            index = self.next_index
            self.next_index = (index + 1) % k
            return (index,)
        if self.grouping == "fields":
            key = grouping_key(event, self.field)
            group = key_group_of(key, self.max_parallelism)
            if self.owners is not None:
                return (self.owners[group],)
            return (key_group_owner(self.max_parallelism, k, group),)
        if self.grouping == "all":
            return range(k)
        return (0,)


class Router:
    """Buffers emitted events per downstream executor and sends them in frames of up to the channel's
    `frame_limit` (`MAX_BATCH` at most, half the channel's credit window). `opener` opens a channel to a
    receiver a migration of scope `keyGroups` names (None: this router cannot take part in one)."""

    def __init__(
        self, outputs: Sequence[OutputStream], stop: threading.Event, opener: OpenChannel | None = None
    ) -> None:
        self.outputs = list(outputs)
        self.stop = stop
        self.blocked_s = 0.0
        self.opener = opener

    def route(self, event: Any) -> None:
        for output in self.outputs:
            if output.held:
                self._route_holding(output, event)
                continue
            if output.load_aware:
                output.pending.append(event)
                if len(output.pending) >= output.pending_limit:
                    self.blocked_s += output.send_pending(self.stop)
                continue
            for index in output.targets(event):
                buffer = output.buffers[index]
                buffer.append(event)
                channel = output.channels[index]
                if len(buffer) >= channel.frame_limit:
                    self.blocked_s += channel.send_events(buffer, self.stop)
                    output.buffers[index] = []

    def route_batch(self, events: Sequence[Any]) -> None:
        """`route` every event of `events`, in order, with what `route` would send: where a run of events goes
        to one buffer (a load-aware stream's pending buffer, a stream to one receiver, executor 0 of a global
        stream, each receiver of a broadcast) it goes at once and leaves in frames of the channel's
        `frame_limit`; a stream that deals (round-robin shuffle, fields over several receivers) or holds (a
        partial migration) takes them one by one."""
        for output in self.outputs:
            if output.held:
                for event in events:
                    self._route_holding(output, event)
            elif output.load_aware:
                output.pending += events
                while len(output.pending) >= output.pending_limit:
                    self.blocked_s += output.send_pending(self.stop, output.pending_limit)
            elif output.owners is None and (len(output.channels) == 1 or output.grouping == "global"):
                self._fill(output, 0, events)
            elif output.grouping == "all":
                for index in range(len(output.channels)):
                    self._fill(output, index, events)
            else:
                buffers, channels = output.buffers, output.channels
                for event in events:
                    for index in output.targets(event):
                        buffer = buffers[index]
                        buffer.append(event)
                        if len(buffer) >= channels[index].frame_limit:
                            self.blocked_s += channels[index].send_events(buffer, self.stop)
                            buffers[index] = []

    def _fill(self, output: OutputStream, index: int, events: Sequence[Any]) -> None:
        """Append `events` to the buffer of channel `index` and send every full frame of it."""
        buffer = output.buffers[index]
        buffer += events
        channel = output.channels[index]
        while len(buffer) >= channel.frame_limit:
            limit = channel.frame_limit
            if len(buffer) == limit:
                frame, buffer = buffer, []
            else:
                frame, buffer = buffer[:limit], buffer[limit:]
            output.buffers[index] = buffer
            self.blocked_s += channel.send_events(frame, self.stop)

    def flush(self) -> None:
        for output in self.outputs:
            if output.pending:
                self.blocked_s += output.send_pending(self.stop)
            for index, buffer in enumerate(output.buffers):
                if buffer:
                    self.blocked_s += output.channels[index].send_events(buffer, self.stop)
                    output.buffers[index] = []

    def _route_holding(self, output: OutputStream, event: Any) -> None:
        """`route` for a stream with moving receivers: hold what is theirs, send the rest."""
        if output.held_whole or len(output.held) >= len(output.channels):  # none stays: hold it for the new ones
            output.held_events.append((event, None))
            return
        if output.grouping == "shuffle":  # any receiver may take it: deal it to those that stay
            k = len(output.channels)
            while output.next_index in output.held:
                output.next_index = (output.next_index + 1) % k
            targets: Sequence[int] = (output.next_index,)
            output.next_index = (output.next_index + 1) % k
        else:
            targets = output.targets(event)
        for index in targets:
            if index in output.held:
                output.held_events.append((event, index))
                continue
            buffer = output.buffers[index]
            buffer.append(event)
            if len(buffer) >= output.channels[index].frame_limit:
                self.blocked_s += output.channels[index].send_events(buffer, self.stop)
                output.buffers[index] = []

    def hold(self, holds: Mapping[str, Sequence[int] | None]) -> None:
        """A partial migration begins (`core.migration_scope.Holds`: child vertex -> the moving receivers'
        indices, None when all move). What was routed before goes out first: the old receivers capture it."""
        self.flush()
        for output in self.outputs:
            if output.stream.dst in holds:
                indices = holds[output.stream.dst]
                output.held_whole = indices is None
                output.held = frozenset(range(len(output.channels)) if indices is None else indices)

    @property
    def holding(self) -> bool:
        return any(output.held for output in self.outputs)

    def held_count(self) -> int:
        return sum(len(output.held_events) for output in self.outputs)

    def holding_full(self) -> bool:
        """Whether the executor should stop taking input until the migration reroutes (back-pressure)."""
        return self.holding and self.held_count() >= HOLD_LIMIT

    def send_control_held(self, message: dict[str, Any]) -> None:
        """Send a control message (COMMIT) in-band on the held channels only, behind what they carried."""
        self.flush()
        for output in self.outputs:
            for index in sorted(output.held):
                self.blocked_s += output.channels[index].send_control(message, self.stop)

    def release(self) -> None:
        """The partial migration was aborted: what was held goes to the old receivers after all."""
        held = [(output, output.held_events) for output in self.outputs if output.held]
        for output, _ in held:
            output.held, output.held_whole, output.held_events = frozenset(), False, []
        self._deliver(held)

    def reroute(self, outputs: Sequence[OutputStream]) -> list[Channel]:
        """Switch to the new schedule's outputs (the channels to receivers that stay are the same objects)
        and send what was held to the new receivers. Returns the channels no longer used (to close)."""
        self.flush()
        kept = {id(c) for output in outputs for c in output.channels}
        dropped = [c for c in self.channels() if id(c) not in kept]
        by_vertex = {output.stream.dst: output for output in outputs}
        held = [(by_vertex[output.stream.dst], output.held_events) for output in self.outputs if output.held]
        self.outputs = list(outputs)
        self._deliver(held)
        return dropped

    def _deliver(self, held: Sequence[tuple[OutputStream, list[tuple[Any, int | None]]]]) -> None:
        for output, events in held:
            for event, index in events:
                targets = output.targets(event) if index is None else (index,)
                for target in targets:
                    buffer = output.buffers[target]
                    buffer.append(event)
                    if len(buffer) >= output.channels[target].frame_limit:
                        self.blocked_s += output.channels[target].send_events(buffer, self.stop)
                        output.buffers[target] = []
        self.flush()

    def flip(self, sender: str, flip: FlipOrder, marker: Callable[[list[Mapping[str, Any]]], dict[str, Any]]) -> None:
        """A step of a migration of scope `keyGroups` (`core.keygroup_batches`): what went to each donor so far
        goes out, then MARKER (`marker(batches)`, the donor's batches of the step) behind it; from now on the
        step's key groups go to their recipients (a keyed stream), or the whole stream goes to the vertex's
        new instances (`flip.channels`: any other grouping; the old donors' channels close)."""
        if self.opener is None:
            raise RuntimeError(f"{sender}: a key-group migration needs a router that can open channels")
        output = next((o for o in self.outputs if o.stream.dst == flip.vertex), None)
        if output is None:
            raise ValueError(f"{sender} sends nothing to {flip.vertex}; a FLIP of its key groups is not for it")
        self.flush()
        by_donor: dict[int, list[Mapping[str, Any]]] = {}
        for batch in flip.batches:
            by_donor.setdefault(int(batch["donorIndex"]), []).append(batch)
        for index, batches in sorted(by_donor.items()):
            self.blocked_s += output.channels[index].send_control(marker(batches), self.stop)
        existing = {(c.receiver, c.endpoint): i for i, c in enumerate(output.channels)}

        def channel_to(receiver: str, endpoint: str) -> int:
            found = existing.get((receiver, endpoint))
            if found is None:
                assert self.opener is not None
                output.channels.append(self.opener(sender, receiver, endpoint))
                output.buffers.append([])
                found = existing[(receiver, endpoint)] = len(output.channels) - 1
            return found

        if flip.channels is None:
            if output.owners is None:
                k = len(output.channels)
                output.owners = [key_group_owner(output.max_parallelism, k, g) for g in range(output.max_parallelism)]
            for batch in flip.batches:
                recipient = channel_to(str(batch["recipient"]), str(batch["endpoint"]))
                for group in batch["groups"]:
                    output.owners[int(group)] = recipient
            return
        channels = [output.channels[channel_to(receiver, endpoint)] for receiver, endpoint in flip.channels]
        kept = {id(c) for c in channels}
        for channel in output.channels:
            if id(channel) not in kept:
                channel.close()  # after the MARKER it carried: the donor has all it will get from this sender
        self.outputs[self.outputs.index(output)] = OutputStream(output.stream, output.max_parallelism, channels)

    def send_control(self, message: dict[str, Any]) -> None:
        """Send a control message in-band on every output channel (behind the data already sent)."""
        self.flush()
        for output in self.outputs:
            for channel in output.channels:
                self.blocked_s += channel.send_control(message, self.stop)

    def budget(self, at_most: int) -> int:
        """How many new events a source should generate now: what its channels can take without blocking,
        at most `at_most`; 0 while less than a quarter of their windows is free (then `await_credit`), so
        batches stay large when the receivers keep up. Events are stamped when generated: generating more
        than the channels take would only make them wait, stamped, in the router's buffers."""
        budget = at_most
        if self.holding_full():  # a partial migration holds this much for moving receivers already
            return 0
        for output in self.outputs:
            channels = output.channels[:1] if output.grouping == "global" else output.channels
            if output.held:  # the moving receivers' share is held (bounded above), not sent
                channels = [c for i, c in enumerate(channels) if i not in output.held]
                if not channels:
                    continue
            free = sum(channel.free_credit() for channel in channels)
            window = sum(channel.window for channel in channels)
            if output.grouping == "all":
                free //= max(1, len(channels))
                window //= max(1, len(channels))
            if free < min(at_most, window) // 4:
                return 0
            budget = min(budget, free)
        return max(1, budget)

    def await_credit(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for credit to come back on any channel (counted as blocked, not busy)."""
        start = time.perf_counter()
        poller = zmq.Poller()
        for channel in self.channels():
            poller.register(channel.socket, zmq.POLLIN)
        poller.poll(int(timeout_s * 1000))
        self.blocked_s += time.perf_counter() - start

    def channels(self) -> list[Channel]:
        return [c for output in self.outputs for c in output.channels]

    def take_blocked(self) -> float:
        blocked, self.blocked_s = self.blocked_s, 0.0
        return blocked


@dataclass(frozen=True)
class FlipOrder:
    """What a FLIP tells a sender (`Router.flip`): the vertex whose key groups move, the step's batches as the
    message carries them ({"n", "donorIndex", "recipient", "endpoint", "groups"}), and for a stream that is not
    keyed the vertex's new receivers in index order, (executor, endpoint) each (None for a keyed stream)."""

    vertex: str
    batches: Sequence[Mapping[str, Any]]
    channels: Sequence[tuple[str, str]] | None = None


def build_outputs(
    topology: Topology, sender: str, parallelism: Mapping[str, int], endpoints: Mapping[str, str], open: OpenChannel
) -> list[OutputStream]:
    """The output streams of executor `sender`: one per child vertex, with a channel per executor of it."""
    vertex = split_executor_id(sender)[0]
    return [
        OutputStream(
            topology.stream(vertex, child),
            topology.vertices[child].max_parallelism,
            [open(sender, f"{child}#{i}", endpoints[f"{child}#{i}"]) for i in range(parallelism[child])],
        )
        for child in topology.children(vertex)
    ]
