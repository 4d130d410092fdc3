"""A topology's spec.podTemplate and its connectors' Secrets (issue 39, point 4; the chart's worker.podTemplate,
$ELASTREAM_WORKER_POD_TEMPLATE): labels, annotations, env, envFrom, volumes, volumeMounts, serviceAccountName and
priorityClassName reach the worker pods only as far as `PodTemplatePolicy` allows, the operator's own fields win
any conflict, hostPath never passes, and what is refused is refused before a pod exists, naming the field and the
fix and never a value. Every Secret a source or sink names in `secretRef` is mounted read-only at
/etc/elastream/secrets/<name>/, one volume each, where the worker's Kafka client reads it."""

from __future__ import annotations

import copy
import fnmatch
import itertools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kubernetes_backend import backend
from test_reconciler import World, restarted_operator, running

from elastream.control.backends.worker_objects import (
    CODE_ENV,
    HARMLESS_PYTHON_ENV,
    OPERATOR_ENV,
    OPERATOR_LABEL_KEYS,
    OPERATOR_MOUNT_PATHS,
    SECRET_MODE,
    PodTemplatePolicy,
    PodTemplateRefused,
    WorkerPodSettings,
    labels_for,
    merge_pod_template,
    pod_template_problems,
    worker_pod,
)
from elastream.core.ports import BackendError
from elastream.core.topology import TopologyError, parse_manifest
from elastream.crd import check_manifest, openapi_schema
from elastream.worker_inputs.secrets import secret_properties, secrets_dir
from support.manifests import edge, manifest, sink, src

OWNER = {"name": "t", "uid": "u-1"}
#: what a platform team that trusts its tenants with storage and one service account might allow
GENEROUS = PodTemplatePolicy(
    allowed_volume_types=("configMap", "secret", "emptyDir", "projected", "persistentVolumeClaim"),
    allowed_mount_paths=("/mnt/*", "/var/cache/app"),
    allowed_service_accounts=("streams-*",),
    allowed_priority_classes=("streaming",),
    allowed_label_keys=("team", "example.com/*"),
    allowed_annotation_keys=("example.com/*",),
)
#: a template every policy here allows
PLAIN = {
    "labels": {"team": "payments", "example.com/cost-centre": "42"},
    "annotations": {"example.com/owner": "payments@example.com"},
    "env": [
        {"name": "APP_MODE", "value": "fast"},
        {"name": "APP_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "app", "key": "password"}}},
        {"name": "APP_POD", "value": "$(POD_NAME)"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ],
    "envFrom": [{"prefix": "DB_", "secretRef": {"name": "db"}}, {"prefix": "CFG_", "configMapRef": {"name": "c"}}],
    "volumes": [
        {"name": "config", "configMap": {"name": "app-config"}},
        {"name": "certs", "secret": {"secretName": "app-certs", "defaultMode": 0o440}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
    ],
    "volumeMounts": [
        {"name": "config", "mountPath": "/mnt/config", "readOnly": True},
        {"name": "certs", "mountPath": "/mnt/certs/app.pem", "subPath": "tls.crt"},
        {"name": "scratch", "mountPath": "/mnt/scratch"},
    ],
}


def kafka(name: str, secret: str | None = None, kind: str = "source") -> dict[str, Any]:
    block: dict[str, Any] = {"type": "kafka", "topic": f"{name}-topic", "bootstrapServers": "kafka:9092"}
    if secret is not None:
        block["secretRef"] = {"name": secret}
    return {"name": name, "parallelism": 1, kind: block}


def document(template: Any = None, vertices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    vertices = vertices or [src("s"), sink("z")]
    names = [v["name"] for v in vertices]
    doc = manifest(vertices, [edge(a, b) for a, b in itertools.pairwise(names)])
    doc["metadata"]["namespace"] = "team-a"
    if template is not None:
        doc["spec"]["podTemplate"] = template
    return doc


def pod(template: Any = None, policy: PodTemplatePolicy | None = None, **kwargs: Any) -> dict[str, Any]:
    settings_ = WorkerPodSettings(pod_template=policy or PodTemplatePolicy())
    return worker_pod(check_manifest(document(template, **kwargs)), "node-0", OWNER, settings_)


def container(pod_: Mapping[str, Any]) -> dict[str, Any]:
    [only] = pod_["spec"]["containers"]
    return dict(only)


# ------------------------------------------------------------------------------------------ the merge


def test_an_allowed_template_reaches_the_pod_beside_everything_the_operator_gives_it() -> None:
    bare, made = pod(), pod(PLAIN)
    worker = container(made)
    assert made["metadata"]["labels"] == {**PLAIN["labels"], **bare["metadata"]["labels"]}
    assert made["metadata"]["annotations"] == PLAIN["annotations"]
    assert worker["env"] == container(bare)["env"] + PLAIN["env"]  # after the operator's: $(POD_NAME) expands
    assert worker["envFrom"] == PLAIN["envFrom"]
    assert made["spec"]["volumes"] == bare["spec"]["volumes"] + PLAIN["volumes"]
    assert worker["volumeMounts"] == container(bare)["volumeMounts"] + PLAIN["volumeMounts"]
    # everything else is the operator's, as without a template
    for key in ("image", "imagePullPolicy", "args", "ports", "readinessProbe", "securityContext"):
        assert worker.get(key) == container(bare).get(key)
    for key in ("securityContext", "automountServiceAccountToken", "restartPolicy", "terminationGracePeriodSeconds"):
        assert made["spec"][key] == bare["spec"][key]
    assert "serviceAccountName" not in made["spec"] and "priorityClassName" not in made["spec"]


def test_a_service_account_and_a_priority_class_the_policy_allows_reach_the_pod() -> None:
    template = {
        "serviceAccountName": "streams-reader",
        "priorityClassName": "streaming",
        "volumes": [
            {"name": "identity", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "a"}}]}},
            {"name": "state", "persistentVolumeClaim": {"claimName": "state"}},
        ],
        "volumeMounts": [{"name": "identity", "mountPath": "/var/cache/app"}, {"name": "state", "mountPath": "/mnt/s"}],
    }  # fmt: skip
    made = pod(template, GENEROUS)
    assert made["spec"]["serviceAccountName"] == "streams-reader" and made["spec"]["priorityClassName"] == "streaming"
    assert made["spec"]["automountServiceAccountToken"] is False  # the token only where the template projects it
    assert [v["name"] for v in made["spec"]["volumes"]][-2:] == ["identity", "state"]


