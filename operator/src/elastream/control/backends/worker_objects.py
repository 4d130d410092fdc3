"""The objects of a topology's workers on Kubernetes, as manifests and names: the worker pod, its
NetworkPolicy and PodDisruptionBudget, labels, owner references and the ownership check every patch or
delete goes through, the Redis CA the ConfigMap carries, and the spec a ConfigMap records (read back when an
operator takes a topology over). Pure functions of the topology and `WorkerPodSettings`, except
`running_spec_of` (one read of the ConfigMap). `control.backends.kubernetes` creates and inspects them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastream.core.ports import BackendError, CoreApi, NotOwned
from elastream.core.topology import API_VERSION, KIND, Topology, TopologyError, manifest_document_from_text
from elastream.store.drains import DRAIN_GRACE_ENV
from elastream.worker_inputs.keys import (
    AUTH_ENV,
    CLIENT_KEY_ENV,
    SECRET_CLIENT_KEY,
    SECRET_SERVER_KEY,
    SERVER_KEY_ENV,
)

log = logging.getLogger("elastream.kubernetes")

#: the port a worker's inboxes start from (PORT+1, … on its own pod IP), its health and metrics ports
INBOX_PORT = 7000
HEALTH_PORT = 8081
METRICS_PORT = 9100
#: the Secret's entry holding the password of the topology's Redis user
SECRET_REDIS_PASSWORD = "redisPassword"
WORKER_UID = 10001
#: the CA of Redis' TLS certificate in the topology's ConfigMap, and where worker pods find it (the ConfigMap
#: is mounted at /etc/elastream): the operator copies the file its own URL names (`ssl_ca_certs`)
REDIS_CA_KEY = "redis-ca.crt"
#: the ConfigMap's record of an upgrade in flight: the spec it upgrades from (absent when none is)
PREVIOUS_SPEC_KEY = "previous-topology.yaml"
WORKER_REDIS_CA_PATH = f"/etc/elastream/{REDIS_CA_KEY}"
#: a CA bundle larger than this is refused (a ConfigMap holds at most 1 MiB)
MAX_REDIS_CA_BYTES = 256 * 1024


@dataclass(frozen=True)
class WorkerPodSettings:
    """What the operator decides for every worker pod (the rest comes from the topology's spec)."""

    image: str = "elastream-worker:dev"
    image_pull_policy: str = "IfNotPresent"
    #: names of Secrets (in the topology's namespace) the kubelet pulls the worker image with
    image_pull_secrets: tuple[str, ...] = ()
    log_level: str = "INFO"
    interval_s: float = 1.0
    service_account: str | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    #: listen on the pod IP only instead of every interface: for pods on the host's network (one port space
    #: shared by every pod, as in the e2e tier), where two workers on 0.0.0.0 would take each other's ports
    listen_on_pod_ip: bool = False
    #: authenticate and encrypt the data plane with the topology's CURVE keys (from its Secret)
    data_plane_auth: bool = True
    #: keep a NetworkPolicy `<topology>-workers` beside the topology's Secret: its workers accept traffic from
    #: its own workers only, and their metrics port from `metrics_from` (NetworkPolicyPeers: the scraper)
    network_policy: bool = False
    metrics_from: tuple[Mapping[str, Any], ...] = ()
    #: the pods' terminationGracePeriodSeconds: a worker told to stop (eviction, node drain, `kubectl delete
    #: pod`) has this long for its drain (its executors moved off by CCR) before it is killed
    termination_grace_s: int = 30
    #: workers ask for a drain on SIGTERM (off: they stop at once and the topology rolls back, as before)
    drains: bool = True
    #: keep a PodDisruptionBudget `<topology>-workers` (maxUnavailable 1): evictions take one worker at a time
    disruption_budget: bool = True


def labels_for(topology: Topology, node: str | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "elastream-worker",
        "app.kubernetes.io/instance": topology.name,
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/managed-by": "elastream",
    }
    if node is not None:
        labels["elastream.dev/node"] = node
    return labels


def selector_for(topology: Topology) -> str:
    """The label selector of a topology's worker pods (also `status.selector`, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in labels_for(topology).items())


def pod_name(topology: Topology, node: str) -> str:
    return f"{topology.name}-{node}"


def config_map_name(topology: Topology) -> str:
    return f"{topology.name}-topology"


def secret_name(topology: Topology) -> str:
    return f"{topology.name}-redis"


def object_field(obj: Any, attribute: str, key: str) -> Any:
    """A field of a client model (`obj.owner_references`) or of a plain dict (`obj["ownerReferences"]`)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, attribute, None)


