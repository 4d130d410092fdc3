"""The parts of a reconcile pass one by one (`control.reconciler.TopologyReconciler` composes them): the
attempt in progress as a tagged union (`control.attempts`), the status rendered by a pure function
(`core.status.render_status`), and `Convergence`, `Lifecycle`, `Upgrades` and `ControllerTick` each called
alone on a topology over the fakes of `test_reconciler.World` (no pass around them). The whole pass is
`test_reconciler`'s."""

from __future__ import annotations

import pytest
import redis
from test_reconciler import World, running

from elastream.control.attempts import (
    Attempt,
    ResumeAttempt,
    ScaleAttempt,
    StartAttempt,
    SuspendAttempt,
    UpgradeAttempt,
    failure_counts,
    next_attempt,
)
from elastream.control.convergence import degrees_to_apply, reached
from elastream.control.lifecycle import (
    KeepSuspended,
    SuspendOutcome,
    TakeLastCheckpoint,
    WaitToSuspend,
    start_failure,
    suspend_outcome,
    suspend_step,
)
from elastream.control.managed import ManagedTopology, UpgradeMemory
from elastream.control.operator_options import OperatorOptions
from elastream.control.pacing import LoopSettings, Pacing
from elastream.control.pass_context import PassContext, observe, observe_resource
from elastream.control.upgrades import (
    ApplyInPlace,
    KeepRolledBack,
    RefuseChange,
    StartUpgrade,
    WaitToUpgrade,
    spec_step,
)
from elastream.core.ports import BackendError, NotOwned
from elastream.core.status import (
    FailureCounts,
    StatusFacts,
    StatusReading,
    VertexReading,
    WorkloadReading,
    render_status,
    utc_timestamp,
)
from elastream.core.topology import Topology
from elastream.core.upgrade import SpecChange
from elastream.store.acl import AclRefused


def managed_of(world: World) -> ManagedTopology:
    managed = world.topologies.get("default", "t")
    assert managed is not None
    return managed


def wanted_of(world: World) -> Topology:
    return observe_resource(world.body, world.topologies.allowed_images, world.topologies.settings)


def context_of(world: World, now: float | None = None) -> PassContext:
    """What a pass of `world` would hand its parts at `now` (the clock's by default): the resource observed,
    and what its controller runs once there is one."""
    seen = observe(world.body, world.topologies.allowed_images, world.topologies.settings)
    context = PassContext(seen, world.clock.monotonic() if now is None else now)
    managed = world.topologies.get("default", "t")
    controller = managed.controller if managed is not None else None
    return context.reading(controller) if controller is not None else context


# ------------------------------------------------------------------------------------------- attempts


def test_a_failure_at_the_same_target_counts_on_and_another_target_starts_from_one() -> None:
    first = next_attempt(None, ScaleAttempt.of(5, None), "not ready", now=100.0, retry_s=5.0, retry_cap_s=300.0)
    assert (first.failures, first.due, first.delay) == (1, 105.0, 5.0)
    again = next_attempt(first, ScaleAttempt(5), "not ready", now=105.0, retry_s=5.0, retry_cap_s=300.0)
    assert (again.failures, again.delay) == (2, 10.0)
    other = next_attempt(again, ScaleAttempt.of(5, {"parse": 3}), "not ready", 110.0, 5.0, 300.0)
    assert other.failures == 1  # new degrees: a new desired state
    assert next_attempt(again, StartAttempt(), "quota", 110.0, 5.0, 300.0).failures == 1


def test_an_attempt_waits_only_for_its_own_target_until_it_is_due() -> None:
    attempt = Attempt(SuspendAttempt(), failures=1, due=10.0)
    assert attempt.waits(SuspendAttempt(), now=4.0) == 6.0
    assert attempt.waits(SuspendAttempt(), now=10.0) is None
    assert attempt.waits(UpgradeAttempt(), now=4.0) is None


