"""One backoff for everything that waits on Redis or on a peer: 0.2 s doubling to 5 s (and a variant that
grows by half from 50 ms to 1 s for the worker's polls of Redis keys).

`retry_redis` runs one Redis call until Redis answers, for as long as the caller runs: a Redis that is
unreachable (refused, reset, timed out), loading its data after a restart (LOADING) or failing over is an
outage to wait out, never a reason to drop a write or let a thread die. `RedisOutage` logs an outage once
when it starts and once when it ends, however many threads and attempts wait on it; a `stop` event ends the
wait (`RetryCancelled`), so a stopping process is never held by an unreachable Redis.

Two replies say that the server itself is held rather than away, and are waited out for a bounded time only
(`BLOCKED_WAIT_S`): BUSY (a script or function has run past Redis' busy-reply threshold; if it wrote and then
loops, nothing but SHUTDOWN NOSAVE ends it) and OOM (used memory over `maxmemory` under `noeviction`: every
write is refused until memory is freed). A call that keeps getting one of them for that long raises
`RedisBusy` or `RedisOutOfMemory`, whose names are the reasons (`core.status.REDIS_BUSY`,
`REDIS_OUT_OF_MEMORY`) the operator reports them with, in a condition and an event: an error to report, never
an endless, silent wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis
from redis.exceptions import AskError, ClusterDownError, RedisClusterException, SlotNotCoveredError, TryAgainError

from elastream.core.ports import StopSignal
from elastream.core.status import REDIS_BUSY, REDIS_OUT_OF_MEMORY

T = TypeVar("T")

#: how a Redis Cluster client (`redis.cluster.RedisCluster`) says that no node of the cluster answered, or that
#: the slots are not all served yet (a failover in progress): outages too
_CLUSTER_UNREACHABLE = ("Redis Cluster cannot be connected", "All slots are not covered")

#: the first word of Redis error replies that mean "not now, try again": a Redis loading its data set after
#: a restart, a replica whose primary is away, a failover in progress, a script running too long, a blocking
#: read (BLPOP, XREAD BLOCK) released because its primary became a replica (nothing was read); and the replies of
#: a held server (`BLOCKED_REPLIES`: a script running too long, memory full), which are waited out for a bounded
#: time only
TRANSIENT_REPLIES = frozenset(
    {"LOADING", "MASTERDOWN", "TRYAGAIN", "READONLY", "BUSY", "CLUSTERDOWN", "UNBLOCKED", "OOM"}
)

#: the replies that say the server is held, not away, and the reason each is reported with: BUSY (a script or
#: function running past Redis' busy-reply threshold: one that wrote and then loops ends only with SHUTDOWN
#: NOSAVE) and OOM (used memory over `maxmemory` with `noeviction`: writes refused until memory is freed)
BLOCKED_REPLIES = {"BUSY": REDIS_BUSY, "OOM": REDIS_OUT_OF_MEMORY}

#: how long `retry_redis` waits out a server that keeps answering BUSY or OOM before it raises `RedisBusy` or
#: `RedisOutOfMemory` (seconds): longer than a slow script of the operator's (a checkpoint's commit) holds the
#: server, short enough that a held server is an error the operator reports, not a stall
BLOCKED_WAIT_S = 30.0


def backoff(first_s: float = 0.2, factor: float = 2.0, cap_s: float = 5.0) -> Iterator[float]:
    """Delays between retries, without end: `first_s`, then multiplied by `factor` up to `cap_s`."""
    delay = first_s
    while True:
        yield delay
        delay = min(cap_s, delay * factor)


def redis_backoff() -> Iterator[float]:
    """The delays of `retry_redis`: `backoff` from 0.1 s doubling to 1 s (a refused connection costs
    nothing, and a Redis that is back is noticed within a second)."""
    return backoff(0.1, 2.0, 1.0)


def _first_word(exc: BaseException) -> str | None:
    """The error code of a Redis error reply (READONLY, OOM, BUSY): redis-py takes it off the message of the
    replies it maps to a class (READONLY -> ReadOnlyError "You can't write against a read only replica.", OOM
    -> OutOfMemoryError) and keeps it as `status_code`; other replies keep it as the message's first word."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code
    words = str(exc).split(maxsplit=1)
    return words[0] if words else None


def blocked_reply(exc: BaseException) -> str | None:
    """The reply (BUSY or OOM) of a held server that `exc` is (`BLOCKED_REPLIES`), else None."""
    if not isinstance(exc, redis.ResponseError):
        return None
    code = _first_word(exc)
    return code if code in BLOCKED_REPLIES else None


