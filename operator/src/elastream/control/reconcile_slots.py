"""How many reconcile passes run at once, and why a pass that waits does not count among them.

Every topology's passes share the operator's `--reconcile-workers` slots (`ReconcileSlots`): a pass takes one
before it starts (`ReconcileSlots.running`) and gives it back at its end. A pass that waits — for worker pods
to be ready (a start, a migration's PREPARE and SWITCH, a recovery: up to `--worker-start-timeout`), for a
checkpoint's barriers (a suspend), between retries — waits through the operator's `Clock`, and the clock the
operator hands every controller (`ReconcileSlots.clock`) gives the slot back for as long as it sleeps and
takes one again before the pass goes on. So a topology whose pods never become ready (a wrong image, a quota,
no node that fits) holds a parked thread, not a share of the pool, and every other topology's passes still
find a slot: a stuck topology costs at most its own thread. This is the managed blocking of Java's
`ForkJoinPool.ManagedBlocker`: the pool (`ReconcilePool`) keeps `--reconcile-workers` threads and adds one
when a pass parks and no thread is idle, up to `--waiting-passes` more; passes queue first in, first out.

What a pass holds while it waits must be its topology's own (its `ManagedTopology.lock`, its checkpoint
driver's): a lock shared between topologies held across a wait could leave every slot with a pass blocked on
it while its holder waits for a slot. None of the operator's shared locks (the analysis session's, the
status writers', the user keeper's) is held across a wait.

Checkpoint rounds, the one wait of an idle topology's every pass, do not wait here at all: they span passes
(`control.checkpoint_driver.CheckpointDriver.begin`/`poll`).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from typing import Any, TypeVar

from elastream.core.ports import Clock, StopSignal

T = TypeVar("T")


class ReconcileSlots:
    """At most `size` reconcile passes doing work at once; a pass's waits give its slot back."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"reconcile slots: {size}; give at least 1")
        self.size = size
        self._free = threading.Semaphore(size)
        self._held = threading.local()
        self._lock = threading.Lock()
        #: passes holding a slot now, and the most there ever were (what tests and the benchmark look at)
        self.running_now = 0
        self.running_most = 0
        #: passes waiting with their slot given back, now
        self.parked_now = 0
        #: called (on the parking thread) when a pass parks: the pool adds a thread if none is idle
        self.on_park: Callable[[], None] | None = None

    def holds(self) -> bool:
        """Whether this thread runs a pass that holds a slot."""
        return bool(getattr(self._held, "slot", False))

    @contextmanager
    def running(self) -> Iterator[None]:
        """Hold a slot for the pass this thread runs (re-entrant: a pass within a pass holds the one)."""
        if self.holds():
            yield
            return
        self._take()
        try:
            yield
        finally:
            self._give()

    def parked(self, wait: Callable[[], T]) -> T:
        """Run `wait` with this thread's slot given back (taken again before returning); a thread that holds
        none (the leader elector, a checkpointer of its own) just waits."""
        if not self.holds():
            return wait()
        self._give()
        with self._lock:
            self.parked_now += 1
        if self.on_park is not None:
            self.on_park()
        try:
            return wait()
        finally:
            with self._lock:
                self.parked_now -= 1
            self._take()

    def clock(self, inner: Clock) -> Clock:
        """`inner` whose `sleep` and `wait` give the caller's slot back while they last."""
        return _ParkingClock(inner, self)

    def _take(self) -> None:
        self._free.acquire()
        self._held.slot = True
        with self._lock:
            self.running_now += 1
            self.running_most = max(self.running_most, self.running_now)

    def _give(self) -> None:
        with self._lock:
            self.running_now -= 1
        self._held.slot = False
        self._free.release()


class ReconcilePool(Executor):
    """The threads reconcile passes run on (the kopf daemons' `run_in_executor`): `slots.size` threads, one
    more whenever a pass parks while none is idle (so the passes still queued find a thread while the slot
    it gave back is free), at most `waiting` more in all, each leaving again after a pass once the parked
    passes are back; one first-in first-out queue. A pass takes its slot itself
    (`TopologyReconciler.reconcile`): an idle thread holds none. A pass runs in its submitter's context."""

    def __init__(self, slots: ReconcileSlots, waiting: int, name: str = "reconcile") -> None:
        self.slots = slots
        self.max_threads = slots.size + max(0, waiting)
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None]
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._shutdown = False
        slots.on_park = self._parked
        for _ in range(slots.size):
            self._add_thread()

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("the reconcile pool is shut down")
        future: Future[T] = Future()
        # run in a copy of the submitter's context, as kopf runs a sync handler (asyncio's run_in_executor does
        # not): a pass's log lines name the topology its daemon set (`elastream.log_format.CURRENT_TOPOLOGY`)
        self._queue.put((future, contextvars.copy_context().run, (fn, *args), kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _parked(self) -> None:
        with self._lock:
            if self._idle == 0 and not self._shutdown and len(self._threads) < self.max_threads:
                self._add_thread()

    def _add_thread(self) -> None:
        thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._queue.get()
            with self._lock:
                self._idle -= 1
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the future carries it to the awaiting daemon
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, fn, args, kwargs, item
            with self._lock:
                # a thread added for a parked pass goes once that pass is back: left idle, such threads would
                # take passes from the queue only to wait for a slot (unordered), not in the queue (in order)
                if len(self._threads) > self.slots.size + self.slots.parked_now:
                    self._threads.remove(threading.current_thread())
                    return


class _ParkingClock:
    """A `Clock` whose waits are `ReconcileSlots.parked` (see the module)."""

    def __init__(self, inner: Clock, slots: ReconcileSlots) -> None:
        self.inner = inner
        self.slots = slots

    def now(self) -> float:
        return self.inner.now()

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def sleep(self, seconds: float) -> None:
        self.slots.parked(lambda: self.inner.sleep(seconds))

    def wait(self, stop: StopSignal, seconds: float) -> bool:
        return self.slots.parked(lambda: self.inner.wait(stop, seconds))
