"""The pure migration and checkpoint state machines: coordinator phases, timeouts, INIT resend, participants,
checkpoint rounds, and the rate timeline a migration is measured on."""

from __future__ import annotations

import math

import pytest

from elastream.core.checkpoint_protocol import CheckpointPhase, CheckpointRound, replayed_events
from elastream.core.migration_protocol import (
    Ack,
    ActionKind,
    ExecutorParticipant,
    MigrationCoordinator,
    Mode,
    Phase,
    Timeouts,
)
from elastream.core.rate_timeline import rate_timeline, recovery_times
from elastream.core.schedule import key_group_owner, key_group_ranges
from elastream.core.topology import TopologyError, parse_manifest
from elastream.crd import check_manifest
from support.manifests import edge, manifest, sink, src

OLD = frozenset({"s#0", "a#0", "a#1"})
NEW = frozenset({"s#0", "a#0", "a#1", "a#2"})


def kinds(actions):
    return [a.kind for a in actions]


def ack_all(coordinator, executors, phase, now):
    actions = []
    for e in sorted(executors):
        actions += coordinator.on_ack(Ack("m1", phase, e, captured=2), now)
    return actions


def test_ccr_happy_path_and_phase_times() -> None:
    c = MigrationCoordinator("m1", "ccr", OLD, NEW)
    assert kinds(c.start(0.0)) == [ActionKind.PAUSE_SOURCES, ActionKind.BROADCAST_PREPARE]
    assert kinds(ack_all(c, OLD, Phase.PREPARING, 0.1)) == [ActionKind.START_COMMIT]
    assert c.captured == 6
    assert kinds(ack_all(c, OLD, Phase.COMMITTING, 0.3)) == [ActionKind.APPLY_SCHEDULE]
    init = c.on_rebalanced(1.3)
    assert kinds(init) == [ActionKind.BROADCAST_INIT] and init[0].executors == tuple(sorted(NEW))
    assert kinds(ack_all(c, NEW, Phase.INITIALIZING, 1.5)) == [ActionKind.RESUME_SOURCES, ActionKind.CLEANUP]
    assert c.phase is Phase.DONE
    durations = c.times.durations_ms()
    assert durations == pytest.approx(
        {"captureMs": 100.0, "commitMs": 200.0, "rebalanceMs": 1000.0, "restoreMs": 200.0}
    )


def test_duplicate_late_and_foreign_acks_are_ignored() -> None:
    c = MigrationCoordinator("m1", "ccr", OLD, NEW)
    c.start(0.0)
    assert c.on_ack(Ack("m1", Phase.PREPARING, "s#0"), 0.1) == []
    assert c.on_ack(Ack("m1", Phase.PREPARING, "s#0"), 0.1) == []  # duplicate
    assert c.on_ack(Ack("other", Phase.PREPARING, "a#0"), 0.1) == []  # another migration
    assert c.on_ack(Ack("m1", Phase.COMMITTING, "a#0"), 0.1) == []  # wrong phase
    assert c.on_ack(Ack("m1", Phase.PREPARING, "zz#9"), 0.1) == []  # not a participant
    assert c.acked == {"s#0"}


def test_init_is_resent_every_second_to_those_missing() -> None:
    c = MigrationCoordinator("m1", "ccr", OLD, NEW)
    c.start(0.0)
    ack_all(c, OLD, Phase.PREPARING, 0.0)
    ack_all(c, OLD, Phase.COMMITTING, 0.0)
    c.on_rebalanced(10.0)
    c.on_ack(Ack("m1", Phase.INITIALIZING, "a#0"), 10.2)
    assert c.on_tick(10.5) == []
    resend = c.on_tick(11.0)
    assert kinds(resend) == [ActionKind.BROADCAST_INIT] and "a#0" not in resend[0].executors
    assert set(resend[0].executors) == NEW - {"a#0"}


