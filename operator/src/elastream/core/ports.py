"""Protocols the adapters implement, so orchestration is written once and tested with in-memory fakes.

- `MetricSource`: the analysed metrics of a running topology (Spark analysis, the pure reference, a fake).
- `Backend`: runs worker nodes under a schedule (local processes, Kubernetes pods, a fake); raises
  `BackendError` (the one error type the controller catches from it).
- `Migrator`: moves a running topology to another schedule (CCR, DCR, restart) and recovers it from failures.
- `ScaleRequests` / `StatusSink`: where a controller's requests come from and where its status goes (Redis
  keys in local mode, the custom resource on Kubernetes).
- `DrainRequests`: workers told to stop (SIGTERM) asking for their executors to be moved off (`core.drain_plan`).
- `SampleFeed`: the raw metric samples (the live view and the recovery measurement read them).
- `Clock`: time, replaceable in tests.
- `EventSink`: where decisions and migrations are reported (stdout, Kubernetes events, a list in tests).
- `CoreApi`, `CustomObjectsApi`, `NetworkingApi`, `PolicyApi`, `CoordinationApi`: the calls the operator makes of
  the Kubernetes API, with the arguments it passes (what `kubernetes.client`'s CoreV1Api, CustomObjectsApi,
  NetworkingV1Api, PolicyV1Api and CoordinationV1Api provide, and the in-memory fakes of the tests).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from elastream.core.keygroup_batches import Load
from elastream.core.metrics import MetricSample, MetricSnapshot
from elastream.core.migration_protocol import MigrationReport
from elastream.core.schedule import Schedule
from elastream.core.topology.limits import MigrationScope
from elastream.core.window_analysis import Analysis


@runtime_checkable
class MetricSource(Protocol):
    #: samples before this time (the current schedule's start) are not analysed
    not_before: float

    @property
    def engine(self) -> str | None:
        """The engine the last analysis ran on (spark | python), None before the first."""
        ...

    def snapshot(self, window: int) -> MetricSnapshot:
        """Analyse the last `window` metric intervals into a snapshot."""
        ...

    def analyse(self, window: int) -> Analysis:
        """The same analysis with its window's span and how many samples it used (the autoscaler's input)."""
        ...


@runtime_checkable
class SampleFeed(Protocol):
    def read_since(self, since_ts: float | None = None) -> list[MetricSample]:
        """Samples whose `ts` is at or after `since_ts`, oldest first."""
        ...


@runtime_checkable
class Migrator(Protocol):
    def migrate(self, schedule: Schedule, load: Load | None = None) -> MigrationReport:
        """Move the running topology to `schedule` with the topology's protocol (`load`: each vertex's state
        and input rate, for a key-group migration's batch sizes)."""
        ...

    def interrupted_target(self) -> Schedule | None:
        """The schedule an interrupted migration past COMMIT moves to (start it, then `resume`), or None."""
        ...

    def resume(self) -> MigrationReport | None:
        """Finish or abort a migration a previous controller left; None when there is none."""
        ...

    def unfinished(self) -> str | None:
        """The id of a migration or checkpoint holding the topology that no live controller drives (`resume`
        takes it over), or None."""
        ...

    def recover(self, failed: dict[str, str]) -> MigrationReport | None:
        """Workers died (node -> why): roll back to the last checkpoint, or restart them empty (None)."""
        ...

    def abandon_restore(self) -> str | None:
        """Forget a restore from a checkpoint (the restart protocol) that failed and whose workers are being
        stopped, so nothing finishes it later and the checkpoint it restored from stays the one to start from
        (a rolled-back upgrade starts the previous spec from it). Its id, or None when there was none."""
        ...


@dataclass(frozen=True)
class ScaleRequest:
    """What a user asked for: a node count, and optionally new degrees for some vertices."""

    nodes: int
    parallelism: Mapping[str, int] | None = None


@runtime_checkable
class ScaleRequests(Protocol):
    def take(self) -> ScaleRequest | None:
        """The request made since the last call, or None."""
        ...


