"""The Helm chart (charts/elastream): `helm lint --strict`, and `helm template` with the default values, an
external Redis, two replicas, no leader election, Redis without persistence and one watched namespace, parsed and
checked: the CRD is the repository's, RBAC is exactly the rules the operator needs (and a Role for its Lease), the
operator runs locked down and takes the Lease `elastream-operator` before it works, the Redis URL sits in a
Secret, the bundled Redis keeps an append-only file on a PersistentVolumeClaim and reads its password from a file
of that Secret. Every rendered Kubernetes object is validated offline against the Kubernetes
1.34 OpenAPI schemas (`kubernetes-validate`), and every value is typed in values.schema.json, commented in
values.yaml and listed in docs/chart.md.

These tests need a `helm` binary: $ELASTREAM_HELM, else `helm` on PATH, else the one
`scripts/k8s-tools.sh` builds into ~/.cache/elastream/tools/*/bin/helm. Without one they FAIL, saying how
to get it: a chart nobody rendered is not a tested chart.
"""

from __future__ import annotations

import base64
import functools
import glob
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import pytest
import yaml

from support.manifests import assert_worker_binds
from support.paths import REPO

CHART = os.path.join(REPO, "charts", "elastream")
CRD = os.path.join(REPO, "crds", "streamtopology.yaml")
RELEASE, NAMESPACE = "es", "elastream-system"
FULLNAME = f"{RELEASE}-elastream"
REDIS = f"{RELEASE}-redis"
KUBERNETES_VERSION = "1.34.0"
#: the default scraper of the metrics ports (networkPolicy.metricsFrom)
PROMETHEUS = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
#: the operator's default wait for worker pods, their image pull policy and the per-topology NetworkPolicies, as
#: the chart passes them
TIMEOUT_ARGS = [
    "--worker-start-timeout", "180",
    "--worker-image-pull-policy", "IfNotPresent",
    "--network-policies", "--metrics-from", json.dumps([PROMETHEUS], separators=(",", ":")),
    "--worker-grace-period", "30", "--drains", "on", "--disruption-budgets", "on",
    "--redis-topology-users", "on",
]  # fmt: skip
#: leader election with the chart's defaults: the Lease in the release namespace (the kubelet expands the variable)
ELECTION_ARGS = [
    "--leader-elect",
    "--leader-elect-lease-duration", "15",
    "--leader-elect-renew-deadline", "10",
    "--leader-elect-retry-period", "2",
    "--leader-elect-namespace", "$(POD_NAMESPACE)",
]  # fmt: skip
LEASE = "elastream-operator"
with open(os.path.join(CHART, "Chart.yaml"), encoding="utf-8") as _handle:
    #: the images' tag when operator.image.tag and worker.image.tag are empty (their default)
    APP_VERSION = str(yaml.safe_load(_handle)["appVersion"])

#: rendering scenarios: name -> --set arguments
SCENARIOS: dict[str, list[str]] = {
    "default": [],
    "external-url": ["redis.enabled=false", "redis.external.url=redis://:s3cret@redis.example:6379/1"],
    "external-secret": [
        "redis.enabled=false",
        "redis.external.existingSecret=my-redis",
        "redis.external.existingSecretKey=uri",
    ],
    "replicas-2": ["operator.replicas=2"],
    "no-leader-election": ["operator.leaderElection.enabled=false"],
    "leader-election-timing": [
        "operator.leaderElection.leaseDurationSeconds=30",
        "operator.leaderElection.renewDeadlineSeconds=20",
        "operator.leaderElection.retryPeriodSeconds=5",
    ],
    "watch-namespace": ["operator.watchNamespace=streams"],
    "replicas-2-watch-namespace": ["operator.replicas=2", "operator.watchNamespace=streams"],
    "watch-namespaces": ["operator.watchNamespaces={streams,analytics}"],
    "persistence": [
        "redis.persistence.size=5Gi",
        "redis.persistence.storageClass=fast",
        "redis.persistence.accessModes={ReadWriteOncePod}",
        "redis.appendfsync=always",
    ],
    "persistence-no-class": ["redis.persistence.storageClass=-"],
    "no-persistence": ["redis.persistence.enabled=false"],
    "no-topology-users": ["redis.enabled=false", "redis.external.url=redis://r:6379", "redis.topologyUsers=false"],
    "listen-on-pod-ip": ["listenOnPodIP=true"],
    "no-network-policy": ["networkPolicy.enabled=false"],
    "metrics-from-monitoring": [
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
    ],
    "no-redis-tls": ["redis.tls.enabled=false"],
    "redis-tls-cert-manager": ["redis.tls.certManager.enabled=true"],
    "redis-tls-cert-manager-issuer": [
        "redis.tls.certManager.enabled=true",
        "redis.tls.certManager.issuerRef.name=corp-ca",
        "redis.tls.certManager.issuerRef.kind=ClusterIssuer",
    ],
    "redis-tls-existing-secret": ["redis.tls.existingSecret=my-redis-tls"],
    "external-url-private-ca": [
        "redis.enabled=false",
        "redis.external.url=rediss://:s3cret@redis.example:6380/0?ssl_ca_certs=/etc/elastream/redis-tls/ca.crt",
        "redis.external.caSecret=corp-ca",
        "redis.external.caSecretKey=root.pem",
    ],
    "no-drains": [
        "worker.drains=false",
        "worker.podDisruptionBudget=false",
        "worker.terminationGracePeriodSeconds=12",
    ],
    "worker-images": [
        "worker.image.pullPolicy=Always",
        "worker.imagePullSecrets[0].name=regcred",
        "worker.imagePullSecrets[1].name=mirror",
        "worker.allowedImages={registry.example.com/streams/,ghcr.io/acme/worker}",
    ],
}