def is_redis_outage(exc: BaseException) -> bool:
    """Whether `exc` says Redis is unreachable or not serving for now (worth waiting out), as opposed to a
    mistake in the call (wrong type, bad script, no permission) that no retry fixes. Connection errors include
    a refused or reset connection, LOADING (`BusyLoadingError`) and a refused password (an ACL being
    restored with the data); a Redis Cluster's failover (CLUSTERDOWN, MASTERDOWN, TRYAGAIN, READONLY, a
    slot without a primary, no node reachable) is one too."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | ConnectionError | TimeoutError):
        return True
    # a Redis Cluster failing over: CLUSTERDOWN and MASTERDOWN (ClusterDownError), TRYAGAIN, a slot without a
    # primary in the client's map, no node reachable while it reads the slots again, a MOVED or ASK the
    # client's own retries did not settle (its slot map is read again within a few redirections)
    if isinstance(exc, ClusterDownError | TryAgainError | SlotNotCoveredError | AskError):
        return True
    if type(exc) is RedisClusterException:
        return str(exc).startswith(_CLUSTER_UNREACHABLE)
    if isinstance(exc, redis.ResponseError):
        return _first_word(exc) in TRANSIENT_REPLIES
    return False


class RedisBlocked(redis.RedisError):
    """Redis kept answering BUSY or OOM (`BLOCKED_REPLIES`) to a call for `BLOCKED_WAIT_S`: the server is held
    (a script that does not end, memory full), which waiting longer does not fix. A `redis.RedisError`, so the
    operator's handlers of Redis errors report it; not an outage (`is_redis_outage` is False), so no retry
    around it waits again. The subclasses' names are the reasons the operator reports."""

    #: the reply (BUSY, OOM), the reason (`core.status`) and what ends it, for each subclass
    reply = ""
    reason = ""
    advice = ""

    def __init__(self, what: str, waited_s: float, last: BaseException) -> None:
        super().__init__(f"{what}: Redis answered {self.reply} for {waited_s:.0f} s ({last}); {self.advice}")
        self.what = what
        self.waited_s = waited_s


class RedisBusy(RedisBlocked):
    reply = "BUSY"
    reason = REDIS_BUSY
    advice = (
        "a script or function holds the server; if it wrote and then loops, only SCRIPT KILL (it refuses once "
        "the script wrote) or SHUTDOWN NOSAVE by an administrator ends it"
    )


class RedisOutOfMemory(RedisBlocked):
    reply = "OOM"
    reason = REDIS_OUT_OF_MEMORY
    advice = "its used memory is over maxmemory (noeviction): free memory or raise maxmemory"


#: the exception `retry_redis` raises for each blocked reply
_BLOCKED_ERRORS: dict[str, type[RedisBlocked]] = {"BUSY": RedisBusy, "OOM": RedisOutOfMemory}


class RetryLater:
    """The backoff of a loop that must go on between attempts (a source takes the controller's messages
    between its polls, so it cannot wait in a retry): `due(now)` says whether to try again, `failed(now)`
    puts the next try one delay of `delays()` later, `succeeded()` starts the delays over."""

    def __init__(self, delays: Callable[[], Iterator[float]] = backoff) -> None:
        self._fresh = delays
        self._delays = delays()
        self.retry_at = float("-inf")

    def due(self, now: float) -> bool:
        return now >= self.retry_at

    def failed(self, now: float) -> None:
        self.retry_at = now + next(self._delays)

    def succeeded(self) -> None:
        self._delays = self._fresh()


class AnyOf:
    """Set when any of `events` is (a thread that stops with its executor's generation or its process)."""

    def __init__(self, *events: threading.Event) -> None:
        self.events = events

    def is_set(self) -> bool:
        return any(event.is_set() for event in self.events)

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            remaining = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if remaining <= 0:
                return False
            self.events[0].wait(remaining)
        return True


class RetryCancelled(Exception):
    """The stop event was set while a call waited for Redis: the caller is shutting down."""


