"""The desired state a topology's reconcile loop tried to reach and could not (`Attempt`), as a tagged union
of what was tried: a start, a resume, a suspend, an upgrade, a scaling to a target. Pure: the next attempt
after a failure (`next_attempt`: counted on from the last one at the same target, due after the backoff of
`control.retrying.backoff_delay`) and what each kind's failures count towards in the status
(`failure_counts`), each kind where it belongs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elastream.control.retrying import backoff_delay
from elastream.core.status import FailureCounts


@dataclass(frozen=True)
class StartAttempt:
    """The start of the topology's workers (or the adoption of those an earlier operator left)."""


@dataclass(frozen=True)
class ResumeAttempt:
    """The start of a suspended topology's workers from its last checkpoint."""


@dataclass(frozen=True)
class SuspendAttempt:
    """The last checkpoint before a suspend stops the workers."""


@dataclass(frozen=True)
class UpgradeAttempt:
    """The checkpoint that begins a stateful upgrade."""


@dataclass(frozen=True)
class ScaleAttempt:
    """A scaling to `nodes` nodes and, when the spec changed them, these vertex degrees (sorted pairs)."""

    nodes: int
    parallelism: tuple[tuple[str, int], ...] | None = None

    @staticmethod
    def of(nodes: int, parallelism: Mapping[str, int] | None) -> ScaleAttempt:
        return ScaleAttempt(nodes, tuple(sorted(parallelism.items())) if parallelism else None)


AttemptTarget = StartAttempt | ResumeAttempt | SuspendAttempt | UpgradeAttempt | ScaleAttempt


@dataclass(frozen=True)
class Attempt:
    """A desired state the loop tried to reach and could not: retried with backoff while it stays the desired
    state; a new desired state is tried at once."""

    target: AttemptTarget
    failures: int = 0
    due: float = 0.0
    reason: str = ""
    #: the backoff `due` is after the last failure
    delay: float = 0.0

    def waits(self, target: AttemptTarget, now: float) -> float | None:
        """Seconds until `target` may be tried again (None: it may be tried now, or this attempt is another's)."""
        return self.due - now if self.target == target and now < self.due else None


def next_attempt(
    previous: Attempt | None, target: AttemptTarget, reason: str, now: float, retry_s: float, retry_cap_s: float
) -> Attempt:
    """Another failure to reach `target`: counted on from `previous` when it was the same target, else from
    1, and due again after the backoff."""
    failures = previous.failures + 1 if previous is not None and previous.target == target else 1
    delay = backoff_delay(failures, retry_s, retry_cap_s)
    return Attempt(target, failures, now + delay, reason, delay)


def failure_counts(attempt: Attempt | None) -> FailureCounts:
    """The status's failure counters of the attempt in progress: each kind counts its own (a start and a
    resume are starts)."""
    if attempt is None:
        return FailureCounts()
    target, failures = attempt.target, attempt.failures
    return FailureCounts(
        start=failures if isinstance(target, StartAttempt | ResumeAttempt) else 0,
        suspend=failures if isinstance(target, SuspendAttempt) else 0,
        upgrade=failures if isinstance(target, UpgradeAttempt) else 0,
        scaling=failures if isinstance(target, ScaleAttempt) else 0,
    )
