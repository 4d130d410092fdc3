"""The long-suspend test: a suspended topology keeps its latest checkpoint for as long as it stays suspended
(none of its keys has a TTL), and a resume whose checkpoint lost its state (keys deleted by hand, a Redis
restored without them) reports StateLost instead of starting every vertex empty and the sources over.

Real worker processes, a real Redis and the real controller of local mode (as test_suspend_resume.py)."""

from __future__ import annotations

import pytest
from test_control_faults import Events, ticking
from test_migration import load

from elastream.analysis import Analyzer
from elastream.core.ports import StateLost
from elastream.crd import load_manifest
from support.harness import controlled, exactly_once, with_audit, write_manifest

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lose", ["state", "positions"])
def test_the_latest_checkpoint_never_expires_and_a_resume_without_its_state_is_state_lost(
    lose: str, tmp_path, redis_url: str
) -> None:
    doc = exactly_once(with_audit(load("ccr-linear"), 6000), checkpoint_s=2, rate=200, nodes=2)
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    log = Events()
    cluster, controller = controlled(topology, path, redis_url, Analyzer(engine="python"), log)
    with cluster, controller:
        controller.start()
        ticking(controller, 5.0)  # periodic checkpoints
        result = controller.suspend()
        assert result.done and result.checkpoint_id, result
        client, prefix = cluster.client, topology.redis_prefix
        m = f"{prefix}mig:{result.checkpoint_id}"
        keys = [k.decode() for k in client.scan_iter(match=f"{m}:*")]
        assert f"{m}:state:t3" in keys and f"{m}:position" in keys, keys
        # a day and more later it is all still there: no key of the latest checkpoint has a TTL
        assert {k: client.ttl(k) for k in [*keys, f"{prefix}ckpt:latest"]} == dict.fromkeys(
            [*keys, f"{prefix}ckpt:latest"], -1
        )
        # and the rounds it replaced are gone, none left behind without a TTL
        others = {k.decode() for k in client.scan_iter(match=f"{prefix}mig:*")} - {*keys, f"{prefix}mig:owner"}
        assert others == set(), others
        latest = controller.migrator.store.latest_checkpoint()  # type: ignore[attr-defined]
        assert latest["contents"]["state"] == ["t3"] and latest["contents"]["positions"] >= 1, latest

        if lose == "state":
            client.delete(*[k for k in keys if k.startswith(f"{m}:state:")])
        else:
            client.delete(f"{m}:position")
        with pytest.raises(StateLost, match=f"checkpoint {result.checkpoint_id}") as lost:
            controller.resume()
        assert ("the state of t3 is gone" if lose == "state" else "source positions are gone") in str(lost.value)
        assert cluster.running_nodes() == set()  # nothing started empty
        assert controller.suspended  # still suspended: the user decides (restart-from-scratch, or restore)
