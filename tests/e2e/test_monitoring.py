"""The chart's monitoring on a real Prometheus (Debian's `prometheus`, 2.x) against the real API server: Prometheus
finds the operator and every worker pod as the Prometheus Operator would from the chart's ServiceMonitor and
PodMonitor (`helm template` renders them; `kubernetes_sd_configs` with the monitors' selectors and ports, as a
ServiceAccount of the test that may list and watch pods), loads the chart's PrometheusRule as its rule file, and
scrapes every 2 s while one topology is scaled from 1 to 2 nodes and back with `kubectl scale`. Then, through
Prometheus' HTTP API:

- every panel query of the chart's Grafana dashboard ($namespace and $topology set to the topology's,
  $__rate_interval to 1m) returns series, and each of its vector selectors returns the topology's series;
- every annotation query returns something over the test's span;
- elastream_rescales_total counts the two rescales (out and in, succeeded);
- every vector selector of every alert expression matches series of the topology (an alert expression is
  normally empty, e.g. `... == 1`, so its selectors are queried alone, see `check_alert_selectors`);
- ElastreamTopologyStalled fires once the topology is made Stalled (an InvalidSpec the API server accepts:
  slotsPerNode 1 for more executors than that) with its labels and annotations filled in, and resolves once the
  spec is fixed.

The alerts' `for:` (one to five minutes) is at most 4 s in the test's copy of the rule file (`with_for_at_most`):
what this test shows is that the expressions match what the operator and the workers serve and that an alert
fires and resolves on a real topology; the real durations are tested by `promtool test rules`
(tests/unit/test_alert_rules.py).

How the targets are found here. The PodMonitor becomes a `role: pod` job, what the Prometheus Operator generates
(keep the pods whose labels match its selector, in its namespaces, on the container port it names, not Failed or
Succeeded; `honor_labels` as it says). Debian's `prometheus` is built without Kubernetes service discovery
(`kubernetes_sd_configs` is an unknown field to it), so `support.prometheus.KubernetesPodDiscovery` stands in for
`role: pod` through HTTP service discovery: it lists the pods from the API server with the ServiceAccount's token
each time Prometheus asks (every 2 s) and answers with the targets and `__meta_kubernetes_pod_*` labels Prometheus'
own discoverer makes, so the relabelings are the ones a real `role: pod` job runs. The ServiceMonitor would be a
`role: endpoints` job, but in this tier Endpoints and EndpointSlices cannot hold the pods' loopback addresses
(the API server refuses 127.0.0.0/8, docs/e2e.md "Known gaps"), so the Service it selects is followed to what its
endpoints would list: the pods matching the Service's selector, on the container port its targetPort names.
Either way the monitors' own selectors, ports, namespaces and honorLabels decide what Prometheus scrapes and how
it labels it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
import yaml

from support.paths import REPO
from support.prometheus import (
    KubernetesPodDiscovery,
    Prometheus,
    alerting_rules,
    dashboard_annotations,
    dashboard_panels,
    selector_text,
    substitute,
    vector_selectors,
    with_for_at_most,
)

from .conftest import RELEASE, SYSTEM
from .controlplane import ControlPlane
from .test_operator import pods_of, scaled, wait_status

pytestmark = pytest.mark.e2e

CHART = os.path.join(REPO, "charts", "elastream")
#: what turns the chart's monitoring objects on (docs/monitoring.md)
MONITORING_VALUES = (
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.dashboard.enabled=true",
)
SCRAPE_INTERVAL = "2s"
FOR_AT_MOST = "4s"
STALLED_ALERT = "ElastreamTopologyStalled"
#: the series that carry no topology (the Redis the operator uses): their selectors are checked for series at all
UNLABELLED = ("elastream_redis_memory_used_bytes", "elastream_redis_memory_limit_bytes")


def topology(name: str) -> dict[str, Any]:
    """One node to start; parse is congested (300 events/s offered, 250/s at 4 ms an event) so Stela has a
    vertex to grow on the way out; an endless source so every panel has data all along; room for the executors
    Stela adds, on one node again after the scale-in."""
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name},
        "spec": {
            "nodes": 1,
            "slotsPerNode": 8,
            "vertices": [
                {"name": "clicks", "source": {"type": "synthetic", "rate": 300, "keys": 50}, "maxParallelism": 8},
                {"name": "parse", "logic": {"builtin": "work", "costMs": 4.0}, "maxParallelism": 8},
                {"name": "count", "logic": {"builtin": "count", "key": "key"}, "stateful": True, "maxParallelism": 8},
                {"name": "out", "sink": {"type": "null"}, "maxParallelism": 8},
            ],
            "streams": [
                {"from": "clicks", "to": "parse", "grouping": "shuffle"},
                {"from": "parse", "to": "count", "grouping": "fields", "key": "key"},
                {"from": "count", "to": "out", "grouping": "shuffle"},
            ],
            "scaling": {"strategy": "stela", "migration": "ccr", "checkpointIntervalSeconds": 2, "window": 5},
        },
    }


# ---- the chart's monitoring objects ------------------------------------------------------------------------------
def render_monitoring(helm) -> dict[str, list[dict[str, Any]]]:
    """The chart rendered as the `installed` release with monitoring on: its documents by kind."""
    args = ["template", RELEASE, CHART, "--namespace", SYSTEM, "--api-versions", "monitoring.coreos.com/v1"]
    for value in MONITORING_VALUES:
        args += ["--set", value]
    rendered = helm(*args, quiet=True).stdout
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(rendered):
        if doc:
            by_kind.setdefault(doc["kind"], []).append(doc)
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        assert by_kind.get(kind), f"the chart rendered no {kind} with {' '.join(MONITORING_VALUES)}"
    return by_kind


def the_dashboard(rendered: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The Grafana dashboard as the chart ships it (the ConfigMap Grafana's sidecar loads)."""
    for config_map in rendered.get("ConfigMap", []):
        if (config_map["metadata"].get("labels") or {}).get("grafana_dashboard"):
            (text,) = config_map["data"].values()
            return dict(json.loads(text))
    raise AssertionError("the chart rendered no ConfigMap labelled grafana_dashboard (metrics.dashboard.enabled)")


