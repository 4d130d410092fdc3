"""One backoff for everything that waits on Redis or on a peer: 0.2 s doubling to 5 s (and a variant that
grows by half from 50 ms to 1 s for the worker's polls of Redis keys)."""

from __future__ import annotations

from collections.abc import Iterator


def backoff(first_s: float = 0.2, factor: float = 2.0, cap_s: float = 5.0) -> Iterator[float]:
    """Delays between retries, without end: `first_s`, then multiplied by `factor` up to `cap_s`."""
    delay = first_s
    while True:
        yield delay
        delay = min(cap_s, delay * factor)
