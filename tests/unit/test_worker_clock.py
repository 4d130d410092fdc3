"""The worker's time goes through its clock (`core.ports.Clock`): the metric grid it publishes on,
stepped here instead of waited for."""

from __future__ import annotations

import threading

import pytest

from elastream.core.topology import parse_manifest
from elastream.runtime.worker import Worker, WorkerOptions
from support.manifests import edge, manifest, sink, src


class SteppedClock:
    """A clock whose waits pass at once: each moves its time on by what was asked."""

    def __init__(self, start: float) -> None:
        self.at = start
        self.waits: list[float] = []

    def now(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        self.waits.append(seconds)
        self.at += seconds
        return stop.is_set()


def test_samples_fall_on_the_wall_clock_grid_and_a_clock_set_back_starts_the_grid_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ELASTREAM_PARENT_PID", raising=False)
    topology = parse_manifest(manifest([src("s", 1), sink("z", 1)], [edge("s", "z")], name="w", nodes=1))
    clock = SteppedClock(1000.3)
    options = WorkerOptions(node="node-0", redis_url="redis://127.0.0.1:1/0", interval_s=1.0)
    worker = Worker(topology, options, clock)
    published: list[float] = []

    def publish() -> None:
        published.append(round(clock.at, 6))
        if len(published) == 2:
            clock.at = 900.5  # the wall clock is set back by 100 s
        if len(published) == 4:
            worker.stop.set()

    monkeypatch.setattr(worker.reporting, "publish_metrics", publish)
    monkeypatch.setattr(worker.reporting, "log_data_plane", lambda force=False: None)
    try:
        worker.serve()
    finally:
        worker.zmq.term()
    assert published == [1001.0, 1002.0, 901.0, 902.0]  # on the grid, before and after the jump
    assert max(clock.waits) <= 1.0  # never a wait as long as the jump back
