"""Leader election: the pure decisions (`elastream.core.lease`) case by case, then `LeaderElector` against an
in-memory CoordinationV1Api with the API server's resourceVersion rules (404 on a missing Lease, 409 on a
stale write or a second create, a "down" mode whose calls raise) and a fake clock: two replicas never both
lead, a standby takes over when the leader's claim expires and not before, a leader the API cannot hear
gives up at its renew deadline, a release hands over at once. Last, the operator's command-line flags."""

from __future__ import annotations

import copy
import datetime
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from elastream.control.leader import LeaderElection, LeaderElector, default_identity, lease_body, record_of
from elastream.core.lease import (
    LeaseConfigError,
    LeaseRecord,
    LeaseTiming,
    Observation,
    can_acquire,
    claim,
    expires_at,
    is_held,
    observe,
    released,
    still_leader,
    timing_problems,
    why_not,
)

T0 = 1_700_000_000.0


# ---- core.lease ------------------------------------------------------------------------------------------------
def held(holder: str = "a", duration: int = 15, observed_at: float = 100.0) -> Observation:
    return Observation(LeaseRecord(holder, duration, T0, T0, 3), observed_at)


@pytest.mark.parametrize(
    ("observation", "identity", "now", "expected"),
    [
        (None, "b", 0.0, True),  # no Lease yet
        (held(holder=""), "b", 100.0, True),  # released: empty holder
        (held("b"), "b", 100.0, True),  # mine: renew
        (held("a"), "b", 100.0, False),  # just seen renewed by a
        (held("a"), "b", 114.999, False),  # a's claim lasts 15 s from when b saw it
        (held("a"), "b", 115.0, True),  # ... and not one instant longer
        (held("a", duration=1), "b", 101.0, True),  # a released-style duration
        (held("a"), "a", 10_000.0, True),  # mine, even long expired
    ],
)
def test_can_acquire(observation: Observation | None, identity: str, now: float, expected: bool) -> None:
    assert can_acquire(observation, identity, now) is expected
    if observation is not None:
        assert (why_not(observation, identity, now) == "") is expected


def test_why_not_names_the_holder_and_the_time_left() -> None:
    assert why_not(held("pod-a"), "pod-b", 103.0) == "held by pod-a, expires in 12.0 s unless renewed"


def test_is_held_and_expiry_count_from_the_observation_not_the_writers_clock() -> None:
    # renewTime says the year 2023 on the holder's clock; what counts is when this replica saw it change
    observation = held("a", observed_at=500.0)
    assert expires_at(observation) == 515.0
    assert is_held(observation, 514.9) and not is_held(observation, 515.0)
    assert not is_held(None, 0.0) and not is_held(held(""), 500.0)


def test_observe_keeps_the_first_sight_of_an_unchanged_record_and_restarts_on_a_change() -> None:
    record = LeaseRecord("a", 15, T0, T0, 0)
    first = observe(None, record, 10.0)
    assert first == Observation(record, 10.0)
    assert observe(first, LeaseRecord("a", 15, T0, T0, 0), 12.0) is first  # same record: not renewed
    renewed = LeaseRecord("a", 15, T0, T0 + 2, 0)
    assert observe(first, renewed, 12.0) == Observation(renewed, 12.0)
    taken = LeaseRecord("b", 15, T0 + 3, T0 + 3, 1)
    assert observe(first, taken, 13.0) == Observation(taken, 13.0)


def test_claim_creates_renews_and_takes_over() -> None:
    assert claim(None, "a", T0, 15) == LeaseRecord("a", 15, T0, T0, 0)
    mine = LeaseRecord("a", 15, T0, T0 + 4, 2)
    assert claim(mine, "a", T0 + 6, 15) == LeaseRecord("a", 15, T0, T0 + 6, 2)  # renew: acquire time kept
    assert claim(mine, "a", T0 + 6, 20).lease_duration_s == 20  # a restarted leader with a new duration
    no_acquire_time = LeaseRecord("a", 15, None, T0, 2)
    assert claim(no_acquire_time, "a", T0 + 6, 15).acquire_time == T0 + 6
    theirs = LeaseRecord("b", 15, T0, T0 + 4, 2)
    assert claim(theirs, "a", T0 + 30, 15) == LeaseRecord("a", 15, T0 + 30, T0 + 30, 3)
    assert claim(released(theirs, T0 + 5), "a", T0 + 6, 15) == LeaseRecord("a", 15, T0 + 6, T0 + 6, 3)


