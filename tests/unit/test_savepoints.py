"""Savepoints and the deletion policy: the pure rules (`core.savepoint_rules`, the parser) and the reconcile loop's
handling of the annotations and of `spec.initialSavepoint` over fakes (`FakeSavepoints`, `test_reconciler`'s
World). Real Redis and real workers: tests/integration/test_savepoint_workers.py; a real API server:
tests/e2e/test_operator_savepoints.py."""

from __future__ import annotations

from typing import Any

import pytest
from test_reconciler import World, _Keys, running

from elastream.core import savepoint_rules
from elastream.core.savepoint_rules import (
    SavepointMeta,
    access_problem,
    compatibility_problems,
    name_problem,
    parse_share_with,
    status_entries,
)
from elastream.core.topology import TopologyError, parse_manifest, topology_prefix
from elastream.crd import check_manifest
from support.manifests import edge, manifest, sink, src, work

TAKE = "elastream.dev/savepoint"
SHARE = "elastream.dev/savepoint-share-with"
DELETE = "elastream.dev/delete-savepoint"


def meta(name: str = "sp", namespace: str = "a", shared: tuple[str, ...] = (), **vertices: int) -> SavepointMeta:
    return SavepointMeta(name, namespace, "t", "ckpt-3", "2026-01-01T00:00:00Z", vertices or {"s": 8, "c": 16}, shared)


# ------------------------------------------------------------------------------------------ pure rules


def test_savepoint_names_are_dns_labels_and_a_bad_one_says_where_and_how() -> None:
    assert name_problem("before-upgrade", "x") is None
    for bad in ("", "Upper", "a_b", "-a", "a" * 64, None, 3):
        problem = name_problem(bad, "annotation elastream.dev/savepoint")
        assert problem is not None and problem.startswith("annotation elastream.dev/savepoint: ")
        assert "DNS-1123 label" in problem


def test_share_with_is_a_comma_separated_list_of_namespaces() -> None:
    assert parse_share_with(" b, c ,b,") == (("b", "c"), None)
    assert parse_share_with(None) == ((), None)
    names, problem = parse_share_with("b,Not_A_Namespace")
    assert names == () and problem is not None and SHARE in problem


def test_another_namespace_reads_a_savepoint_only_with_its_grant() -> None:
    assert access_problem(meta(), "a") is None
    assert access_problem(meta(shared=("b",)), "b") is None
    refused = access_problem(meta(shared=("b",)), "c")
    assert refused is not None and refused.startswith("spec.initialSavepoint: ")
    assert f"{SHARE}=c" in refused  # names the fix


def test_vertex_names_and_key_spaces_must_agree_parallelism_need_not() -> None:
    assert compatibility_problems(meta(s=8, c=16), {"s": 8, "c": 16}) == []
    problems = compatibility_problems(meta(s=8, c=16), {"s": 8, "c": 32, "x": 4})
    assert any("lacks vertices of this topology: x" in p for p in problems)
    assert any("maxParallelism of c 16 (here 32)" in p for p in problems)
    assert any("lacks" in p for p in compatibility_problems(meta(s=8, c=16), {"s": 8, "c": 16, "y": 1}))
    assert any("lacks: c" in p for p in compatibility_problems(meta(s=8, c=16), {"s": 8}))


def test_meta_round_trips_through_redis_fields_and_the_status_keeps_the_newest() -> None:
    one = SavepointMeta("sp", "a", "t", "ckpt-3", "2026-01-01T00:00:00Z", {"s": 8}, ("b",), {"out": "1-0"}, 42)
    assert SavepointMeta.from_redis(one.to_redis()) == one
    many = [SavepointMeta(f"sp{i}", "a", "t", f"ckpt-{i}", f"2026-01-01T00:{i:02d}:00Z", {"s": 8}) for i in range(25)]
    entries = status_entries(many)
    assert (
        len(entries) == savepoint_rules.MAX_SAVEPOINTS and entries[-1]["name"] == "sp24" and entries[0]["name"] == "sp5"
    )


def document(**spec: Any) -> dict[str, Any]:
    doc = manifest([src("s", 1), work("w", 1), sink("z", 1)], [edge("s", "w"), edge("w", "z")])
    doc["spec"].update(spec)
    return doc


