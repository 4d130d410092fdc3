"""The worker's side of the controller's messages and of a migration: the control list read by one thread
(`dispatch_control`), messages for an executor handed to it ahead of its input, messages for the node itself
(STAGE, UNSTAGE, SWITCH, STOP) carried out in order, and the schedule switch that moves a node's executors
from one generation to the next. Methods of `Worker`, kept apart by concern."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from elastream.core.migration_protocol import ControlType, ExecutorParticipant
from elastream.core.migration_scope import migration_parts
from elastream.core.topology import split_executor_id
from elastream.runtime.participant import Migration
from elastream.runtime.transport import learned_windows
from elastream.runtime.worker_state import WorkerState
from elastream.store.control import pop_control
from elastream.store.retry import RetryCancelled
from elastream.worker_inputs.user_code import OperatorLoadError

log = logging.getLogger("elastream.worker")


class ControlMessages(WorkerState):
    """`Worker`'s handling of the controller's messages and its part in migrations."""

    def migration_in_progress(self) -> str | None:
        """The migration whose INIT this worker's executors must wait for: one that has passed COMMIT (its
        state is in Redis and this worker runs the schedule it moves to)."""
        mid: str | None = self.redis_call("read the migration in progress", self.store.current)
        if mid is None:
            return None
        phase = self.redis_call("read the migration record", lambda: self.store.record(mid)).get("phase")
        if phase in ("rebalancing", "initializing"):
            log.info("migration %s in progress: executors wait for INIT", mid)
            return mid
        return None

    def _migration_for(
        self, executor: str, parallelism: Mapping[str, int], awaiting: str | None, stop: threading.Event
    ) -> Migration:
        vertex = split_executor_id(executor)[0]
        parents = self.topology.parents(vertex)
        upstream = frozenset(f"{p}#{i}" for p in parents for i in range(parallelism[p]))
        inputs = {p: (self.topology.stream(p, vertex).grouping, self.topology.stream(p, vertex).key) for p in parents}
        return Migration(
            executor=executor,
            store=self.store,
            participant=ExecutorParticipant(executor, upstream),
            inputs=inputs,
            max_parallelism=self.topology.vertices[vertex].max_parallelism,
            awaiting=awaiting,
            stop=stop,
        )

    def dispatch_control(self) -> None:
        """Hand the controller's messages for this node to the executors they name (ahead of their input);
        messages for the node itself (stage, switch, unstage) are carried out here, in order. A Redis outage
        is waited out; a fault of this loop fails the worker."""
        client = self.client_factory()
        prefix = self.topology.redis_prefix
        try:
            while not self.stop.is_set():
                try:
                    item = self.redis_call(
                        "read its control list", lambda: pop_control(client, prefix, self.node, timeout_s=0.5)
                    )
                except RetryCancelled:
                    break
                except (ValueError, KeyError, TypeError) as exc:  # popped, but not a message: drop it
                    log.error("node %s: a malformed control message was dropped: %s", self.node, exc)
                    continue
                if item is not None:
                    self.dispatch(*item)
        except Exception as exc:
            self.fail("the control dispatcher", exc)
        finally:
            client.close()

    def dispatch(self, executor: str, message: dict[str, Any]) -> None:
        if not executor:
            try:
                self.on_node_message(message)
            except RetryCancelled:
                pass  # stopping
            except OperatorLoadError as exc:  # reported in the log; the controller times the step out
                log.error("node %s: %s failed: %s", self.node, message.get("type"), exc)
            except Exception as exc:
                if message.get("type") != ControlType.SWITCH:
                    # a STAGE or UNSTAGE that failed leaves the running executors as they were: the
                    # controller times the step out
                    log.exception("node %s: %s failed: %s", self.node, message.get("type"), exc)
                else:  # half switched: this node's executors are in no known state
                    self.fail(f"the switch to schedule version {message.get('version')}", exc)
            return
        current = self.current
        thread = current.by_executor().get(executor) if current is not None else None
        if thread is None:
            log.warning("control message %s for %s, which is not on this node; dropped", message, executor)
            return
        thread.control.put(message)

    def on_node_message(self, message: Mapping[str, Any]) -> None:
        kind = message.get("type")
        version = int(message.get("version", 0))
        if kind == ControlType.STAGE:
            found = self.redis_call("read a staged schedule", lambda: self.registry.schedule_version(version))
            if found is None:
                raise OperatorLoadError(f"staged schedule version {version} is not in Redis")
            self.discard_staged()
            keep = self.current if message.get("scope") == "moving" else None
            staged_version, schedule = found
            self.staged = self.stage(staged_version, schedule, keep=keep)
            self.redis_call("mark itself staged", lambda: self.registry.mark_staged(version, self.node))
        elif kind == ControlType.UNSTAGE:
            if self.staged is not None and self.staged.version == version:
                self.discard_staged()
                if self.current is None:  # started only for the staged schedule: nothing left to run
                    log.info("node %s: staged schedule version %d discarded; stopping", self.node, version)
                    self.stop.set()
        elif kind == ControlType.SWITCH:
            self.switch(version, message.get("mid") or None, message.get("scope") == "moving")
        elif kind == ControlType.STOP:
            self.stopped_by_backend = True  # before anything else: a SIGTERM may come between any two lines
            self.stop.set()
            log.info("node %s: stopped by its backend", self.node)

    def discard_staged(self) -> None:
        staged, self.staged = self.staged, None
        if staged is not None:
            for inbox in staged.inboxes.values():
                inbox.close()

    def switch(self, version: int, migration_id: str | None, partial: bool = False) -> None:
        """Load schedule `version` in place: stop this node's executors of the running schedule (after a
        migration's COMMIT they are checkpointed and idle), start the ones the new schedule places here,
        waiting for INIT of `migration_id`, or stop the process when the node is no longer in it. `partial`
        (a migration of scope `moving`): the executors that stay as they are (`core.migration_scope`) run
        on, untouched but for their outputs and upstream (REROUTE); only the others stop and start."""
        found = self.redis_call("read the new schedule", lambda: self.registry.schedule_version(version))
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