@dataclass(frozen=True)
class DrainRequest:
    """A worker told to stop asks for its node to be drained before `deadline` (wall-clock seconds), after
    which it exits anyway."""

    node: str
    requested_at: float
    deadline: float


@runtime_checkable
class DrainRequests(Protocol):
    def pending(self) -> dict[str, DrainRequest]:
        """The requests not handled yet, by node."""
        ...

    def done(self, node: str) -> None:
        """Forget the request of `node` (drained, refused, or stale)."""
        ...


@runtime_checkable
class StatusSink(Protocol):
    def publish(self, field: str, status: dict[str, Any]) -> None:
        """Record `status` as the topology's `field` (lastScaling, lastRecovery); never raises: what cannot
        be written now (its store away) is kept for `flush`."""
        ...

    def flush(self) -> None:
        """Write what `publish` could not (called every tick)."""
        ...


@runtime_checkable
class Background(Protocol):
    """A periodic task the controller owns (checkpoints, the metric archive): started with the topology,
    given a `tick` on every controller tick (it decides whether its work is due), stopped before the
    workers."""

    def start(self) -> Any: ...

    def tick(self) -> Any: ...

    def stop(self) -> Any: ...


class BackendError(Exception):
    """A worker node did not start, died, or a schedule could not be applied; the message names the nodes
    and why (a quote of the worker's log where there is one)."""


class NotOwned(BackendError):
    """An object the backend would patch or delete (a worker pod, the topology's ConfigMap or Secret) exists
    and is not the topology's: it is left untouched; the message names it and the fix."""


@runtime_checkable
class Backend(Protocol):
    """Worker nodes under a schedule. Migrations (`control.migration`) drive it: `prepare` before anything is
    paused, `apply` after COMMIT, `discard` when a prepared schedule is not used."""

    def current_schedule(self) -> Schedule:
        """The schedule the workers run (raises `BackendError` before the first `start`)."""
        ...

    def start(self, schedule: Schedule) -> None:
        """Start every node of `schedule` from scratch and wait until all are ready."""
        ...

    def prepare(self, schedule: Schedule, scope: MigrationScope = "all") -> None:
        """Ready the next schedule without disturbing the running one: nodes it adds are started and ready
        (idle, endpoints registered), nodes that stay bind the inboxes of their new executors (`moving`: only
        of those that move, `core.migration_scope`)."""
        ...

    def discard(self, schedule: Schedule) -> None:
        """Undo `prepare(schedule)`: the added nodes stop, the staying ones drop what they bound."""
        ...

    def apply(self, schedule: Schedule, migration_id: str, scope: MigrationScope = "all") -> None:
        """Switch to `schedule` in place: a running worker that stays loads it (stops the executors it
        loses, starts the ones it gains, waiting for INIT of `migration_id`; `moving`: the executors that
        stay as they are run on), a node without a running worker is started, a node the schedule drops
        stops. Returns when every node of it is ready."""
        ...

    def failed_nodes(self) -> dict[str, str]:
        """Nodes of the running schedule whose worker died, with why; empty when all are alive."""
        ...

    def check_alive(self) -> None:
        """Raise `BackendError` naming a dead worker, if any."""
        ...

    def restart_nodes(self, nodes: Sequence[str]) -> None:
        """Start the workers of `nodes` again under the running schedule (their executors start empty)."""
        ...

    def stop_workers(self) -> None:
        """Stop every worker (the `restart` protocol, shutdown, suspend)."""
        ...

    def running_nodes(self) -> set[str]:
        """Nodes that have a live worker (a pod that runs or is being started)."""
        ...

    def assume(self, schedule: Schedule) -> None:
        """Take `schedule` as the one the workers run without starting any (a suspended topology: its workers
        are stopped; the restore that resumes it starts them)."""
        ...


