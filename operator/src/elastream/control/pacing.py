"""How often the reconcile loop comes back to a topology and how it retries (`Pacing`): the seconds between
passes of an idle topology, how long a changed spec must be still before it moves anything, and the backoff
of a failed start, resume, suspend, upgrade or scaling. Every part of the pass reads the one value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pacing:
    #: seconds between passes of an idle topology (dead workers, checkpoints, the autoscaler, rates)
    tick_s: float = 2.0
    #: a changed spec is acted on once it has been still this long (a burst of patches moves once)
    settle_s: float = 1.0
    #: a failed attempt at the same desired state is retried after this, doubling up to the cap
    retry_s: float = 5.0
    retry_cap_s: float = 300.0