def test_released_empties_the_holder_for_one_second() -> None:
    assert released(LeaseRecord("a", 15, T0, T0 + 4, 2), T0 + 9) == LeaseRecord("", 1, T0 + 9, T0 + 9, 2)


@pytest.mark.parametrize(
    ("last", "now", "expected"),
    [(None, 0.0, False), (50.0, 50.0, True), (50.0, 59.999, True), (50.0, 60.0, False), (50.0, 80.0, False)],
)
def test_still_leader_within_the_renew_deadline(last: float | None, now: float, expected: bool) -> None:
    assert still_leader(last, now, 10.0) is expected


@pytest.mark.parametrize(
    ("duration", "deadline", "retry", "fragment"),
    [
        (15, 15, 2, "renew deadline 15 s must be shorter than the lease duration 15 s"),
        (15, 20, 2, "renew deadline 20 s must be shorter than the lease duration 15 s"),
        (15, 2, 2, "renew deadline 2 s must be longer than 1.2 x the retry period 2 s"),
        (15, 2.4, 2, "renew deadline 2.4 s must be longer than 1.2 x the retry period 2 s"),
        (15, 10, 0, "retry period 0 s: give a positive number of seconds"),
        (0, -1, 1, "lease duration 0 s: give a whole number of seconds, at least 1"),
        (2.5, 2, 1, "lease duration 2.5 s: give a whole number of seconds"),
    ],
)
def test_timings_that_cannot_guarantee_one_leader_are_refused(
    duration: float, deadline: float, retry: float, fragment: str
) -> None:
    assert any(fragment in p for p in timing_problems(duration, deadline, retry))
    with pytest.raises(LeaseConfigError, match=fragment.split(":")[0]):
        LeaseTiming(duration, deadline, retry)  # type: ignore[arg-type]


def test_the_default_timings_are_client_gos() -> None:
    assert timing_problems(15, 10, 2) == [] and LeaseTiming() == LeaseTiming(15, 10.0, 2.0)
    assert timing_problems(15, 2.5, 2) == [] and timing_problems(1, 0.5, 0.1) == []


# ---- an in-memory API server and a fake clock ----------------------------------------------------------------------
class FakeClock:
    """Wall and monotonic time moving together, only when told. `wait` (what a standby's or leader's loop
    sleeps in) first lets `on_wait` act as the rest of the world, then advances time."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.on_wait: Callable[[], None] | None = None
        self.waits = 0

    def now(self) -> float:
        return T0 + self.mono

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.mono += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.waits += 1
        if event.is_set():
            return True
        if self.on_wait is not None:
            self.on_wait()
        self.advance(seconds)
        return event.is_set()


class ApiDown(ConnectionRefusedError):
    pass


class FakeCoordinationApi:
    """CoordinationV1Api's three Lease calls with the API server's rules: a Lease is stored as the JSON the
    client sends (so times must parse as RFC3339Micro), every write bumps resourceVersion, a replace with any
    other resourceVersion is 409 Conflict, a create of an existing Lease 409 AlreadyExists, a read of a missing
    one 404. `down`: every call raises as an unreachable server does. `after_read`: called once after the
    next successful read (to interleave another replica between a read and its write)."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 100
        self.down = False
        self.calls: list[tuple[str, Any]] = []
        self.after_read: Callable[[], None] | None = None
        self.serializer = client.ApiClient()

    def _call(self, op: str, kwargs: dict[str, Any]) -> None:
        self.calls.append((op, kwargs.get("_request_timeout")))
        if self.down:
            raise ApiDown("[Errno 111] Connection refused")

    def _stored(self, namespace: str, body: Any) -> dict[str, Any]:
        doc = self.serializer.sanitize_for_serialization(body)
        for field in ("acquireTime", "renewTime"):
            value = doc["spec"].get(field)
            # the API server parses these as RFC3339Micro: six fractional digits, always
            assert value is None or datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%f%z"), value
            assert value is None or len(value.split(".")[1]) == len("000000+00:00"), value
        self.version += 1
        doc["metadata"]["resourceVersion"] = str(self.version)
        doc["metadata"]["namespace"] = namespace
        return doc

    def read_namespaced_lease(self, name: str, namespace: str, **kwargs: Any) -> client.V1Lease:
        self._call("read", kwargs)
        doc = self.leases.get((namespace, name))
        if doc is None:
            raise ApiException(status=404, reason="Not Found")
        result = client.V1Lease.model_validate(copy.deepcopy(doc))
        hook, self.after_read = self.after_read, None
        if hook is not None:
            hook()
        return result

    def create_namespaced_lease(self, namespace: str, body: Any, **kwargs: Any) -> client.V1Lease:
        self._call("create", kwargs)
        key = (namespace, body.metadata.name)
        if key in self.leases:
            raise ApiException(status=409, reason="AlreadyExists")
        assert body.metadata.resource_version is None
        self.leases[key] = self._stored(namespace, body)
        return client.V1Lease.model_validate(copy.deepcopy(self.leases[key]))

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any, **kwargs: Any) -> client.V1Lease:
        self._call("replace", kwargs)
        current = self.leases.get((namespace, name))
        if current is None:
            raise ApiException(status=404, reason="Not Found")
        if body.metadata.resource_version != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.leases[(namespace, name)] = self._stored(namespace, body)
        return client.V1Lease.model_validate(copy.deepcopy(self.leases[(namespace, name)]))

    def spec(self, namespace: str = "ops", name: str = "elastream-operator") -> dict[str, Any]:
        return self.leases[(namespace, name)]["spec"]