def test_commit_is_resent_every_commit_resend_s_to_those_missing() -> None:
    # an ack lost with a failed Redis primary would otherwise hold the migration until commit_s aborts it
    c = MigrationCoordinator("m1", "ccr", OLD, NEW, Timeouts(commit_resend_s=5.0))
    c.start(0.0)
    assert kinds(ack_all(c, OLD, Phase.PREPARING, 1.0)) == [ActionKind.START_COMMIT]
    c.on_ack(Ack("m1", Phase.COMMITTING, "s#0"), 1.1)
    assert c.on_tick(5.9) == []
    resend = c.on_tick(6.0)
    assert kinds(resend) == [ActionKind.RESEND_COMMIT] and resend[0].executors == ("a#0", "a#1")
    assert c.on_tick(10.9) == [] and kinds(c.on_tick(11.0)) == [ActionKind.RESEND_COMMIT]
    c.on_ack(Ack("m1", Phase.COMMITTING, "a#0"), 11.5)
    assert kinds(c.on_ack(Ack("m1", Phase.COMMITTING, "a#1"), 11.6)) == [ActionKind.APPLY_SCHEDULE]


def test_a_participant_ignores_commit_once_committed() -> None:
    p = ExecutorParticipant("a#0", frozenset({"s#0"}))
    p.on_prepare("m1")
    assert not p.committed("m1")
    assert p.on_commit("m1", "s#0") and p.committed("m1") and not p.committed("m2")
    assert not p.on_commit("m1", "s#0")  # a duplicate (a sender's COMMIT, resent)


def test_timeout_before_commit_aborts_with_reason() -> None:
    c = MigrationCoordinator("m1", "ccr", OLD, NEW, Timeouts(prepare_s=5.0))
    c.start(0.0)
    c.on_ack(Ack("m1", Phase.PREPARING, "s#0"), 1.0)
    actions = c.on_tick(6.0)
    assert kinds(actions) == [ActionKind.ABORT, ActionKind.RESUME_SOURCES, ActionKind.CLEANUP]
    assert c.phase is Phase.ABORTED
    assert actions[0].reason == "preparing timed out after 5 s waiting for a#0, a#1"


def test_failure_after_commit_goes_forward() -> None:
    c = MigrationCoordinator("m1", "ccr", OLD, NEW)
    c.start(0.0)
    ack_all(c, OLD, Phase.PREPARING, 0.0)
    ack_all(c, OLD, Phase.COMMITTING, 0.0)
    assert kinds(c.on_failure("worker node-1 died", 1.0)) == [ActionKind.APPLY_SCHEDULE]
    assert c.phase is Phase.REBALANCING
    c.on_rebalanced(2.0)
    assert kinds(c.on_failure("worker node-2 died", 3.0)) == [ActionKind.BROADCAST_INIT]
    assert c.phase is Phase.INITIALIZING


def test_ccr_participant_captures_then_aligns_commits() -> None:
    p = ExecutorParticipant("b#0", frozenset({"a#0", "a#1"}))
    assert not p.captures()
    assert p.on_prepare("m1") is True and p.captures()
    assert p.on_commit("m1", "a#0") is False
    assert p.on_commit("m1", "a#0") is False  # the same channel twice is not alignment
    assert p.on_commit("m1", "a#1") is True and p.mode is Mode.CHECKPOINTED
    assert p.on_init("m1") is True and p.mode is Mode.RUNNING
    assert p.on_init("m1") is False  # duplicate INIT: ack only


def test_dcr_participant_waits_for_prepare_on_every_channel() -> None:
    p = ExecutorParticipant("b#0", frozenset({"a#0", "a#1"}), protocol="dcr")
    assert p.on_prepare("m1", "a#0") is False
    assert not p.captures()  # DCR drains by processing, it never captures
    assert p.on_prepare("m1", "a#1") is True


def test_source_commits_when_told() -> None:
    p = ExecutorParticipant("s#0", frozenset())
    p.on_prepare("m1")
    assert p.on_commit("m1", None) is True


