"""Bounded waits for tests and benchmarks: every wait says what it waited for when it gives up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    probe: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1, detail: Callable[[], str] | None = None
) -> Any:
    """`probe()` until it returns something true (returned), for at most `timeout_s`; then TimeoutError
    naming `what` was awaited, with `detail()` (a log's tail, say) after it."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:g} s for {what}" + (f"\n{detail()}" if detail else ""))
        time.sleep(poll_s)