class Stepped(LeaderElector):
    """An elector whose renewing the test drives (`renew_once`, `check_deadline`) instead of two threads."""

    def _start_threads(self) -> None:
        pass


@pytest.fixture
def world() -> tuple[FakeCoordinationApi, FakeClock]:
    return FakeCoordinationApi(), FakeClock()


def elector(world: tuple[FakeCoordinationApi, FakeClock], identity: str, lost: list[str] | None = None) -> Stepped:
    api, clock = world
    return Stepped(
        api,
        LeaderElection("ops", identity),
        clock=clock,
        on_lost=(lost.append if lost is not None else None),
        request_timeout_s=4.0,
    )


def no_stop() -> threading.Event:
    return threading.Event()


# ---- LeaderElector -------------------------------------------------------------------------------------------------
def test_the_first_replica_creates_the_lease_and_the_second_waits(world) -> None:
    api, clock = world
    a, b = elector(world, "pod-a"), elector(world, "pod-b")
    assert a.acquire(no_stop()) and a.is_leader()
    spec = api.spec()
    assert spec["holderIdentity"] == "pod-a" and spec["leaseDurationSeconds"] == 15 and spec["leaseTransitions"] == 0
    assert api.leases[("ops", "elastream-operator")]["metadata"]["labels"]["app.kubernetes.io/name"] == "elastream"
    for _ in range(20):  # 40 s of a live leader renewing: b never gets in
        clock.advance(2.0)
        assert a.renew_once()
        assert not b.try_acquire_or_renew()
        assert a.is_leader() and not b.is_leader()
    assert api.spec()["holderIdentity"] == "pod-a" and api.spec()["leaseTransitions"] == 0
    assert "pod-b" not in str(api.leases)
    # every call was bounded
    assert api.calls and all(t is not None and 0 < t <= 4.0 for _, t in api.calls)


def test_two_replicas_racing_for_an_expired_lease_cannot_both_win(world) -> None:
    api, clock = world
    dead = elector(world, "pod-dead")
    assert dead.acquire(no_stop())
    a, b = elector(world, "pod-a"), elector(world, "pod-b")
    assert not a.try_acquire_or_renew() and not b.try_acquire_or_renew()  # both see pod-dead's fresh claim
    clock.advance(15.0)
    # a reads the expired Lease; before a writes, b reads the same version and writes itself in
    api.after_read = lambda: results.append(b.try_acquire_or_renew())
    results: list[bool] = []
    results.insert(0, a.try_acquire_or_renew())
    assert results == [False, True]  # a's write with the stale resourceVersion got 409
    assert api.spec()["holderIdentity"] == "pod-b" and api.spec()["leaseTransitions"] == 1
    assert "409" in a.last_error
    assert not a.try_acquire_or_renew()  # a re-reads: b's fresh claim