def test_each_kind_of_attempt_counts_its_failures_where_it_belongs() -> None:
    assert failure_counts(None) == FailureCounts()
    assert failure_counts(Attempt(StartAttempt(), 2)) == FailureCounts(start=2)
    assert failure_counts(Attempt(ResumeAttempt(), 3)) == FailureCounts(start=3)
    assert failure_counts(Attempt(SuspendAttempt(), 1)) == FailureCounts(suspend=1)
    # an upgrade's failed checkpoint is not a failed scaling
    assert failure_counts(Attempt(UpgradeAttempt(), 4)) == FailureCounts(upgrade=4)
    assert failure_counts(Attempt(ScaleAttempt(5), 2)) == FailureCounts(scaling=2)


# ------------------------------------------------------------------------------------- status, pure


def test_the_status_is_rendered_from_the_facts_and_what_was_read() -> None:
    facts = StatusFacts(0, 0, started=True)
    reading = StatusReading(
        schedule_nodes=3,
        parallelism={"s": 2},
        ready=2,
        workload=WorkloadReading("app=t", 1234.56, (VertexReading("s", 99.94, lag=7),), last_scaling="out 2->3"),
    )
    now = utc_timestamp(0.0)
    rendered = render_status(facts, reading, FailureCounts(), [], 4, now, {"stateEpoch": "e1"})
    status = rendered.status
    assert (status["nodes"], status["readyNodes"], status["observedGeneration"]) == (3, 2, 4)
    assert status["vertices"] == [{"name": "s", "parallelism": 2, "processingRate": 99.9, "lag": 7}]
    assert status["throughput"] == 1234.6 and status["lastScalingSummary"] == "out 2->3"
    assert status["stateEpoch"] == "e1" and now == "1970-01-01T00:00:00Z"
    assert (rendered.facts.ready_nodes, rendered.facts.desired_nodes) == (2, 3)
    assert facts.ready_nodes == 0  # the facts given are not changed


def test_a_reading_that_could_not_count_the_ready_nodes_keeps_the_last_count() -> None:
    rendered = render_status(
        StatusFacts(3, 3, started=True), StatusReading(schedule_nodes=3), FailureCounts(), [], 1, "t"
    )
    assert rendered.status["readyNodes"] == 3


def test_a_suspended_topology_shows_no_node_whatever_was_read() -> None:
    facts = StatusFacts(3, 3, started=True, suspended=True)
    reading = StatusReading(schedule_nodes=3, parallelism={"s": 2}, ready=3)
    rendered = render_status(facts, reading, FailureCounts(), [], 1, "t")
    assert (rendered.status["nodes"], rendered.status["readyNodes"], rendered.status["phase"]) == (0, 0, "Suspended")


def test_a_condition_keeps_its_transition_time_while_its_status_stays() -> None:
    facts = StatusFacts(3, 3, started=True)
    reading = StatusReading(schedule_nodes=3, ready=3)
    first = render_status(facts, reading, FailureCounts(), [], 1, "early")
    later = render_status(facts, reading, FailureCounts(), first.conditions, 1, "late")
    assert {c["lastTransitionTime"] for c in later.conditions} == {"early"}


def test_failures_in_a_row_stall_the_kind_that_failed() -> None:
    facts = StatusFacts(3, 3, started=True, scaling_failed="pods not ready")
    stalled = render_status(facts, StatusReading(schedule_nodes=3, ready=3), FailureCounts(scaling=3), [], 1, "t")
    assert {c["type"]: c["status"] for c in stalled.conditions}["Stalled"] == "True"
    retried = render_status(facts, StatusReading(schedule_nodes=3, ready=3), FailureCounts(upgrade=3), [], 1, "t")
    assert "Stalled" not in {c["type"] for c in retried.conditions}


# ------------------------------------------------------------------------------- scaling decisions, pure