def test_the_operator_wins_every_conflict_even_in_a_template_no_policy_checked() -> None:
    """`merge_pod_template` only settles conflicts: whatever the template says of the operator's labels,
    annotations, environment, volumes, mount paths, service account, containers, image, resources or security
    context, the operator's stand."""
    base = pod()
    base["spec"]["serviceAccountName"] = "elastream-worker"  # an operator that names its workers' account
    base["metadata"]["annotations"] = {"elastream.dev/schedule-version": "3"}
    hostile = {
        "labels": {"app.kubernetes.io/instance": "someone-else", "elastream.dev/node": "node-9", "team": "a"},
        "annotations": {"elastream.dev/schedule-version": "0", "example.com/x": "y"},
        "env": [
            {"name": "ELASTREAM_REDIS_URL", "value": "redis://evil"},
            {"name": "ELASTREAM_NEW_SETTING", "value": "x"},
            {"name": "POD_IP", "value": "10.0.0.1"},
            {"name": "APP", "value": "1"},
        ],
        "volumes": [{"name": "topology", "emptyDir": {}}, {"name": "mine", "emptyDir": {}}],
        "volumeMounts": [
            {"name": "mine", "mountPath": "/etc/elastream/secrets/x"},
            {"name": "mine", "mountPath": "/tmp"},
            {"name": "mine", "mountPath": "/etc"},
            {"name": "topology", "mountPath": "/mnt/topology"},
            {"name": "mine", "mountPath": "/mnt/mine"},
        ],
        "serviceAccountName": "cluster-admin",
        "containers": [{"name": "sidecar", "image": "evil/miner"}],
        "securityContext": {"runAsUser": 0},
        "image": "evil/miner",
        "resources": {"limits": {"cpu": "64"}},
        "hostNetwork": True,
    }
    before = copy.deepcopy(base)
    merged = merge_pod_template(base, hostile)
    assert base == before  # pure
    assert merged["metadata"]["labels"] == {"team": "a", **base["metadata"]["labels"]}
    assert merged["metadata"]["annotations"] == {"example.com/x": "y", "elastream.dev/schedule-version": "3"}
    env = container(merged)["env"]
    assert env[: len(container(base)["env"])] == container(base)["env"]
    assert [e["name"] for e in env[len(container(base)["env"]) :]] == ["APP"]
    assert [v["name"] for v in merged["spec"]["volumes"]] == ["topology", "tmp", "mine"]
    assert merged["spec"]["volumes"][0] == base["spec"]["volumes"][0]
    assert container(merged)["volumeMounts"][-1] == {"name": "mine", "mountPath": "/mnt/mine"}
    assert len(container(merged)["volumeMounts"]) == len(container(base)["volumeMounts"]) + 1
    assert merged["spec"]["serviceAccountName"] == "elastream-worker"
    assert (
        merged["spec"]["containers"] == [container(merged)] and container(merged)["image"] == container(base)["image"]
    )
    assert merged["spec"]["securityContext"] == base["spec"]["securityContext"] and "hostNetwork" not in merged["spec"]
    assert container(merged).get("resources") == container(base).get("resources")
    # nothing of the template is shared with the pod (a later change of either leaves the other alone)
    container(merged)["env"][-1]["value"] = "changed"
    assert hostile["env"][3]["value"] == "1"