def find_helm() -> str | None:
    """$ELASTREAM_HELM, `helm` on PATH, or the newest ~/.cache/elastream/tools/*/bin/helm."""
    explicit = os.environ.get("ELASTREAM_HELM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    cache = os.environ.get("ELASTREAM_TOOLS_CACHE", os.path.expanduser("~/.cache/elastream/tools"))
    built = [p for p in glob.glob(os.path.join(cache, "*", "bin", "helm")) if os.access(p, os.X_OK)]
    return max(built, key=os.path.getmtime) if built else None


def helm_binary() -> str:
    """find_helm's binary; without one the test fails, saying how to get it."""
    binary = find_helm()
    if binary is None:
        pytest.fail(
            "no helm binary: the chart tests need one. Build it (with the Kubernetes test tier's tools) with "
            "`bash scripts/k8s-tools.sh` (into ~/.cache/elastream/tools/*/bin/helm), or install helm 3 on PATH, "
            "or point ELASTREAM_HELM at one",
            pytrace=False,
        )
    return binary


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, env=env)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def set_args(values: list[str]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


@functools.cache
def _render(helm: str, scenario: str) -> tuple[dict[str, Any], ...]:
    proc = run_helm(
        helm, "template", RELEASE, CHART, "--namespace", NAMESPACE, "--include-crds", *set_args(SCENARIOS[scenario])
    )
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


@pytest.fixture(scope="module")
def render(helm: str) -> Any:
    return lambda scenario: _render(helm, scenario)


def objects(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in objects(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}: {[d['metadata']['name'] for d in objects(docs, kind)]}"
    return found[0]


def container(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    [operator] = one(docs, "Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"]
    return operator


def env_of(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# ---------------------------------------------------------------------------------------------------------
# lint and the values schema


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_lint_strict(helm: str, scenario: str) -> None:
    proc = run_helm(helm, "lint", "--strict", CHART, *set_args(SCENARIOS[scenario]))
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["operator.replicas=two"], "/operator/replicas"),
        (["operator.replicas=0"], "/operator/replicas"),
        (["operator.replica=2"], "replica"),
        (["redis.enabled=maybe"], "/redis/enabled"),
        (["operator.logLevel=LOUD"], "/operator/logLevel"),
        (["redis.external.url=http://redis:6379"], "/redis/external/url"),
        (["operator.peering.name=elastream"], "peering"),
        (["operator.leaderElection.enabled=yes"], "/operator/leaderElection/enabled"),
        (["operator.leaderElection.leaseDurationSeconds=0"], "/operator/leaderElection/leaseDurationSeconds"),
        (["operator.leaderElection.renewDeadlineSeconds=2.5"], "/operator/leaderElection/renewDeadlineSeconds"),
        (["operator.leaderElection.retryPeriodSeconds=0"], "/operator/leaderElection/retryPeriodSeconds"),
        (["redis.appendfsync=sometimes"], "/redis/appendfsync"),
        (["redis.persistence.enabled=1"], "/redis/persistence/enabled"),
        (["redis.persistence.size=lots"], "/redis/persistence/size"),
        (["redis.persistence.storageClass=Fast_Disks"], "/redis/persistence/storageClass"),
        (["redis.persistence.accessModes={ReadWriteSometimes}"], "/redis/persistence/accessModes"),
        (["worker.image.pullPolicy=Sometimes"], "/worker/image/pullPolicy"),
        (["networkPolicy.enabled=no"], "/networkPolicy/enabled"),
        (["networkPolicy.metricsFrom[0].podSelecter.x=y"], "/networkPolicy/metricsFrom/0"),
        (["worker.imagePullSecrets[0].nam=regcred"], "/worker/imagePullSecrets/0"),
        (["worker.allowedImages={a b}"], "/worker/allowedImages/0"),
    ],
)
def test_the_values_schema_rejects_wrong_values(helm: str, values: list[str], message: str) -> None:
    proc = run_helm(helm, "template", RELEASE, CHART, *set_args(values), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr and message in proc.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["redis.enabled=false"], "set redis.external.url"),
        (["redis.enabled=false", "redis.external.url=redis://r:6379", "redis.external.existingSecret=s"], "not both"),
        (["redis.tls.existingSecret=mine", "redis.tls.certManager.enabled=true"], "redis.tls: set either"),
        (
            ["operator.replicas=2", "operator.leaderElection.enabled=false"],
            "more than one operator replica needs operator.leaderElection.enabled=true",
        ),
        (["spark.master=spark://master:7077"], "spark.master is set: its executors connect back to the operator"),
        (
            ["operator.leaderElection.renewDeadlineSeconds=15"],
            "renewDeadlineSeconds (15) must be less than leaseDurationSeconds (15)",
        ),
        (
            ["operator.leaderElection.retryPeriodSeconds=9"],
            "renewDeadlineSeconds (10) must be more than 1.2 x retryPeriodSeconds (9)",
        ),
    ],
)
def test_settings_that_cannot_work_fail_the_render(helm: str, values: list[str], message: str) -> None:
    proc = run_helm(helm, "template", RELEASE, CHART, *set_args(values), check=False)
    assert proc.returncode != 0 and message in proc.stderr


def leaf_paths(schema: Mapping[str, Any], values: Any, prefix: str = "") -> Iterator[str]:
    """Every value the schema describes that is not itself a group of described values. A closed object whose
    default in `values` (values.yaml) is empty is one value, given whole (metrics.podMonitor.namespaceSelector)."""
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        default = values.get(name) if isinstance(values, Mapping) else None
        if "properties" in sub and sub.get("additionalProperties") is False and default != {}:
            yield from leaf_paths(sub, default, path)
        else:
            yield path


