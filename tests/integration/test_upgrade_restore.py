"""A stateful upgrade on real worker processes and a real Redis: the steps the operator's reconcile loop takes
(`control.upgrades.Upgrades`) with the controller of local mode. The running topology's last checkpoint is
taken and its workers stop (`suspend(announce=False)`); a controller of the new spec (user code config changed,
the keyed count's degree changed: its key groups land on other executors of another schedule) takes it over
stopped (`start_suspended`) and starts its workers from that checkpoint (`restart_from_checkpoint`, the
recovery's restore). At the end every event reached every exactly-once sink exactly once and every keyed count
ran 1..n per key across the upgrade: the kept vertex's key groups carried their state.
"""

from __future__ import annotations

import copy

import pytest
from test_control_faults import Events, check_exactly_once_at_end, ticking
from test_migration import load

from elastream.analysis import Analyzer
from elastream.core.outcomes import Outcome
from elastream.core.upgrade import spec_change
from elastream.crd import load_manifest
from support.harness import (
    controlled,
    exactly_once,
    expected_copies,
    id_counts,
    sink_events,
    wait_for_sinks_idle,
    with_audit,
    write_manifest,
)
from support.harness import ticking as ticking_in_background

pytestmark = pytest.mark.integration

RATE = 200
EVENTS = 5000  # 25 s of the sources: the upgrade lands mid-stream


@pytest.mark.timeout(900)
def test_an_upgrade_restores_kept_vertices_state_into_the_new_spec_exactly_once(tmp_path, redis_url: str) -> None:
    doc = exactly_once(with_audit(load("ccr-diamond"), EVENTS), checkpoint_s=2, rate=RATE, nodes=3)
    old_path, new_dir = written(tmp_path, doc)
    old = load_manifest(old_path)

    upgraded = copy.deepcopy(doc)
    by_name = {v["name"]: v for v in upgraded["spec"]["vertices"]}
    by_name["t3"]["parallelism"] = 3  # the keyed count: other executors own its key groups
    by_name["t3"]["logic"]["costMs"] = 1.0  # user code config
    by_name["t4"]["logic"]["costMs"] = 3.0
    new_path = write_manifest(new_dir, upgraded)
    new = load_manifest(new_path)
    change = spec_change(old, new)
    assert change.needs_restart and change.added == change.removed == () and change.refused == ()

    analyzer = Analyzer(engine="python")
    log = Events()
    cluster, controller = controlled(old, old_path, redis_url, analyzer, log)
    with cluster, controller:
        controller.start()
        ticking(controller, 6.0)  # periodic checkpoints commit some output first
        result = controller.suspend(announce=False)
        assert result.done and result.checkpoint_id, result
        assert cluster.running_nodes() == set()
        assert "Suspended" not in log.reasons()  # the upgrade says what it does itself

    log = Events()
    cluster, controller = controlled(new, new_path, redis_url, analyzer, log)
    with cluster, controller:
        assert controller.start_suspended(None) is True
        report = controller.restart_from_checkpoint("upgrading to generation 2")
        assert report is not None and report.outcome == Outcome.SUCCEEDED, report
        assert report.restored_from == result.checkpoint_id
        assert cluster.current_schedule().parallelism()["t3"] == 3
        check_exactly_once_at_end(cluster, new, EVENTS, controller)