@runtime_checkable
class StateEpochs(Protocol):
    """Where the proof that the state store still holds the topology's state lives (`store.epoch`)."""

    def read(self) -> str | None: ...

    def create(self) -> str: ...


class StateLost(BackendError):
    """The state store no longer holds the topology's state (emptied, a new volume, a wrong URL): nothing
    may restart from it until the user says so."""


@runtime_checkable
class StopSignal(Protocol):
    """What ends a wait: a `threading.Event`, or `store.retry.AnyOf` several."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Clock(Protocol):
    """The one clock of the operator, the controller and the workers; replaceable in tests, so nothing that
    waits or keeps a deadline reads `time` itself."""

    def now(self) -> float:
        """Seconds since the epoch: what is written down (status, Lease records, metric samples)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps: every deadline and every interval measured."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, stop: StopSignal, seconds: float) -> bool:
        """Wait `seconds` or until `stop` is set; True when it is set."""
        ...


@runtime_checkable
class EventSink(Protocol):
    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        """Report one decision or outcome (a Kubernetes Event's reason and message)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, stop: StopSignal, seconds: float) -> bool:
        return stop.wait(max(0.0, seconds))


class CoreApi(Protocol):
    """The core/v1 calls of the operator: its events, the topology's ConfigMap and Secret, its worker pods
    (`kubernetes.client.CoreV1Api`). Objects come back as the client's models (or dicts from fakes)."""

    def create_namespaced_event(self, namespace: str, body: Any) -> Any: ...

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any: ...

    def create_namespaced_config_map(self, namespace: str, body: Any) -> Any: ...

    def patch_namespaced_config_map(self, name: str, namespace: str, body: Any) -> Any: ...

    def read_namespaced_secret(self, name: str, namespace: str) -> Any: ...

    def create_namespaced_secret(self, namespace: str, body: Any) -> Any: ...

    def patch_namespaced_secret(self, name: str, namespace: str, body: Any) -> Any: ...

    def list_namespaced_pod(self, namespace: str, *, label_selector: str = ...) -> Any: ...

    def read_namespaced_pod(self, name: str, namespace: str) -> Any: ...

    def create_namespaced_pod(self, namespace: str, body: Any) -> Any: ...

    def delete_namespaced_pod(
        self, name: str, namespace: str, *, body: Any = ..., grace_period_seconds: int | None = ...
    ) -> Any: ...


class CustomObjectsApi(Protocol):
    """A StreamTopology's spec, metadata and status subresource (`kubernetes.client.CustomObjectsApi`)."""

    def patch_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        body: Any,
        *,
        _request_timeout: float,
        field_manager: str = ...,
    ) -> Any: ...

    def patch_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, *, _request_timeout: float
    ) -> Any: ...


class NetworkingApi(Protocol):
    """A topology's NetworkPolicy (`kubernetes.client.NetworkingV1Api`)."""

    def read_namespaced_network_policy(self, name: str, namespace: str) -> Any: ...

    def create_namespaced_network_policy(self, namespace: str, body: Any) -> Any: ...

    def patch_namespaced_network_policy(self, name: str, namespace: str, body: Any) -> Any: ...


class PolicyApi(Protocol):
    """A topology's PodDisruptionBudget (`kubernetes.client.PolicyV1Api`)."""

    def read_namespaced_pod_disruption_budget(self, name: str, namespace: str) -> Any: ...

    def create_namespaced_pod_disruption_budget(self, namespace: str, body: Any) -> Any: ...

    def patch_namespaced_pod_disruption_budget(self, name: str, namespace: str, body: Any) -> Any: ...


class CoordinationApi(Protocol):
    """The leader election's Lease (`kubernetes.client.CoordinationV1Api`)."""

    def read_namespaced_lease(self, name: str, namespace: str, *, _request_timeout: float | None = ...) -> Any: ...

    def create_namespaced_lease(self, namespace: str, body: Any, *, _request_timeout: float | None = ...) -> Any: ...

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: Any, *, _request_timeout: float | None = ...
    ) -> Any: ...
