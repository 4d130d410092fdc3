"""Key groups that migrate a few at a time, controlled in band (Megaphone, VLDB 2019): the pure half.

CCR pauses every executor that moves for four control round trips through Redis, and every event addressed
to one waits them out. Here nothing pauses. A rescale is a list of *moves*: a key group of a vertex changes
its owner, an executor *instance* (the executor on a node: an executor that changes node is a new instance of
the same name). The moves go in small *batches*; each batch is carried out in band, like a checkpoint barrier,
by the three roles this module gives as state machines (the worker drives them, `control` drives the
coordinator):

1. **Senders** (every executor feeding the vertex) get FLIP(batch) from the controller. From then on they route
   the batch's key groups to their new owners, and they send a MARKER(batch) in band, behind the data, on the
   channel into every instance that gives a group of the batch away.
2. A **donor** (the old owner) processes its input as always. Once it has the batch's MARKER from every
   upstream executor, everything routed to it for those key groups before the flip is processed and nothing
   after it will come: it takes those groups' state out and ships it in band to each recipient (STATE), and
   writes a durable copy to Redis off the critical path. It keeps processing its other key groups throughout.
3. A **recipient** (the new owner) processes what it already owns. An event of a key group it is still to
   receive is held, for that key group only, until the group's STATE arrives; then the group's held events are
   processed in arrival order, before any later event of that group.

Per channel the order is FIFO, so every event of a key group is processed exactly once, by the owner of its
side of the marker, with the state of every earlier event. What waits is only the events of the few key
groups in flight, for the time of their batch; executors that gain or lose nothing see no change.

How big a batch is (`batch_size`): as many key groups as ship within `BatchBudget.hold_s` at the measured
transfer rate, and no more than the held events a batch may collect at the vertex's input rate allow,
between 1 and `max_groups`. The coordinator keeps at most `in_flight` batches open at once (a controller
round trip per batch lengthens the migration, not any event's wait) and orders them so that each donor and
recipient works on one batch at a time where the plan allows.

Failure: a worker that dies, or a batch whose STATE does not arrive within `stall_s`, ends the batched
migration; the control layer rolls the topology back to the last periodic checkpoint (as `moving` does), so
no key group is ever half moved: a batch is installed whole (its STATE carries all its groups) or not at
all, and a rollback restores every group from one consistent cut.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from elastream.core.schedule import Schedule, key_group_owner
from elastream.core.topology import Topology, executor_id, split_executor_id


@dataclass(frozen=True, order=True)
class Instance:
    """An executor instance: what owns key groups. A migration starts a *new* instance of every executor that
    moves (its node or its vertex's parallelism changes: `core.migration_scope`), beside the old one, in the
    worker's staged generation; an executor that is kept is one instance throughout (`new` False)."""

    executor: str
    node: str
    new: bool = False

    def __str__(self) -> str:
        return f"{self.executor}@{self.node}{' (new)' if self.new else ''}"


@dataclass(frozen=True, order=True)
class Move:
    """Key group `key_group` of `vertex` goes from `donor` to `recipient`."""

    vertex: str
    key_group: int
    donor: Instance
    recipient: Instance


def owner(
    schedule: Schedule, vertex: str, max_parallelism: int, key_group: int, new: bool, kept: frozenset[str]
) -> Instance:
    """The instance that owns `key_group` of `vertex` under `schedule` (`new`: the migration's target, whose
    executors are new instances unless `kept`)."""
    parallelism = schedule.parallelism()[vertex]
    executor = executor_id(vertex, key_group_owner(max_parallelism, parallelism, key_group))
    return Instance(executor, schedule.node_of(executor), new and executor not in kept)


def moves(topology: Topology, old: Schedule, new: Schedule, kept: frozenset[str]) -> tuple[Move, ...]:
    """Every key group whose owner differs between `old` and `new` (`kept`: the executors that run on as they
    are), sorted by vertex and key group: every key group of an executor that moves. A source's read position
    is not a key group: sources are not here (a moving source hands its position over at the end)."""
    found: list[Move] = []
    sources = set(topology.sources)
    for name in sorted(topology.vertices):
        if name in sources:
            continue
        max_parallelism = topology.vertices[name].max_parallelism
        for group in range(max_parallelism):
            donor = owner(old, name, max_parallelism, group, False, kept)
            recipient = owner(new, name, max_parallelism, group, True, kept)
            if donor != recipient:
                found.append(Move(name, group, donor, recipient))
    return tuple(found)


#: how long a node waits for the handshakes of the channels it opens ahead of a migration's FLIPs (WARM) before
#: it acks anyway; the controller waits that and a second more for the acks, then flips either way
WARM_WAIT_S = 1.0


# ------------------------------------------------------------------------------------------- batch sizes


@dataclass(frozen=True)
class BatchBudget:
    """What a batch may cost. Defaults: a held key group waits about 5 ms for its state on a loopback data
    plane that ships msgpack at about 50 MB/s; at most 512 events (a data frame) held per batch."""

    #: how long a batch's events may wait for its state (the ship time the size aims at)
    hold_s: float = 0.005
    #: the fixed part of a batch's time: MARKER and STATE each one hop of the data plane
    hop_s: float = 0.001
    #: bytes of state a donor ships per second in band
    ship_bytes_per_s: float = 50e6
    #: events a batch may hold at most (its key groups' share of the input rate over `hold_s`)
    max_held_events: int = 512
    #: key groups in one batch at most: "a few at a time"
    max_groups: int = 16
    #: batches open at once
    in_flight: int = 2
    #: a batch whose state has not arrived in this time fails the migration (a rollback follows)
    stall_s: float = 10.0


#: vertex -> (bytes of state, events/s into it): what batch sizes are chosen from (`batch_size`)
Load = Mapping[str, tuple[float, float]]


def vertex_loads(state_bytes: Mapping[str, int], input_rates: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Each vertex's (state bytes, input events/s) from the last checkpoint's sizes and the analysed window's
    rates (a vertex missing from one has 0 there)."""
    return {
        v: (float(state_bytes.get(v, 0)), float(input_rates.get(v, 0.0))) for v in set(state_bytes) | set(input_rates)
    }


def batch_size(state_bytes: float, events_per_s: float, key_groups: int, budget: BatchBudget) -> int:
    """Key groups per batch of a vertex with `state_bytes` of state and `events_per_s` of input over
    `key_groups` key groups (its max parallelism): as many as ship within the hold budget and hold at most
    `max_held_events`, between 1 and `max_groups`. State and rate are spread evenly over the key groups."""
    if key_groups < 1:
        raise ValueError(f"key_groups must be at least 1, not {key_groups}")
    shipping_s = max(budget.hold_s - budget.hop_s, 0.0)
    per_group_bytes = max(state_bytes, 0.0) / key_groups
    by_state = math.inf if per_group_bytes <= 0 else shipping_s * budget.ship_bytes_per_s / per_group_bytes
    per_group_events = max(events_per_s, 0.0) / key_groups * (budget.hold_s + budget.hop_s)
    by_events = math.inf if per_group_events <= 0 else budget.max_held_events / per_group_events
    size = min(by_state, by_events, float(budget.max_groups))
    return max(1, int(size))


def predicted_hold_s(groups: int, state_bytes: float, key_groups: int, budget: BatchBudget) -> float:
    """How long the events of a batch of `groups` key groups wait for their state (the model `batch_size`
    uses): one hop for the marker, one for the state, and the state's bytes at the shipping rate."""
    return 2 * budget.hop_s + groups * max(state_bytes, 0.0) / key_groups / budget.ship_bytes_per_s


@dataclass(frozen=True)
class Batch:
    """Key groups that move together: one donor to one recipient, of one vertex."""

    number: int
    vertex: str
    donor: Instance
    recipient: Instance
    key_groups: tuple[int, ...]


def plan_batches(
    all_moves: Iterable[Move],
    sizes: Mapping[str, int],
) -> tuple[Batch, ...]:
    """The moves in batches of at most `sizes[vertex]` key groups (1 for a vertex not in `sizes`), each batch
    one donor → one recipient. Batches of different (donor, recipient) pairs interleave round-robin, so that
    consecutive batches — the ones open together — mostly involve different executors and every pair
    progresses from the start."""
    by_pair: dict[tuple[str, Instance, Instance], list[int]] = {}
    for move in sorted(all_moves):
        by_pair.setdefault((move.vertex, move.donor, move.recipient), []).append(move.key_group)
    queues: list[list[tuple[str, Instance, Instance, tuple[int, ...]]]] = []
    for (vertex, donor, recipient), groups in sorted(by_pair.items()):
        size = max(1, sizes.get(vertex, 1))
        queues.append([(vertex, donor, recipient, tuple(groups[i : i + size])) for i in range(0, len(groups), size)])
    batches: list[Batch] = []
    while any(queues):
        for queue in queues:
            if queue:
                vertex, donor, recipient, batch_groups = queue.pop(0)
                batches.append(Batch(len(batches), vertex, donor, recipient, batch_groups))
    return tuple(batches)


# ------------------------------------------------------------------------------------------ routing table


@dataclass(frozen=True)
class KeyGroupTable:
    """Who owns each key group of one vertex while its groups move: the senders' routing. It starts as the
    old schedule's ranges and changes one flipped batch at a time."""

    vertex: str
    owners: tuple[Instance, ...]

    @classmethod
    def of(
        cls, schedule: Schedule, topology: Topology, vertex: str, new: bool = False, kept: frozenset[str] = frozenset()
    ) -> KeyGroupTable:
        max_parallelism = topology.vertices[vertex].max_parallelism
        return cls(
            vertex, tuple(owner(schedule, vertex, max_parallelism, g, new, kept) for g in range(max_parallelism))
        )

    def owner(self, key_group: int) -> Instance:
        return self.owners[key_group]

    def flipped(self, batch: Batch) -> KeyGroupTable:
        """The table after `batch` flipped: its key groups owned by its recipient. Flipping a batch whose groups
        are not its donor's (flipped already, or another plan's) is an error, never a silent re-route."""
        if batch.vertex != self.vertex:
            raise ValueError(f"batch {batch.number} moves key groups of {batch.vertex}, not of {self.vertex}")
        owners = list(self.owners)
        for group in batch.key_groups:
            if owners[group] != batch.donor:
                raise ValueError(
                    f"batch {batch.number}: key group {group} of {self.vertex} is owned by {owners[group]}, "
                    f"not by its donor {batch.donor}"
                )
            owners[group] = batch.recipient
        return KeyGroupTable(self.vertex, tuple(owners))


# ------------------------------------------------------------------------------------------------ steps


@dataclass(frozen=True)
class Step:
    """Batches flipped together by one FLIP: one batch of a vertex whose every input is keyed, or all the
    batches of a vertex with an input that is not (a shuffle, broadcast or global stream cannot send one key
    group elsewhere: its senders switch the whole stream to the new instances at once)."""

    number: int
    vertex: str
    batches: tuple[Batch, ...]
    #: steps of a lower level go first (`vertex_levels`)
    level: int

    def instances(self) -> frozenset[Instance]:
        return frozenset(i for b in self.batches for i in (b.donor, b.recipient))


def whole_vertices(topology: Topology, vertices: Iterable[str]) -> frozenset[str]:
    """Of `vertices`, those with an input stream that is not keyed (`fields`): they move in one step."""
    return frozenset(
        v for v in vertices if any(topology.stream(p, v).grouping != "fields" for p in topology.parents(v))
    )


def vertex_levels(topology: Topology, vertices: Iterable[str]) -> dict[str, int]:
    """The order moving `vertices` go in: downstream first. A vertex's level is 0 without a moving child, else
    one more than its moving children's highest. So while a vertex's key groups move, its senders (the
    executors of its parents) are the old schedule's and stay so, and the new instances of a parent only
    start sending once its children's groups are all in place."""
    moving = set(vertices)
    levels: dict[str, int] = {}

    def level(vertex: str) -> int:
        if vertex not in levels:
            below = [level(c) for c in topology.children(vertex) if c in moving]
            levels[vertex] = 1 + max(below) if below else 0
        return levels[vertex]

    for vertex in sorted(moving):
        level(vertex)
    return levels


def plan_steps(batches: Sequence[Batch], topology: Topology) -> tuple[Step, ...]:
    """The batches as steps (see `Step`), lowest level first, in the batches' order within a level."""
    vertices = {b.vertex for b in batches}
    whole, levels = whole_vertices(topology, vertices), vertex_levels(topology, vertices)
    grouped: list[tuple[str, tuple[Batch, ...]]] = []
    for vertex in sorted(whole):
        grouped.append((vertex, tuple(b for b in batches if b.vertex == vertex)))
    grouped += [(b.vertex, (b,)) for b in batches if b.vertex not in whole]
    order = sorted(range(len(grouped)), key=lambda i: (levels[grouped[i][0]], grouped[i][1][0].number))
    return tuple(Step(n, grouped[i][0], grouped[i][1], levels[grouped[i][0]]) for n, i in enumerate(order))


# ------------------------------------------------------------------------------------------- coordinator


class BatchActionKind(enum.Enum):
    #: the senders of the step's vertex route its key groups to their recipients and send MARKER in band
    FLIP = "flip"
    #: every batch is installed: the new schedule runs (instances that own nothing now retire)
    DONE = "done"
    #: the batched migration failed: roll back to the last periodic checkpoint
    FAIL = "fail"


@dataclass(frozen=True)
class BatchAction:
    kind: BatchActionKind
    step: Step | None = None
    reason: str = ""


class StepState(enum.Enum):
    WAITING = "waiting"
    FLIPPED = "flipped"
    INSTALLED = "installed"


@dataclass
class BatchCoordinator:
    """The controller's side: which steps to flip and when (events in: a batch's recipient installed it, ticks,
    failures; actions out). Steps of a level open only once every step of the levels below is installed; at
    most `budget.in_flight` steps are open at once, and a step waits while one of its instances is in another
    open step, unless nothing is open (so a plan of one donor and one recipient still runs)."""

    steps: tuple[Step, ...]
    budget: BatchBudget = field(default_factory=BatchBudget)
    states: dict[int, StepState] = field(init=False)
    installed: set[int] = field(init=False, default_factory=set)
    flipped_at: dict[int, float] = field(init=False, default_factory=dict)
    installed_at: dict[int, float] = field(init=False, default_factory=dict)
    finished: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.states = {s.number: StepState.WAITING for s in self.steps}
        self._step_of = {b.number: s.number for s in self.steps for b in s.batches}

    @property
    def batches(self) -> int:
        return len(self._step_of)

    def start(self, now: float) -> list[BatchAction]:
        return self._open(now)

    def on_installed(self, batch: int, now: float) -> list[BatchAction]:
        """The recipient of `batch` installed it (acks may repeat: a second one changes nothing)."""
        number = self._step_of.get(batch)
        if self.finished or number is None or self.states[number] != StepState.FLIPPED or batch in self.installed:
            return []
        self.installed.add(batch)
        if all(b.number in self.installed for b in self.steps[number].batches):
            self.states[number] = StepState.INSTALLED
            self.installed_at[number] = now
            return self._open(now)
        return []

    def on_tick(self, now: float) -> list[BatchAction]:
        if self.finished:
            return []
        for number, at in sorted(self.flipped_at.items()):
            if self.states[number] == StepState.FLIPPED and now - at > self.budget.stall_s:
                step = self.steps[number]
                missing = [b for b in step.batches if b.number not in self.installed]
                return self.on_failure(
                    f"{len(missing)} batch(es) of {step.vertex} (the first: {missing[0].donor} → "
                    f"{missing[0].recipient}, {len(missing[0].key_groups)} key groups) not installed within "
                    f"{self.budget.stall_s:g} s",
                    now,
                )
        return []

    def on_failure(self, reason: str, now: float) -> list[BatchAction]:
        if self.finished:
            return []
        self.finished = True
        return [BatchAction(BatchActionKind.FAIL, reason=reason)]

    def open_steps(self) -> list[Step]:
        return [s for s in self.steps if self.states[s.number] == StepState.FLIPPED]

    def _open(self, now: float) -> list[BatchAction]:
        actions: list[BatchAction] = []
        open_now = self.open_steps()
        busy = {i for s in open_now for i in s.instances()}
        waiting = [s for s in self.steps if self.states[s.number] == StepState.WAITING]
        level = min((s.level for s in open_now + waiting), default=0)
        while len(open_now) < max(1, self.budget.in_flight):
            ready = [s for s in waiting if s.level == level]
            free = next((s for s in ready if not s.instances() & busy), None)
            if free is None:
                if open_now or not ready:
                    break
                free = ready[0]
            waiting.remove(free)
            self.states[free.number] = StepState.FLIPPED
            self.flipped_at[free.number] = now
            open_now.append(free)
            busy |= free.instances()
            actions.append(BatchAction(BatchActionKind.FLIP, step=free))
        if not waiting and not open_now and not self.finished:
            self.finished = True
            actions.append(BatchAction(BatchActionKind.DONE))
        return actions

    def hold_times_s(self) -> list[float]:
        """Flip → installed of every installed step: the longest any of its events waited."""
        return [self.installed_at[n] - self.flipped_at[n] for n in sorted(self.installed_at)]


# ------------------------------------------------------------------------------------- executor roles


@dataclass
class Donor:
    """The old owner's side of the batches it gives away: it counts MARKERs per batch and says when a batch's
    state can be taken (MARKER from every upstream executor). It never holds input."""

    upstream: frozenset[str]
    marked: dict[int, set[str]] = field(default_factory=dict)
    shipped: set[int] = field(default_factory=set)

    def on_marker(self, batch: int, sender: str) -> bool:
        """MARKER of `batch` from `sender`; True exactly once: when the batch's state can be shipped now."""
        if batch in self.shipped:
            return False
        if sender not in self.upstream:
            raise ValueError(f"MARKER of batch {batch} from {sender}, which does not feed this executor")
        seen = self.marked.setdefault(batch, set())
        seen.add(sender)
        if seen >= self.upstream:
            self.shipped.add(batch)
            del self.marked[batch]
            return True
        return False


@dataclass
class Recipient:
    """The new owner's side: the key groups it is still to receive, and the events held for each until its
    STATE arrives (per key group, in arrival order)."""

    awaited: set[int]
    held: dict[int, list[object]] = field(default_factory=dict)

    @classmethod
    def of(cls, batches: Iterable[Batch], me: Instance) -> Recipient:
        return cls({g for b in batches if b.recipient == me for g in b.key_groups})

    def holds(self, key_group: int) -> bool:
        return key_group in self.awaited

    def hold(self, key_group: int, event: object) -> None:
        if key_group not in self.awaited:
            raise ValueError(f"key group {key_group} is not awaited: its events are processed, not held")
        self.held.setdefault(key_group, []).append(event)

    def held_count(self) -> int:
        return sum(len(events) for events in self.held.values())

    def on_state(self, key_groups: Sequence[int]) -> list[object]:
        """STATE of `key_groups` installed: the events held for them, to process now in arrival order (per
        key group; key groups in the order given). A group not awaited (a resent STATE) releases nothing."""
        released: list[object] = []
        for group in key_groups:
            if group in self.awaited:
                self.awaited.discard(group)
                released.extend(self.held.pop(group, []))
        return released


def senders_of(topology: Topology, schedule: Schedule, vertex: str) -> tuple[str, ...]:
    """The executors that feed `vertex` under `schedule` (FLIP goes to them): every executor of its parents."""
    parents = set(topology.parents(vertex))
    return tuple(sorted(e for e in schedule.assignment if split_executor_id(e)[0] in parents))
