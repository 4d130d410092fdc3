"""A Redis that is held rather than away, without a Redis: a BUSY reply (a script holding the server) or an OOM
reply (maxmemory reached under noeviction) is waited out for a bounded time only, then raised as `RedisBusy` or
`RedisOutOfMemory` (`store.retry`); the operator reports it with its own constant reason, in a condition
(`core.status`) and an event (`TopologyController.note_store`), and an OOM does not flap away with each read
that succeeds. Issue 38: "any tenant can freeze the shared Redis"."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

import pytest
import redis
from redis._parsers.base import BaseParser

from elastream.core.status import (
    DEGRADED,
    PROGRESSING,
    REDIS_BUSY,
    REDIS_GRACE_S,
    REDIS_OUT_OF_MEMORY,
    REDIS_UNAVAILABLE,
    EventReason,
    StatusFacts,
    desired_conditions,
    redis_reason,
)
from elastream.store.retry import (
    BLOCKED_WAIT_S,
    RedisBlocked,
    RedisBusy,
    RedisOutage,
    RedisOutOfMemory,
    RetryCancelled,
    blocked_reply,
    is_redis_outage,
    retry_redis,
)

#: the replies as redis-py makes them from what Redis sends (its own parser)
BUSY = "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."
OOM = "OOM command not allowed when used memory > 'maxmemory'."


def reply(text: str) -> redis.RedisError:
    error = BaseParser.parse_error(text)
    assert isinstance(error, redis.RedisError)
    return error


class FakeTime:
    """A monotonic clock and a stop signal whose waits only move the clock (never set)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        self.t += timeout or 0.0
        return False


def every(delay: float) -> Iterator[float]:
    return repeat(delay)


def replies(*outcomes: Exception | str) -> tuple[Callable[[], str], list[int]]:
    """A call that raises each exception of `outcomes` in turn (the last one for ever) or returns a string."""
    calls = [0]

    def call() -> str:
        outcome = outcomes[min(calls[0], len(outcomes) - 1)]
        calls[0] += 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return call, calls


# ---------------------------------------------------------------------------------------------------------
# which replies


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (reply(BUSY), "BUSY"),
        (reply(OOM), "OOM"),  # redis-py's OutOfMemoryError: the code is taken off the message
        (redis.ResponseError(f"{OOM} script: 1234, on @user_script:1."), "OOM"),  # met inside a script
        (reply("BUSYGROUP Consumer Group name already exists"), None),
        (reply("LOADING Redis is loading the dataset in memory"), None),
        (reply("WRONGTYPE Operation against a key holding the wrong kind of value"), None),
        (redis.ConnectionError("Connection refused"), None),
        (ValueError("BUSY"), None),
    ],
)
def test_busy_and_oom_are_the_replies_of_a_held_server(error: Exception, code: str | None) -> None:
    assert blocked_reply(error) == code


def test_a_held_server_is_waited_out_like_an_outage_while_it_lasts() -> None:
    assert isinstance(reply(OOM), redis.exceptions.OutOfMemoryError)
    assert is_redis_outage(reply(BUSY)) and is_redis_outage(reply(OOM))
    # what `retry_redis` raises in the end is not: no retry around it waits again
    error = RedisBusy("x", 30.0, reply(BUSY))
    assert isinstance(error, redis.RedisError) and not is_redis_outage(error)


# ---------------------------------------------------------------------------------------------------------
# the retry policy


@pytest.mark.parametrize(
    ("text", "kind", "reason"), [(BUSY, RedisBusy, REDIS_BUSY), (OOM, RedisOutOfMemory, REDIS_OUT_OF_MEMORY)]
)
def test_a_server_held_for_ever_is_an_error_after_the_deadline_not_an_endless_wait(
    text: str, kind: type[RedisBlocked], reason: str
) -> None:
    fake = FakeTime()
    call, calls = replies(reply(text))
    with pytest.raises(kind) as raised:
        retry_redis(call, "sink out#0: cannot write stream S", stop=fake, outage=RedisOutage(),
                    delays=every(1.0), blocked_s=10.0, clock=fake.now)  # fmt: skip
    assert fake.t == 10.0 and calls[0] == 11  # a try a second for 10 s, then no more
    error = raised.value
    assert error.reason == reason and type(error).__name__ == reason  # what the operator says it with
    assert isinstance(error, redis.RedisError) and isinstance(error.__cause__, redis.ResponseError)
    assert str(error).startswith(f"sink out#0: cannot write stream S: Redis answered {text.split()[0]} for 10 s")
    assert redis_reason(f"{type(error).__name__}: {error}") == reason


