"""Routing: how an executor's output reaches the executors downstream of it.

`Router` implements the groupings of DESIGN.md over the schedule's parallelism: shuffle, fields (key -> key
group -> owning executor, contiguous key-group ranges as `key_group_owner` says), all (broadcast) and global
(executor 0). A shuffle stream is load-aware by default: events collect in one buffer and each full frame
goes to the receiver whose channel has the most free credit, i.e. the one draining fastest (Storm's answer
to the same problem, its load-aware shuffle), so a vertex goes at the sum of its executors' speeds instead
of k times its slowest one's. `balance: round-robin` keeps the plain deal in turn. Either way a channel
stays FIFO and every event goes down exactly one channel, so the migration protocols' in-band markers and
exactly-once accounting see no difference.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq

from elastream.core.schedule import key_group_of, key_group_owner
from elastream.core.topology import Stream, Topology, split_executor_id
from elastream.runtime.transport import BLOCKED_LOG_S, MAX_BATCH, Channel, wait_for_any_credit

log = logging.getLogger("elastream.worker")

#: how an executor opens the channel from one of its executors to a receiver: (sender, receiver, endpoint)
OpenChannel = Callable[[str, str, str], Channel]


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

    def send_pending(self, stop: threading.Event) -> float:
        """Send the pending buffer as one frame to the channel `choose` picks; returns the seconds blocked."""
        events, self.pending = self.pending, []
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
            return (key_group_owner(self.max_parallelism, k, key_group_of(key, self.max_parallelism)),)
        if self.grouping == "all":
            return range(k)
        return (0,)


class Router:
    """Buffers emitted events per downstream executor and sends them in frames of up to the channel's
    `frame_limit` (`MAX_BATCH` at most, half the channel's credit window)."""

    def __init__(self, outputs: Sequence[OutputStream], stop: threading.Event) -> None:
        self.outputs = list(outputs)
        self.stop = stop
        self.blocked_s = 0.0

    def route(self, event: Any) -> None:
        for output in self.outputs:
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

    def flush(self) -> None:
        for output in self.outputs:
            if output.pending:
                self.blocked_s += output.send_pending(self.stop)
            for index, buffer in enumerate(output.buffers):
                if buffer:
                    self.blocked_s += output.channels[index].send_events(buffer, self.stop)
                    output.buffers[index] = []

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
        for output in self.outputs:
            channels = output.channels[:1] if output.grouping == "global" else output.channels
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
