"""Stateful upgrades in the reconcile loop, over the fakes of test_reconciler: a change the running schedule
cannot take in place goes through a checkpoint, the old pods stopped and new ones started from it; new pods
that do not start are rolled back; observedGeneration follows what is applied."""

from __future__ import annotations

import copy
from typing import Any

from test_reconciler import World, gitops_conditions, restarted_operator, running

from elastream.core.ports import BackendError

NODES = {"node-0", "node-1", "node-2"}


def observed_while(world: World, phase: str) -> set[int]:
    """The observedGeneration the status had whenever its phase was `phase` (replaying the patches)."""
    status: dict[str, Any] = {}
    seen = set()
    for patch in world.custom.status_patches:
        status.update({k: v for k, v in patch.items() if v is not None})
        if status.get("phase") == phase:
            seen.add(status.get("observedGeneration"))
    return seen


def test_an_image_change_checkpoints_stops_the_old_pods_and_starts_new_ones_from_the_checkpoint() -> None:
    world = running(3)
    old = world.backend
    world.patch_spec(image="elastream-worker:2")
    world.run_for(5.0)
    assert old.log == ["checkpoint ckpt-1", "workers stopped"]  # the checkpoint first, then the stop
    assert len(world.backends) == 2  # a controller of the new spec, its pods from the checkpoint
    controller = world.topologies.topologies["default/t"].controller
    assert controller is not None and controller.topology.spec["image"] == "elastream-worker:2"
    assert world.migrator.recovered == [{n: "upgrading to generation 2" for n in sorted(NODES)}]
    assert world.pods == NODES
    status = world.status
    assert status["phase"] == "Running" and status["observedGeneration"] == 2
    assert status["lastUpgrade"]["outcome"] == "Upgraded" and status["lastUpgrade"]["checkpoint"] == "ckpt-1"
    assert status["lastUpgrade"]["generation"] == 2 and status["lastUpgrade"]["replayed"] == 321
    assert gitops_conditions(world) == {"Ready": ("True", "AsExpected")}
    assert world.reasons().count("UpgradeStarted") == 1 and world.reasons().count("Upgraded") == 1
    world.run_for(60.0)
    assert len(world.backends) == 2  # applied once


def test_observed_generation_lags_while_the_upgrade_is_in_flight() -> None:
    world = running(3)
    assert world.status["observedGeneration"] == 1
    world.patch_spec(image="elastream-worker:2")
    world.run_for(5.0)
    assert observed_while(world, "Upgrading") == {1}  # kstatus: InProgress until the new pods run
    assert world.status["observedGeneration"] == 2
    upgrading = [p for p in world.custom.status_patches if p.get("phase") == "Upgrading"]
    conditions = {c["type"]: c for c in upgrading[0]["conditions"]}
    assert conditions["Reconciling"]["reason"] == "Upgrading" and conditions["Ready"]["status"] == "False"


def test_observed_generation_lags_while_a_scaling_is_pending_and_catches_up_when_it_ran() -> None:
    world = running(3)
    world.patch_spec(nodes=4)
    world.reconcile()  # the burst settles first: nothing moved yet
    assert world.status["observedGeneration"] == 1
    world.run_for(5.0)
    assert world.status["nodes"] == 4 and world.status["observedGeneration"] == 2


def test_a_user_code_change_keeps_the_state_of_kept_vertices_and_drops_a_removed_ones_with_a_warning() -> None:
    world = running(3)
    spec = copy.deepcopy(world.body["spec"])
    spec["vertices"][1] = {"name": "tokenize", "parallelism": 2, "logic": {"builtin": "work", "costMs": 1}}
    spec["streams"] = [{"from": "s", "to": "tokenize", "grouping": "shuffle"}, {"from": "tokenize", "to": "z"}]
    world.patch_spec(**spec)
    world.run_for(5.0)
    dropped = [e for e in world.core.events if e["reason"] == "StateDropped"]
    assert len(dropped) == 1 and "parse" in dropped[0]["message"] and dropped[0]["type"] == "Warning"
    started = next(e["message"] for e in world.core.events if e["reason"] == "UpgradeStarted")
    assert "tokenize" in started and "starting empty" in started
    assert world.status["phase"] == "Running" and world.status["observedGeneration"] == 2
    assert [v["name"] for v in world.status["vertices"]] == ["s", "tokenize", "z"]