def test_the_operators_labels_are_the_ones_it_reserves() -> None:
    topology = check_manifest(document())
    assert set(labels_for(topology, "node-0")) == set(OPERATOR_LABEL_KEYS)


# ------------------------------------------------------------------------------------------ connectors' Secrets


def test_every_secret_a_connector_names_is_mounted_read_only_where_the_worker_reads_it() -> None:
    made = pod(vertices=[kafka("in", "kafka-creds"), kafka("again", "kafka-creds", "sink")])
    secrets = [v for v in made["spec"]["volumes"] if "secret" in v]
    assert secrets == [
        {"name": "elastream-secret-0", "secret": {"secretName": "kafka-creds", "defaultMode": 0o440, "optional": False}}
    ]  # one volume per distinct Secret
    made = pod(vertices=[kafka("in", "b-creds"), kafka("out", "a.creds", "sink")])
    volumes = {v["name"]: v["secret"] for v in made["spec"]["volumes"] if "secret" in v}
    mounts = {m["name"]: m for m in container(made)["volumeMounts"] if m["name"] in volumes}
    assert sorted(v["secretName"] for v in volumes.values()) == ["a.creds", "b-creds"]
    for name, volume in volumes.items():
        assert volume["defaultMode"] == SECRET_MODE and SECRET_MODE & 0o137 == 0  # 0440 or stricter: nobody writes
        assert volume["optional"] is False
        assert mounts[name] == {
            "name": name,
            "mountPath": f"{secrets_dir({})}/{volume['secretName']}",  # what worker_inputs.secrets reads
            "readOnly": True,
        }
    assert made["spec"]["securityContext"]["fsGroup"] == container(made)["securityContext"]["runAsUser"]


def test_the_mounted_secret_is_what_the_kafka_client_reads(tmp_path: Any) -> None:
    """As the kubelet lays a Secret volume out (a file per key behind ..data links), at the pod's mount path
    under the root the worker reads: the worker finds every key; the operator put none of it anywhere."""
    made = pod(vertices=[kafka("in", "kafka-creds"), sink("z")])
    [mount] = [m for m in container(made)["volumeMounts"] if m["name"].startswith("elastream-secret-")]
    relative = mount["mountPath"].removeprefix(secrets_dir({}) + "/")
    data = tmp_path / relative / "..2026_01_01"
    data.mkdir(parents=True)
    (data / "sasl.password").write_text("hunter2\n")
    (tmp_path / relative / "..data").symlink_to(data.name)
    (tmp_path / relative / "sasl.password").symlink_to("..data/sasl.password")
    assert secret_properties("kafka-creds", {"ELASTREAM_SECRETS_DIR": str(tmp_path)}) == {"sasl.password": "hunter2"}
    assert "hunter2" not in json.dumps(made)


def test_without_secret_refs_or_a_template_the_pod_is_as_before() -> None:
    made = pod()
    assert [v["name"] for v in made["spec"]["volumes"]] == ["topology", "tmp"]
    assert [m["mountPath"] for m in container(made)["volumeMounts"]] == ["/etc/elastream", "/tmp"]
    assert "envFrom" not in container(made) and made["metadata"]["annotations"] == {}


