"""Operators: the code an executor runs for each event, built-in or user-supplied.

An event is a tuple ``(id, key, value, ts)``: `id` is the number its source gave it (derived events keep
their input's id, so sinks can check exactly-once delivery), `key` the grouping key, `value` the payload
(anything msgpack can encode), `ts` the source's emission time (seconds since the epoch, for end-to-end
latency). User operators receive it as an `Event` named tuple (``event.key``); built-ins index the plain tuple.

The operator API (also for user code, named ``logic: {module: "package.module:Class"}`` in the manifest)::

    class Operator:
        def open(self, context: Context) -> None: ...          # once, before the first event
        def process(self, event, emit) -> None: ...            # emit(value, key=...) sends one event on
        def snapshot_state(self) -> dict[int, object]: ...     # stateful only: key group -> state
        def restore_state(self, state: dict[int, object]) -> None: ...
        def close(self) -> None: ...

`emit(value, key=SAME)` creates an event with the input's id and ts, the given value and, unless a new key
is given, the input's key. Stateful operators keep their state per key group (``context.key_group(key)``)
so that a rescale can move exactly the groups an executor gains or loses. Sources implement
`SourceOperator`: `poll(now, emit_new)` emits the events that are due, `position()`/`seek(position)` make
their read position part of a checkpoint.
"""

from __future__ import annotations

import heapq
import importlib
import logging
import math
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import redis

from elastream.core import rates
from elastream.core.rates import parse_rates
from elastream.core.schedule import key_group_of, key_group_ranges
from elastream.core.topology import Vertex, stream_key
from elastream.store.checkpoint import open_transactions_key, transaction_keys
from elastream.store.cluster import slot_mate
from elastream.store.codec import text
from elastream.store.retry import REDIS, backoff, is_redis_outage, retry_redis


class Event(NamedTuple):
    id: int
    key: Any
    value: Any
    ts: float


SAME: Any = object()
Emit = Callable[..., None]


class OperatorLoadError(Exception):
    """A `module:Class` named in the manifest cannot be loaded (message names the vertex and the fix)."""


@dataclass
class Context:
    """What an operator knows about where it runs."""

    vertex: str
    index: int
    parallelism: int
    max_parallelism: int
    config: Mapping[str, Any]
    #: key groups this executor owns (contiguous range; all of them for a non-keyed vertex)
    key_groups: range = field(default_factory=lambda: range(0))
    node_cpu: NodeCpu | None = None
    #: set when the executor stops: a built-in operator waiting for Redis gives up then
    stop: threading.Event | None = None

    def key_group(self, key: Any) -> int:
        return key_group_of(key, self.max_parallelism)


class Operator(Protocol):
    def open(self, context: Context) -> None: ...
    def process(self, event: Any, emit: Emit) -> None: ...
    def close(self) -> None: ...


class NodeCpu:
    """Emulated CPU of one node: sleep-mode costs hold one of the node's virtual cores while they sleep.

    This is how 8-9 nodes with 2 cores each fit on a 2-core machine: a `work` vertex with costMs 2 sleeps
    2 ms per event while holding a permit, so a node whose executors want more than its cores queue for them,
    as they would for real CPU. Fractional cores stretch the sleeps (0.5 cores: one permit, twice as long).
    """

    def __init__(self, cores: float | None) -> None:
        self.cores = cores
        self.permits = max(1, math.floor(cores)) if cores else 0
        self.stretch = self.permits / cores if cores else 1.0
        self._semaphore = threading.BoundedSemaphore(self.permits) if cores else None

    def sleep(self, seconds: float) -> float:
        """Do `seconds` of emulated CPU work; returns the work done (the time slept holding a core, unstretched),
        which may exceed `seconds` when the OS oversleeps. Waiting for a free core is not work."""
        if self._semaphore is None:
            start = time.perf_counter()
            time.sleep(seconds)
            return time.perf_counter() - start
        with self._semaphore:
            start = time.perf_counter()
            time.sleep(seconds * self.stretch)
            return (time.perf_counter() - start) / self.stretch


class Cost:
    """Per-event cost: `sleep` (emulated CPU through `NodeCpu`, the default) or `spin` (real CPU).

    Costs accumulate as a debt paid in slices of at least 1 ms, because sleeping 50 µs at a time is both
    inaccurate and expensive; over-sleeping is credited to the next events, so the mean cost is exact.
    """

    SLICE_S = 0.001

    def __init__(self, config: Mapping[str, Any], cpu: NodeCpu | None) -> None:
        self.per_event_s = float(config.get("costMs", 0.0)) / 1000.0
        self.spin = config.get("mode", "sleep") == "spin"
        self.cpu = cpu or NodeCpu(None)
        self.debt = 0.0

    def charge(self, events: int = 1) -> None:
        if self.per_event_s <= 0.0:
            return
        self.debt += self.per_event_s * events
        if self.debt >= self.SLICE_S:
            self.pay()

    def pay(self) -> None:
        if self.debt <= 0.0:
            return
        if self.spin:
            end = time.perf_counter() + self.debt
            while time.perf_counter() < end:
                pass
            self.debt = 0.0
        else:
            self.debt -= self.cpu.sleep(self.debt)


