"""The topology controller with in-memory fakes at every port: a backend that records schedules, a migrator
that applies them, metrics from the fluid simulator of whatever the backend runs, requests from a list, status
into a dict, a fake clock. No processes, no Redis."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import redis

from elastream.control.autoscaler import Autoscaler
from elastream.control.changes import SETTLE_INTERVALS, settles_at
from elastream.control.controller import TopologyController
from elastream.core.autoscaling.decision import AutoscalerState
from elastream.core.metrics import MetricSample, MetricSnapshot
from elastream.core.migration_protocol import MigrationReport
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.simulate import simulate
from elastream.core.topology import parse_manifest
from support.fakes import (
    DictStatus,
    FakeBackend,
    FakeCheckpoints,
    FakeClock,
    FakeMigrator,
    ListEvents,
    ListFeed,
    ListRequests,
    ManualClock,
    SimulatedMetrics,
)
from support.manifests import edge, manifest, sink, src, work


@dataclass
class Task:
    name: str
    log: list[str]
    fail_stop: bool = False

    def start(self) -> None:
        self.log.append(f"{self.name} started")

    def tick(self) -> None:
        self.log.append(f"{self.name} ticked")

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
        feed=options.pop("feed", None) or ListFeed(),
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
    assert published["catchUp"] == "measuring"  # catch-up and stabilization follow on later ticks
    record = controller.scale_to(2)
    assert record.direction == "in" and len(backend.current_schedule().nodes) == 2


def test_a_migration_is_given_each_vertexs_state_and_input_rate_for_its_batch_sizes() -> None:
    """A key-group migration sizes its batches from each vertex's state (the last checkpoint's) and input rate
    (the analysed window's): the controller hands both to the migrator."""
    topology, backend, migrator, _, _, _, controller = setup()
    checkpoints = FakeCheckpoints(backend)
    checkpoints.state = {"parse": 4096}
    controller.checkpoints = checkpoints
    controller.start()
    snapshot = SimulatedMetrics(topology, backend).snapshot(10)
    assert controller.scale_to(3).outcome == "succeeded"
    load = migrator.loads[-1]
    parse = snapshot.vertices["parse"]
    rate = parse.input_rate if parse.input_rate is not None else parse.processing_rate  # derived: what it takes
    assert load["parse"] == (4096.0, pytest.approx(rate)) and rate > 0
    assert load["z"][0] == 0.0 and load["z"][1] > 0  # no state of its own in the checkpoint, a rate all the same


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
    assert "catchUp" not in status.fields["lastScaling"][-1]  # nothing to measure


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
        from elastream.core.window_analysis import Analysis

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


# ---- the autoscaler on its own ----------------------------------------------------------------------------------


def evaluator(**auto):
    backend, _migrator, _events, status, controller = autoscaled(**auto)
    autoscaler = Autoscaler(backend, ManualClock(controller.clock.t), controller.interval_s)  # type: ignore[arg-type]
    return autoscaler, controller, status


def test_the_autoscaler_returns_its_decision_and_changes_nothing_itself() -> None:
    autoscaler, controller, status = evaluator()
    metrics = controller.metrics
    analysed = []
    real = metrics.analyse

    def analyse(window: int):
        analysed.append(real(window))
        return analysed[-1]

    metrics.analyse = analyse
    evaluation = autoscaler.evaluate(controller.topology, metrics, AutoscalerState())
    assert evaluation is not None and evaluation.recommendation.action == "scale-out"
    assert evaluation.status == evaluation.recommendation.to_status()
    assert [said.reason for said in evaluation.said] == ["AutoscalerDecided"]
    order = evaluation.scale
    assert order is not None and order.nodes == evaluation.recommendation.target_nodes
    assert order.parallelism is not None and order.parallelism["parse"] == 8
    assert [order.snapshot] == [a.snapshot for a in analysed]  # the plan reuses the one window analysed
    assert "autoscaler" not in status.fields and controller.last_evaluation is None  # nothing applied
    assert autoscaler.evaluated_at == autoscaler.clock.now()
    # within the period: no evaluation at all
    assert autoscaler.evaluate(controller.topology, controller.metrics, evaluation.state) is None


def test_the_autoscaler_only_recommends_with_execute_false() -> None:
    autoscaler, controller, _status = evaluator(execute=False)
    evaluation = autoscaler.evaluate(controller.topology, controller.metrics, AutoscalerState())
    assert evaluation is not None and evaluation.scale is None
    assert [said.reason for said in evaluation.said] == ["AutoscalerRecommends"]


def test_an_autoscaler_evaluation_that_raises_returns_an_undecided_one_forgetting_the_votes() -> None:
    autoscaler, controller, _status = evaluator()

    class Broken(WindowedMetrics):
        def analyse(self, window: int):
            raise ValueError("no window today")

    metrics = Broken(controller.topology, autoscaler.backend, controller.clock)  # type: ignore[arg-type]
    evaluation = autoscaler.evaluate(controller.topology, metrics, AutoscalerState(scale_in_votes=2))
    assert evaluation is not None and evaluation.scale is None and evaluation.said == ()
    assert evaluation.recommendation.action == "none"
    assert "ValueError: no window today" in evaluation.recommendation.reason
    assert evaluation.state.scale_in_votes == 0


# ---- the settle rule ------------------------------------------------------------------------------------------


class SettleLog(SimulatedMetrics):
    """Records every write of `not_before`: each schedule change must be settled once, by the one rule."""

    def __init__(self, topology, backend: FakeBackend) -> None:
        self.writes: list[float] = []
        super().__init__(topology, backend)
        self.writes.clear()  # the constructor's own initial value

    @property
    def not_before(self) -> float:
        return self.writes[-1] if self.writes else 0.0

    @not_before.setter
    def not_before(self, value: float) -> None:
        self.writes.append(value)


def test_each_schedule_change_is_settled_once_by_the_one_rule() -> None:
    topology, backend, migrator, _events, _status, _requests, controller = setup(2)
    metrics = SettleLog(topology, backend)
    controller.metrics = metrics
    controller.clock = clock = ManualClock()  # a clock read as often as it is moved: `now` is what was set
    controller.start()
    assert metrics.writes == [settles_at(controller.clock.now(), controller.interval_s)]
    clock.t += 10.0
    record = controller.scale_to(3)
    assert record.outcome == "succeeded"
    assert metrics.writes[1:] == [settles_at(controller.clock.now(), controller.interval_s)]
    assert settles_at(100.0, 0.5) == 100.0 + SETTLE_INTERVALS * 0.5
    clock.t += 10.0
    backend.dead = {"node-0": "gone"}
    controller.recover(backend.failed_nodes())
    assert metrics.writes[2:] == [settles_at(controller.clock.now(), controller.interval_s)]
    clock.t += 10.0
    migrator.outcome = "aborted"
    assert controller.scale_to(2).outcome == "failed"
    assert len(metrics.writes) == 3  # a failed scaling changed no schedule: nothing to settle


# ------------------------------------------------------------------------------------------- faults


@dataclass
class FlakyFeed(ListFeed):
    """A feed whose Redis is away while `down` is set."""

    down: bool = False

    def read_since(self, since_ts: float | None = None) -> list[MetricSample]:
        if self.down:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return super().read_since(since_ts)


def test_redis_away_is_noted_once_and_the_tick_goes_on_when_it_is_back() -> None:
    _, backend, _, events, _, requests, controller = setup(feed=FlakyFeed(down=True))
    controller.start()
    requests.pending.append(3)
    for _ in range(3):
        assert controller.tick() is None
    assert "Connection refused" in controller.store_error
    assert [e[0] for e in events.events].count("RedisUnavailable") == 1
    assert len(backend.current_schedule().nodes) == 2  # nothing was attempted while Redis was away
    controller.feed.down = False  # type: ignore[attr-defined]
    record = controller.tick()
    assert controller.store_error == ""
    assert [e[0] for e in events.events].count("RedisAvailable") == 1
    assert record is not None and record.outcome == "succeeded" and len(backend.current_schedule().nodes) == 3


def test_a_redis_error_during_a_scaling_fails_it_and_keeps_the_schedule() -> None:
    _, backend, migrator, _, status, _, controller = setup()
    controller.start()

    def away(schedule: Schedule, load: object = None) -> MigrationReport:
        raise redis.ConnectionError("Connection reset by peer")

    migrator.migrate = away  # type: ignore[method-assign]
    record = controller.scale_to(3)
    assert record.outcome == "failed" and "Redis" in record.reason
    assert len(backend.current_schedule().nodes) == 2
    assert status.fields["lastScaling"][-1]["outcome"] == "failed"
    assert "Connection reset" in controller.store_error


def test_a_migration_nobody_drives_is_resumed_by_the_next_tick() -> None:
    _, _, migrator, events, _, _, controller = setup()
    controller.start()
    resumed = migrator.resumed
    migrator.left = "abc123"
    controller.tick()
    assert migrator.resumed == resumed + 1 and migrator.left is None
    assert [e[0] for e in events.events].count("MigrationResumed") == 1
    controller.tick()
    assert migrator.resumed == resumed + 1  # nothing left: not resumed again


def test_failed_recoveries_back_off_exponentially_up_to_the_cap_and_say_so() -> None:
    _, backend, migrator, events, status, _, controller = setup(recovery_backoff_s=2.0, recovery_backoff_cap_s=5.0)
    controller.start()
    migrator.recover_failures = 3
    backend.dead = {"node-1": "worker pod t-node-1 is gone"}
    clock = controller.clock
    attempts = []
    for _ in range(40):  # 0.5 s of fake time per now() call: about 20 s
        before = len(migrator.recovered)
        controller.tick()
        if len(migrator.recovered) > before:
            attempts.append(clock.t)  # type: ignore[attr-defined]
    backoffs = [e[1] for e in events.events if e[0] == "RecoveryBackoff"]
    assert backoffs[:3] == [
        "recovery attempt 1 failed; the next in 2 s",
        "recovery attempt 2 failed; the next in 4 s",
        "recovery attempt 3 failed; the next in 5 s",
    ]
    assert len(attempts) == 4  # three failures, then the one that worked: not one per tick
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 2.0 and gaps[1] >= 4.0 and gaps[2] >= 5.0
    assert status.fields["lastRecovery"][-1]["outcome"] == "succeeded"
    assert controller.recovery_failures == 0


def test_background_work_is_ticked_by_the_controller() -> None:
    log: list[str] = []
    _, _, _, _, _, _, controller = setup(background=[Task("checkpoints", log)])
    controller.start()
    controller.tick()
    controller.tick()
    assert log.count("checkpoints ticked") == 2


# ------------------------------------------------------------------------------------ suspend and resume


def test_suspend_stops_the_periodic_work_and_the_workers_after_the_checkpoint_and_ticks_do_nothing() -> None:
    log: list[str] = []
    _, backend, migrator, events, *_, controller = setup(background=[Task("checkpoints", log)])
    checkpoints = FakeCheckpoints(backend)
    controller.checkpoints = checkpoints
    controller.start()
    result = controller.suspend()
    assert (result.done, result.checkpoint_id) == (True, "ckpt-1")
    assert backend.log == ["checkpoint ckpt-1", "workers stopped"]
    assert log == ["checkpoints started", "checkpoints stopped"]
    assert controller.suspend() == result and checkpoints.taken == ["ckpt-1"]  # idempotent
    backend.dead = {"node-0": "gone"}
    controller.tick()
    assert migrator.recovered == [] and log[-1] == "checkpoints stopped"  # suspended: no recovery, no round
    backend.dead = {}
    report = controller.resume()
    assert report is not None and report.restored_from == "ckpt-7"
    assert set(migrator.recovered[0]) == set(backend.current_schedule().nodes)
    assert log[-1] == "checkpoints started" and not controller.suspended
    assert [r for r, *_ in events.events][-2:] == ["Suspended", "Resumed"]


@pytest.mark.parametrize("failure", ["redis", "round"])
def test_a_suspend_whose_checkpoint_fails_stops_nothing(failure: str) -> None:
    _, backend, *_, controller = setup()
    checkpoints = FakeCheckpoints(backend)
    controller.checkpoints = checkpoints
    controller.start()
    if failure == "redis":

        def take():
            raise redis.ConnectionError("Connection refused")

        checkpoints.take = take  # type: ignore[method-assign]
    else:
        checkpoints.failure = "checkpoint ckpt-1 timed out"
    result = controller.suspend()
    assert not result.done and result.reason
    assert "workers stopped" not in backend.log and not controller.suspended
    assert backend.running_nodes() == set(backend.current_schedule().nodes)
    if failure == "redis":
        assert controller.store_error  # the usual RedisUnavailable
