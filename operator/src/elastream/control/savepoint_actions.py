"""Taking a savepoint of a running (or suspended) topology, and starting a new topology from one.

`take_savepoint` takes a checkpoint on demand (`CheckpointDriver.take`, the periodic aligned-barrier round:
it completes, and commits the exactly-once sinks' output staged before it, before anything is copied), then
copies it to the savepoint's retained keys (`store.savepoint_store`) with its meta: the vertices and their key
spaces, where it comes from, the namespaces it is shared with, and each exactly-once sink's last committed
entry (what the output held at that point). A suspended topology is saved from its resume point (the suspend's
last checkpoint) without starting anything. The copy is made by the operator's connection (it reads one
topology's keys and writes others: across Redis Cluster slots, which no single command could).

`restore_initial_savepoint` seeds a topology that has no state of its own (no epoch in Redis: new, or
restarted from scratch) with `spec.initialSavepoint`: the savepoint's state and positions become the
topology's first completed checkpoint, so the controller's ordinary start restores every executor from it
(`migrator.recover`, the `restart` protocol: state per key group, sources from the savepoint's positions)
exactly as a resume after a suspend does. A topology with state of its own ignores it.

Nothing here retries: the caller (`control.savepoint_annotations`) retries with backoff and reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from elastream.control.controller import TopologyController
from elastream.control.retrying import backoff_delay
from elastream.core.ports import Clock, EventSink, SystemClock
from elastream.core.savepoint_rules import (
    DELETE_SAVEPOINT_ANNOTATION,
    MAX_SAVEPOINTS,
    SAVEPOINT_ANNOTATION,
    SHARE_ANNOTATION,
    SavepointMeta,
    access_problem,
    compatibility_problems,
    name_problem,
    parse_share_with,
    status_entries,
)
from elastream.core.schedule import initial_schedule
from elastream.core.status import EventReason, utc_timestamp
from elastream.core.topology import Topology, stream_key
from elastream.store.checkpoint_store import CheckpointScope, CheckpointStore
from elastream.store.epoch import RedisEpoch
from elastream.store.savepoint_store import SavepointStore

log = logging.getLogger("elastream.savepoint")


class SavepointError(Exception):
    """A savepoint could not be taken or restored. `retry`: it may work later (a checkpoint that did not
    complete, a savepoint not there yet); otherwise the user must change something (the message says what)."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def take_savepoint(
    client: redis.Redis, controller: TopologyController, name: str, share_with: Sequence[str] = ()
) -> SavepointMeta:
    """Take the savepoint `name` of the controller's topology (see the module); raises `SavepointError` or
    `redis.RedisError` (nothing is listed then)."""
    topology = controller.topology
    problem = name_problem(name, "annotation elastream.dev/savepoint")
    if problem is not None:
        raise SavepointError(problem, retry=False)
    store = SavepointStore(client, topology.namespace, topology.name)
    names = store.names()
    if name in names:
        raise SavepointError(
            f"savepoint {name} exists already; choose another name, or delete it first with the annotation "
            f"elastream.dev/delete-savepoint={name}",
            retry=False,
        )
    if len(names) >= MAX_SAVEPOINTS:
        raise SavepointError(
            f"{len(names)} savepoints kept, the most allowed; delete one with the annotation "
            "elastream.dev/delete-savepoint=<name>",
            retry=False,
        )
    checkpoints = controller.checkpoints
    if checkpoints is None:
        raise SavepointError("this controller takes no checkpoint on demand", retry=False)
    if controller.suspended:
        checkpoint_id = controller.resume_point
        if checkpoint_id is None:
            raise SavepointError(
                "the topology is suspended and never completed a checkpoint: nothing to save; resume it first",
                retry=False,
            )
    else:
        result = checkpoints.take()
        if result.outcome != "completed" or result.checkpoint_id is None:
            raise SavepointError(f"the checkpoint was not taken: {result.reason or result.outcome}", retry=True)
        checkpoint_id = result.checkpoint_id
    working = CheckpointStore(client, topology.redis_prefix)
    state, positions = working.export_checkpoint(checkpoint_id, topology.order)
    latest = working.latest_checkpoint()
    if latest is None or latest.get("id") != checkpoint_id:  # replaced (and deleted) meanwhile: a partial copy
        raise SavepointError(f"checkpoint {checkpoint_id} was replaced while it was copied", retry=True)
    meta = SavepointMeta(
        name=name,
        namespace=topology.namespace,
        topology=topology.name,
        checkpoint=checkpoint_id,
        taken_at=utc_timestamp(controller.clock.now()),
        vertices={v: topology.vertices[v].max_parallelism for v in topology.order},
        shared_with=tuple(share_with),
        # read now, before anything else of this controller runs: only a checkpoint commits to these streams
        committed_output=committed_output(client, topology),
        state_bytes=sum(len(b) for groups in state.values() for b in groups.values()),
    )
    store.save(meta, state, positions)
    log.info("savepoint %s of %s/%s taken from %s", name, topology.namespace, topology.name, checkpoint_id)
    return meta