def load_values() -> dict[str, Any]:
    with open(os.path.join(CHART, "values.yaml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_values_schema() -> dict[str, Any]:
    with open(os.path.join(CHART, "values.schema.json"), encoding="utf-8") as handle:
        return json.load(handle)


def lookup(values: Mapping[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def key_line(lines: list[str], path: str) -> int:
    """Index of the line of `path`'s key in values.yaml, looked up key by key within each parent's block."""
    index = -1
    for depth, key in enumerate(path.split(".")):
        pattern = re.compile(rf"^{'  ' * depth}{re.escape(key)}:")
        index = next(i for i in range(index + 1, len(lines)) if pattern.match(lines[i]))
    return index


def test_the_default_values_pass_their_schema() -> None:
    jsonschema.Draft7Validator(load_values_schema()).validate(load_values())


def test_every_value_is_typed_described_commented_and_documented() -> None:
    values, schema = load_values(), load_values_schema()
    paths = [p for p in leaf_paths(schema, values) if p != "global"]
    with open(os.path.join(CHART, "values.yaml"), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    with open(os.path.join(REPO, "docs", "chart.md"), encoding="utf-8") as handle:
        table = handle.read()
    for path in paths:
        lookup(values, path)  # a KeyError names a described value values.yaml lacks
        node: Any = schema
        for part in path.split("."):
            node = node["properties"][part]
        assert node.get("description"), f"values.schema.json: {path} has no description"
        # in values.yaml, the key's line is preceded by a "# --" comment block
        above = key_line(lines, path) - 1
        while above >= 0 and lines[above].strip().startswith("#") and not lines[above].strip().startswith("# --"):
            above -= 1
        assert above >= 0 and lines[above].strip().startswith("# --"), f"values.yaml: {path} has no '# --' comment"
        assert f"| `{path}` |" in table, f"docs/chart.md: no row for {path}"
    # and every row of the table is a value
    rows = re.findall(r"^\| `([A-Za-z.]+)` \|", table, flags=re.M)
    assert sorted(rows) == sorted(paths)


def test_notes_tell_the_next_commands() -> None:
    with open(os.path.join(CHART, "templates", "NOTES.txt"), encoding="utf-8") as handle:
        notes = handle.read()
    for command in (
        "kubectl apply",
        "-f examples/",
        "kubectl get topo",
        " -w",
        "kubectl scale topo",
        "kubectl patch topo",
    ):
        assert command in notes


# ---------------------------------------------------------------------------------------------------------
# what the chart renders


def test_the_chart_ships_the_repository_crd(render: Any) -> None:
    with open(CRD, encoding="utf-8") as handle:
        source = yaml.safe_load(handle)
    for scenario in SCENARIOS:
        assert one(render(scenario), "CustomResourceDefinition", "streamtopologies.elastream.dev") == source
    with open(CRD, "rb") as a, open(os.path.join(CHART, "crds", "streamtopology.yaml"), "rb") as b:
        assert a.read() == b.read()


#: every Kubernetes API call the operator's code makes (a method of a kubernetes client API object), as the
#: RBAC rule it needs: (API group, resource, verb). `test_the_code_makes_exactly_the_tabled_api_calls` scans
#: operator/src/elastream for these calls, so a new call without a row, or a row no code calls, fails.
CODE_CALLS: dict[str, tuple[str, str, str]] = {
    # ResourceApi: the status writer, the autoscaler's spec.nodes, the restart-from-scratch annotation
    "patch_namespaced_custom_object_status": ("elastream.dev", "streamtopologies/status", "patch"),
    "patch_namespaced_custom_object": ("elastream.dev", "streamtopologies", "patch"),
    # `elastream plan --live` in the operator's pod (control.live_plan): one topology by a metadata.name field
    # selector (the chart grants list, which kopf needs anyway, and no get)
    "list_namespaced_custom_object": ("elastream.dev", "streamtopologies", "list"),
    # KubernetesEvents
    "create_namespaced_event": ("", "events", "create"),
    # KubernetesBackend: worker pods, the topology's ConfigMap and Secret
    "list_namespaced_pod": ("", "pods", "list"),
    "read_namespaced_pod": ("", "pods", "get"),  # its owner, before a delete
    "create_namespaced_pod": ("", "pods", "create"),
    "delete_namespaced_pod": ("", "pods", "delete"),
    "read_namespaced_config_map": ("", "configmaps", "get"),  # its owner, before a patch
    "create_namespaced_config_map": ("", "configmaps", "create"),
    "patch_namespaced_config_map": ("", "configmaps", "patch"),
    "read_namespaced_secret": ("", "secrets", "get"),
    "create_namespaced_secret": ("", "secrets", "create"),
    "patch_namespaced_secret": ("", "secrets", "patch"),
    # KubernetesBackend: the topology's NetworkPolicy (networkPolicy.enabled)
    "read_namespaced_network_policy": ("networking.k8s.io", "networkpolicies", "get"),
    "create_namespaced_network_policy": ("networking.k8s.io", "networkpolicies", "create"),
    "patch_namespaced_network_policy": ("networking.k8s.io", "networkpolicies", "patch"),
    # KubernetesBackend: the topology's PodDisruptionBudget (worker.podDisruptionBudget)
    "read_namespaced_pod_disruption_budget": ("policy", "poddisruptionbudgets", "get"),
    "create_namespaced_pod_disruption_budget": ("policy", "poddisruptionbudgets", "create"),
    "patch_namespaced_pod_disruption_budget": ("policy", "poddisruptionbudgets", "patch"),
    # LeaderElector (the Lease; its own Role in the release namespace)
    "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
}
#: what kopf itself asks of the API server, as the operator runs it (standalone: no peering; posting off: no
#: events of its own; finalizer and progress in annotations, written by merge patches; discovery needs no rule)
KOPF_CALLS: set[tuple[str, str, str]] = {
    ("elastream.dev", "streamtopologies", "list"),  # the initial listing of the watch
    ("elastream.dev", "streamtopologies", "watch"),
    ("elastream.dev", "streamtopologies", "patch"),  # finalizer, progress annotations
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),  # resource observation
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}
LEASES = ("coordination.k8s.io", "leases")
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions")}
#: a client method name: verb_[namespaced_]kind[_status]
API_CALL = re.compile(r"(?:create|read|list|patch|replace|delete|delete_collection)_(?:namespaced_)?[a-z_]+")


def code_api_calls() -> set[str]:
    """The Kubernetes client methods the operator's code calls or hands on (on objects named api, core, core_api,
    custom_api, networking or policy: what the operator names its client API objects)."""
    found: set[str] = set()
    root = os.path.join(REPO, "operator", "src", "elastream")
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                source = handle.read()
            # called, or handed on to be called (`self._read("Pod", self.core.read_namespaced_pod, name)`)
            for match in re.finditer(r"\b(?:api|core|core_api|custom_api|networking|policy)\s*\.\s*(\w+)", source):
                if API_CALL.fullmatch(match.group(1)):
                    found.add(match.group(1))
    return found


def rules_needed(scope: str) -> dict[tuple[str, ...], set[str]]:
    """(group, resource) -> verbs the code and kopf need: `namespaced` (the watched namespaces), `cluster`
    (cluster-scoped resources) or `leases` (the release namespace's Role)."""
    needed: dict[tuple[str, ...], set[str]] = {}
    for group, resource, verb in {*CODE_CALLS.values(), *KOPF_CALLS}:
        key = (group, resource)
        kind = "leases" if key == LEASES else "cluster" if key in CLUSTER_SCOPED else "namespaced"
        if kind == scope:
            needed.setdefault(key, set()).add(verb)
    return needed


NAMESPACED_RULES = rules_needed("namespaced")
CRD_RULES = rules_needed("cluster")


def test_the_code_makes_exactly_the_tabled_api_calls() -> None:
    """A call the table lacks (and so RBAC may lack) or a row no code calls (a rule nobody uses) fails."""
    calls = code_api_calls()
    assert calls - set(CODE_CALLS) == set(), "calls without a row in CODE_CALLS (and an RBAC rule)"
    assert set(CODE_CALLS) - calls == set(), "rows of CODE_CALLS no code calls: drop them and their rule"


def test_the_lease_rules_are_what_the_elector_calls() -> None:
    assert rules_needed("leases") == {LEASES: {"create", "get", "update"}}


ELECTION_ROLE = f"{FULLNAME}-leader-election"


def rules_of(role: Mapping[str, Any], names: bool = False) -> dict[tuple[str, ...], set[str]]:
    """(group, resource) -> verbs; with `names`, (group, resource, resourceName or "") -> verbs."""
    found: dict[tuple[str, ...], set[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule
        assert names or "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in (group, resource, *rule["verbs"]), rule
                for name in rule.get("resourceNames") or [""]:
                    key = (group, resource, name) if names else (group, resource)
                    found.setdefault(key, set()).update(rule["verbs"])
    return found


def assert_leader_election_rbac(docs: tuple[dict[str, Any], ...]) -> None:
    """A Role in the release namespace: create a Lease, get and update exactly `elastream-operator`."""
    role = one(docs, "Role", ELECTION_ROLE)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules_of(role, names=True) == {
        ("coordination.k8s.io", "leases", ""): {"create"},
        ("coordination.k8s.io", "leases", LEASE): {"get", "update"},
    }
    binding = one(docs, "RoleBinding", ELECTION_ROLE)
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ELECTION_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


@pytest.mark.parametrize("scenario", ["default", "replicas-2"])
def test_cluster_wide_rbac_is_exactly_the_operators_rules(render: Any, scenario: str) -> None:
    docs = render(scenario)
    assert [r["metadata"]["name"] for r in objects(docs, "Role")] == [ELECTION_ROLE]
    assert [r["metadata"]["name"] for r in objects(docs, "RoleBinding")] == [ELECTION_ROLE]
    assert_leader_election_rbac(docs)
    expected = {**NAMESPACED_RULES, **CRD_RULES}
    assert rules_of(one(docs, "ClusterRole", FULLNAME)) == expected
    binding = one(docs, "ClusterRoleBinding", FULLNAME)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": FULLNAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


@pytest.mark.parametrize("scenario", ["watch-namespace", "replicas-2-watch-namespace"])
def test_one_namespace_rbac_is_a_role_there_and_crd_reading(render: Any, scenario: str) -> None:
    docs = render(scenario)
    role = one(docs, "Role", FULLNAME)
    assert role["metadata"]["namespace"] == "streams"
    assert rules_of(role) == NAMESPACED_RULES
    assert_leader_election_rbac(docs)  # the Lease stays in the release namespace
    binding = one(docs, "RoleBinding", FULLNAME)
    assert binding["metadata"]["namespace"] == "streams"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    [cluster_role] = objects(docs, "ClusterRole")
    assert rules_of(cluster_role) == CRD_RULES
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == cluster_role["metadata"]["name"]


def test_the_operator_runs_locked_down(render: Any) -> None:
    docs = render("default")
    deployment = one(docs, "Deployment", FULLNAME)
    pod = deployment["spec"]["template"]["spec"]
    operator = container(docs)
    security = operator["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 10001
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"] == FULLNAME
    # a read-only root filesystem with a writable /tmp (and, with Redis' TLS, its CA read-only)
    [mount] = [m for m in operator["volumeMounts"] if not m.get("readOnly")]
    assert mount["mountPath"] == "/tmp"
    assert next(v for v in pod["volumes"] if v["name"] == mount["name"])["emptyDir"] is not None


def test_the_operator_container(render: Any) -> None:
    docs = render("default")
    operator = container(docs)
    assert operator["image"] == f"elastream-operator:{APP_VERSION}"  # the chart's own release of the images
    assert operator["imagePullPolicy"] == "IfNotPresent"
    assert operator["command"] == ["elastream", "operator"]
    assert operator["args"] == ["--all-namespaces", *ELECTION_ARGS, "--engine", "spark", *TIMEOUT_ARGS]
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    probe = operator["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and ports[probe["port"]] == 8081
    assert operator["resources"]["requests"] and operator["resources"]["limits"]
    env = env_of(operator)
    assert env["ELASTREAM_REDIS_URL"] == {"secretKeyRef": {"name": REDIS, "key": "url"}}
    assert env["ELASTREAM_WORKER_IMAGE"] == f"elastream-worker:{APP_VERSION}"
    assert env["ELASTREAM_SPARK_MASTER"] == "" and env["ELASTREAM_SPARK_CONF"] == ""
    assert env["ELASTREAM_LOG_LEVEL"] == "INFO"
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # the Lease holder's identity
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}  # what workers are reached at
    assert not any("redis://" in arg for arg in operator["args"] + operator["command"])
    service = one(docs, "Service", f"{FULLNAME}-metrics")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("scenario", ["default", "listen-on-pod-ip"])
def test_every_listener_binds_every_interface_unless_listen_on_pod_ip(render: Any, scenario: str, monkeypatch) -> None:
    """Redis, the operator's metrics and health, and the worker pods the operator creates (read through the
    operator's own command line, as the rendered Deployment runs it) listen on every interface, so
    `kubectl port-forward` and `kubectl exec ... redis-cli` (localhost in the pod) work; on the pod IP only
    with listenOnPodIP (pods sharing the host's network)."""
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options
    from elastream.control.backends.worker_objects import worker_pod
    from elastream.crd import load_manifest
    from elastream.handlers.main import listen_address

    on_pod_ip = scenario == "listen-on-pod-ip"
    docs = render(scenario)
    [redis] = one(docs, "StatefulSet", REDIS)["spec"]["template"]["spec"]["containers"]
    bind = redis["command"][redis["command"].index("--bind") + 1 :]
    bind = bind[: next((i for i, a in enumerate(bind) if a.startswith("--")), len(bind))]
    assert bind == (["$(POD_IP)"] if on_pod_ip else ["*", "-::*"])

    operator = container(docs)
    monkeypatch.setenv("POD_IP", "127.0.0.9")
    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    args = build_parser().parse_args(operator["command"][1:] + operator["args"])
    options = operator_options(args)
    assert listen_address(options.worker.listen_on_pod_ip) == ("127.0.0.9" if on_pod_ip else "0.0.0.0")
    pod = worker_pod(
        load_manifest(os.path.join(REPO, "examples", "demo.yaml")), "node-0", {"name": "demo", "uid": "u"},
        options.worker,
    )  # fmt: skip
    assert_worker_binds(pod, on_pod_ip)


def test_spark_settings_reach_the_operator(helm: str) -> None:
    proc = run_helm(
        helm,
        "template",
        RELEASE,
        CHART,
        *set_args(["spark.master=spark://master:7077", "operator.logLevel=DEBUG", "networkPolicy.enabled=false"]),
        "--set-string",
        r"spark.conf.spark\.executor\.memory=2g,spark.conf.spark\.cores\.max=4",
    )
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    env = env_of(container(docs))
    assert env["ELASTREAM_SPARK_MASTER"] == "spark://master:7077"
    assert env["ELASTREAM_SPARK_CONF"] == "spark.cores.max=4,spark.executor.memory=2g"
    assert env["ELASTREAM_LOG_LEVEL"] == "DEBUG"


def test_worker_image_settings_reach_the_worker_pods_and_the_allow_list(render: Any, monkeypatch) -> None:
    """worker.image.pullPolicy, worker.imagePullSecrets and worker.allowedImages, read through the operator's own
    command line as the rendered Deployment runs it: the worker pods it makes, and the images it allows."""
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options
    from elastream.control.backends.worker_objects import worker_pod
    from elastream.core.images import image_allowed
    from elastream.crd import load_manifest

    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    demo = load_manifest(os.path.join(REPO, "examples", "demo.yaml"))
    for scenario, policy, secrets, allowed in (
        ("default", "IfNotPresent", None, ()),
        (
            "worker-images",
            "Always",
            [{"name": "regcred"}, {"name": "mirror"}],
            ("registry.example.com/streams/", "ghcr.io/acme/worker"),
        ),
    ):
        operator = container(render(scenario))
        options = operator_options(build_parser().parse_args(operator["command"][1:] + operator["args"]))
        assert options.allowed_images == allowed
        pod = worker_pod(demo, "node-0", {"name": "demo", "uid": "u"}, options.worker)
        assert pod["spec"]["containers"][0]["imagePullPolicy"] == policy
        assert pod["spec"].get("imagePullSecrets") == secrets
    assert image_allowed("ghcr.io/acme/worker:1.2", allowed) and not image_allowed("ghcr.io/acme/evil:1", allowed)


def test_the_charts_default_placement_is_the_operators() -> None:
    """worker.placement's defaults are the operator's own (`PlacementPolicy()`): an operator run without the chart
    allows what the chart's does, and both read the same shape."""
    from elastream.control.backends.worker_objects import PlacementPolicy

    assert load_values()["worker"]["placement"] == PlacementPolicy().to_values()
    jsonschema.validate(
        PlacementPolicy().to_values(), load_values_schema()["properties"]["worker"]["properties"]["placement"]
    )


def test_placement_settings_reach_the_operator_and_refuse_the_control_plane(helm: str, monkeypatch) -> None:
    """worker.placement, read through the operator's own command line and environment as the rendered Deployment
    runs it: the policy it enforces on every worker pod."""
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options
    from elastream.control.backends.worker_objects import (
        AllowedToleration,
        PlacementPolicy,
        PlacementRefused,
        worker_pod,
    )
    from elastream.crd import check_manifest, load_manifest

    values = [
        "worker.placement.allowedTolerations[0].key=dedicated",
        "worker.placement.allowedTolerations[0].value=streams",
        "worker.placement.allowedTolerations[0].effect=NoSchedule",
        "worker.placement.allowedNodeSelectorKeys={topology.kubernetes.io/zone,pool.example.com/*}",
        "worker.placement.allowAffinity=false",
    ]
    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    with open(os.path.join(REPO, "examples", "demo.yaml"), encoding="utf-8") as handle:
        demo = yaml.safe_load(handle)
    for scenario, expected in (
        ([], PlacementPolicy()),
        (
            values,
            PlacementPolicy(
                (AllowedToleration("dedicated", "streams", "NoSchedule"),),
                ("topology.kubernetes.io/zone", "pool.example.com/*"),
                False,
            ),
        ),
    ):
        proc = run_helm(helm, "template", RELEASE, CHART, "--namespace", NAMESPACE, *set_args(scenario))
        operator = container(tuple(d for d in yaml.safe_load_all(proc.stdout) if d))
        assert operator["args"] == [a for a in operator["args"] if "placement" not in a]  # the environment's
        monkeypatch.setenv("ELASTREAM_WORKER_PLACEMENT", env_of(operator)["ELASTREAM_WORKER_PLACEMENT"])
        options = operator_options(build_parser().parse_args(operator["command"][1:] + operator["args"]))
        assert options.worker.placement == expected
        settings = options.worker
        zoned = {**demo, "spec": {**demo["spec"], "placement": {"nodeSelector": {"topology.kubernetes.io/zone": "z"}}}}
        assert worker_pod(check_manifest(zoned), "node-0", {"name": "demo", "uid": "u"}, settings)["spec"][
            "nodeSelector"
        ]
        control_plane = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
        hostile = {**demo, "spec": {**demo["spec"], "placement": {"tolerations": [control_plane]}}}
        with pytest.raises(PlacementRefused, match="control plane"):
            worker_pod(check_manifest(hostile), "node-0", {"name": "demo", "uid": "u"}, settings)
    assert load_manifest(os.path.join(REPO, "examples", "demo.yaml")).spec.get("placement") is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["worker.placement.allowedTolerations[0].effect=Sometimes"], "/worker/placement/allowedTolerations/0"),
        (["worker.placement.allowedTolerations[0].value=x"], "/worker/placement/allowedTolerations/0"),  # no key
        (["worker.placement.allowedTolerations[0].key=a b"], "/worker/placement/allowedTolerations/0/key"),
        (["worker.placement.allowedNodeSelectorKeys={a b}"], "/worker/placement/allowedNodeSelectorKeys/0"),
        (["worker.placement.allowAffinity=maybe"], "/worker/placement/allowAffinity"),
        (["worker.placement.allowedTaints={x}"], "allowedTaints"),
    ],
)
def test_the_values_schema_rejects_a_wrong_placement(helm: str, values: list[str], message: str) -> None:
    proc = run_helm(helm, "template", RELEASE, CHART, *set_args(values), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr and message in proc.stderr, proc.stderr


def test_the_charts_default_pod_template_policy_is_the_operators() -> None:
    """worker.podTemplate's defaults are the operator's own (`PodTemplatePolicy()`), in the same shape."""
    from elastream.control.backends.worker_objects import NEVER_VOLUME_TYPES, VOLUME_TYPES, PodTemplatePolicy

    assert load_values()["worker"]["podTemplate"] == PodTemplatePolicy().to_values()
    schema = load_values_schema()["properties"]["worker"]["properties"]["podTemplate"]
    jsonschema.validate(PodTemplatePolicy().to_values(), schema)
    # the chart offers every volume type the operator knows, but the two it never allows
    assert schema["properties"]["allowedVolumeTypes"]["items"]["enum"] == [
        t for t in VOLUME_TYPES if t not in NEVER_VOLUME_TYPES
    ]


def test_pod_template_settings_reach_the_operator_and_refuse_hostpath(helm: str, monkeypatch) -> None:
    """worker.podTemplate, read through the operator's environment as the rendered Deployment sets it: the policy
    it enforces on every worker pod."""
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options
    from elastream.control.backends.worker_objects import PodTemplatePolicy, PodTemplateRefused, worker_pod
    from elastream.core.topology import parse_manifest
    from elastream.crd import check_manifest

    values = [
        "worker.podTemplate.allowedVolumeTypes={secret,persistentVolumeClaim}",
        "worker.podTemplate.allowedMountPaths={/var/lib/app/*}",
        "worker.podTemplate.allowedServiceAccounts={streams-*}",
        "worker.podTemplate.allowedPriorityClasses={streaming}",
        "worker.podTemplate.allowedLabelKeys={team}",
        "worker.podTemplate.allowedAnnotationKeys=null",
    ]
    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    with open(os.path.join(REPO, "examples", "demo.yaml"), encoding="utf-8") as handle:
        demo = yaml.safe_load(handle)
    claimed = {
        "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": "state"}}],
        "volumeMounts": [{"name": "state", "mountPath": "/var/lib/app/state"}],
        "serviceAccountName": "streams-reader",
        "labels": {"team": "payments"},
    }
    for scenario, expected, allowed in (
        ([], PodTemplatePolicy(), False),
        (
            values,
            PodTemplatePolicy(
                ("secret", "persistentVolumeClaim"), ("/var/lib/app/*",), ("streams-*",), ("streaming",), ("team",)
            ),
            True,
        ),
    ):
        proc = run_helm(helm, "template", RELEASE, CHART, "--namespace", NAMESPACE, *set_args(scenario))
        operator = container(tuple(d for d in yaml.safe_load_all(proc.stdout) if d))
        monkeypatch.setenv("ELASTREAM_WORKER_POD_TEMPLATE", env_of(operator)["ELASTREAM_WORKER_POD_TEMPLATE"])
        options = operator_options(build_parser().parse_args(operator["command"][1:] + operator["args"]))
        assert options.worker.pod_template == expected
        settings = options.worker
        with_claim = check_manifest({**demo, "spec": {**demo["spec"], "podTemplate": claimed}})
        if allowed:
            made = worker_pod(with_claim, "node-0", {"name": "demo", "uid": "u"}, settings)
            assert made["spec"]["serviceAccountName"] == "streams-reader"
        else:
            with pytest.raises(PodTemplateRefused, match="persistentVolumeClaim: not a volume type"):
                worker_pod(with_claim, "node-0", {"name": "demo", "uid": "u"}, settings)
        host = {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}
        hostile = parse_manifest({**demo, "spec": {**demo["spec"], "podTemplate": host}})
        with pytest.raises(PodTemplateRefused, match="hostPath: never allowed"):
            worker_pod(hostile, "node-0", {"name": "demo", "uid": "u"}, settings)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["worker.podTemplate.allowedVolumeTypes={hostPath}"], "/worker/podTemplate/allowedVolumeTypes/0"),
        (["worker.podTemplate.allowedVolumeTypes={gitRepo}"], "/worker/podTemplate/allowedVolumeTypes/0"),
        (["worker.podTemplate.allowedMountPaths={/*}"], "/worker/podTemplate/allowedMountPaths/0"),
        (["worker.podTemplate.allowedMountPaths={mnt}"], "/worker/podTemplate/allowedMountPaths/0"),
        (["worker.podTemplate.allowedServiceAccounts={a b}"], "/worker/podTemplate/allowedServiceAccounts/0"),
        (["worker.podTemplate.allowHostPath=true"], "allowHostPath"),
    ],
)
def test_the_values_schema_rejects_a_wrong_pod_template_policy(helm: str, values: list[str], message: str) -> None:
    proc = run_helm(helm, "template", RELEASE, CHART, *set_args(values), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr and message in proc.stderr, proc.stderr


NETWORK_POLICY_RULE = ("networking.k8s.io", "networkpolicies")


def test_without_network_policies_there_are_none_nor_their_rule(render: Any) -> None:
    docs = render("no-network-policy")
    assert objects(docs, "NetworkPolicy") == []
    assert "--network-policies" not in container(docs)["args"]
    rules = rules_of(one(docs, "ClusterRole", FULLNAME))
    assert NETWORK_POLICY_RULE not in rules
    assert rules == {k: v for k, v in {**NAMESPACED_RULES, **CRD_RULES}.items() if k != NETWORK_POLICY_RULE}


DISRUPTION_BUDGET_RULE = ("policy", "poddisruptionbudgets")


def test_drain_settings_reach_the_worker_pods_and_without_budgets_there_is_no_rule(render: Any, monkeypatch) -> None:
    """worker.terminationGracePeriodSeconds, worker.drains and worker.podDisruptionBudget, read through the
    operator's own command line as the rendered Deployment runs it: the worker pods' grace period and the drain
    grace their workers get, whether the operator keeps budgets, and the RBAC rule for them."""
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options
    from elastream.control.backends.worker_objects import worker_pod
    from elastream.crd import load_manifest

    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    demo = load_manifest(os.path.join(REPO, "examples", "demo.yaml"))
    for scenario, grace, drain_env, budgets in (("default", 30, "30", True), ("no-drains", 12, "0", False)):
        docs = render(scenario)
        options = operator_options(build_parser().parse_args(container(docs)["command"][1:] + container(docs)["args"]))
        assert options.worker.disruption_budget is budgets
        pod = worker_pod(demo, "node-0", {"name": "demo", "uid": "u"}, options.worker)
        assert pod["spec"]["terminationGracePeriodSeconds"] == grace
        assert env_of(pod["spec"]["containers"][0])["ELASTREAM_DRAIN_GRACE_S"] == drain_env
        assert (DISRUPTION_BUDGET_RULE in rules_of(one(docs, "ClusterRole", FULLNAME))) is budgets


def test_the_operator_accepts_only_the_metrics_scrape(render: Any) -> None:
    policy = one(render("default"), "NetworkPolicy", FULLNAME)
    deployment = one(render("default"), "Deployment", FULLNAME)
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [PROMETHEUS], "ports": [{"protocol": "TCP", "port": 8080}]}]
    assert {p["containerPort"] for p in container(render("default"))["ports"]} == {8080, 8081}  # 8081: kubelet


