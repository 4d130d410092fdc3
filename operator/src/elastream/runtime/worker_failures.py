"""The worker's failure path, for faults of its own code: an executor or source thread, the control dispatcher
or the main loop that dies of an exception that is not a user operator's (those are counted in `errors`)
logs it with the traceback, takes the node's readiness back (the /ready probe fails, its `ready:<version>`
mark goes) and exits with `EXIT_INTERNAL_ERROR` (70) within seconds, so the backend sees a failed worker
and recovery starts."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable

from elastream.runtime.executor import ExecutorLoop
from elastream.runtime.worker_state import RedisStores

log = logging.getLogger("elastream.worker")

#: the exit code of a worker whose own code failed (an executor's loop, the control dispatcher, the main
#: loop died of an exception): sysexits' EX_SOFTWARE, "internal software error"
EXIT_INTERNAL_ERROR = 70
#: how long a failed worker's orderly shutdown may take before the process exits anyway
FAILURE_EXIT_S = 10.0


class FailurePath:
    """A worker's failure path: it owns what failed first (`failed`), sets the worker's `stop` and, on the way
    out, takes the node's readiness marks back (its `stores`' registry, the `versions` it is marked for) and
    runs the worker's `shutdown` under a watchdog."""

    def __init__(
        self,
        node: str,
        stop: threading.Event,
        stores: RedisStores,
        versions: Callable[[], Iterable[int]],
        shutdown: Callable[[], None],
    ) -> None:
        self.node = node
        self.stop = stop
        self.stores = stores
        self.versions = versions
        self.shutdown = shutdown
        #: what failed (an executor, "the control dispatcher", "the main loop"), when the worker's own code did:
        #: it exits with EXIT_INTERNAL_ERROR and is not ready
        self.failed: str | None = None

    def executor_failed(self, thread: ExecutorLoop) -> None:
        """An executor's loop died (it logged the traceback): the worker fails."""
        self.fail(f"executor {thread.executor}", None)

    def fail(self, what: str, exc: BaseException | None) -> None:
        """The worker's own code failed in `what` (logged here with the traceback unless `exc` is None: the
        failing thread logged it): stop, so that `run` takes readiness back and exits with
        `EXIT_INTERNAL_ERROR`. The first failure is the one reported."""
        if exc is not None:
            log.critical("node %s: %s failed: %s: %s", self.node, what, type(exc).__name__, exc, exc_info=exc)
        if self.failed is None:
            self.failed = what
        self.stop.set()

    def exit_failed(self) -> int:
        """Take the node's readiness back, stop what can be stopped within `FAILURE_EXIT_S` (then exit
        regardless) and return `EXIT_INTERNAL_ERROR`."""
        log.error(
            "node %s: %s failed; not ready, exiting with code %d so that recovery starts",
            self.node,
            self.failed,
            EXIT_INTERNAL_ERROR,
        )
        watchdog = threading.Timer(FAILURE_EXIT_S, _exit_now, args=(self.node,))
        watchdog.daemon = True
        watchdog.start()
        self.unmark_ready()
        self.shutdown()
        watchdog.cancel()
        return EXIT_INTERNAL_ERROR

    def unmark_ready(self) -> None:
        """Remove this node's ready and staged marks (one attempt each: a failed worker does not wait for
        Redis; its exit tells the backend anyway)."""
        if not self.stores.connected:  # failed before it connected
            return
        for version in set(self.versions()):
            try:
                self.stores.registry.unmark(version, self.node)
            except Exception as exc:
                log.warning("node %s: could not take back its ready mark of version %d: %s", self.node, version, exc)


def _exit_now(node: str) -> None:
    """A failed worker whose shutdown hangs (a socket that will not close) exits anyway."""
    log.critical("node %s: shutdown did not finish within %.0f s; exiting now", node, FAILURE_EXIT_S)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(EXIT_INTERNAL_ERROR)
