"""A worker's generations of executors: the one running now and the one staged ahead of a migration. A
generation is staged (operators made, inboxes bound, endpoints registered, nothing running), activated
(outputs connected, threads started, the node marked ready), switched to in place when the controller says
so (all executors, or for a migration of scope `moving` only those that move: the others run on and are
rerouted) and retired (threads stopped, sockets closed, the sources' positions published)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis
import zmq

from elastream.core.keygroup_batches import WARM_WAIT_S, Recipient
from elastream.core.migration_protocol import ControlType, ExecutorParticipant
from elastream.core.migration_scope import migration_parts
from elastream.core.ports import Clock
from elastream.core.schedule import Schedule, key_group_ranges
from elastream.core.topology import Topology, split_executor_id
from elastream.runtime.executor import ExecutorLoop, ExecutorThread
from elastream.runtime.keygroup_migration import is_stateful
from elastream.runtime.operators.api import Context
from elastream.runtime.operators.cpu import NodeCpu
from elastream.runtime.operators.loading import make_operator
from elastream.runtime.participant import Migration
from elastream.runtime.routing import OpenChannel, Router, build_outputs
from elastream.runtime.source_thread import SourceThread
from elastream.runtime.transport import (
    INITIAL_WINDOW,
    Channel,
    DataPlaneStats,
    Inbox,
    WarmChannels,
    await_handshakes,
    learned_windows,
)
from elastream.runtime.worker_metrics import source_positions
from elastream.runtime.worker_state import Generation, RedisStores, RedisWaits, WorkerOptions
from elastream.store.metric_stream import metric_stream_maxlen
from elastream.store.retry import RetryCancelled
from elastream.worker_inputs.rate_files import resolve_rate_file
from elastream.worker_inputs.user_code import OperatorLoadError

log = logging.getLogger("elastream.worker")


class Generations:
    """A node's executors, by generation. It owns the running generation (`current`), the staged one
    (`staged`) and the lock a switch holds; it may read the topology and the worker's options, bind inboxes
    on the worker's ZeroMQ context (counting into its `data_plane`), make operators (with `client_factory`
    and `cpu`), read and write the registry and checkpoint store through `stores` (waiting with `waits`),
    set the worker's `stop` when the node leaves the schedule, report an executor's death to `on_failure`
    and ask whether the worker has `failed` (never ready then)."""

    def __init__(
        self,
        topology: Topology,
        options: WorkerOptions,
        clock: Clock,
        stop: threading.Event,
        stores: RedisStores,
        waits: RedisWaits,
        sockets: zmq.Context[Any],
        data_plane: DataPlaneStats,
        cpu: NodeCpu,
        client_factory: Callable[[], redis.Redis],
        on_failure: Callable[[ExecutorLoop], None],
        failed: Callable[[], bool],
    ) -> None:
        self.topology = topology
        self.options = options
        self.node = options.node
        self.clock = clock
        self.stop = stop
        self.stores = stores
        self.waits = waits
        self.sockets = sockets
        self.data_plane = data_plane
        self.cpu = cpu
        self.client_factory = client_factory
        self.on_failure = on_failure
        self.failed = failed
        #: the generation running now, and the one staged ahead of a migration (inboxes bound, idle)
        self.current: Generation | None = None
        self.staged: Generation | None = None
        #: this node's senders' channels to a key-group migration's new instances, opened ahead of its FLIPs
        self.warm_channels = WarmChannels()
        self.warm_for: str | None = None
        self._switching = threading.Lock()

    @property
    def threads(self) -> list[ExecutorThread | SourceThread]:
        current = self.current
        return list(current.threads) if current is not None else []

    def running(self) -> Mapping[str, ExecutorThread | SourceThread]:
        """The executors running now, by id (those the controller's messages go to)."""
        current = self.current
        return current.by_executor() if current is not None else {}

    def marked_versions(self) -> set[int]:
        """The schedule versions this node is marked ready or staged for."""
        return {g.version for g in (self.current, self.staged) if g is not None}

    # ----------------------------------------------------------------------------------- stage and activate

    def migration_in_progress(self) -> str | None:
        """The migration whose INIT this worker's executors must wait for: one that has passed COMMIT (its
        state is in Redis and this worker runs the schedule it moves to)."""
        store = self.stores.store
        mid: str | None = self.waits.redis_call("read the migration in progress", store.current)
        if mid is None:
            return None
        phase = self.waits.redis_call("read the migration record", lambda: store.record(mid)).get("phase")
        if phase in ("rebalancing", "initializing"):
            log.info("migration %s in progress: executors wait for INIT", mid)
            return mid
        return None

    def stage(self, version: int, schedule: Schedule, keep: Generation | None = None) -> Generation:
        """Make this node's operators of `schedule` and bind their inboxes; register the endpoints under
        `version`. Nothing runs yet: a migration stages the new schedule before it pauses anything. With
        `keep` (a partial migration's: the running generation) the executors it runs that stay as they are
        (`core.migration_scope`) are not made again: their inboxes are registered under `version` too."""
        if self.node not in schedule.nodes:
            raise OperatorLoadError(f"node {self.node} is not in schedule version {version}; nothing to run")
        parallelism = schedule.parallelism()
        kept_executors: set[str] = set()
        if keep is not None:
            parts = migration_parts(self.topology, keep.schedule, schedule, "moving")
            kept_executors = {t.executor for t in keep.threads} & parts.kept
        kept = {e: box for e, box in (keep.inboxes if keep is not None else {}).items() if e in kept_executors}
        mine = [e for e in schedule.executors_on(self.node) if e not in kept_executors]
        stops = {executor: threading.Event() for executor in mine}
        operators: dict[str, tuple[Any, Context]] = {}
        for executor in mine:
            vertex_name, index = split_executor_id(executor)
            vertex = self.topology.vertices[vertex_name]
            k = parallelism[vertex_name]
            context = Context(
                vertex=vertex_name,
                index=index,
                parallelism=k,
                max_parallelism=vertex.max_parallelism,
                config=resolve_rate_file(vertex, self.options.manifest_dir),
                key_groups=key_group_ranges(vertex.max_parallelism, k)[index],
                node_cpu=self.cpu,
                stop=stops[executor],
            )
            operators[executor] = (make_operator(vertex, self.client_factory, self.topology.redis_prefix), context)
        inboxes: dict[str, Inbox] = {}
        receivers = [e for e in mine if self.topology.vertices[split_executor_id(e)[0]].kind != "source"]
        ports = self._ports_for(version, len(receivers), {box.endpoint.rpartition(":")[2] for box in kept.values()})
        try:
            for executor, port in zip(receivers, ports, strict=True):
                inboxes[executor] = Inbox(
                    self.sockets,
                    self.options.host,
                    port,
                    self.options.address,
                    self.options.data_plane,
                    self.data_plane,
                )
        except zmq.ZMQError:
            for inbox in inboxes.values():
                inbox.close()
            raise
        endpoints = {e: box.endpoint for e, box in (inboxes | kept).items()}
        registry = self.stores.registry
        try:
            self.waits.redis_call("register its endpoints", lambda: registry.register_endpoints(version, endpoints))
        except BaseException:
            for inbox in inboxes.values():
                inbox.close()
            raise
        return Generation(version, schedule, operators, inboxes, stops)

    def activate(self, generation: Generation) -> bool:
        """Connect `generation`'s outputs to the registered endpoints of its downstream executors, build its
        threads and start them; False when stopped while waiting for endpoints."""
        kept = list(generation.threads)  # the kept threads of a partial switch
        endpoints = self._endpoints(generation, list(generation.operators) + [t.executor for t in kept])
        if endpoints is None:
            return False
        open_channel = self._opener(generation)
        parallelism = generation.schedule.parallelism()
        for running in kept:  # a partial switch: the kept threads take the new schedule's outputs and upstream
            running.control.put(self._reroute(running, parallelism, endpoints, open_channel))
        for executor in generation.operators:
            generation.threads.append(self._thread(generation, executor, endpoints, open_channel, generation.awaiting))
        for thread in generation.threads:
            if thread not in kept:
                thread.start()
        return self._mark_ready(generation)

    def _endpoints(self, generation: Generation, senders: list[str]) -> dict[str, str] | None:
        """The registered endpoints of every executor `senders` send to under `generation`'s schedule, once all
        are registered; None when stopped while waiting."""
        schedule, version = generation.schedule, generation.version
        registry = self.stores.registry
        parallelism = schedule.parallelism()
        needed = {
            f"{child}#{i}"
            for executor in senders
            for child in self.topology.children(split_executor_id(executor)[0])
            for i in range(parallelism[child])
        }
        found: dict[str, dict[str, str]] = {"endpoints": {}}

        def all_endpoints() -> bool:  # wait_for waits out a Redis outage
            found["endpoints"] = registry.endpoints(version)
            return needed <= set(found["endpoints"])

        def missing() -> str:
            absent = sorted(needed - set(found["endpoints"]))
            nodes = sorted({schedule.node_of(e) for e in absent})
            return f"endpoints of {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''} (on {', '.join(nodes)})"

        if not self.waits.wait_for(missing, all_endpoints, poll_s=0.005, stop=generation.stop):
            return None
        return found["endpoints"]

    def _opener(self, generation: Generation) -> OpenChannel:
        def open_channel(sender: str, receiver: str, endpoint: str) -> Channel:
            warmed = self.warm_channels.take(sender, receiver, endpoint)
            if warmed is not None:  # opened ahead (WARM): its handshake is done
                return warmed
            window = generation.windows.get((sender, split_executor_id(receiver)[0]), INITIAL_WINDOW)
            return Channel(self.sockets, sender, receiver, endpoint, self.options.data_plane, window)

        return open_channel

    def _thread(
        self,
        generation: Generation,
        executor: str,
        endpoints: Mapping[str, str],
        open_channel: OpenChannel,
        awaiting: str | None,
    ) -> ExecutorThread | SourceThread:
        """The thread of one of `generation`'s executors, its outputs connected, not started."""
        vertex_name, _ = split_executor_id(executor)
        parallelism = generation.schedule.parallelism()
        operator, context = generation.operators[executor]
        stop = generation.stops[executor]
        outputs = build_outputs(self.topology, executor, parallelism, endpoints, open_channel)
        router = Router(outputs, stop, open_channel)
        migration = self._migration_for(executor, parallelism, awaiting, stop)
        if self.topology.vertices[vertex_name].kind == "source":
            source = SourceThread(executor, operator, context, router, stop, migration, self.on_failure)
            source.paused.set()  # until every node is ready (and, during a migration, until RESUME)
            return source
        is_sink = self.topology.vertices[vertex_name].kind == "sink"
        inbox = generation.inboxes[executor]
        return ExecutorThread(executor, operator, context, inbox, router, stop, is_sink, migration, self.on_failure)

    def _mark_ready(self, generation: Generation) -> bool:
        """`generation` runs: register the worker and mark the node ready (never after an executor died)."""
        schedule, version = generation.schedule, generation.version
        registry = self.stores.registry
        # about an hour of samples for the executors that actually run, at the actual interval
        self.stores.metrics.maxlen = metric_stream_maxlen(len(schedule), self.options.interval_s)
        self.current = generation
        info = {
            "pid": os.getpid(),
            "host": self.options.address,
            "metricsPort": self.options.metrics_port,
            "version": version,
            "startedAt": self.clock.now(),
        }
        self.waits.redis_call("register itself", lambda: registry.register_worker(self.node, info), generation.stop)
        if self.failed():  # an executor died already: never say ready
            return False
        self.waits.redis_call("mark itself ready", lambda: registry.mark_ready(version, self.node), generation.stop)
        log.info(
            "node %s ready: %d executors (schedule version %d%s)",
            self.node,
            len(generation.threads),
            version,
            f", waiting for INIT of migration {generation.awaiting}" if generation.awaiting else "",
        )
        return True

    # ------------------------------------------------------------------------ a migration of scope keyGroups

    def overlap(self, migration_id: str) -> None:
        """OVERLAP (a migration of scope `keyGroups`, `core.keygroup_batches`): start the staged generation's
        executors now, beside the running ones. Each new instance awaits every key group it will own (its
        donors ship them in band); a new source stays paused until its old instance hands its position over.
        Acked with the staged version (a repeated OVERLAP is acked again, nothing started twice)."""
        with self._switching:
            staged = self.staged
            if staged is None:
                raise OperatorLoadError(f"node {self.node}: OVERLAP of migration {migration_id}, but nothing is staged")
            if not staged.overlapping:
                endpoints = self._endpoints(staged, list(staged.operators))
                if endpoints is None:
                    return
                open_channel = self._opener(staged)
                for executor in staged.operators:
                    is_source = self.topology.vertices[split_executor_id(executor)[0]].kind == "source"
                    thread = self._thread(
                        staged, executor, endpoints, open_channel, migration_id if is_source else None
                    )
                    if not is_source:
                        thread.batching.recipient = Recipient(set(thread.context.key_groups))
                        thread.batching.hold_unkeyed = is_stateful(thread.operator)
                    staged.threads.append(thread)
                for thread in staged.threads:
                    thread.start()
                staged.overlapping = True
                log.info(
                    "node %s: %d new executor instances run beside the old ones (migration %s)",
                    self.node,
                    len(staged.threads),
                    migration_id,
                )
        store, info = self.stores.store, {"version": staged.version}
        self.waits.redis_call("ack OVERLAP", lambda: store.ack(migration_id, "overlap", self.node, info))

    def warm(self, migration_id: str, wanted: Iterable[tuple[str, str, str]]) -> None:
        """WARM (a migration of scope `keyGroups`): open the channels of this node's running senders to the new
        instances they will send to, (sender, receiver, endpoint) of `wanted`, before the FLIPs that route
        there, and wait at most `WARM_WAIT_S` for their handshakes. Acked either way: a channel whose handshake
        is late only delays its first frames, as it did when FLIP opened it."""
        if self.warm_for != migration_id:  # what an earlier migration opened and never used (it was aborted)
            self.warm_channels.close()
            self.warm_for = migration_id
        current, opened = self.current, []
        if current is not None:
            running, open_channel = current.by_executor(), self._opener(current)
            # the opener takes a channel already in the pool first: a repeated WARM opens nothing twice
            opened = [open_channel(s, r, e) for s, r, e in wanted if s in running]
        ready = await_handshakes(opened, WARM_WAIT_S)
        self.warm_channels.put(opened)
        log.info(
            "node %s: %d channels to new instances opened ahead of migration %s, %d handshaken",
            self.node,
            len(opened),
            migration_id,
            ready,
        )
        store, info = self.stores.store, {"opened": len(opened), "handshaken": ready}
        self.waits.redis_call("ack WARM", lambda: store.ack(migration_id, "warmed", self.node, info))

    def overlapping(self) -> Mapping[str, ExecutorThread | SourceThread]:
        """The new instances an OVERLAP started, by id (the controller's messages marked for them go there)."""
        staged = self.staged
        return staged.by_executor() if staged is not None and staged.overlapping else {}

    def start_sources_when_all_ready(self, generation: Generation) -> None:
        """Start the sources once every node of the schedule is ready (during a migration the controller
        resumes them after INIT instead)."""
        nodes = set(generation.schedule.nodes)
        registry = self.stores.registry
        ready = self.waits.wait_for(
            "every node to be ready",
            lambda: registry.ready_nodes(generation.version) >= nodes,
            stop=generation.stop,
        )
        if ready and generation.awaiting is None:
            for thread in generation.threads:
                if isinstance(thread, SourceThread):
                    thread.paused.clear()

    def _migration_for(
        self, executor: str, parallelism: Mapping[str, int], awaiting: str | None, stop: threading.Event
    ) -> Migration:
        vertex = split_executor_id(executor)[0]
        parents = self.topology.parents(vertex)
        upstream = frozenset(f"{p}#{i}" for p in parents for i in range(parallelism[p]))
        inputs = {p: (self.topology.stream(p, vertex).grouping, self.topology.stream(p, vertex).key) for p in parents}
        return Migration(
            executor=executor,
            store=self.stores.store,
            participant=ExecutorParticipant(executor, upstream),
            inputs=inputs,
            max_parallelism=self.topology.vertices[vertex].max_parallelism,
            awaiting=awaiting,
            stop=stop,
        )

    def _reroute(
        self,
        thread: ExecutorThread | SourceThread,
        parallelism: Mapping[str, int],
        endpoints: Mapping[str, str],
        open_channel: OpenChannel,
    ) -> dict[str, Any]:
        """The REROUTE a kept thread of a partial switch gets: its outputs under the new schedule (None when
        its receivers are the same; a channel to a receiver that stays is the same object, its credit and
        order intact) and its upstream executors."""
        existing = {(c.receiver, c.endpoint): c for c in thread.router.channels()}

        def reuse(sender: str, receiver: str, endpoint: str) -> Channel:
            return existing.get((receiver, endpoint)) or open_channel(sender, receiver, endpoint)

        vertex = split_executor_id(thread.executor)[0]
        wanted = {
            (f"{child}#{i}", endpoints[f"{child}#{i}"])
            for child in self.topology.children(vertex)
            for i in range(parallelism[child])
        }
        outputs = None
        if wanted != set(existing):
            outputs = build_outputs(self.topology, thread.executor, parallelism, endpoints, reuse)
        upstream = {f"{p}#{i}" for p in self.topology.parents(vertex) for i in range(parallelism[p])}
        return {"type": ControlType.REROUTE, "outputs": outputs, "upstream": upstream}

    def _ports_for(self, version: int, count: int, taken: set[str]) -> list[int]:
        """Ports for `count` new inboxes. Inboxes of `--bind HOST:PORT` sit at PORT+1+slot for odd schedule
        versions and one block of `slotsPerNode` higher for even ones: a node restarted under the same
        version binds the same ports (its peers reconnect to it), and a staged version never collides with
        the running one (the backend gives consecutive versions different parities). The inboxes a partial
        migration keeps (`taken`, as text) stay where they are; new ones take the free ports of both blocks,
        their version's first. 0 (the OS picks) without a port."""
        if not self.options.port:
            return [0] * count
        slots = self.topology.slots_per_node
        blocks = [version % 2, 1 - version % 2]
        ports = [self.options.port + 1 + block * slots + slot for block in blocks for slot in range(slots)]
        return [p for p in ports if str(p) not in taken][:count]

    # ------------------------------------------------------------------------- the controller's node messages

    def stage_ahead(self, version: int, partial: bool) -> None:
        """STAGE: stage schedule `version` beside the running one (`partial`: keeping the executors a migration
        of scope `moving` leaves as they are) and mark the node staged."""
        registry = self.stores.registry
        found = self.waits.redis_call("read a staged schedule", lambda: registry.schedule_version(version))
        if found is None:
            raise OperatorLoadError(f"staged schedule version {version} is not in Redis")
        self.discard_staged()
        keep = self.current if partial else None
        staged_version, schedule = found
        self.staged = self.stage(staged_version, schedule, keep=keep)
        self.waits.redis_call("mark itself staged", lambda: registry.mark_staged(version, self.node))

    def unstage(self, version: int) -> None:
        """UNSTAGE: discard staged schedule `version`; a node started only for it stops."""
        if self.staged is not None and self.staged.version == version:
            self.discard_staged()
            if self.current is None:  # started only for the staged schedule: nothing left to run
                log.info("node %s: staged schedule version %d discarded; stopping", self.node, version)
                self.stop.set()

    def discard_staged(self) -> None:
        """Drop the staged generation; the new instances an OVERLAP started stop (what they received is rolled
        back with the rest of the topology: a key-group migration that does not finish ends in a rollback)."""
        staged, self.staged = self.staged, None
        self.warm_channels.close()  # the migration they were opened for ends without its new instances
        if staged is not None:
            if staged.threads:
                staged.halt()
                join(staged.threads, 5.0, self.clock)
                for thread in staged.threads:
                    for channel in thread.router.channels():
                        channel.close(0)
            for inbox in staged.inboxes.values():
                inbox.close()

    def switch(self, version: int, migration_id: str | None, partial: bool = False, overlapped: bool = False) -> None:
        """Load schedule `version` in place: stop this node's executors of the running schedule (after a
        migration's COMMIT they are checkpointed and idle), start the ones the new schedule places here,
        waiting for INIT of `migration_id`, or stop the process when the node is no longer in it. `partial`
        (a migration of scope `moving`): the executors that stay as they are (`core.migration_scope`) run
        on, untouched but for their outputs and upstream (REROUTE); only the others stop and start.
        `overlapped` (a migration of scope `keyGroups`): the new instances run already (OVERLAP) and own every
        key group; the old instances they replace, idle now, stop, and the kept ones join the new generation."""
        try:
            self._switch(version, migration_id, partial, overlapped)
        finally:  # the migration's FLIPs are over: what no sender took (one that failed midway) is not needed
            self.warm_channels.close()

    def _switch(self, version: int, migration_id: str | None, partial: bool, overlapped: bool) -> None:
        registry = self.stores.registry
        found = self.waits.redis_call("read the new schedule", lambda: registry.schedule_version(version))
        if found is None:
            raise OperatorLoadError(f"schedule version {version} is not in Redis")
        _, schedule = found
        started = time.perf_counter()
        with self._switching:
            old = self.current
            learned = learned_windows(c for t in old.threads for c in t.router.channels()) if old is not None else {}
            if old is not None and old.version == version:
                # the controller sent this switch again (Redis went away while it applied the schedule): this
                # node runs that version already; binding its inboxes a second time would fail
                log.info(
                    "node %s: already runs schedule version %d; the repeated switch is ignored", self.node, version
                )
                return
            if self.node not in schedule.nodes:
                if old is not None:
                    self.retire(old)
                self.current = None
                log.info("node %s: not in schedule version %d; stopping", self.node, version)
                self.stop.set()
                return
            staged = self.staged if self.staged is not None and self.staged.version == version else None
            if overlapped:
                if staged is None or not staged.overlapping:
                    raise OperatorLoadError(
                        f"node {self.node}: switch to schedule version {version} of a key-group migration, but its "
                        "new executor instances are not running here"
                    )
                self.staged = None
                adopted: list[ExecutorThread | SourceThread] = []
                if old is not None:  # (a node the migration adds runs nothing else)
                    kept = migration_parts(self.topology, old.schedule, schedule, "moving").kept
                    self.retire(old, [t.executor for t in old.threads if t.executor not in kept])
                    adopted = [t for t in old.threads if t.executor in kept]
                for thread in adopted:
                    assert old is not None
                    staged.stops[thread.executor] = old.stops[thread.executor]
                    if thread.executor in old.inboxes:
                        staged.inboxes[thread.executor] = old.inboxes[thread.executor]
                self._adopt(staged, adopted)
                log.info(
                    "node %s switched to schedule version %d in %.0f ms (key groups moved in band)",
                    self.node,
                    version,
                    (time.perf_counter() - started) * 1000.0,
                )
                return
            if staged is None:
                self.discard_staged()
            self.staged = None
            if partial and old is not None:
                generation = staged or self.stage(version, schedule, keep=old)
                kept = migration_parts(self.topology, old.schedule, schedule, "moving").kept
                self.retire(old, [t.executor for t in old.threads if t.executor not in kept])
                for thread in old.threads:
                    if thread.executor in kept:
                        generation.threads.append(thread)
                        generation.stops[thread.executor] = old.stops[thread.executor]
                        if thread.executor in old.inboxes:
                            generation.inboxes[thread.executor] = old.inboxes[thread.executor]
            else:
                if old is not None:
                    self.retire(old)
                generation = staged or self.stage(version, schedule)
            generation.awaiting = migration_id
            generation.windows = learned
            self.activate(generation)
        log.info(
            "node %s switched to schedule version %d in %.0f ms%s",
            self.node,
            version,
            (time.perf_counter() - started) * 1000.0,
            "" if staged is None else " (staged ahead)",
        )

    def _adopt(self, generation: Generation, kept: list[ExecutorThread | SourceThread]) -> None:
        """The end of an overlapped switch: the kept threads join `generation` with the new schedule's outputs
        and upstream (REROUTE: every key group's owner is the new schedule's already), and it runs."""
        endpoints = self._endpoints(generation, [t.executor for t in kept])
        if endpoints is None:
            return
        open_channel = self._opener(generation)
        parallelism = generation.schedule.parallelism()
        for running in kept:
            running.control.put(self._reroute(running, parallelism, endpoints, open_channel))
            generation.threads.append(running)
        self._mark_ready(generation)

    # ------------------------------------------------------------------------------------------------ stop

    def retire(self, generation: Generation, executors: Iterable[str] | None = None) -> None:
        """Stop a generation's threads (or only those of `executors`: a partial switch) and close their
        sockets. In a migration they are checkpointed (state and captured events committed) and idle; a
        source's final position is published for `restart`'s count."""
        if executors is None:
            generation.halt()
            threads = list(generation.threads)
        else:
            leaving = set(executors)
            threads = [t for t in generation.threads if t.executor in leaving]
            for executor in leaving:
                generation.stops[executor].set()
        join(threads, 5.0, self.clock)
        positions = source_positions(threads)
        store = self.stores.store
        with contextlib.suppress(RetryCancelled):  # only a stopping worker gives up on them
            self.waits.redis_call("publish source positions", lambda: store.publish_positions(positions))
        for thread in threads:
            for channel in thread.router.channels():
                channel.close(0)
            inbox = generation.inboxes.get(thread.executor)
            if inbox is not None:
                inbox.close()

    def close(self, last_words: Callable[[Generation], None]) -> None:
        """The worker stops: halt the running generation, let `last_words` publish what it can of it (best
        effort), close every socket of it and discard the staged one."""
        with self._switching:
            current, self.current = self.current, None
            self.warm_channels.close()
            if current is not None:
                current.halt()
                join(current.threads, 5.0, self.clock)
                with contextlib.suppress(Exception):  # best effort on the way out
                    last_words(current)
                for thread in current.threads:
                    for channel in thread.router.channels():
                        channel.close(0)
                for inbox in current.inboxes.values():
                    inbox.close()
            self.discard_staged()


def join(threads: Iterable[threading.Thread], timeout_s: float, clock: Clock) -> None:
    """Join `threads` within `timeout_s` in all (a thread stuck past it is a daemon: it dies with the process)."""
    deadline = clock.monotonic() + timeout_s
    for thread in threads:
        if thread.is_alive():
            thread.join(timeout=max(0.0, deadline - clock.monotonic()))