def test_a_remote_spark_masters_executors_reach_the_driver(helm: str) -> None:
    spark = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "spark"}}}
    proc = run_helm(
        helm, "template", RELEASE, CHART, "--namespace", NAMESPACE,
        *set_args(["spark.master=spark://master:7077", "networkPolicy.sparkFrom[0].namespaceSelector.matchLabels"
                   ".kubernetes\\.io/metadata\\.name=spark"]),
    )  # fmt: skip
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    metrics, executors = one(docs, "NetworkPolicy", FULLNAME)["spec"]["ingress"]
    assert metrics["from"] == [PROMETHEUS] and executors == {"from": [spark]}  # any port: Spark picks them


def test_redis_accepts_only_the_operator_and_worker_pods(render: Any) -> None:
    from elastream.control.backends.worker_objects import labels_for
    from elastream.crd import load_manifest

    worker_labels = labels_for(load_manifest(os.path.join(REPO, "examples", "demo.yaml")), "node-0")
    for scenario, namespaces in (
        ("default", {}),
        ("watch-namespace", {"matchLabels": {"kubernetes.io/metadata.name": "streams"}}),
    ):
        docs = render(scenario)
        policy = one(docs, "NetworkPolicy", REDIS)
        statefulset, _, _ = redis_pod(docs)
        assert policy["spec"]["podSelector"] == statefulset["spec"]["selector"]
        [rule] = policy["spec"]["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
        operator, workers = rule["from"]
        assert operator == {"podSelector": one(docs, "Deployment", FULLNAME)["spec"]["selector"]}
        assert workers["namespaceSelector"] == namespaces
        # the selector matches the pods the operator makes, of any topology
        assert workers["podSelector"]["matchLabels"].items() <= worker_labels.items()
        assert "app.kubernetes.io/instance" not in workers["podSelector"]["matchLabels"]
    assert [p["metadata"]["name"] for p in objects(render("external-url"), "NetworkPolicy")] == [FULLNAME]


def test_the_scraper_reaches_the_per_topology_policies(render: Any, monkeypatch) -> None:
    """networkPolicy.metricsFrom, read through the operator's own command line, is what each topology's
    NetworkPolicy lets reach the workers' metrics port."""
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options
    from elastream.control.backends.worker_objects import worker_network_policy
    from elastream.crd import load_manifest

    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    demo = load_manifest(os.path.join(REPO, "examples", "demo.yaml"))
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    for scenario, scraper in (("default", PROMETHEUS), ("metrics-from-monitoring", monitoring)):
        docs = render(scenario)
        operator = container(docs)
        options = operator_options(build_parser().parse_args(operator["command"][1:] + operator["args"]))
        assert options.worker.network_policy
        policy = worker_network_policy(demo, {"name": "demo", "uid": "u"}, options.worker)
        assert policy["spec"]["ingress"][1] == {"from": [scraper], "ports": [{"protocol": "TCP", "port": 9100}]}
        assert one(docs, "NetworkPolicy", FULLNAME)["spec"]["ingress"][0]["from"] == [scraper]


def labels_are_standard(obj: Mapping[str, Any]) -> None:
    labels = obj["metadata"]["labels"]
    for key in ("name", "instance", "version", "managed-by", "component"):
        assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], obj["metadata"]["name"], key)


