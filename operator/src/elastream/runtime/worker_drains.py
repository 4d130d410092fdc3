"""The worker's graceful drain: the first SIGTERM of a worker that runs executors asks the controller to move
them off (`store.drain_requests`) and serves on until the switch that takes its node out of the schedule, for at most
the grace period less `core.drain_plan.DRAIN_MARGIN_S`.

Drains are on with a grace period (`--drain-grace`, `ELASTREAM_DRAIN_GRACE_S`; on Kubernetes the pod's
terminationGracePeriodSeconds). The migration's switch after COMMIT takes the node out of the schedule and
the worker stops, exit code 0; at the deadline it stops anyway (a lost worker: the controller rolls back to
the last checkpoint). Redis away, no executors (a node staged for a migration, one still starting), the
parent of a local worker gone, a second SIGTERM or a SIGINT: it stops at once. A STOP message on its
control list (its backend is about to stop it: a suspend, a scale-in, a shutdown) stops it at once too, so
the SIGTERM that follows asks for nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from elastream.core.drain_plan import drain_deadline
from elastream.core.ports import Clock
from elastream.runtime.worker_state import RedisStores
from elastream.store.drain_requests import cancel_drain, request_drain
from elastream.store.retry import is_redis_outage

log = logging.getLogger("elastream.worker")


class Drains:
    """A worker's drain on SIGTERM and its signal handlers. It owns the drain's thread (`draining`) and whether
    the backend stopped the node (`stopped_by_backend`); it may set the worker's `stop`, write and take back
    this node's drain request through its `stores`, and ask whether executors are `running`."""

    def __init__(
        self,
        node: str,
        prefix: str,
        grace_s: float,
        clock: Clock,
        stop: threading.Event,
        stores: RedisStores,
        running: Callable[[], bool],
    ) -> None:
        self.node = node
        self.prefix = prefix
        self.grace_s = grace_s
        self.clock = clock
        self.stop = stop
        self.stores = stores
        self.running = running
        #: the thread waiting for this node's drain, once the first SIGTERM asked for one
        self.draining: threading.Thread | None = None
        #: a STOP came on the control list: a SIGTERM around it is the backend's, not a drain request
        self.stopped_by_backend = False

    def backend_stops(self) -> None:
        """A STOP came from the backend: the SIGTERM that follows (or raced it) asks for no drain."""
        self.stopped_by_backend = True

    def wants_drain(self) -> bool:
        """Whether a SIGTERM now asks for a drain rather than stopping: drains on, none asked yet, not
        stopping, executors running (a staged or starting node has nothing to move), its parent alive."""
        parent = watched_parent()
        return (
            drain_deadline(self.grace_s) > 0
            and self.draining is None
            and not self.stop.is_set()
            and self.running()
            and self.stores.connected
            and (parent is None or os.getppid() == parent)
        )

    def drain(self) -> None:
        """Ask the controller to move this node's executors off, then wait (bounded) for the switch that takes
        the node out of the schedule, which stops the worker; stop anyway at the deadline or when the request
        cannot be written."""
        wait_s = drain_deadline(self.grace_s)
        now = self.clock.now()
        try:
            request_drain(self.stores.client, self.prefix, self.node, now, now + wait_s)
        except Exception as exc:
            if not is_redis_outage(exc):
                log.exception("node %s: the drain request failed", self.node)
            log.warning("node %s: no drain (Redis: %s); stopping", self.node, exc)
            self.stop.set()
            return
        log.info(
            "node %s: drain requested; serving until its executors are moved off (at most %.0f s)", self.node, wait_s
        )
        if self.clock.wait(self.stop, wait_s):
            if self.stopped_by_backend:  # the SIGTERM was its backend's stop, which raced the STOP: no drain
                with contextlib.suppress(Exception):
                    cancel_drain(self.stores.client, self.prefix, self.node)
        else:
            log.warning(
                "node %s: not drained within %.0f s; stopping (the controller rolls back to the last checkpoint)",
                self.node,
                wait_s,
            )
            self.stop.set()

    def install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if signum == signal.SIGTERM and self.wants_drain():
                log.info("node %s: %s, asking for a drain (a second SIGTERM stops at once)", self.node, name)
                self.draining = threading.Thread(target=self.drain, name="drain", daemon=True)
                self.draining.start()
                return
            log.info("node %s: %s, stopping", self.node, name)
            self.stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def join(self, timeout_s: float) -> None:
        """Wait for a drain in progress: it takes back a request the backend's stop made moot (one Redis call)."""
        draining = self.draining
        if draining is not None:
            draining.join(timeout=timeout_s)


def watched_parent() -> int | None:
    """The pid of the local backend that started this worker (it must not outlive it), or None."""
    raw = os.environ.get("ELASTREAM_PARENT_PID", "")
    return int(raw) if raw.isdigit() else None