def committed_output(client: redis.Redis, topology: Topology) -> dict[str, str]:
    """Each exactly-once redis-stream sink -> the id of its stream's last entry ("0-0": empty). Such a stream
    is written only when a checkpoint commits, so right after one this is exactly what it committed."""
    found = {}
    for vertex in topology.sinks:
        config = topology.vertices[vertex].config
        if config.get("type") != "redis-stream" or config.get("delivery") != "exactly-once":
            continue
        last = client.xrevrange(stream_key(topology.redis_prefix, "sink", str(config.get("stream") or vertex)), count=1)
        found[vertex] = (last[0][0].decode() if isinstance(last[0][0], bytes) else str(last[0][0])) if last else "0-0"
    return found


def unavailable(name: str, namespace: str, topology: str, reader: str) -> str:
    """Why a topology of namespace `reader` cannot start from savepoint `name` of another namespace's
    `namespace/topology`: one message whether it does not exist or is not shared with `reader`, so a
    reference cannot tell another namespace's savepoints apart from nothing (no existence oracle)."""
    return (
        f"spec.initialSavepoint: savepoint {name} of {namespace}/{topology} does not exist or is not shared with "
        f"namespace {reader}; its owners take it with the annotations {SAVEPOINT_ANNOTATION}={name} and "
        f"{SHARE_ANNOTATION}={reader} on {namespace}/{topology}"
    )


def check_restorable(meta: SavepointMeta, topology: Topology) -> None:
    """Raise `SavepointError` (the user's to fix: no retry) when `topology` may not start from `meta`: another
    namespace's savepoint not shared with it (said as `unavailable` says it), or other vertex names or key
    spaces (said only to a topology that may read it)."""
    if access_problem(meta, topology.namespace):
        raise SavepointError(unavailable(meta.name, meta.namespace, meta.topology, topology.namespace), retry=False)
    problems = compatibility_problems(meta, {v: topology.vertices[v].max_parallelism for v in topology.order})
    if problems:
        raise SavepointError("; ".join(problems), retry=False)