def test_every_object_carries_the_standard_labels(render: Any) -> None:
    for scenario in ("default", "replicas-2-watch-namespace"):
        for obj in render(scenario):
            if obj["kind"] != "CustomResourceDefinition":
                labels_are_standard(obj)


def decoded(secret: Mapping[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def redis_pod(docs: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The bundled Redis' StatefulSet, its pod spec and its one container."""
    statefulset = one(docs, "StatefulSet", REDIS)
    pod = statefulset["spec"]["template"]["spec"]
    [redis] = pod["containers"]
    return statefulset, pod, redis


def option(command: list[str], name: str) -> str:
    """The value after `--name` on a redis-server command line (given once)."""
    assert command.count(f"--{name}") == 1, command
    return command[command.index(f"--{name}") + 1]


def test_the_bundled_redis(render: Any) -> None:
    docs = render("default")
    data = decoded(one(docs, "Secret", REDIS))
    password = data["password"]
    assert re.fullmatch(r"[A-Za-z0-9]{24}", password)
    ca = "/etc/elastream/redis-tls/ca.crt"
    assert data["url"] == f"rediss://:{password}@{REDIS}.{NAMESPACE}.svc:6379/0?ssl_ca_certs={ca}"
    service = one(docs, "Service", REDIS)
    assert service["spec"]["type"] == "ClusterIP" and "clusterIP" not in service["spec"]
    assert service["spec"]["ports"][0]["port"] == 6379
    statefulset, pod, redis = redis_pod(docs)
    assert statefulset["spec"]["replicas"] == 1
    assert redis["image"] == "redis:7-bookworm"
    assert pod["securityContext"]["runAsNonRoot"] is True and redis["securityContext"]["runAsNonRoot"] is True
    assert redis["securityContext"]["allowPrivilegeEscalation"] is False
    assert service["spec"]["selector"] == statefulset["spec"]["selector"]["matchLabels"]


def test_the_bundled_redis_reads_its_password_from_a_file_of_the_secret(render: Any) -> None:
    """Not on the command line (`ps`), not in the environment (/proc/PID/environ), not in the pod spec: redis-server
    includes a configuration file the Secret holds, mounted read-only for the redis group only."""
    for scenario in ("default", "no-persistence", "listen-on-pod-ip"):
        docs = render(scenario)
        data = decoded(one(docs, "Secret", REDIS))
        password = data["password"]
        assert data["redis-auth.conf"] == f"requirepass {password}\n"
        _, pod, redis = redis_pod(docs)
        command = redis["command"]
        assert command[0] == "redis-server" and "args" not in redis
        assert "--requirepass" not in command and not any(password in arg for arg in command)
        assert not any("PASSWORD" in e["name"] or "secretKeyRef" in (e.get("valueFrom") or {}) for e in redis["env"])
        assert "envFrom" not in redis
        assert password not in json.dumps(pod)
        mounts = {m["mountPath"]: m for m in redis["volumeMounts"]}
        include = option(command, "include")
        mount = mounts[os.path.dirname(include)]
        assert mount["readOnly"] is True
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"] == {
            "secretName": REDIS,
            "items": [
                {"key": "redis-auth.conf", "path": os.path.basename(include)},
                {"key": "password", "path": "password"},  # for `kubectl exec ... redis-cli` (REDISCLI_AUTH)
            ],
            "defaultMode": 0o440,
        }
        assert pod["securityContext"]["fsGroup"] == redis["securityContext"]["runAsUser"] == 999


def test_the_bundled_redis_persists_by_default(render: Any) -> None:
    """A volumeClaimTemplate (the cluster's default StorageClass, 1Gi, ReadWriteOnce) mounted where Redis keeps its
    append-only file, fsynced every second."""
    statefulset, pod, redis = redis_pod(render("default"))
    command = redis["command"]
    assert option(command, "appendonly") == "yes"
    assert option(command, "appendfsync") == "everysec"
    assert option(command, "tls-port") == "6379"
    data_dir = option(command, "dir")
    [mount] = [m for m in redis["volumeMounts"] if m["mountPath"] == data_dir]
    assert not mount.get("readOnly")
    [claim] = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == mount["name"] == "data"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    assert "storageClassName" not in claim["spec"]  # the cluster's default StorageClass
    assert "data" not in {v["name"] for v in pod["volumes"]}
    # the claim outlives the pod (and, by default, the StatefulSet and the release)
    assert "persistentVolumeClaimRetentionPolicy" not in statefulset["spec"]


def test_redis_persistence_settings(render: Any) -> None:
    statefulset, _, redis = redis_pod(render("persistence"))
    [claim] = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["accessModes"] == ["ReadWriteOncePod"]
    assert option(redis["command"], "appendfsync") == "always"
    # "-": no class at all (only a PersistentVolume without a class binds), as charts spell it
    [claim] = one(render("persistence-no-class"), "StatefulSet", REDIS)["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == ""


def test_redis_without_persistence_uses_an_empty_dir(render: Any) -> None:
    statefulset, pod, redis = redis_pod(render("no-persistence"))
    assert "volumeClaimTemplates" not in statefulset["spec"]
    data_dir = option(redis["command"], "dir")
    [mount] = [m for m in redis["volumeMounts"] if m["mountPath"] == data_dir]
    assert [v for v in pod["volumes"] if v["name"] == mount["name"]] == [{"name": "data", "emptyDir": {}}]
    assert option(redis["command"], "appendonly") == "yes"  # still survives a container restart


def test_an_external_redis_url_goes_into_a_secret(render: Any) -> None:
    docs = render("external-url")
    assert objects(docs, "StatefulSet") == [] and [s["metadata"]["name"] for s in objects(docs, "Service")] == [
        f"{FULLNAME}-metrics"
    ]
    assert decoded(one(docs, "Secret", REDIS)) == {"url": "redis://:s3cret@redis.example:6379/1"}
    assert env_of(container(docs))["ELASTREAM_REDIS_URL"] == {"secretKeyRef": {"name": REDIS, "key": "url"}}


def test_topology_users_can_be_turned_off_for_a_redis_that_forbids_acl_commands(render: Any) -> None:
    args = container(render("no-topology-users"))["args"]
    assert args[args.index("--redis-topology-users") + 1] == "off"


def test_an_existing_secret_is_used_as_it_is(render: Any) -> None:
    docs = render("external-secret")
    assert objects(docs, "Secret") == [] and objects(docs, "StatefulSet") == []
    assert env_of(container(docs))["ELASTREAM_REDIS_URL"] == {"secretKeyRef": {"name": "my-redis", "key": "uri"}}


def test_no_kopf_peering_is_left(render: Any) -> None:
    """Leader election replaced kopf peering: no peering objects, CRDs, rules or arguments in any scenario."""
    for scenario in SCENARIOS:
        docs = render(scenario)
        assert not [d for d in docs if "kopf" in json.dumps(d).lower()], scenario
        if objects(docs, "Deployment"):
            assert "--peering" not in container(docs)["args"]


def test_one_replica_takes_the_lease_and_rolls(render: Any) -> None:
    docs = render("default")
    deployment = one(docs, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 1
    # only the Lease holder works: the new pod may start beside the old one
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    args = container(docs)["args"]
    assert args[args.index("--leader-elect") :][: len(ELECTION_ARGS)] == ELECTION_ARGS
    assert "--standalone" not in args  # kopf's standalone mode is the operator's only mode now
    env = env_of(container(docs))
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert_leader_election_rbac(docs)
    # the Lease is the operator's to create: the chart need not ship one
    assert objects(docs, "Lease") == []


def test_two_replicas_elect_a_leader(render: Any) -> None:
    docs = render("replicas-2")
    deployment = one(docs, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert container(docs)["args"] == [
        "--all-namespaces", *ELECTION_ARGS, "--engine", "spark", *TIMEOUT_ARGS,
    ]  # fmt: skip
    assert_leader_election_rbac(docs)


def test_leader_election_timing_reaches_the_operator(render: Any) -> None:
    args = container(render("leader-election-timing"))["args"]
    assert option(args, "leader-elect-lease-duration") == "30"
    assert option(args, "leader-elect-renew-deadline") == "20"
    assert option(args, "leader-elect-retry-period") == "5"


def test_without_leader_election_one_operator_is_recreated(render: Any) -> None:
    docs = render("no-leader-election")
    deployment = one(docs, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two operators side by side
    args = container(docs)["args"]
    assert args == ["--all-namespaces", "--engine", "spark", *TIMEOUT_ARGS]
    assert objects(docs, "Role") == [] and objects(docs, "RoleBinding") == []


def test_one_watched_namespace(render: Any) -> None:
    docs = render("replicas-2-watch-namespace")
    assert container(docs)["args"] == [
        "--namespace", "streams", *ELECTION_ARGS, "--engine", "spark", *TIMEOUT_ARGS,
    ]  # fmt: skip
    assert container(render("watch-namespace"))["args"] == [
        "--namespace", "streams", *ELECTION_ARGS, "--engine", "spark", *TIMEOUT_ARGS,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# the Kubernetes schemas


def kubernetes_version(validate_module: Any) -> str:
    schemas = os.path.join(os.path.dirname(validate_module.__file__), "kubernetes-json-schema")
    bundled = {name.split("-")[0].lstrip("v") for name in os.listdir(schemas)}
    return KUBERNETES_VERSION if KUBERNETES_VERSION in bundled else str(validate_module.latest_version())


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_objects_pass_the_kubernetes_schemas(render: Any, scenario: str) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install -e 'operator[dev]'", pytrace=False)
    version = kubernetes_version(kubernetes_validate)
    checked = set()
    for obj in render(scenario):
        if obj["apiVersion"].startswith("cert-manager.io/"):
            continue  # cert-manager's own CRDs: no schema here (the redis-tls tests check their fields)
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.message} at {list(exc.path)}")
        checked.add(obj["kind"])
    assert {"Deployment", "ClusterRole", "CustomResourceDefinition", "ServiceAccount", "Service"} <= checked


def redis_tls(docs: tuple[dict[str, Any], ...]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """The bundled Redis' command line, its `tls` volume and the operator's `redis-ca` volume."""
    _, pod, redis = redis_pod(docs)
    [tls] = [v for v in pod["volumes"] if v["name"] == "tls"]
    operator = one(docs, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    [ca] = [v for v in operator["volumes"] if v["name"] == "redis-ca"]
    return redis["command"], tls, ca


def tls_secrets(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [d for d in objects(docs, "Secret") if d["type"] == "kubernetes.io/tls"]


def openssl(*args: str, stdin: str = "") -> str:
    proc = subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_bundled_redis_speaks_tls_only_with_a_generated_certificate_for_its_service(
    render: Any, tmp_path: Any
) -> None:
    docs = render("default")
    command, tls, ca_volume = redis_tls(docs)
    assert option(command, "port") == "0"  # no plain listener at all
    assert option(command, "tls-port") == "6379" and option(command, "tls-auth-clients") == "no"
    secret = one(docs, "Secret", f"{REDIS}-tls")
    assert secret["type"] == "kubernetes.io/tls" and tls["secret"]["secretName"] == f"{REDIS}-tls"
    files = {item["path"] for item in tls["secret"]["items"]}
    for name in ("tls-cert-file", "tls-key-file", "tls-ca-cert-file"):
        assert os.path.basename(option(command, name)) in files
    # the operator gets the CA, never the server's key
    assert ca_volume["secret"] == {"secretName": f"{REDIS}-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    data = decoded(secret)
    (tmp_path / "ca.crt").write_text(data["ca.crt"])
    (tmp_path / "tls.crt").write_text(data["tls.crt"])
    assert "tls.crt: OK" in openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt"))
    names = openssl("x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt"))
    for name in (REDIS, f"{REDIS}.{NAMESPACE}.svc", f"{REDIS}.{NAMESPACE}.svc.cluster.local", "localhost"):
        assert f"DNS:{name}," in names + ","
    assert "PRIVATE KEY" in data["tls.key"] and "PRIVATE KEY" not in data["ca.crt"]


def test_redis_tls_off_is_plain_tcp_with_nothing_mounted(render: Any) -> None:
    docs = render("no-redis-tls")
    _, pod, redis = redis_pod(docs)
    assert option(redis["command"], "port") == "6379" and "--tls-port" not in redis["command"]
    assert "tls" not in {v["name"] for v in pod["volumes"]}
    assert not objects(docs, "Certificate") and not tls_secrets(docs)
    assert decoded(one(docs, "Secret", REDIS))["url"].startswith("redis://")
    operator = one(docs, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert "redis-ca" not in {v["name"] for v in operator["volumes"]}


def test_cert_manager_issues_the_redis_certificate_with_a_chart_made_ca_or_the_given_issuer(render: Any) -> None:
    docs = render("redis-tls-cert-manager")
    assert not tls_secrets(docs)  # cert-manager writes it
    certificate = one(docs, "Certificate", f"{REDIS}-tls")
    assert certificate["apiVersion"] == "cert-manager.io/v1" and certificate["spec"]["secretName"] == f"{REDIS}-tls"
    assert f"{REDIS}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"] == {"name": f"{REDIS}-tls-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert one(docs, "Certificate", f"{REDIS}-tls-ca")["spec"]["isCA"] is True
    assert one(docs, "Issuer", f"{REDIS}-tls-ca")["spec"]["ca"]["secretName"] == f"{REDIS}-tls-ca"
    assert "selfSigned" in one(docs, "Issuer", f"{REDIS}-tls-selfsigned")["spec"]
    command, tls, _ = redis_tls(docs)
    assert tls["secret"]["secretName"] == f"{REDIS}-tls" and option(command, "port") == "0"
    docs = render("redis-tls-cert-manager-issuer")
    certificate = one(docs, "Certificate", f"{REDIS}-tls")
    assert certificate["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert not objects(docs, "Issuer") and len(objects(docs, "Certificate")) == 1


def test_a_tls_secret_of_ones_own_is_used_as_it_is(render: Any) -> None:
    docs = render("redis-tls-existing-secret")
    assert not objects(docs, "Certificate") and not tls_secrets(docs)
    _, tls, ca = redis_tls(docs)
    assert tls["secret"]["secretName"] == ca["secret"]["secretName"] == "my-redis-tls"


def test_an_external_redis_with_a_private_ca_gets_it_mounted_in_the_operator(render: Any) -> None:
    docs = render("external-url-private-ca")
    operator = one(docs, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    [ca] = [v for v in operator["volumes"] if v["name"] == "redis-ca"]
    assert ca["secret"] == {"secretName": "corp-ca", "items": [{"key": "root.pem", "path": "ca.crt"}]}
    [container] = operator["containers"]
    assert {"name": "redis-ca", "mountPath": "/etc/elastream/redis-tls", "readOnly": True} in container["volumeMounts"]


# ---------------------------------------------------------------------------------------------------------
# the bundled Redis cannot be held by a tenant nor filled until it dies (issue 38)


def liveness_script(redis: Mapping[str, Any]) -> str:
    """The shell script of the Redis container's exec liveness probe."""
    probe = redis["livenessProbe"]
    assert "tcpSocket" not in probe and "httpGet" not in probe, probe
    command = probe["exec"]["command"]
    assert command[:2] == ["sh", "-c"] and len(command) == 3, command
    return str(command[2])


def run_probe(script: str, tmp_path: Any, reply: str) -> tuple[int, list[str], str]:
    """Run the probe's `script` with a stand-in `redis-cli` on PATH that prints `reply` (and exits 0, as the
    real one does for an error reply) and records its arguments and REDISCLI_AUTH; the password file is a
    temporary one. Returns (exit code, the stand-in's arguments, the password it was given)."""
    import shlex

    bin_dir, password = tmp_path / "bin", tmp_path / "password"
    bin_dir.mkdir(exist_ok=True)
    password.write_text("pw-from-the-file")
    cli = bin_dir / "redis-cli"
    cli.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {tmp_path}/args\n'
        f'printf "%s" "$REDISCLI_AUTH" > {tmp_path}/auth\n'
        f"printf '%s\\n' {shlex.quote(reply)}\n"
    )
    cli.chmod(0o755)
    script = script.replace("/etc/redis-auth/password", str(password))
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "POD_IP": "10.1.2.3"}
    proc = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    args = (tmp_path / "args").read_text().split("\n")[:-1]
    return proc.returncode, args, (tmp_path / "auth").read_text()


@pytest.mark.parametrize(
    ("reply", "alive"),
    [
        ("PONG", True),
        ("LOADING Redis is loading the dataset in memory", True),  # reading its append-only file after a restart
        ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", False),
        ("NOAUTH Authentication required.", False),
        ("Could not connect to Redis at localhost:6379: Connection refused", False),
        ("", False),
    ],
)
def test_the_bundled_redis_liveness_probe_is_a_ping_that_fails_on_busy(
    render: Any, tmp_path: Any, reply: str, alive: bool
) -> None:
    """A TCP check passes while a script holds Redis (every client gets BUSY): the probe PINGs, with the
    password from the Secret's file and over TLS with the CA, and only PONG (or LOADING) keeps the container."""
    redis = redis_pod(render("default"))[2]
    code, args, auth = run_probe(liveness_script(redis), tmp_path, reply)
    assert (code == 0) is alive, (reply, code)
    assert auth == "pw-from-the-file"  # REDISCLI_AUTH: not on the command line, not in the pod spec
    assert args[-1] == "ping" and args[args.index("-h") + 1] == "localhost" and args[args.index("-p") + 1] == "6379"
    assert "--tls" in args and args[args.index("--cacert") + 1] == "/etc/redis-tls/ca.crt"
    mounts = {m["mountPath"] for m in redis["volumeMounts"]}
    assert {"/etc/redis-auth", "/etc/redis-tls"} <= mounts  # the files it reads are there
    probe = redis["livenessProbe"]
    assert probe["timeoutSeconds"] <= probe["periodSeconds"] and probe["failureThreshold"] >= 2
    assert probe["initialDelaySeconds"] >= 10


def test_the_liveness_probe_follows_tls_and_the_listening_address(render: Any, tmp_path: Any) -> None:
    _, _, redis = redis_pod(render("no-redis-tls"))
    code, args, _ = run_probe(liveness_script(redis), tmp_path, "PONG")
    assert code == 0 and "--tls" not in args and "--cacert" not in args
    _, _, redis = redis_pod(render("listen-on-pod-ip"))  # Redis binds the pod IP only: localhost would be refused
    code, args, _ = run_probe(liveness_script(redis), tmp_path, "PONG")
    assert code == 0 and args[args.index("-h") + 1] == "10.1.2.3"
    for scenario in ("default", "no-persistence", "listen-on-pod-ip", "no-redis-tls"):
        script = liveness_script(redis_pod(render(scenario))[2])
        assert subprocess.run(["sh", "-n", "-c", script], timeout=30).returncode == 0, script  # valid shell
        _, _, redis = redis_pod(render(scenario))
        assert redis["readinessProbe"] == {"tcpSocket": {"port": "redis"}, "periodSeconds": 5}


def test_the_bundled_redis_gets_three_quarters_of_its_memory_limit_and_refuses_writes_past_it(render: Any) -> None:
    """Without maxmemory one tenant fills Redis until its memory limit OOM-kills it (and an append-only file
    that no longer fits makes it crash-loop): 75 % of the limit, and noeviction (evicting would drop checkpoints)."""
    for scenario in ("default", "no-persistence", "no-redis-tls", "listen-on-pod-ip"):
        command = redis_pod(render(scenario))[2]["command"]
        assert option(command, "maxmemory") == str(1024**3 * 3 // 4)  # of the default 1Gi
        assert option(command, "maxmemory-policy") == "noeviction"


@pytest.mark.parametrize(
    ("values", "maxmemory"),
    [
        (["redis.resources.limits.memory=2Gi"], str(2 * 1024**3 * 3 // 4)),
        (["redis.resources.limits.memory=1.5Gi"], str(int(1.5 * 1024**3 * 0.75))),
        (["redis.resources.limits.memory=4G"], "3000000000"),
        (["redis.resources.limits.memory=512Mi"], str(512 * 1024**2 * 3 // 4)),
        (["redis.resources.limits.memory=1000000000"], "750000000"),
        (["redis.maxmemory=2gb"], "2gb"),
        (["redis.maxmemory=805306368"], "805306368"),
        (["redis.maxmemory=0"], "0"),  # no limit, as asked
        (["redis.resources.limits=null"], None),  # no limit to take it from
    ],
)
def test_redis_maxmemory_follows_the_limit_or_the_value(helm: str, values: list[str], maxmemory: str | None) -> None:
    proc = run_helm(helm, "template", RELEASE, CHART, "--namespace", NAMESPACE, *set_args(values))
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    command = redis_pod(docs)[2]["command"]
    if maxmemory is None:
        assert "--maxmemory" not in command
    else:
        assert option(command, "maxmemory") == maxmemory
    assert option(command, "maxmemory-policy") == "noeviction"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["redis.maxmemory=lots"], "/redis/maxmemory"),
        (["redis.maxmemory=-1"], "/redis/maxmemory"),
        (["redis.maxmemoryPolicy=allkeys-lru"], "maxmemoryPolicy"),  # no evicting policy to choose
        (["redis.resources.limits.memory=1e9"], "set redis.maxmemory"),  # a limit the chart cannot read
    ],
)
def test_a_maxmemory_that_cannot_work_fails_the_render(helm: str, values: list[str], message: str) -> None:
    proc = run_helm(helm, "template", RELEASE, CHART, *set_args(values), check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_durable_commits_reach_the_operator_and_a_bad_value_stops_it_in_one_line(helm: str, monkeypatch) -> None:
    """redis.durableCommits becomes the operator's ELASTREAM_DURABLE_COMMITS settings, read as the controllers read
    them; an unreadable value stops `elastream operator` at start with one line naming the variable."""
    from elastream.cli import CommandError, build_parser
    from elastream.cli.operator import operator_options
    from elastream.store.checkpoint_store import DurableCommits

    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    for scenario, expected in (
        ([], DurableCommits(False, 0, 1000)),
        (
            [
                "redis.durableCommits.enabled=true",
                "redis.durableCommits.replicas=1",
                "redis.durableCommits.timeoutMs=250",
            ],
            DurableCommits(True, 1, 250),
        ),
    ):
        proc = run_helm(helm, "template", RELEASE, CHART, "--namespace", NAMESPACE, *set_args(scenario))
        env = env_of(container(tuple(d for d in yaml.safe_load_all(proc.stdout) if d)))
        durable = {k: v for k, v in env.items() if k.startswith("ELASTREAM_DURABLE_COMMITS")}
        assert DurableCommits.from_env(durable) == expected
    monkeypatch.setenv("ELASTREAM_DURABLE_COMMITS", "sometimes")
    with pytest.raises(CommandError, match="ELASTREAM_DURABLE_COMMITS='sometimes': use on or off"):
        operator_options(build_parser().parse_args(["operator"]))
    proc = run_helm(
        helm,
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--set",
        "redis.durableCommits.timeoutMs=0",
        check=False,
    )
    assert proc.returncode != 0 and "/redis/durableCommits/timeoutMs" in proc.stderr