def test_the_default_deadline_is_bounded_and_short_of_a_stall() -> None:
    fake = FakeTime()
    call, _ = replies(reply(BUSY))
    with pytest.raises(RedisBusy):
        retry_redis(call, "x", stop=fake, outage=RedisOutage(), delays=every(1.0), clock=fake.now)
    assert fake.t == BLOCKED_WAIT_S and 5.0 < BLOCKED_WAIT_S <= 60.0


def test_a_server_held_for_less_than_the_deadline_is_waited_out() -> None:
    fake = FakeTime()
    call, calls = replies(reply(BUSY), reply(BUSY), reply(OOM), "written")  # a slow script, then memory freed
    assert retry_redis(call, "x", stop=fake, outage=RedisOutage(), delays=every(1.0), blocked_s=10.0,
                       clock=fake.now) == "written"  # fmt: skip
    assert calls[0] == 4


def test_anything_else_between_held_replies_starts_the_count_again() -> None:
    """BUSY, then Redis restarted by its liveness probe or SHUTDOWN NOSAVE (refused while it is down), then
    BUSY again: a new hold, counted from its own first reply (the outage in between is waited out as ever)."""
    fake = FakeTime()
    outcomes: list[Exception | str] = [reply(BUSY)] * 8 + [redis.ConnectionError("refused")] * 20 + [reply(BUSY)] * 8
    call, _ = replies(*outcomes, "ok")
    assert retry_redis(call, "x", stop=fake, outage=RedisOutage(), delays=every(1.0), blocked_s=10.0,
                       clock=fake.now) == "ok"  # fmt: skip
    assert fake.t == 36.0  # longer than the deadline in all, never 10 s held in a row


def test_a_stop_still_ends_a_wait_on_a_held_server() -> None:
    stop = threading.Event()
    call, calls = replies(reply(OOM))

    def stopping() -> str:
        if calls[0] == 2:
            stop.set()
        return call()

    with pytest.raises(RetryCancelled):
        retry_redis(stopping, "x", stop=stop, outage=RedisOutage(), delays=every(0.0), blocked_s=3600.0)
    assert calls[0] == 3


def test_a_held_server_is_logged_as_held_not_as_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    outage = RedisOutage(logging.getLogger("test.held"))
    fake = FakeTime()
    call, _ = replies(reply(BUSY), "ok")
    with caplog.at_level(logging.INFO, logger="test.held"):
        retry_redis(call, "node node-0: cannot ack", stop=fake, outage=outage, delays=every(1.0), clock=fake.now)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("node node-0: cannot ack: Redis answers BUSY (ResponseError: BUSY Redis is busy")
    assert f"at most {BLOCKED_WAIT_S:.0f} s" in lines[0] and "unreachable" not in lines[0]


# ---------------------------------------------------------------------------------------------------------
# what the operator says: conditions


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (f"ResponseError: {BUSY}", REDIS_BUSY),
        ("OutOfMemoryError: command not allowed when used memory > 'maxmemory'.", REDIS_OUT_OF_MEMORY),
        (f"ResponseError: {OOM} script: 1, on @user_script:1.", REDIS_OUT_OF_MEMORY),
        ("RedisBusy: sink z#0: Redis answered BUSY for 30 s (...)", REDIS_BUSY),
        ("RedisOutOfMemory: sink z#0: Redis answered OOM for 30 s (...)", REDIS_OUT_OF_MEMORY),
        ("ConnectionError: Error 111 connecting to 127.0.0.1:6379. Connection refused.", REDIS_UNAVAILABLE),
        ("ResponseError: BUSYGROUP Consumer Group name already exists", REDIS_UNAVAILABLE),
        ("", REDIS_UNAVAILABLE),
    ],
)
def test_a_redis_error_gets_its_reason(error: str, reason: str) -> None:
    assert redis_reason(error) == reason


