"""Leader election over a coordination.k8s.io Lease: the decisions, pure (client-go's `leaderelection` rules).

One operator replica acts at a time. Each replica keeps trying to write its identity into one Lease; the
adapter (`elastream.control.leader`) reads and writes it, these functions decide:

- `can_acquire`: nobody holds the Lease (none yet, or released: empty holder), I hold it, or it expired;
- `claim`: the record to write when acquiring or renewing (a new holder counts one more transition);
- `released`: the record a leader writes on a clean shutdown, so a standby takes over at once;
- `still_leader`: a leader that has not renewed within the renew deadline must stop acting.

Expiry is counted, as client-go counts it (and as the Lease's `leaseDurationSeconds` is documented: "measured
against the time of last observed renewTime"), from when *this* replica last saw the record change, on its
own clock, not from the `renewTime` the holder wrote with its clock: clock skew between replicas then never
lets a standby take a Lease its holder is still renewing. The price is that a replica starting next to a
stale record waits one lease duration before taking it.

Safety rests on `renew_deadline < lease_duration`: a leader stops acting `renew_deadline` after its last
successful renew was sent, and a standby, which saw that renew no earlier than it was sent, waits
`lease_duration` after seeing it; the difference is the margin for the old leader's process to exit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: client-go's rule: the renew deadline must exceed the retry period by this factor (its retries are jittered)
JITTER_FACTOR = 1.2


class LeaseConfigError(ValueError):
    """Timings that cannot guarantee one leader (e.g. a renew deadline not shorter than the lease duration)."""


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease's spec says. Times are seconds since the epoch, on the writer's clock."""

    #: "" when nobody holds the Lease (never acquired, or released)
    holder: str = ""
    #: how long, after a standby saw the record change, the holder's claim lasts (an integer in the API)
    lease_duration_s: int = 15
    acquire_time: float | None = None
    renew_time: float | None = None
    #: how many times the Lease changed hands
    transitions: int = 0


@dataclass(frozen=True)
class LeaseTiming:
    """The three durations of client-go's LeaderElectionConfig, checked so one leader is guaranteed."""

    #: how long a standby waits after the record last changed before it takes the Lease
    lease_duration_s: int = 15
    #: how long a leader keeps acting without a successful renew (must be shorter than the lease duration)
    renew_deadline_s: float = 10.0
    #: how often a standby tries to acquire and a leader renews (1.2 x it must be shorter than the renew deadline)
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        problems = timing_problems(self.lease_duration_s, self.renew_deadline_s, self.retry_period_s)
        if problems:
            raise LeaseConfigError("; ".join(problems))


def timing_problems(lease_duration_s: float, renew_deadline_s: float, retry_period_s: float) -> list[str]:
    """Why these timings cannot guarantee one leader (empty when they can)."""
    problems: list[str] = []
    if lease_duration_s < 1 or lease_duration_s != int(lease_duration_s):
        problems.append(f"lease duration {lease_duration_s:g} s: give a whole number of seconds, at least 1")
    if retry_period_s <= 0:
        problems.append(f"retry period {retry_period_s:g} s: give a positive number of seconds")
    if renew_deadline_s >= lease_duration_s:
        problems.append(
            f"renew deadline {renew_deadline_s:g} s must be shorter than the lease duration {lease_duration_s:g} s "
            "(a leader must give up before a standby may take over)"
        )
    if retry_period_s > 0 and renew_deadline_s <= JITTER_FACTOR * retry_period_s:
        problems.append(
            f"renew deadline {renew_deadline_s:g} s must be longer than {JITTER_FACTOR:g} x the retry period "
            f"{retry_period_s:g} s (else one failed renew loses the Lease)"
        )
    return problems


@dataclass(frozen=True)
class Observation:
    """A record as this replica saw it, and when (its own clock) it first saw the record as it is."""

    record: LeaseRecord
    observed_at: float


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """The observation after reading `record` at `now`: a record unchanged since the last read keeps the time
    it was first seen (so it expires), a changed one (renewed, taken, released) starts a new lease duration."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def expires_at(observation: Observation) -> float:
    """When (this replica's clock) the holder's claim ends unless the record changes again."""
    return observation.observed_at + observation.record.lease_duration_s


def is_held(observation: Observation | None, now: float) -> bool:
    """Someone holds the Lease and their claim has not expired."""
    if observation is None or not observation.record.holder:
        return False
    return now < expires_at(observation)


def can_acquire(observation: Observation | None, identity: str, now: float) -> bool:
    """May `identity` write itself into the Lease: there is none, nobody holds it (released), it holds it
    already, or the holder's claim expired."""
    if observation is None:
        return True
    holder = observation.record.holder
    return not holder or holder == identity or not is_held(observation, now)


def why_not(observation: Observation, identity: str, now: float) -> str:
    """Why `identity` may not acquire (for a standby's log line); empty when it may."""
    if can_acquire(observation, identity, now):
        return ""
    record = observation.record
    return f"held by {record.holder}, expires in {expires_at(observation) - now:.1f} s unless renewed"


def claim(current: LeaseRecord | None, identity: str, now: float, lease_duration_s: int) -> LeaseRecord:
    """The record to write to acquire (or, for its holder, renew) the Lease at `now` (the caller checked
    `can_acquire`). A renew keeps the acquire time and the transitions; a new holder (after anyone else, a
    release included) counts one more transition; a new Lease starts at 0."""
    if current is None:
        return LeaseRecord(identity, lease_duration_s, now, now, 0)
    if current.holder == identity:
        acquired = current.acquire_time if current.acquire_time is not None else now
        return replace(current, lease_duration_s=lease_duration_s, acquire_time=acquired, renew_time=now)
    return LeaseRecord(identity, lease_duration_s, now, now, current.transitions + 1)


def released(current: LeaseRecord, now: float) -> LeaseRecord:
    """What the holder writes on a clean shutdown: no holder, a 1 s duration (client-go writes the same), so
    every standby may take the Lease at its next try."""
    return replace(current, holder="", lease_duration_s=1, acquire_time=now, renew_time=now)


def still_leader(last_renewed_at: float | None, now: float, renew_deadline_s: float) -> bool:
    """A leader acts only while its last successful acquire/renew was *sent* less than `renew_deadline_s` ago
    (its own clock); past that, a standby may be about to take over, so it must stop."""
    return last_renewed_at is not None and now - last_renewed_at < renew_deadline_s
