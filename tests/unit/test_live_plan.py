"""`elastream plan --live` without a running topology: the name it is given, where the window starts, the plan
it makes beside the one the controller makes for a scale request, the spec read through the Kubernetes API (an
in-memory lister), and the command's refusals. The reads from a real Redis and a running topology are in
tests/integration/test_live_plan.py."""

from __future__ import annotations

from typing import Any

import pytest
from test_topology_controller import setup

from elastream.cli import main
from elastream.control.changes import SETTLE_INTERVALS
from elastream.control.live_plan import (
    LivePlanError,
    LiveTopology,
    TopologyRef,
    WindowTooShort,
    covered_intervals,
    find_resource,
    plan_window,
)
from elastream.core.metrics import MetricSample
from elastream.core.schedule import initial_schedule
from elastream.core.topology import parse_manifest
from support.manifests import edge, manifest, sink, src, work


def test_a_topology_is_named_namespace_slash_name_or_name_in_default() -> None:
    assert TopologyRef.parse("analytics/pageload") == TopologyRef("analytics", "pageload")
    assert TopologyRef.parse("pageload") == TopologyRef("default", "pageload")
    assert TopologyRef.parse("a/b").prefix == "elastream:{a/b}:"
    for bad in ("", "a/", "/b", "A/b", "a/b_c", "a/b/c", "a b/c", "-a/b"):
        with pytest.raises(LivePlanError, match=r"--live: .* is not NAMESPACE/NAME"):
            TopologyRef.parse(bad)


def _live(topology, schedule=None, **records: Any) -> LiveTopology:
    return LiveTopology(
        ref=TopologyRef(topology.namespace, topology.name),
        topology=topology,
        schedule=schedule or initial_schedule(topology),
        version=1,
        spec_from="redis",
        spec_nodes=None,
        last_scaling=records.get("last_scaling"),
        last_recovery=records.get("last_recovery"),
    )


def test_the_window_starts_after_the_last_scaling_or_recovery_settled() -> None:
    topology, *_ = setup()
    assert _live(topology).settled_since(1.0) == 0.0
    scaled = _live(topology, last_scaling={"finishedAt": 100.0}, last_recovery={"finishedAt": 90.0})
    assert scaled.settled_since(0.5) == 100.0 + SETTLE_INTERVALS * 0.5
    recovered = _live(topology, last_scaling={"finishedAt": 100.0}, last_recovery={"finishedAt": 130.0})
    assert recovered.settled_since(1.0) == 130.0 + SETTLE_INTERVALS
    # a record still running (no finishedAt) or garbled does not move the start
    assert _live(topology, last_scaling={"finishedAt": None}, last_recovery={"finishedAt": "x"}).settled_since(1) == 0


def _sample(executor: str, ts: float, started_at: float) -> MetricSample:
    vertex = executor.split("#")[0]
    return MetricSample(ts, "node-0", vertex, executor, started_at, 0, 0, 0, 0.0, 0)


def test_covered_intervals_count_from_the_newest_executor_start_or_the_settled_schedule() -> None:
    samples = [_sample("a#0", t, 100.0) for t in range(101, 131)] + [_sample("b#0", t, 120.0) for t in range(121, 131)]
    intervals, why = covered_intervals(samples, not_before=0.0, interval_s=1.0)
    assert intervals == 10 and why.startswith("its newest executor started 10.0 s")
    intervals, why = covered_intervals(samples, not_before=125.0, interval_s=1.0)
    assert intervals == 5 and why.startswith("the running schedule settled")
    # an executor that stopped reporting (its latest incarnation is old) does not shorten the window, a
    # restarted one (a newer incarnation) does
    restarted = [*samples, _sample("a#0", 131.0, 129.0)]
    assert covered_intervals(restarted, 0.0, 1.0)[0] == 2
    # a sample a little late on its grid counts on it
    assert covered_intervals([_sample("a#0", 110.2, 100.0)], 0.0, 1.0)[0] == 10


def test_window_too_short_says_how_many_intervals_there_are_and_what_to_do() -> None:
    message = str(WindowTooShort(3, 20, 1.0, "its newest executor started 3.2 s before the newest sample"))
    assert message.startswith("the metric window has 3 of 20 intervals (its newest executor started")
    assert message.endswith("wait 17 intervals of 1 s or lower --window")


@pytest.mark.parametrize("nodes", [3, 4, 1])
def test_the_live_plan_is_the_plan_the_controller_makes_for_a_scale_request(nodes: int) -> None:
    topology, backend, *_, controller = setup()
    controller.start()
    snapshot = controller.metrics.snapshot(topology.scaling.window)
    expected, throughput = controller.plan(nodes)
    plan, measured = plan_window(_live(topology, backend.current_schedule()), snapshot, nodes)
    assert plan.to_dict() == expected.to_dict()
    assert measured == throughput > 0.0
    assert plan.to_nodes == nodes