def test_a_commit_arriving_after_the_abort_is_ignored() -> None:
    # ABORT comes through the control list and can overtake COMMIT, which travels in-band behind the data:
    # taking the late COMMIT would checkpoint the executor and capture its input forever
    p = ExecutorParticipant("b#0", frozenset({"a#0"}))
    p.on_prepare("m1")
    p.on_abort()
    assert p.on_commit("m1", "a#0") is False
    assert p.mode is Mode.RUNNING and not p.captures()
    assert p.on_commit("m0", "a#0") is False  # nor is a COMMIT of a migration it never prepared for
    p.on_prepare("m2")
    assert p.on_commit("m2", "a#0") is True  # the next migration commits as usual


def test_key_group_owner_matches_ranges() -> None:
    for max_par in (4, 7, 128):
        for k in range(1, min(max_par, 9) + 1):
            for index, groups in enumerate(key_group_ranges(max_par, k)):
                assert all(key_group_owner(max_par, k, g) == index for g in groups)


def test_recovery_times_follow_the_output_rate_back_to_its_level() -> None:
    from elastream.core.rate_timeline import recovery_times

    timeline = [(-2.0, 100.0), (-1.0, 100.0), (0.0, 0.0), (1.0, 20.0), (2.0, 180.0), (3.0, 120.0)]
    timeline += [(4.0, 105.0), (5.0, 98.0), (6.0, 101.0)]
    catch_up, stable = recovery_times(timeline)
    assert catch_up == 2.0  # first back to >= 90
    assert stable == 4.0  # 105, 98, 101 stay within ±10 %
    assert recovery_times([(0.0, 5.0)]) == (None, None)  # no reference before the migration


def test_restart_skips_capture_and_commit_and_restores_on_init() -> None:
    c = MigrationCoordinator("m1", "restart", OLD, NEW)
    assert kinds(c.start(0.0)) == [ActionKind.APPLY_SCHEDULE]
    assert c.phase is Phase.REBALANCING
    assert kinds(c.on_rebalanced(2.0)) == [ActionKind.BROADCAST_INIT]
    assert kinds(ack_all(c, NEW, Phase.INITIALIZING, 2.5)) == [ActionKind.RESUME_SOURCES, ActionKind.CLEANUP]
    assert c.times.durations_ms() == pytest.approx(
        {"captureMs": 0.0, "commitMs": 0.0, "rebalanceMs": 2000.0, "restoreMs": 500.0}
    )


def test_checkpoint_round_completes_on_every_ack_once() -> None:
    r = CheckpointRound("ckpt-1", OLD, started_at=10.0, timeout_s=5.0)
    assert r.on_ack("s#0", 100, 10.1) is CheckpointPhase.RUNNING
    assert r.on_ack("s#0", 100, 10.1) is CheckpointPhase.RUNNING  # a duplicate counts once
    assert r.on_ack("x#9", 100, 10.1) is CheckpointPhase.RUNNING  # not part of the round
    r.on_ack("a#0", 10, 10.2)
    assert r.on_ack("a#1", 10, 10.4) is CheckpointPhase.COMPLETED
    assert r.state_bytes == 120 and r.duration_ms == pytest.approx(400.0)
    assert r.on_tick(100.0) is CheckpointPhase.COMPLETED  # a completed round never times out


def test_checkpoint_round_times_out_naming_the_missing_and_fails_on_a_dead_worker() -> None:
    r = CheckpointRound("ckpt-2", OLD, started_at=0.0, timeout_s=5.0)
    r.on_ack("s#0", 0, 1.0)
    assert r.on_tick(4.0) is CheckpointPhase.RUNNING
    assert r.on_tick(5.5) is CheckpointPhase.FAILED
    assert r.failure == "checkpoint ckpt-2 timed out after 5 s waiting for a#0, a#1"
    dead = CheckpointRound("ckpt-3", OLD, started_at=0.0)
    assert dead.on_failure("worker node-1 exited with code -9") is CheckpointPhase.FAILED
    assert dead.on_ack("s#0", 0, 1.0) is CheckpointPhase.FAILED and "node-1" in (dead.failure or "")


