"""Schedules: slots, Storm's round-robin, key-group ranges."""

from __future__ import annotations

import itertools

import pytest

from elastream.core.schedule import (
    Schedule,
    ScheduleError,
    fresh_node_names,
    initial_schedule,
    key_group_ranges,
    round_robin,
)
from elastream.core.topology import parse_manifest
from support.manifests import edge, manifest, sink, src, work


def test_initial_schedule_is_round_robin_in_topological_order() -> None:
    topology = parse_manifest(
        manifest([src("s", 2), work("a", 3), sink("z")], [edge("s", "a"), edge("a", "z")], nodes=3)
    )
    schedule = initial_schedule(topology)
    assert schedule.placement() == {
        "node-0": ["a#1", "s#0"],
        "node-1": ["a#2", "s#1"],
        "node-2": ["a#0", "z#0"],
    }
    assert schedule.parallelism() == {"s": 2, "a": 3, "z": 1}


def test_round_robin_skips_full_nodes_and_refuses_overflow() -> None:
    schedule = round_robin(["a#0", "a#1", "a#2"], ["n1", "n2"], 2)
    assert sorted(len(schedule.executors_on(n)) for n in schedule.nodes) == [1, 2]
    with pytest.raises(ScheduleError):
        round_robin(["a#0", "a#1", "a#2"], ["n1"], 2)


def test_slots_are_enforced() -> None:
    with pytest.raises(ScheduleError, match="has 1 slots"):
        Schedule({"a#0": "n", "a#1": "n"}, ("n",), 1)
    with pytest.raises(ScheduleError, match="unknown node"):
        Schedule({"a#0": "m"}, ("n",), 1)


def test_schedule_round_trips_through_dict() -> None:
    schedule = round_robin(["a#0", "b#0", "b#1"], ["node-0", "node-1"], 4)
    assert Schedule.from_dict(schedule.to_dict()) == schedule


def test_key_groups_are_contiguous_and_cover_everything() -> None:
    for max_par in (1, 7, 128):
        for k in range(1, min(max_par, 12) + 1):
            ranges = key_group_ranges(max_par, k)
            assert ranges[0].start == 0 and ranges[-1].stop == max_par
            assert all(a.stop == b.start for a, b in itertools.pairwise(ranges))
            assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_fresh_node_names_continue_numbering() -> None:
    assert fresh_node_names(["node-0", "node-3"], 2) == ["node-4", "node-5"]


def test_key_hash_is_stable_and_spreads_keys() -> None:
    import zlib

    from elastream.core.schedule import key_group_of, stable_key_hash

    assert stable_key_hash("user-7") == zlib.crc32(b"user-7")  # not salted per process, unlike hash()
    assert stable_key_hash(3) != stable_key_hash(4)
    groups = [key_group_of(k, 16) for k in range(1600)]
    assert all(60 <= groups.count(g) <= 140 for g in range(16))
    groups = [key_group_of(f"k{k}", 16) for k in range(1600)]
    assert all(60 <= groups.count(g) <= 140 for g in range(16))