def _label(name: str) -> str:
    """A Kubernetes label's name as Prometheus' service discovery spells it in __meta_* labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def selector_relabels(selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A label selector as the Prometheus Operator writes it into relabel_configs (role: pod)."""
    rules: list[dict[str, Any]] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        rules.append({
            "action": "keep", "regex": f"({re.escape(str(value))});true",
            "source_labels": [f"__meta_kubernetes_pod_label_{_label(key)}",
                              f"__meta_kubernetes_pod_labelpresent_{_label(key)}"],
        })  # fmt: skip
    for expression in selector.get("matchExpressions") or []:
        key, operator = _label(expression["key"]), expression["operator"]
        present = f"__meta_kubernetes_pod_labelpresent_{key}"
        values = "|".join(re.escape(str(v)) for v in expression.get("values") or [])
        if operator in ("In", "NotIn"):
            action = "keep" if operator == "In" else "drop"
            rules.append({"action": action, "regex": f"({values});true",
                          "source_labels": [f"__meta_kubernetes_pod_label_{key}", present]})  # fmt: skip
        else:  # Exists, DoesNotExist
            rules.append({"action": "keep" if operator == "Exists" else "drop", "regex": "true",
                          "source_labels": [present]})  # fmt: skip
    return rules


def pod_job(
    job: str,
    sd: KubernetesPodDiscovery,
    namespaces: Sequence[str] | None,
    selector: Mapping[str, Any],
    port: str | int,
    path: str,
    honor_labels: bool,
) -> dict[str, Any]:
    """A `role: pod` scrape job: the pods of `namespaces` (None: all) matching `selector`, on container `port`
    (a name or a number), labelled namespace/pod/container/job as the Prometheus Operator labels them."""
    port_rule: dict[str, Any] = (
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": str(port)}
        if isinstance(port, str)
        else {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_number"], "regex": str(port)}
    )
    return {
        "job_name": job,
        "honor_labels": honor_labels,
        "metrics_path": path,
        # the test's clock: the monitors leave the interval to Prometheus (30 s by default, and 1 m in the chart's
        # examples); 2 s makes the rates and the alerts answer within a short test
        "scrape_interval": SCRAPE_INTERVAL,
        # kubernetes_sd_configs: [{role: pod, namespaces: {names: namespaces}}] in a Prometheus that has it
        "http_sd_configs": [sd.sd_config(namespaces)],
        "relabel_configs": [
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
            *selector_relabels(selector),
            port_rule,
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"target_label": "job", "replacement": job},
        ],
    }


def monitor_namespaces(monitor: Mapping[str, Any]) -> list[str] | None:
    """A monitor's namespaceSelector as the Prometheus Operator reads it: any (None), matchNames, else its own."""
    chosen = monitor["spec"].get("namespaceSelector") or {}
    if chosen.get("any"):
        return None
    return list(chosen.get("matchNames") or [monitor["metadata"]["namespace"]])


