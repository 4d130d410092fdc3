"""The Helm chart's monitoring package and its 0.2 values, rendered with `helm template` (the helm of
tests/unit/test_chart.py): the ServiceMonitor, PodMonitor, PrometheusRule and Grafana dashboard ConfigMap
(`metrics.*`, each off by default) select what the operator and its worker pods really serve and pass the
Prometheus Operator's own CRD schemas (tests/fixtures/prometheus-operator, validated with `jsonschema`);
`operator.watchNamespaces` gives one `--namespace` and one Role per namespace and nothing namespaced
cluster-wide; `logFormat` reaches the operator's command line; the images default to the chart's appVersion.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest
import yaml
from test_chart import (
    APP_VERSION,
    CHART,
    CRD_RULES,
    ELECTION_ARGS,
    FULLNAME,
    NAMESPACE,
    NAMESPACED_RULES,
    RELEASE,
    TIMEOUT_ARGS,
    container,
    env_of,
    helm_binary,
    kubernetes_version,
    labels_are_standard,
    objects,
    one,
    rules_of,
    run_helm,
    set_args,
)

from elastream.crd import check_manifest
from elastream.crd.schema import to_json_schema
from support.paths import EXAMPLES, REPO

PROMETHEUS_OPERATOR = os.path.join(REPO, "tests", "fixtures", "prometheus-operator")
ALERTS = os.path.join(CHART, "files", "alerts.yaml")
DASHBOARD = os.path.join(CHART, "files", "dashboard.json")
ALL_MONITORING = [
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.dashboard.enabled=true",
]
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


@functools.cache
def _template(helm: str, values: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    proc = run_helm(helm, "template", RELEASE, CHART, "--namespace", NAMESPACE, *set_args(list(values)))
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


@pytest.fixture(scope="module")
def template(helm: str) -> Any:
    """`helm template` with these --set values, parsed (cached per value list)."""
    return lambda *values: _template(helm, tuple(values))


def failed_render(helm: str, *values: str) -> str:
    proc = run_helm(helm, "template", RELEASE, CHART, *set_args(list(values)), check=False)
    assert proc.returncode != 0, f"the render with {values} succeeded"
    return proc.stderr


def dashboard_config_maps(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [d for d in objects(docs, "ConfigMap") if "elastream.json" in d.get("data", {})]


# ---------------------------------------------------------------------------------------------------------
# the Prometheus Operator's CRDs


#: kind -> the CRD file of tests/fixtures/prometheus-operator (monitoring.coreos.com, v0.93.0)
CRD_FILES = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft202012Validator:
    """The v1 openAPIV3Schema of the Prometheus Operator's CRD for `kind`, as the API server applies it (unknown
    fields refused, int-or-string...: elastream.crd.schema.to_json_schema)."""
    with open(os.path.join(PROMETHEUS_OPERATOR, CRD_FILES[kind]), encoding="utf-8") as handle:
        crd = yaml.safe_load(handle)
    assert crd["spec"]["names"]["kind"] == kind and crd["spec"]["group"] == "monitoring.coreos.com"
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert version["served"] and version["storage"]
    return jsonschema.Draft202012Validator(to_json_schema(version["schema"]["openAPIV3Schema"]))


def crd_problems(obj: Mapping[str, Any]) -> list[str]:
    """What the API server would refuse in `obj` (a rendered ServiceMonitor, PodMonitor or PrometheusRule)."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1", obj["apiVersion"]
    errors = crd_validator(obj["kind"]).iter_errors(obj)
    return sorted(f"{'.'.join(str(p) for p in e.absolute_path) or '(object)'}: {e.message}" for e in errors)


