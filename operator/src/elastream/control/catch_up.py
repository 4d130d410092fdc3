"""Catch-up and stabilization after a migration, measured from the metric stream as the CCR paper does.

`measure_catch_up` reads the sinks' output rate from `before_s` before the migration request on and returns
how long after the request it came back to its level (catch-up) and settled within ±10 % (stabilization),
by `core.rate_timeline.recovery_times`. `CatchUpFollowUp` does that without blocking a control loop: given a
scaling's status record, each `tick()` measures again until both times are known or `timeout_s` has passed,
then writes `catchUpMs` / `stabilizationMs` (None: not within the timeout) into the record, `catchUp` saying
where the measurement is (measuring, measured, not stable within the timeout). Not to be confused with the
recovery from a dead worker (`status.lastRecovery`): this is the catch-up after a scaling.
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
    before_s: float = 10.0,
    bucket_s: float = 1.0,
) -> tuple[float | None, float | None]:
    """(catch-up, stabilization) in seconds after `migrated_at`, or None where not reached yet."""
    samples = feed.read_since(migrated_at - before_s)
    timeline = rate_timeline(samples, topology.sources, topology.sinks, at=migrated_at, bucket_s=bucket_s)
    return recovery_times(timeline["output"])


@dataclass
class CatchUpFollowUp:
    feed: SampleFeed
    topology: Topology
    bucket_s: float = 1.0
    timeout_s: float = 60.0
    now: Callable[[], float] = field(default=SystemClock().now)
    #: (status record, migrated at, on_done) of the scalings still being followed
    pending: list[tuple[dict[str, Any], float, Callable[[dict[str, Any]], None]]] = field(default_factory=list)

    def follow(self, status: dict[str, Any], migrated_at: float, on_done: Callable[[dict[str, Any]], None]) -> None:
        status["catchUp"] = "measuring"
        self.pending.append((status, migrated_at, on_done))

    def tick(self) -> None:
        still = []
        for status, migrated_at, on_done in self.pending:
            catch_up, stable = measure_catch_up(self.feed, self.topology, migrated_at, bucket_s=self.bucket_s)
            timed_out = self.now() - migrated_at > self.timeout_s
            if stable is None and not timed_out:
                still.append((status, migrated_at, on_done))
                continue
            status["catchUpMs"] = None if catch_up is None else catch_up * 1000.0
            status["stabilizationMs"] = None if stable is None else stable * 1000.0
            status["catchUp"] = "measured" if stable is not None else f"not stable within {self.timeout_s:g} s"
            on_done(status)
        self.pending = still