@pytest.mark.timeout(900)
def test_an_upgrade_that_adds_and_removes_vertices_starts_the_added_empty_and_drops_the_removed(
    tmp_path, redis_url: str
) -> None:
    """A keyed count removed (`t6`) and another added (`t7`) in its place, on real workers: the kept count's
    key groups carry their state, the added one starts empty (its counts run 1..n per key from the restore on),
    and every event is counted exactly once by one of the two: what the removed count's audit sink committed up
    to the checkpoint and what the added one's received after it are disjoint and together every event."""
    doc = exactly_once(with_audit(_with_count(load("ccr-diamond"), "t6"), EVENTS), checkpoint_s=2, rate=RATE, nodes=3)
    old_path, new_dir = written(tmp_path, doc)
    old = load_manifest(old_path)

    upgraded = copy.deepcopy(doc)
    spec = upgraded["spec"]
    for entry in spec["vertices"]:
        entry["name"] = {"t6": "t7", "audit-t6": "audit-t7"}.get(entry["name"], entry["name"])
    for stream in spec["streams"]:
        for end in ("from", "to"):
            stream[end] = {"t6": "t7", "audit-t6": "audit-t7"}.get(stream[end], stream[end])
    new_path = write_manifest(new_dir, upgraded)
    new = load_manifest(new_path)
    change = spec_change(old, new)
    assert set(change.added) == {"t7", "audit-t7"} and set(change.removed) == {"t6", "audit-t6"}, change
    assert change.needs_restart and change.refused == ()

    analyzer = Analyzer(engine="python")
    cluster, controller = controlled(old, old_path, redis_url, analyzer, Events())
    with cluster, controller:
        controller.start()
        ticking(controller, 6.0)
        result = controller.suspend(announce=False)
        assert result.done and result.checkpoint_id, result
        before = id_counts(sink_events(cluster.client, old, "audit-t6"))
    assert before, "the removed count committed nothing before the upgrade: the test proves nothing"

    cluster, controller = controlled(new, new_path, redis_url, analyzer, Events())
    with cluster, controller:
        assert controller.start_suspended(None) is True
        report = controller.restart_from_checkpoint("upgrading to generation 2")
        assert report is not None and report.outcome == Outcome.SUCCEEDED, report
        assert report.restored_from == result.checkpoint_id
        assert set(cluster.current_schedule().parallelism()) == set(new.vertices)
        with ticking_in_background(controller):
            wait_for_sinks_idle(cluster, new, quiet_s=10.0, timeout_s=600.0)
        truth = expected_copies(new, range(EVENTS))
        for sink in ("sink", "audit-t3"):  # the unchanged paths: every event as before the upgrade
            got = id_counts(sink_events(cluster.client, new, sink))
            assert got == truth[sink], f"{sink}: {sum(got.values())} of {sum(truth[sink].values())} copies"
        assert _counts_run_from_one(sink_events(cluster.client, new, "audit-t3"))
        after_events = sink_events(cluster.client, new, "audit-t7")
        after = id_counts(after_events)
    assert after and max(after.values()) == 1 and max(before.values()) == 1
    assert not set(before) & set(after), "an event counted by both the removed and the added vertex"
    assert set(before) | set(after) == set(range(EVENTS)), "an event counted by neither"
    assert _counts_run_from_one(after_events), "the added count did not start empty"


def written(tmp_path, doc: dict) -> tuple[str, str]:
    """The running spec written to `old/` (its path) and the directory `new/` for the upgraded one."""
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    return write_manifest(str(old_dir), doc), str(new_dir)


def _with_count(doc: dict, name: str) -> dict:
    """The diamond with one more keyed count `name` beside t3 (t1 -> name -> t5)."""
    doc = copy.deepcopy(doc)
    spec = doc["spec"]
    spec["vertices"].insert(
        4,
        {
            "name": name,
            "logic": {"builtin": "count", "key": "key", "costMs": 1.0},
            "stateful": True,
            "parallelism": 2,
            "maxParallelism": 16,
        },
    )
    spec["streams"] += [
        {"from": "t1", "to": name, "grouping": "fields", "key": "key"},
        {"from": name, "to": "t5", "grouping": "shuffle"},
    ]
    spec["slotsPerNode"] += 2
    return doc


def _counts_run_from_one(events: list[dict]) -> bool:
    """Whether a keyed count's running values are 1..n for every key (nothing carried in, nothing twice)."""
    per_key: dict[str, list[int]] = {}
    for event in events:
        per_key.setdefault(event["key"], []).append(int(event["value"]))
    return bool(per_key) and all(sorted(v) == list(range(1, len(v) + 1)) for v in per_key.values())