def test_a_secret_ref_naming_an_operators_secret_is_refused() -> None:
    """`<topology>-redis` holds a topology's Redis password and data-plane keys: mounting another topology's (or
    its own) into a pod the tenant controls would hand them over."""
    spec = document(vertices=[kafka("in", "payments-redis"), sink("z")])["spec"]
    assert pod_template_problems(spec, WorkerPodSettings()) == [
        "spec.vertices[0].source.secretRef.name: names the Secret payments-redis; a Secret named <topology>-redis is "
        "the operator's (a topology's Redis password and data-plane keys): name a Secret of your own"
    ]
    with pytest.raises(PodTemplateRefused, match=r"^spec.vertices\[0\].source.secretRef.name"):
        worker_pod(check_manifest(document(vertices=[kafka("in", "payments-redis"), sink("z")])), "n", OWNER,
                   WorkerPodSettings())  # fmt: skip


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ({"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
         "spec.podTemplate.volumes[0].hostPath: never allowed (a node's own files)"),
        ({"volumes": [{"name": "repo", "gitRepo": {"repository": "https://x"}}]},
         "spec.podTemplate.volumes[0].gitRepo: never allowed (a git clone the kubelet runs on the node)"),
        ({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]},
         "spec.podTemplate.volumes[0].persistentVolumeClaim: not a volume type the operator allows "
         "(worker.podTemplate.allowedVolumeTypes: configMap, secret, emptyDir, projected, downwardAPI); remove it, or "
         "have the operator's list extended"),
        ({"volumes": [{"name": "topology", "emptyDir": {}}]},
         "spec.podTemplate.volumes[0].name: topology is the operator's (topology, tmp, elastream-*)"),
        ({"volumes": [{"name": "elastream-secret-0", "emptyDir": {}}]},
         "spec.podTemplate.volumes[0].name: elastream-secret-0 is the operator's"),
        ({"volumes": [{"name": "s", "secret": {"secretName": "other-redis"}}]},
         "spec.podTemplate.volumes[0].secret.secretName: names the Secret other-redis; a Secret named "
         "<topology>-redis is the operator's"),
        ({"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "t-redis"}}]}}]},
         "spec.podTemplate.volumes[0].projected.sources[0].secret.name: names the Secret t-redis"),
        ({"volumes": [{"name": "p", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]},
         "spec.podTemplate.volumes[0].projected.sources[0].serviceAccountToken: worker pods hold no API token of "
         "their own unless spec.podTemplate.serviceAccountName names a ServiceAccount the operator allows"),
        ({"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/usr/local/lib"}]},
         "spec.podTemplate.volumeMounts[0].mountPath: /usr/local/lib is not where the operator lets volumes be "
         "mounted (worker.podTemplate.allowedMountPaths: /mnt/*, /data/*)"),
        ({"volumes": [{"name": "v", "emptyDir": {}}],
          "volumeMounts": [{"name": "v", "mountPath": "/etc/elastream/secrets/k"}]},
         "spec.podTemplate.volumeMounts[0].mountPath: /etc/elastream/secrets/k is at, under or above the "
         "operator's mounts (/etc/elastream, /tmp); mount it elsewhere, e.g. under /mnt/"),
        ({"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/etc"}]},
         "spec.podTemplate.volumeMounts[0].mountPath: /etc is at, under or above the operator's mounts"),
        ({"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/mnt/../usr"}]},
         "spec.podTemplate.volumeMounts[0].mountPath: /mnt/../usr; give an absolute path without ., .. or //"),
        ({"volumeMounts": [{"name": "topology", "mountPath": "/mnt/t"}]},
         "spec.podTemplate.volumeMounts[0].name: topology is no volume of spec.podTemplate.volumes"),
        ({"env": [{"name": "ELASTREAM_REDIS_URL", "value": "x"}]},
         "spec.podTemplate.env[0].name: ELASTREAM_REDIS_URL is the operator's (ELASTREAM_*, POD_IP, POD_NAME); "
         "name the variable otherwise"),
        ({"env": [{"name": "POD_IP", "value": "x"}]}, "spec.podTemplate.env[0].name: POD_IP is the operator's"),
        ({"env": [{"name": "LD_PRELOAD", "value": "/mnt/x.so"}]},
         "spec.podTemplate.env[0].name: LD_PRELOAD changes what code the worker image runs"),
        ({"env": [{"name": "PYTHONPATH", "value": "/mnt/code"}]},
         "spec.podTemplate.env[0].name: PYTHONPATH changes what code the worker image runs"),
        ({"env": [{"name": "JAVA_TOOL_OPTIONS", "value": "-javaagent:/mnt/a.jar"}]},
         "spec.podTemplate.env[0].name: JAVA_TOOL_OPTIONS changes what code"),
        ({"env": [{"name": "PATH", "value": "/mnt/bin"}]}, "spec.podTemplate.env[0].name: PATH changes what code"),
        ({"env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "web-redis", "key": "url"}}}]},
         "spec.podTemplate.env[0].valueFrom.secretKeyRef.name: names the Secret web-redis"),
        ({"envFrom": [{"secretRef": {"name": "s"}}]},
         "spec.podTemplate.envFrom[0].prefix: none; give one (e.g. APP_): the operator never reads what the Secret "
         "holds, and a key such as LD_PRELOAD or PYTHONPATH would change what code the worker image runs"),
        ({"envFrom": [{"prefix": "LD_", "configMapRef": {"name": "c"}}]},
         "spec.podTemplate.envFrom[0].prefix: LD_: names made with it could be LD_*; choose another prefix"),
        ({"envFrom": [{"prefix": "ELASTREAM_X", "configMapRef": {"name": "c"}}]},
         "spec.podTemplate.envFrom[0].prefix: ELASTREAM_X: names made with it could be ELASTREAM_*"),
        ({"envFrom": [{"prefix": "PA", "configMapRef": {"name": "c"}}]},
         "spec.podTemplate.envFrom[0].prefix: PA: a key could make it PATH"),
        ({"envFrom": [{"prefix": "APP_", "secretRef": {"name": "x-redis"}}]},
         "spec.podTemplate.envFrom[0].secretRef.name: names the Secret x-redis"),
        ({"serviceAccountName": "default"},
         "spec.podTemplate.serviceAccountName: default is not a ServiceAccount the operator lets worker pods run as "
         "(worker.podTemplate.allowedServiceAccounts: none); remove it, or have the operator's list extended"),
        ({"priorityClassName": "high"},
         "spec.podTemplate.priorityClassName: high is not a PriorityClass the operator allows "
         "(worker.podTemplate.allowedPriorityClasses: none)"),
        ({"priorityClassName": "system-cluster-critical"},
         "spec.podTemplate.priorityClassName: system-cluster-critical is Kubernetes' own (system-*)"),
        ({"labels": {"app.kubernetes.io/instance": "other"}},
         "spec.podTemplate.labels[app.kubernetes.io/instance]: the key is the operator's or Kubernetes' "
         "(elastream.dev, kubernetes.io, k8s.io); remove it"),
        ({"labels": {"elastream.dev/node": "node-0"}}, "spec.podTemplate.labels[elastream.dev/node]: the key is"),
        ({"annotations": {"container.apparmor.security.beta.kubernetes.io/worker": "unconfined"}},
         "spec.podTemplate.annotations[container.apparmor.security.beta.kubernetes.io/worker]: the key is the "
         "operator's or Kubernetes'"),
        ({"annotations": {"x.k8s.io/y": "z"}}, "spec.podTemplate.annotations[x.k8s.io/y]: the key is"),
        ({"containers": [{"name": "sidecar"}]},
         "spec.podTemplate.containers: not a field the operator takes (containers, securityContext, image and "
         "resources are the operator's)"),
    ],
)  # fmt: skip
def test_what_the_default_policy_refuses_names_the_field_and_the_fix(template: dict[str, Any], says: str) -> None:
    problems = pod_template_problems(document(template)["spec"], WorkerPodSettings())
    assert len(problems) == 1 and problems[0].startswith(says), problems