def test_new_pods_that_do_not_start_are_rolled_back_to_the_previous_spec_and_the_generation_stalls() -> None:
    world = running(3)
    world.broken_images.add("elastream-worker:broken")
    world.patch_spec(image="elastream-worker:broken")
    world.run_for(5.0)
    # old controller, the failed new one, the previous spec's restored one
    assert len(world.backends) == 3
    controller = world.topologies.topologies["default/t"].controller
    assert controller is not None and controller.topology.spec.get("image") is None  # the previous spec runs
    assert world.migrators[1].abandoned == 1  # the failed restore is forgotten: nothing finishes it later
    assert world.migrators[2].recovered == [{n: "rolling back a failed upgrade" for n in sorted(NODES)}]
    assert world.pods == NODES
    status = world.status
    assert status["observedGeneration"] == 2  # judged: kstatus says Failed, not InProgress forever
    assert status["phase"] == "Degraded"
    assert gitops_conditions(world) == {"Ready": ("False", "UpgradeFailed"), "Stalled": ("True", "UpgradeFailed")}
    assert "rolled back" in world.condition("Stalled")["message"] and "ckpt-1" in world.condition("Stalled")["message"]
    assert status["lastUpgrade"]["outcome"] == "RolledBack"
    assert world.reasons().count("UpgradeFailed") == 1 and world.reasons().count("UpgradeRolledBack") == 1
    world.run_for(120.0)
    assert len(world.backends) == 3  # the generation is not tried again
    world.patch_spec(image="elastream-worker:3")  # the fix: applied at once
    world.run_for(5.0)
    assert len(world.backends) == 4 and world.status["phase"] == "Running"
    assert gitops_conditions(world) == {"Ready": ("True", "AsExpected")}
    assert world.status["observedGeneration"] == 3 and world.status["lastUpgrade"]["outcome"] == "Upgraded"


def test_reverting_a_rolled_back_spec_clears_the_stall_without_a_restart() -> None:
    world = running(3)
    world.broken_images.add("elastream-worker:broken")
    world.patch_spec(image="elastream-worker:broken")
    world.run_for(5.0)
    world.body["spec"].pop("image")
    world.body["metadata"]["generation"] += 1
    world.run_for(5.0)
    assert len(world.backends) == 3 and world.status["phase"] == "Running"
    assert gitops_conditions(world) == {"Ready": ("True", "AsExpected")}
    assert world.status["observedGeneration"] == 3


def test_an_operator_restarted_after_a_rollback_does_not_try_the_generation_again() -> None:
    world = running(3)
    world.broken_images.add("elastream-worker:broken")
    world.patch_spec(image="elastream-worker:broken")
    world.run_for(5.0)
    restarted = World(3)
    restarted.body, restarted.custom.body = world.body, world.body
    restarted.pods, restarted.keys, restarted.checkpoint_keys = world.pods, world.keys, world.checkpoint_keys
    restarted.running_doc = world.running_doc  # the ConfigMap: the previous spec runs
    restarted.broken_images = world.broken_images
    restarted.rewire(custom_api=world.custom)
    restarted.run_for(60.0)
    assert len(restarted.backends) == 1  # adopted the previous spec's pods; nothing upgraded again
    assert gitops_conditions(restarted) == {"Ready": ("False", "UpgradeFailed"), "Stalled": ("True", "UpgradeFailed")}


def test_a_spec_changed_while_no_operator_ran_is_upgraded_not_assumed() -> None:
    world = running(3)
    restarted = World(3)
    restarted.body, restarted.custom.body = world.body, world.body
    restarted.pods, restarted.keys, restarted.checkpoint_keys = world.pods, world.keys, world.checkpoint_keys
    restarted.running_doc = world.running_doc
    restarted.rewire(custom_api=world.custom)
    world.patch_spec(image="elastream-worker:2")  # while no operator runs
    restarted.run_for(5.0)
    first, second = restarted.backends
    assert first.log == ["checkpoint ckpt-1", "workers stopped"]  # the old pods were adopted, then upgraded
    assert second.started == [] and restarted.migrator.recovered  # the new ones came from the checkpoint
    controller = restarted.topologies.topologies["default/t"].controller
    assert controller is not None and controller.topology.spec["image"] == "elastream-worker:2"
    assert restarted.status["observedGeneration"] == 2