def test_the_crds_are_the_prometheus_operators_with_their_origin() -> None:
    with open(os.path.join(PROMETHEUS_OPERATOR, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    assert "github.com/prometheus-operator/prometheus-operator" in readme and "v0.93.0" in readme
    for name in CRD_FILES.values():
        assert name in readme
        with open(os.path.join(PROMETHEUS_OPERATOR, name), encoding="utf-8") as handle:
            crd = yaml.safe_load(handle)
        assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] == "0.93.0"


def test_the_crd_validation_refuses_what_the_api_server_would(helm: str, template: Any) -> None:
    """The check below can fail: a wrong duration, an unknown field and a missing required field are named."""
    monitor = copy.deepcopy(one(template("metrics.serviceMonitor.enabled=true"), "ServiceMonitor"))
    assert crd_problems(monitor) == []
    monitor["spec"]["endpoints"][0]["interval"] = "often"
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    del monitor["spec"]["selector"]
    problems = crd_problems(monitor)
    assert any(p.startswith("spec.endpoints.0.interval: 'often' does not match") for p in problems), problems
    assert any(p.startswith("spec.endpoints.0: Additional properties") and "honourLabels" in p for p in problems)
    assert "spec: 'selector' is a required property" in problems


# ---------------------------------------------------------------------------------------------------------
# off by default


def test_the_monitoring_objects_are_off_by_default(template: Any) -> None:
    docs = template()
    assert not [d for d in docs if d["kind"] in MONITORING_KINDS]
    assert dashboard_config_maps(docs) == []
    assert "--log-format" not in container(docs)["args"]


# ---------------------------------------------------------------------------------------------------------
# the ServiceMonitor


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_the_service_monitor_scrapes_the_operators_metrics_service(template: Any) -> None:
    docs = template(
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.namespace=monitoring",
        "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
        "metrics.serviceMonitor.interval=30s",
        "metrics.serviceMonitor.scrapeTimeout=",
    )
    monitor = one(docs, "ServiceMonitor", FULLNAME)
    assert crd_problems(monitor) == []
    labels_are_standard(monitor)
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # it selects exactly the metrics Service, in the release namespace, on the port that Service names
    services = objects(docs, "Service")
    selected = [s for s in services if matches(monitor["spec"]["selector"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in selected] == [f"{FULLNAME}-metrics"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in selected[0]["spec"]["ports"]]
    # the Service's port reaches the operator container's metrics port (8080)
    ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    assert ports[selected[0]["spec"]["ports"][0]["targetPort"]] == 8080
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s", "honorLabels": True}


def test_the_service_monitors_defaults(template: Any) -> None:
    monitor = one(template("metrics.serviceMonitor.enabled=true"), "ServiceMonitor", FULLNAME)
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s", "honorLabels": True}
    ]
    off = one(
        template("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.honorLabels=false"), "ServiceMonitor"
    )
    assert off["spec"]["endpoints"][0]["honorLabels"] is False and crd_problems(off) == []


def test_a_service_monitor_without_the_metrics_service_fails_the_render(helm: str) -> None:
    message = failed_render(helm, "metrics.serviceMonitor.enabled=true", "operator.metrics.service.enabled=false")
    assert "metrics.serviceMonitor.enabled" in message and "operator.metrics.service.enabled=false" in message


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ["metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.interval=5s"],
            "metrics.serviceMonitor: scrapeTimeout (10s) is longer than interval (5s)",
        ),
        (
            [
                "metrics.podMonitor.enabled=true",
                "metrics.podMonitor.interval=1m",
                "metrics.podMonitor.scrapeTimeout=1m1s",
            ],
            "metrics.podMonitor: scrapeTimeout (1m1s) is longer than interval (1m)",
        ),
    ],
)
def test_a_scrape_timeout_longer_than_the_interval_fails_the_render(helm: str, values: list[str], message: str) -> None:
    assert message in failed_render(helm, *values)


@pytest.mark.parametrize(
    ("interval", "timeout"), [("1m", "59s999ms"), ("1h", "10s"), ("2m", "1m30s"), ("", "10s"), ("30s", "")]
)
def test_a_scrape_timeout_within_the_interval_renders(template: Any, interval: str, timeout: str) -> None:
    values = ("metrics.podMonitor.enabled=true", f"metrics.podMonitor.interval={interval}")
    monitor = one(template(*values, f"metrics.podMonitor.scrapeTimeout={timeout}"), "PodMonitor")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint.get("interval", ""), endpoint.get("scrapeTimeout", "")) == (interval, timeout)
    assert crd_problems(monitor) == []