def test_a_refused_template_makes_no_pod() -> None:
    template = {"volumes": [{"name": "host", "hostPath": {"path": "/var/run/docker.sock"}}]}
    topology = parse_manifest(document(template))  # as a spec the API server took, read back
    with pytest.raises(PodTemplateRefused, match=r"^spec.podTemplate.volumes\[0\].hostPath: never allowed") as info:
        worker_pod(topology, "node-0", OWNER, WorkerPodSettings())
    assert isinstance(info.value, BackendError)  # where pods are made: a start that fails, retried with backoff


def test_hostpath_is_refused_even_by_a_policy_that_lists_it() -> None:
    policy = PodTemplatePolicy(allowed_volume_types=("hostPath", "gitRepo", "emptyDir"))
    for kind in ("hostPath", "gitRepo"):
        [line] = pod_template_problems(
            {"podTemplate": {"volumes": [{"name": "h", kind: {}}]}}, WorkerPodSettings(pod_template=policy)
        )
        assert line.startswith(f"spec.podTemplate.volumes[0].{kind}: never allowed")  # fmt: skip
    with pytest.raises(ValueError, match=r"^allowedVolumeTypes\[0\]: hostPath is never allowed"):
        PodTemplatePolicy.from_json('{"allowedVolumeTypes": ["hostPath"]}')


