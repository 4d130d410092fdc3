"""A router takes a batch (`Router.route_batch`) as it takes its events one by one: the same frames down the same
channels, the same events held for moving receivers, with fakes at its channels (no sockets)."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from elastream.core.topology import Stream
from elastream.runtime.routing import OutputStream, Router


class Channel:
    """A channel that records the frames sent down it (no sockets; credit as configured)."""

    def __init__(self, receiver: str, frame_limit: int, free: int = 1000) -> None:
        self.receiver = receiver
        self.sender = "s#0"
        self.frame_limit = frame_limit
        self.window = 2 * frame_limit
        self.in_flight = 0
        self.free = free
        self.frames: list[list[int]] = []
        self._next_take = float("inf")  # `transport.Channel.free_credit`, which a load-aware stream also calls

    def send_events(self, events: list[Any], stop: threading.Event) -> float:
        self.frames.append([e[0] for e in events])
        return 0.0

    def send_control(self, message: dict[str, Any], stop: threading.Event) -> float:
        return 0.0

    def free_credit(self) -> int:
        return self.free


def make_router(grouping: str, receivers: int, balance: str = "load-aware") -> tuple[Router, list[Channel]]:
    channels = [Channel(f"b#{i}", frame_limit=3 + i, free=100 * (i + 1)) for i in range(receivers)]
    stream = Stream("s", "b", grouping, "k" if grouping == "fields" else None, balance)  # type: ignore[arg-type]
    return Router([OutputStream(stream, 8, channels)], threading.Event()), channels  # type: ignore[list-item]


CASES = [
    ("shuffle", 1, "load-aware"),
    ("shuffle", 3, "load-aware"),
    ("shuffle", 3, "round-robin"),
    ("fields", 1, "load-aware"),
    ("fields", 3, "load-aware"),
    ("all", 2, "load-aware"),
    ("global", 2, "load-aware"),
]


#: receiver 1 held exists only with two receivers or more (a stream whose receivers all move holds whole:
#: `core.migration_scope`)
HELD_CASES = [(*case, hold) for case in CASES for hold in (None, (1,), "whole") if not (hold == (1,) and case[1] == 1)]


@pytest.mark.parametrize(("grouping", "receivers", "balance", "hold"), HELD_CASES)
def test_a_batch_is_routed_as_its_events_one_by_one(grouping: str, receivers: int, balance: str, hold: Any) -> None:
    events = [(i, f"key-{i % 7}", {"k": i % 5}, 0.0) for i in range(100)]
    one, one_channels = make_router(grouping, receivers, balance)
    many, many_channels = make_router(grouping, receivers, balance)
    if hold is not None:
        for router in (one, many):
            router.hold({"b": None if hold == "whole" else hold})
    for event in events:
        one.route(event)
    rng = random.Random(7)
    start = 0
    while start < len(events):
        end = min(len(events), start + rng.choice((1, 2, 5, 17, 40)))
        many.route_batch(events[start:end])
        start = end
    one.flush()
    many.flush()
    assert [c.frames for c in many_channels] == [c.frames for c in one_channels]  # the same frames, in order
    assert one.outputs[0].held_events == many.outputs[0].held_events
    sent = [i for c in many_channels for frame in c.frames for i in frame]
    held = [e[0] for e, _ in many.outputs[0].held_events]
    copies = receivers if grouping == "all" and hold != "whole" else 1
    assert sorted(sent + held) == sorted(list(range(100)) * copies)  # each event once (to each receiver)
    assert all(len(frame) <= c.frame_limit for c in many_channels for frame in c.frames)