def restore_initial_savepoint(
    client: redis.Redis, topology: Topology, clock: Clock | None = None
) -> SavepointMeta | None:
    """Seed `topology` from its `spec.initialSavepoint` when it has no state of its own (see the module);
    returns the savepoint used, None when there is none to use (no reference, or state of its own). Raises
    `SavepointError`, `StateLost` (its state or positions are gone) or `redis.RedisError`.

    Who may read it is checked on its meta alone, before anything of its state is read. A savepoint of the
    topology's own namespace that is missing is retried (it may be taken yet); one of another namespace that
    is missing or not shared with this one gives the same message either way (`unavailable`, InvalidSpec: the
    user's to fix, by another reference or a grant; the start is tried again every pass all the same)."""
    ref = topology.initial_savepoint
    if ref is None or RedisEpoch(client, topology.redis_prefix).read() is not None:
        return None
    store = SavepointStore(client, ref.namespace, ref.topology)
    meta = store.meta(ref.name)
    foreign = ref.namespace != topology.namespace
    if meta is not None and (meta.name, meta.namespace, meta.topology) != (ref.name, ref.namespace, ref.topology):
        meta = None  # not the savepoint its key names: as good as none
    if foreign and (meta is None or access_problem(meta, topology.namespace)):
        raise SavepointError(unavailable(ref.name, ref.namespace, ref.topology, topology.namespace), retry=False)
    if meta is None:
        raise SavepointError(
            f"spec.initialSavepoint: no savepoint {ref.name} of {ref.namespace}/{ref.topology}; take it first "
            f"(annotation elastream.dev/savepoint={ref.name} on that topology) or name one that exists "
            "(status.savepoints lists them)",
            retry=True,
        )
    check_restorable(meta, topology)
    state, positions = store.load_data(meta)  # only now: it may be read; StateLost if its keys are gone
    working = CheckpointStore(client, topology.redis_prefix)
    checkpoint_id = working.next_checkpoint_id()
    working.import_checkpoint(checkpoint_id, state, positions)
    working.clear_source_positions()  # positions published by anything earlier of this name are not ours
    working.complete_checkpoint(
        checkpoint_id,
        {
            "completedAt": (clock or SystemClock()).now(),
            "schedule": initial_schedule(topology).to_dict(),
            "savepoint": ref.key,
        },
        CheckpointScope.of(topology),
    )
    log.info("%s/%s seeded from savepoint %s as %s", topology.namespace, topology.name, ref.key, checkpoint_id)
    return meta


class Savepoints(Protocol):
    """Where savepoints are kept (`RedisSavepoints`; the reconciler's unit tests use an in-memory fake)."""

    def take(self, controller: TopologyController, name: str, share_with: Sequence[str]) -> SavepointMeta: ...

    def delete(self, namespace: str, topology: str, name: str) -> bool: ...

    def list(self, namespace: str, topology: str) -> list[SavepointMeta]: ...

    def restore(self, topology: Topology) -> SavepointMeta | None: ...

    def has_checkpoint(self, topology: Topology) -> bool: ...


@dataclass
class RedisSavepoints:
    """`Savepoints` in Redis, through the operator's connection."""

    client: redis.Redis
    #: the time the seeded checkpoint's record says it completed
    clock: Clock = field(default_factory=SystemClock)

    def take(self, controller: TopologyController, name: str, share_with: Sequence[str]) -> SavepointMeta:
        return take_savepoint(self.client, controller, name, share_with)

    def delete(self, namespace: str, topology: str, name: str) -> bool:
        return SavepointStore(self.client, namespace, topology).delete(name)

    def list(self, namespace: str, topology: str) -> list[SavepointMeta]:
        return SavepointStore(self.client, namespace, topology).list()

    def restore(self, topology: Topology) -> SavepointMeta | None:
        return restore_initial_savepoint(self.client, topology, self.clock)

    def has_checkpoint(self, topology: Topology) -> bool:
        """Whether the topology's prefix holds a completed checkpoint (a seeded savepoint's included)."""
        return CheckpointStore(self.client, topology.redis_prefix).latest_checkpoint() is not None


#: a savepoint whose checkpoint keeps failing is given up after this many attempts (the annotation removed)
MAX_TAKE_ATTEMPTS = 5