# ---------------------------------------------------------------------------------------------------------
# the PodMonitor


def demo_worker_pod(operator: Mapping[str, Any], monkeypatch: Any) -> dict[str, Any]:
    """The worker pod the rendered operator makes for examples/demo.yaml without its spec.image, read through the
    operator's own command line and environment as the rendered Deployment runs it."""
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options
    from elastream.control.backends.worker_objects import worker_pod

    env = env_of(operator)
    monkeypatch.setenv("ELASTREAM_WORKER_IMAGE", env["ELASTREAM_WORKER_IMAGE"])  # read when the parser is built
    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    options = operator_options(build_parser().parse_args(operator["command"][1:] + operator["args"]))
    with open(os.path.join(EXAMPLES, "demo.yaml"), encoding="utf-8") as handle:
        manifest = yaml.safe_load(handle)
    del manifest["spec"]["image"]
    return worker_pod(check_manifest(manifest), "node-0", {"name": "demo", "uid": "u"}, options.worker)


def test_the_pod_monitor_selects_the_worker_pods_the_operator_makes(template: Any, monkeypatch: Any) -> None:
    docs = template(
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.labels.release=kube-prometheus-stack",
        "metrics.podMonitor.interval=",
    )
    monitor = one(docs, "PodMonitor", f"{FULLNAME}-workers")
    assert crd_problems(monitor) == []
    labels_are_standard(monitor)
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    pod = demo_worker_pod(container(docs), monkeypatch)
    assert matches(monitor["spec"]["selector"], pod["metadata"]["labels"])
    # not the operator's own pod, nor the bundled Redis'
    deployment = one(docs, "Deployment", FULLNAME)
    redis = one(docs, "StatefulSet")
    for other in (deployment, redis):
        assert not matches(monitor["spec"]["selector"], other["spec"]["template"]["metadata"]["labels"])
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "scrapeTimeout": "10s", "honorLabels": True}
    [worker] = pod["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9100} in [
        {k: p[k] for k in ("name", "containerPort")} for p in worker["ports"]
    ]