def test_replayed_events_per_lane_from_latest_back_to_the_checkpoint() -> None:
    # synthetic positions: {lane: events emitted in it}; lanes moved between executors merge by maximum
    checkpointed = [{0: 10, 1: 12}, {2: 7}]
    latest = [{0: 15, 1: 12}, {2: 9}, {2: 8}]  # a stale entry of lane 2 from an older executor
    assert replayed_events(checkpointed, latest) == 5 + 0 + 2
    assert replayed_events([], latest) == 15 + 12 + 9  # no checkpoint: everything is emitted again
    # redis-stream positions: {lane: [last entry id, entries of the lane emitted]}
    assert replayed_events([{0: ["5-0", 40]}], [{0: ["9-0", 64]}]) == 24
    assert replayed_events([{0: 3}], [None, "opaque"]) == 0  # positions without counts count nothing
    # a synthetic source's profile clock and a redis-stream source's lane mark are no lanes
    clock = {"clock": 1795650000.0}
    assert replayed_events([], [{0: 15, **clock}, {"lanes": "ordinal % 8", 2: ["7-0", 9]}]) == 15 + 9


def test_checkpoint_interval_is_validated() -> None:
    doc = manifest([src("s"), sink("k")], [edge("s", "k")])
    assert parse_manifest(doc).scaling.checkpoint_interval_s == 10
    doc["spec"]["scaling"] = {"checkpointIntervalSeconds": 0}
    assert parse_manifest(doc).scaling.checkpoint_interval_s == 0
    doc["spec"]["scaling"] = {"checkpointIntervalSeconds": -1}
    with pytest.raises(TopologyError, match=r"spec.scaling.checkpointIntervalSeconds: -1 is below 0"):
        check_manifest(doc)


def _sample(ts: float, vertex: str, processed: int, started_at: float = 0.0, executor: str | None = None):
    from elastream.core.metrics import MetricSample

    return MetricSample(ts, "node-0", vertex, executor or f"{vertex}#0", started_at, processed, processed, 0, 0.0, 0)


def test_rate_timeline_buckets_rates_per_incarnation_and_fills_gaps_with_zero() -> None:
    samples = [_sample(t, "src", 100 * t) for t in range(0, 5)]  # 100/s
    samples += [_sample(t, "out", 50 * t) for t in range(0, 3)]  # 50/s, then the worker stops...
    samples += [_sample(t, "out", 80 * (t - 4), started_at=4.0) for t in range(4, 7)]  # ...restarts at 80/s
    samples += [_sample(t, "mid", 999 * t) for t in range(0, 7)]  # neither source nor sink
    timeline = rate_timeline(samples, ["src"], ["out"], at=2.0, bucket_s=1.0)
    # both series share one time axis: after the source's last sample its buckets are zero
    assert timeline["input"] == [(-1.0, 100.0), (0.0, 100.0), (1.0, 100.0), (2.0, 100.0), (3.0, 0.0), (4.0, 0.0)]
    assert timeline["output"] == [(-1.0, 50.0), (0.0, 50.0), (1.0, 0.0), (2.0, 0.0), (3.0, 80.0), (4.0, 80.0)]
    # the reference is the output before the request (50/s): still there at +0 s, never within ±10 % of it for
    # two buckets in a row afterwards (0/s, then 80/s)
    assert recovery_times(timeline["output"], tolerance=0.1, hold=2) == (0.0, None)
    assert recovery_times([(-1.0, 50.0), (0.0, 10.0), (1.0, 48.0), (2.0, 50.0)], hold=2) == (1.0, 1.0)


