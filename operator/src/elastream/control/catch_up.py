"""Catch-up and stabilization after a migration, measured from the metric stream as the CCR paper does.

`measure_catch_up` reads the sinks' output rate from `before_s` before the migration request on and returns
how long after the request it came back to its level once the migration's pause was over (catch-up) and
settled within ±10 % (stabilization), by `core.rate_timeline.recovery_times`. `CatchUpFollowUp` does that
without blocking a control loop: given a scaling's status record, each `tick()` measures again until both
times are known or `timeout_s` has passed since the pause ended, then writes `catchUpMs` / `stabilizationMs`
(None: not within the timeout) into the record, `catchUp` saying where the measurement is (measuring,
measured, not stable within the timeout). Not to be confused with the recovery from a dead worker
(`status.lastRecovery`): this is the catch-up after a scaling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elastream.core.ports import SampleFeed, SystemClock
from elastream.core.rate_timeline import rate_timeline, recovery_times
from elastream.core.topology import Topology


def measure_catch_up(
    feed: SampleFeed,
    topology: Topology,
    migrated_at: float,
    resumed_at: float | None = None,
    before_s: float = 10.0,
    bucket_s: float = 1.0,
) -> tuple[float | None, float | None]:
    """(catch-up, stabilization) in seconds after `migrated_at` (the request), or None where not reached yet;
    `resumed_at`: a time at or after the migration's pause ended (its report's return), from which the
    output is searched (the output before it is the old level, not a catch-up)."""
    output = output_timeline(feed, topology, migrated_at, before_s, bucket_s)
    resumed = None if resumed_at is None else resumed_at - migrated_at
    return recovery_times(output, resumed_at=resumed)


def output_timeline(
    feed: SampleFeed, topology: Topology, migrated_at: float, before_s: float = 10.0, bucket_s: float = 1.0
) -> list[tuple[float, float]]:
    """The sinks' output rate per `bucket_s` from `before_s` before the request on (times relative to it):
    what `measure_catch_up` reads its times off."""
    samples = feed.read_since(migrated_at - before_s)
    return rate_timeline(samples, topology.sources, topology.sinks, at=migrated_at, bucket_s=bucket_s)["output"]


@dataclass
class CatchUpFollowUp:
    feed: SampleFeed
    topology: Topology
    bucket_s: float = 1.0
    timeout_s: float = 60.0
    now: Callable[[], float] = field(default=SystemClock().now)
    #: (status record, migrated at, resumed at, on_done) of the scalings still being followed
    pending: list[tuple[dict[str, Any], float, float, Callable[[dict[str, Any]], None]]] = field(default_factory=list)

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
        still = []
        for status, migrated_at, resumed_at, on_done in self.pending:
            catch_up, stable = measure_catch_up(
                self.feed, self.topology, migrated_at, resumed_at=resumed_at, bucket_s=self.bucket_s
            )
            # the bound runs from the end of the pause: a scaling that took a minute to start its pods has had
            # no time to settle yet
            timed_out = self.now() - resumed_at > self.timeout_s
            if stable is None and not timed_out:
                still.append((status, migrated_at, resumed_at, on_done))
                continue
            status["catchUpMs"] = None if catch_up is None else catch_up * 1000.0
            status["stabilizationMs"] = None if stable is None else stable * 1000.0
            status["catchUp"] = "measured" if stable is not None else f"not stable within {self.timeout_s:g} s"
            on_done(status)
        self.pending = still