def test_the_parser_reads_initial_savepoint_and_deletion_policy_with_defaults() -> None:
    topology = parse_manifest(document(initialSavepoint={"name": "sp"}, deletionPolicy="Retain"))
    ref = topology.initial_savepoint
    assert ref is not None and (ref.name, ref.topology, ref.namespace) == ("sp", topology.name, topology.namespace)
    assert topology.deletion_policy == "Retain"
    plain = parse_manifest(document())
    assert plain.initial_savepoint is None and plain.deletion_policy == "Delete"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"initialSavepoint": {"name": "Bad_Name"}}, "spec.initialSavepoint.name: 'Bad_Name' is not a DNS-1123"),
        ({"initialSavepoint": {"topology": "t"}}, "spec.initialSavepoint.name: is missing"),
        ({"initialSavepoint": "sp"}, "spec.initialSavepoint: 'sp' is not a mapping"),
        ({"initialSavepoint": {"name": "sp", "nmespace": "x"}}, "spec.initialSavepoint.nmespace: unknown field"),
        ({"deletionPolicy": "Orphan"}, "spec.deletionPolicy: 'Orphan' is unknown; use one of: Delete, Retain"),
    ],
)
def test_bad_savepoint_fields_are_refused_naming_the_field_and_the_fix(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(TopologyError) as info:
        check_manifest(document(**spec))
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


# ------------------------------------------------------------------------------------------ taking them


def annotate(world: World, **annotations: str | None) -> None:
    current = world.body["metadata"].setdefault("annotations", {})
    for key, value in annotations.items():
        current[key.replace("_", "-")] = value


def test_an_annotation_takes_a_savepoint_from_a_fresh_checkpoint_lists_it_and_is_removed() -> None:
    world = running(3)
    world.body["metadata"]["annotations"] = {TAKE: "before-upgrade", SHARE: "team-b"}
    world.reconcile()
    assert world.checkpoints[-1].taken == ["ckpt-1"]  # taken on demand, not an old one
    assert TAKE not in world.body["metadata"]["annotations"]
    assert "SavepointTaken" in world.reasons()
    (entry,) = world.status["savepoints"]
    assert entry["name"] == "before-upgrade" and entry["checkpoint"] == "ckpt-1" and entry["sharedWith"] == ["team-b"]

    world.body["metadata"]["annotations"] = {TAKE: "before-upgrade"}  # the same name again: refused
    world.reconcile()
    assert world.reasons()[-1] == "SavepointRefused" and TAKE not in world.body["metadata"]["annotations"]
    assert len(world.status["savepoints"]) == 1

    world.body["metadata"]["annotations"] = {DELETE: "before-upgrade"}
    world.reconcile()
    assert world.reasons()[-1] == "SavepointDeleted" and DELETE not in world.body["metadata"]["annotations"]
    assert world.status["savepoints"] == []


def test_a_bad_name_is_a_warning_naming_the_annotation_and_nothing_is_taken() -> None:
    world = running(3)
    world.body["metadata"]["annotations"] = {TAKE: "Not A Name"}
    world.reconcile()
    assert world.checkpoints[-1].taken == []
    event = world.core.events[-1]
    assert event["reason"] == "SavepointRefused" and event["type"] == "Warning"
    assert "annotation elastream.dev/savepoint" in event["message"] and "DNS-1123 label" in event["message"]
    assert TAKE not in world.body["metadata"]["annotations"]
    assert "savepoints" not in world.status


def test_a_failing_checkpoint_is_retried_with_backoff_then_given_up_saying_how_to_retry() -> None:
    world = running(3)
    checkpoints = world.checkpoints[-1]
    checkpoints.failure = "worker node-1 did not answer"
    world.body["metadata"]["annotations"] = {TAKE: "sp"}
    world.reconcile()
    assert world.reasons()[-1] == "SavepointBackoff" and TAKE in world.body["metadata"]["annotations"]
    attempts = len([r for r in world.reasons() if r == "SavepointBackoff"])
    world.reconcile()  # within the backoff: no new attempt
    assert len([r for r in world.reasons() if r == "SavepointBackoff"]) == attempts
    world.run_for(600.0)
    failed = [e for e in world.core.events if e["reason"] == "SavepointFailed"]
    assert len(failed) == 1 and "after 5 attempts" in failed[0]["message"]
    assert f"{TAKE}=sp again" in failed[0]["message"]
    assert TAKE not in world.body["metadata"]["annotations"] and "savepoints" not in world.status

    checkpoints.failure = ""  # annotated again once the worker answers: taken
    world.body["metadata"]["annotations"] = {TAKE: "sp"}
    world.reconcile()
    assert [e["name"] for e in world.status["savepoints"]] == ["sp"]


def test_a_suspended_topology_is_saved_from_its_resume_point_without_starting_anything() -> None:
    world = running(3)
    world.patch_spec(suspend=True)
    world.run_for(5.0)
    assert world.status["phase"] == "Suspended"
    resume_point = world.checkpoints[-1].latest()
    taken = list(world.checkpoints[-1].taken)
    world.body["metadata"]["annotations"] = {TAKE: "parked"}
    world.reconcile()
    assert world.checkpoints[-1].taken == taken  # no checkpoint round: no worker runs
    assert world.status["savepoints"][0]["checkpoint"] == resume_point
    assert world.status["phase"] == "Suspended"


def test_the_status_lists_the_savepoints_again_after_an_operator_restart() -> None:
    world = running(3)
    world.body["metadata"]["annotations"] = {TAKE: "sp"}
    world.reconcile()
    status = dict(world.status)
    status.pop("savepoints")
    again = World(3)  # a new operator: its memory is empty, Redis (the fakes) is the same
    again.savepoints = world.savepoints
    again.rewire(savepoint_service=world.savepoints)
    again.keys, again.checkpoint_keys = world.keys, world.checkpoint_keys
    again.body["status"] = status
    again.reconcile()
    assert [e["name"] for e in again.status["savepoints"]] == ["sp"]


# ------------------------------------------------------------------------------------------ restoring them


def world_from(shared: Any, namespace: str = "default", **spec: Any) -> World:
    """A new topology `t` of `namespace`, with no state of its own, over the savepoints `shared` holds."""
    world = World(3, **spec)
    world.body["metadata"]["namespace"] = namespace
    prefix = topology_prefix(namespace, "t")
    world.savepoints = shared
    world.rewire(savepoint_service=shared)
    shared.stores[prefix], shared.epochs[prefix] = world.checkpoint_keys, world.keys
    return world


def taken(**spec: Any) -> World:
    world = running(3, **spec)
    world.body["metadata"]["annotations"] = {TAKE: "sp", SHARE: "team-b"}
    world.reconcile()
    assert world.status["savepoints"][0]["name"] == "sp"
    return world


def test_a_new_topology_starts_from_the_savepoint_by_the_restore_and_says_so() -> None:
    first = taken()
    second = world_from(first.savepoints, initialSavepoint={"name": "sp", "topology": "t"})
    second.reconcile()
    assert second.status["phase"] == "Running"
    assert first.savepoints.restored == ["default/t/sp"]
    assert len(second.migrator.recovered) == 1  # every executor restored from the seeded checkpoint, not empty
    assert "RestoredFromSavepoint" in second.reasons()
    # it has state of its own now: a later start (an operator restart) does not seed it again
    assert first.savepoints.restore(second.topologies.topologies["default/t"].topology) is None


def test_a_missing_savepoint_is_retried_and_starts_once_it_exists() -> None:
    first = running(3)
    second = world_from(first.savepoints, namespace="later", initialSavepoint={"name": "sp", "topology": "t",
                                                                               "namespace": "default"})  # fmt: skip
    second.reconcile()
    assert second.status["phase"] != "Running" and "StartFailed" in second.reasons()
    assert "no savepoint sp" in second.condition("Ready")["message"]
    first.body["metadata"]["annotations"] = {TAKE: "sp", SHARE: "later"}
    first.reconcile()
    second.run_for(30.0)
    assert second.status["phase"] == "Running" and "RestoredFromSavepoint" in second.reasons()


def test_another_namespace_without_the_grant_is_invalid_spec_naming_the_fix() -> None:
    first = taken()  # shared with team-b only
    second = world_from(
        first.savepoints, namespace="team-c", initialSavepoint={"name": "sp", "topology": "t", "namespace": "default"}
    )
    second.reconcile()
    stalled = second.condition("Stalled")
    assert stalled["reason"] == "InvalidSpec" and "not shared with namespace team-c" in stalled["message"]
    assert f"{SHARE}=team-c" in stalled["message"]
    assert second.status["phase"] != "Running" and first.savepoints.restored == []  # nothing started or seeded
    granted = world_from(
        first.savepoints, namespace="team-b", initialSavepoint={"name": "sp", "topology": "t", "namespace": "default"}
    )
    granted.reconcile()
    assert granted.status["phase"] == "Running"


def test_other_key_spaces_are_invalid_spec_naming_the_vertex() -> None:
    first = taken()
    second = world_from(first.savepoints, namespace="team-b", initialSavepoint={"name": "sp", "namespace": "default"})
    second.body["spec"]["vertices"][1]["maxParallelism"] = 64
    second.reconcile()
    stalled = second.condition("Stalled")
    assert stalled["reason"] == "InvalidSpec" and "maxParallelism of parse" in stalled["message"]


def test_a_topology_with_state_of_its_own_ignores_its_initial_savepoint() -> None:
    first = taken()
    again = world_from(first.savepoints, initialSavepoint={"name": "sp"})
    again.keys["epoch"] = "e-own"  # its own state (an earlier run of it, retained)
    again.body["status"] = {"stateEpoch": "e-own"}
    again.reconcile()
    assert again.status["phase"] == "Running" and first.savepoints.restored == []


# ------------------------------------------------------------------------------------------ deletion policy


def test_retain_keeps_the_keys_and_delete_wipes_them_savepoints_stay_either_way() -> None:
    for retain, left in ((True, 3), (False, 1)):
        world = running(3)
        client = _Keys(
            "elastream:{default/t}:mig:ckpt-1:state:c",
            "elastream:{default/t}:sink:out",
            "elastream:savepoint:{default/t}:sp:meta",
        )
        world.rewire(redis_client=client)
        world.topologies.remove("default", "t", retain=retain)
        assert "workers stopped" in world.backend.log
        assert len(client.keys) == left and "elastream:savepoint:{default/t}:sp:meta" in client.keys
        assert client.commands == [("ACL", "DELUSER", "elastream.default.t")]  # its Redis user goes either way


def test_a_new_resource_over_retained_state_continues_from_it_and_says_so() -> None:
    world = World(3)
    world.keys["epoch"] = "e-old"  # what an earlier topology of this name left (deletionPolicy Retain)
    world.rewire(running_schedule=lambda topology: world_schedule(topology))
    world.reconcile()
    assert world.status["phase"] == "Running" and world.status["stateEpoch"] == "e-old"
    event = next(e for e in world.core.events if e["reason"] == "RetainedStateAdopted")
    assert event["type"] == "Warning" and "deletionPolicy Delete" in event["message"]


def world_schedule(topology: Any) -> Any:
    from elastream.core.schedule import initial_schedule

    return initial_schedule(topology)


# ------------------------------------------------------------------------------------------ the CLI


def test_the_cli_refuses_a_bad_name_or_no_redis_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from elastream.cli import main

    assert main(["savepoint", "list", "--topology", "Bad_Name", "--redis", "redis://x:1/0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --topology: 'Bad_Name' is not a DNS-1123 label") and "Traceback" not in err
    assert main(["savepoint", "delete", "sp", "--topology", "t", "--redis", ""]) == 1
    assert "--redis: no Redis URL" in capsys.readouterr().err


def test_a_restore_of_a_topology_never_started_makes_its_configmap_secret_and_user_before_its_pods() -> None:
    # a new topology from a savepoint (or one re-created over retained state): the restore's apply is the
    # first thing that starts its workers, and they need their ConfigMap, Secret and Redis user first
    from types import SimpleNamespace

    from test_kubernetes_backend import VersionRegistry, backend

    from elastream.core.schedule import initial_schedule

    kube, core = backend()
    schedule = initial_schedule(kube.topology)

    class Empty(VersionRegistry):
        def schedule(self) -> None:
            return None  # a topology never started: nothing in Redis

    kube.registry = Empty()  # type: ignore[assignment]
    kube.control = lambda s: SimpleNamespace(send_nodes=lambda nodes, message: None)  # type: ignore[method-assign]
    seen_at_first_pod: list[bool] = []
    spawn = kube.spawn

    def spawned(node: str, staged_version: int = 0) -> None:
        if not seen_at_first_pod:
            seen_at_first_pod.append("web-topology" in core.config_maps and "web-redis" in core.secrets)
        spawn(node, staged_version)

    kube.spawn = spawned  # type: ignore[method-assign]
    kube.assume(schedule)
    assert core.config_maps == {} and core.secrets == {}
    kube.apply(schedule, "r1")
    assert seen_at_first_pod == [True]
    assert "elastream.default.web" in kube.client.users  # type: ignore[attr-defined]
    assert set(core.pods) == {f"web-{n}" for n in schedule.nodes}
