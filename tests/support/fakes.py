"""In-memory fakes at the controller's ports (`core.ports`): a backend that records schedules, a migrator that
applies them, metrics from the fluid simulator of whatever the backend runs, requests from a list, status into
a dict, events into a list, a fake clock. Shared by the controller's and the reconciler's unit tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from elastream.control.checkpoint_driver import CheckpointResult
from elastream.core.metrics import MetricSample, MetricSnapshot
from elastream.core.migration_protocol import MigrationReport
from elastream.core.ports import BackendError, ScaleRequest
from elastream.core.schedule import Schedule
from elastream.core.simulate import simulate, snapshot_from_simulation


class FakeBackend:
    def __init__(self) -> None:
        self.schedule: Schedule | None = None
        self.started: list[Schedule] = []
        self.dead: dict[str, str] = {}
        self.log: list[str] = []
        #: nodes with a worker (pod) that exists: changed in place, so a test can share it between the
        #: backends of two operator lifetimes (pods outlive an operator restart)
        self.workers: set[str] = set()
        #: how often the topology's Redis user was checked, and what checking it raises (an `AclRefused`)
        self.redis_user_checks = 0
        self.redis_user_error: Exception | None = None
        #: the topology's ConfigMap (share it between operator lifetimes, as `workers`), and what writing the
        #: record of an upgrade raises
        self.configmap: dict[str, Any] = {}
        self.configmap_error: Exception | None = None

    def record_upgrade(self, previous: Any) -> None:
        if self.configmap_error is not None:
            raise self.configmap_error
        if previous is None:
            self.configmap.pop("previous", None)
        else:
            self.configmap["previous"] = {"spec": dict(previous.spec)}

    def ensure_redis_user(self) -> None:
        self.redis_user_checks += 1
        if self.redis_user_error is not None:
            raise self.redis_user_error

    def current_schedule(self) -> Schedule:
        if self.schedule is None:
            raise BackendError("no schedule applied yet")
        return self.schedule

    def ready_nodes(self) -> set[str]:
        return set(self.schedule.nodes) - set(self.dead) if self.schedule is not None else set()

    def pending_nodes(self) -> dict[str, str]:
        return {}

    def start(self, schedule: Schedule) -> None:
        self.started.append(schedule)
        self.schedule = schedule
        self.workers.update(schedule.nodes)

    def failed_nodes(self) -> dict[str, str]:
        return dict(self.dead)

    def stop_workers(self) -> None:
        self.log.append("workers stopped")
        self.workers.clear()
        self.dead = {}

    def running_nodes(self) -> set[str]:
        return set(self.workers) - set(self.dead)

    def assume(self, schedule: Schedule) -> None:
        self.log.append("assumed")
        self.schedule = schedule


@dataclass
class FakeMigrator:
    backend: FakeBackend
    applied: list[Schedule] = field(default_factory=list)
    outcome: str = "succeeded"
    target: Schedule | None = None
    resumed: int = 0
    recovered: list[dict[str, str]] = field(default_factory=list)
    #: a migration nobody drives (left by Redis going away), until resumed
    left: str | None = None
    #: recover raises this many times before it succeeds, with this message
    recover_failures: int = 0
    recover_error: str = "pod t-node-1 not created: Forbidden: exceeded quota: pods"
    #: set when the topology is deleted (a migration in flight stops waiting)
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: failed restores forgotten (`abandon_restore`)
    abandoned: int = 0
    #: the `load` each migration was given (each vertex's state and input rate)
    loads: list[Any] = field(default_factory=list)

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

    def migrate(self, schedule: Schedule, load: Any = None) -> MigrationReport:
        self.loads.append(load)
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
        left, self.left = self.left, None
        return self.report("succeeded") if self.target is not None or left is not None else None

    def unfinished(self) -> str | None:
        return self.left

    def abandon_restore(self) -> str | None:
        self.abandoned += 1
        return None

    def recover(self, failed: dict[str, str]) -> MigrationReport | None:
        self.recovered.append(failed)
        if self.recover_failures:
            self.recover_failures -= 1
            raise BackendError(self.recover_error)
        self.backend.dead = {}
        if self.backend.schedule is not None:  # the restore starts the workers that are not there
            self.backend.workers.update(self.backend.schedule.nodes)
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


class FakeCheckpoints:
    """Checkpoints on demand: each `take` completes the next id (kept in `store`, the test's "Redis", so it
    outlives an operator restart), or fails with `failure` while that is set."""

    def __init__(self, backend: FakeBackend, store: dict[str, str] | None = None) -> None:
        self.backend = backend
        self.store = store if store is not None else {}
        self.taken: list[str] = []
        self.failure = ""
        self.discarded = 0
        #: bytes of state per vertex the last checkpoint held (what a key-group migration sizes batches from)
        self.state: dict[str, int] = {}

    def take(self) -> CheckpointResult:
        checkpoint_id = f"ckpt-{int(self.store.get('ckpt:count', '0')) + 1}"
        self.store["ckpt:count"] = checkpoint_id.split("-")[1]
        if self.failure:
            return CheckpointResult(checkpoint_id, "failed", reason=self.failure)
        self.taken.append(checkpoint_id)
        self.backend.log.append(f"checkpoint {checkpoint_id}")
        self.store["ckpt:latest"] = checkpoint_id
        return CheckpointResult(checkpoint_id, "completed", 12.0)

    def latest(self) -> str | None:
        return self.store.get("ckpt:latest")

    def discard_uncommitted(self) -> int:
        self.discarded += 1
        return 0

    def state_by_vertex(self) -> dict[str, int]:
        return dict(self.state)


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

    def flush(self) -> None:
        pass


class ListEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))


class ManualClock:
    """Time moves only when the test moves it (`t`, `sleep`, `wait`): a deadline, a backoff or an age is then
    exactly what the test set."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def wait(self, stop: Any, seconds: float) -> bool:
        self.t += seconds
        return False


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        self.t += 0.5
        return self.t

    def monotonic(self) -> float:
        return self.now()

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def wait(self, stop: Any, seconds: float) -> bool:
        if not stop.is_set():
            self.t += seconds
        return bool(stop.is_set())


