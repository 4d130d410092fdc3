"""CPU emulation: what a `costMs` costs an operator, slept on one of its node's emulated cores or spun on real
CPU, so that many nodes of a few cores each fit on a small machine with the contention real CPU would give."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import Any


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