def test_a_generous_policy_allows_what_it_lists_and_nothing_more() -> None:
    settings_ = WorkerPodSettings(pod_template=GENEROUS)
    assert pod_template_problems({"podTemplate": PLAIN}, settings_) == []
    assert pod_template_problems({"podTemplate": {"labels": {"other": "x"}}}, settings_) == [
        "spec.podTemplate.labels[other]: the key is not one the operator allows (worker.podTemplate.allowedLabelKeys: "
        "team, example.com/*); remove it, or have the operator's list extended"
    ]
    assert pod_template_problems({"podTemplate": {"annotations": {"prometheus.io/scrape": "true"}}}, settings_)
    assert pod_template_problems({"podTemplate": {"serviceAccountName": "streams-writer"}}, settings_) == []
    assert pod_template_problems({"podTemplate": {"serviceAccountName": "admin"}}, settings_)
    assert pod_template_problems({"podTemplate": {"priorityClassName": "streaming"}}, settings_) == []
    mounted = {"volumes": [{"name": "v", "emptyDir": {}}]}
    for path, ok in (("/var/cache/app", True), ("/var/cache/other", False), ("/mnt/a/b", True), ("/data/x", False)):
        problems = pod_template_problems(
            {"podTemplate": {**mounted, "volumeMounts": [{"name": "v", "mountPath": path}]}}, settings_
        )
        assert (problems == []) is ok, (path, problems)


def test_every_refusal_is_named_at_once_in_short_lines_and_no_value_is_shown() -> None:
    """Env values and annotations may hold secrets: no refusal, status or event shows one."""
    secret = "hunter2-s3cr3t"
    template = {
        "labels": {"app.kubernetes.io/instance": secret.replace("2", "x")},
        "annotations": {"kubernetes.io/x": secret, "example.com/k": 7},
        "env": [
            {"name": "ELASTREAM_REDIS_URL", "value": f"redis://:{secret}@r"},
            {"name": "LD_PRELOAD", "value": secret},
            {"name": "OK", "value": secret},
        ],
        "volumes": [{"name": "h", "hostPath": {"path": f"/{secret}"}}],
        "volumeMounts": [{"name": "h", "mountPath": "/" + "x" * 5000}],
        "k" * 100_000: secret,
    }
    problems = pod_template_problems({"podTemplate": template}, WorkerPodSettings())
    assert len(problems) == 9
    assert all(secret not in line and "hunter" not in line and len(line) < 600 for line in problems), problems
    with pytest.raises(PodTemplateRefused) as info:
        worker_pod(parse_manifest(document(template)), "node-0", OWNER, WorkerPodSettings())
    assert "(and 6 more)" in str(info.value) and secret not in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------ the policy


def test_the_policy_reads_the_charts_json_and_names_what_is_wrong() -> None:
    assert PodTemplatePolicy.from_json(json.dumps(PodTemplatePolicy().to_values())) == PodTemplatePolicy()
    assert PodTemplatePolicy.from_json(json.dumps(GENEROUS.to_values())) == GENEROUS
    assert PodTemplatePolicy.from_json("{}") == PodTemplatePolicy()
    assert PodTemplatePolicy.from_json('{"allowedLabelKeys": []}').allowed_label_keys == ()
    for text, says in (
        ("[]", "give a JSON object"),
        ("{", "not JSON"),
        ('{"allowedVolumes": []}', "allowedVolumes: unknown"),
        ('{"allowedVolumeTypes": "secret"}', "allowedVolumeTypes: 'secret' is not a list"),
        ('{"allowedVolumeTypes": ["gitRepo"]}', "allowedVolumeTypes[0]: gitRepo is never allowed"),
        ('{"allowedVolumeTypes": ["secrets"]}', "allowedVolumeTypes[0]: 'secrets' is no volume type of a Pod"),
        ('{"allowedMountPaths": ["/*"]}', "allowedMountPaths[0]: '/*'; give an absolute path or glob below /"),
        ('{"allowedMountPaths": ["mnt/*"]}', "allowedMountPaths[0]: 'mnt/*'"),
        ('{"allowedServiceAccounts": [""]}', "allowedServiceAccounts[0]: ''"),
        ('{"allowedPriorityClasses": ["a b"]}', "allowedPriorityClasses[0]: 'a b'"),
        ('{"allowedAnnotationKeys": [7]}', "allowedAnnotationKeys[0]: 7"),
    ):
        with pytest.raises(ValueError, match="^" + re.escape(says)):
            PodTemplatePolicy.from_json(text)


