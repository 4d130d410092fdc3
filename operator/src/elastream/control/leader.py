"""Leader election for the operator's replicas over a coordination.k8s.io Lease (the client-go / controller-runtime
model, which the Flink and Spark operators use too): exactly one replica acts, a standby takes over within a
lease duration when the active one dies, and at once when it shuts down cleanly.

`LeaderElector.acquire` blocks until this replica holds the Lease (`elastream-operator` in the operator's
namespace), trying every retry period: it creates the Lease when there is none, and otherwise writes itself
in with the `resourceVersion` it read, so of two replicas racing only one write succeeds (the other gets 409
Conflict and reads again). Then a renew thread renews every retry period, and a watchdog checks that the
last successful renew is younger than the renew deadline. When it is not (the API server unreachable, the
Lease taken by another replica), `on_lost` is called once; the operator exits at once with a non-zero code,
as controller-runtime does, so it can never act next to a new leader. `release` (clean shutdown) empties the
holder so a standby acquires at its next try.

The decisions (may I acquire, what to write, am I still leader) are `elastream.core.lease`'s; this module
only talks to the API (every call bounded by a request timeout) and keeps time with a replaceable clock.
"""

from __future__ import annotations

import datetime
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elastream.core.lease import (
    LeaseRecord,
    LeaseTiming,
    Observation,
    can_acquire,
    claim,
    observe,
    released,
    still_leader,
    why_not,
)
from elastream.core.ports import Clock, CoordinationApi, SystemClock

log = logging.getLogger("elastream.leader")

#: the Lease the chart's Role lets the operator get, create and update (in the operator's namespace)
LEASE_NAME = "elastream-operator"


@dataclass(frozen=True)
class LeaderElection:
    """`--leader-elect` and its timings (`cli.operator.leader_election`): one active replica, holding the Lease
    `name` in `namespace` as `identity`."""

    namespace: str
    identity: str
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    name: str = LEASE_NAME