@pytest.mark.parametrize(
    ("values", "selector"),
    [
        (["operator.watchNamespaces={streams,analytics}"], {"matchNames": ["streams", "analytics"]}),
        (["operator.watchNamespace=streams"], {"matchNames": ["streams"]}),
        (
            ["operator.watchNamespaces={streams}", "metrics.podMonitor.namespaceSelector.any=true"],
            {"any": True},
        ),
        (["metrics.podMonitor.namespaceSelector.matchNames={team-a}"], {"matchNames": ["team-a"]}),
    ],
)
def test_the_pod_monitor_looks_in_the_watched_namespaces_or_the_given_ones(
    template: Any, values: list[str], selector: dict[str, Any]
) -> None:
    monitor = one(template("metrics.podMonitor.enabled=true", *values), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == selector
    assert crd_problems(monitor) == []


# ---------------------------------------------------------------------------------------------------------
# the PrometheusRule and the dashboard


def load_alerts() -> dict[str, Any]:
    with open(ALERTS, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def test_the_prometheus_rule_is_the_charts_alerts_file(template: Any) -> None:
    rule = one(
        template("metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=kube-prometheus-stack"),
        "PrometheusRule",
        FULLNAME,
    )
    assert crd_problems(rule) == []
    labels_are_standard(rule)
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["spec"] == load_alerts()  # as written: the descriptions' {{ $labels.x }} are Prometheus'
    assert [g["name"] for g in rule["spec"]["groups"]] == ["elastream"]


def test_additional_labels_reach_every_alert_and_its_own_severity_stays(template: Any) -> None:
    rule = one(
        template(
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule.namespace=monitoring",
            "metrics.prometheusRule.additionalLabels.team=streams",
            "metrics.prometheusRule.additionalLabels.severity=none",
        ),
        "PrometheusRule",
    )
    assert crd_problems(rule) == []
    assert rule["metadata"]["namespace"] == "monitoring"
    source = load_alerts()
    rendered = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    written = [r for g in source["groups"] for r in g["rules"]]
    assert len(rendered) == len(written) > 0
    for got, want in zip(rendered, written, strict=True):
        assert got["labels"] == {"team": "streams", **want.get("labels", {})}
        assert got["labels"]["severity"] == want["labels"]["severity"]
        assert {k: v for k, v in got.items() if k != "labels"} == {k: v for k, v in want.items() if k != "labels"}


def test_the_dashboard_config_map_holds_the_charts_dashboard_for_grafanas_sidecar(template: Any) -> None:
    docs = template(
        "metrics.dashboard.enabled=true",
        "metrics.dashboard.namespace=monitoring",
        "metrics.dashboard.annotations.grafana_folder=Streaming",
        "metrics.dashboard.labels.team=streams",
    )
    [config_map] = dashboard_config_maps(docs)
    labels_are_standard(config_map)
    assert config_map["metadata"]["name"] == f"{FULLNAME}-dashboard"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["labels"]["team"] == "streams"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Streaming"}
    assert list(config_map["data"]) == ["elastream.json"]
    with open(DASHBOARD, encoding="utf-8") as handle:
        assert json.loads(config_map["data"]["elastream.json"]) == json.load(handle)
    # a sidecar that looks for another value of the label
    other = dashboard_config_maps(
        template("metrics.dashboard.enabled=true", "metrics.dashboard.labels.grafana_dashboard=elastream")
    )
    assert other[0]["metadata"]["labels"]["grafana_dashboard"] == "elastream"


@pytest.mark.parametrize(
    ("value", "file"),
    [("metrics.prometheusRule.enabled", "files/alerts.yaml"), ("metrics.dashboard.enabled", "files/dashboard.json")],
)
def test_a_chart_copy_without_its_files_fails_the_render_rather_than_ship_nothing(
    helm: str, tmp_path: Any, value: str, file: str
) -> None:
    chart = os.path.join(tmp_path, "elastream")
    shutil.copytree(CHART, chart)  # crds/ is a symlink to the repository's CRD: copied as the file it names
    os.remove(os.path.join(chart, file))
    proc = run_helm(helm, "template", RELEASE, chart, "--set", f"{value}=true", check=False)
    assert proc.returncode != 0 and f"{value}: the chart has no {file}" in proc.stderr
    run_helm(helm, "template", RELEASE, chart)  # off, the chart renders without it


def test_everything_on_renders_valid_objects(helm: str, template: Any) -> None:
    """Every monitoring object at once, with watched namespaces: the CRDs' schemas for the Prometheus Operator's
    kinds, the Kubernetes schemas for the rest, `helm lint --strict` for the chart."""
    values = [*ALL_MONITORING, "operator.watchNamespaces={streams,analytics}", "logFormat=json"]
    docs = template(*values)
    assert {d["kind"] for d in docs} >= MONITORING_KINDS
    assert len(dashboard_config_maps(docs)) == 1
    import kubernetes_validate

    version = kubernetes_version(kubernetes_validate)
    for obj in docs:
        labels_are_standard(obj)
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            assert crd_problems(obj) == [], obj["kind"]
        elif not obj["apiVersion"].startswith("cert-manager.io/"):
            kubernetes_validate.validate(obj, version, strict=True)
    proc = run_helm(helm, "lint", "--strict", CHART, *set_args(values))
    assert "0 chart(s) failed" in proc.stdout


# ---------------------------------------------------------------------------------------------------------
# operator.watchNamespaces


def operator_namespaces(operator: Mapping[str, Any], monkeypatch: Any) -> tuple[str, ...]:
    """The namespaces the rendered operator watches, read by its own command-line parser."""
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options

    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    return operator_options(build_parser().parse_args(operator["command"][1:] + operator["args"])).namespaces


def test_several_watched_namespaces_get_one_namespace_argument_and_one_role_each(
    template: Any, monkeypatch: Any
) -> None:
    docs = template("operator.watchNamespaces={streams,analytics}")
    operator = container(docs)
    assert operator["args"] == [
        "--namespace", "streams", "--namespace", "analytics", *ELECTION_ARGS, "--engine", "spark", *TIMEOUT_ARGS,
    ]  # fmt: skip
    assert operator_namespaces(operator, monkeypatch) == ("streams", "analytics")
    for namespace in ("streams", "analytics"):
        [role] = [r for r in objects(docs, "Role") if r["metadata"].get("namespace") == namespace]
        assert role["metadata"]["name"] == FULLNAME and rules_of(role) == NAMESPACED_RULES
        [binding] = [b for b in objects(docs, "RoleBinding") if b["metadata"].get("namespace") == namespace]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FULLNAME}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    # two Roles for the topologies and the leader election's in the release namespace, nothing else namespaced
    assert sorted(r["metadata"]["namespace"] for r in objects(docs, "Role")) == ["analytics", NAMESPACE, "streams"]
    # cluster-wide: reading CRDs only, none of the namespaced rights
    [cluster_role] = objects(docs, "ClusterRole")
    assert rules_of(cluster_role) == CRD_RULES
    assert not set(rules_of(cluster_role)) & set(NAMESPACED_RULES)
    [cluster_binding] = objects(docs, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    # the bundled Redis accepts worker pods from those namespaces only
    redis_policy = one(docs, "NetworkPolicy", f"{RELEASE}-redis")
    workers = redis_policy["spec"]["ingress"][0]["from"][1]
    assert workers["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["streams", "analytics"]}
        ]
    }


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["operator.watchNamespace=streams"], ("streams",)),
        (["operator.watchNamespaces={streams}"], ("streams",)),
        # watchNamespaces wins over the one-namespace form
        (["operator.watchNamespace=old", "operator.watchNamespaces={streams,analytics}"], ("streams", "analytics")),
        # a list in the one-namespace form reads as watchNamespaces
        (["operator.watchNamespace={streams,analytics}"], ("streams", "analytics")),
        ([], ()),
    ],
)
def test_the_one_namespace_form_still_works_and_the_list_wins(
    template: Any, monkeypatch: Any, values: list[str], expected: tuple[str, ...]
) -> None:
    docs = template(*values)
    assert operator_namespaces(container(docs), monkeypatch) == expected
    roles = sorted(r["metadata"]["namespace"] for r in objects(docs, "Role") if r["metadata"]["name"] == FULLNAME)
    assert roles == sorted(expected)
    if expected:
        assert [rules_of(r) for r in objects(docs, "ClusterRole")] == [CRD_RULES]
    else:
        assert rules_of(one(docs, "ClusterRole", FULLNAME)) == {**NAMESPACED_RULES, **CRD_RULES}