def conditions(facts: StatusFacts) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in desired_conditions(facts)}


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (f"ResponseError: {BUSY}", REDIS_BUSY),
        ("OutOfMemoryError: command not allowed when used memory > 'maxmemory'.", REDIS_OUT_OF_MEMORY),
        ("ConnectionError: Connection refused", REDIS_UNAVAILABLE),
    ],
)
def test_a_held_redis_is_a_condition_with_its_own_reason(error: str, reason: str) -> None:
    base = {"desired_nodes": 2, "ready_nodes": 2, "started": True, "redis_unavailable": error}
    now = conditions(StatusFacts(**base, redis_down_s=1.0))  # type: ignore[arg-type]
    assert now[PROGRESSING]["status"] == "True" and now[PROGRESSING]["reason"] == reason
    assert error in now[PROGRESSING]["message"]
    assert now[DEGRADED]["status"] == "False"
    later = conditions(StatusFacts(**base, redis_down_s=REDIS_GRACE_S + 1))  # type: ignore[arg-type]
    assert later[DEGRADED]["status"] == "True" and later[DEGRADED]["reason"] == reason
    assert EventReason(reason) == reason  # the same string names the event


# ---------------------------------------------------------------------------------------------------------
# what the operator says: events, from the controller's tick


def make_controller(feed: Any) -> tuple[Any, Any]:
    from elastream.control.controller import TopologyController
    from elastream.core.topology import parse_manifest
    from support.fakes import (
        DictStatus,
        FakeBackend,
        FakeClock,
        FakeMigrator,
        ListEvents,
        ListRequests,
        SimulatedMetrics,
    )
    from support.manifests import edge, manifest, sink, src

    topology = parse_manifest(manifest([src("s", 1), sink("z", 1)], [edge("s", "z")], nodes=1, slotsPerNode=4))
    backend = FakeBackend()
    events = ListEvents()
    controller = TopologyController(
        topology=topology,
        backend=backend,  # type: ignore[arg-type]
        metrics=SimulatedMetrics(topology, backend),
        migrator=FakeMigrator(backend),
        feed=feed,
        requests=ListRequests(),
        status=DictStatus(),
        events=events,
        clock=FakeClock(),
    )
    controller.start()
    return controller, events


class HeldFeed:
    """A metric feed whose reads fail with `error` while it is set (a BUSY server refuses reads too)."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    def read_since(self, since_ts: float | None = None) -> list[Any]:
        if self.error is not None:
            raise self.error
        return []


def reasons(events: Any) -> list[str]:
    return [reason for reason, _, _ in events.events if reason.startswith("Redis")]


def test_a_busy_redis_is_one_redis_busy_event_and_a_change_of_cause_is_another() -> None:
    feed = HeldFeed()
    controller, events = make_controller(feed)
    feed.error = reply(BUSY)
    for _ in range(3):
        controller.tick()
    assert reasons(events) == [REDIS_BUSY]
    [(_, message, warning)] = [e for e in events.events if e[0] == REDIS_BUSY]
    assert warning and "a script holds the server" in message and "BUSY Redis is busy" in message
    assert redis_reason(controller.store_error) == REDIS_BUSY
    feed.error = redis.ConnectionError("Connection refused")  # an administrator's SHUTDOWN NOSAVE
    controller.tick()
    controller.tick()
    assert reasons(events) == [REDIS_BUSY, REDIS_UNAVAILABLE]
    feed.error = None
    controller.tick()
    assert reasons(events) == [REDIS_BUSY, REDIS_UNAVAILABLE, "RedisAvailable"] and controller.store_error == ""


def test_an_out_of_memory_redis_stays_noted_while_only_reads_succeed() -> None:
    """OOM refuses writes only: the tick's read succeeds, its writes fail. The condition and the event do not
    flap with each read: the OOM is over once no call met it for a while."""
    feed = HeldFeed()
    controller, events = make_controller(feed)
    oom = reply(OOM)
    for _ in range(5):
        controller.tick()  # the read succeeds ...
        controller.note_store(f"{type(oom).__name__}: {oom}")  # ... and a write of the pass meets OOM
        controller.tick()
        assert redis_reason(controller.store_error) == REDIS_OUT_OF_MEMORY
    assert reasons(events) == [REDIS_OUT_OF_MEMORY]
    [(_, message, _)] = [e for e in events.events if e[0] == REDIS_OUT_OF_MEMORY]
    assert "out of memory" in message and "maxmemory" in message
    controller.clock.t += 3600  # type: ignore[attr-defined]  # no OOM met for an hour
    controller.tick()
    assert controller.store_error == "" and reasons(events) == [REDIS_OUT_OF_MEMORY, "RedisAvailable"]
