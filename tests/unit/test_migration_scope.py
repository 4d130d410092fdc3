"""A migration that pauses only what moves: who takes part (`core.migration_scope`) and how a router holds what
is addressed to moving receivers, sends COMMIT into them only and reroutes or releases what it held."""

from __future__ import annotations

import threading
from typing import Any

from elastream.core.migration_protocol import MigrationCoordinator, Phase
from elastream.core.migration_scope import migration_parts
from elastream.core.schedule import Schedule
from elastream.core.topology import Stream, parse_manifest
from elastream.runtime.routing import HOLD_LIMIT, OutputStream, Router
from support.manifests import by_key, edge, manifest, sink, src, work


def diamond() -> Any:
    """src -> (a, keyed b) -> out"""
    return parse_manifest(
        manifest(
            [src("src"), work("a", 2), work("b", 2), sink("out")],
            [edge("src", "a"), by_key("src", "b"), edge("a", "out"), edge("b", "out")],
        )
    )


def schedule(placement: dict[str, list[str]]) -> Schedule:
    return Schedule.from_placement(placement, slots_per_node=4)


OLD = schedule({"node-0": ["src#0", "a#0", "b#0"], "node-1": ["a#1", "b#1", "out#0"]})


def test_scope_all_moves_everyone() -> None:
    new = schedule({"node-0": ["src#0", "a#0", "b#0"], "node-1": ["a#1", "out#0"], "node-2": ["b#1"]})
    parts = migration_parts(diamond(), OLD, new, "all")
    assert parts.moving_old == frozenset(OLD.assignment) and parts.moving_new == frozenset(new.assignment)
    assert not parts.kept and not parts.senders and parts.participants == frozenset(OLD.assignment)


def test_a_moved_executor_moves_alone_and_its_senders_hold_its_index() -> None:
    new = schedule({"node-0": ["src#0", "a#0", "b#0"], "node-1": ["a#1", "out#0"], "node-2": ["b#1"]})
    parts = migration_parts(diamond(), OLD, new, "moving")
    assert parts.moving_old == {"b#1"} and parts.moving_new == {"b#1"}
    assert parts.kept == {"src#0", "a#0", "b#0", "a#1", "out#0"}
    assert parts.senders == {"src#0": {"b": (1,)}}  # a and out do not send to b
    assert parts.participants == {"b#1", "src#0"}
    assert parts.partly_moving == {"b": (1,)}
    assert parts.pending_share("b#1", 2) == (0, 1)  # b#0 captured nothing: b#1 replays all b's shared list


def test_a_parallelism_change_moves_the_whole_vertex_and_its_senders_hold_all_of_it() -> None:
    new = schedule({"node-0": ["src#0", "a#0", "b#0"], "node-1": ["a#1", "b#1", "out#0"], "node-2": ["b#2"]})
    parts = migration_parts(diamond(), OLD, new, "moving")
    assert parts.moving_old == {"b#0", "b#1"} and parts.moving_new == {"b#0", "b#1", "b#2"}
    assert parts.senders == {"src#0": {"b": None}}  # routed afresh by the new parallelism
    assert parts.partly_moving == {}
    assert parts.pending_share("b#2", 3) == (2, 3)


def test_nothing_moving_is_a_migration_that_waits_for_nobody() -> None:
    parts = migration_parts(diamond(), OLD, OLD, "moving")
    assert not parts.participants and not parts.moving_new
    coordinator = MigrationCoordinator("m", "ccr", parts.participants, parts.moving_new)
    coordinator.start(0.0)
    for tick in range(1, 4):
        coordinator.on_tick(float(tick))
    assert coordinator.phase == Phase.REBALANCING  # prepare and commit had nobody to wait for
    coordinator.on_rebalanced(5.0)
    coordinator.on_tick(6.0)
    assert coordinator.phase == Phase.DONE


