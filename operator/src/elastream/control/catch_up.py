"""Catch-up and stabilization after a migration, measured from the metric stream as the CCR paper does.

`measure_catch_up` reads the sinks' output rate (and the sources' emitted and offered rates) from `before_s`
before the migration request on and returns how long after the request the output came back to its level
once the migration's pause was over (catch-up) and settled within ±10 % (stabilization), by
`core.rate_timeline.recovery`: against the level before the request, or against the new level the output
settled at when the scale changed what the topology delivers (a congested topology scaled out).
`CatchUpFollowUp` does that without blocking a control loop: given a scaling's status record, each `tick()`
measures again until the output has settled and stabilized or `timeout_s` has passed since the pause ended,
then writes `catchUpMs` / `stabilizationMs` (None: not within the timeout) into the record, `catchUp` saying
where the measurement is (measuring, measured, not stable within the timeout), `catchUpReference` what the
times are measured against (before | newLevel) and `outputBefore` / `outputAfter` the two levels (events/s;
None: not known). Not to be confused with the recovery from a dead worker (`status.lastRecovery`): this is the
catch-up after a scaling.

From the Redis metric stream (a feed read by entry id, `control.monitor.ForwardFeed`) the follow-up reads
each entry once: from the stream id of the earliest request's `before_s` on, then only what was added since,
at most `FOLLOW_BUDGET_ENTRIES` a tick, keeping the sources' and sinks' samples only (at most
`KEPT_SAMPLES`). Other feeds (test doubles) are read by time on every tick.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elastream.control.monitor import FOLLOW_BUDGET_ENTRIES, ForwardFeed
from elastream.core.metrics import MetricSample
from elastream.core.ports import SampleFeed, SystemClock
from elastream.core.rate_timeline import Recovery, rate_timeline, recovery
from elastream.core.topology import Topology
from elastream.store.metric_stream import stream_start

#: the sources' and sinks' samples a follow-up keeps at most (the oldest go first): a minute and more of
#: hundreds of them each second
KEPT_SAMPLES = 200_000
#: how long before the request the output is read (its level before the request)
BEFORE_S = 10.0
#: the scaling record's fields a measured catch-up fills (`recovery_fields`)
CATCH_UP_FIELDS = ("catchUpMs", "stabilizationMs", "catchUpReference", "outputBefore", "outputAfter")


def measure_catch_up(
    feed: SampleFeed,
    topology: Topology,
    migrated_at: float,
    resumed_at: float | None = None,
    before_s: float = BEFORE_S,
    bucket_s: float = 1.0,
    samples: list[MetricSample] | None = None,
) -> Recovery:
    """Catch-up and stabilization in seconds after `migrated_at` (the request), None where not reached yet,
    and the reference they are measured against; `resumed_at`: a time at or after the migration's pause ended
    (its report's return), from which the output is searched (the output before it is the old level, not a
    catch-up). `samples`: what was read already (else the feed is read)."""
    timeline = _timelines(feed, topology, migrated_at, before_s, bucket_s, samples, offered=True)
    resumed = None if resumed_at is None else resumed_at - migrated_at
    return recovery(timeline["output"], resumed_at=resumed, emitted=timeline["input"], offered=timeline["offered"])


def output_timeline(
    feed: SampleFeed,
    topology: Topology,
    migrated_at: float,
    before_s: float = BEFORE_S,
    bucket_s: float = 1.0,
    samples: list[MetricSample] | None = None,
) -> list[tuple[float, float]]:
    """The sinks' output rate per `bucket_s` from `before_s` before the request on (times relative to it):
    what `measure_catch_up` reads its times off (from `samples` when given, else from the feed)."""
    return _timelines(feed, topology, migrated_at, before_s, bucket_s, samples)["output"]


def _timelines(
    feed: SampleFeed,
    topology: Topology,
    migrated_at: float,
    before_s: float,
    bucket_s: float,
    samples: list[MetricSample] | None,
    offered: bool = False,
) -> dict[str, list[tuple[float, float]]]:
    since = migrated_at - before_s
    window = feed.read_since(since) if samples is None else [s for s in samples if s.ts >= since]
    return rate_timeline(window, topology.sources, topology.sinks, at=migrated_at, bucket_s=bucket_s, offered=offered)


@dataclass
class CatchUpFollowUp:
    feed: SampleFeed
    topology: Topology
    bucket_s: float = 1.0
    timeout_s: float = 60.0
    now: Callable[[], float] = field(default=SystemClock().now)
    #: (status record, migrated at, resumed at, on_done) of the scalings still being followed
    pending: list[tuple[dict[str, Any], float, float, Callable[[dict[str, Any]], None]]] = field(default_factory=list)
    #: read from a stream by entry id: the sources' and sinks' samples since `_since`, and where to go on
    _kept: list[MetricSample] = field(default_factory=list, repr=False)
    _since: float | None = field(default=None, repr=False)
    _position: str = field(default="-", repr=False)

    def follow(
        self,
        status: dict[str, Any],
        migrated_at: float,
        on_done: Callable[[dict[str, Any]], None],
        resumed_at: float | None = None,
    ) -> None:
        """Follow a scaling requested at `migrated_at` whose migration's pause ended by `resumed_at` (default:
        now, for a caller that follows once the migration has returned)."""
        status["catchUp"] = "measuring"
        self.pending.append((status, migrated_at, self.now() if resumed_at is None else resumed_at, on_done))

    def tick(self) -> None:
        samples = self._read()
        still = []
        for status, migrated_at, resumed_at, on_done in self.pending:
            found = measure_catch_up(
                self.feed, self.topology, migrated_at, resumed_at=resumed_at, bucket_s=self.bucket_s, samples=samples
            )
            # the bound runs from the end of the pause: a scaling that took a minute to start its pods has had
            # no time to settle yet. Until the output has settled, its level (and so the reference) is not
            # known: a stabilization against the level before could be the output passing through on its way
            # to a new one
            timed_out = self.now() - resumed_at > self.timeout_s
            if not found.final and not timed_out:
                still.append((status, migrated_at, resumed_at, on_done))
                continue
            stable = found.stabilization
            status.update(recovery_fields(found))
            status["catchUp"] = "measured" if stable is not None else f"not stable within {self.timeout_s:g} s"
            on_done(status)
        self.pending = still

    def _read(self) -> list[MetricSample] | None:
        """The samples of the scalings followed, read by entry id (None: the feed is read by time)."""
        if not self.pending or not isinstance(self.feed, ForwardFeed):
            self._kept, self._since = [], None
            return None
        since = min(migrated_at for _, migrated_at, _, _ in self.pending) - BEFORE_S
        if self._since is None or since < self._since:
            self._kept, self._since, self._position = [], since, stream_start(since)
        read = self.feed.read_forward(self._position, FOLLOW_BUDGET_ENTRIES)
        self._position = read.next_start
        wanted = {*self.topology.sources, *self.topology.sinks}
        self._kept.extend(s for s in read.samples if s.vertex in wanted)
        if len(self._kept) > KEPT_SAMPLES:
            del self._kept[: len(self._kept) - KEPT_SAMPLES]
        return self._kept


def recovery_fields(found: Recovery) -> dict[str, Any]:
    """A measured catch-up as the scaling record's fields: `catchUpMs`, `stabilizationMs` (None: not reached),
    `catchUpReference` (before | newLevel) and the output's levels `outputBefore` / `outputAfter` (events/s,
    None: not known)."""
    return {
        "catchUpMs": None if found.catch_up is None else found.catch_up * 1000.0,
        "stabilizationMs": None if found.stabilization is None else found.stabilization * 1000.0,
        "catchUpReference": found.reference,
        "outputBefore": found.level_before,
        "outputAfter": found.level_after,
    }