def test_the_spec_degrees_are_migrated_to_only_when_they_changed_and_the_autoscaler_does_not_own_them() -> None:
    assert degrees_to_apply({"s": 2}, {"s": 2}, autoscaled=False) is None
    assert degrees_to_apply({"s": 3}, {"s": 2}, autoscaled=False) == {"s": 3}
    assert degrees_to_apply({"s": 3}, {"s": 2}, autoscaled=True) is None


def test_what_runs_reached_the_spec_by_nodes_and_degrees() -> None:
    world = World(3)
    wanted = wanted_of(world)
    degrees = {v: wanted.vertices[v].parallelism for v in wanted.order}
    assert reached(wanted, 3, degrees)
    assert not reached(wanted, 2, degrees)
    assert not reached(wanted, 3, None)


# ------------------------------------------------------------------------------------ the parts alone


def test_lifecycle_alone_starts_a_topology_and_backs_a_failed_start_off() -> None:
    world = World(3)
    calls = world.starts_fail()
    managed = world.topologies.entry(world.body)
    lifecycle = world.topologies.lifecycle
    delay = lifecycle.start(managed, context_of(world, now=0.0), wanted_of(world))
    assert delay == 5.0 and len(calls) == 1 and managed.controller is None
    assert managed.attempt is not None and managed.attempt.target == StartAttempt()
    assert lifecycle.start(managed, context_of(world, now=1.0), wanted_of(world)) == 4.0  # backing off: no build
    assert len(calls) == 1
    world.rewire(build=world.build)  # starts succeed again: a reconciler built with the working build
    lifecycle = world.topologies.lifecycle
    assert lifecycle.start(managed, context_of(world, now=5.0), wanted_of(world)) is None
    assert managed.controller is not None and managed.attempt is None and managed.facts.started


def test_lifecycle_alone_backs_a_suspend_off_when_its_checkpoint_fails() -> None:
    world = running(3)
    managed = managed_of(world)
    world.checkpoints[-1].failure = "checkpoint timed out"
    delay = world.topologies.lifecycle.suspend(managed, context_of(world))
    assert delay == 5.0 and world.pods == {"node-0", "node-1", "node-2"}
    assert managed.attempt is not None and managed.attempt.target == SuspendAttempt()
    assert managed.facts_to_report().suspend_failures == 1
    world.topologies.lifecycle.not_suspending(managed)  # the suspend is no longer asked for
    assert managed.attempt is None and managed.facts.suspending == ""


def test_upgrades_alone_count_a_failed_checkpoint_as_an_upgrade_failure_not_a_scaling_one() -> None:
    world = running(3)
    managed = managed_of(world)
    world.checkpoints[-1].failure = "checkpoint timed out"
    world.patch_spec(image="elastream-worker:2")
    managed.seen.changed_at = -100.0  # settled
    delay = world.topologies.upgrades.apply_spec(managed, context_of(world))
    assert delay == 5.0
    assert managed.attempt is not None and managed.attempt.target == UpgradeAttempt()
    reported = managed.facts_to_report()
    assert (reported.upgrade_failures, reported.scaling_failures) == (1, 0)
    assert "UpgradeBackoff" in world.reasons()


def test_convergence_alone_settles_then_scales_and_backs_a_failure_off() -> None:
    world = running(3)
    managed = managed_of(world)
    convergence = world.topologies.convergence
    world.patch_spec(nodes=5)
    managed.seen.generation, managed.seen.changed_at = 2, world.clock.monotonic()
    assert convergence.converge(managed, context_of(world)) == 1.0  # settling
    world.migrator.outcome = "raise"
    world.clock.t += 1.0
    delay = convergence.converge(managed, context_of(world))
    assert delay == 5.0 and managed.attempt is not None and managed.attempt.target == ScaleAttempt(5)
    assert managed.facts.scaling_failed and not convergence.converged(managed, context_of(world))
    world.migrator.outcome = "succeeded"
    world.clock.t += 5.0
    assert convergence.converge(managed, context_of(world)) == 2.0
    assert managed.attempt is None and convergence.converged(managed, context_of(world))
    assert len(world.backend.current_schedule().nodes) == 5