def _passes(event_id: int, selectivity: float) -> int:
    """How many copies of an event a vertex of this selectivity emits, deterministically from the event id
    (so a replay after a migration makes the same decision): floor(s) plus one more for a hash-chosen share."""
    whole = int(selectivity)
    fraction = selectivity - whole
    if fraction > 0.0 and ((event_id * 2654435761) & 0xFFFFFFFF) < fraction * 4294967296.0:
        whole += 1
    return whole


class Work:
    """`builtin: work` — spend `costMs` per event, emit `selectivity` events per input (default 1)."""

    def open(self, context: Context) -> None:
        self.cost = Cost(context.config, context.node_cpu)
        self.selectivity = float(context.config.get("selectivity", 1.0))

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        for _ in range(_passes(event[0], self.selectivity)):
            emit(event[2])

    def close(self) -> None:
        self.cost.pay()


class Filter(Work):
    """`builtin: filter` — keep a deterministic `selectivity` share of the events (by id)."""

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        if _passes(event[0], min(self.selectivity, 1.0)):
            emit(event[2])


class Count:
    """`builtin: count` — stateful keyed counter: emits the running count of the event's key for every event.

    With `key: FIELD` it counts by ``value[FIELD]`` when the value is a mapping holding it (else by the
    event key), as a fields grouping on FIELD routes, so a `count` fed by ``grouping: fields, key: FIELD``
    sees every event of a key. State is kept per key group, so a rescale moves exactly the groups an
    executor gains or loses."""

    def open(self, context: Context) -> None:
        self.context = context
        self.cost = Cost(context.config, context.node_cpu)
        field = context.config.get("key")
        self.field = None if field is None else str(field)
        self.groups: dict[int, dict[Any, int]] = {}

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        key = event[1]
        if self.field is not None:
            value = event[2]
            if isinstance(value, Mapping) and self.field in value:
                key = value[self.field]
        group = self.groups.setdefault(key_group_of(key, self.context.max_parallelism), {})
        count = group.get(key, 0) + 1
        group[key] = count
        emit(count)

    def snapshot_state(self) -> dict[int, Any]:
        return {g: dict(counts) for g, counts in self.groups.items()}

    def restore_state(self, state: Mapping[int, Any]) -> None:
        for g, counts in state.items():
            self.groups.setdefault(int(g), {}).update(counts)

    def counts(self) -> dict[Any, int]:
        return {k: c for group in self.groups.values() for k, c in group.items()}

    def close(self) -> None:
        self.cost.pay()


