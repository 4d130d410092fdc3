"""The scaling pipeline with in-memory fakes: a backend that records schedules and a metric source backed
by the fluid simulator of whatever the backend runs."""

from __future__ import annotations

from elastream.control.scaling import ScalingController
from elastream.core.metrics import MetricSnapshot
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.simulate import simulate, snapshot_from_simulation
from elastream.core.topology import parse_manifest
from helpers import edge, manifest, sink, src, work


class FakeBackend:
    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.applied: list[Schedule] = []

    def apply(self, schedule: Schedule) -> None:
        self.applied.append(schedule)
        self.schedule = schedule

    def current_schedule(self) -> Schedule:
        return self.schedule


class SimulatedMetrics:
    def __init__(self, topology, backend: FakeBackend) -> None:
        self.topology, self.backend = topology, backend

    def snapshot(self, window: int) -> MetricSnapshot:
        schedule = self.backend.current_schedule()
        return snapshot_from_simulation(self.topology, schedule, simulate(self.topology, schedule))


class ListEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        self.t += 0.5
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def setup(nodes: int = 2):
    topology = parse_manifest(
        manifest(
            [src("s", 2, rate=4000), work("parse", 2, costMs=2), sink("z", 1, costMs=0.05)],
            [edge("s", "parse"), edge("parse", "z")],
            nodes=nodes,
            slotsPerNode=6,
        )
    )
    backend = FakeBackend(initial_schedule(topology))
    events = ListEvents()
    controller = ScalingController(topology, backend, SimulatedMetrics(topology, backend), events, FakeClock())
    return topology, backend, events, controller


def test_scale_out_then_in_applies_plans_and_reports() -> None:
    topology, backend, events, controller = setup()
    before = simulate(topology, backend.schedule).throughput
    record = controller.scale_to(3)
    assert record.outcome == "succeeded" and record.direction == "out"
    assert len(backend.schedule.nodes) == 3
    after = simulate(topology, backend.schedule).throughput
    assert after > before
    assert record.predicted_throughput == after
    assert [e[0] for e in events.events] == ["ScalingPlanned", "Scaled"]
    status = record.to_status()
    assert status["fromNodes"] == 2 and status["toNodes"] == 3 and status["plan"]["added_nodes"] == ["node-2"]
    record = controller.scale_to(2)
    assert record.direction == "in" and len(backend.schedule.nodes) == 2


def test_impossible_request_is_rejected_with_the_fix_and_nothing_applied() -> None:
    _, backend, events, controller = setup()
    record = controller.scale_to(0)
    assert record.outcome == "failed" and "at least 1 node" in record.reason
    assert backend.applied == []
    assert events.events[-1][0] == "ScalingRejected" and events.events[-1][2] is True


def test_same_node_count_is_a_no_op() -> None:
    _, backend, _, controller = setup()
    assert controller.scale_to(2).outcome == "unchanged"
    assert backend.applied == []
