"""An executor's periodic-checkpoint alignment against migrations and abandoned rounds, driven frame by frame
with fakes at its ports (no sockets, no Redis): no input may be held for a round that will never complete,
or it is lost with the executor (the 60 s fault walk ended 617 events short)."""

from __future__ import annotations

import threading
from typing import Any

from elastream.core.migration_protocol import ControlType, ExecutorParticipant
from elastream.runtime.executor import ExecutorThread
from elastream.runtime.operators import Context
from elastream.runtime.participant import Migration
from elastream.runtime.transport import CONTROL, DATA

UPSTREAM = ("source#0", "source#1")


class Store:
    """The checkpoint store's port: what an executor saved and acked."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, Any]] = []
        self.tokens: list[str | None] = []
        self.acks: list[tuple[str, str]] = []

    def save(self, mid: str, checkpoint: Any, token: str | None = None) -> None:
        self.saved.append((mid, checkpoint))
        self.tokens.append(token)

    def ack(self, mid: str, phase: str, executor: str, info: Any = None) -> None:
        self.acks.append((mid, phase))

    def load_pending(self, mid: str, vertex: str, key_groups: Any, index: int, parallelism: int) -> list[Any]:
        return []  # what INIT replays: nothing was captured in these tests' INITs


class Router:
    def __init__(self) -> None:
        self.controls: list[dict[str, Any]] = []
        self.routed: list[Any] = []

    def send_control(self, message: dict[str, Any]) -> None:
        self.controls.append(message)

    def route(self, event: Any) -> None:
        self.routed.append(event)

    def flush(self) -> None:
        pass

    def take_blocked(self) -> float:
        return 0.0


class Keep:
    """A pass-through operator that remembers what it processed."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def process(self, event: Any, emit: Any) -> None:
        self.seen.append(event[0])


def executor() -> tuple[ExecutorThread, Keep, Store]:
    store, operator = Store(), Keep()
    participant = ExecutorParticipant("t1#0", frozenset(UPSTREAM))
    migration = Migration("t1#0", store, participant)  # type: ignore[arg-type]
    context = Context("t1", 0, 1, 1, {})
    thread = ExecutorThread(
        "t1#0",
        operator,
        context,
        None,
        Router(),
        threading.Event(),
        False,
        migration,  # type: ignore[arg-type]
    )
    return thread, operator, store


def data(sender: str, *ids: int) -> list[Any]:
    return [DATA, sender, [(i, i, i, 0.0) for i in ids]]


def barrier(sender: str, checkpoint: str) -> list[Any]:
    return [CONTROL, sender, {"type": ControlType.BARRIER, "mid": checkpoint}]


def control(kind: str, mid: str) -> list[Any]:
    return [CONTROL, "controller", {"type": kind, "mid": mid}]


def captured(thread: ExecutorThread) -> list[int]:
    return sorted(e[0] for events in thread.migration.pending.values() for e in events)


def test_a_migration_captures_what_an_alignment_held() -> None:
    # ckpt-7's barrier came from source#0 only (its round was abandoned, the abort never came); source#0's
    # later events wait for the alignment. A CCR PREPARE must capture them, not leave them held
    thread, operator, _ = executor()
    thread.handle(data("source#0", 1))
    thread.handle(barrier("source#0", "ckpt-7"))
    thread.handle(data("source#0", 2, 3))
    thread.handle(data("source#1", 4))
    assert operator.seen == [1, 4] and thread.aligning_held
    thread.handle(control(ControlType.PREPARE, "m1"))
    thread.handle(data("source#0", 5))
    assert captured(thread) == [2, 3, 5] and not thread.aligning_held and thread.barrier is None


def test_a_barrier_during_a_migration_holds_nothing() -> None:
    thread, _, _ = executor()
    thread.handle(control(ControlType.PREPARE, "m1"))
    thread.handle(barrier("source#0", "ckpt-7"))  # a stale round's barrier behind the data
    thread.handle(data("source#0", 1))
    assert captured(thread) == [1] and thread.barrier is None


def test_a_late_barrier_of_an_abandoned_round_is_ignored() -> None:
    # the abort came (through the control list, first) before the barriers (behind a backlog of data):
    # aligning them would hold input for a dead round and stage a sink's output under it
    thread, operator, store = executor()
    thread.handle(control(ControlType.CHECKPOINT_ABORT, "ckpt-7"))
    thread.handle(barrier("source#0", "ckpt-7"))
    thread.handle(data("source#0", 1))
    thread.handle(barrier("source#1", "ckpt-7"))
    assert operator.seen == [1] and thread.barrier is None and not store.saved
    # the next round aligns as usual
    thread.handle(barrier("source#0", "ckpt-8"))
    thread.handle(data("source#0", 2))
    assert operator.seen == [1]
    thread.handle(barrier("source#1", "ckpt-8"))
    assert operator.seen == [1, 2] and [mid for mid, _ in store.saved] == ["ckpt-8"]


def commit(sender: str, mid: str) -> list[Any]:
    return [CONTROL, sender, {"type": ControlType.COMMIT, "mid": mid}]


def resent_commit(mid: str) -> list[Any]:
    return [CONTROL, "controller", {"type": ControlType.COMMIT, "mid": mid, "resend": True}]


def test_a_resent_commit_saves_the_same_checkpoint_again_under_its_token_and_acks_again() -> None:
    # a Redis failover can lose an acknowledged write: the controller resends COMMIT to an executor whose
    # ack it has not seen; the save is repeated with the first save's token (applied only if it was lost)
    thread, _, store = executor()
    router = thread.router
    thread.handle(control(ControlType.PREPARE, "m1"))
    thread.handle(data("source#0", 1, 2))
    thread.handle(resent_commit("m1"))  # before COMMIT came in-band: nothing to do yet
    assert not store.saved and ("m1", "committing") not in store.acks
    thread.handle(commit("source#0", "m1"))
    thread.handle(commit("source#1", "m1"))
    assert [mid for mid, _ in store.saved] == ["m1"] and store.acks.count(("m1", "committing")) == 1
    assert [c["type"] for c in router.controls] == [ControlType.COMMIT]
    thread.handle(resent_commit("m1"))
    assert [mid for mid, _ in store.saved] == ["m1", "m1"] and store.saved[1][1] is store.saved[0][1]
    assert store.tokens[1] == store.tokens[0] is not None
    assert store.acks.count(("m1", "committing")) == 2
    assert [c["type"] for c in router.controls] == [ControlType.COMMIT]  # not forwarded again
    # a COMMIT again in-band (a sender's, resent) is a duplicate: neither saved nor forwarded
    thread.handle(commit("source#1", "m1"))
    assert len(store.saved) == 2 and len(router.controls) == 1


def test_a_resent_commit_of_another_migration_or_after_init_saves_nothing() -> None:
    thread, _, store = executor()
    thread.handle(control(ControlType.PREPARE, "m1"))
    thread.handle(commit("source#0", "m1"))
    thread.handle(commit("source#1", "m1"))
    thread.handle(resent_commit("m0"))  # an older migration's
    assert len(store.saved) == 1
    thread.migration.awaiting = "m1"  # as the worker sets it for the new schedule's INIT
    thread.handle(control(ControlType.INIT, "m1"))
    assert thread.migration.last_save is None  # dropped once the migration is over here
    thread.handle(resent_commit("m1"))
    assert len(store.saved) == 1 and store.acks.count(("m1", "committing")) == 1