@pytest.mark.parametrize("phase", [0.0, 0.1, 0.24, 0.25, 0.26, 0.3, 0.49])
def test_a_steady_output_sampled_a_little_late_reads_steady_wherever_the_request_falls(phase: float) -> None:
    # Workers sample on the wall clock's 0.5 s grid, each sample a few milliseconds late (more on a busy
    # machine). Buckets placed from the request's time put an edge where the request fell: with the request a
    # quarter interval after a grid time, a sample 11 ms late and the next 9 ms late landed in one bucket and
    # left the next empty (200/s read as 400, then 0), and a steady output could read as "not stable".
    delays = [0.002, 0.011, 0.009, 0.030, 0.004, 0.018, 0.001, 0.040, 0.012, 0.007]
    samples = [_sample(1000.0 + 0.5 * k + delays[k % len(delays)], "out", 100 * k) for k in range(40)]
    at = 1005.0 + phase
    output = rate_timeline(samples, [], ["out"], at=at, bucket_s=0.5)["output"]
    rates = [rate for _, rate in output]
    assert min(rates) > 150.0 and max(rates) < 250.0, rates  # 200/s give or take the delays, never 0 or 400
    assert [t for t, _ in output][:2] == pytest.approx([1000.5 - at, 1001.0 - at])  # the grid's own times
    first_after = math.ceil(at / 0.5) * 0.5 - at  # the first grid time at or after the request
    assert recovery_times(output) == pytest.approx((first_after, first_after))


def test_a_start_up_burst_before_the_request_does_not_move_the_level_the_output_returns_to() -> None:
    # Beside the soak, a topology started 4 s before its rescale delivered what queued while its workers
    # started in its first bucket (a 260/s bucket among 200s on a pinned core; more on a busier machine). A mean
    # reference moved by it more than 10 % left the steady 200/s outside the band for good: "not stable".
    before = [(-3.5, 600.0)] + [(t / 2.0, 200.0) for t in range(-6, 0)]
    after = [(0.0, 200.0), (0.5, 0.0), (1.0, 250.0)] + [(1.5 + t / 2.0, 200.0) for t in range(10)]
    assert recovery_times(before + after, resumed_at=0.5) == (1.0, 1.5)


def test_the_output_is_followed_from_the_end_of_the_pause_not_from_the_request() -> None:
    # The request's analysis and the migration's prepare phase take seconds, the output at its old level all
    # along: catch-up and stabilization read there would be 0 s whatever the pause did afterwards.
    output = [(t / 2.0, 100.0) for t in range(-8, 5)] + [(2.5, 0.0), (3.0, 0.0), (3.5, 60.0)]
    output += [(4.0 + t / 2.0, 100.0) for t in range(6)]
    assert recovery_times(output) == (0.0, 0.0)  # from the request: the old level
    assert recovery_times(output, resumed_at=2.5) == (4.0, 4.0)
    assert recovery_times(output, resumed_at=9.0) == (None, None)  # nothing measured after it yet


def test_the_follow_up_bounds_its_wait_from_the_end_of_the_pause() -> None:
    # A scaling that took 70 s (pods to start) has had no time to settle when it returns: its follow-up gives
    # the output 60 s from there, not from the request (where it would time out at once).
    from types import SimpleNamespace

    from elastream.control.catch_up import CatchUpFollowUp
    from support.fakes import ListFeed

    clock = SimpleNamespace(t=1070.0)
    samples = [_sample(990.0 + k, "out", 100 * k) for k in range(110)]  # 100/s from 10 s before the request
    follow = CatchUpFollowUp(ListFeed(samples[:80]), SimpleNamespace(sources=[], sinks=["out"]), now=lambda: clock.t)
    done: list[dict] = []
    status: dict = {}
    follow.follow(status, 1000.0, done.append, resumed_at=1070.0)
    follow.tick()
    assert status["catchUp"] == "measuring" and not done  # nothing after the pause yet, and within the bound
    follow.feed = ListFeed(samples)
    clock.t = 1100.0
    follow.tick()
    assert done and status["catchUp"] == "measured", status
    assert status["catchUpMs"] == pytest.approx(70_000.0) and status["stabilizationMs"] == pytest.approx(70_000.0)

    late: dict = {}
    follow.feed = ListFeed(samples[:80])
    follow.follow(late, 1000.0, done.append, resumed_at=1070.0)
    clock.t = 1129.0
    follow.tick()
    assert late["catchUp"] == "measuring"
    clock.t = 1131.0
    follow.tick()
    assert late["catchUp"] == "not stable within 60 s" and late["stabilizationMs"] is None, late