def test_the_operator_reads_the_policy_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options

    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    monkeypatch.setenv("ELASTREAM_WORKER_POD_TEMPLATE", json.dumps(GENEROUS.to_values()))
    options = operator_options(build_parser().parse_args(["operator"]))
    assert options.worker.pod_template == GENEROUS
    monkeypatch.delenv("ELASTREAM_WORKER_POD_TEMPLATE")
    assert operator_options(build_parser().parse_args(["operator"])).worker.pod_template == PodTemplatePolicy()
    monkeypatch.setenv("ELASTREAM_WORKER_POD_TEMPLATE", '{"allowedVolumeTypes": ["hostPath"]}')
    with pytest.raises(SystemExit, match=r"^error: \$ELASTREAM_WORKER_POD_TEMPLATE \(the chart's worker.podTemplate\): "
                       r"allowedVolumeTypes\[0\]: hostPath is never allowed"):  # fmt: skip
        operator_options(build_parser().parse_args(["operator"]))


# ------------------------------------------------------------------------------------------ the CRD


def walk(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    for key, step in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), Mapping):
            yield from walk(node[key], path + step)


def test_the_crd_bounds_every_list_map_and_string_of_the_template() -> None:
    schema = openapi_schema()["properties"]["spec"]["properties"]["podTemplate"]
    for path, node in walk(schema, "spec.podTemplate"):
        kind = node.get("type")
        if kind == "array":
            assert node.get("maxItems"), path
        elif kind == "object" and "additionalProperties" in node:
            assert node.get("maxProperties"), path
        elif kind == "string":
            assert node.get("maxLength"), path
        elif node.get("x-kubernetes-preserve-unknown-fields"):
            assert node.get("maxProperties"), path  # a volume: its name and one type, checked to 8 KiB by the operator