class Window:
    """`builtin: window` — tumbling keyed aggregate over `sizeMs` of processing time: when a window closes it
    emits, per key, ``[count, sum]`` of the numeric values it saw (the event carries the window's last id)."""

    def open(self, context: Context) -> None:
        self.context = context
        self.cost = Cost(context.config, context.node_cpu)
        self.size_s = float(context.config.get("sizeMs", 1000.0)) / 1000.0
        self.window_end = 0.0
        self.groups: dict[int, dict[Any, list[Any]]] = {}

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        now = time.time()
        if now >= self.window_end:
            self.flush(emit)
            self.window_end = (now // self.size_s + 1) * self.size_s
        key = event[1]
        group = self.groups.setdefault(key_group_of(key, self.context.max_parallelism), {})
        agg = group.get(key)
        value = event[2] if isinstance(event[2], int | float) and not isinstance(event[2], bool) else 0
        if agg is None:
            group[key] = [1, value, event[0], event[3]]
        else:
            agg[0] += 1
            agg[1] += value
            agg[2] = event[0]

    def timer(self, emit: Emit) -> None:
        """Called by an idle executor (every ~20 ms): close the window when its time is up, so the last
        window of a burst is emitted without waiting for a later event. Not called on close(): a migration
        stops executors mid-window and the open window moves with the state."""
        now = time.time()
        if self.groups and now >= self.window_end:
            self.flush(emit)
            self.window_end = (now // self.size_s + 1) * self.size_s

    def flush(self, emit: Emit) -> None:
        for group in self.groups.values():
            for key, (count, total, last_id, ts) in group.items():
                emit((count, total), key=key, event_id=last_id, ts=ts)
        self.groups = {}

    def snapshot_state(self) -> dict[int, Any]:
        return {g: {k: list(v) for k, v in keys.items()} for g, keys in self.groups.items()}

    def restore_state(self, state: Mapping[int, Any]) -> None:
        for g, keys in state.items():
            self.groups.setdefault(int(g), {}).update({k: list(v) for k, v in keys.items()})

    def close(self) -> None:
        self.cost.pay()


# --------------------------------------------------------------------------------------------------------
# Sources


class RateProfile(rates.RateProfile):
    """`core.rates.RateProfile` that reads a `csv:` rate file (the one piece of I/O a profile needs)."""

    def __init__(self, config: Mapping[str, Any], share: float) -> None:
        super().__init__(config, share, read_csv=read_rate_file)


#: the environment variable naming the directory `csv:` rate files are read from (and confined to); unset,
#: it is the manifest's directory (for `elastream run` the file's, for a worker pod /etc/elastream)
RATE_DIR_ENV = "ELASTREAM_RATE_DIR"
#: a rate file larger than this is refused unread (MAX_CSV_RATES lines of a few bytes each fit well within)
MAX_RATE_FILE_BYTES = 4 * 1_048_576


def rate_directory(manifest_dir: str) -> str:
    """The directory `csv:` paths are relative to and must stay inside: $ELASTREAM_RATE_DIR, else `manifest_dir`."""
    return os.environ.get(RATE_DIR_ENV) or manifest_dir


def read_rate_file(path: str) -> list[float]:
    """The rates of a `csv:` file; OSError or ValueError (naming the line, never its content) when it cannot
    be used. Only a regular file of at most MAX_RATE_FILE_BYTES is read (a FIFO or a device would hang or
    never end)."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses anything but a regular file
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("is not a regular file")
        data = handle.read(MAX_RATE_FILE_BYTES + 1)
    if len(data) > MAX_RATE_FILE_BYTES:
        raise ValueError(
            f"is larger than {MAX_RATE_FILE_BYTES // 1_048_576} MiB; one rate per line, one line per second"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"byte {exc.start} is not UTF-8; save the file as UTF-8") from None
    return parse_rates(text.splitlines())


def resolve_rate_file(vertex: Vertex, manifest_dir: str) -> Mapping[str, Any]:
    """The vertex's config with its `csv:` path made absolute inside the rate directory (`rate_directory`),
    checked readable: `OperatorLoadError` names the field and the file otherwise. The path, links resolved,
    must stay inside that directory; the file's content never appears in a message."""
    config = vertex.config
    if vertex.kind != "source" or not isinstance(config.get("csv"), str):
        return config
    csv = str(config["csv"])
    field_path = f"spec.vertices[{vertex.name}].source.csv"
    base = rate_directory(manifest_dir)
    why = rates.csv_path_problem(csv)
    path = os.path.join(base, csv)
    if why is None:
        root = os.path.realpath(base)
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            why = f"leads out of the rate directory {base} (through a link)"
    if why is not None:
        raise OperatorLoadError(
            f"{field_path}: {rates.shown(csv)} {why}; give a path inside the rate directory ({RATE_DIR_ENV}, else "
            "the manifest's directory)"
        )
    try:
        read_rate_file(path)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise OperatorLoadError(
            f"{field_path}: {path}: {reason}; fix the file or the path (relative paths start at the rate directory, "
            f"{RATE_DIR_ENV} or else the manifest's directory)"
        ) from None
    return {**config, "csv": path}


class SourceOperator(Protocol):
    def open(self, context: Context) -> None: ...
    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        """Emit up to `budget` due events through `emit_new(id, key, value)`; return how many were due."""
        ...

    def position(self) -> Any: ...
    def seek(self, position: Any) -> None: ...
    def close(self) -> None: ...


class Synthetic:
    """`source: {type: synthetic}` — numbered events at a rate profile.

    The id space is split into `maxParallelism` lanes, lane j holding the sequence numbers j, j+M, j+2M, ...
    (M = maxParallelism). Lanes are owned like key groups (contiguous ranges over the executors) and each
    lane offers rate/M events/s, so the vertex's total rate and its ids do not depend on its parallelism,
    and a rescale hands whole lanes, with their positions, to new executors: nothing is skipped or repeated.
    An event has id ``idOffset + seq``, key ``seq % keys`` and value ``seq``; `limit` caps the sequence
    numbers. The position is {lane: next index in the lane, "clock": the profile's start}.

    The rate profile's clock belongs to the topology, not to the executor: it starts when the topology's
    sources first open and travels in the position through checkpoints, migrations and recoveries, so a
    `steps`, `csv` or `profile` source continues at the rate of the step it is in after any rescale.

    What its lanes owe when an executor takes them over depends on why. After a migration it owes what
    the old executors had not emitted (what back-pressure held, what fell due during the pause) and emits
    it first, as a real source's queue would be drained: an event leaves as soon after its due time as the
    topology lets it, which is what latency is measured against. After a recovery (`pace_replay`) the
    events since the checkpoint are a replay of what was emitted once already: they come at the profile's
    rate from the takeover on, not in a burst (a minute's events replayed at once overloaded the recovery
    it follows), so the source then runs that much behind its profile."""

    #: the position's key for the profile clock's start (seconds since the epoch); the lanes' keys are ints
    CLOCK = "clock"
    #: the wall clock (replaceable in tests; `poll` and `offered` are given their time)
    wall_clock = staticmethod(time.time)

    def open(self, context: Context) -> None:
        self.context = context
        config = context.config
        self.cost = Cost(config, context.node_cpu)
        self.keys = int(config.get("keys", 1000))
        self.limit = int(config["limit"]) if config.get("limit") is not None else None
        self.id_offset = int(config.get("idOffset", 0))
        self.stride = context.max_parallelism
        self.lanes = list(context.key_groups)
        self.next: dict[int, int] = dict.fromkeys(self.lanes, 0)
        self.profile = RateProfile(config, len(self.lanes) / self.stride)
        #: the profile clock's start: now for a new topology, the position's after `seek`
        self.clock_start = self.wall_clock()
        self._take_over(self.clock_start, owe=True)

    def _take_over(self, now: float, owe: bool) -> None:
        """Count from the lanes' positions at `now`. What the profile offered them before `now` is not this
        executor's offered load (it was offered to the executors before it); with `owe`, what of it they
        did not emit is an inherited backlog this executor emits first, without it the lanes are paced from
        `now` on."""
        self.due_before = self._due(now)
        #: events due before the takeover and not emitted by then (0 without `owe`)
        self.inherited = 0
        if owe and not math.isinf(self.due_before):
            self.inherited = max(0, int(self.due_before) - sum(self.next.values()))
        #: events this executor emitted since it took its lanes over
        self.emitted_here = 0
        #: (next sequence number, lane) of every lane not done, smallest first: events leave in sequence
        #: order, the order they fall due in. (Round-robin over the lanes, restarted at each takeover, let
        #: the lanes drift apart by one index per rescale that ended mid-round, and the lanes behind ran
        #: late for good: 1.3 s at 25 events/s after six rescales in bench-autoscale.)
        self.live = [(lane + self.next[lane] * self.stride, lane) for lane in self.lanes if not self._lane_done(lane)]
        heapq.heapify(self.live)

    def _lane_done(self, lane: int) -> bool:
        return self.limit is not None and lane + self.next[lane] * self.stride >= self.limit

    def _due(self, now: float) -> float:
        """Events the profile offered this executor's lanes since the topology's sources started."""
        return self.profile.due(now - self.clock_start)

    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        """Emit what this executor's lanes owe (the inherited backlog, then what the profile offered them
        since the takeover); return the events offered to it since the takeover (`offered`)."""
        due = self._due(now)
        count = int(min(self._owed(due), budget)) if not math.isinf(due) else budget
        live, stride, limit = self.live, self.stride, self.limit
        for _ in range(max(count, 0)):
            if not live:
                break
            seq, lane = live[0]
            self.next[lane] += 1
            if limit is not None and seq + stride >= limit:
                heapq.heappop(live)
            else:
                heapq.heapreplace(live, (seq + stride, lane))
            self.emitted_here += 1
            self.cost.charge()
            emit_new(self.id_offset + seq, seq % self.keys, seq)
        return self._offered(due)

    def offered(self, now: float) -> int:
        """The events offered to this executor's lanes since it took them over, emitted or not: the rate
        profile's, whatever back-pressure or a pause let through (an unbounded or finished source: what it
        emitted). The executor's metric samples ask it at their own time."""
        return self._offered(self._due(now))

    def backlog(self, now: float) -> int:
        """The events this executor owes: the inherited backlog and what it was offered since, not emitted
        yet (held back by back-pressure)."""
        due = self._due(now)
        return 0 if math.isinf(due) or not self.live else max(0, self._owed(due))

    def _owed(self, due: float) -> int:
        """The inherited backlog and what was offered since the takeover, less what was emitted since."""
        return self.inherited + self._offered(due) - self.emitted_here

    def _offered(self, due: float) -> int:
        if math.isinf(due) or not self.live:
            return self.emitted_here
        return max(0, int(due) - int(self.due_before))

    def exhausted(self) -> bool:
        return not self.live

    def position(self) -> Any:
        return {**self.next, self.CLOCK: self.clock_start}

    def seek(self, position: Any) -> None:
        """Take the positions of the lanes this executor owns (a merged map of every old executor's) and the
        topology's profile clock; what the lanes owe is this executor's to emit first (a migration)."""
        for lane, index in position.items():
            if lane == self.CLOCK:
                self.clock_start = float(index)
            elif int(lane) in self.next:
                self.next[int(lane)] = int(index)
        self._take_over(self.wall_clock(), owe=True)

    def pace_replay(self) -> None:
        """A recovery sought a checkpoint's position: pace the lanes from now on instead of emitting what
        they owe since the checkpoint at once (see the class)."""
        self._take_over(self.wall_clock(), owe=False)

    def close(self) -> None:
        self.cost.pay()


#: the key that marks a `RedisStreamSource` position as per-lane (its value, "ordinal % M", names the stride)
LANES_MARK = "lanes"


class RedisStreamSource:
    """`source: {type: redis-stream, stream: NAME}` — reads entries of a Redis stream (field `value`, optional
    `key`), exactly once across any change of parallelism. Its key is `<prefix>source:<NAME>`
    (`core.topology.stream_key`; NAME defaults to the vertex's name): under the topology's own prefix, the only
    keys its workers' Redis user reaches.

    Entries are numbered by their ordinal n in the stream (0 for its first entry: the stream must not be
    trimmed below entries a source has not read). Like `Synthetic`'s ids, the ordinals are split into
    `maxParallelism` lanes, lane j holding j, j+M, j+2M, ... (M = maxParallelism); an executor owns the lanes
    of its key groups, reads the whole stream and emits the entries of its own lanes. The position is::

        {"lanes": "ordinal % M", j: [entry id, count], ...}      # one pair per lane the executor owns

    meaning: the lane's first `count` entries (ordinals j, j+M, ..., j+(count-1)M) are emitted, so its next
    entry has ordinal j + count*M; `entry id` is the id of the last of them ("0-0" while count is 0), so
    reading may resume right after it, at ordinal j + (count-1)M + 1 (at 0 from "0-0"). A rescale merges the
    old executors' maps and hands whole lanes over: a new executor resumes reading at the smallest resume
    point of its lanes and skips the entries of a lane until the lane's next ordinal, so nothing is skipped
    or repeated whatever the old and new parallelism. Counts only grow (`replayed_events` reads them).
    Positions of the previous version ({executor index: [last entry id read, entries read]}, executor i
    of k having emitted the ordinals n ≡ i mod k below its count) and per-lane positions of another M are
    converted exactly on `seek` (one XREVRANGE of M entries); only another rescale before the executors have
    read past the furthest of those old read points may repeat entries of that gap."""

    def __init__(self, client_factory: Callable[[], Any], prefix: str) -> None:
        self.client_factory = client_factory
        self.prefix = prefix

    def open(self, context: Context) -> None:
        self.client = self.client_factory()
        self.stream = stream_key(self.prefix, "source", str(context.config.get("stream", context.vertex)))
        self.stride = context.max_parallelism
        lanes = context.key_groups or key_group_ranges(context.max_parallelism, context.parallelism)[context.index]
        self.lanes = list(lanes)
        self.name = f"{context.vertex}#{context.index}"
        #: per own lane: the ordinal of its next entry, and the id of its last emitted entry
        self.next: dict[int, int] = {lane: lane for lane in self.lanes}
        self.last: dict[int, str] = dict.fromkeys(self.lanes, "0-0")
        #: the read cursor: the id of the last entry read and the ordinal of the next one
        self.last_id = "0-0"
        self.read = 0
        #: entries this executor emitted since it opened: what it reports as offered ("due"). Not `read`:
        #: every executor reads the whole stream, so k executors would report k times the stream's rate
        #: (and a queue of the entries of other lanes) to the analysis and the autoscaler
        self.offered = 0
        #: after seeking a foreign position: (its stride S, per foreign lane the ordinal below which the
        #: entries of the lane (n ≡ lane mod S) were emitted, the largest of these)
        self.foreign: tuple[int, dict[int, int], int] | None = None
        self.retry_at = 0.0
        self.delays = backoff()
        self.stop = context.stop

    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        if now < self.retry_at:
            return self.offered
        started = time.monotonic()
        try:
            entries = self.client.xread({self.stream: self.last_id}, count=budget, block=10) or []
        except Exception as exc:
            if not is_redis_outage(exc):
                raise
            # Redis is away (restarting): nothing is lost, the position stays; try again with backoff (the
            # source thread goes on meanwhile: it takes the controller's messages between polls)
            REDIS.failed(f"source {self.name}: cannot read stream {self.stream}", exc, started)
            self.retry_at = now + next(self.delays)
            return self.offered
        REDIS.succeeded()
        self.delays = backoff()
        for _, items in entries:
            for entry_id, fields in items:
                self.last_id = text(entry_id)
                n = self.read
                self.read += 1
                lane = n % self.stride
                if n < self.next.get(lane, n + 1):
                    continue  # not an own lane, or emitted before (by an old executor)
                self.next[lane] = n + self.stride
                self.last[lane] = self.last_id
                if self.foreign is not None:
                    stride, emitted_below, _ = self.foreign
                    if n < emitted_below.get(n % stride, 0):
                        continue  # emitted by an executor of the foreign position
                ms, seq = (int(x) for x in self.last_id.split("-"))
                decoded = {text(k): text(v) for k, v in fields.items()}
                self.offered += 1
                emit_new(ms * 1000 + seq, decoded.get("key", n), decoded.get("value"))
        if self.foreign is not None and self.read >= self.foreign[2]:
            self.foreign = None
        return self.offered

    def position(self) -> Any:
        """{"lanes": "ordinal % M", lane: [id of its last emitted entry, entries of it emitted]} (see the class)."""
        position: dict[Any, Any] = {LANES_MARK: f"ordinal % {self.stride}"}
        for lane in self.lanes:
            position[lane] = [self.last[lane], (self.next[lane] - lane) // self.stride]
        return position

    def seek(self, position: Any) -> None:
        """Take the positions of the lanes this executor owns from `position` (every old executor's merged)
        and resume reading at the smallest resume point among them. A position this source cannot read is
        logged and ignored (the executor keeps its own, from the stream's start when new)."""
        try:
            if not isinstance(position, Mapping):
                raise ValueError("not a mapping")
            stride = _lanes_stride(position.get(LANES_MARK))
            if stride == self.stride:
                taken: dict[int, tuple[int, str]] = {}
                for key, value in position.items():
                    if key != LANES_MARK and int(key) in self.next:
                        lane, count = int(key), max(0, int(value[1]))
                        taken[lane] = (lane + count * self.stride, _entry_id(value[0]) if count > 0 else "0-0")
                for lane, (nxt, last) in taken.items():
                    self.next[lane], self.last[lane] = nxt, last
                self.foreign = None
                self._resume_at_the_first_lane()
            else:
                self._seek_foreign(position, stride)
        except (ValueError, TypeError, IndexError, KeyError, redis.RedisError) as exc:
            logging.getLogger("elastream.worker").warning(
                "source %s: ignoring a read position it cannot use (%s): %r", self.name, exc, position
            )

    def _resume_at_the_first_lane(self) -> None:
        """Put the read cursor at the smallest resume point among the own lanes (every lane's entries before
        it are emitted)."""
        self.last_id, self.read = "0-0", 0
        if self.lanes:
            lane = min(self.lanes, key=self.next.__getitem__)
            if self.next[lane] >= self.stride:  # count ≥ 1: resume after the lane's last emitted entry
                self.last_id, self.read = self.last[lane], self.next[lane] - self.stride + 1

    def _seek_foreign(self, position: Mapping[Any, Any], stride: int | None) -> None:
        """Seek to a position of another shape: per-lane of another stride, or the previous version's
        {executor index: [last entry id read, entries read]} (stride None). Both say "the entries n ≡ i mod S
        below bound[i] are emitted"; every own lane resumes at its first entry at or after the smallest
        bound's resume point, and `poll` skips the entries the bounds cover beyond it."""
        values = {int(k): v for k, v in position.items() if k != LANES_MARK}
        legacy = stride is None
        stride = max(values, default=-1) + 1 if stride is None else stride
        if stride <= 0 or not all(0 <= i < stride for i in values):
            raise ValueError(f"no lanes 0..{stride - 1}")
        bounds: dict[int, int] = {}
        resume = [] if len(values) == stride else [("0-0", 0)]  # a lane without a position: from the start
        for i, value in values.items():
            count = max(0, int(value[1]))
            if legacy:  # executor i of k = S read `count` entries, the last one `entry id`
                bounds[i] = count
                resume.append((_entry_id(value[0]), count) if count > 0 else ("0-0", 0))
            else:  # lane i of S: `count` entries emitted, the last one `entry id`
                bounds[i] = i + count * stride
                resume.append((_entry_id(value[0]), bounds[i] - stride + 1) if count > 0 else ("0-0", 0))
        start_id, start = min(resume, key=lambda r: r[1])
        # the ids of the M entries before the cursor (newest first): the own lanes' last emitted entries
        before: list[str] = []
        if start > 0:
            entries = retry_redis(
                lambda: self.client.xrevrange(self.stream, max=start_id, min="-", count=self.stride),
                f"source {self.name}: cannot read stream {self.stream}",
                self.stop,
            )
            before = [text(entry_id) for entry_id, _ in entries]
        for lane in self.lanes:
            nxt = lane if lane >= start else lane + -(-(start - lane) // self.stride) * self.stride
            self.next[lane] = nxt
            back = start - 1 - (nxt - self.stride)  # index of the lane's last emitted entry in `before`
            self.last[lane] = "0-0" if nxt < self.stride else before[back] if back < len(before) else start_id
        self.last_id, self.read = start_id, start
        furthest = max(bounds.values(), default=0)
        self.foreign = (stride, bounds, furthest) if furthest > start else None

    def close(self) -> None:
        self.client.close()


def _entry_id(value: Any) -> str:
    """A stream entry id from a position (msgpack may hand back bytes)."""
    entry = text(value) if isinstance(value, bytes | str) else None
    if entry is None or len(entry.split("-")) != 2 or not all(p.isdigit() for p in entry.split("-")):
        raise ValueError(f"not a stream entry id: {value!r}")
    return entry


def _lanes_stride(mark: Any) -> int | None:
    """The stride M of a per-lane position's mark "ordinal % M" (None: no mark, the previous version's)."""
    if mark is None:
        return None
    prefix, _, stride = str(mark).rpartition("%")
    if prefix.strip() != "ordinal" or not stride.strip().isdigit():
        raise ValueError(f"unknown position mark {mark!r}")
    return int(stride)


# --------------------------------------------------------------------------------------------------------
# Sinks


class NullSink:
    """`sink: {type: "null"}` — counts and drops (with an optional `costMs`)."""

    def open(self, context: Context) -> None:
        self.cost = Cost(context.config, context.node_cpu)

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()

    def close(self) -> None:
        self.cost.pay()


class LogSink(NullSink):
    """`sink: {type: log}` — prints every `every`-th event (default 1) to the worker's stdout."""

    def open(self, context: Context) -> None:
        super().open(context)
        self.name = f"{context.vertex}#{context.index}"
        self.every = int(context.config.get("every", 1))
        self.seen = 0

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        self.seen += 1
        if self.seen % self.every == 0:
            print(f"{self.name}: id={event[0]} key={event[1]!r} value={event[2]!r}", flush=True)


#: Appends a batch to a stream unless the batch's token is already recorded, then records it, atomically.
#: KEYS: stream, the writer's token key. ARGV: token, MAXLEN (0: none), token TTL (s), then id/key/value/ts
#: of each event.
_XADD_BATCH_ONCE = """
if redis.call('GET', KEYS[2]) == ARGV[1] then return 0 end
local maxlen = tonumber(ARGV[2])
local n = 0
for i = 4, #ARGV, 4 do
  if maxlen > 0 then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*',
               'id', ARGV[i], 'key', ARGV[i + 1], 'value', ARGV[i + 2], 'ts', ARGV[i + 3])
  else
    redis.call('XADD', KEYS[1], '*', 'id', ARGV[i], 'key', ARGV[i + 1], 'value', ARGV[i + 2], 'ts', ARGV[i + 3])
  end
  n = n + 1
end
redis.call('SET', KEYS[2], ARGV[1], 'EX', tonumber(ARGV[3]))
return n
"""


class RedisStreamSink:
    """`sink: {type: redis-stream, stream: NAME, delivery: at-least-once | exactly-once}` — appends events
    (fields id, key, value, ts) to the Redis stream `<prefix>sink:<NAME>` (`core.topology.stream_key`; NAME
    defaults to the vertex's name): under the topology's prefix, so also in its hash slot on a Redis Cluster.

    `at-least-once` (the default) writes every processed batch at once: the lowest latency, and CCR and DCR
    migrations never duplicate anything, but after a rollback to a checkpoint (a worker died, or the
    `restart` protocol) the events replayed since that checkpoint reach the stream a second time. A batch is
    written by one Lua script that also records the batch's token under a key of this executor, so it lands
    all or nothing, and a retry after a lost reply (Redis stopped after applying it) writes nothing. While
    Redis is away (refused, timed out, LOADING after a restart) every write waits it out and is retried, never
    skipped (the executor holds its batch and its inputs back-pressure); it gives up only when the executor
    stops.

    `exactly-once` is a two-phase commit, as Flink's transactional sinks do it: processed events stay in the
    executor until its next checkpoint (a periodic one or a migration's COMMIT), which stages them in Redis
    (`pre_commit`); the controller moves every staged event of a checkpoint into the streams in one atomic
    script, in the same transaction that makes it the latest checkpoint. A rollback discards what was not
    committed, so a reader never sees an event twice; the price is up to one checkpoint interval
    (`spec.scaling.checkpointIntervalSeconds`) of extra latency and the buffered events in memory."""

    batched = True
    #: how long a writer's last token is remembered (a retry comes within seconds)
    TOKEN_TTL_S = 3600

    def __init__(self, client_factory: Callable[[], Any], prefix: str) -> None:
        self.client_factory = client_factory
        self.prefix = prefix

    def open(self, context: Context) -> None:
        self.client = self.client_factory()
        self.stream = stream_key(self.prefix, "sink", str(context.config.get("stream", context.vertex)))
        self.maxlen = int(context.config.get("maxLen") or 0)
        self.exactly_once = context.config.get("delivery", "at-least-once") == "exactly-once"
        self.cost = Cost(context.config, context.node_cpu)
        self.buffer: list[Any] = []
        self.writer = f"{context.vertex}#{context.index}"
        self.what = f"sink {self.writer}: cannot write stream {self.stream}"
        # in the stream's hash slot (the topology's: the stream is under its prefix), which the script writes
        # with the stream and an exactly-once commit with the checkpoint, on one shard of a Redis Cluster
        self.token_key = slot_mate(self.stream, f":writer:{self.writer}")
        self.script = self.client.register_script(_XADD_BATCH_ONCE)
        self.stop = context.stop

    def process(self, event: Any, emit: Emit) -> None:
        self.cost.charge()
        self.buffer.append(event)

    def flush(self) -> None:
        if not self.buffer or self.exactly_once:  # exactly-once: written when a checkpoint commits
            return
        token = uuid.uuid4().hex  # the same token on every retry of this batch
        args: list[Any] = [token, self.maxlen, self.TOKEN_TTL_S]
        for event in self.buffer:
            args += [event[0], str(event[1]), str(event[2]), repr(event[3])]
        retry_redis(lambda: self.script(keys=[self.stream, self.token_key], args=args), self.what, self.stop)
        self.buffer = []

    def pre_commit(self, txn_id: str) -> None:
        """Stage the events processed since the last checkpoint under transaction `txn_id` (the checkpoint's
        or migration's id); the controller commits them with it."""
        if not self.exactly_once or not self.buffer:
            return
        staging, members = transaction_keys(self.prefix, txn_id, self.writer)
        items: list[Any] = [self.stream]
        for event in self.buffer:
            items += [event[0], str(event[1]), str(event[2]), repr(event[3])]

        index = open_transactions_key(self.prefix)

        def stage() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(staging)
            pipe.rpush(staging, *items)
            pipe.sadd(members, staging)
            pipe.zadd(index, {txn_id: time.time()}, nx=True)  # the first sink's staging time orders it
            pipe.expire(staging, STAGED_TTL_S)
            pipe.expire(members, STAGED_TTL_S)
            pipe.expire(index, STAGED_TTL_S)
            pipe.execute()

        retry_redis(stage, self.what, self.stop)
        self.buffer = []

    def abort_commit(self, txn_id: str) -> None:
        """The checkpoint or migration `txn_id` was abandoned and this executor goes on: take the staged
        events back, ahead of what was processed since (they are committed with the next checkpoint)."""
        if not self.exactly_once:
            return
        staging, members = transaction_keys(self.prefix, txn_id, self.writer)

        def drop() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(staging)
            pipe.srem(members, staging)
            pipe.execute()

        # read, then delete: each step may be repeated after a lost reply without losing the events
        items = retry_redis(lambda: list(self.client.lrange(staging, 1, -1)), self.what, self.stop)
        events = [
            (text(items[i]), text(items[i + 1]), text(items[i + 2]), float(text(items[i + 3])))
            for i in range(0, len(items), 4)
        ]
        self.buffer = events + self.buffer
        retry_redis(drop, self.what, self.stop)

    def close(self) -> None:
        # exactly-once: what was not staged belongs to no checkpoint; a restore replays it
        self.flush()
        self.cost.pay()
        self.client.close()


#: staged sink events of a checkpoint that never completes expire after this
STAGED_TTL_S = 24 * 3600


# --------------------------------------------------------------------------------------------------------
# Loading


LOGIC_BUILTINS: Mapping[str, type] = {"work": Work, "filter": Filter, "count": Count, "window": Window}


def load_class(vertex: Vertex) -> type:
    """The user class named by `module: package.module:Class`; `OperatorLoadError` names the vertex and fix."""
    spec = str(vertex.config["module"])
    module_name, _, class_name = spec.partition(":")
    where = f"spec.vertices[{vertex.name}].{vertex.kind}.module"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise OperatorLoadError(
            f"{where}: cannot import {module_name!r} ({type(exc).__name__}: {exc}); "
            "install the package in the worker image or fix the name"
        ) from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise OperatorLoadError(f"{where}: module {module_name!r} has no class {class_name!r}; fix the name")
    if vertex.kind == "source":
        missing = [m for m in ("open", "poll") if not callable(getattr(cls, m, None))]
    else:
        missing = [m for m in ("process",) if not callable(getattr(cls, m, None))]
    if missing:
        raise OperatorLoadError(f"{where}: class {spec} has no {', '.join(missing)}(); see the operator API in README")
    return cls


def make_operator(vertex: Vertex, client_factory: Callable[[], Any], prefix: str) -> Any:
    """A fresh operator instance for one executor of `vertex` (not yet opened)."""
    config = vertex.config
    if "module" in config:
        instance = load_class(vertex)()
        return UserSource(instance) if vertex.kind == "source" else UserOperator(instance)
    if vertex.kind == "source":
        return Synthetic() if config["type"] == "synthetic" else RedisStreamSource(client_factory, prefix)
    if vertex.kind == "sink":
        kind = config["type"]
        if kind == "redis-stream":
            return RedisStreamSink(client_factory, prefix)
        return LogSink() if kind == "log" else NullSink()
    return LOGIC_BUILTINS[str(config["builtin"])]()


#: how an executor hears of an exception in a user hook: report(hook name, exception)
ErrorReport = Callable[[str, BaseException], None]


def _log_report(hook: str, exc: BaseException) -> None:
    logging.getLogger("elastream.worker").error("user operator: %s raised %s: %s", hook, type(exc).__name__, exc)


class _UserCode:
    """What user sources and operators share: optional hooks, and exceptions in them reported through
    `report` (the executor's: log line with the vertex name + errors metric) instead of killing the worker."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.report: ErrorReport = _log_report

    def bind_errors(self, report: ErrorReport) -> None:
        self.report = report

    def _call(self, hook: str, *args: Any) -> Any:
        method = getattr(self.inner, hook, None)
        if not callable(method):
            return None
        try:
            return method(*args)
        except Exception as exc:
            self.report(f"{hook}()", exc)
            return None

    def open(self, context: Context) -> None:
        self._call("open", context)

    def close(self) -> None:
        self._call("close")


class UserOperator(_UserCode):
    """Adapts a user logic or sink class to the executor: events arrive as `Event` named tuples; missing
    hooks are no-ops. An exception in `process` propagates (the executor skips and reports that event); in
    `open`, `close`, `snapshot_state` or `restore_state` it is reported and the executor goes on (a failed
    snapshot checkpoints no state for this executor)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.stateful = callable(getattr(inner, "snapshot_state", None))

    def process(self, event: Any, emit: Emit) -> None:
        self.inner.process(Event._make(event), emit)

    def snapshot_state(self) -> dict[int, Any]:
        if not self.stateful:
            return {}
        state = self._call("snapshot_state")
        return dict(state) if isinstance(state, Mapping) else {}

    def restore_state(self, state: Mapping[int, Any]) -> None:
        self._call("restore_state", state)


class UserSource(_UserCode):
    """Adapts a user source class: `poll(now, emit_new, budget)` (an exception is reported and the source
    tries again at its next tick, backing off to 1 s while it keeps failing); `position`, `seek` and
    `exhausted` are passed through when the class has them."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.retry_at = 0.0
        self.backoff_s = 0.0
        self.due = 0
        for hook in ("position", "seek", "exhausted"):
            if callable(getattr(inner, hook, None)):
                setattr(self, hook, getattr(inner, hook))

    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        if now < self.retry_at:
            return self.due
        try:
            self.due = int(self.inner.poll(now, emit_new, budget) or 0)
        except Exception as exc:
            self.report("poll()", exc)
            self.backoff_s = min(1.0, max(0.05, 2 * self.backoff_s))
            self.retry_at = now + self.backoff_s
        else:
            self.backoff_s = 0.0
        return self.due
