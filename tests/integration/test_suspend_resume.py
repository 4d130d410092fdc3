"""Suspend and resume (`spec.suspend`) on real worker processes, a real Redis and the real controller of local
mode: the same `TopologyController.suspend` / `resume` / `start_suspended` the operator's reconcile loop calls.

A diamond of keyed counts with an audit sink after each (their running counts prove the state continued
exactly) and exactly-once `redis-stream` sinks (their output commits with checkpoints) is suspended in the
middle of its stream: the last checkpoint completes, every worker stops, nothing reaches a sink while it is
suspended, and Redis keeps the state. It is resumed twice: once by the controller that suspended it, and
once by a new controller over a new cluster (an operator restarted while the topology was suspended). At the
end every event has arrived exactly once at every sink and every keyed count is exactly 1..n per key.
"""

from __future__ import annotations

import time

import pytest
from test_control_faults import Events, check_exactly_once_at_end, ticking
from test_migration import load

from elastream.analysis import Analyzer
from elastream.control.backends.local import LocalCluster
from elastream.core.outcomes import Outcome
from elastream.crd import load_manifest
from support.harness import controlled, exactly_once, sink_key, with_audit, write_manifest

pytestmark = pytest.mark.integration

RATE = 200
EVENTS = 6000  # 30 s of the sources at RATE: both suspends land mid-stream


def sink_lengths(cluster: LocalCluster, topology) -> dict[str, int]:
    return {s: int(cluster.client.xlen(sink_key(topology, s))) for s in topology.sinks}


@pytest.mark.timeout(900)
def test_suspend_and_resume_keep_every_event_exactly_once_and_keyed_counts_exact(tmp_path, redis_url: str) -> None:
    doc = exactly_once(with_audit(load("ccr-diamond"), EVENTS), checkpoint_s=2, rate=RATE, nodes=3)
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    analyzer = Analyzer(engine="python")

    # ---- suspend and resume by the same controller
    log = Events()
    cluster, controller = controlled(topology, path, redis_url, analyzer, log)
    with cluster, controller:
        controller.start()
        ticking(controller, 6.0)  # periodic checkpoints commit some output first
        assert sum(sink_lengths(cluster, topology).values()) > 0
        result = controller.suspend()
        assert result.done and result.checkpoint_id, result
        assert cluster.running_nodes() == set() and controller.suspended
        store = controller.migrator.store  # type: ignore[attr-defined]
        assert store.latest_checkpoint()["id"] == result.checkpoint_id  # the resume point, kept in Redis
        frozen = sink_lengths(cluster, topology)
        ticking(controller, 3.0)  # ticks while suspended: no recovery of the stopped workers, no checkpoint
        assert cluster.running_nodes() == set() and sink_lengths(cluster, topology) == frozen
        assert "WorkerLost" not in log.reasons() and store.latest_checkpoint()["id"] == result.checkpoint_id

        report = controller.resume()
        assert report is not None and report.outcome == Outcome.SUCCEEDED, report
        assert report.restored_from == result.checkpoint_id
        assert cluster.running_nodes() == set(cluster.current_schedule().nodes)
        assert log.reasons()[-1] == "Resumed"
        ticking(controller, 6.0)

        # ---- suspended again, then the controller goes away with its cluster (an operator restart)
        again = controller.suspend()
        assert again.done and again.checkpoint_id and again.checkpoint_id != result.checkpoint_id
        schedule = cluster.current_schedule()

    # ---- a new controller over a new cluster finds it suspended, starts nothing, and resumes it
    log = Events()
    cluster, controller = controlled(topology, path, redis_url, analyzer, log)
    with cluster, controller:
        assert controller.start_suspended(schedule) is True
        assert cluster.running_nodes() == set() and controller.resume_point == again.checkpoint_id
        time.sleep(1.0)
        report = controller.resume()
        assert report is not None and report.outcome == Outcome.SUCCEEDED, report
        assert report.restored_from == again.checkpoint_id
        check_exactly_once_at_end(cluster, topology, EVENTS, controller)
