"""Protocols the adapters implement, so orchestration is written once and tested with in-memory fakes.

- `MetricSource`: the analysed metrics of a running topology (Spark analysis, the pure reference, a fake).
- `Backend`: runs worker nodes under a schedule (local processes, Kubernetes pods, a fake).
- `Clock`: time, replaceable in tests.
- `EventSink`: where decisions and migrations are reported (stdout, Kubernetes events, a list in tests).
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from elastream.core.metrics import MetricSnapshot
from elastream.core.schedule import Schedule


@runtime_checkable
class MetricSource(Protocol):
    def snapshot(self, window: int) -> MetricSnapshot:
        """Analyse the last `window` metric intervals into a snapshot."""
        ...


@runtime_checkable
class Backend(Protocol):
    def apply(self, schedule: Schedule) -> None:
        """Run the topology under `schedule` (start, stop or restart what differs)."""
        ...

    def current_schedule(self) -> Schedule: ...


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def sleep(self, seconds: float) -> None: ...


@runtime_checkable
class EventSink(Protocol):
    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        """Report one decision or outcome (a Kubernetes Event's reason and message)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