def scrape_jobs(rendered: Mapping[str, list[dict[str, Any]]], sd: KubernetesPodDiscovery) -> list[dict[str, Any]]:
    """The scrape jobs the chart's PodMonitors and ServiceMonitors make (see the module's docstring)."""
    jobs: list[dict[str, Any]] = []
    for monitor in rendered["PodMonitor"]:
        meta, spec = monitor["metadata"], monitor["spec"]
        for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
            jobs.append(pod_job(
                f"podMonitor/{meta['namespace']}/{meta['name']}/{i}", sd, monitor_namespaces(monitor),
                spec["selector"], endpoint["port"], endpoint.get("path") or "/metrics",
                bool(endpoint.get("honorLabels")),
            ))  # fmt: skip
    for monitor in rendered["ServiceMonitor"]:
        meta, spec = monitor["metadata"], monitor["spec"]
        namespaces = monitor_namespaces(monitor)
        wanted = (spec.get("selector") or {}).get("matchLabels") or {}
        services = [
            s for s in rendered.get("Service", [])
            if (namespaces is None or s["metadata"].get("namespace", SYSTEM) in namespaces)
            and all((s["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]  # fmt: skip
        for i, endpoint in enumerate(spec["endpoints"]):
            matched = [
                (service, port) for service in services for port in service["spec"]["ports"]
                if port.get("name") == endpoint["port"]
            ]  # fmt: skip
            assert matched, f"ServiceMonitor {meta['name']}: no Service of the chart has a port {endpoint['port']!r}"
            for service, port in matched:
                jobs.append(pod_job(
                    f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}", sd,
                    [service["metadata"].get("namespace", SYSTEM)], {"matchLabels": service["spec"]["selector"]},
                    port.get("targetPort", port["port"]), endpoint.get("path") or "/metrics",
                    bool(endpoint.get("honorLabels")),
                ))  # fmt: skip
    return jobs


def rule_groups(rendered: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for rule in rendered["PrometheusRule"]:
        groups += rule["spec"]["groups"]
    return groups


# ---- Prometheus' identity on the API server ----------------------------------------------------------------------
@pytest.fixture
def prometheus_sd(
    kubectl, control_plane: ControlPlane, e2e_namespace: str, tmp_path
) -> Iterator[KubernetesPodDiscovery]:
    """A ServiceAccount `prometheus` allowed to get, list and watch pods, services and endpoints in every namespace
    (what kube-prometheus-stack gives its Prometheus), and the pod discovery that lists the pods with its token
    from this API server, checking its certificate with the cluster's CA."""
    role = f"{e2e_namespace}-prometheus"
    kubectl("create", "serviceaccount", "prometheus", "-n", e2e_namespace)
    kubectl("create", "clusterrole", role, "--verb=get,list,watch", "--resource=pods,services,endpoints")
    kubectl(
        "create", "clusterrolebinding", role, f"--clusterrole={role}", f"--serviceaccount={e2e_namespace}:prometheus"
    )
    token = kubectl("create", "token", "prometheus", "-n", e2e_namespace, "--duration=1h", quiet=True).stdout.strip()
    token_file = tmp_path / "prometheus.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    discovery = KubernetesPodDiscovery(control_plane.server, str(token_file), control_plane.ca_file).start()
    try:
        yield discovery
    finally:
        discovery.stop()
        kubectl("delete", "clusterrolebinding", role, "--ignore-not-found", check=False)
        kubectl("delete", "clusterrole", role, "--ignore-not-found", check=False)


# ---- what is asked of Prometheus ---------------------------------------------------------------------------------
def labelled(rows: Sequence[Mapping[str, Any]], namespace: str, name: str) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["metric"].get("namespace") == namespace and r["metric"].get("topology") == name]


def check_panels(prom: Prometheus, dashboard: Mapping[str, Any], namespace: str, name: str) -> list[str]:
    """What is wrong with the dashboard's panels for this topology (nothing: []). Every target's query returns
    series, and every vector selector in it returns this topology's series (the selectors of a per-topology metric
    name $namespace and $topology, so their series are the topology's)."""
    variables = {"namespace": namespace, "topology": name, "datasource": "prometheus"}
    problems: list[str] = []
    for panel in dashboard_panels(dashboard):
        for target in panel["targets"]:
            expr = substitute(target["expr"], variables)
            rows = prom.query(expr)
            print(f"  panel {panel['title']!r}: {expr} -> {len(rows)} series")
            if not rows:
                problems.append(f"panel {panel['title']!r}: {expr} returned no series")
            for metric, matchers in vector_selectors(expr):
                selector = selector_text(metric, matchers)
                found = prom.query(selector)
                if metric not in UNLABELLED:
                    found = labelled(found, namespace, name)
                if not found:
                    problems.append(f"panel {panel['title']!r}: {selector} matched no series of {namespace}/{name}")
    return problems


def check_annotations(
    prom: Prometheus, dashboard: Mapping[str, Any], namespace: str, name: str, start: float
) -> list[str]:
    """Every annotation query finds something between `start` and now (Grafana asks them over the time range)."""
    variables = {"namespace": namespace, "topology": name, "datasource": "prometheus"}
    problems = []
    for annotation in dashboard_annotations(dashboard):
        expr = substitute(annotation["expr"], variables)
        rows = prom.query_range(expr, start, time.time(), 2)
        print(f"  annotation {annotation['name']!r}: {expr} -> {sum(len(r['values']) for r in rows)} points")
        if not rows:
            problems.append(f"annotation {annotation['name']!r}: {expr} found nothing since the topology started")
    return problems


def check_alert_selectors(
    prom: Prometheus, groups: Sequence[Mapping[str, Any]], namespace: str, name: str
) -> list[str]:
    """An alert expression is empty while all is well (`... == 1`, `... > 0.9`), so querying it says nothing about
    whether it could ever match. Its vector selectors are read out of it instead (`vector_selectors`: every
    elastream series is named elastream_*, so a selector is such a name with its {matchers}) and each is asked
    alone, with namespace and topology matchers added for a per-topology metric: it must return the topology's
    series, and carry every label the selector matches on. A selector whose matcher values are not true now (e.g.
    rescales that failed, of which there were none) is asked without those values: that the metric is served with
    that label is what can be checked; the Stalled alert below then fires on a value made true."""
    problems = []
    for rule in alerting_rules(groups):
        for metric, matchers in vector_selectors(str(rule["expr"])):
            scoped = [] if metric in UNLABELLED else [("namespace", "=", namespace), ("topology", "=", name)]
            exact = prom.query(selector_text(metric, [*matchers, *scoped]))
            served = exact or prom.query(selector_text(metric, scoped))
            print(f"  alert {rule['alert']}: {selector_text(metric, matchers)} -> {len(exact)} series "
                  f"({len(served)} of {metric} for the topology)")  # fmt: skip
            if not served:
                problems.append(f"alert {rule['alert']}: {metric} has no series of {namespace}/{name}")
                continue
            missing = {label for label, _, _ in matchers} - set().union(*(r["metric"] for r in served))
            if missing:
                problems.append(f"alert {rule['alert']}: {metric} has no label {', '.join(sorted(missing))}")
    return problems


def alerts_of(prom: Prometheus, alert: str, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        a for a in prom.alerts()
        if a["labels"].get("alertname") == alert and a["labels"].get("namespace") == namespace
        and a["labels"].get("topology") == name
    ]  # fmt: skip


def rescales(prom: Prometheus, namespace: str, name: str) -> dict[tuple[str, str], float]:
    rows = prom.query(
        f'sum by (direction, outcome) (elastream_rescales_total{{namespace="{namespace}",topology="{name}"}})'
    )
    return {(r["metric"]["direction"], r["metric"]["outcome"]): float(r["value"][1]) for r in rows}


def scraped_pods(prom: Prometheus, namespace: str) -> set[str]:
    """The worker pods of `namespace` Prometheus scrapes successfully now."""
    rows = prom.query(f'up{{job=~"podMonitor/.*",namespace="{namespace}"}} == 1')
    return {r["metric"]["pod"] for r in rows}


def test_prometheus_scrapes_a_topology_scaled_out_and_in_and_its_stalled_alert_fires_and_resolves(
    installed, helm, kubectl, e2e_namespace, prometheus_sd, tmp_path
):
    rendered = render_monitoring(helm)
    dashboard = the_dashboard(rendered)
    groups = rule_groups(rendered)
    rules_file = tmp_path / "elastream-rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": with_for_at_most(groups, FOR_AT_MOST)}, sort_keys=False))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, f"promtool check rules:\n{checked.stdout}{checked.stderr}"
    jobs = scrape_jobs(rendered, prometheus_sd)
    print("e2e: Prometheus jobs: " + ", ".join(j["job_name"] for j in jobs))

    with Prometheus(jobs, [str(rules_file)], workdir=str(tmp_path / "prometheus")) as prom:
        print(f"e2e: Prometheus at {prom.url}, files in {prom.workdir}")
        # the operator first: a job that finds no pod would leave every operator query empty
        prom.wait_for(lambda: prom.query('up{job=~"serviceMonitor/.*"} == 1'), 60, "the operator scraped (up == 1)")
        name = "watched"
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(yaml.safe_dump(topology(name)))
        started = time.time()
        kubectl("apply", "-n", e2e_namespace, "-f", str(manifest))
        kubectl("wait", "--for=condition=Available", f"topo/{name}", "-n", e2e_namespace, "--timeout=240s")
        pods = {p["metadata"]["name"] for p in pods_of(kubectl, e2e_namespace, name)}
        prom.wait_for(lambda: scraped_pods(prom, e2e_namespace) >= pods, 30, f"the worker pod(s) {pods} scraped")
        time.sleep(6)  # a window of metrics before the first decision (scaling.window: 5 s)

        kubectl("scale", "topo", name, "-n", e2e_namespace, "--replicas=2")
        scaled(kubectl, e2e_namespace, name, 2, 240)
        pods = {p["metadata"]["name"] for p in pods_of(kubectl, e2e_namespace, name)}
        assert len(pods) == 2
        prom.wait_for(lambda: scraped_pods(prom, e2e_namespace) >= pods, 30, f"both worker pods {pods} scraped")

        kubectl("scale", "topo", name, "-n", e2e_namespace, "--replicas=1")
        scaled(kubectl, e2e_namespace, name, 1, 240)
        expected = {("out", "succeeded"): 1.0, ("in", "succeeded"): 1.0}
        prom.wait_for(lambda: all(rescales(prom, e2e_namespace, name).get(k) == v for k, v in expected.items()), 30,
                      f"elastream_rescales_total at {expected}")  # fmt: skip
        counted = rescales(prom, e2e_namespace, name)
        print(f"  elastream_rescales_total of {name} by (direction, outcome): {counted}")
        assert not any(outcome == "failed" for _, outcome in counted), counted
        desired = f'elastream_topology_desired_nodes{{namespace="{e2e_namespace}",topology="{name}"}} == 1'
        prom.wait_for(lambda: prom.query(desired), 30, "desired nodes back at 1")

        problems = check_panels(prom, dashboard, e2e_namespace, name)
        problems += check_annotations(prom, dashboard, e2e_namespace, name, started)
        assert not problems, "\n".join(problems) + f"\ntargets:\n{prom.describe_targets()}"

        # Stalled: a spec the API server accepts and the operator refuses (more executors than slots); the
        # workers run on meanwhile, as they were
        kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"slotsPerNode":1}}')
        wait_status(
            kubectl, e2e_namespace, name,
            lambda s: any(c["type"] == "Stalled" and c["status"] == "True" for c in s.get("conditions", [])),
            60, "Stalled (InvalidSpec)",
        )  # fmt: skip
        firing = prom.wait_for(
            lambda: [a for a in alerts_of(prom, STALLED_ALERT, e2e_namespace, name) if a["state"] == "firing"],
            60, f"{STALLED_ALERT} firing for {e2e_namespace}/{name}",
        )  # fmt: skip
        alert = firing[0]
        print(f"  {STALLED_ALERT}: {json.dumps(alert, indent=1)}")
        assert alert["labels"]["severity"] == "critical", alert
        assert f"{e2e_namespace}/{name}" in alert["annotations"]["summary"], alert
        assert "InvalidSpec" in alert["annotations"]["description"], alert  # the reason, from its query template
        assert alert["annotations"]["runbook_url"].endswith("#" + STALLED_ALERT.lower()), alert

        problems = check_alert_selectors(prom, groups, e2e_namespace, name)
        assert not problems, "\n".join(problems)

        kubectl("patch", "topo", name, "-n", e2e_namespace, "--type", "merge", "-p", '{"spec":{"slotsPerNode":8}}')
        kubectl("wait", "--for=condition=Ready", f"topo/{name}", "-n", e2e_namespace, "--timeout=120s")
        prom.wait_for(lambda: not alerts_of(prom, STALLED_ALERT, e2e_namespace, name), 60,
                      f"{STALLED_ALERT} of {e2e_namespace}/{name} resolved")  # fmt: skip
        print(f"  active alerts at the end: {[(a['labels']['alertname'], a['state']) for a in prom.alerts()]}")