def test_two_replicas_racing_to_create_the_lease_cannot_both_win(world) -> None:
    api, _ = world
    a, b = elector(world, "pod-a"), elector(world, "pod-b")
    results: list[bool] = []
    # both read 404 before either creates; b creates first, a's create is 409 AlreadyExists
    original = api.read_namespaced_lease

    def read_then_let_b_in(name: str, namespace: str, **kwargs: Any) -> Any:
        api.read_namespaced_lease = original  # type: ignore[method-assign]
        try:
            return original(name, namespace, **kwargs)
        finally:
            results.append(b.try_acquire_or_renew())

    api.read_namespaced_lease = read_then_let_b_in  # type: ignore[method-assign]
    results.insert(0, a.try_acquire_or_renew())
    assert results == [False, True]
    assert api.spec()["holderIdentity"] == "pod-b"
    assert "AlreadyExists" in a.last_error


def test_when_the_leader_dies_the_standby_takes_over_after_the_lease_expires_and_not_before(world) -> None:
    api, clock = world
    a, b = elector(world, "pod-a"), elector(world, "pod-b")
    assert a.acquire(no_stop())
    death = clock.monotonic() + 21.0  # a renews every 2 s for 21 s, then its process is gone
    last_renew: list[float] = []

    def leader_lives() -> None:
        if clock.monotonic() < death and clock.monotonic() - (last_renew or [0.0])[-1] >= 2.0:
            last_renew.append(clock.monotonic())
            assert a.renew_once()

    clock.on_wait = leader_lives
    assert b.acquire(no_stop())
    took_over = clock.monotonic() - last_renew[-1]
    # b saw a's last renew within one retry period of it, and waited a whole lease duration from there
    assert 15.0 <= took_over <= 15.0 + 2 * 2.0, took_over
    spec = api.spec()
    assert spec["holderIdentity"] == "pod-b" and spec["leaseTransitions"] == 1
    assert b.is_leader()
    # the old leader, were it only paused, finds the Lease taken at its next renew and gives up at once
    lost: list[str] = []
    a.on_lost = lost.append
    assert not a.renew_once() and lost == ["the Lease was taken by pod-b"]
    assert a.lost and not a.is_leader()


def test_a_standby_that_starts_next_to_a_stale_lease_waits_one_lease_duration(world) -> None:
    _, clock = world
    a = elector(world, "pod-a")
    assert a.acquire(no_stop())
    clock.advance(3600.0)  # pod-a died an hour ago (its renewTime is that old)
    b = elector(world, "pod-b")
    began = clock.monotonic()
    assert b.acquire(no_stop())
    # renewTime is another replica's clock: b counts from when it first saw the record
    assert 15.0 <= clock.monotonic() - began <= 17.0


def test_a_leader_the_api_server_cannot_hear_gives_up_at_its_renew_deadline(world) -> None:
    api, clock = world
    lost: list[str] = []
    a = elector(world, "pod-a", lost)
    assert a.acquire(no_stop())
    acquired_at = clock.monotonic()
    api.down = True
    step = 0.5
    while not lost:
        clock.advance(step)
        if clock.monotonic() - acquired_at < 10.0:
            assert not a.renew_once() and a.check_deadline() and a.is_leader(), clock.monotonic() - acquired_at
        else:
            a.renew_once()
        assert clock.monotonic() - acquired_at <= 10.0 + step
    assert len(lost) == 1 and lost[0].startswith("not renewed within the renew deadline of 10 s")
    assert "Connection refused" in lost[0]
    assert not a.is_leader() and a.lost
    # lost once, whatever runs next; a lost elector never leads again
    assert not a.check_deadline() and not a.renew_once() and len(lost) == 1
    with pytest.raises(RuntimeError):
        a.acquire(no_stop())
    # the leader's calls were cut to what was left of its deadline
    assert all(timeout <= 4.0 for _, timeout in api.calls)
    assert min(timeout for _, timeout in api.calls) < 1.0


def test_a_short_outage_within_the_renew_deadline_keeps_the_leader(world) -> None:
    api, clock = world
    lost: list[str] = []
    a, b = elector(world, "pod-a", lost), elector(world, "pod-b")
    assert a.acquire(no_stop())
    api.down = True
    for _ in range(4):  # 8 s without the API server
        clock.advance(2.0)
        assert not a.renew_once()
        assert not b.try_acquire_or_renew()
    api.down = False
    clock.advance(1.0)
    assert a.renew_once() and a.is_leader() and not lost
    for _ in range(10):
        clock.advance(2.0)
        assert a.renew_once() and not b.try_acquire_or_renew()
    assert api.spec()["holderIdentity"] == "pod-a" and not lost