class Channel:
    """A channel that records what goes down it (no sockets, no credit limit)."""

    def __init__(self, receiver: str) -> None:
        self.receiver = receiver
        self.sender = "s#0"
        self.endpoint = f"tcp://127.0.0.1:{abs(hash(receiver)) % 1000 + 1}"
        self.frame_limit = 2
        self.window = 256
        self.in_flight = 0
        self.events: list[int] = []
        self.controls: list[str] = []

    def send_events(self, events: list[Any], stop: threading.Event) -> float:
        self.events += [e[0] for e in events]
        return 0.0

    def send_control(self, message: dict[str, Any], stop: threading.Event) -> float:
        self.controls.append(message["type"])
        return 0.0

    def free_credit(self) -> int:
        return self.window


def stream(grouping: str) -> Stream:
    return Stream("s", "b", grouping, "k" if grouping == "fields" else None)


def event(i: int) -> tuple[int, Any, Any, float]:
    return (i, f"key-{i}", {}, 0.0)


def router(grouping: str, receivers: int = 2) -> tuple[Router, list[Channel]]:
    channels = [Channel(f"b#{i}") for i in range(receivers)]
    return Router([OutputStream(stream(grouping), 8, channels)], threading.Event()), channels  # type: ignore[list-item]


def test_a_shuffle_stream_deals_to_the_receivers_that_stay_and_holds_nothing() -> None:
    r, (b0, b1) = router("shuffle")
    r.hold({"b": (1,)})
    for i in range(6):
        r.route(event(i))
    r.flush()
    assert b0.events == list(range(6)) and b1.events == [] and r.held_count() == 0


def test_a_keyed_stream_holds_a_moving_receivers_keys_and_reroutes_them_to_its_new_instance() -> None:
    r, (b0, b1) = router("fields")
    r.route(event(100))  # before PREPARE: goes to the old receivers (they capture it)
    r.hold({"b": (1,)})
    for i in range(20):
        r.route(event(i))
    r.flush()
    held = [e for e, _ in r.outputs[0].held_events]
    assert held and all(e[0] not in b1.events for e in held)  # nothing of b#1's went to the old b#1
    assert sorted(b0.events + [e[0] for e in held] + [e for e in b1.events if e == 100]) == sorted([*range(20), 100])
    r.send_control_held({"type": "commit", "mid": "m"})
    assert b1.controls == ["commit"] and b0.controls == []
    new_b1 = Channel("b#1")
    dropped = r.reroute([OutputStream(stream("fields"), 8, [b0, new_b1])])  # type: ignore[list-item]
    assert dropped == [b1]
    assert new_b1.events == [e[0] for e in held] and not r.holding  # the same index, in order


def test_a_whole_held_stream_is_routed_afresh_by_the_new_parallelism() -> None:
    r, (b0, b1) = router("fields")
    r.hold({"b": None})
    for i in range(30):
        r.route(event(i))
    assert b0.events == [] and b1.events == [] and r.held_count() == 30
    new = [Channel(f"b#{i}") for i in range(3)]
    r.reroute([OutputStream(stream("fields"), 8, new)])  # type: ignore[list-item]
    assert sorted(e for c in new for e in c.events) == list(range(30)) and all(c.events for c in new)


def test_an_aborted_migration_sends_what_was_held_to_the_old_receivers() -> None:
    r, (b0, _) = router("global")
    r.hold({"b": (0,)})
    for i in range(5):
        r.route(event(i))
    assert b0.events == [] and r.held_count() == 5
    r.release()
    assert b0.events == list(range(5)) and not r.holding


def test_a_router_holding_enough_asks_its_executor_for_back_pressure() -> None:
    r, _ = router("global")
    r.hold({"b": (0,)})
    for i in range(HOLD_LIMIT - 1):
        r.route(event(i))
    assert not r.holding_full() and r.budget(512) > 0
    r.route(event(HOLD_LIMIT))
    assert r.holding_full() and r.budget(512) == 0


def test_a_shuffle_stream_whose_every_receiver_is_held_holds_instead_of_spinning() -> None:
    r, (b0, b1) = router("shuffle")
    r.hold({"b": (0, 1)})  # every index listed rather than None: nothing to deal to
    for i in range(4):
        r.route(event(i))
    assert b0.events == b1.events == [] and r.held_count() == 4