class FakeSavepoints:
    """`control.savepoint_actions.Savepoints` in memory (the test's "Redis", shared by operators of one test): a take
    copies the controller's on-demand checkpoint (failing while its checkpoints fail), a restore seeds a
    topology's fake checkpoint store (`stores`: prefix -> the `FakeCheckpoints` store of that topology)."""

    def __init__(self) -> None:
        from elastream.core.savepoint_rules import SavepointMeta

        self.kept: dict[tuple[str, str, str], SavepointMeta] = {}
        #: topology prefix -> its checkpoint keys (what `restore` seeds and `has_checkpoint` reads), its epoch keys
        self.stores: dict[str, dict[str, str]] = {}
        self.epochs: dict[str, dict[str, str]] = {}
        self.restored: list[str] = []

    def take(self, controller: Any, name: str, share_with: Any) -> Any:
        from elastream.control.savepoint_actions import SavepointError
        from elastream.core.savepoint_rules import SavepointMeta

        topology = controller.topology
        if (topology.namespace, topology.name, name) in self.kept:
            raise SavepointError(f"savepoint {name} exists already", retry=False)
        checkpoint = controller.resume_point if controller.suspended else None
        if checkpoint is None:
            result = controller.checkpoints.take()
            if result.outcome != "completed":
                raise SavepointError(f"the checkpoint was not taken: {result.reason}", retry=True)
            checkpoint = result.checkpoint_id
        meta = SavepointMeta(
            name,
            topology.namespace,
            topology.name,
            checkpoint,
            f"2026-01-01T00:00:{len(self.kept):02d}Z",
            {v: topology.vertices[v].max_parallelism for v in topology.order},
            tuple(share_with),
        )
        self.kept[(topology.namespace, topology.name, name)] = meta
        return meta

    def delete(self, namespace: str, topology: str, name: str) -> bool:
        return self.kept.pop((namespace, topology, name), None) is not None

    def list(self, namespace: str, topology: str) -> list[Any]:
        return [m for (ns, t, _), m in sorted(self.kept.items()) if (ns, t) == (namespace, topology)]

    def restore(self, topology: Any) -> Any:
        from elastream.control.savepoint_actions import SavepointError, check_restorable

        ref = topology.initial_savepoint
        store = self.stores.setdefault(topology.redis_prefix, {})
        if ref is None or self.epochs.get(topology.redis_prefix, {}).get("epoch"):
            return None
        meta = self.kept.get((ref.namespace, ref.topology, ref.name))
        if meta is None:
            raise SavepointError(f"spec.initialSavepoint: no savepoint {ref.name}", retry=True)
        check_restorable(meta, topology)  # the real check: the fake stands in for Redis only
        store["ckpt:latest"] = f"ckpt-from-{ref.name}"
        self.restored.append(ref.key)
        return meta

    def has_checkpoint(self, topology: Any) -> bool:
        return bool(self.stores.get(topology.redis_prefix, {}).get("ckpt:latest"))