def test_one_watched_namespace_renders_as_in_chart_0_1(template: Any) -> None:
    """The string form and a list of one render the same operator, RBAC and NetworkPolicies (the Redis policy's
    matchLabels as before)."""
    kinds = {"Deployment", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "NetworkPolicy"}
    string_form, list_form = template("operator.watchNamespace=streams"), template("operator.watchNamespaces={streams}")
    assert [d for d in string_form if d["kind"] in kinds] == [d for d in list_form if d["kind"] in kinds]
    policy = one(list_form, "NetworkPolicy", f"{RELEASE}-redis")
    selector = policy["spec"]["ingress"][0]["from"][1]["namespaceSelector"]
    assert selector == {"matchLabels": {"kubernetes.io/metadata.name": "streams"}}


# ---------------------------------------------------------------------------------------------------------
# logFormat and the images' tags


def test_log_format_json_reaches_the_operators_command_line(template: Any, monkeypatch: Any) -> None:
    from elastream.cli import build_parser

    operator = container(template("logFormat=json"))
    at = operator["args"].index("--log-format")
    assert operator["args"][at + 1] == "json"
    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    assert build_parser().parse_args(operator["command"][1:] + operator["args"]).log_format == "json"
    # text is the operator's default: the chart passes nothing for it
    assert "--log-format" not in container(template("logFormat=text"))["args"]