def owners_of(obj: Any) -> list[tuple[str, str, str]]:
    """(kind, name, uid) of each ownerReference of an API object (a client model or a dict)."""
    metadata = object_field(obj, "metadata", "metadata")
    refs = object_field(metadata, "owner_references", "ownerReferences") or []
    return [tuple(str(object_field(r, key, key)) for key in ("kind", "name", "uid")) for r in refs]  # type: ignore[misc]


def is_owned_by(obj: Any, owner: Mapping[str, Any]) -> bool:
    """The object's ownerReferences name this StreamTopology, by uid (a label anyone can set; a uid names one
    resource, so a topology deleted and re-created under the same name does not own what the old one left)."""
    return any(kind == KIND and uid == str(owner["uid"]) for kind, _, uid in owners_of(obj))


def not_owned(kind: str, namespace: str, name: str, obj: Any, owner: Mapping[str, Any]) -> NotOwned:
    """The refusal for an object in the way: which object, whose it is, and the fix."""
    owners = owners_of(obj)
    if any(k == KIND and n == owner["name"] for k, n, _ in owners):
        whose = f"it belongs to an earlier StreamTopology {owner['name']}, not deleted by the garbage collector yet"
    elif owners:
        whose = "it is owned by " + ", ".join(f"{k} {n}" for k, n, _ in owners)
    else:
        whose = "it has no owner"
    return NotOwned(
        f"{kind} {namespace}/{name} exists and is not this StreamTopology's ({whose}); the operator leaves it "
        f"untouched: delete or rename it"
    )


def network_policy_name(topology: Topology) -> str:
    return f"{topology.name}-workers"


def worker_network_policy(topology: Topology, owner: Mapping[str, Any], settings: WorkerPodSettings) -> dict[str, Any]:
    """The topology's NetworkPolicy: its worker pods accept any port from its own worker pods (the data plane,
    whose ports move between schedule versions) and the metrics port from `settings.metrics_from`; nothing else
    (the kubelet's probes come from the node, which a NetworkPolicy always allows). Egress is not restricted:
    workers reach Redis, DNS and the topology's own sources and sinks."""
    workers = {"matchLabels": labels_for(topology)}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": workers}]}]
    if settings.metrics_from:
        ingress.append(
            {
                "from": [dict(peer) for peer in settings.metrics_from],
                "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(topology),
            "namespace": topology.namespace,
            "labels": labels_for(topology),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {"podSelector": workers, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def disruption_budget_name(topology: Topology) -> str:
    return f"{topology.name}-workers"


def worker_disruption_budget(topology: Topology, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The topology's PodDisruptionBudget: evictions (`kubectl drain`, a cluster autoscaler) take at most one of
    its worker pods at a time, so each drain moves one node's executors while the others run."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": disruption_budget_name(topology),
            "namespace": topology.namespace,
            "labels": labels_for(topology),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels_for(topology)}},
    }


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to the StreamTopology `owner` (its metadata): deleting it deletes the pods."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner["name"],
        "uid": owner["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def read_redis_ca(path: str) -> str:
    """The CA certificate(s) at `path` (PEM), which the operator's Redis URL names for TLS; `BackendError`
    saying what to mount when it cannot be read or is no certificate."""
    fix = "mount the CA that signed Redis' certificate there (chart: redis.tls, or redis.external.caSecret)"
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_REDIS_CA_BYTES + 1)
    except OSError as exc:
        raise BackendError(
            f"the Redis URL's CA file {path} (ssl_ca_certs) cannot be read: {exc.strerror}; {fix}"
        ) from None
    if len(raw) > MAX_REDIS_CA_BYTES:
        raise BackendError(f"the Redis URL's CA file {path} is over {MAX_REDIS_CA_BYTES // 1024} KiB; {fix}")
    text = raw.decode("ascii", errors="replace")
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise BackendError(f"the Redis URL's CA file {path} holds no PEM certificate; {fix}")
    return text


def worker_pod(
    topology: Topology,
    node: str,
    owner: Mapping[str, Any],
    settings: WorkerPodSettings,
    staged_version: int = 0,
    redis_ca: bool = False,
) -> dict[str, Any]:
    """The pod of one node: what `kubectl get pod <topology>-<node> -o yaml` shows. `redis_ca`: Redis is
    reached over TLS with a CA the topology's ConfigMap carries (`redis-ca.crt`, mounted beside the manifest)."""
    spec = topology.spec
    image = str(spec.get("image") or settings.image)
    args = [
        "worker",
        "--topology",
        "/etc/elastream/topology.yaml",
        "--node",
        node,
        *(
            ["--bind", f"$(POD_IP):{INBOX_PORT}"]
            if settings.listen_on_pod_ip
            else ["--bind", f"0.0.0.0:{INBOX_PORT}", "--advertise", "$(POD_IP)"]
        ),
        "--metrics-port",
        str(METRICS_PORT),
        "--health-port",
        str(HEALTH_PORT),
        "--interval",
        f"{settings.interval_s:g}",
    ]
    if staged_version:
        args += ["--schedule-version", str(staged_version)]
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": args,
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "ELASTREAM_REDIS_URL",
                "valueFrom": {"secretKeyRef": {"name": secret_name(topology), "key": "url"}},
            },
            {"name": "ELASTREAM_LOG_LEVEL", "value": settings.log_level},
            {"name": DRAIN_GRACE_ENV, "value": str(settings.termination_grace_s if settings.drains else 0)},
            *data_plane_env(topology, settings),
        ],
        "ports": [
            {"name": "health", "containerPort": HEALTH_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": HEALTH_PORT},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": WORKER_UID,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "topology", "mountPath": "/etc/elastream", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    resources = spec.get("resources")
    if isinstance(resources, Mapping):
        container["resources"] = {k: dict(v) for k, v in resources.items() if isinstance(v, Mapping)}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # workers talk to Redis and to each other, never to the API
        # the worker's drain (its executors moved off by CCR) must fit in it: the worker reads it from its env
        "terminationGracePeriodSeconds": settings.termination_grace_s,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": WORKER_UID,
            "runAsGroup": WORKER_UID,
            "fsGroup": WORKER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {
                "name": "topology",
                "configMap": {
                    "name": config_map_name(topology),
                    "items": [
                        {"key": "topology.yaml", "path": "topology.yaml"},
                        *([{"key": REDIS_CA_KEY, "path": REDIS_CA_KEY}] if redis_ca else []),
                    ],
                },
            },
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in settings.image_pull_secrets]
    placement = spec.get("placement")
    if isinstance(placement, Mapping):
        for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
            if key in placement:
                pod_spec[key] = placement[key]
    if spec.get("spreadOverNodes") and "topologySpreadConstraints" not in pod_spec:
        pod_spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": labels_for(topology)},
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(topology, node),
            "namespace": topology.namespace,
            "labels": {**labels_for(topology, node), **settings.extra_labels},
            "annotations": {"elastream.dev/schedule-version": str(staged_version)} if staged_version else {},
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": pod_spec,
    }