def test_the_controller_tick_alone_reports_a_lost_worker_and_its_recovery() -> None:
    world = running(3)
    managed = managed_of(world)
    before = len(world.custom.statuses)
    world.backend.dead = {"node-1": "node-1: worker pod gone"}
    world.topologies.ticks.tick(managed)
    # WorkerLost written before the recovery (which may wait for pods), then the recovery's record
    first = world.custom.statuses[before]
    assert any(c["reason"] == "WorkerLost" for c in first["conditions"])
    assert world.status["lastRecovery"]["outcome"] == "succeeded"
    assert not managed.facts.worker_lost and not managed.facts.recovering  # recovered within the tick


def test_the_status_is_written_by_the_pass_not_by_the_parts() -> None:
    world = World(3)
    world.starts_fail()
    world.reconcile()
    patches = len(world.custom.status_patches)
    managed = managed_of(world)
    world.clock.t += 1.0  # within the backoff: the part does nothing, the pass writes what changed (nothing)
    world.topologies.lifecycle.start(managed, context_of(world), wanted_of(world))
    assert len(world.custom.status_patches) == patches
    managed.write()
    assert len(world.custom.status_patches) == patches  # nothing changed: no patch


def test_a_backend_that_cannot_say_its_schedule_reads_as_no_node() -> None:
    world = running(3)
    managed = managed_of(world)

    def away() -> None:
        raise BackendError("API server away")

    world.backend.current_schedule = away  # type: ignore[method-assign,assignment]
    managed.write()
    assert world.status["nodes"] == 0


def test_the_pass_observes_the_resource_once_and_an_invalid_one_says_why() -> None:
    world = World(3)
    seen = observe(world.body, (), world.topologies.settings)
    assert seen.wanted is not None and seen.generation == 1 and seen.spec["nodes"] == 3 and not seen.invalid
    world.body["spec"]["image"] = "evil/miner:1"
    refused = observe(world.body, ("registry.example.com/",), world.topologies.settings)
    assert refused.wanted is None and "evil/miner:1" in refused.invalid


# ------------------------------------------------------------------------------- decisions, pure


def test_a_refused_change_is_reported_once_per_generation() -> None:
    refused = SpecChange(refused=("spec.vertices[0].name: renaming a vertex loses its state",))
    assert spec_step(refused, UpgradeMemory(), 3, True, 0.0, None) == RefuseChange(report=True)
    assert spec_step(refused, UpgradeMemory(refused_reported=3), 3, True, 0.0, None) == RefuseChange(report=False)


def test_scaling_settings_rebuild_the_controller_once_the_spec_settled_and_nothing_else_waits() -> None:
    rebuild = SpecChange(controller=("strategy",))
    assert spec_step(rebuild, UpgradeMemory(), 2, True, settle_s=0.4, backoff_s=None) == ApplyInPlace(True, 0.4)
    assert spec_step(rebuild, UpgradeMemory(), 2, True, settle_s=-1.0, backoff_s=None) == ApplyInPlace(True)
    # no change that needs anything: nothing waits, not even a settling spec
    assert spec_step(SpecChange(), UpgradeMemory(), 2, False, settle_s=0.4, backoff_s=9.0) == ApplyInPlace(False)