@dataclass
class SavepointRequests:
    """The annotations of one topology that ask for savepoints, carried out by its reconcile passes:
    `elastream.dev/savepoint=<name>` takes one (a failed checkpoint retried with backoff, given up after
    `MAX_TAKE_ATTEMPTS`), `elastream.dev/delete-savepoint=<name>` deletes one; each annotation is removed when
    done or refused (a Warning event says why and what to do). `entries` is `status.savepoints`, read from
    Redis on the first pass (an operator restart rebuilds it) and after every change."""

    service: Savepoints
    events: EventSink
    remove_annotation: Callable[[str], None]
    retry_s: float = 5.0
    retry_cap_s: float = 60.0
    clock: Callable[[], float] = field(default=SystemClock().monotonic)
    entries: list[dict[str, Any]] | None = None
    #: the take being retried: (name, failures so far, when the next may start)
    pending: tuple[str, int, float] | None = None

    def reconcile(self, controller: TopologyController, annotations: Mapping[str, str]) -> None:
        """One pass: delete, then take, as annotated; refresh `entries` when they changed. Never raises for
        Redis away (the controller notes it; the next pass tries again)."""
        topology = controller.topology
        try:
            if self.entries is None:
                self.refresh(topology)
            doomed = annotations.get(DELETE_SAVEPOINT_ANNOTATION)
            if doomed is not None:
                self._delete(topology, doomed)
            wanted = annotations.get(SAVEPOINT_ANNOTATION)
            if wanted is None:
                self.pending = None
            elif not controller.state_lost and not controller.store_error:
                self._take(controller, wanted, annotations.get(SHARE_ANNOTATION))
        except redis.RedisError as exc:
            log.debug("savepoints of %s not handled now: %s", topology.name, exc)

    def refresh(self, topology: Topology) -> None:
        self.entries = status_entries(self.service.list(topology.namespace, topology.name))

    def _delete(self, topology: Topology, name: str) -> None:
        if self.service.delete(topology.namespace, topology.name, name):
            self.events.emit(EventReason.SAVEPOINT_DELETED, f"savepoint {name} deleted")
        else:
            self.events.emit(
                EventReason.SAVEPOINT_REFUSED,
                f"annotation {DELETE_SAVEPOINT_ANNOTATION}: no savepoint {name!r} of this topology "
                "(status.savepoints lists them); nothing deleted",
                warning=True,
            )
        self.remove_annotation(DELETE_SAVEPOINT_ANNOTATION)
        self.refresh(topology)

    def _take(self, controller: TopologyController, name: str, share: str | None) -> None:
        now = self.clock()
        pending = self.pending if self.pending is not None and self.pending[0] == name else None
        if pending is not None and now < pending[2]:
            return
        share_with, problem = parse_share_with(share)
        try:
            problem = name_problem(name, f"annotation {SAVEPOINT_ANNOTATION}") or problem
            if problem is not None:
                raise SavepointError(problem, retry=False)
            meta = self.service.take(controller, name, share_with)
        except (SavepointError, redis.RedisError) as exc:
            retry = isinstance(exc, redis.RedisError) or exc.retry
            failures = (pending[1] if pending is not None else 0) + 1
            if retry and failures < MAX_TAKE_ATTEMPTS:
                delay = backoff_delay(failures, self.retry_s, self.retry_cap_s)
                self.pending = (name, failures, now + delay)
                self.events.emit(
                    EventReason.SAVEPOINT_BACKOFF,
                    f"savepoint {name}: attempt {failures} failed ({exc}); retrying in {delay:.0f} s",
                    warning=True,
                )
                return
            self.pending = None
            if retry:
                self.events.emit(
                    EventReason.SAVEPOINT_FAILED,
                    f"savepoint {name} not taken after {failures} attempts: {exc}; annotate "
                    f"{SAVEPOINT_ANNOTATION}={name} again to retry",
                    warning=True,
                )
            else:
                self.events.emit(
                    EventReason.SAVEPOINT_REFUSED,
                    f"annotation {SAVEPOINT_ANNOTATION}={name[:80]}: {exc}",
                    warning=True,
                )
            self.remove_annotation(SAVEPOINT_ANNOTATION)
            return
        self.pending = None
        self.events.emit(
            EventReason.SAVEPOINT_TAKEN,
            f"savepoint {name} taken from checkpoint {meta.checkpoint} ({meta.state_bytes} bytes of state"
            + (f"; shared with {', '.join(meta.shared_with)}" if meta.shared_with else "")
            + ")",
        )
        self.remove_annotation(SAVEPOINT_ANNOTATION)
        self.refresh(controller.topology)
