"""A checkpoint round spans reconcile passes (issue 38): on a real Redis, with workers that never acknowledge,
each `Checkpointer.tick` takes one look and returns, the round fails at its deadline, failed rounds in a row
back off, and a migration about to claim the topology makes the open round give way instead of waiting on it.
(That one topology's unanswered round holds no reconcile thread is what lets the others go on: the fairness
test of tests/integration/test_reconcile_fairness.py shows it with the operator's pool.)"""

from __future__ import annotations

import itertools

import pytest
import redis

from elastream.control.checkpoint_driver import FAILED_ROUNDS_BACKOFF_CAP_S, CheckpointDriver, Checkpointer
from elastream.core.schedule import initial_schedule
from elastream.core.topology import parse_manifest
from elastream.store.checkpoint_store import CheckpointStore
from support.fakes import FakeBackend, ManualClock

pytestmark = pytest.mark.integration

MANIFEST = {
    "apiVersion": "elastream.dev/v1alpha1",
    "kind": "StreamTopology",
    "metadata": {"name": "silent", "namespace": "rounds"},
    "spec": {
        "nodes": 2,
        "slotsPerNode": 2,
        "vertices": [
            {"name": "source", "source": {"type": "synthetic", "rate": 10}, "parallelism": 1},
            {"name": "sink", "sink": {"type": "null"}, "parallelism": 1},
        ],
        "streams": [{"from": "source", "to": "sink"}],
    },
}


class SilentWorkers(FakeBackend):
    """Workers that are alive and never acknowledge a checkpoint (nothing reads their control lists)."""

    def check_alive(self) -> None:
        return None


@pytest.fixture
def silent(redis_url: str):
    topology = parse_manifest(MANIFEST)
    backend = SilentWorkers()
    backend.start(initial_schedule(topology))
    client = redis.Redis.from_url(redis_url)
    clock = ManualClock()
    driver = CheckpointDriver(topology, backend, client, timeout_s=30.0, clock=clock)
    yield topology, backend, client, clock, driver
    for key in client.scan_iter(match=f"{topology.redis_prefix}*"):
        client.delete(key)
    client.close()


def test_a_round_nobody_acknowledges_is_followed_one_look_per_tick_and_fails_at_its_deadline(silent) -> None:
    topology, _, client, clock, driver = silent
    checkpointer = Checkpointer(driver, interval_s=10.0, own_thread=False).start()
    clock.t += 10.0
    assert checkpointer.tick() is None  # the round began; the tick did not wait for it
    assert driver.round_open
    checkpoint_id = driver.store.current()
    assert checkpoint_id is not None and checkpoint_id.startswith("ckpt-")
    # the sources were told: the barrier is on their control list, nothing acknowledges it
    assert client.llen(f"{topology.redis_prefix}control:node-0") + client.llen(f"{topology.redis_prefix}control:node-1")
    for _ in range(5):
        clock.t += 5.0
        assert checkpointer.tick() is None and driver.round_open  # 25 s in: still waiting, pass after pass
    clock.t += 6.0
    result = checkpointer.tick()
    assert result is not None and result.outcome == "failed" and "timed out" in result.reason, result
    assert not driver.round_open
    assert driver.store.current() is None  # its claim went with it: a migration may claim the topology
    assert CheckpointStore(client, topology.redis_prefix).latest_checkpoint() is None


def test_failed_rounds_in_a_row_back_off_and_the_pause_is_capped(silent) -> None:
    _, _, _, clock, driver = silent
    interval = 10.0
    checkpointer = Checkpointer(driver, interval_s=interval, own_thread=False).start()
    began_at: list[float] = []
    for _ in range(7):
        # step the clock one second at a time until a round begins, then let it time out
        for _ in range(2000):
            clock.t += 1.0
            checkpointer.tick()
            if driver.round_open:
                break
        assert driver.round_open, "no round began"
        began_at.append(clock.t)
        clock.t += 31.0
        result = checkpointer.tick()
        assert result is not None and result.outcome == "failed"
    assert checkpointer.failures == 7
    # from the end of one failed round to the start of the next: the interval doubling per failure, capped
    pauses = [later - (earlier + 31.0) for earlier, later in itertools.pairwise(began_at)]
    expected = [min(FAILED_ROUNDS_BACKOFF_CAP_S, interval * 2**n) for n in range(len(pauses))]
    assert pauses == pytest.approx(expected, abs=1.0), pauses


def test_a_migration_about_to_claim_the_topology_makes_the_open_round_give_way(silent) -> None:
    topology, _, client, clock, driver = silent
    checkpointer = Checkpointer(driver, interval_s=10.0, own_thread=False).start()
    clock.t += 10.0
    checkpointer.tick()
    assert driver.round_open
    given_up = driver.abandon_open("ccr migration abc claims the topology")
    assert given_up is not None and given_up.outcome == "failed"
    assert "claims the topology" in given_up.reason
    assert not driver.round_open and driver.store.current() is None
    store = CheckpointStore(client, topology.redis_prefix)
    assert store.begin("abcdef012345", {"id": "abcdef012345"})  # the migration's claim now succeeds
    assert driver.abandon_open("again") is None  # nothing left to give up