def test_a_checkpoint_that_fails_stops_nothing_and_the_upgrade_is_retried_with_backoff() -> None:
    world = running(3)
    world.checkpoints[-1].failure = "checkpoint ckpt-1 timed out: node-2 did not ack"
    world.patch_spec(image="elastream-worker:2")
    world.run_for(3.0)
    assert world.pods == NODES and "workers stopped" not in world.backend.log and len(world.backends) == 1
    assert world.status["phase"] == "Upgrading" and "did not ack" in world.condition("Progressing")["message"]
    assert world.reasons().count("UpgradeBackoff") == 1 and world.status["observedGeneration"] == 1
    world.checkpoints[-1].failure = ""
    world.run_for(30.0)
    assert len(world.backends) == 2 and world.status["phase"] == "Running"
    assert world.status["observedGeneration"] == 2


def test_a_kept_stateful_vertex_changing_its_key_groups_is_refused_and_nothing_restarts() -> None:
    world = running(3)
    spec = copy.deepcopy(world.body["spec"])
    spec["vertices"][1]["stateful"] = True
    world = running(3, vertices=spec["vertices"])
    spec["vertices"][1]["maxParallelism"] = 64
    world.patch_spec(vertices=spec["vertices"])
    world.run_for(30.0)
    assert len(world.backends) == 1 and "workers stopped" not in world.backend.log
    assert gitops_conditions(world) == {"Ready": ("False", "UpgradeRefused"), "Stalled": ("True", "UpgradeRefused")}
    assert "spec.vertices[1].maxParallelism: 128 → 64" in world.condition("Stalled")["message"]
    assert world.reasons().count("UpgradeRefused") == 1 and world.status["observedGeneration"] == 2


def test_scaling_settings_rebuild_the_operator_side_and_adopt_the_running_pods() -> None:
    world = running(3)
    world.patch_spec(scaling={"checkpointIntervalSeconds": 5})
    world.run_for(5.0)
    assert len(world.backends) == 2 and world.backends[0].log == []  # no checkpoint, no stop
    assert world.pods == NODES and world.migrator.recovered == []
    controller = world.topologies.topologies["default/t"].controller
    assert controller is not None and controller.topology.scaling.checkpoint_interval_s == 5
    assert world.status["observedGeneration"] == 2 and world.reasons().count("Upgraded") == 1


def test_an_upgrade_asked_while_suspended_applies_on_resume_from_the_suspends_checkpoint() -> None:
    world = running(3)
    world.patch_spec(suspend=True)
    world.run_for(1.0)
    world.patch_spec(image="elastream-worker:2")
    world.run_for(10.0)
    assert world.status["phase"] == "Suspended" and world.pods == set()
    assert world.status["observedGeneration"] == 3  # suspended as asked: Current
    world.patch_spec(suspend=False)
    world.run_for(10.0)
    controller = world.topologies.topologies["default/t"].controller
    assert controller is not None and controller.topology.spec["image"] == "elastream-worker:2"
    assert world.status["phase"] == "Running" and world.pods == NODES


def test_the_upgrade_is_recorded_in_the_configmap_before_anything_stops_and_cleared_after() -> None:
    world = running(3)
    world.patch_spec(image="elastream-worker:2")
    world.run_for(5.0)
    assert world.configmap == {}  # done: no upgrade in flight
    world.backends[-1].configmap_error = BackendError("ConfigMap t-topology: Service Unavailable")
    world.patch_spec(image="elastream-worker:3")
    world.run_for(3.0)
    # the record could not be written: nothing stopped, retried with backoff
    assert len(world.backends) == 2 and "workers stopped" not in world.backend.log
    assert world.reasons().count("UpgradeBackoff") == 1 and world.status["phase"] == "Upgrading"
    world.backends[-1].configmap_error = None
    world.run_for(30.0)
    assert len(world.backends) == 3 and world.status["observedGeneration"] == 3 and world.configmap == {}