def test_release_hands_over_to_the_standby_at_once(world) -> None:
    api, clock = world
    a, b = elector(world, "pod-a"), elector(world, "pod-b")
    assert a.acquire(no_stop())
    clock.advance(2.0)
    assert not b.try_acquire_or_renew()
    assert a.release()
    spec = api.spec()
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert not a.is_leader()
    before = clock.monotonic()
    assert b.acquire(no_stop())
    assert clock.monotonic() == before  # no wait at all
    assert api.spec()["holderIdentity"] == "pod-b" and api.spec()["leaseTransitions"] == 1
    # releasing a Lease someone else holds changes nothing
    assert not a.release() and api.spec()["holderIdentity"] == "pod-b"


def test_release_with_the_api_server_away_does_not_raise(world) -> None:
    api, _ = world
    a = elector(world, "pod-a")
    assert a.acquire(no_stop())
    api.down = True
    assert a.release() is False


def test_acquire_returns_false_when_stopped_while_waiting(world) -> None:
    api, clock = world
    a, b = elector(world, "pod-a"), elector(world, "pod-b")
    assert a.acquire(no_stop())
    stop = threading.Event()
    clock.on_wait = lambda: (a.renew_once(), clock.waits >= 5 and stop.set())  # type: ignore[func-returns-value]
    assert b.acquire(stop) is False
    assert api.spec()["holderIdentity"] == "pod-a"


def test_a_standby_with_the_api_server_away_keeps_trying(world) -> None:
    api, clock = world
    api.down = True
    a = elector(world, "pod-a")
    clock.on_wait = lambda: setattr(api, "down", clock.waits < 4)
    assert a.acquire(no_stop())
    assert api.spec()["holderIdentity"] == "pod-a"


def test_lease_body_and_record_round_trip() -> None:
    record = LeaseRecord("pod-a", 15, T0 + 0.25, T0 + 2.0, 4)  # a whole-second renew time too
    doc = client.ApiClient().sanitize_for_serialization(lease_body("ops", "elastream-operator", record, "7"))
    assert doc["apiVersion"] == "coordination.k8s.io/v1" and doc["kind"] == "Lease"
    assert doc["metadata"]["resourceVersion"] == "7"
    assert doc["spec"]["renewTime"] == "2023-11-14T22:13:22.000000+00:00"
    assert record_of(client.V1Lease.model_validate(doc), 15) == record
    assert record_of(client.V1Lease(metadata=client.V1ObjectMeta(name="x")), 9) == LeaseRecord(lease_duration_s=9)


def test_identity_is_the_pod_name_or_host_pid_random(monkeypatch) -> None:
    monkeypatch.setenv("POD_NAME", "elastream-7d9f-abcde")
    assert default_identity() == "elastream-7d9f-abcde"
    monkeypatch.delenv("POD_NAME")
    one, two = default_identity(), default_identity()
    assert one != two and f"-{os.getpid()}-" in one


def test_real_threads_renew_and_a_lost_lease_is_reported_once() -> None:
    """The renew and watchdog threads on the real clock (1 s lease, 0.5 s renew deadline, 0.1 s retry)."""
    api = FakeCoordinationApi()
    lost: list[str] = []
    timing = LeaseTiming(lease_duration_s=1, renew_deadline_s=0.5, retry_period_s=0.1)
    a = LeaderElector(api, LeaderElection("ops", "pod-a", timing), on_lost=lost.append)
    b = LeaderElector(api, LeaderElection("ops", "pod-b", timing))
    assert a.acquire(no_stop())
    time.sleep(1.5)  # longer than the lease: only renewing keeps it
    assert a.is_leader() and not lost
    assert not b.try_acquire_or_renew()
    renewed = sum(1 for op, _ in api.calls if op == "replace")
    assert renewed >= 5, renewed
    api.down = True
    went_down = time.monotonic()
    while not lost and time.monotonic() - went_down < 3.0:
        time.sleep(0.02)
    assert len(lost) == 1 and time.monotonic() - went_down < 0.5 + 0.4, lost
    time.sleep(0.3)
    assert len(lost) == 1 and not a.is_leader()
    api.down = False
    assert b.acquire(no_stop())  # a's claim expires; b is the leader
    b.release()


