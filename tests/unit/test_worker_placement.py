"""The operator's allow-list of worker pod placement (issue 38; the chart's worker.placement,
$ELASTREAM_WORKER_PLACEMENT): a topology's spec.placement reaches its pods only as far as `PlacementPolicy`
allows, never tolerates the control plane, and anything else is refused before a pod exists, with the field and
the fix in the topology's status and events."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kubernetes_backend import backend
from test_reconciler import World

from elastream.cli import CommandError
from elastream.control.backends.worker_objects import (
    CONTROL_PLANE_KEYS,
    AllowedToleration,
    PlacementPolicy,
    PlacementRefused,
    WorkerPodSettings,
    placement_problems,
    worker_pod,
)
from elastream.core.ports import BackendError
from elastream.core.topology import parse_manifest
from support.manifests import edge, manifest, sink, src

OWNER = {"name": "t", "uid": "u-1"}
CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
#: what a cluster administrator who trusts every tenant might write: every key, every value, every effect
ANYTHING = PlacementPolicy((AllowedToleration("*"),), ("*",), True)
DEDICATED = PlacementPolicy(
    (AllowedToleration("dedicated", "streams", "NoSchedule"), AllowedToleration("spot", effect="NoSchedule")),
    ("topology.kubernetes.io/zone", "pool.example.com/*"),
    True,
)


def topology(placement: dict[str, Any], namespace: str = "team-a") -> Any:
    document = manifest([src("s"), sink("z")], [edge("s", "z")], placement=placement)
    document["metadata"]["namespace"] = namespace
    return parse_manifest(document)


def pod(placement: dict[str, Any], policy: PlacementPolicy | None = None) -> dict[str, Any]:
    settings_ = WorkerPodSettings() if policy is None else WorkerPodSettings(placement=policy)
    return worker_pod(topology(placement), "node-0", OWNER, settings_)


def refused(placement: dict[str, Any], policy: PlacementPolicy | None = None) -> str:
    with pytest.raises(PlacementRefused) as info:
        pod(placement, policy)
    assert isinstance(info.value, BackendError)  # a start that fails: StartFailed, retried with backoff
    return str(info.value)


# ------------------------------------------------------------------------------------------ the default


def test_what_the_default_allows_reaches_the_pod_as_written() -> None:
    placement = {
        "nodeSelector": {"topology.kubernetes.io/zone": "zone-b", "kubernetes.io/arch": "arm64"},
        "tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 30},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                           "values": ["zone-a", "zone-b"]}]},
                ]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m7i.large"]}]}},
                ],
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "t"}},
                     "topologyKey": "kubernetes.io/hostname", "namespaces": ["team-a"]},
                ],
            },
        },
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "DoNotSchedule"}],
    }  # fmt: skip
    spec = pod(placement)["spec"]
    for key, value in placement.items():
        assert spec[key] == value


def test_the_e2e_tiers_zone_selector_and_a_spec_without_placement_pass() -> None:
    assert pod({"nodeSelector": {"topology.kubernetes.io/zone": "zone-c"}})["spec"]["nodeSelector"] == {
        "topology.kubernetes.io/zone": "zone-c"
    }
    assert "tolerations" not in pod({})["spec"]


@pytest.mark.parametrize("policy", [None, ANYTHING, DEDICATED], ids=["default", "anything", "dedicated"])
@pytest.mark.parametrize(
    ("toleration", "says"),
    [
        (
            CONTROL_PLANE,
            "spec.placement.tolerations[0]: tolerates the control plane's taint node-role.kubernetes.io/control-plane; "
            "worker pods never run there: remove it",
        ),
        ({"key": "node-role.kubernetes.io/master", "operator": "Equal", "value": "", "effect": "NoSchedule"},
         "spec.placement.tolerations[0]: tolerates the control plane's taint node-role.kubernetes.io/master"),
        ({"operator": "Exists"}, "spec.placement.tolerations[0]: tolerates every taint (no key), the control plane's"),
        ({"key": "", "operator": "Exists", "effect": "NoSchedule"}, "spec.placement.tolerations[0]: tolerates every"),
    ],
)  # fmt: skip
def test_the_control_plane_is_never_tolerated_whatever_the_policy(
    policy: PlacementPolicy | None, toleration: dict[str, Any], says: str
) -> None:
    assert refused({"tolerations": [toleration]}, policy).startswith(says)


@pytest.mark.parametrize("policy", [None, ANYTHING], ids=["default", "anything"])
@pytest.mark.parametrize("key", CONTROL_PLANE_KEYS)
def test_the_control_planes_nodes_are_never_selected(policy: PlacementPolicy | None, key: str) -> None:
    assert refused({"nodeSelector": {key: ""}}, policy) == (
        f"spec.placement.nodeSelector[{key}]: selects the control plane's nodes ({key}); worker pods never run "
        "there: remove it"
    )
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": "Exists"}]}]}}}  # fmt: skip
    assert refused({"affinity": affinity}, policy).startswith(
        "spec.placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
        f".matchExpressions[0].key: selects the control plane's nodes ({key})"
    )


def test_a_toleration_or_a_label_outside_the_default_names_the_field_the_list_and_the_fix() -> None:
    message = refused(
        {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}
    )
    assert message == (
        "spec.placement.tolerations[0]: the toleration dedicated=gpu:NoSchedule is not one the operator allows "
        "(worker.placement.allowedTolerations: node.kubernetes.io/not-ready:NoExecute, "
        "node.kubernetes.io/unreachable:NoExecute); remove it, or have the operator's list extended"
    )
    message = refused({"nodeSelector": {"kubernetes.io/hostname": "node-7"}})
    assert message == (
        "spec.placement.nodeSelector[kubernetes.io/hostname]: the node label kubernetes.io/hostname is not one the "
        "operator allows selecting on (worker.placement.allowedNodeSelectorKeys: topology.kubernetes.io/zone, "
        "topology.kubernetes.io/region, kubernetes.io/arch and 2 more); remove it, or have the operator's list "
        "extended"
    )
    # the not-ready toleration of every effect is more than the default allows (NoExecute only)
    assert "node.kubernetes.io/not-ready:(every effect) is not one" in refused(
        {"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]}
    )


def test_every_refused_field_is_named_at_once_and_no_pod_is_made() -> None:
    message = refused({
        "tolerations": [{"key": "a", "operator": "Exists"}, CONTROL_PLANE],
        "nodeSelector": {"kubernetes.io/hostname": "n", "topology.kubernetes.io/zone": "z"},
        "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}]}},
    })  # fmt: skip
    fields = [part.split(":", 1)[0] for part in message.split("; ") if part.startswith("spec.")]
    assert fields == [
        "spec.placement.tolerations[0]",
        "spec.placement.tolerations[1]",
        "spec.placement.nodeSelector[kubernetes.io/hostname]",
    ]
    assert message.endswith("(and 1 more)")
    problems = placement_problems(
        {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}]}}},
        PlacementPolicy(),
        "team-a",
    )  # fmt: skip
    assert problems == [
        "spec.placement.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector: "
        "reaches pods of other namespaces; remove it (a worker's pod affinity may only name pods of its own "
        "namespace, team-a)"
    ]


# ------------------------------------------------------------------------------------------ a policy


def test_a_dedicated_pool_is_reached_only_as_the_policy_says() -> None:
    allowed = {
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "streams", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "nodeSelector": {"pool.example.com/streams": "true"},
    }
    assert pod(allowed, DEDICATED)["spec"]["tolerations"] == allowed["tolerations"]
    for toleration, why in (
        ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, "another value"),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}, "every value of the key"),
        ({"key": "dedicated", "operator": "Equal", "value": "streams"}, "every effect of the key"),
        ({"key": "dedicated", "operator": "Equal", "value": "streams", "effect": "NoExecute"}, "another effect"),
        ({"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}, "another effect"),
    ):
        assert refused({"tolerations": [toleration]}, DEDICATED).startswith("spec.placement.tolerations[0]: "), why
    assert refused({"nodeSelector": {"pool.example.com": "x"}}, DEDICATED).startswith(
        "spec.placement.nodeSelector[pool.example.com]:"
    )


def test_affinity_can_be_refused_and_pod_affinity_stays_in_its_namespace() -> None:
    no_affinity = PlacementPolicy(allow_affinity=False)
    assert refused({"affinity": {}}, no_affinity) == (
        "spec.placement.affinity: the operator allows no affinity (worker.placement.allowAffinity: false); remove "
        "it (spec.placement.nodeSelector on an allowed label places pods too)"
    )
    other = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                          "namespaces": ["team-a", "team-b"]}}]}}  # fmt: skip
    assert refused({"affinity": other}) == (
        "spec.placement.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm"
        ".namespaces: names 'team-b', another namespace; name only team-a (a worker's pod affinity may only name "
        "pods of its own namespace)"
    )
    fields = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]}]}}}  # fmt: skip
    assert "matchFields[0].key: the node label metadata.name is not one" in refused({"affinity": fields})


def test_a_malformed_or_huge_placement_is_refused_in_short_lines() -> None:
    assert refused({"tolerations": ["dedicated"]}).startswith("spec.placement.tolerations[0]: is not a toleration")
    assert refused({"tolerations": [{"key": 7}]}).startswith("spec.placement.tolerations[0]: key, operator, value")
    huge = "k" * 100_000
    message = refused({"nodeSelector": {huge: "x"}, "tolerations": [{"key": huge, "operator": "Exists"}]})
    assert len(message) < 1200 and "\n" not in message


def test_the_policy_reads_the_charts_json_and_names_what_is_wrong() -> None:
    assert PlacementPolicy.from_json(json.dumps(PlacementPolicy().to_values())) == PlacementPolicy()
    assert PlacementPolicy.from_json(json.dumps(DEDICATED.to_values())) == DEDICATED
    assert PlacementPolicy.from_json('{"allowAffinity": false}') == PlacementPolicy(allow_affinity=False)
    assert PlacementPolicy.from_json('{"allowedTolerations": []}').allowed_tolerations == ()
    for text, says in (
        ("[]", "give a JSON object"),
        ("{", "not JSON"),
        ('{"allowedTolerations": [{"key": ""}]}', "allowedTolerations[0].key: ''"),
        ('{"allowedTolerations": [{"key": "a", "effect": "Sometimes"}]}', "allowedTolerations[0].effect: 'Sometimes'"),
        ('{"allowedTolerations": [{"key": "a", "operator": "Exists"}]}', "allowedTolerations[0]: "),
        ('{"allowedNodeSelectorKeys": "zone"}', "allowedNodeSelectorKeys: 'zone' is not a list"),
        ('{"allowedNodeSelectorKeys": [" "]}', "allowedNodeSelectorKeys[0]: ' '"),
        ('{"allowAffinity": "yes"}', "allowAffinity: 'yes'; give true or false"),
        ('{"allowedTaints": []}', "allowedTaints: unknown"),
    ):
        with pytest.raises(ValueError, match="^" + re.escape(says)):
            PlacementPolicy.from_json(text)


def test_the_operator_reads_the_policy_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options

    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    monkeypatch.setenv("ELASTREAM_WORKER_PLACEMENT", json.dumps(DEDICATED.to_values()))
    options = operator_options(build_parser().parse_args(["operator"]))
    assert options.worker.placement == DEDICATED
    monkeypatch.delenv("ELASTREAM_WORKER_PLACEMENT")
    assert operator_options(build_parser().parse_args(["operator"])).worker.placement == PlacementPolicy()
    monkeypatch.setenv("ELASTREAM_WORKER_PLACEMENT", '{"allowAffinity": 1}')
    with pytest.raises(CommandError, match=r"^--worker-placement \(\$ELASTREAM_WORKER_PLACEMENT\): allowAffinity"):
        operator_options(build_parser().parse_args(["operator"]))


names = st.sampled_from([*CONTROL_PLANE_KEYS, "", None])
effects = st.sampled_from([None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"])


@settings(max_examples=200, deadline=None)
@given(
    key=names,
    operator=st.sampled_from([None, "Exists", "Equal"]),
    value=st.sampled_from([None, "", "true", "*"]),
    effect=effects,
    before=st.lists(st.sampled_from(["node.kubernetes.io/unreachable", "dedicated", "spot"]), max_size=3),
)
def test_no_toleration_of_the_control_plane_passes_even_an_allow_all_policy(
    key: str | None, operator: str | None, value: str | None, effect: str | None, before: list[str]
) -> None:
    toleration = {
        k: v for k, v in (("key", key), ("operator", operator), ("value", value), ("effect", effect)) if v is not None
    }
    tolerations = [{"key": k, "operator": "Exists"} for k in before] + [toleration]
    problems = placement_problems({"tolerations": tolerations}, ANYTHING, "team-a")
    assert len(problems) == 1 and problems[0].startswith(f"spec.placement.tolerations[{len(before)}]: tolerates ")


# ------------------------------------------------------------------------------------------ the operator


def test_the_backend_creates_no_pod_for_a_refused_placement() -> None:
    kube, core = backend()
    placed = manifest([src("s", 2), sink("z", 2)], [edge("s", "z")], name="web", nodes=2)
    placed["spec"]["placement"] = {"tolerations": [copy.deepcopy(CONTROL_PLANE)]}
    kube.topology = parse_manifest(placed)
    with pytest.raises(PlacementRefused, match=r"^spec.placement.tolerations\[0\]: tolerates the control plane's"):
        kube.spawn("node-0")
    assert core.pods == {}


def test_a_placement_refused_where_pods_are_made_is_a_start_failure_naming_the_field() -> None:
    """Whatever reached the pod maker (a spec the reconcile pass let through, a ConfigMap's), `worker_pod` refuses
    it: the start fails, the status and a StartFailed event name the field and the fix, retried with backoff."""
    world = World(3, placement={"tolerations": [{"key": "dedicated", "operator": "Exists"}]})
    world.rewire(settings=WorkerPodSettings(placement=ANYTHING))  # the pass lets it through...
    build = world.build

    def building(owner: Any, topology_: Any, metadata: Any, managed: Any) -> Any:
        controller = build(owner, topology_, metadata, managed)
        start = controller.start

        def start_making_pods(schedule: Any = None) -> Any:
            owner_ = {"name": metadata["name"], "uid": metadata["uid"]}
            for node in ("node-0", "node-1", "node-2"):  # ...the pods are made under the default policy
                worker_pod(topology_, node, owner_, WorkerPodSettings())
            return start(schedule)

        controller.start = start_making_pods  # type: ignore[method-assign]
        return controller

    world.rewire(build=building)
    world.run_for(30.0)
    says = "spec.placement.tolerations[0]: the toleration dedicated:(every effect) is not one the operator allows"
    assert world.status["phase"] == "Pending"
    assert world.reasons().count("StartFailed") >= 2 and says in world.core.events[-1]["message"]
    assert says in world.condition("Degraded")["message"]
    assert "have the operator's list extended" in world.condition("Degraded")["message"]


def test_a_refused_placement_is_invalid_spec_creates_nothing_and_a_fixed_spec_starts() -> None:
    world = World(3, placement={"tolerations": [copy.deepcopy(CONTROL_PLANE)]})
    world.run_for(65.0)
    assert world.backends == []  # never built: no pod, no ConfigMap, no Secret
    available = world.condition("Available")
    assert available["reason"] == "InvalidSpec"
    assert available["message"].startswith(
        "spec.placement.tolerations[0]: tolerates the control plane's taint node-role.kubernetes.io/control-plane; "
        "worker pods never run there: remove it"
    )
    assert world.reasons() == ["InvalidSpec"]  # once, not once per pass
    world.patch_spec(placement={"nodeSelector": {"topology.kubernetes.io/zone": "zone-a"}})
    world.run_for(2.0)
    assert world.status["phase"] == "Running" and len(world.backends) == 1
