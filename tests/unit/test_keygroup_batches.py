"""Key groups that migrate a few at a time (`core.keygroup_batches`): which groups move, batch sizes, the plan,
the senders' routing table, the coordinator, and — through a simulated data plane with random interleavings —
that the in-band protocol processes every event exactly once, in order per channel and key group, with the
state of every earlier event."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from elastream.core.keygroup_batches import (
    Batch,
    BatchActionKind,
    BatchBudget,
    BatchCoordinator,
    Donor,
    Instance,
    KeyGroupTable,
    Move,
    Recipient,
    Step,
    batch_size,
    plan_batches,
    plan_steps,
    predicted_hold_s,
    senders_of,
    vertex_levels,
    whole_vertices,
)
from elastream.core.keygroup_batches import moves as all_moves_of
from elastream.core.migration_scope import migration_parts
from elastream.core.schedule import Schedule, key_group_ranges
from elastream.core.topology import parse_manifest
from support.manifests import by_key, edge, manifest, sink, src, work

MAX_P = 16


def topology(b: int = 2) -> Any:
    """src (2) -> keyed b -> keyed out, every vertex with max parallelism 16."""
    vertices = [src("src", 2), work("b", b), sink("out")]
    for vertex in vertices:
        vertex["maxParallelism"] = MAX_P
    return parse_manifest(manifest(vertices, [by_key("src", "b"), by_key("b", "out")]))


def schedule(placement: dict[str, list[str]]) -> Schedule:
    return Schedule.from_placement(placement, slots_per_node=4)


OLD = schedule({"node-0": ["src#0", "b#0"], "node-1": ["src#1", "b#1", "out#0"]})


def moves(top: Any, old: Schedule, new: Schedule) -> tuple[Move, ...]:
    """The moves with the executors `core.migration_scope` keeps (scope `moving`)."""
    return all_moves_of(top, old, new, migration_parts(top, old, new, "moving").kept)


# ------------------------------------------------------------------------------------------------ moves


def test_a_parallelism_change_moves_every_group_of_the_vertex_to_new_instances() -> None:
    new = schedule({"node-0": ["src#0", "b#0"], "node-1": ["src#1", "b#1", "out#0"], "node-2": ["b#2"]})
    found = moves(topology(3), OLD, new)
    assert {m.key_group for m in found} == set(range(MAX_P))
    assert {m.vertex for m in found} == {"b"}  # out keeps its executor and node; sources have no key groups
    assert all(not m.donor.new and m.recipient.new for m in found)
    new_ranges = key_group_ranges(MAX_P, 3)
    for m in found:  # b#0 stays on node-0 but is a new instance there, with the new ranges
        assert m.key_group in new_ranges[int(m.recipient.executor.split("#")[1])]
    assert Instance("b#0", "node-0", True) in {m.recipient for m in found}


def test_an_executor_that_changes_node_moves_all_its_groups_to_its_new_instance() -> None:
    new = schedule({"node-0": ["src#0", "b#0"], "node-1": ["src#1", "out#0"], "node-2": ["b#1"]})
    found = moves(topology(), OLD, new)
    assert {m.key_group for m in found} == set(key_group_ranges(MAX_P, 2)[1])
    assert {(m.donor, m.recipient) for m in found} == {(Instance("b#1", "node-1"), Instance("b#1", "node-2", True))}


def test_a_schedule_that_changes_nothing_moves_nothing() -> None:
    assert moves(topology(), OLD, OLD) == ()


def test_a_moving_source_is_no_key_group_move() -> None:
    new = schedule({"node-0": ["b#0"], "node-1": ["src#1", "b#1", "out#0"], "node-2": ["src#0"]})
    assert moves(topology(), OLD, new) == ()


# ------------------------------------------------------------------------------------------- batch sizes


def test_stateless_idle_vertex_takes_the_largest_batch() -> None:
    assert batch_size(0, 0, 128, BatchBudget()) == BatchBudget().max_groups


def test_huge_state_moves_one_group_at_a_time() -> None:
    assert batch_size(10e9, 100, 128, BatchBudget()) == 1


def test_state_bounds_a_batch_to_what_ships_within_the_hold_budget() -> None:
    budget = BatchBudget(hold_s=0.005, hop_s=0.001, ship_bytes_per_s=1e6, max_groups=1000)
    # 4 ms of shipping at 1 MB/s is 4,000 bytes: 40 groups of 100 bytes
    assert batch_size(100 * 128, 0, 128, budget) == 40
    assert predicted_hold_s(40, 100 * 128, 128, budget) == pytest.approx(0.002 + 0.004)


def test_the_input_rate_bounds_the_events_a_batch_holds() -> None:
    budget = BatchBudget(hold_s=0.005, hop_s=0.001, max_held_events=60, max_groups=1000)
    # 100,000 events/s over 100 groups: 1,000 per group per s, 6 per group in 6 ms: 10 groups hold 60
    assert batch_size(0, 100_000, 100, budget) == 10


def test_bigger_state_never_gives_bigger_batches() -> None:
    sizes = [batch_size(state, 1000, 128, BatchBudget()) for state in (0, 1e4, 1e5, 1e6, 1e7, 1e8)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] > sizes[-1]


# ------------------------------------------------------------------------------------------------- plan


def three_way_moves() -> tuple[Move, ...]:
    new = schedule({"node-0": ["src#0", "b#0"], "node-1": ["src#1", "b#1", "out#0"], "node-2": ["b#2"]})
    return moves(topology(3), OLD, new)


def test_every_move_is_in_exactly_one_batch_of_one_pair_within_its_size() -> None:
    all_moves = three_way_moves()
    batches = plan_batches(all_moves, {"b": 2})
    seen = [(b.vertex, g) for b in batches for g in b.key_groups]
    assert sorted(seen) == sorted((m.vertex, m.key_group) for m in all_moves)
    assert all(1 <= len(b.key_groups) <= 2 for b in batches)
    pair = {(m.vertex, m.key_group): (m.donor, m.recipient) for m in all_moves}
    assert all(pair[(b.vertex, g)] == (b.donor, b.recipient) for b in batches for g in b.key_groups)
    assert [b.number for b in batches] == list(range(len(batches)))


def test_batches_of_different_pairs_interleave() -> None:
    batches = plan_batches(three_way_moves(), {"b": 1})
    pairs = [(b.donor, b.recipient) for b in batches]
    assert len(set(pairs)) >= 2
    assert pairs[0] != pairs[1]


def test_flipping_every_batch_gives_the_new_schedules_owners() -> None:
    top = topology(3)
    new = schedule({"node-0": ["src#0", "b#0"], "node-1": ["src#1", "b#1", "out#0"], "node-2": ["b#2"]})
    table = KeyGroupTable.of(OLD, top, "b")
    for batch in plan_batches(moves(top, OLD, new), {"b": 3}):
        table = table.flipped(batch)
    assert table == KeyGroupTable.of(new, top, "b", new=True)


def test_a_batch_flipped_twice_is_refused() -> None:
    top = topology(3)
    new = schedule({"node-0": ["src#0", "b#0"], "node-1": ["src#1", "b#1", "out#0"], "node-2": ["b#2"]})
    batch = plan_batches(moves(top, OLD, new), {"b": 3})[0]
    table = KeyGroupTable.of(OLD, top, "b").flipped(batch)
    with pytest.raises(ValueError, match="not by its donor"):
        table.flipped(batch)


def test_flip_goes_to_every_executor_of_the_parents() -> None:
    assert senders_of(topology(), OLD, "b") == ("src#0", "src#1")
    assert senders_of(topology(), OLD, "out") == ("b#0", "b#1")


# ----------------------------------------------------------------------------------------- coordinator


def pair_steps(pairs: list[tuple[str, str]], levels: list[int] | None = None) -> tuple[Step, ...]:
    """One step of one batch per (donor, recipient) pair."""
    return tuple(
        Step(
            i,
            "b",
            (Batch(i, "b", Instance(d, "node-0"), Instance(r, "node-1", True), (i,)),),
            0 if levels is None else levels[i],
        )
        for i, (d, r) in enumerate(pairs)
    )


def flipped(actions: list[Any]) -> list[int]:
    return [a.step.number for a in actions if a.kind == BatchActionKind.FLIP]


def test_at_most_in_flight_steps_are_open_and_busy_instances_wait() -> None:
    steps = pair_steps([("b#0", "b#2"), ("b#0", "b#2"), ("b#1", "b#3"), ("b#1", "b#3")])
    coordinator = BatchCoordinator(steps, BatchBudget(in_flight=2))
    assert flipped(coordinator.start(0.0)) == [0, 2]  # 1 shares b#0/b#2 with 0
    assert coordinator.on_installed(3, 0.1) == []  # not flipped: ignored
    assert flipped(coordinator.on_installed(0, 0.1)) == [1]
    assert coordinator.on_installed(0, 0.2) == []  # a repeated ack changes nothing
    assert flipped(coordinator.on_installed(2, 0.3)) == [3]
    coordinator.on_installed(1, 0.4)
    last = coordinator.on_installed(3, 0.5)
    assert [a.kind for a in last] == [BatchActionKind.DONE]
    assert coordinator.hold_times_s() == pytest.approx([0.1, 0.4 - 0.1, 0.3, 0.5 - 0.3])


def test_a_level_opens_only_once_the_levels_below_are_installed() -> None:
    steps = pair_steps([("b#0", "b#2"), ("c#0", "c#2"), ("d#0", "d#2")], levels=[0, 1, 0])
    coordinator = BatchCoordinator(steps, BatchBudget(in_flight=3))
    assert flipped(coordinator.start(0.0)) == [0, 2]
    assert coordinator.on_installed(0, 0.1) == []
    assert flipped(coordinator.on_installed(2, 0.2)) == [1]


def test_a_step_of_several_batches_is_installed_when_all_of_them_are() -> None:
    a, b = (Batch(n, "b", Instance(f"b#{n}", "node-0"), Instance(f"b#{n}", "node-1", True), (n,)) for n in (0, 1))
    coordinator = BatchCoordinator((Step(0, "b", (a, b), 0),))
    assert flipped(coordinator.start(0.0)) == [0]
    assert coordinator.on_installed(1, 0.1) == []
    assert [x.kind for x in coordinator.on_installed(0, 0.2)] == [BatchActionKind.DONE]


def test_one_pair_moves_its_steps_one_after_another() -> None:
    coordinator = BatchCoordinator(pair_steps([("b#0", "b#1")] * 3), BatchBudget(in_flight=4))
    assert flipped(coordinator.start(0.0)) == [0]
    assert flipped(coordinator.on_installed(0, 1.0)) == [1]


def test_no_steps_is_done_at_once() -> None:
    assert [a.kind for a in BatchCoordinator(()).start(0.0)] == [BatchActionKind.DONE]


def test_a_step_that_stalls_fails_the_migration_once() -> None:
    coordinator = BatchCoordinator(pair_steps([("b#0", "b#1")]), BatchBudget(stall_s=5.0))
    coordinator.start(0.0)
    assert coordinator.on_tick(4.0) == []
    failed = coordinator.on_tick(6.0)
    assert [a.kind for a in failed] == [BatchActionKind.FAIL]
    assert "of b" in failed[0].reason and "not installed within 5 s" in failed[0].reason
    assert coordinator.on_tick(7.0) == [] and coordinator.on_installed(0, 7.0) == []


def test_levels_go_downstream_first_and_unkeyed_inputs_move_whole() -> None:
    top = parse_manifest(
        manifest(
            [src("s"), work("a", 2), work("b", 2), sink("out")],
            [by_key("s", "a"), edge("a", "b"), by_key("b", "out")],
        )
    )
    assert vertex_levels(top, ["a", "b", "out"]) == {"out": 0, "b": 1, "a": 2}
    assert vertex_levels(top, ["a", "out"]) == {"out": 0, "a": 0}  # b runs on between them: no order
    assert whole_vertices(top, ["a", "b", "out"]) == frozenset({"b"})
    batches = tuple(
        Batch(n, v, Instance(f"{v}#0", "node-0"), Instance(f"{v}#0", "node-1", True), (n,))
        for n, v in enumerate(["a", "b", "b", "out"])
    )
    steps = plan_steps(batches, top)
    assert [(s.vertex, [b.number for b in s.batches], s.level) for s in steps] == [
        ("out", [3], 0),
        ("b", [1, 2], 1),
        ("a", [0], 2),
    ]


# ------------------------------------------------------------------------------------------ executor roles


def test_a_donor_ships_once_it_has_every_upstream_marker_and_only_once() -> None:
    donor = Donor(frozenset({"src#0", "src#1"}))
    assert not donor.on_marker(0, "src#0")
    assert not donor.on_marker(0, "src#0")
    assert donor.on_marker(0, "src#1")
    assert not donor.on_marker(0, "src#1")
    with pytest.raises(ValueError, match="does not feed"):
        donor.on_marker(1, "b#7")


def test_a_recipient_holds_only_awaited_groups_and_releases_them_in_order() -> None:
    recipient = Recipient({3, 4})
    assert recipient.holds(3) and not recipient.holds(5)
    recipient.hold(3, "e1")
    recipient.hold(4, "e2")
    recipient.hold(3, "e3")
    with pytest.raises(ValueError, match="not awaited"):
        recipient.hold(5, "e4")
    assert recipient.held_count() == 3
    assert recipient.on_state([3]) == ["e1", "e3"]
    assert recipient.on_state([3]) == []  # a resent STATE releases nothing
    assert recipient.on_state([4]) == ["e2"] and recipient.held_count() == 0


# ------------------------------------------------------- the protocol over a simulated data plane


@dataclass
class SimInstance:
    """An executor instance of the keyed vertex: per-key-group state (events seen, in order)."""

    me: Instance
    owned: set[int]
    donor: Donor
    recipient: Recipient
    state: dict[int, list[tuple[str, int]]] = field(default_factory=dict)

    def process(self, group: int, event: tuple[str, int]) -> None:
        assert group in self.owned, f"{self.me} processed key group {group} it does not own"
        self.state.setdefault(group, []).append(event)


def simulate(seed: int, in_flight: int, size: int) -> int:
    """Two senders emit numbered events of random key groups to vertex b while b goes 2 → 3 (b#1 also changes
    node); FLIP reaches each sender at a random later step, channels deliver in random order across channels
    and FIFO within one, STATE travels on its own channel. At the end every group's state, at its new owner,
    holds exactly the events emitted for it, each once, in emission order per sender."""
    rng = random.Random(seed)
    top = topology(3)
    new = schedule({"node-0": ["src#0", "b#0"], "node-1": ["src#1", "out#0"], "node-2": ["b#1", "b#2"]})
    batches = plan_batches(moves(top, OLD, new), {"b": size})
    coordinator = BatchCoordinator(plan_steps(batches, top), BatchBudget(in_flight=in_flight))
    senders = list(senders_of(top, OLD, "b"))
    tables = {s: KeyGroupTable.of(OLD, top, "b") for s in senders}
    instances: dict[Instance, SimInstance] = {}
    final = KeyGroupTable.of(new, top, "b", new=True)
    for table_owner in set(KeyGroupTable.of(OLD, top, "b").owners) | set(final.owners):
        owned = {g for g, o in enumerate(KeyGroupTable.of(OLD, top, "b").owners) if o == table_owner}
        instances[table_owner] = SimInstance(
            table_owner, owned, Donor(frozenset(senders)), Recipient.of(batches, table_owner)
        )
    channels: dict[tuple[str, Instance], deque[Any]] = {}
    state_channel: deque[tuple[Batch, dict[int, list[tuple[str, int]]]]] = deque()
    pending_flips: list[tuple[int, str, Batch]] = []  # (due step, sender, batch)
    emitted: dict[tuple[str, int], list[tuple[str, int]]] = {}
    counters = dict.fromkeys(senders, 0)

    def act(actions: list[Any], step: int) -> None:
        for action in actions:
            if action.kind == BatchActionKind.FLIP:
                for sender in senders:
                    for batch in action.step.batches:
                        pending_flips.append((step + rng.randint(0, 20), sender, batch))

    def deliver(target: SimInstance, sender: str, item: Any) -> None:
        if item[0] == "marker":
            batch = item[1]
            if target.donor.on_marker(batch.number, sender):
                groups = {g: target.state.pop(g, []) for g in batch.key_groups}
                target.owned -= set(batch.key_groups)
                state_channel.append((batch, groups))
            return
        _, group, event = item
        if target.recipient.holds(group):
            target.recipient.hold(group, (group, event))
            nonlocal held_most
            held_most = max(held_most, sum(i.recipient.held_count() for i in instances.values()))
        else:
            target.process(group, event)

    act(coordinator.start(0), 0)
    held_most = 0  # the most events the recipients held at once
    step = 0
    while not coordinator.finished or any(channels.values()) or state_channel or pending_flips:
        step += 1
        assert step < 200_000, "the simulation does not end"
        due = [f for f in pending_flips if f[0] <= step]
        for flip in due:
            pending_flips.remove(flip)
            _, sender, batch = flip
            tables[sender] = tables[sender].flipped(batch)
            channels.setdefault((sender, batch.donor), deque()).append(("marker", batch))
        choice = rng.random()
        if choice < 0.4 and step < 3_000:
            sender = rng.choice(senders)
            group = rng.randrange(MAX_P)
            counters[sender] += 1
            event = (sender, counters[sender])
            emitted.setdefault((sender, group), []).append(event)
            channels.setdefault((sender, tables[sender].owner(group)), deque()).append(("event", group, event))
        elif choice < 0.9:
            busy = [key for key, queue in channels.items() if queue]
            if busy:
                sender, target = rng.choice(busy)
                deliver(instances[target], sender, channels[(sender, target)].popleft())
        elif state_channel:
            batch, groups = state_channel.popleft()
            recipient = instances[batch.recipient]
            recipient.owned |= set(batch.key_groups)
            for group, events in groups.items():
                recipient.state.setdefault(group, []).extend(events)
            for group, event in recipient.recipient.on_state(batch.key_groups):  # type: ignore[misc]
                recipient.process(group, event)
            act(coordinator.on_installed(batch.number, step), step)
    for group in range(MAX_P):
        holder = instances[final.owner(group)]
        others = [i for i in instances.values() if i is not holder and group in i.state and i.state[group]]
        assert not others, f"key group {group} has state outside its new owner {holder.me}"
        got = holder.state.get(group, [])
        for sender in senders:
            assert [e for e in got if e[0] == sender] == emitted.get((sender, group), [])
    assert all(not i.recipient.held for i in instances.values())
    assert sorted(coordinator.installed) == [b.number for b in batches]  # every batch installed, none failed
    return held_most


@pytest.mark.parametrize("seed", range(40))
def test_every_event_is_processed_once_in_order_with_its_groups_state(seed: int) -> None:
    simulate(seed, in_flight=1 + seed % 3, size=1 + seed % 4)


def test_the_simulation_does_hold_events_for_groups_in_flight() -> None:
    assert max(simulate(seed, in_flight=2, size=2) for seed in range(10)) > 0