# ---- the operator's flags ------------------------------------------------------------------------------------------
def parse(*argv: str) -> Any:
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options

    return operator_options(build_parser().parse_args(["operator", "--redis", "redis://127.0.0.1:1/0", *argv]))


def test_without_leader_elect_the_operator_acts_alone(monkeypatch) -> None:
    options = parse()
    assert options.leader_election is None
    assert not hasattr(options, "peering") and not hasattr(options, "standalone")
    assert parse("--standalone").leader_election is None  # still accepted: kopf always runs standalone


def test_leader_elect_flags(monkeypatch) -> None:
    monkeypatch.setenv("POD_NAME", "elastream-0")
    monkeypatch.setenv("POD_NAMESPACE", "elastream-system")
    election = parse("--leader-elect").leader_election
    assert (election.namespace, election.identity, election.name) == (
        "elastream-system", "elastream-0", "elastream-operator"
    )  # fmt: skip
    assert election.timing == LeaseTiming(lease_duration_s=15, renew_deadline_s=10.0, retry_period_s=2.0)
    # what the chart passes
    election = parse(
        "--leader-elect", "--leader-elect-lease-duration", "30", "--leader-elect-renew-deadline", "20",
        "--leader-elect-retry-period", "4", "--leader-elect-namespace", "ops",
    ).leader_election  # fmt: skip
    assert (election.namespace, election.timing) == ("ops", LeaseTiming(30, 20.0, 4.0))
    monkeypatch.delenv("POD_NAMESPACE")
    assert parse("--leader-elect").leader_election.namespace == "default"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--leader-elect-renew-deadline", "15"],
            "error: --leader-elect-renew-deadline: 15 s must be shorter than --leader-elect-lease-duration (15 s)",
        ),
        (
            ["--leader-elect-lease-duration", "8"],
            "error: --leader-elect-renew-deadline: 10 s must be shorter than --leader-elect-lease-duration (8 s)",
        ),
        (
            ["--leader-elect-retry-period", "9"],
            "error: --leader-elect-renew-deadline: 10 s must be longer than 1.2 x --leader-elect-retry-period (9 s)",
        ),
        (["--leader-elect-retry-period", "0"], "error: --leader-elect-retry-period: 0 s; give a positive number"),
        (["--leader-elect-lease-duration", "0"], "error: --leader-elect-lease-duration: 0 s; give at least 1"),
    ],
)
def test_bad_leader_election_timings_are_one_line_and_exit_1(argv: list[str], message: str, capsys) -> None:
    from elastream.cli import main

    assert main(["operator", "--redis", "redis://127.0.0.1:1/0", "--leader-elect", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err


def test_a_bad_timing_is_refused_before_anything_starts_without_a_traceback() -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    argv = ["operator", "--redis", "redis://127.0.0.1:1/0", "--leader-elect", "--leader-elect-renew-deadline", "15"]
    proc = subprocess.run(
        [sys.executable, "-m", "elastream", *argv], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr == (
        "error: --leader-elect-renew-deadline: 15 s must be shorter than --leader-elect-lease-duration (15 s), "
        "so a leader gives up before a standby may take over\n"
    )


def test_the_standby_health_endpoint_answers_until_closed() -> None:
    import urllib.error
    import urllib.request

    from elastream.handlers.main import standby_health
    from support.ports import free_port

    port = free_port()
    with standby_health("127.0.0.1", port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200 and b"standby" in response.read()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_a_lost_lease_ends_the_process_at_once_with_code_1() -> None:
    code = (
        "import logging, threading, time\n"
        "logging.basicConfig(level='INFO', format='%(levelname)s %(name)s: %(message)s')\n"
        "from elastream.handlers.main import exit_on_lost_lease\n"
        "threading.Thread(target=exit_on_lost_lease, args=('the Lease was taken by pod-b',)).start()\n"
        "time.sleep(30)\n"
        "print('still running')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "still running" not in proc.stdout
    assert (
        "CRITICAL elastream.operator: leader election lost (the Lease was taken by pod-b): exiting with code 1 so "
        "that only the new leader acts"
    ) in proc.stderr
