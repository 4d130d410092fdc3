"""One controller per topology, whatever runs its workers: the whole life of a running topology.

`TopologyController` starts the topology (finishing a migration an earlier controller left, then the
periodic checkpoints and the metric archive), carries out scale requests (analysis -> plan with the spec's
strategy -> migration with the spec's protocol -> a record shaped like `status.lastScaling` -> catch-up and
stabilization measured on later ticks), and on every `tick` checks the workers (a dead one outside a
migration rolls the topology back to the last checkpoint), takes a pending request and refreshes the live
rates. `close` stops what it started, in reverse order, also after a failure.

`suspend` takes one last complete checkpoint (the periodic aligned-barrier round, exactly-once sinks' output
committed with it) and only then stops the periodic work and the workers; `resume` starts them again from
that checkpoint by the same restore that rolls a topology back when its workers died (`migrator.recover`:
the `restart` protocol in place, every executor initialised from the checkpoint, the sources replaying
from its positions). `start_suspended` is a suspended topology's start (a new controller, e.g. after an
operator restart): it starts no worker, or adopts the ones still running so they can be suspended.

Everything it touches is a port (`core.ports`): the backend (local processes, Kubernetes pods), the metric
source (Spark analysis), the migrator (`control.migration`), where requests come from and where status goes
(Redis keys in local mode, the custom resource on Kubernetes), the event sink and the clock. So the same code
serves `elastream run`, `elastream demo` and the operator, and its unit tests use in-memory fakes.
`local_controller` wires it for local mode.

Its parts with their own state change nothing of it: the drains (`control.controller_drains.DrainRunner`)
and the autoscaler's evaluation (`control.autoscaler.Autoscaler`) return outcomes, which it applies. Every
schedule change (a start, a restore, a recovery, a scaling, a drain, a refill) is settled in one place,
`_settle`, by the one rule of `control.changes`: the analysis skips the samples of the switch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from elastream.control.autoscaler import Autoscaler, Evaluation
from elastream.control.catch_up import CATCH_UP_FIELDS, CatchUpFollowUp
from elastream.control.changes import Said, settles_at
from elastream.control.checkpoint_driver import Checkpoints
from elastream.control.connectors import LAG_READ_S, ConnectorWatch, LagSource, partition_lag
from elastream.control.controller_drains import DrainOutcome, DrainRunner
from elastream.control.metrics import SkippedSamples
from elastream.control.monitor import LiveRates, SampleFollower
from elastream.control.retrying import backoff_delay
from elastream.control.scaling import PrintEvents, ScalingRecord, planned_message
from elastream.core.autoscaling.decision import AutoscalerState, Recommendation
from elastream.core.keygroup_batches import Load, vertex_loads
from elastream.core.metrics import MetricSnapshot
from elastream.core.migration_protocol import MigrationReport
from elastream.core.outcomes import Direction, Outcome
from elastream.core.planner import Plan, PlanningError, plan_request
from elastream.core.ports import (
    Backend,
    BackendError,
    Background,
    Clock,
    DrainRequests,
    EventSink,
    MetricSource,
    Migrator,
    SampleFeed,
    ScaleRequests,
    StateEpochs,
    StateLost,
    StatusSink,
    SystemClock,
)
from elastream.core.rate_timeline import reference_phrase
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.status import REDIS_BUSY, REDIS_OUT_OF_MEMORY, EventReason, redis_reason
from elastream.core.topology import Topology, split_executor_id

log = logging.getLogger("elastream.control")

#: an OOM noted by `note_store` lasts at least this long after the last call that met it (seconds)
OOM_HOLD_S = 60.0


@dataclass(frozen=True)
class SuspendResult:
    """What one attempt to suspend did: `done` (the workers are stopped) with the checkpoint the topology
    resumes from (None: it never completed one, it resumes from the sources' beginning), or why not."""

    done: bool
    checkpoint_id: str | None = None
    reason: str = ""


@dataclass
class TopologyController:
    topology: Topology
    backend: Backend
    metrics: MetricSource
    migrator: Migrator
    feed: SampleFeed
    requests: ScaleRequests
    status: StatusSink
    events: EventSink = field(default_factory=PrintEvents)
    clock: Clock = field(default_factory=SystemClock)
    #: periodic work started with the topology and stopped before its workers (checkpoints)
    background: Sequence[Background] = ()
    #: the metric archive: stopped after the workers, so its last pass archives their last samples
    archiver: Background | None = None
    interval_s: float = 1.0
    #: how long after a scaling its catch-up and stabilization are measured (`control.catch_up`)
    catch_up_timeout_s: float = 60.0
    last_scaling: ScalingRecord | None = None
    last_recovery: dict[str, Any] | None = None
    #: what the autoscaler remembers (last change, whether it settled, votes, capacity history)
    autoscaler: AutoscalerState = field(default_factory=AutoscalerState)
    last_evaluation: Recommendation | None = None
    #: seconds between autoscaler evaluations (None: two metric intervals)
    evaluation_period_s: float | None = None
    #: told the new node count after an automatic change (the operator writes it to spec.nodes)
    on_nodes_changed: Callable[[int], None] | None = None
    #: the state epoch in the state store (None: not checked, as in unit tests without one)
    epochs: StateEpochs | None = None
    #: the epoch this topology's state must have (kept outside Redis: the resource's status); None: new
    expected_epoch: str | None = None
    #: takes a checkpoint on demand (a suspend's last one); None: suspending keeps the latest periodic one
    checkpoints: Checkpoints | None = None
    #: workers told to stop asking for a graceful drain (`control.controller_drains`); None: no drains
    drains: DrainRequests | None = None
    last_drain: dict[str, Any] | None = None
    #: the node count before the drains in progress (their refill brings it back), None when none is
    drain_target: int | None = None
    #: where the kafka sources' partition lags are read (the checkpoint store); None: not shown in the status
    lags: LagSource | None = None

    #: recovery retries back off from this many seconds, doubling, up to `recovery_backoff_cap_s`
    recovery_backoff_s: float = 2.0
    recovery_backoff_cap_s: float = 60.0

    def __post_init__(self) -> None:
        self.live = LiveRates(self.topology, stale_s=3 * self.interval_s)
        self.follow_up = CatchUpFollowUp(
            self.feed, self.topology, bucket_s=self.interval_s, timeout_s=self.catch_up_timeout_s, now=self.clock.now
        )
        self._since: float | None = None
        #: the tick's read of the metric stream, by entry id; what it skips is counted and told (rate-limited)
        self.follower = SampleFollower(SkippedSamples(self.topology, self.events, self.clock), 3 * self.interval_s)
        #: what the connectors report they cannot do (the ConnectorError condition), and its events
        self.connectors = ConnectorWatch(self.events, self.clock)
        #: per kafka source vertex: partition -> messages not read yet (`_read_partition_lag`)
        self.partition_lag: dict[str, dict[int, int]] = {}
        self.lag_read_at = float("-inf")
        self._started: list[Background] = []
        #: the autoscaler's evaluation once per period (`control.autoscaler`); it remembers when it last ran
        self.evaluator = Autoscaler(self.backend, self.clock, self.interval_s, self.evaluation_period_s)
        #: carries out the drain requests (`control.controller_drains`); None without drains
        self.drainer = (
            DrainRunner(self.drains, self.backend, self.migrator, self.clock) if self.drains is not None else None
        )
        #: why Redis cannot be used now ("" when it can), and since when
        self.store_error = ""
        self.store_down_since: float | None = None
        #: when a call last met Redis' OOM reply (`note_store`)
        self.store_oom_at = float("-inf")
        #: failed recoveries in a row, and when the next may start
        self.recovery_failures = 0
        self.recovery_due = 0.0
        #: the epoch of the state this controller runs on, and why it is lost ("" while it is not)
        self.epoch: str | None = self.expected_epoch
        self.state_lost = ""
        #: the workers are stopped by `suspend` (or were never started by `start_suspended`)
        self.suspended = False
        #: the checkpoint a suspended topology resumes from (None: from the sources' beginning)
        self.resume_point: str | None = None

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self, schedule: Schedule | None = None) -> None:
        """Run the topology: a migration an earlier controller left past COMMIT is finished (its target
        schedule starts and is initialised from the state in Redis), one before COMMIT is aborted; then the
        periodic work starts. Adopting a running `schedule` (an operator restart) none of whose workers is
        left restores the latest checkpoint, as a recovery would: started empty, its sources would begin
        again and exactly-once sinks would see their events twice."""
        self._check_epoch(starting=True)
        if self.archiver is not None:
            self.archiver.start()
        target = self.migrator.interrupted_target()
        if target is None and schedule is not None and self._every_worker_gone_since_a_checkpoint():
            self.backend.assume(schedule)
            report = self._restore("every worker was gone when the controller started")
            if report is not None:
                self.events.emit(
                    EventReason.RECOVERED,
                    f"every worker was gone when the controller started: rolled back to checkpoint "
                    f"{report.restored_from}, {report.replayed} events replayed",
                )
            return
        self.backend.start(target or schedule or initial_schedule(self.topology))
        self._settle()
        self._since = self.clock.now()
        self._resume()
        for task in self.background:
            task.start()
            self._started.append(task)

    # ------------------------------------------------------------------------------------ suspend and resume

    def start_suspended(self, schedule: Schedule | None = None) -> bool:
        """Take over a topology whose spec says suspended without starting a worker: the schedule it ran (or
        will run) is assumed, its latest checkpoint is the resume point. Workers of it that still run (an
        operator restarted in the middle of a suspend) are adopted instead, so `suspend` can checkpoint
        and stop them: returns False then, True when it is suspended. Raises `StateLost` as `start` does."""
        self._check_epoch(starting=True)
        target = self.migrator.interrupted_target() or schedule or initial_schedule(self.topology)
        if self.backend.running_nodes():
            self.start(target)
            return False
        self.backend.assume(target)
        self.resume_point = self.checkpoints.latest() if self.checkpoints is not None else None
        self.suspended = True
        return True

    def suspend(self, announce: bool = True) -> SuspendResult:
        """Take the last checkpoint, then stop the periodic work and every worker; the state stays in Redis.
        Idempotent. A checkpoint that cannot be taken (a worker not answering, Redis away, a migration
        holding the topology) stops nothing: the result says why and the caller retries. With workers
        already dead no checkpoint can complete: the latest one is the resume point (what came after it is
        replayed from it on resume, as a recovery would), and the rest are stopped. `announce=False`: no
        Suspended event (an upgrade says what it does itself)."""
        if self.suspended:
            return SuspendResult(True, self.resume_point)
        try:
            if not self._check_epoch():
                return SuspendResult(False, reason=self.state_lost)
            if self.migrator.unfinished() is not None:
                self._resume()  # a migration nobody drives: finished or rolled back before the checkpoint
            if self.backend.failed_nodes():
                checkpoint = self.checkpoints.latest() if self.checkpoints is not None else None
            elif self.checkpoints is not None:
                result = self.checkpoints.take()
                if result.outcome != "completed":
                    return SuspendResult(False, reason=f"the last checkpoint was not taken: {result.reason}")
                checkpoint = result.checkpoint_id
            else:
                checkpoint = None
        except redis.RedisError as exc:
            self.note_store(f"{type(exc).__name__}: {exc}")
            return SuspendResult(False, reason=f"Redis: {exc}")
        except BackendError as exc:
            return SuspendResult(False, reason=str(exc))
        # nothing may take a checkpoint or move an executor between the last checkpoint and the stop
        while self._started:
            _stop_quietly(self._started.pop())
        self.backend.stop_workers()
        self.suspended, self.resume_point = True, checkpoint
        if not announce:
            return SuspendResult(True, checkpoint)
        self.events.emit(
            EventReason.SUSPENDED,
            "workers stopped, state kept; "
            + (
                f"resumes from checkpoint {checkpoint}"
                if checkpoint
                else "no checkpoint was ever completed: resumes from the sources' beginning"
            ),
        )
        return SuspendResult(True, checkpoint)

    def check_state(self) -> bool:
        """Whether Redis still holds this topology's state (its epoch), for a suspended topology's passes: a
        Redis emptied while suspended is StateLost then, not only at the resume. Redis away: nothing that
        runs needs it now, so that is not an error here (the resume notes it)."""
        try:
            return self._check_epoch()
        except redis.RedisError:
            return True

    def resume(self) -> MigrationReport | None:
        """Start the workers of a suspended topology from its latest checkpoint, by the restore a recovery
        uses (`migrator.recover`: every executor initialised from the checkpoint's state, sources replaying
        from its positions, exactly-once sinks' output staged after it discarded). Without any checkpoint
        the topology never completed one (its epoch, checked first, proves Redis still holds its state), so
        it starts from the sources' beginning. Returns the restore's report (None without a checkpoint);
        raises `StateLost`, `BackendError` or `redis.RedisError` (nothing changes: the caller retries)."""
        if not self.suspended:
            return None
        report = self.restart_from_checkpoint("resuming after a suspend")
        self.events.emit(
            EventReason.RESUMED,
            f"resumed from checkpoint {report.restored_from}: {report.replayed} events replayed"
            if report is not None
            else "resumed from the sources' beginning (no checkpoint was ever completed)",
        )
        return report

    def restart_from_checkpoint(self, why: str) -> MigrationReport | None:
        """`resume` without its event: the workers of a topology taken over stopped (`start_suspended`) start
        from its latest checkpoint, `why` in the restore's record (an upgrade's new pods, a rollback's old
        ones). Raises as `resume` does."""
        self._check_epoch(starting=True)
        report = self._restore(why)
        self.suspended, self.resume_point = False, None
        return report

    def _every_worker_gone_since_a_checkpoint(self) -> bool:
        return (
            self.checkpoints is not None and not self.backend.running_nodes() and self.checkpoints.latest() is not None
        )

    def _restore(self, why: str) -> MigrationReport | None:
        """Start every worker of the assumed schedule from the latest checkpoint by the recovery's restore
        (`migrator.recover`), or from the sources' beginning when there is none; then the periodic work.
        Workers that already run it (an earlier attempt's restore, finished by `_resume`) are left alone."""
        report: MigrationReport | None = None
        if self.migrator.unfinished() is not None:
            self._resume()  # an earlier attempt's restore left (Redis went away): finished from its record
        schedule = self.backend.current_schedule()
        if not (set(schedule.nodes) <= self.backend.running_nodes() and not self.backend.failed_nodes()):
            latest = self.checkpoints.latest() if self.checkpoints is not None else None
            if latest is None:
                if self.checkpoints is not None:
                    # staged before and never committed: replayed from the beginning now, so the first
                    # checkpoint must not commit it as a leftover of an abandoned round
                    self.checkpoints.discard_uncommitted()
                self.backend.start(schedule)
            else:
                report = self.migrator.recover({node: why for node in schedule.nodes})
                if report is None or report.outcome != Outcome.SUCCEEDED:
                    raise BackendError(
                        f"the restore from checkpoint {latest} failed: {report.reason if report else 'no report'}"
                    )
        self._settle()
        self._since = self.clock.now()
        for task in self.background:
            task.start()
            self._started.append(task)
        return report

    def _check_epoch(self, starting: bool = False) -> bool:
        """Whether the state store still holds this topology's state (its epoch). Starting without an expected
        epoch makes one (a new topology) or adopts the one found; starting with one that is not there raises
        `StateLost`. Later, a missing epoch marks the topology `state_lost` (one StateLost event) and stops
        everything that would restart from the store."""
        if self.epochs is None:
            return True
        found = self.epochs.read()
        if starting and self.epoch is None:
            self.epoch = found or self.epochs.create()
            return True
        if found == self.epoch:
            if self.state_lost:
                self.events.emit(EventReason.STATE_RESTORED, f"the state store holds epoch {self.epoch} again")
            self.state_lost = ""
            return True
        reason = (
            f"the state store has no state for this topology (epoch {self.epoch} not found"
            + (f", {found} instead" if found else "")
            + "): it was emptied, replaced or is the wrong one; nothing restarts from it. Restore it, or "
            "annotate the topology elastream.dev/restart-from-scratch=true to start over from the sources' "
            "beginning"
        )
        if not self.state_lost:
            self.events.emit(EventReason.STATE_LOST, reason, warning=True)
        self.state_lost = reason
        if starting:
            raise StateLost(reason)
        return False

    def _resume(self) -> None:
        """Finish or abort a migration (or abandon a checkpoint) that no live controller drives: left by an
        earlier controller, or by this one when Redis went away in the middle of it."""
        report = self.migrator.resume()
        if report is not None:
            self.events.emit(
                EventReason.MIGRATION_RESUMED if report.outcome == Outcome.SUCCEEDED else EventReason.MIGRATION_FAILED,
                f"migration {report.migration_id} left unfinished: {report.outcome}"
                + (f" ({report.reason})" if report.reason else ""),
                warning=report.outcome != Outcome.SUCCEEDED,
            )

    def close(self, stop_workers: bool = True) -> None:
        """Stop the periodic work (newest first), then the workers (unless told not to), then the archive's
        last pass. Safe to call after a failed start."""
        while self._started:
            _stop_quietly(self._started.pop())
        try:
            if stop_workers:
                self.backend.stop_workers()
        finally:
            if self.archiver is not None:
                _stop_quietly(self.archiver)

    def __enter__(self) -> TopologyController:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ tick

    def tick(self) -> ScalingRecord | None:
        """Once per interval: finish a migration nobody drives, drain a node whose worker asked to be drained
        (`control.controller_drains`), recover from dead workers (backing off after a
        failed attempt), carry out a pending scale request (returned), take a checkpoint when one is due,
        refresh the live rates and the recovery measurements. Redis away is not an error here: it is noted
        (`store_error`, a RedisUnavailable event) and the next tick tries again."""
        try:
            samples = self.follower.read(self.feed, self._since)  # the tick's first read: also tells if Redis is up
            self.note_store("")
            record = self._tick()
        except redis.RedisError as exc:
            self.note_store(f"{type(exc).__name__}: {exc}")
            return None
        if samples:
            self.live.add(samples)
            self.connectors.note(self.live.connector_problems())
        self._read_partition_lag()
        return record

    def _read_partition_lag(self) -> None:
        """The kafka sources' lag per partition, read every `LAG_READ_S` (for the status); kept as it was while
        Redis is away."""
        kafka = [v for v in self.topology.sources if self.topology.vertices[v].config.get("type") == "kafka"]
        now = self.clock.now()
        if not kafka or self.lags is None or now < self.lag_read_at:
            return
        self.lag_read_at = now + LAG_READ_S
        try:
            executors = [e for e, _ in self.backend.current_schedule() if split_executor_id(e)[0] in kafka]
            self.partition_lag = partition_lag(self.lags, executors)
        except (redis.RedisError, BackendError) as exc:
            log.debug("%s: partition lag not read: %s", self.topology.name, exc)

    def _tick(self) -> ScalingRecord | None:
        if self.suspended:
            return None  # no worker runs: nothing to recover, scale or checkpoint until `resume`
        if not self._check_epoch():
            return None  # no recovery, scaling or checkpoint may write over (or restart from) an empty store
        if self.migrator.unfinished() is not None:
            self._resume()
        # before the recovery: a drained worker that exits is out of the schedule, not lost
        self._take_drain()
        failed = self.backend.failed_nodes()
        if failed and self.clock.now() >= self.recovery_due:
            self.recover(failed)
        record = None
        request = self.requests.take()
        if request is not None:
            record = self.scale_to(request.nodes, request.parallelism)
        elif self.topology.scaling.auto.enabled and not failed:
            record = self.autoscale()
        for task in self._started:
            task.tick()
        self.follow_up.tick()
        self.status.flush()
        return record

    def note_store(self, error: str) -> None:
        """Redis went away (`error` says how) or is back (""): one event each way, `store_error` meanwhile. A
        server that is held rather than away is said as what it is, with its own reason (`redis_reason`): BUSY
        (RedisBusy: a script holds it) or OOM (RedisOutOfMemory: writes refused); a change of reason is a new
        event. An OOM refuses writes only, so a read that succeeds does not end it: it stays noted until no call
        met it for `OOM_HOLD_S` (or two checkpoint intervals, when longer)."""
        now = self.clock.now()
        reason = redis_reason(error) if error else ""
        if reason == REDIS_OUT_OF_MEMORY:
            self.store_oom_at = now
        elif not error and redis_reason(self.store_error) == REDIS_OUT_OF_MEMORY:
            hold = max(OOM_HOLD_S, 2.0 * self.topology.scaling.checkpoint_interval_s)
            if now - self.store_oom_at < hold:
                return
        if error and (not self.store_error or reason != redis_reason(self.store_error)):
            if not self.store_error:
                self.store_down_since = now
            said = {
                REDIS_BUSY: f"Redis answers BUSY: a script holds the server ({error}); retrying",
                REDIS_OUT_OF_MEMORY: f"Redis is out of memory: writes are refused ({error}); retrying",
            }.get(reason, f"Redis cannot be reached: {error}; retrying")
            self.events.emit(reason, said, warning=True)
        elif not error and self.store_error:
            down = now - (self.store_down_since or now)
            self.store_down_since = None
            self.events.emit(EventReason.REDIS_AVAILABLE, f"Redis reachable again after {down:.0f} s")
        self.store_error = error

    def recover(self, failed: dict[str, str]) -> dict[str, Any]:
        """Workers died outside a migration: roll back to the last checkpoint (or restart them empty) and
        record what was replayed as `lastRecovery`. A failed attempt is retried after a backoff (doubling up
        to `recovery_backoff_cap_s`), announced in an event, so a quota or a missing image does not make
        the controller create pods in a tight loop."""
        started = self.clock.now()
        self.events.emit(EventReason.WORKER_LOST, "; ".join(failed.values()), warning=True)
        try:
            report = self.migrator.recover(failed)
        except BackendError as exc:
            status = {"nodes": sorted(failed), "outcome": Outcome.FAILED, "reason": str(exc), "startedAt": started}
            self.events.emit(EventReason.RECOVERY_FAILED, str(exc), warning=True)
            self._recovery_failed()
        else:
            status = {"nodes": sorted(failed), "startedAt": started, "finishedAt": self.clock.now()}
            if report is None:
                status.update(outcome=Outcome.RESTARTED, reason="no checkpoint yet: the dead workers restarted empty")
            else:
                status.update(report.to_status())
                self.events.emit(
                    EventReason.RECOVERED if report.outcome == Outcome.SUCCEEDED else EventReason.RECOVERY_FAILED,
                    f"rolled back to checkpoint {report.restored_from}: {report.replayed} events replayed"
                    if report.outcome == Outcome.SUCCEEDED
                    else report.reason,
                    warning=report.outcome != Outcome.SUCCEEDED,
                )
            if report is not None and report.outcome != Outcome.SUCCEEDED:
                self._recovery_failed()
            else:
                self.recovery_failures, self.recovery_due = 0, 0.0
        self._settle()
        self.last_recovery = status
        self.status.publish("lastRecovery", status)
        return status

    def _recovery_failed(self) -> None:
        self.recovery_failures += 1
        delay = backoff_delay(self.recovery_failures, self.recovery_backoff_s, self.recovery_backoff_cap_s)
        self.recovery_due = self.clock.now() + delay
        self.events.emit(
            EventReason.RECOVERY_BACKOFF,
            f"recovery attempt {self.recovery_failures} failed; the next in {delay:.0f} s",
            warning=True,
        )

    # -------------------------------------------------------------------------------------------- scaling

    def plan(
        self, nodes: int, parallelism: Mapping[str, int] | None = None, snapshot: MetricSnapshot | None = None
    ) -> tuple[Plan, float]:
        """Analyse the current window (unless `snapshot` is that analysis already) and plan a move to `nodes`
        with the spec's strategy (or to the vertex degrees in `parallelism`); also returns the sinks'
        throughput in that window."""
        if snapshot is None:
            snapshot = self.metrics.snapshot(self.topology.scaling.window)
        return plan_request(self.topology, self.backend.current_schedule(), snapshot, nodes, parallelism)

    def scale_to(
        self,
        nodes: int,
        parallelism: Mapping[str, int] | None = None,
        trigger: str = "request",
        snapshot: MetricSnapshot | None = None,
    ) -> ScalingRecord:
        """Analyse, plan, migrate; the record is published as `lastScaling` and, once measured, again with
        catch-up and stabilization. `parallelism`: vertex degrees to move to (the autoscaler's, the spec's);
        `trigger` says who asked (request | autoscaler | spec); `snapshot`: the window already analysed."""
        record = self._scale(nodes, parallelism, snapshot)
        record.trigger = trigger
        status = record.to_status()
        status["requestedNodes"] = nodes
        if parallelism is not None:
            status["requestedParallelism"] = dict(parallelism)
        if record.outcome == Outcome.SUCCEEDED:
            self.autoscaler = self.autoscaler.changed(self.clock.now(), record.direction)
            self.follow_up.follow(status, record.started_at, self._caught_up, resumed_at=record.finished_at)
        self.last_scaling = record
        self.status.publish("lastScaling", status)
        return record

    def _caught_up(self, status: dict[str, Any]) -> None:
        self.autoscaler = self.autoscaler.settled(self.clock.now())
        catch_up, stable = status.get("catchUpMs"), status.get("stabilizationMs")
        against = reference_phrase(
            status.get("catchUpReference"), status.get("outputBefore"), status.get("outputAfter")
        )
        self.events.emit(
            EventReason.CATCH_UP_MEASURED,
            f"catch-up {_seconds(catch_up)}, stabilization {_seconds(stable)} after the scaling ({status['catchUp']}), "
            f"measured against {against}",
        )
        if self.last_scaling is not None:
            self.last_scaling.report.update({k: status.get(k) for k in CATCH_UP_FIELDS})
        self.status.publish("lastScaling", status)

    def load(self, snapshot: MetricSnapshot) -> Load:
        """Each vertex's state (the last checkpoint's) and input rate (the analysed window's): what a key-group
        migration sizes its batches from."""
        rates = {
            v: m.input_rate if m.input_rate is not None else m.processing_rate for v, m in snapshot.vertices.items()
        }
        state = self.checkpoints.state_by_vertex() if self.checkpoints is not None else {}
        return vertex_loads(state, rates)

    def _scale(
        self, nodes: int, parallelism: Mapping[str, int] | None, snapshot: MetricSnapshot | None
    ) -> ScalingRecord:
        started = self.clock.now()
        current = len(self.backend.current_schedule().nodes)
        scaling = self.topology.scaling
        record = ScalingRecord(Direction.NONE, current, nodes, scaling.strategy, scaling.migration, None, 0.0, started)
        try:
            if snapshot is None:
                snapshot = self.metrics.snapshot(self.topology.scaling.window)
            plan, before = self.plan(nodes, parallelism, snapshot)
        except redis.RedisError as exc:
            record.outcome, record.reason, record.finished_at = Outcome.FAILED, f"Redis: {exc}", self.clock.now()
            self.note_store(f"{type(exc).__name__}: {exc}")
            return record
        except PlanningError as exc:
            record.outcome, record.reason, record.finished_at = Outcome.FAILED, str(exc), self.clock.now()
            self.events.emit(EventReason.SCALING_REJECTED, str(exc), warning=True)
            return record
        record.analysis_engine = self.metrics.engine
        record.direction = plan.direction
        record.predicted_throughput = plan.predicted_throughput
        record.throughput_before = before
        record.plan = plan.to_dict()
        if plan.direction == "none":
            record.outcome, record.finished_at = Outcome.UNCHANGED, self.clock.now()
            return record
        self.events.emit(EventReason.SCALING_PLANNED, planned_message(plan, before))
        try:
            report = self.migrator.migrate(plan.new_schedule, self.load(snapshot))
        except redis.RedisError as exc:
            record.outcome, record.reason, record.finished_at = Outcome.FAILED, f"Redis: {exc}", self.clock.now()
            self.note_store(f"{type(exc).__name__}: {exc}")
            self.events.emit(EventReason.SCALING_FAILED, record.reason, warning=True)
            return record
        except BackendError as exc:
            record.outcome, record.reason, record.finished_at = Outcome.FAILED, str(exc), self.clock.now()
            self.events.emit(EventReason.SCALING_FAILED, str(exc), warning=True)
            return record
        record.report = dict(report.to_status())
        record.finished_at = self.clock.now()
        if report.outcome != Outcome.SUCCEEDED:
            record.outcome, record.reason = Outcome.FAILED, report.reason or f"migration {report.outcome}"
            self.events.emit(EventReason.SCALING_FAILED, record.reason, warning=True)
            return record
        record.outcome = Outcome.SUCCEEDED
        self._settle(plan.to_nodes)
        pause = report.pause_ms
        self.events.emit(
            EventReason.SCALED,
            f"running on {plan.to_nodes} nodes ({record.finished_at - started:.1f} s"
            + (f", sources paused {pause:.0f} ms" if pause is not None else "")
            + ")",
        )
        return record

    # ------------------------------------------------------------------------------------------- autoscaling

    def autoscale(self) -> ScalingRecord | None:
        """Once per evaluation period: the autoscaler's evaluation (`control.autoscaler`), published as
        `autoscaler`, and the scaling it decides when it decides one (returned; unless `execute: false`,
        which only recommends)."""
        evaluation = self.evaluator.evaluate(self.topology, self.metrics, self.autoscaler)
        return None if evaluation is None else self._apply_evaluation(evaluation)

    @property
    def evaluated_at(self) -> float | None:
        """When the autoscaler last evaluated (None: never)."""
        return self.evaluator.evaluated_at

    def _apply_evaluation(self, evaluation: Evaluation) -> ScalingRecord | None:
        self.autoscaler = evaluation.state
        self.last_evaluation = evaluation.recommendation
        self.status.publish("autoscaler", evaluation.status)
        self._say(evaluation.said)
        order = evaluation.scale
        if order is None:
            return None
        record = self.scale_to(order.nodes, order.parallelism, "autoscaler", order.snapshot)
        if (
            record.outcome == Outcome.SUCCEEDED
            and self.on_nodes_changed is not None
            and record.to_nodes != record.from_nodes
        ):
            self.on_nodes_changed(record.to_nodes)
        return record

    # ------------------------------------------------------------------------------------------------ drains

    def _take_drain(self) -> None:
        """The oldest pending drain request, and the refill after it when one is due (`control.controller_drains`)."""
        if self.drainer is None:
            return
        outcome = self.drainer.take(self.drain_target)
        if outcome is None:
            return
        self._apply_drain(outcome)
        if outcome.refill_to is not None:
            self._apply_drain(self.drainer.refill(outcome))

    def _apply_drain(self, outcome: DrainOutcome) -> None:
        if outcome.store_error:
            self.note_store(outcome.store_error)
        if outcome.running is not None:
            self._settle(len(outcome.running.nodes))
        self.drain_target = outcome.target
        self._say(outcome.said)
        if outcome.record is not None:
            self.last_drain = outcome.record
            self.status.publish("lastDrain", dict(outcome.record))

    # ------------------------------------------------------------------------------------- applying changes

    def _settle(self, nodes: int | None = None) -> None:
        """The topology runs a new schedule from now (on `nodes` nodes, when given): the one place a schedule
        change is applied to the analysis, which skips the samples of the switch (`control.changes`)."""
        if nodes is not None and nodes != self.topology.nodes:
            self.topology = self.topology.with_nodes(nodes)
        self.metrics.not_before = settles_at(self.clock.now(), self.interval_s)

    def _say(self, said: Sequence[Said]) -> None:
        for event in said:
            self.events.emit(event.reason, event.message, warning=event.warning)


def _stop_quietly(task: Background) -> None:
    try:
        task.stop()
    except Exception as exc:  # one task failing to stop must not keep the others (or the workers) running
        log.warning("stopping %s: %s", type(task).__name__, exc)


def _seconds(ms: Any) -> str:
    return "-" if ms is None else f"{float(ms) / 1000.0:.1f} s"