def test_the_images_default_to_the_charts_app_version(template: Any, monkeypatch: Any) -> None:
    version = APP_VERSION
    docs = template()
    operator = container(docs)
    assert operator["image"] == f"elastream-operator:{version}"
    assert env_of(operator)["ELASTREAM_WORKER_IMAGE"] == f"elastream-worker:{version}"
    # a topology without spec.image runs it
    assert demo_worker_pod(operator, monkeypatch)["spec"]["containers"][0]["image"] == f"elastream-worker:{version}"
    # local builds (make images, scripts/images.sh) are tagged dev
    dev = container(template("operator.image.tag=dev", "worker.image.tag=dev"))
    assert dev["image"] == "elastream-operator:dev"
    assert env_of(dev)["ELASTREAM_WORKER_IMAGE"] == "elastream-worker:dev"


# ---------------------------------------------------------------------------------------------------------
# the values schema


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["logFormat=xml"], "/logFormat"),
        (["metrics.serviceMonitor.enabled=yes"], "/metrics/serviceMonitor/enabled"),
        (["metrics.serviceMonitor.interval=often"], "/metrics/serviceMonitor/interval"),
        (["metrics.serviceMonitor.scrapeTimeout=10"], "/metrics/serviceMonitor/scrapeTimeout"),
        (["metrics.serviceMonitor.honorLabels=maybe"], "/metrics/serviceMonitor/honorLabels"),
        (["metrics.serviceMonitor.labels.release=1"], "/metrics/serviceMonitor/labels/release"),
        (["metrics.serviceMonitor.namespace=Monitoring"], "/metrics/serviceMonitor/namespace"),
        (["metrics.serviceMonitor.port=metrics"], "port"),
        (["metrics.podMonitor.enabled=1"], "/metrics/podMonitor/enabled"),
        (["metrics.podMonitor.interval=15 s"], "/metrics/podMonitor/interval"),
        (["metrics.podMonitor.namespaceSelector.all=true"], "/metrics/podMonitor/namespaceSelector"),
        (["metrics.podMonitor.namespaceSelector.any=yes"], "/metrics/podMonitor/namespaceSelector/any"),
        (["metrics.prometheusRule.enabled=on"], "/metrics/prometheusRule/enabled"),
        (["metrics.prometheusRule.additionalLabels.team=7"], "/metrics/prometheusRule/additionalLabels/team"),
        (["metrics.dashboard.enabled=true", "metrics.dashboard.folder=x"], "folder"),
        (["metrics.dashboard.annotations.grafana_folder=true"], "/metrics/dashboard/annotations/grafana_folder"),
        (["metrics.grafana.enabled=true"], "grafana"),
        (["operator.watchNamespaces=streams"], "/operator/watchNamespaces"),
        (["operator.watchNamespaces={Streams}"], "/operator/watchNamespaces/0"),
        (["operator.watchNamespaces={streams,streams}"], "/operator/watchNamespaces"),
        (["operator.watchNamespace=Bad_NS"], "/operator/watchNamespace"),
        (["operator.watchNamespace={ok,Bad_NS}"], "/operator/watchNamespace/1"),
    ],
)
def test_the_values_schema_rejects_wrong_monitoring_and_namespace_values(
    helm: str, values: list[str], message: str
) -> None:
    stderr = failed_render(helm, *values)
    assert "values don't meet the specifications of the schema" in stderr and message in stderr, stderr