def test_a_strategy_asked_for_replaces_the_specs() -> None:
    topology, backend, *_, controller = setup()
    controller.start()
    snapshot = controller.metrics.snapshot(topology.scaling.window)
    plan, _ = plan_window(_live(topology, backend.current_schedule()), snapshot, 3, strategy="round-robin")
    assert plan.strategy == "round-robin"


def _resource(name: str, namespace: str = "analytics", nodes: int = 3) -> dict[str, Any]:
    doc = manifest(
        [src("s", 1, rate=100), work("w", 1, costMs=1), sink("z")],
        [edge("s", "w"), edge("w", "z")],
        name=name,
        nodes=nodes,
    )
    doc["metadata"]["namespace"] = namespace
    doc["status"] = {"lastScaling": {"finishedAt": 50.0}}
    return doc


class ListedTopologies:
    """StreamTopologies as the API lists them with a `metadata.name` field selector (the operator's role lists,
    it does not get); `error` is raised instead when set."""

    def __init__(self, *bodies: dict[str, Any], error: Exception | None = None) -> None:
        self.bodies, self.error = list(bodies), error
        self.calls: list[tuple[str, str]] = []

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, *, field_selector: str, _request_timeout: float
    ) -> dict[str, Any]:
        self.calls.append((namespace, field_selector))
        if self.error is not None:
            raise self.error
        name = field_selector.removeprefix("metadata.name=")
        items = [b for b in self.bodies if b["metadata"]["namespace"] == namespace and b["metadata"]["name"] == name]
        return {"items": items}


def test_the_spec_comes_from_the_resource_listed_by_name() -> None:
    api = ListedTopologies(_resource("other"), _resource("pageload"))
    body = find_resource(TopologyRef("analytics", "pageload"), lambda: (api, ""), "redis://r:6379/0")
    assert body["metadata"]["name"] == "pageload" and body["status"]["lastScaling"]["finishedAt"] == 50.0
    assert api.calls == [("analytics", "metadata.name=pageload")]
    assert parse_manifest({k: v for k, v in body.items() if k != "status"}).nodes == 3


def test_a_spec_that_cannot_be_found_names_every_place_looked_at() -> None:
    from kubernetes.client.exceptions import ApiException

    ref = TopologyRef("analytics", "pageload")
    with pytest.raises(LivePlanError) as missing:
        find_resource(ref, lambda: (ListedTopologies(_resource("other")), ""), "redis://r:6379/0")
    assert "no StreamTopology analytics/pageload in the Kubernetes API" in str(missing.value)
    assert "--manifest FILE" in str(missing.value)
    forbidden = ListedTopologies(error=ApiException(status=403, reason="Forbidden"))
    with pytest.raises(LivePlanError) as refused:
        find_resource(ref, lambda: (forbidden, ""), "redis://r:6379/0")
    assert "listing StreamTopologies in namespace analytics failed (HTTP 403 Forbidden)" in str(refused.value)
    with pytest.raises(LivePlanError) as no_api:
        find_resource(ref, lambda: (None, "not in a pod and no usable kubeconfig"), "redis://r:6379/0")
    text = str(no_api.value)
    assert "no key elastream:{analytics/pageload}:manifest" in text
    assert "the Kubernetes API cannot be used (not in a pod and no usable kubeconfig)" in text
    assert "--manifest FILE" in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--live", "a/b", "--nodes", "0"], "--nodes: 0 is outside [1, 1000]"),
        (["--live", "a/b", "--nodes", "1001"], "--nodes: 1001 is outside [1, 1000]"),
        (["--live", "Not_A_Name", "--nodes", "3"], "--live: 'Not_A_Name' is not NAMESPACE/NAME"),
        (["--live", "a/b", "--nodes", "3", "--redis-url", ""], "--redis-url: no URL"),
    ],
)
def test_plan_live_refuses_bad_input_in_one_line(argv, said, capsys, monkeypatch) -> None:
    monkeypatch.delenv("ELASTREAM_REDIS_URL", raising=False)
    if "--redis-url" not in argv:
        argv = [*argv, "--redis-url", "redis://127.0.0.1:1/0"]
    assert main(["plan", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["m.yaml", "--live", "a/b", "--nodes", "3"], "give its spec as --manifest m.yaml, not as FILE"),
        (["--live", "a/b", "--pareto"], "leave out --pareto, --metrics, --max-nodes"),
        (["m.yaml", "--nodes", "3", "--window", "5"], "--window: only with --live NAMESPACE/NAME"),
        (["--nodes", "3"], "give a manifest FILE, or --live NAMESPACE/NAME"),
    ],
)
def test_plan_live_usage_errors(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", *argv])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_an_unreachable_redis_is_named_without_its_password(capsys) -> None:
    url = "redis://admin:s3cret-pw@127.0.0.1:1/0"  # nothing listens on port 1: refused at once
    assert main(["plan", "--live", "analytics/pageload", "--nodes", "3", "--redis-url", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach Redis at redis://admin:***@127.0.0.1:1/0")
    assert "s3cret" not in err
