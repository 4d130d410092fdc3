"""The fault matrix: Redis stopped (and restarted with its data) in every phase of a topology's life, a worker
killed, an executor crashed (the runtime's test-only hook), on real worker processes, a real Redis and the
real controller of local mode.

One test per outage length walks every phase in one run (one process start, not one per phase): start,
steady state, prepare, PREPARE -> COMMIT (capture), after COMMIT, INIT, a periodic checkpoint and a recovery.
After each the controller must still be alive and say what happened (its last record or its events); at the
end every event must have arrived exactly once at the `exactly-once` sinks and every keyed count must be
exact (the audit sinks see 1..n for every key).

The minute-long walk leaves out prepare and INIT: a long outage there goes through the same bounded waits
(`NodeBackend._wait_for`, the migration's `redis_step`) as in capture and after COMMIT, the 5 s walk covers
both phases, and two more minutes of outage would push a fresh machine's CI run towards its bound.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from test_migration import check_exactly_once, load

from elastream.analysis import Analyzer
from elastream.control.backends.local import LocalCluster
from elastream.control.controller import TopologyController
from elastream.control.local_mode import local_controller
from elastream.core.migration_protocol import Action, ActionKind, MigrationCoordinator
from elastream.crd import load_manifest
from elastream.runtime.executor import TEST_CRASH_ENV
from support.harness import exactly_once, wait_for_sinks_idle, with_audit, write_manifest
from support.harness import ticking as ticking_in_background
from support.redis_servers import RedisServer

pytestmark = pytest.mark.integration


class Outage:
    """Redis stopped now and started again (same port, same append-only data) `seconds` later."""

    def __init__(self, server: RedisServer, seconds: float) -> None:
        self.server, self.seconds = server, seconds
        self.thread: threading.Thread | None = None
        self.count = 0
        #: `begin_once` starts an outage only while armed (a hook may be called again after the outage)
        self.armed = False

    def arm(self) -> None:
        self.armed = True

    def begin_once(self) -> None:
        if self.armed:
            self.begin()

    def begin(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        self.count += 1
        self.armed = False
        self.server.stop()
        self.thread = threading.Thread(target=self._back, daemon=True)
        self.thread.start()

    def _back(self) -> None:
        time.sleep(self.seconds)
        self.server.start()

    def over(self, timeout_s: float = 120.0) -> None:
        if self.thread is not None:
            self.thread.join(timeout=timeout_s)
            assert not self.thread.is_alive(), "Redis did not come back"


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.seen.append((reason, message))

    def reasons(self) -> list[str]:
        return [r for r, _ in self.seen]


def manifest(tmp_path: Any, events: int, rate: int) -> str:
    doc = exactly_once(with_audit(load("ccr-diamond"), events), checkpoint_s=2, rate=rate, nodes=3)
    return write_manifest(str(tmp_path), doc)


def ticking(controller: TopologyController, seconds: float, until: Callable[[], bool] | None = None) -> None:
    """The control loop of `elastream run`: a tick per interval (any exception of the controller fails the
    test), until `until()` holds (Redis still loading its data counts as not yet)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until is not None and _holds(until)):
        controller.tick()
        time.sleep(controller.interval_s)


