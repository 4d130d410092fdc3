"""Schedules: which node runs each executor, with per-node slots, and Storm's round-robin placement.

A `Schedule` is immutable; planners build new ones. Executors are named ``<vertex>#<i>`` and nodes
``node-<i>`` (`node_name`); the Kubernetes backend maps node names to worker pods.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from elastream.core.topology import Topology, executor_id, split_executor_id


class ScheduleError(ValueError):
    """A schedule breaks a rule: unknown node, executor without node, too many executors on a node."""


def node_name(index: int) -> str:
    return f"node-{index}"


def node_index(name: str) -> int:
    """The number in ``node-<i>``; names of other shapes sort after them (-1 means "not of that shape")."""
    prefix, _, number = name.rpartition("-")
    return int(number) if prefix and number.isdigit() else -1


def fresh_node_names(existing: Iterable[str], count: int) -> list[str]:
    """`count` node names not in `existing`, continuing the ``node-<i>`` numbering."""
    taken = set(existing)
    start = max((node_index(n) for n in taken), default=-1) + 1
    names: list[str] = []
    i = start
    while len(names) < count:
        if node_name(i) not in taken:
            names.append(node_name(i))
        i += 1
    return names


@dataclass(frozen=True)
class Schedule:
    """The map executor -> node, over an explicit ordered node list with `slots_per_node` slots each."""

    assignment: Mapping[str, str]
    nodes: tuple[str, ...]
    slots_per_node: int
    _by_node: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        node_set = set(self.nodes)
        if len(node_set) != len(self.nodes):
            raise ScheduleError(f"node list {list(self.nodes)} repeats a node")
        by_node: dict[str, list[str]] = {n: [] for n in self.nodes}
        for executor, node in self.assignment.items():
            if node not in node_set:
                raise ScheduleError(f"executor {executor} is placed on unknown node {node}")
            by_node[node].append(executor)
        for node, executors in by_node.items():
            if len(executors) > self.slots_per_node:
                raise ScheduleError(f"node {node} holds {len(executors)} executors but has {self.slots_per_node} slots")
            executors.sort(key=_executor_sort_key)
        object.__setattr__(self, "_by_node", {n: tuple(e) for n, e in by_node.items()})

    def executors_on(self, node: str) -> tuple[str, ...]:
        return self._by_node[node]

    def node_of(self, executor: str) -> str:
        return self.assignment[executor]

    def free_slots(self, node: str) -> int:
        return self.slots_per_node - len(self._by_node[node])

    def parallelism(self) -> dict[str, int]:
        return dict(Counter(split_executor_id(e)[0] for e in self.assignment))

    def placement(self) -> dict[str, list[str]]:
        """node -> executors, the snapshot's `placement` shape."""
        return {n: list(e) for n, e in self._by_node.items()}

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(sorted(self.assignment.items(), key=lambda item: _executor_sort_key(item[0])))

    def __len__(self) -> int:
        return len(self.assignment)

    def to_dict(self) -> dict[str, object]:
        return {"nodes": list(self.nodes), "slotsPerNode": self.slots_per_node, "placement": self.placement()}

    @staticmethod
    def from_placement(
        placement: Mapping[str, Sequence[str]], slots_per_node: int, nodes: Sequence[str] | None = None
    ) -> Schedule:
        assignment: dict[str, str] = {}
        for node, executors in placement.items():
            for executor in executors:
                if executor in assignment:
                    raise ScheduleError(f"executor {executor} is placed on both {assignment[executor]} and {node}")
                assignment[executor] = node
        node_list = tuple(nodes) if nodes is not None else tuple(sorted(placement, key=_node_sort_key))
        return Schedule(assignment, node_list, slots_per_node)

    @staticmethod
    def from_dict(data: Mapping[str, object]) -> Schedule:
        placement = data["placement"]
        nodes = data.get("nodes")
        slots = data["slotsPerNode"]
        if not isinstance(placement, Mapping) or not isinstance(slots, int):
            raise ScheduleError("a schedule needs placement: {node: [executors]} and slotsPerNode: int")
        return Schedule.from_placement(placement, slots, list(nodes) if isinstance(nodes, list) else None)


def _executor_sort_key(executor: str) -> tuple[str, int]:
    return split_executor_id(executor)


def _node_sort_key(node: str) -> tuple[int, str]:
    return (node_index(node), node)


def executor_order(topology: Topology, parallelism: Mapping[str, int] | None = None) -> list[str]:
    """All executors in topological vertex order, then by index: the order Storm's scheduler walks."""
    counts = parallelism or {v.name: v.parallelism for v in topology.vertices.values()}
    return [executor_id(v, i) for v in topology.order for i in range(counts.get(v, 0))]


def round_robin(executors: Sequence[str], nodes: Sequence[str], slots_per_node: int) -> Schedule:
    """Storm's even scheduler: executor j goes to node j mod N (skipping full nodes)."""
    if not nodes:
        raise ScheduleError("round-robin placement needs at least one node")
    if len(executors) > len(nodes) * slots_per_node:
        raise ScheduleError(f"{len(executors)} executors do not fit {len(nodes)} nodes × {slots_per_node} slots")
    load = dict.fromkeys(nodes, 0)
    assignment: dict[str, str] = {}
    cursor = 0
    for executor in executors:
        while load[nodes[cursor % len(nodes)]] >= slots_per_node:
            cursor += 1
        node = nodes[cursor % len(nodes)]
        assignment[executor] = node
        load[node] += 1
        cursor += 1
    return Schedule(assignment, tuple(nodes), slots_per_node)


def initial_schedule(topology: Topology) -> Schedule:
    """The schedule a new topology starts with: its executors round-robin over ``node-0..node-(N-1)``."""
    nodes = [node_name(i) for i in range(topology.nodes)]
    return round_robin(executor_order(topology), nodes, topology.slots_per_node)


def key_group_ranges(max_parallelism: int, parallelism: int) -> list[range]:
    """Contiguous key-group ranges of executors 0..k-1 (Flink's operator-index ranges, sizes differ by ≤ 1);
    `key_group_owner` inverts it."""
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} must be within 1..{max_parallelism}")
    return [
        range(
            (i * max_parallelism + parallelism - 1) // parallelism,
            ((i + 1) * max_parallelism - 1) // parallelism + 1,
        )
        for i in range(parallelism)
    ]


def key_group_owner(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """Index of the executor owning `key_group` when `max_parallelism` groups split over `parallelism`."""
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group {key_group} outside 0..{max_parallelism - 1}")
    return key_group * parallelism // max_parallelism


def stable_key_hash(key: object) -> int:
    """A 32-bit hash of a grouping key that is the same in every process (Python's `hash` of a str is salted
    per process, so two workers would disagree on a key's owner). Integers are mixed (Knuth's multiplicative
    hash), everything else hashes its text with CRC-32."""
    if isinstance(key, bool):
        key = int(key)
    if isinstance(key, int):
        return (key * 2654435761) & 0xFFFFFFFF
    data = key if isinstance(key, bytes) else str(key).encode()
    return zlib.crc32(data)


def key_group_of(key: object, max_parallelism: int) -> int:
    """The key group (0..max_parallelism-1) a key belongs to; `key_group_owner` maps it to an executor."""
    return stable_key_hash(key) % max_parallelism
