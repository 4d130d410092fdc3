"""The control plane's one retry: a call to Redis or the API server that fails for a reason worth waiting out
is tried again, on the caller's clock, for a bounded time; then its last error is raised for the caller to
report. The delays between attempts are `store.retry.backoff`'s (the one backoff schedule of the project);
`backoff_delay` is the same doubling for what is retried across passes of a loop (a start, a recovery, a
savepoint) rather than within one call.

Every retry here is bounded: the control plane must not be held by a Redis or an API server that stays away
(the reconcile pass, a delete's finalizer, a migration's record all have something to say about it). The
workers' waits, which last as long as their process, are `store.retry.retry_redis`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from elastream.core.ports import Clock

T = TypeVar("T")


def retry_within(
    call: Callable[[], T],
    *,
    transient: Callable[[Exception], bool],
    within_s: float,
    clock: Clock,
    delays: Iterator[float],
    on_failure: Callable[[Exception], None] | None = None,
) -> T:
    """`call()` until it returns; an exception `transient` says is worth waiting out is retried after the next
    of `delays` (on `clock`) for at most `within_s` after the first failure, then raised; any other exception at
    once. `on_failure` is told each transient failure before the pause (a log line, a condition)."""
    first_failure: float | None = None
    for delay in delays:
        try:
            return call()
        except Exception as exc:
            if not transient(exc):
                raise
            now = clock.monotonic()
            first_failure = now if first_failure is None else first_failure
            if now - first_failure > within_s:
                raise
            if on_failure is not None:
                on_failure(exc)
            clock.sleep(delay)
    return call()  # `delays` ran out: one last attempt, whatever it raises


def backoff_delay(failures: int, first_s: float, cap_s: float) -> float:
    """Seconds before retry number `failures` (1, 2, ...) of something retried across passes: `first_s`
    doubling up to `cap_s`."""
    return float(min(cap_s, first_s * 2 ** max(0, failures - 1)))
