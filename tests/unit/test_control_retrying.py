"""The control plane's one bounded retry (`control.retrying`): what it retries, for how long, on whose clock."""

from __future__ import annotations

import itertools

import pytest

from elastream.control.retrying import backoff_delay, retry_within
from elastream.store.retry import backoff
from support.fakes import FakeClock


class Flaky:
    """Fails with `error` `failures` times, then returns "done"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.left, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise self.error
        return "done"


def test_a_transient_failure_is_retried_after_the_delays_and_reported_each_time() -> None:
    clock, seen = FakeClock(), []
    call = Flaky(3, ConnectionError("refused"))
    result = retry_within(
        call,
        transient=lambda exc: isinstance(exc, ConnectionError),
        within_s=60.0,
        clock=clock,
        delays=backoff(1.0, 2.0, 8.0),
        on_failure=seen.append,
    )
    assert (result, call.calls, len(seen)) == ("done", 4, 3)


def test_a_failure_no_retry_fixes_is_raised_at_once() -> None:
    call = Flaky(5, ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        retry_within(call, transient=lambda exc: False, within_s=60.0, clock=FakeClock(), delays=backoff())
    assert call.calls == 1


@pytest.mark.timeout(30)
def test_a_failure_that_lasts_is_raised_once_the_bound_passed_on_the_callers_clock() -> None:
    clock = FakeClock()
    call = Flaky(10**9, ConnectionError("refused"))
    with pytest.raises(ConnectionError):
        retry_within(call, transient=lambda exc: True, within_s=3600.0, clock=clock, delays=itertools.repeat(1.0))
    assert clock.t - 1000.0 > 3600.0  # an hour of the fake clock passed: the bound, not a count of attempts


def test_the_backoff_across_passes_doubles_up_to_its_cap() -> None:
    assert [backoff_delay(n, 5.0, 300.0) for n in (1, 2, 3, 7, 8)] == [5.0, 10.0, 20.0, 300.0, 300.0]