def test_a_template_at_the_crds_bounds_is_refused_by_the_schema() -> None:
    for template, field in (
        ({"env": [{"name": f"A{i}", "value": "x"} for i in range(65)]}, "spec.podTemplate.env"),
        ({"volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(33)]}, "spec.podTemplate.volumes"),
        ({"labels": {f"k{i}": "v" for i in range(33)}}, "spec.podTemplate.labels"),
        ({"annotations": {"a": "x" * 4097}}, "spec.podTemplate.annotations.a"),
        ({"env": [{"name": "A", "value": "x" * 8193}]}, "spec.podTemplate.env[0].value"),
        ({"volumes": [{"name": "v", "emptyDir": {}, "hostPath": {"path": "/"}}]}, "spec.podTemplate.volumes[0]"),
        ({"volumeMounts": [{"name": "v", "mountPath": "/mnt/../etc"}]}, "spec.podTemplate.volumeMounts[0].mountPath"),
        ({"envFrom": [{"secretRef": {"name": "s"}}]}, "spec.podTemplate.envFrom[0].prefix"),
        ({"labels": {"k" * 400: "v"}}, "spec.podTemplate.labels"),
        ({"hostNetwork": True}, "spec.podTemplate.hostNetwork"),
    ):
        with pytest.raises(TopologyError) as info:
            check_manifest(document(template))
        assert [p.split(": ")[0] for p in info.value.problems] == [field], info.value.problems


def test_a_full_template_passes_the_crd_and_makes_a_valid_pod() -> None:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install -e 'operator[dev]'", pytrace=False)
    made = pod(PLAIN, vertices=[kafka("in", "kafka-creds"), kafka("out", "kafka-creds", "sink")])
    kubernetes_validate.validate(made, str(kubernetes_validate.latest_version()), strict=True)


# ------------------------------------------------------------------------------------------ the operator


def test_the_backend_creates_no_pod_for_a_refused_template() -> None:
    kube, core = backend()
    hostile = manifest([src("s", 2), sink("z", 2)], [edge("s", "z")], name="web", nodes=2)
    hostile["spec"]["podTemplate"] = {"env": [{"name": "LD_PRELOAD", "value": "/mnt/evil.so"}]}
    kube.topology = parse_manifest(hostile)
    with pytest.raises(PodTemplateRefused, match=r"^spec.podTemplate.env\[0\].name: LD_PRELOAD"):
        kube.spawn("node-0")
    assert core.pods == {}


def test_a_refused_template_is_invalid_spec_creates_nothing_and_a_fixed_spec_starts() -> None:
    secret = "hunter2-s3cr3t"
    world = World(
        3,
        podTemplate={
            "env": [{"name": "ELASTREAM_DATA_PLANE_AUTH", "value": "off"}, {"name": "APP_TOKEN", "value": secret}],
            "annotations": {"kubernetes.io/x": secret},
        },
    )
    world.run_for(65.0)
    assert world.backends == []  # never built: no pod, no ConfigMap, no Secret
    available = world.condition("Available")
    assert available["reason"] == "InvalidSpec"
    assert available["message"].startswith(
        "spec.podTemplate.annotations[kubernetes.io/x]: the key is the operator's or Kubernetes' (elastream.dev, "
        "kubernetes.io, k8s.io); remove it"
    )
    assert "spec.podTemplate.env[0].name: ELASTREAM_DATA_PLANE_AUTH is the operator's" in available["message"]
    assert world.reasons() == ["InvalidSpec"]  # once, not once per pass
    assert secret not in json.dumps(world.status) and secret not in json.dumps(world.core.events)
    world.patch_spec(podTemplate={"env": [{"name": "APP_TOKEN", "value": secret}]})
    world.run_for(2.0)
    assert world.status["phase"] == "Running" and len(world.backends) == 1


def test_a_template_changed_on_a_running_topology_is_a_stateful_upgrade() -> None:
    world = running(3)
    world.patch_spec(podTemplate={"labels": {"team": "payments"}})
    world.run_for(10.0)
    assert len(world.backends) == 2 and world.backend is world.backends[-1]
    assert world.running_doc is not None and world.running_doc["spec"]["podTemplate"] == {
        "labels": {"team": "payments"}
    }
    assert world.status["phase"] == "Running"


def test_a_configmap_edited_to_a_refused_template_brings_no_pod_of_it() -> None:
    """The ConfigMap lives in the tenant's namespace: an operator taking the topology over never starts (nor rolls
    back to) a template its policy refuses, whatever the ConfigMap says ran."""
    world = running(3)
    hostile = {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    world.running_doc = {"spec": {**copy.deepcopy(world.body["spec"]), "podTemplate": hostile}}
    world.configmap["previous"] = {"spec": {**copy.deepcopy(world.body["spec"]), "podTemplate": hostile}}
    restarted = restarted_operator(world)
    built: list[dict[str, Any]] = []
    build = restarted.topologies.build

    def recording(owner: Any, topology: Any, metadata: Any, managed: Any) -> Any:
        built.append(copy.deepcopy(dict(topology.spec)))
        return build(owner, topology, metadata, managed)

    restarted.rewire(build=recording)
    restarted.run_for(5.0)
    assert built and all("podTemplate" not in spec for spec in built)
    assert restarted.status["phase"] == "Running"


# ------------------------------------------------------------------------------------------ properties

names = st.one_of(
    st.sampled_from([*OPERATOR_ENV, *CODE_ENV, *HARMLESS_PYTHON_ENV]).map(lambda n: n.replace("*", "X")),
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True),
)


@settings(max_examples=300, deadline=None)
@given(name=names)
def test_no_env_name_of_the_operator_or_that_loads_code_passes(name: str) -> None:
    problems = pod_template_problems({"podTemplate": {"env": [{"name": name, "value": "v"}]}}, WorkerPodSettings())
    reserved = any(fnmatch.fnmatchcase(name, p) for p in OPERATOR_ENV) or (
        any(fnmatch.fnmatchcase(name, p) for p in CODE_ENV) and name not in HARMLESS_PYTHON_ENV
    )
    assert bool(problems) is reserved, (name, problems)


segments = st.sampled_from(["etc", "elastream", "secrets", "tmp", "mnt", "data", "usr", "lib", "..", ".", "", "x"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(segments, min_size=1, max_size=5), policy=st.sampled_from([PodTemplatePolicy(), GENEROUS]))
def test_no_mount_passes_over_the_operators_paths_or_outside_the_allowed_ones(
    parts: list[str], policy: PodTemplatePolicy
) -> None:
    path = "/" + "/".join(parts)
    template = {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": path}]}
    problems = pod_template_problems({"podTemplate": template}, WorkerPodSettings(pod_template=policy))
    if not problems:
        assert all(part not in ("", ".", "..") for part in parts)
        assert not any(path == p or path.startswith(p + "/") or p.startswith(path + "/") for p in OPERATOR_MOUNT_PATHS)
        assert any(fnmatch.fnmatchcase(path, glob) for glob in policy.allowed_mount_paths)
        merged = merge_pod_template(pod(), template)
        assert container(merged)["volumeMounts"][-1]["mountPath"] == path