class RedisOutage:
    """Logs an outage of Redis once when it starts (the first failed call, with what it was doing) and once
    when it ends (the first call that succeeds after it), however many threads retry meanwhile."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("elastream.redis")
        self._lock = threading.Lock()
        #: monotonic time the current outage was first noticed (None: Redis answers)
        self.since: float | None = None
        #: monotonic time the last outage ended
        self.ended_at = float("-inf")
        #: outages noticed so far (for tests and metrics)
        self.count = 0

    @property
    def active(self) -> bool:
        return self.since is not None

    def failed(self, what: str, exc: BaseException, attempt_started: float | None = None) -> None:
        """A call failed for an outage. A call that started before the last outage ended (a reply that was
        lost in it) does not open a new one."""
        with self._lock:
            if self.since is not None:
                return
            if attempt_started is not None and attempt_started < self.ended_at:
                return
            self.since = time.monotonic()
            self.count += 1
        reply = blocked_reply(exc)
        if reply is not None:
            self.log.warning(
                "%s: Redis answers %s (%s: %s): the server is held; calls wait for at most %.0f s, then fail",
                what,
                reply,
                type(exc).__name__,
                exc,
                BLOCKED_WAIT_S,
            )
            return
        self.log.warning(
            "%s: Redis unreachable (%s: %s); everything that needs it waits and retries until it is back, "
            "nothing is dropped",
            what,
            type(exc).__name__,
            exc,
        )

    def succeeded(self) -> None:
        """A call succeeded: an outage in progress is over."""
        if self.since is None:  # the common case, without the lock
            return
        with self._lock:
            since, self.since = self.since, None
            if since is None:
                return
            self.ended_at = time.monotonic()
        self.log.warning("Redis reachable again after %.1f s", self.ended_at - since)


#: the outage log of this process (one Redis, one outage, one pair of lines however many threads wait)
REDIS = RedisOutage()


class RedisAttempt:
    """One attempt at Redis, as a `with` block around its calls: an outage (`is_redis_outage`) raised in it is
    reported to `outage` (logged once however many attempts fail in it), kept in `failure` and not raised;
    anything else propagates. A block that ends normally ends an outage in progress, unless it set `reached`
    to False (it touched no Redis: no proof that Redis is back). `what` ("sink out#0: cannot write stream S",
    or a function that says it) leads the outage's log line.

    The one way the runtime meets a Redis outage: `retry_redis` repeats an attempt until it succeeds, and a
    loop that must go on between attempts (a source polling its stream, a worker waiting for a key, a metric
    sample that is skipped while Redis is away) makes one attempt per turn."""

    def __init__(self, what: str | Callable[[], str], outage: RedisOutage | None = None) -> None:
        self.what = what
        self.outage = REDIS if outage is None else outage
        self.failure: Exception | None = None
        self.reached = True
        self.started = 0.0

    def __enter__(self) -> RedisAttempt:
        self.started = time.monotonic()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, traceback: Any) -> bool:
        if exc is None:
            if self.reached:
                self.outage.succeeded()
            return False
        if not isinstance(exc, Exception) or not is_redis_outage(exc):
            return False
        self.failure = exc
        self.outage.failed(self.what() if callable(self.what) else self.what, exc, self.started)
        return True


#: the stop of a caller that gives none: never set (the wait between attempts is then only the backoff's)
_NEVER = threading.Event()


def retry_redis(
    call: Callable[[], T],
    what: str,
    stop: StopSignal | None = None,
    outage: RedisOutage | None = None,
    delays: Iterator[float] | None = None,
    blocked_s: float = BLOCKED_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`call()` until Redis answers it, waiting out outages (`RedisAttempt`) with `redis_backoff` for as long
    as the caller runs; other exceptions propagate. `what` ("sink out#0: cannot write stream S") leads the
    outage's log line.
    With `stop` (every caller in the runtime passes its executor's or its worker's), its being set ends the
    wait with `RetryCancelled` (checked between attempts), so the wait is bounded by the caller's life and
    each pause by the backoff's cap. The call must be safe to repeat: a reply lost in an outage may hide a
    write that was applied.
    A server that answers BUSY or OOM (`BLOCKED_REPLIES`) to every attempt for `blocked_s` seconds (on
    `clock`) makes it raise `RedisBusy` or `RedisOutOfMemory`: a held server is an error, not a wait without
    end. Any other reply or failure in between starts that count again."""
    delays = redis_backoff() if delays is None else delays
    stop = _NEVER if stop is None else stop
    blocked_since: float | None = None
    while True:
        with RedisAttempt(what, outage) as attempt:
            result = call()
        if attempt.failure is None:
            return result
        reply = blocked_reply(attempt.failure)
        if reply is None:
            blocked_since = None
        else:
            now = clock()
            blocked_since = now if blocked_since is None else blocked_since
            if now - blocked_since >= blocked_s:
                raise _BLOCKED_ERRORS[reply](what, now - blocked_since, attempt.failure) from attempt.failure
        if stop.wait(next(delays)):
            raise RetryCancelled(f"{what}: stopped while waiting for Redis") from attempt.failure
