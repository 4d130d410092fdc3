"""The built-in sources: `synthetic` (numbered events at a rate profile) and `redis-stream` (a Redis stream,
read exactly once across rescales)."""

from __future__ import annotations

import bisect
import heapq
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from elastream.core import rates
from elastream.core.schedule import key_group_ranges
from elastream.runtime.operators.api import Context
from elastream.runtime.operators.cpu import Cost
from elastream.runtime.operators.streams import RedisStreamEnd
from elastream.store.codec import text
from elastream.store.retry import RedisAttempt, RetryLater, retry_redis
from elastream.worker_inputs.rate_files import read_rate_file


class RateProfile(rates.RateProfile):
    """`core.rates.RateProfile` that reads a `csv:` rate file (the one piece of I/O a profile needs)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config, read_csv=read_rate_file)


class Synthetic:
    """`source: {type: synthetic}` — numbered events at a rate profile.

    The id space is split into `maxParallelism` lanes, lane j holding the sequence numbers j, j+M, j+2M, ...
    (M = maxParallelism). Lanes are owned like key groups (contiguous ranges over the executors). The rate
    profile is the vertex's: sequence number s falls due when the vertex's profile has offered more than s
    events, whichever executor owns its lane, so the vertex's total rate, its ids and when each event is
    due do not depend on its parallelism, and a rescale hands whole lanes, with their positions, to new
    executors: nothing is skipped or repeated. (Pacing each executor at its share of the rate instead let an
    executor with the upper lanes of a round emit them up to half a round early and one with the lower
    lanes up to half a round late, for good, after any scale-out: 64 ms at 125 events/s in bench-migration.)
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
        self.lanes = sorted(context.key_groups)
        #: the lanes as a range [lo, hi), when they are one (key groups are contiguous): a level run (`cursor`)
        self.lo, self.hi = (self.lanes[0], self.lanes[-1] + 1) if self.lanes else (0, 0)
        self.contiguous = self.lanes == list(range(self.lo, self.hi))
        #: while the lanes are level (every lane's next sequence number within one round of the smallest) the
        #: events leave as one run through the lane range, round after round: `cursor` is the run's next
        #: number, and `next` and `live` are brought up to it when read (`_settle`); None otherwise
        self.cursor: int | None = None
        self.next: dict[int, int] = dict.fromkeys(self.lanes, 0)
        #: the vertex's rate profile (not this executor's share of it: see the class)
        self.profile = RateProfile(config)
        #: the profile clock's start: now for a new topology, the position's after `seek`
        self.clock_start = self.wall_clock()
        self._take_over(self.clock_start, owe=True)

    def _take_over(self, now: float, owe: bool) -> None:
        """Count from the lanes' positions at `now`. What the profile offered them before `now` is not this
        executor's offered load (it was offered to the executors before it); with `owe`, what of it they
        did not emit is an inherited backlog this executor emits first, without it the lanes are paced from
        `now` on."""
        self._settle()
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
        """Events the profile offered this executor's lanes since the topology's sources started: the
        sequence numbers of its lanes below the vertex's due count."""
        vertex_due = self.profile.due(now - self.clock_start)
        if math.isinf(vertex_due):
            return vertex_due
        rounds, rest = divmod(int(vertex_due), self.stride)
        return float(rounds * len(self.lanes) + bisect.bisect_left(self.lanes, rest))

    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        """Emit what this executor's lanes owe (the inherited backlog, then what the profile offered them
        since the takeover); return the events offered to it since the takeover (`offered`)."""
        due = self._due(now)
        offset, keys = self.id_offset, self.keys
        for run in self._take(self._count(due, budget)):
            for seq in run:
                emit_new(offset + seq, seq % keys, seq)
        return self._offered(due)

    def poll_batch(self, now: float, emit_events: Callable[[list[Any]], None], budget: int) -> int:
        """`poll`, emitting the events as one list of whole events (`BatchSource`)."""
        due = self._due(now)
        offset, keys = self.id_offset, self.keys
        runs = self._take(self._count(due, budget))
        if runs and offset:
            emit_events([(offset + seq, seq % keys, seq, now) for run in runs for seq in run])
        elif runs:  # no `idOffset` (the default): an addition less per event
            emit_events([(seq, seq % keys, seq, now) for run in runs for seq in run])
        return self._offered(due)

    def _count(self, due: float, budget: int) -> int:
        """How many events a poll emits: what the lanes owe, at most `budget`."""
        return max(0, int(min(self._owed(due), budget)) if not math.isinf(due) else budget)

    def _take(self, count: int) -> list[Sequence[int]]:
        """The sequence numbers of the next `count` events (fewer when the lanes end), in the order they fall
        due, as runs; the lanes move past them and their cost is charged."""
        if count <= 0 or not self.live:
            return []
        if self.cursor is None and self._level():
            self.cursor = self.live[0][0]
        runs: list[Sequence[int]] = []
        if self.cursor is not None:
            runs = self._take_level(count)
        else:
            runs.append(self._take_heap(count))
        taken = sum(map(len, runs))
        self.emitted_here += taken
        self.cost.charge(taken)
        return runs

    def _level(self) -> bool:
        """Whether the lanes are level: all of them live, contiguous, each one's next number within one round
        (`stride`) of the smallest. Then those numbers are the run's next `stride` numbers of own lanes."""
        live = self.live
        return self.contiguous and len(live) == len(self.lanes) and max(live)[0] < live[0][0] + self.stride

    def _take_level(self, count: int) -> list[Sequence[int]]:
        """`_take` while the lanes are level: ranges of consecutive numbers through [lo, hi) of each round."""
        assert self.cursor is not None
        seq, stride, lo, hi, limit = self.cursor, self.stride, self.lo, self.hi, self.limit
        runs: list[Sequence[int]] = []
        while count > 0:
            base = seq - seq % stride
            end = min(base + hi, seq + count)
            if limit is not None:
                end = min(end, limit)
            if end <= seq:
                break
            runs.append(range(seq, end))
            count -= end - seq
            seq = end if end < base + hi else base + stride + lo
        self.cursor = seq
        if limit is not None and seq + stride > limit:  # a lane may be done: back to the heap, which drops it
            self._settle()
        return runs

    def _take_heap(self, count: int) -> list[int]:
        """`_take` lane by lane off the heap: the smallest next number first."""
        live, stride, limit, positions = self.live, self.stride, self.limit, self.next
        seqs: list[int] = []
        for _ in range(count):
            if not live:
                break
            seq, lane = live[0]
            positions[lane] += 1
            if limit is not None and seq + stride >= limit:
                heapq.heappop(live)
            else:
                heapq.heapreplace(live, (seq + stride, lane))
            seqs.append(seq)
        return seqs

    def _settle(self) -> None:
        """Bring `next` and `live` up to a level run's `cursor` (each lane's next number: the first of its
        own at or after the cursor), and end the run."""
        seq = self.cursor
        if seq is None:
            return
        self.cursor = None
        stride = self.stride
        for lane in self.lanes:
            self.next[lane] = (seq + (lane - seq) % stride - lane) // stride
        live = [(lane + self.next[lane] * stride, lane) for lane in self.lanes if not self._lane_done(lane)]
        heapq.heapify(live)
        self.live = live

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
        self._settle()
        return {**self.next, self.CLOCK: self.clock_start}

    def seek(self, position: Any) -> None:
        """Take the positions of the lanes this executor owns (a merged map of every old executor's) and the
        topology's profile clock; what the lanes owe is this executor's to emit first (a migration)."""
        self._settle()
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


class RedisStreamSource(RedisStreamEnd):
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

    def open(self, context: Context) -> None:
        self.open_stream(context, "source")
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
        #: while Redis is away: when to read again (0.2 s doubling to 5 s)
        self.retry = RetryLater()

    def poll(self, now: float, emit_new: Callable[[int, Any, Any], None], budget: int) -> int:
        if not self.retry.due(now):
            return self.offered
        entries: list[Any] = []
        with RedisAttempt(f"source {self.name}: cannot read stream {self.stream}") as attempt:
            entries = self.client.xread({self.stream: self.last_id}, count=budget, block=10) or []
        if attempt.failure is not None:
            # Redis is away (restarting): nothing is lost, the position stays; try again with backoff (the
            # source thread goes on meanwhile: it takes the controller's messages between polls)
            self.retry.failed(now)
            return self.offered
        self.retry.succeeded()
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
