"""The topology controller with in-memory fakes at every port: a backend that records schedules, a migrator
that applies them, metrics from the fluid simulator of whatever the backend runs, requests from a list, status
into a dict, a fake clock. No processes, no Redis."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from elastream.control.controller import TopologyController
from elastream.core.metrics import MetricSample, MetricSnapshot
from elastream.core.migration import MigrationReport
from elastream.core.ports import BackendError, ScaleRequest
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.simulate import simulate, snapshot_from_simulation
from elastream.core.topology import parse_manifest
from helpers import edge, manifest, sink, src, work


class FakeBackend:
    def __init__(self) -> None:
        self.schedule: Schedule | None = None
        self.started: list[Schedule] = []
        self.dead: dict[str, str] = {}
        self.log: list[str] = []

    def current_schedule(self) -> Schedule:
        assert self.schedule is not None
        return self.schedule

    def start(self, schedule: Schedule) -> None:
        self.started.append(schedule)
        self.schedule = schedule

    def failed_nodes(self) -> dict[str, str]:
        return dict(self.dead)

    def stop_workers(self) -> None:
        self.log.append("workers stopped")


@dataclass
class FakeMigrator:
    backend: FakeBackend
    applied: list[Schedule] = field(default_factory=list)
    outcome: str = "succeeded"
    target: Schedule | None = None
    resumed: int = 0
    recovered: list[dict[str, str]] = field(default_factory=list)

    def report(self, outcome: str, **extra: object) -> MigrationReport:
        return MigrationReport(
            "m1",
            "ccr",
            "out",
            2,
            3,
            {"captureMs": 10.0},
            5,
            0,
            0,
            outcome,
            pause_ms=42.0,
            **extra,  # type: ignore[arg-type]
        )

    def migrate(self, schedule: Schedule) -> MigrationReport:
        if self.outcome == "raise":
            raise BackendError("node-2 not ready after 60 s")
        if self.outcome == "succeeded":
            self.applied.append(schedule)
            self.backend.schedule = schedule
            return self.report("succeeded")
        return self.report(self.outcome, reason="prepare timed out")

    def interrupted_target(self) -> Schedule | None:
        return self.target

    def resume(self) -> MigrationReport | None:
        self.resumed += 1
        return self.report("succeeded") if self.target is not None else None

    def recover(self, failed: dict[str, str]) -> MigrationReport | None:
        self.recovered.append(failed)
        self.backend.dead = {}
        return MigrationReport(
            "r1",
            "restart",
            "in",
            2,
            2,
            {},
            0,
            0,
            321,
            "succeeded",
            restored_from="ckpt-7",  # type: ignore[arg-type]
        )


class SimulatedMetrics:
    def __init__(self, topology, backend: FakeBackend) -> None:
        self.topology, self.backend = topology, backend
        self.not_before = 0.0
        self.engine = "python"

    def snapshot(self, window: int) -> MetricSnapshot:
        schedule = self.backend.current_schedule()
        return snapshot_from_simulation(self.topology, schedule, simulate(self.topology, schedule))


@dataclass
class ListFeed:
    samples: list[MetricSample] = field(default_factory=list)

    def read_since(self, since_ts: float | None = None) -> list[MetricSample]:
        return [s for s in self.samples if since_ts is None or s.ts >= since_ts]


@dataclass
class ListRequests:
    pending: list[int] = field(default_factory=list)

    def take(self) -> ScaleRequest | None:
        return ScaleRequest(self.pending.pop(0)) if self.pending else None


@dataclass
class DictStatus:
    fields: dict[str, list[dict]] = field(default_factory=dict)

    def publish(self, name: str, status: dict) -> None:
        self.fields.setdefault(name, []).append(dict(status))


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


@dataclass
class Task:
    name: str
    log: list[str]
    fail_stop: bool = False

    def start(self) -> None:
        self.log.append(f"{self.name} started")

    def stop(self) -> None:
        self.log.append(f"{self.name} stopped")
        if self.fail_stop:
            raise RuntimeError("stuck")


def setup(nodes: int = 2, **options):
    topology = parse_manifest(
        manifest(
            [src("s", 2, rate=4000), work("parse", 2, costMs=2), sink("z", 1, costMs=0.05)],
            [edge("s", "parse"), edge("parse", "z")],
            nodes=nodes,
            slotsPerNode=6,
        )
    )
    backend = FakeBackend()
    migrator = FakeMigrator(backend)
    events, status, requests = ListEvents(), DictStatus(), ListRequests()
    controller = TopologyController(
        topology=topology,
        backend=backend,  # type: ignore[arg-type]
        metrics=SimulatedMetrics(topology, backend),
        migrator=migrator,
        feed=ListFeed(),
        requests=requests,
        status=status,
        events=events,
        clock=FakeClock(),
        **options,
    )
    return topology, backend, migrator, events, status, requests, controller


def test_start_runs_the_initial_schedule_and_the_background_work() -> None:
    log: list[str] = []
    topology, backend, migrator, *_, controller = setup(background=[Task("checkpoints", log)])
    controller.start()
    assert backend.started == [initial_schedule(topology)]
    assert migrator.resumed == 1  # asked, found nothing
    assert log == ["checkpoints started"]
    assert controller.metrics.not_before > 1000.0  # the start-up transient is not analysed


def test_start_finishes_a_migration_an_earlier_controller_left() -> None:
    topology, backend, migrator, events, *_, controller = setup()
    target = Schedule({e: "node-1" for e in initial_schedule(topology).assignment}, ("node-0", "node-1"), 6)
    migrator.target = target
    controller.start()
    assert backend.started == [target]  # the target's workers start and wait for INIT
    assert events.events[-1][0] == "MigrationResumed"


def test_scale_out_then_in_plans_migrates_and_publishes_the_record() -> None:
    topology, backend, migrator, events, status, _, controller = setup()
    controller.start()
    before = simulate(topology, backend.current_schedule()).throughput
    record = controller.scale_to(3)
    assert record.outcome == "succeeded" and record.direction == "out"
    assert len(backend.current_schedule().nodes) == 3 and migrator.applied == [backend.current_schedule()]
    after = simulate(topology, backend.current_schedule()).throughput
    assert after > before
    assert record.predicted_throughput == after
    assert [e[0] for e in events.events] == ["ScalingPlanned", "Scaled"]
    assert "sources paused 42 ms" in events.events[-1][1]
    published = status.fields["lastScaling"][-1]
    assert published["fromNodes"] == 2 and published["toNodes"] == 3 and published["requestedNodes"] == 3
    assert published["plan"]["added_nodes"] == ["node-2"] and published["pauseMs"] == 42.0
    assert published["analysisEngine"] == "python"
    assert published["recovery"] == "measuring"  # catch-up and stabilization follow on later ticks
    record = controller.scale_to(2)
    assert record.direction == "in" and len(backend.current_schedule().nodes) == 2


def test_an_impossible_request_is_rejected_with_the_fix_and_nothing_migrated() -> None:
    *_, migrator, events, status, _, controller = setup()
    controller.start()
    record = controller.scale_to(0)
    assert record.outcome == "failed" and "at least 1 node" in record.reason
    assert migrator.applied == []
    assert events.events[-1][0] == "ScalingRejected" and events.events[-1][2] is True
    assert status.fields["lastScaling"][-1]["outcome"] == "failed"


def test_the_same_node_count_is_a_no_op() -> None:
    *_, migrator, _, _, _, controller = setup()
    controller.start()
    assert controller.scale_to(2).outcome == "unchanged"
    assert migrator.applied == []


@pytest.mark.parametrize("failure", ["aborted", "raise"])
def test_a_failed_migration_is_reported_and_the_schedule_kept(failure: str) -> None:
    _, backend, migrator, events, status, _, controller = setup()
    controller.start()
    old = backend.current_schedule()
    migrator.outcome = failure
    record = controller.scale_to(3)
    assert record.outcome == "failed"
    assert ("prepare timed out" if failure == "aborted" else "node-2 not ready") in record.reason
    assert backend.current_schedule() == old
    assert events.events[-1][0] == "ScalingFailed" and events.events[-1][2]
    assert "recovery" not in status.fields["lastScaling"][-1]  # nothing to measure


def test_tick_carries_out_a_pending_request() -> None:
    *_, requests, controller = setup()
    controller.start()
    assert controller.tick() is None
    requests.pending.append(3)
    record = controller.tick()
    assert record is not None and record.outcome == "succeeded" and record.to_nodes == 3


def test_tick_rolls_back_after_a_dead_worker_and_records_the_replay() -> None:
    _, backend, migrator, events, status, _, controller = setup()
    controller.start()
    backend.dead = {"node-1": "worker node-1 exited with code -9"}
    controller.tick()
    assert migrator.recovered == [{"node-1": "worker node-1 exited with code -9"}]
    recovery = status.fields["lastRecovery"][-1]
    assert recovery["nodes"] == ["node-1"] and recovery["replayed"] == 321 and recovery["restoredFrom"] == "ckpt-7"
    assert [e[0] for e in events.events][-2:] == ["WorkerLost", "Recovered"]
    assert "321 events replayed" in events.events[-1][1]
    controller.tick()  # healthy again: no second recovery
    assert len(migrator.recovered) == 1


def test_close_stops_background_work_then_workers_then_the_archive_even_if_one_stop_fails() -> None:
    log: list[str] = []
    _, backend, *_, controller = setup(
        background=[Task("checkpoints", log), Task("other", log, fail_stop=True)], archiver=Task("archive", log)
    )
    backend.log = log
    with controller:
        controller.start()
    assert log == [
        "archive started",
        "checkpoints started",
        "other started",
        "other stopped",
        "checkpoints stopped",
        "workers stopped",
        "archive stopped",
    ]


# ---- the autoscaler in the controller -------------------------------------------------------------------------


class WindowedMetrics(SimulatedMetrics):
    """The simulator's snapshot as a full window ending now (the controller's clock)."""

    def __init__(self, topology, backend: FakeBackend, clock: FakeClock) -> None:
        super().__init__(topology, backend)
        self.clock = clock
        self.analysed = 0
        self.snapshots = 0

    def snapshot(self, window: int) -> MetricSnapshot:
        self.snapshots += 1
        return super().snapshot(window)

    def analyse(self, window: int):
        from elastream.core.metrics import Analysis

        self.analysed += 1
        end = self.clock.t
        return Analysis(SimulatedMetrics.snapshot(self, window), {}, {}, {}, end - window, end, 100)


def autoscaled(nodes: int = 2, **auto):
    _topology, backend, migrator, events, status, _requests, controller = setup()
    spec = {"enabled": True, "stabilizationSeconds": 30, **auto}
    document = manifest(
        [src("s", 2, rate=4000), work("parse", 2, costMs=2), sink("z", 1, costMs=0.05)],
        [edge("s", "parse"), edge("parse", "z")],
        nodes=nodes,
        slotsPerNode=6,
        scaling={"auto": spec},
    )
    controller.topology = parse_manifest(document)
    controller.metrics = WindowedMetrics(controller.topology, backend, controller.clock)
    controller.start()
    return backend, migrator, events, status, controller


def test_autoscale_scales_the_critical_vertex_out_by_eq_11_and_publishes_why() -> None:
    # parse: 2 executors × 500/s against 4000/s offered: LAL 4, critical -> ⌈2 × 4⌉ = 8 executors; the
    # source (no cost) is low -> 1; z gets parse's estimated output at its new degree and stays at 1.
    _backend, migrator, events, status, controller = autoscaled()
    record = controller.tick()
    assert record is not None and record.outcome == "succeeded" and record.trigger == "autoscaler"
    assert migrator.applied[-1].parallelism() == {"s": 1, "parse": 8, "z": 1}
    assert len(migrator.applied[-1].nodes) == 2  # 10 executors fit 2 nodes × 6 slots
    evaluation = status.fields["autoscaler"][-1]
    assert evaluation["decision"] == "scale-out" and evaluation["execute"] is True
    assert evaluation["vertices"]["parse"]["activity"] == "critical"
    assert evaluation["vertices"]["parse"]["lal"] == pytest.approx(4.0)
    assert [e[0] for e in events.events if e[0].startswith("Autoscaler")] == ["AutoscalerDecided"]
    assert status.fields["lastScaling"][-1]["trigger"] == "autoscaler"
    assert (controller.metrics.analysed, controller.metrics.snapshots) == (1, 0)  # the plan reused the window


def test_autoscale_holds_after_a_change_until_it_settled_and_stabilized() -> None:
    _backend, migrator, _events, status, controller = autoscaled()
    controller.tick()
    applied = len(migrator.applied)
    controller.clock.t += 5.0
    controller.tick()
    evaluation = status.fields["autoscaler"][-1]
    assert evaluation["decision"] in ("hold", "none")
    assert len(migrator.applied) == applied
    assert controller.autoscaler.settled_at is None  # the catch-up was not measured yet


def test_execute_false_only_recommends() -> None:
    _backend, migrator, events, status, controller = autoscaled(execute=False)
    assert controller.tick() is None
    assert migrator.applied == []
    evaluation = status.fields["autoscaler"][-1]
    assert evaluation["decision"] == "scale-out" and evaluation["execute"] is False
    assert evaluation["parallelism"]["parse"] == 8
    assert [e[0] for e in events.events if e[0].startswith("Autoscaler")] == ["AutoscalerRecommends"]


def test_autoscale_stays_within_max_nodes() -> None:
    # maxNodes 1: 6 slots; parse wanted 8 but only 4 fit beside s and z
    _backend, migrator, _events, status, controller = autoscaled(nodes=1, maxNodes=1)
    record = controller.tick()
    assert record is not None
    assert migrator.applied[-1].parallelism() == {"s": 1, "parse": 4, "z": 1}
    assert migrator.applied[-1].nodes == ("node-0",)
    assert "bounded to 1 nodes" in status.fields["autoscaler"][-1]["reason"]


def test_autoscale_disabled_never_analyses() -> None:
    topology, backend, _migrator, _events, status, _requests, controller = setup()
    controller.metrics = WindowedMetrics(topology, backend, controller.clock)
    controller.start()
    controller.tick()
    assert controller.metrics.analysed == 0 and "autoscaler" not in status.fields
