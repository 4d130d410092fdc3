"""The worker's side of the controller's messages: the control list read by one thread (`dispatch_control`),
messages for an executor handed to it ahead of its input, messages for the node itself (STAGE, UNSTAGE,
SWITCH, STOP) carried out in order through the schedule switch it is given (`ScheduleSwitch`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import redis

from elastream.core.migration_protocol import ControlType
from elastream.runtime.executor import ExecutorLoop
from elastream.store.control import pop_control
from elastream.store.retry import RetryCancelled
from elastream.worker_inputs.user_code import OperatorLoadError

log = logging.getLogger("elastream.worker")


class ScheduleSwitch(Protocol):
    """How the controller's node messages change what a node runs (`worker_generations.Generations`)."""

    def stage_ahead(self, version: int, partial: bool) -> None: ...

    def unstage(self, version: int) -> None: ...

    def switch(
        self, version: int, migration_id: str | None, partial: bool = False, overlapped: bool = False
    ) -> None: ...

    def overlap(self, migration_id: str) -> None: ...

    def warm(self, migration_id: str, wanted: Iterable[tuple[str, str, str]]) -> None: ...


class ControlMessages:
    """A worker's reader of the controller's messages. It owns no state of its own beyond what it is given: it
    reads the node's control list (with its own client from `client_factory`, retried with `redis_call`),
    hands an executor's messages to the `executors` running now, carries out node messages through
    `schedules`, tells `backend_stops` of a STOP, sets the worker's `stop` and reports its own faults to
    `fail`."""

    def __init__(
        self,
        node: str,
        prefix: str,
        stop: threading.Event,
        client_factory: Callable[[], redis.Redis],
        redis_call: Callable[[str, Callable[[], Any]], Any],
        executors: Callable[[], Mapping[str, ExecutorLoop]],
        new_executors: Callable[[], Mapping[str, ExecutorLoop]],
        schedules: ScheduleSwitch,
        backend_stops: Callable[[], None],
        fail: Callable[[str, BaseException | None], None],
    ) -> None:
        self.node = node
        self.prefix = prefix
        self.stop = stop
        self.client_factory = client_factory
        self.redis_call = redis_call
        self.executors = executors
        #: the new instances a key-group migration runs beside the old ones (messages marked `"to": "new"`)
        self.new_executors = new_executors
        self.schedules = schedules
        self.backend_stops = backend_stops
        self.fail = fail

    def dispatch_control(self) -> None:
        """Hand the controller's messages for this node to the executors they name (ahead of their input);
        messages for the node itself (stage, switch, unstage) are carried out here, in order. A Redis outage
        is waited out; a fault of this loop fails the worker."""
        client = self.client_factory()
        try:
            while not self.stop.is_set():
                try:
                    item = self.redis_call(
                        "read its control list", lambda: pop_control(client, self.prefix, self.node, timeout_s=0.5)
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
        running = self.new_executors() if message.get("to") == "new" else self.executors()
        thread = running.get(executor)
        if thread is None:
            log.warning("control message %s for %s, which is not on this node; dropped", message, executor)
            return
        thread.control.put(message)

    def on_node_message(self, message: Mapping[str, Any]) -> None:
        kind = message.get("type")
        version = int(message.get("version", 0))
        scope = message.get("scope")
        partial = scope in ("moving", "keyGroups")
        if kind == ControlType.STAGE:
            self.schedules.stage_ahead(version, partial)
        elif kind == ControlType.UNSTAGE:
            self.schedules.unstage(version)
        elif kind == ControlType.SWITCH:
            self.schedules.switch(version, message.get("mid") or None, partial, overlapped=scope == "keyGroups")
        elif kind == ControlType.OVERLAP:
            self.schedules.overlap(str(message.get("mid")))
        elif kind == ControlType.WARM:
            wanted = [(str(s), str(r), str(e)) for s, r, e in message.get("channels") or []]
            self.schedules.warm(str(message.get("mid")), wanted)
        elif kind == ControlType.STOP:
            self.backend_stops()  # before anything else: a SIGTERM may come between any two lines
            self.stop.set()
            log.info("node %s: stopped by its backend", self.node)
