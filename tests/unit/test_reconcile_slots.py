"""`control.reconcile_slots`: at most `size` passes do work at once, and a pass that waits through the
operator's clock gives its slot back for as long as it waits (real threads; the waits are events the test
sets, so nothing depends on timing)."""

from __future__ import annotations

import threading
import time

import pytest

from elastream.control.reconcile_slots import ReconcilePool, ReconcileSlots
from elastream.core.ports import SystemClock

#: a bound on every join and wait of the test (a failure, not a timing assertion: nothing is expected to take it)
BOUND_S = 10.0


class GatedClock(SystemClock):
    """A clock whose `sleep` returns when the test opens `gate` (whatever the seconds asked)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.sleeping = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.sleeping.set()
        assert self.gate.wait(BOUND_S)


def test_a_waiting_pass_gives_its_slot_to_another_and_takes_one_again() -> None:
    slots = ReconcileSlots(1)
    inner = GatedClock()
    clock = slots.clock(inner)
    seen: dict[str, object] = {}
    other_ran = threading.Event()

    def waiting_pass() -> None:
        with slots.running():
            clock.sleep(180.0)  # a start waiting for pods that never become ready
            seen["holds after the wait"] = slots.holds()
            seen["running after the wait"] = slots.running_now

    def other_pass() -> None:
        with slots.running():
            seen["parked while the other ran"] = slots.parked_now
            other_ran.set()

    waiter = threading.Thread(target=waiting_pass)
    waiter.start()
    assert inner.sleeping.wait(BOUND_S)
    other = threading.Thread(target=other_pass)
    other.start()
    # with one slot, the other pass runs only because the waiting one gave its slot back
    assert other_ran.wait(BOUND_S), "the only slot stayed with a pass that waits"
    other.join(BOUND_S)
    inner.gate.set()
    waiter.join(BOUND_S)
    assert not waiter.is_alive()
    assert seen == {"parked while the other ran": 1, "holds after the wait": True, "running after the wait": 1}
    assert slots.running_now == 0 and slots.parked_now == 0 and slots.running_most == 1


def test_passes_that_work_never_exceed_the_slots() -> None:
    slots = ReconcileSlots(2)
    release = threading.Event()
    entered = threading.Semaphore(0)

    def busy_pass() -> None:
        with slots.running():
            entered.release()
            assert release.wait(BOUND_S)

    threads = [threading.Thread(target=busy_pass) for _ in range(5)]
    for thread in threads:
        thread.start()
    assert entered.acquire(timeout=BOUND_S) and entered.acquire(timeout=BOUND_S)
    assert not entered.acquire(timeout=0.2)  # a third pass is held back while two work
    assert slots.running_now == 2
    release.set()
    for thread in threads:
        thread.join(BOUND_S)
    assert slots.running_most == 2 and slots.running_now == 0


def test_a_thread_without_a_slot_just_waits() -> None:
    """The leader elector, a checkpointer of its own: the clock's waits are plain waits for them."""
    slots = ReconcileSlots(1)
    inner = GatedClock()
    inner.gate.set()
    clock = slots.clock(inner)
    clock.sleep(1.0)
    stop = threading.Event()
    stop.set()
    assert clock.wait(stop, 5.0) is True
    assert slots.running_now == 0 and slots.parked_now == 0 and slots.running_most == 0
    assert clock.monotonic() > 0 and clock.now() > 0


def test_running_is_reentrant_and_size_is_checked() -> None:
    slots = ReconcileSlots(1)
    with slots.running(), slots.running():  # a pass within a pass holds the one slot
        assert slots.running_now == 1
    assert not slots.holds()
    with pytest.raises(ValueError, match="at least 1"):
        ReconcileSlots(0)


def test_the_pool_adds_a_thread_when_a_pass_parks_and_none_is_idle() -> None:
    """One slot, one thread: a pass that parks would leave the queue without a thread (and the slot it gave
    back unused); the pool adds one, so the next pass runs meanwhile."""
    slots = ReconcileSlots(1)
    pool = ReconcilePool(slots, waiting=4)
    inner = GatedClock()
    clock = slots.clock(inner)

    def waiting_pass() -> str:
        with slots.running():
            clock.sleep(180.0)
            return "started at last"

    def quick_pass() -> str:
        with slots.running():
            return "scaled"

    try:
        assert pool.threads == 1
        waiting = pool.submit(waiting_pass)
        assert inner.sleeping.wait(BOUND_S)
        assert pool.submit(quick_pass).result(BOUND_S) == "scaled"
        assert pool.threads == 2
        failing = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(BOUND_S)
        inner.gate.set()
        assert waiting.result(BOUND_S) == "started at last"
        # the pass is back: the thread added for it leaves, and passes queue in order for the one again
        deadline = time.monotonic() + BOUND_S
        while pool.threads > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.threads == 1
        assert pool.submit(quick_pass).result(BOUND_S) == "scaled"
    finally:
        inner.gate.set()
        pool.shutdown(wait=True)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(quick_pass)


def test_a_pool_at_its_bound_adds_no_thread_and_cancels_what_is_queued() -> None:
    slots = ReconcileSlots(1)
    pool = ReconcilePool(slots, waiting=0)
    inner = GatedClock()
    clock = slots.clock(inner)

    def waiting_pass() -> None:
        with slots.running():
            clock.sleep(180.0)

    running = pool.submit(waiting_pass)
    assert inner.sleeping.wait(BOUND_S)
    queued = pool.submit(lambda: None)
    assert pool.threads == 1  # no room for another: the queued pass waits for the only thread
    inner.gate.set()
    running.result(BOUND_S)
    pool.shutdown(wait=True, cancel_futures=True)
    assert queued.done()