def _holds(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except redis.RedisError:
        return False


@pytest.mark.timeout(1500)  # the 60 s walk: 6 outages of a minute, the migrations between them, the drain
@pytest.mark.parametrize("outage_s", [5.0, 60.0], ids=["redis-away-5s", "redis-away-60s"])
def test_every_phase_survives_redis_going_away(tmp_path, restartable_redis: RedisServer, outage_s: float) -> None:
    rate = 150
    long_outage = outage_s > 30.0
    outages = 6 if long_outage else 8
    phases_s = outages * (outage_s + 8.0)  # about how long the phases take: the sources run through them
    events = int(rate * phases_s)
    path = manifest(tmp_path, events, rate)
    topology = load_manifest(path)
    outage = Outage(restartable_redis, outage_s)
    log = Events()
    cluster = LocalCluster(topology, path, restartable_redis.url, interval_s=0.5, start_timeout_s=outage_s + 60.0)
    controller = local_controller(topology, cluster, Analyzer(engine="python"), events=log)
    driver = controller.migrator
    seen: list[str] = []

    def phase(name: str, outage_too: bool = True) -> None:
        seen.append(name)
        print(f"--- phase {name}" + (f": Redis away for {outage_s:g} s" if outage_too else ""), flush=True)

    # start: Redis goes away as the first worker starts; the workers wait for it, so does the controller
    spawn = cluster.spawn

    def spawn_during_outage(node: str, staged_version: int = 0) -> None:
        if "start" not in seen:
            phase("start")
            outage.begin()
        spawn(node, staged_version)

    cluster.spawn = spawn_during_outage  # type: ignore[method-assign]
    with cluster, controller:
        controller.start()
        cluster.spawn = spawn  # type: ignore[method-assign]
        outage.over()
        assert set(cluster.ready_nodes()) == set(cluster.current_schedule().nodes)

        phase("steady state")
        outage.begin()
        ticking(controller, outage_s + 5.0)
        outage.over()
        ticking(controller, 5.0)
        assert controller.store_error == "" and "RedisAvailable" in log.reasons()

        # the migrations: a scale-out, a scale-in, ... each with Redis away at another step

        prepare = cluster.prepare

        def prepare_during_outage(schedule: Any, **options: Any) -> None:
            outage.begin_once()
            prepare(schedule, **options)

        def at(kind: ActionKind) -> Callable[[Action, MigrationCoordinator], None]:
            def hook(action: Action, coordinator: MigrationCoordinator) -> None:
                if action.kind == kind:
                    outage.begin_once()

            return hook

        steps: list[tuple[str, Callable[[], None]]] = [
            ("prepare", lambda: setattr(cluster, "prepare", prepare_during_outage)),
            ("capture (PREPARE -> COMMIT)", lambda: setattr(driver, "before_action", at(ActionKind.START_COMMIT))),
            ("after COMMIT", lambda: setattr(driver, "before_action", at(ActionKind.APPLY_SCHEDULE))),
            ("INIT", lambda: setattr(driver, "before_action", at(ActionKind.BROADCAST_INIT))),
        ]
        for name, arm in steps:
            if long_outage and name in ("prepare", "INIT"):
                continue
            phase(name)
            outage.arm()
            arm()
            running = len(cluster.current_schedule().nodes)
            record = controller.scale_to(4 if running == 3 else 3)  # out and in by turns
            cluster.prepare = prepare  # type: ignore[method-assign]
            driver.before_action = None  # type: ignore[attr-defined]
            outage.over()
            ticking(controller, 60.0, until=lambda: controller.migrator.unfinished() is None)
            ticking(controller, 3.0)
            # what happened is on record: it moved, or it failed/rolled back saying why; never half-way
            assert record.outcome in ("succeeded", "failed"), record
            if record.outcome == "failed":
                assert record.reason
            assert controller.migrator.unfinished() is None
            schedule = cluster.current_schedule()
            assert set(cluster.ready_nodes()) == set(schedule.nodes), name

        phase("periodic checkpoint")
        checkpointer: Any = controller._started[0]
        store = checkpointer.driver.store
        acks = store.acks

        def acks_during_outage(*args: Any) -> Any:
            outage.begin_once()  # the round's CHECKPOINT went out; its acks cannot be read
            return acks(*args)

        store.acks = acks_during_outage
        outage.arm()
        ticking(controller, 10.0, until=lambda: outage.count >= outages - 1)
        store.acks = acks
        outage.over()
        completed, abandoned = checkpointer.completed, checkpointer.last
        # the abandoned round's claim is taken back by the next tick: a new round starts at once ...
        ticking(controller, 10.0, until=lambda: checkpointer.last is not abandoned)
        assert checkpointer.last is not abandoned
        # ... and one completes once the barriers get through: after a long outage they queue behind what the
        # sources sent meanwhile (the sinks could not commit), so a round may time out before one completes
        ticking(controller, outage_s + 60.0, until=lambda: checkpointer.completed > completed)
        assert checkpointer.completed > completed

        phase("recovery (a worker killed)")
        victim = cluster.current_schedule().nodes[-1]
        recover = driver.recover

        def recover_during_outage(failed: dict[str, str]) -> Any:
            outage.begin_once()
            return recover(failed)

        driver.recover = recover_during_outage  # type: ignore[method-assign]
        outage.arm()
        os.kill(cluster.workers[victim].process.pid, signal.SIGKILL)
        ticking(
            controller, outage_s + 90.0, until=lambda: bool(controller.last_recovery) and not cluster.failed_nodes()
        )
        driver.recover = recover  # type: ignore[method-assign]
        outage.over()
        ticking(controller, 120.0, until=lambda: not cluster.failed_nodes() and controller.recovery_failures == 0)
        assert controller.last_recovery is not None and "WorkerLost" in log.reasons()
        assert not cluster.failed_nodes()

        assert outage.count == outages, seen

        phase("an executor crashed", outage_too=False)
        # a scale-out whose new node runs an executor that dies of an error in the runtime after 200 events
        # (the test-only hook, given to the new node's worker only): the worker exits 70, recovery starts
        running = len(cluster.current_schedule().nodes)
        plan, _ = controller.plan(running + 1)
        added = set(plan.new_schedule.nodes) - set(cluster.current_schedule().nodes)
        doomed = next(e for e, node in plan.new_schedule.assignment.items() if node in added)
        cluster.extra_env[TEST_CRASH_ENV] = f"{doomed}:200"
        try:
            report = driver.migrate(plan.new_schedule)
        finally:
            del cluster.extra_env[TEST_CRASH_ENV]  # the worker started again by the recovery runs clean
        assert report.outcome == "succeeded", report.reason
        recoveries = log.reasons().count("WorkerLost")
        ticking(controller, 120.0, until=lambda: log.reasons().count("WorkerLost") > recoveries)
        lost = [m for r, m in log.seen if r == "WorkerLost"][-1]
        assert "exited with code 70" in lost, lost
        ticking(controller, 120.0, until=lambda: not cluster.failed_nodes() and controller.recovery_failures == 0)
        assert controller.last_recovery is not None and controller.last_recovery.get("outcome") == "succeeded"

        ticking(controller, 5.0)
        assert controller.store_error == "" and controller.state_lost == ""
        check_exactly_once_at_end(cluster, topology, events, controller)


def check_exactly_once_at_end(
    cluster: LocalCluster, topology: Any, events: int, controller: TopologyController
) -> None:
    """Every event exactly once at the exactly-once sinks, every keyed count exact: the sinks commit with
    checkpoints, so the controller keeps ticking while they drain."""
    with ticking_in_background(controller):
        # the sources finish their events and the sinks drain (idle for 10 s), then the truth is compared
        wait_for_sinks_idle(cluster, topology, quiet_s=10.0, timeout_s=600.0)
        check_exactly_once(cluster, topology, events)
