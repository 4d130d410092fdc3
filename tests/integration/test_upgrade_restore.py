"""A stateful upgrade on real worker processes and a real Redis: the steps the operator's reconcile loop takes
(`ManagedTopologies._upgrade`) with the controller of local mode. The running topology's last checkpoint is
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
from elastream.core.topology import load_manifest
from elastream.core.upgrade import spec_change
from support.harness import controlled, exactly_once, with_audit, write_manifest

pytestmark = pytest.mark.integration

RATE = 200
EVENTS = 5000  # 25 s of the sources: the upgrade lands mid-stream


@pytest.mark.timeout(900)
def test_an_upgrade_restores_kept_vertices_state_into_the_new_spec_exactly_once(tmp_path, redis_url: str) -> None:
    doc = exactly_once(with_audit(load("ccr-diamond"), EVENTS), checkpoint_s=2, rate=RATE, nodes=3)
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    old_path = write_manifest(str(old_dir), doc)
    old = load_manifest(old_path)

    upgraded = copy.deepcopy(doc)
    by_name = {v["name"]: v for v in upgraded["spec"]["vertices"]}
    by_name["t3"]["parallelism"] = 3  # the keyed count: other executors own its key groups
    by_name["t3"]["logic"]["costMs"] = 1.0  # user code config
    by_name["t4"]["logic"]["costMs"] = 3.0
    new_path = write_manifest(str(new_dir), upgraded)
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