def default_identity() -> str:
    """$POD_NAME (the chart sets it from the downward API, so `kubectl get lease` names the pod), else
    `<hostname>-<pid>-<random>`: unique even for two processes on one host."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class _MicroTime(datetime.datetime):
    """A datetime that serialises with microseconds always: the API server parses a Lease's times as
    RFC3339Micro and refuses `12:00:00+00:00`, which `isoformat()` gives for a whole second."""

    def isoformat(self, sep: str = "T", timespec: str = "microseconds") -> str:
        return super().isoformat(sep, timespec)


def _micro_time(ts: float | None) -> datetime.datetime | None:
    if ts is None:
        return None
    t = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    return _MicroTime(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, tzinfo=datetime.UTC)


def _timestamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):  # a client that did not deserialise the time
        value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return float(value.timestamp())


def record_of(lease: Any, default_duration_s: int) -> LeaseRecord:
    """The record a V1Lease holds (a Lease without a duration gets ours)."""
    spec = lease.spec
    if spec is None:
        return LeaseRecord(lease_duration_s=default_duration_s)
    return LeaseRecord(
        holder=spec.holder_identity or "",
        lease_duration_s=int(spec.lease_duration_seconds or default_duration_s),
        acquire_time=_timestamp(spec.acquire_time),
        renew_time=_timestamp(spec.renew_time),
        transitions=int(spec.lease_transitions or 0),
    )


def lease_body(namespace: str, name: str, record: LeaseRecord, resource_version: str | None) -> Any:
    """The V1Lease to create (no resourceVersion) or replace (the one read: a stale one gets 409 Conflict)."""
    from kubernetes import client

    return client.V1Lease(
        api_version="coordination.k8s.io/v1",
        kind="Lease",
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=namespace,
            resource_version=resource_version,
            labels={"app.kubernetes.io/name": "elastream", "app.kubernetes.io/component": "operator"},
        ),
        spec=client.V1LeaseSpec(
            holder_identity=record.holder,
            lease_duration_seconds=record.lease_duration_s,
            acquire_time=_micro_time(record.acquire_time),
            renew_time=_micro_time(record.renew_time),
            lease_transitions=record.transitions,
        ),
    )


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _describe(exc: BaseException) -> str:
    status = _status(exc)
    if status is not None:
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    return f"{type(exc).__name__}: {exc}"[:300]


class LeaderElector:
    """Acquire, renew and release one Lease for `identity`. Thread-safe; one instance per process."""

    def __init__(
        self,
        coordination_api: CoordinationApi,
        election: LeaderElection,
        clock: Clock | None = None,
        on_lost: Callable[[str], None] | None = None,
        request_timeout_s: float | None = None,
    ) -> None:
        if not election.identity:
            raise ValueError("leader election needs a non-empty identity")
        self.api = coordination_api
        self.namespace = election.namespace
        self.name = election.name
        self.identity = election.identity
        self.timing = election.timing
        self.clock: Clock = clock or SystemClock()
        self.on_lost = on_lost
        #: each API call's bound; a leader's calls are also cut to what is left of its renew deadline
        self.request_timeout_s = request_timeout_s or max(1.0, min(5.0, self.timing.renew_deadline_s / 2))
        #: serialises attempts (API calls); `_state` guards the fields the watchdog reads, never held over a call
        self._attempt = threading.Lock()
        self._state = threading.Lock()
        self._observation: Observation | None = None
        #: monotonic time the last successful acquire/renew started (its read was sent)
        self._last_renewed_at: float | None = None
        self._leading = False
        self._last_error = ""
        self._waiting_for = ""
        self._lost = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    def is_leader(self) -> bool:
        with self._state:
            return self._leading and still_leader(
                self._last_renewed_at, self.clock.monotonic(), self.timing.renew_deadline_s
            )

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    # -- one attempt -------------------------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """One read and (when allowed) one write; True when this replica holds the Lease afterwards. Never
        raises: a failed call is remembered (`last_error`) and the attempt returns False."""
        with self._attempt:
            started = self.clock.monotonic()
            timeout = self._timeout(started)
            try:
                lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
            except Exception as exc:
                if _status(exc) == 404:
                    return self._create(started, timeout)
                return self._failed("read", exc)
            current = record_of(lease, self.timing.lease_duration_s)
            now = self.clock.monotonic()
            self._observation = observe(self._observation, current, now)
            if not can_acquire(self._observation, self.identity, now):
                if not self._leading:
                    self._standby(self._observation, now)
                return False
            record = claim(current, self.identity, self.clock.now(), self.timing.lease_duration_s)
            body = lease_body(self.namespace, self.name, record, lease.metadata.resource_version)
            try:
                self.api.replace_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self._timeout(started)
                )
            except Exception as exc:
                if _status(exc) == 409:  # another replica wrote since our read: read again next time
                    log.debug("leader election: %s: conflict writing %s, another replica wrote first",
                              self.identity, self.lease)  # fmt: skip
                    self._last_error = "409 Conflict: another replica wrote the Lease first"
                    return False
                return self._failed("update", exc)
            self._written(record, started, current)
            return True

    def _create(self, started: float, timeout: float) -> bool:
        record = claim(None, self.identity, self.clock.now(), self.timing.lease_duration_s)
        body = lease_body(self.namespace, self.name, record, None)
        try:
            self.api.create_namespaced_lease(self.namespace, body, _request_timeout=timeout)
        except Exception as exc:
            if _status(exc) == 409:  # another replica created it first
                self._last_error = "409 AlreadyExists: another replica created the Lease first"
                return False
            return self._failed("create", exc)
        log.info("leader election: %s created the Lease %s", self.identity, self.lease)
        self._written(record, started, None)
        return True

    def _written(self, record: LeaseRecord, started: float, previous: LeaseRecord | None) -> None:
        self._observation = Observation(record, self.clock.monotonic())
        self._last_error = ""
        self._waiting_for = ""
        if not self._leading and previous is not None and previous.holder not in ("", self.identity):
            log.info("leader election: %s took the Lease %s over from %s, whose claim expired (no renew seen "
                     "for %d s)", self.identity, self.lease, previous.holder,
                     previous.lease_duration_s)  # fmt: skip
        with self._state:
            if not self._lost.is_set():
                self._last_renewed_at = started

    def _failed(self, what: str, exc: BaseException) -> bool:
        message = f"{what} {self.lease}: {_describe(exc)}"
        if message != self._last_error:
            log.warning("leader election: %s: %s", self.identity, message)
        self._last_error = message
        return False

    def _standby(self, observation: Observation, now: float) -> None:
        holder = observation.record.holder
        if holder != self._waiting_for:
            log.info("leader election: %s is standby, the Lease %s is %s; trying every %g s",
                     self.identity, self.lease, why_not(observation, self.identity, now),
                     self.timing.retry_period_s)  # fmt: skip
            self._waiting_for = holder

    def _timeout(self, now: float) -> float:
        """The bound of the next call: the request timeout, and for a leader no later than its deadline."""
        if self._leading and self._last_renewed_at is not None:
            left = self._last_renewed_at + self.timing.renew_deadline_s - now
            return max(0.1, min(self.request_timeout_s, left))
        return self.request_timeout_s

    @property
    def last_error(self) -> str:
        return self._last_error

    # -- acquire, renew, lose, release ---------------------------------------------------------------------------
    def acquire(self, stop: threading.Event) -> bool:
        """Block until this replica holds the Lease (True; renewing starts) or `stop` is set (False)."""
        if self._lost.is_set():
            raise RuntimeError("this elector lost its Lease; a new leader term needs a new process")
        began = self.clock.monotonic()
        log.info("leader election: %s trying to acquire the Lease %s (lease %d s, renew deadline %g s, retry %g s)",
                 self.identity, self.lease, self.timing.lease_duration_s, self.timing.renew_deadline_s,
                 self.timing.retry_period_s)  # fmt: skip
        while not stop.is_set():
            if self.try_acquire_or_renew():
                with self._state:
                    self._leading = True
                    transitions = self._observation.record.transitions if self._observation else 0
                log.info("leader election: %s acquired the Lease %s after %.1f s (transitions %d): now the active "
                         "operator", self.identity, self.lease, self.clock.monotonic() - began,
                         transitions)  # fmt: skip
                self._start_threads()
                return True
            if self.clock.wait(stop, self.timing.retry_period_s):
                break
        log.info("leader election: %s stopped before acquiring the Lease %s", self.identity, self.lease)
        return False

    def renew_once(self) -> bool:
        """One renew of a leader: True when renewed. A Lease another replica holds is lost at once; failures
        are retried until the renew deadline passes, then the Lease is lost."""
        if not self._leading or self._lost.is_set():
            return False
        if self.try_acquire_or_renew():
            return True
        holder = self._observation.record.holder if self._observation else ""
        if holder not in ("", self.identity):
            self._lose(f"the Lease was taken by {holder}")
        else:
            self.check_deadline()
        return False

    def check_deadline(self) -> bool:
        """False (and the Lease is lost) when a leader has not renewed within the renew deadline."""
        with self._state:
            if not self._leading:
                return not self._lost.is_set()
            if still_leader(self._last_renewed_at, self.clock.monotonic(), self.timing.renew_deadline_s):
                return True
            reason = f"not renewed within the renew deadline of {self.timing.renew_deadline_s:g} s"
            if self._last_error:
                reason += f" (last error: {self._last_error})"
        self._lose(reason)
        return False

    def _lose(self, reason: str) -> None:
        with self._state:
            if self._lost.is_set():
                return
            self._lost.set()
            self._leading = False
            self._stopping.set()
        log.error("leader election: %s lost the Lease %s: %s", self.identity, self.lease, reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    def _start_threads(self) -> None:
        def renew() -> None:
            while not self._stopping.is_set():
                if self.clock.wait(self._stopping, self.timing.retry_period_s):
                    return
                self.renew_once()

        def watchdog() -> None:
            # checks the deadline even while a renew call hangs (each call is bounded, but not DNS, say)
            step = min(1.0, self.timing.retry_period_s / 2)
            while not self._stopping.is_set():
                if self.clock.wait(self._stopping, step):
                    return
                self.check_deadline()

        self._threads = [
            threading.Thread(target=renew, name="elastream-lease-renew", daemon=True),
            threading.Thread(target=watchdog, name="elastream-lease-watchdog", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop renewing (without releasing)."""
        self._stopping.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self.request_timeout_s * 2 + 1)
        self._threads = []

    def release(self) -> bool:
        """Stop renewing and, if this replica still holds the Lease, empty its holder so a standby takes over
        at its next try. True when released; never raises (a failed release only delays the standby by a
        lease duration)."""
        self.stop()
        with self._state:
            self._leading = False
        with self._attempt:
            try:
                lease = self.api.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=self.request_timeout_s
                )
                current = record_of(lease, self.timing.lease_duration_s)
                if current.holder != self.identity:
                    return False
                body = lease_body(
                    self.namespace, self.name, released(current, self.clock.now()), lease.metadata.resource_version
                )
                self.api.replace_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self.request_timeout_s
                )
            except Exception as exc:
                log.warning("leader election: %s could not release the Lease %s (%s); a standby takes over when it "
                            "expires", self.identity, self.lease, _describe(exc))  # fmt: skip
                return False
        log.info("leader election: %s released the Lease %s", self.identity, self.lease)
        return True
