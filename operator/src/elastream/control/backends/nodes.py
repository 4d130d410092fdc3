"""What every backend that runs worker nodes shares: the schedule in Redis and the in-place migration steps.

A `NodeBackend` runs one worker per node of a schedule; subclasses say how a worker is started, stopped and
found dead (a local process, a Kubernetes pod). The steps here are the same for all:
- `start`: publish the schedule as the running version, start a worker per node, wait until all are ready;
- `prepare` (before a migration pauses anything): stage the new schedule as a version of the other parity,
  start the workers of the nodes it adds with that version (they bind their inboxes and idle), tell the
  staying workers to STAGE it (bind their new executors' inboxes), wait until every node has staged;
- `apply` (after COMMIT): activate the version, tell every running worker to SWITCH to it in place, start
  a worker for any node of it that has none (a dead one), forget the removed nodes (their workers exit by
  themselves after the switch), wait until every node is ready;
- `discard`: UNSTAGE on the staying workers, stop the added ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import redis

from elastream.core.migration_protocol import ControlType
from elastream.core.ports import BackendError, Clock, SystemClock
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology
from elastream.core.topology.limits import MigrationScope
from elastream.store.control import ControlChannel
from elastream.store.registry import Registry

log = logging.getLogger("elastream.backend")


class NodeBackend:
    def __init__(
        self, topology: Topology, client: redis.Redis, start_timeout_s: float = 60.0, clock: Clock | None = None
    ) -> None:
        #: every wait's deadline and pause (tests: a fake clock, so a bound of minutes passes at once)
        self.clock: Clock = clock or SystemClock()
        self.topology = topology
        self.client = client
        self.registry = Registry(client, topology.redis_prefix)
        self.start_timeout_s = start_timeout_s
        self.schedule: Schedule | None = None
        self.version = 0
        #: the schedule `prepare` staged, and its version
        self.prepared: tuple[Schedule, int] | None = None
        #: the schedule an `apply` in progress switches to, and its version (a retried apply reuses it)
        self.applying: tuple[Schedule, int] | None = None
        #: executor -> inbox endpoint of the running schedule
        self.endpoints: dict[str, str] = {}
        #: while a start or a migration waits for workers: called with `pending_nodes()` (of the nodes waited
        #: for) whenever it changes, so a pod the scheduler cannot place is reported while it waits
        self.on_waiting: Callable[[Mapping[str, str]], None] | None = None

    # ------------------------------------------------------------------------------ what subclasses provide
    def running_nodes(self) -> set[str]:
        """Nodes that have a live worker (including workers started for a prepared schedule)."""
        raise NotImplementedError

    def spawn(self, node: str, staged_version: int = 0) -> None:
        """Start the worker of `node`: for the running schedule, or idle for a staged version."""
        raise NotImplementedError

    def stop_nodes(self, nodes: Sequence[str]) -> None:
        """Stop the workers of `nodes` and forget them."""
        raise NotImplementedError

    def release_nodes(self, nodes: Sequence[str]) -> None:
        """Forget the workers of `nodes`: they exit by themselves after SWITCH (clean up what remains)."""
        raise NotImplementedError

    def failed_nodes(self) -> dict[str, str]:
        raise NotImplementedError

    def stop_workers(self) -> None:
        raise NotImplementedError

    def describe(self, node: str) -> str:
        """A line on what a node's worker is doing (the tail of its log), for timeout messages."""
        return ""

    def pending_nodes(self) -> dict[str, str]:
        """Nodes whose worker cannot start for now, with why (a pod no cluster node can take, an image that
        cannot be pulled); waiting goes on, as the cluster may change."""
        return {}

    def preflight(self) -> None:
        """Checks before any worker starts (raise `BackendError`)."""

    def is_transient(self, exc: Exception) -> bool:
        """Whether `exc`, raised while looking at the workers, means "cannot tell right now" (Redis or the
        API server away for a moment) rather than a failure: a wait goes on until its deadline."""
        return isinstance(exc, redis.RedisError | OSError)

    # ------------------------------------------------------------------------------------ Backend protocol
    def current_schedule(self) -> Schedule:
        if self.schedule is None:
            raise BackendError("no schedule applied yet")
        return self.schedule

    def start(self, schedule: Schedule) -> None:
        self.preflight()
        self.version = self.registry.publish_schedule(schedule, after=self.version)
        self.schedule = schedule
        running = self.running_nodes()
        for node in schedule.nodes:
            if node not in running:
                self.spawn(node)
        self.wait_ready(schedule.nodes)

    def assume(self, schedule: Schedule) -> None:
        """Take `schedule` as the running one with no worker started (a suspended topology, e.g. after an
        operator restart): its version is the registry's when Redis still holds it as the running one, so
        the restore that resumes it stages the next version of the other parity."""
        found = self.registry.schedule()
        if found is not None and found[1] == schedule:
            self.version = found[0]
        self.schedule = schedule

    def prepare(self, schedule: Schedule, scope: MigrationScope = "all") -> None:
        self.discard_prepared()
        self.preflight()
        version = self.registry.stage_schedule(schedule, after=self.version)
        running = self.running_nodes()
        added = [n for n in schedule.nodes if n not in running]
        # recorded before the first worker starts: whatever fails below, `discard` stops every one started
        self.prepared = (schedule, version)
        try:
            for node in added:
                self.spawn(node, staged_version=version)
            self.control(schedule).send_nodes(
                [n for n in schedule.nodes if n not in added],
                {"type": ControlType.STAGE, "version": version, "scope": scope},
            )
            self._wait_for(schedule.nodes, lambda: self.registry.staged_nodes(version), "staged")
        except (BackendError, redis.RedisError) as exc:
            try:
                self.discard(schedule)
            except redis.RedisError as again:  # the added workers are stopped all the same (see discard_prepared)
                log.warning("discarding the prepared schedule: %s", again)
            if isinstance(exc, BackendError):
                raise
            raise BackendError(f"Redis: {exc}") from None

    def discard(self, schedule: Schedule) -> None:
        if self.prepared is not None and self.prepared[0] == schedule:
            self.discard_prepared()

    def discard_prepared(self) -> None:
        if self.prepared is None:
            return
        schedule, version = self.prepared
        self.prepared = None
        current = set(self.schedule.nodes) if self.schedule is not None else set()
        try:
            self.control(schedule).send_nodes(
                [n for n in schedule.nodes if n in current], {"type": ControlType.UNSTAGE, "version": version}
            )
        finally:  # the added workers go even when Redis cannot carry the UNSTAGE (a staged inbox is harmless)
            self.stop_nodes([n for n in schedule.nodes if n not in current])

    def apply(self, schedule: Schedule, migration_id: str, scope: MigrationScope = "all") -> None:
        if self.prepared is not None and self.prepared[0] == schedule:
            version = self.prepared[1]
            self.prepared = None
        elif self.applying is not None and self.applying[0] == schedule:
            # this apply again (Redis went away in the middle of it): the same version, not a new one, so the
            # workers that switched already are not switched to another version of the other parity
            version = self.applying[1]
        else:
            self.discard_prepared()
            version = self.registry.stage_schedule(schedule, after=self.version)
        alive = self.running_nodes() - set(self.failed_nodes())
        if scope in ("moving", "keyGroups") and not set(schedule.nodes) <= alive:
            # a partial switch keeps executors whose state is only in their process: a worker that died since
            # PREPARE took theirs with it, and a new one could not restore them from the migration
            dead = ", ".join(sorted(set(schedule.nodes) - alive))
            raise BackendError(f"the worker of {dead} died during the migration")
        self.applying = (schedule, version)
        self.registry.activate_schedule(version)
        self.control(schedule).send_nodes(
            sorted(alive), {"type": ControlType.SWITCH, "version": version, "mid": migration_id, "scope": scope}
        )
        self.version, self.schedule = version, schedule
        if any(node not in alive for node in schedule.nodes):
            # what a worker needs before it starts (on Kubernetes its ConfigMap, Secret and Redis user): a
            # restore that starts every worker of a topology it never started (a new topology from a
            # savepoint, one re-created over retained state) finds none of it
            self.preflight()
        for node in schedule.nodes:
            if node not in alive:  # dead or never started: a new worker reads the schedule just activated
                self.spawn(node)
        self.release_nodes([n for n in alive if n not in schedule.nodes])
        self.wait_ready(schedule.nodes)
        self.applying = None

    def ready_nodes(self) -> set[str]:
        """Nodes whose worker runs the current schedule and said it is ready."""
        return self.registry.ready_nodes(self.version) if self.schedule is not None else set()

    def check_alive(self) -> None:
        failed = self.failed_nodes()
        if failed:
            raise BackendError(next(iter(failed.values())))

    def restart_nodes(self, nodes: Sequence[str]) -> None:
        self.stop_nodes(nodes)
        self.registry.unmark_ready(self.version, nodes)
        for node in nodes:
            log.warning("restarting the worker of %s under schedule version %d", node, self.version)
            self.spawn(node)
        if nodes:
            self.wait_ready(list(self.current_schedule().nodes))

    # ---------------------------------------------------------------------------------------------- helpers
    def control(self, schedule: Schedule) -> ControlChannel:
        return ControlChannel(self.client, self.topology.redis_prefix, schedule)

    def tell_stop(self, nodes: Sequence[str]) -> None:
        """Before the backend stops these workers: a STOP on their control lists, so the SIGTERM that follows
        is not taken for a drain request (best effort: with Redis away a worker cannot drain either)."""
        if not nodes:
            return
        try:
            self.control(self.schedule or Schedule({}, (), 1)).send_nodes(nodes, {"type": ControlType.STOP})
        except Exception as exc:  # best effort: the stop goes ahead whatever Redis (or a test's fake) does
            log.debug("STOP not sent to %s: %s", ", ".join(nodes), exc)

    def wait_ready(self, nodes: Sequence[str]) -> None:
        version = self.version
        self._wait_for(nodes, lambda: self.registry.ready_nodes(version), "ready")
        self.endpoints = self.registry.endpoints(version)

    def _wait_for(self, nodes: Sequence[str], reached: Callable[[], set[str]], what: str) -> None:
        """Wait until every node of `nodes` has `reached` a state, for at most `start_timeout_s`. A worker that
        dies ends the wait at once; Redis or the API server away for a moment does not (the wait goes on and
        the timeout message says what could not be read)."""
        deadline = self.clock.monotonic() + self.start_timeout_s
        wanted = set(nodes)
        pause = 0.005
        reported: dict[str, str] = {}
        next_report = 0.0
        unreadable = ""
        while self.clock.monotonic() < deadline:
            try:
                failed = {n: why for n, why in self.failed_nodes().items() if n in wanted}
                if failed:
                    raise BackendError("; ".join(failed.values()))
                if reached() >= wanted:
                    if reported and self.on_waiting is not None:
                        self.on_waiting({})
                    return
                if self.on_waiting is not None and self.clock.monotonic() >= next_report:
                    next_report = self.clock.monotonic() + 1.0
                    pending = {n: why for n, why in self.pending_nodes().items() if n in wanted}
                    if pending != reported:
                        reported = pending
                        self.on_waiting(pending)
                unreadable = ""
            except BackendError:
                raise
            except Exception as exc:
                if not self.is_transient(exc):
                    raise
                if not unreadable:
                    log.warning("waiting for nodes to be %s: cannot look right now (%s); still waiting", what, exc)
                unreadable = f"{type(exc).__name__}: {exc}"
                pause = max(pause, 0.5)
            self.clock.sleep(pause)
            pause = min(0.1 if not unreadable else 1.0, pause * 1.2)  # quick for a switch, gentle on the API
        try:
            missing = sorted(wanted - reached())
            tails = "; ".join(f"{n}: {self.describe(n)!r}" for n in missing)
        except Exception as exc:
            if not self.is_transient(exc):
                raise
            missing, tails = sorted(wanted), f"could not be read: {unreadable or exc}"
        raise BackendError(f"nodes {', '.join(missing)} not {what} after {self.start_timeout_s:.0f} s ({tails})")
