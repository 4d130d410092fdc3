"""The host's CPU use over time, from /proc/stat, for benchmarks that compare a window before an event with one
after it (`bench/migration.py`: does a rescale leave the machine busier?). Linux only; elsewhere it samples
nothing and every figure is None.

`HostCpu` reads the cumulative jiffies every `interval_s` on a thread; `busy_between(t0, t1)` is the share of
all cores' time spent neither idle nor waiting on I/O between two wall-clock times, and `steal_between` the
share a hypervisor took (a noisy neighbour): both between the last sample at or before the window's start and the
first at or after its end.
"""

from __future__ import annotations

import bisect
import threading
import time

STAT = "/proc/stat"


def read_jiffies(path: str = STAT) -> tuple[int, int, int] | None:
    """(total, busy, steal) jiffies of all cores since boot, or None where there is no /proc/stat."""
    try:
        with open(path, encoding="ascii") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    values = [int(v) for v in fields[1:]]
    values += [0] * (8 - len(values))
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    total = sum(values[:8])
    return total, user + nice + system + irq + softirq, steal


class HostCpu:
    """Samples `read_jiffies` every `interval_s` until `stop` (a context manager)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.times: list[float] = []
        self.samples: list[tuple[int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-cpu", daemon=True)

    def __enter__(self) -> HostCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while True:
            jiffies = read_jiffies()
            if jiffies is None:
                return
            self.times.append(time.time())
            self.samples.append(jiffies)
            if self._stop.wait(self.interval_s):
                return

    def _share(self, start: float, end: float, field: int) -> float | None:
        """The growth of a `read_jiffies` field (1 busy, 2 steal) over the total's between the last sample at or
        before `start` and the first at or after `end`."""
        if len(self.times) < 2:
            return None
        i = max(bisect.bisect_right(self.times, start) - 1, 0)
        j = min(bisect.bisect_left(self.times, end), len(self.times) - 1)
        if j <= i:
            return None
        first, last = self.samples[i], self.samples[j]
        total = last[0] - first[0]
        return (last[field] - first[field]) / total if total > 0 else None

    def busy_between(self, start: float, end: float) -> float | None:
        return self._share(start, end, 1)

    def steal_between(self, start: float, end: float) -> float | None:
        return self._share(start, end, 2)