def test_an_operator_restarted_in_the_middle_of_an_upgrade_stops_its_pods_and_upgrades_again() -> None:
    world = running(3)
    previous = {"spec": copy.deepcopy(world.body["spec"])}
    world.patch_spec(image="elastream-worker:2")
    # the old operator died after recording the upgrade and starting the new pods, before they ran
    world.configmap["previous"] = previous
    world.running_doc = {"spec": copy.deepcopy(world.body["spec"])}
    world.checkpoint_keys["ckpt:latest"] = "ckpt-5"
    restarted = restarted_operator(world)
    restarted.run_for(5.0)
    first = restarted.backends[0]
    assert first.log[0] == "workers stopped"  # whatever the interrupted upgrade had started
    assert "UpgradeStarted" in restarted.reasons() and "ckpt-5" in next(
        e["message"] for e in restarted.core.events if e["reason"] == "UpgradeStarted"
    )
    controller = restarted.topologies.topologies["default/t"].controller
    assert controller is not None and controller.topology.spec["image"] == "elastream-worker:2"
    assert restarted.migrators[0].recovered == []  # the previous spec was not restored first: one restore
    assert restarted.migrator.recovered == [{n: "upgrading to generation 2" for n in sorted(NODES)}]
    assert restarted.status["phase"] == "Running" and restarted.configmap == {}


def test_an_interrupted_upgrade_whose_pods_cannot_start_is_rolled_back_after_an_operator_restart() -> None:
    world = running(3)
    previous = {"spec": copy.deepcopy(world.body["spec"])}
    world.broken_images.add("elastream-worker:broken")
    world.patch_spec(image="elastream-worker:broken")
    world.configmap["previous"] = previous
    world.running_doc = {"spec": copy.deepcopy(world.body["spec"])}  # the new pods, stuck
    world.checkpoint_keys["ckpt:latest"] = "ckpt-5"
    restarted = restarted_operator(world)
    restarted.run_for(5.0)
    controller = restarted.topologies.topologies["default/t"].controller
    assert controller is not None and controller.topology.spec.get("image") is None  # the previous spec
    assert restarted.pods == NODES and restarted.status["observedGeneration"] == 2
    assert gitops_conditions(restarted) == {"Ready": ("False", "UpgradeFailed"), "Stalled": ("True", "UpgradeFailed")}


def test_an_upgrade_asked_while_suspended_restores_once_into_the_new_spec() -> None:
    world = running(3)
    world.patch_spec(suspend=True)
    world.run_for(1.0)
    world.patch_spec(image="elastream-worker:2", suspend=False)
    world.run_for(10.0)
    assert world.migrators[0].recovered == []  # not resumed into the old spec first
    assert world.migrator.recovered == [{n: "upgrading to generation 3" for n in sorted(NODES)}]
    assert world.status["phase"] == "Running" and world.status["observedGeneration"] == 3


def test_a_configmap_edited_to_an_image_outside_the_allow_list_brings_no_pod_of_it() -> None:
    """The ConfigMap lives in the tenant's namespace: an operator taking the topology over never starts (nor
    rolls back to) an image the allow list refuses, whatever the ConfigMap says ran."""
    world = running(3)
    world.running_doc = {"spec": {**copy.deepcopy(world.body["spec"]), "image": "evil/miner:1"}}
    world.configmap["previous"] = {"spec": {**copy.deepcopy(world.body["spec"]), "image": "evil/miner:1"}}
    restarted = restarted_operator(world)
    restarted.rewire(allowed_images=("elastream-worker",))
    restarted.run_for(5.0)
    assert restarted.built_images and "evil/miner:1" not in restarted.built_images
    assert restarted.status["phase"] == "Running"


def test_an_upgrade_waiting_for_redis_leaves_observed_generation_behind() -> None:
    world = running(3)
    redis_back = world.redis_away()
    world.run_for(5.0)  # the passes see Redis away
    assert world.condition("Progressing")["reason"] == "RedisUnavailable"
    world.patch_spec(image="elastream-worker:2")
    world.run_for(10.0)
    assert len(world.backends) == 1 and world.pods == NODES  # nothing can be checkpointed: it waits
    assert world.status["observedGeneration"] == 1  # not applied: GitOps tools keep waiting
    redis_back()
    world.run_for(10.0)
    assert len(world.backends) == 2 and world.status["observedGeneration"] == 2