def data_plane_env(topology: Topology, settings: WorkerPodSettings) -> list[dict[str, Any]]:
    """A worker container's data-plane settings: the topology's keys from its Secret, or auth off."""
    if not settings.data_plane_auth:
        return [{"name": AUTH_ENV, "value": "off"}]
    return [
        {"name": AUTH_ENV, "value": "on"},
        *(
            {"name": env, "valueFrom": {"secretKeyRef": {"name": secret_name(topology), "key": key}}}
            for env, key in ((SERVER_KEY_ENV, SECRET_SERVER_KEY), (CLIENT_KEY_ENV, SECRET_CLIENT_KEY))
        ),
    ]


def running_spec_of(
    core: CoreApi, topology: Topology, owner: Mapping[str, Any]
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """(the spec the topology's pods run, the spec an upgrade in flight upgrades from): the `topology.yaml` and
    `previous-topology.yaml` of its ConfigMap (written by every start, upgrade and migration). None for what
    is not there: no ConfigMap of the topology's (a new topology), no upgrade in flight, a document that does
    not read. Read within the manifest bounds: the ConfigMap lives in the tenant's namespace."""
    from kubernetes.client.exceptions import ApiException

    try:
        found = core.read_namespaced_config_map(config_map_name(topology), topology.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None, None
        raise
    if not is_owned_by(found, owner):
        return None, None  # not this topology's (ObjectNotOwned is the start's to say)
    data = object_field(found, "data", "data") or {}

    def document(key: str) -> Mapping[str, Any] | None:
        text = data.get(key)
        if not isinstance(text, str):
            return None
        try:
            return manifest_document_from_text(text, f"ConfigMap {config_map_name(topology)} {key}")
        except TopologyError as exc:
            log.warning("%s", exc)
            return None

    return document("topology.yaml"), document(PREVIOUS_SPEC_KEY)


def manifest_document(topology: Topology) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": topology.name, "namespace": topology.namespace},
        "spec": dict(topology.spec),
    }


def is_api_unavailable(exc: BaseException) -> bool:
    """The API server cannot answer now (down, overloaded, a connection reset), as opposed to refusing the
    request: worth waiting for."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return exc.status in (0, 429) or (exc.status or 0) >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message", ""))
    except (TypeError, ValueError):
        return ""