def test_an_upgrade_waits_for_redis_the_settling_spec_and_its_backoff_in_that_order() -> None:
    image = SpecChange(restart=("spec.image",))
    memory = UpgradeMemory()
    assert spec_step(image, UpgradeMemory(rolled_back_generation=4), 4, True, -1.0, None) == KeepRolledBack()
    assert spec_step(image, memory, 4, redis_ok=False, settle_s=0.5, backoff_s=3.0) == WaitToUpgrade(None)
    assert spec_step(image, memory, 4, redis_ok=True, settle_s=0.5, backoff_s=3.0) == WaitToUpgrade(0.5)
    assert spec_step(image, memory, 4, redis_ok=True, settle_s=0.0, backoff_s=3.0) == WaitToUpgrade(3.0)
    assert spec_step(image, memory, 4, redis_ok=True, settle_s=0.0, backoff_s=None) == StartUpgrade()
    # a rolled-back generation is not tried again; a newer one is
    assert spec_step(image, UpgradeMemory(rolled_back_generation=4), 5, True, 0.0, None) == StartUpgrade()


def test_a_failed_start_is_reported_by_what_failed() -> None:
    quota = start_failure(BackendError("exceeded quota: pods"), StartAttempt(), 5.0)
    assert (quota.fact, quota.reason) == ("backend_error", "StartFailed")
    assert quota.message == "starting: exceeded quota: pods; retrying in 5 s"
    away = start_failure(redis.ConnectionError("refused"), ResumeAttempt(), 10.0)
    assert (away.fact, away.detail) == ("redis_unavailable", "ConnectionError: refused")
    assert away.message == "resuming: refused; retrying in 10 s"
    owned = start_failure(NotOwned("configmap t is not ours"), StartAttempt(), 5.0)
    assert (owned.fact, owned.reason, owned.message) == ("not_owned", "ObjectNotOwned", "configmap t is not ours")
    acl = start_failure(AclRefused("no +acl"), StartAttempt(), 5.0)
    assert (acl.fact, acl.reason) == ("redis_user_refused", "RedisUserRefused")


def test_a_suspend_announces_itself_once_backs_off_and_keeps_what_it_stopped() -> None:
    assert suspend_step(suspended=True, backoff_s=4.0, suspending="") == KeepSuspended()
    assert suspend_step(suspended=False, backoff_s=4.0, suspending="taking...") == WaitToSuspend(4.0)
    assert suspend_step(suspended=False, backoff_s=None, suspending="") == TakeLastCheckpoint(announce=True)
    assert suspend_step(suspended=False, backoff_s=None, suspending="retrying") == TakeLastCheckpoint(announce=False)
    assert suspend_outcome(done=True, state_lost="") is SuspendOutcome.SUSPENDED
    assert suspend_outcome(done=False, state_lost="epoch gone") is SuspendOutcome.RUN_ON_LOST_STATE
    assert suspend_outcome(done=False, state_lost="") is SuspendOutcome.BACK_OFF


# ------------------------------------------------------------------------- settings, pass context


def test_the_loops_settings_come_from_the_operators_options_and_reach_every_part() -> None:
    options = OperatorOptions(redis_url="redis://unused", interval_s=0.5, worker_start_timeout_s=90.0)
    loop = LoopSettings.of_options(options)
    assert (loop.interval_s, loop.start_timeout_s, loop.pacing) == (0.5, 90.0, Pacing())
    world = World(3)
    world.rewire(loop=LoopSettings(pacing=Pacing(tick_s=7.0), start_timeout_s=90.0))
    reconciler = world.topologies
    assert reconciler.lifecycle.pacing is reconciler.loop.pacing is reconciler.convergence.pacing
    assert reconciler.controllers.loop.start_timeout_s == 90.0
    world.reconcile()  # the start
    assert world.reconcile() == 7.0  # an idle topology's next pass: the pacing's tick


def test_the_pass_context_reads_what_runs_from_the_controller_without_asking_again() -> None:
    world = running(3)
    context = context_of(world)
    assert context.schedule is not None and len(context.running_schedule().nodes) == 3
    assert (context.store_error, context.state_lost) == ("", "")
    before = PassContext(context.seen, context.now)
    assert before.schedule is None
    with pytest.raises(BackendError):
        before.running_schedule()  # a pass that has not read what runs cannot compare with it
