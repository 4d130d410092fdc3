"""The Kubernetes backend: every node is a worker pod, owned by its StreamTopology.

Pods are bare (no StatefulSet or Deployment): a scale-in must delete exactly the pods whose nodes the plan
removes (lowest ETPSum), which neither controller can do. Pod `<topology>-<node>` runs
`elastream worker --node <node> --bind 0.0.0.0:7000 --advertise $(POD_IP)` from the topology's image (every
listener on every interface, so `kubectl port-forward` reaches it; `--bind $(POD_IP):7000` with
`listen_on_pod_ip`, for clusters whose pods share the host's network), reads the manifest from
the ConfigMap `<topology>-topology` (which also shows the running schedule) and the Redis URL and the
topology's data-plane CURVE keys from the Secret `<topology>-redis` (never on a command line). The keys are
generated when the Secret is created (or first lacks them) and never changed while it exists, so every pod
of the topology, old or new, holds the same ones and pods of other topologies do not. The Redis URL is the
operator's with the topology's own ACL user (`elastream.store.acl`: its keys and channels only) and a
password kept in the Secret the same way (`redisPassword`); the user is set in Redis before the first pod
starts, checked on every reconcile pass (`ensure_redis_user`) and, also while a pass is held by a migration,
every 2 s by the operator's one `store.acl.UserKeeper` (one thread and one ACL USERS per node for all
topologies). With `topology_users` off the Secret holds the operator's URL, as for a Redis service that refuses
ACL commands. Its readiness probe
(`/ready` on port 8081) means its executors are bound and registered (or, for a node a migration adds,
staged and idle). The in-place migration steps are `NodeBackend`'s; this class only creates, deletes and
inspects pods.

Nothing that is not the topology's is ever patched or deleted: the ConfigMap and the Secret are read before
they are patched, a pod before it is deleted (also the pod holding a name a new worker needs, on a 409), and
only an object whose ownerReferences name this StreamTopology by uid goes ahead (a pod is deleted with that
uid as a precondition); anything else raises `NotOwned` naming the object and the fix, and stays untouched.
Pods labelled like the topology's but not owned by it are no nodes of it.

Pods are never restarted by Kubernetes (restartPolicy Never): a worker that dies is a failure the
controller sees (`failed_nodes`) and recovers from, by rolling back to the last checkpoint. A pod being deleted
(evicted, drained, `kubectl delete pod`) whose worker still runs is not failed yet: the worker asks for a
drain (`control.drains`) and its executors move off within the pod's terminationGracePeriodSeconds
(`WorkerPodSettings.termination_grace_s`); it is failed once its container stopped or the pod is gone while
its node is still in the schedule. The operator's own deletions send STOP first (no drain). With
`disruption_budget`, a PodDisruptionBudget `<topology>-workers` (maxUnavailable 1) lets evictions take one
worker at a time.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import yaml

from elastream.control.backends.nodes import NodeBackend
from elastream.core.acl import topology_user
from elastream.core.ports import BackendError, NotOwned
from elastream.core.schedule import Schedule
from elastream.core.topology import API_VERSION, KIND, Topology, TopologyError, manifest_document_from_text
from elastream.store.acl import UserKeeper, delete_topology_user, ensure_topology_user, topology_url
from elastream.store.drains import DRAIN_GRACE_ENV
from elastream.store.registry import ca_file_of, with_ca_file
from elastream.worker_inputs.keys import (
    AUTH_ENV,
    CLIENT_KEY_ENV,
    SECRET_CLIENT_KEY,
    SECRET_SERVER_KEY,
    SERVER_KEY_ENV,
    generate_keys,
)

log = logging.getLogger("elastream.kubernetes")

#: the port a worker's inboxes start from (PORT+1, … on its own pod IP), its health and metrics ports
INBOX_PORT = 7000
HEALTH_PORT = 8081
METRICS_PORT = 9100
#: the Secret's entry holding the password of the topology's Redis user
SECRET_REDIS_PASSWORD = "redisPassword"
#: how long a list of the topology's pods is reused (failure checks run every few ms during a migration)
POD_CACHE_S = 0.5
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


def _field(obj: Any, attribute: str, key: str) -> Any:
    """A field of a client model (`obj.owner_references`) or of a plain dict (`obj["ownerReferences"]`)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, attribute, None)


def owners_of(obj: Any) -> list[tuple[str, str, str]]:
    """(kind, name, uid) of each ownerReference of an API object (a client model or a dict)."""
    metadata = _field(obj, "metadata", "metadata")
    refs = _field(metadata, "owner_references", "ownerReferences") or []
    return [tuple(str(_field(r, key, key)) for key in ("kind", "name", "uid")) for r in refs]  # type: ignore[misc]


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
    core: Any, topology: Topology, owner: Mapping[str, Any]
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
    data = _field(found, "data", "data") or {}

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


class KubernetesBackend(NodeBackend):
    """Worker pods of one topology. `core` is a `kubernetes.client.CoreV1Api`; `owner` the topology's
    metadata (name, uid); `redis_url` goes into the topology's Secret for its workers."""

    def __init__(
        self,
        topology: Topology,
        client: redis.Redis,
        core: Any,
        owner: Mapping[str, Any],
        redis_url: str,
        settings: WorkerPodSettings | None = None,
        start_timeout_s: float = 180.0,
        networking: Any = None,
        topology_users: bool = True,
        user_keeper: UserKeeper | None = None,
        policy: Any = None,
    ) -> None:
        super().__init__(topology, client, start_timeout_s)
        #: give the workers a Redis user of the topology's own (else the operator's URL, `redis_url`)
        self.topology_users = topology_users
        #: the password of that user, as the topology's Secret holds it (known once `ensure_config` ran)
        self._redis_password: str | None = None
        #: set the user unconditionally the first time (rules of an older operator are replaced)
        self._user_set = False
        #: the operator's one `store.acl.UserKeeper`: it looks at the user every few seconds, also while a pass is
        #: held (a migration waiting for its workers, who need the user)
        self.user_keeper = user_keeper
        self.core = core
        #: a `kubernetes.client.NetworkingV1Api` (needed with `settings.network_policy`)
        self.networking = networking
        #: a `kubernetes.client.PolicyV1Api` (needed with `settings.disruption_budget`)
        self.policy = policy
        self.owner = dict(owner)
        self.redis_url = redis_url
        self.settings = settings or WorkerPodSettings()
        self.namespace = topology.namespace
        self._pods: dict[str, Any] = {}
        self._terminating: set[str] = set()
        self._pods_at = 0.0
        #: nodes whose pods were deleted on purpose (not failures)
        self._released: set[str] = set()

    # ------------------------------------------------------------------------------------ the API objects
    def ensure_config(self) -> None:
        """The ConfigMap the workers read the topology from, and the Secret with the Redis URL and the
        data-plane keys (generated once: existing keys are never replaced, running pods hold them)."""
        from kubernetes.client.exceptions import ApiException

        data = {"topology.yaml": yaml.safe_dump(manifest_document(self.topology), sort_keys=False)}
        if self.schedule is not None:
            data["schedule.json"] = json.dumps({"version": self.version, **self.schedule.to_dict()}, indent=1)
        worker_url = self.redis_url
        ca_file = ca_file_of(self.redis_url)
        if ca_file is not None:  # TLS with a CA of its own: the workers get a copy (public, never a key)
            data[REDIS_CA_KEY] = read_redis_ca(ca_file)
            worker_url = with_ca_file(self.redis_url, WORKER_REDIS_CA_PATH)
        metadata = {
            "name": config_map_name(self.topology),
            "namespace": self.namespace,
            "labels": labels_for(self.topology),
            "ownerReferences": [owner_reference(self.owner)],
        }
        current = self._read("ConfigMap", self.core.read_namespaced_config_map, config_map_name(self.topology))
        try:
            if current is None:
                self.core.create_namespaced_config_map(self.namespace, {"metadata": metadata, "data": data})
            else:
                self.core.patch_namespaced_config_map(metadata["name"], self.namespace, {"data": data})
        except ApiException as exc:  # 409: made meanwhile by someone else; the next pass looks at it again
            raise BackendError(f"ConfigMap {metadata['name']}: {exc.reason}") from None
        name = secret_name(self.topology)
        existing = self._read("Secret", self.core.read_namespaced_secret, name)
        held = dict(_field(existing, "data", "data") or {}) if existing is not None else {}
        string_data = {"url": worker_url}
        if self.topology_users:
            # generated once: running pods hold it, so it never changes while the Secret exists
            password = _decoded_entry(held.get(SECRET_REDIS_PASSWORD)) or secrets.token_hex(32)
            if SECRET_REDIS_PASSWORD not in held:
                string_data[SECRET_REDIS_PASSWORD] = password
            self._redis_password = password
            user = topology_user(self.topology.namespace, self.topology.name)
            string_data["url"] = topology_url(worker_url, user, password)
        if not {SECRET_SERVER_KEY, SECRET_CLIENT_KEY} <= set(held):
            string_data.update(generate_keys().secret_data())
        if existing is None:
            secret: dict[str, Any] = {
                "metadata": {**metadata, "name": name},
                "stringData": string_data,
                "type": "Opaque",
            }
            try:
                self.core.create_namespaced_secret(self.namespace, secret)
            except ApiException as exc:
                raise BackendError(f"Secret {name}: {exc.reason}") from None
            return
        try:
            self.core.patch_namespaced_secret(name, self.namespace, {"stringData": string_data})
        except ApiException as exc:
            raise BackendError(f"Secret {name}: {exc.reason}") from None

    def record_upgrade(self, previous: Topology | None) -> None:
        """Keep (or, with None, drop) the spec an upgrade starts from in the ConfigMap, before the old pods stop:
        an operator restarted in the middle of the upgrade knows what to go back to. Raises `BackendError`."""
        from kubernetes.client.exceptions import ApiException

        value = yaml.safe_dump(manifest_document(previous), sort_keys=False) if previous is not None else None
        try:
            self.core.patch_namespaced_config_map(
                config_map_name(self.topology), self.namespace, {"data": {PREVIOUS_SPEC_KEY: value}}
            )
        except ApiException as exc:
            if exc.status == 404 and previous is None:
                return
            raise BackendError(f"ConfigMap {config_map_name(self.topology)}: {exc.reason}") from None
        except Exception as exc:
            raise BackendError(f"ConfigMap {config_map_name(self.topology)}: {exc}") from None

    def ensure_redis_user(self) -> None:
        """The topology's Redis user as it must be, on every node (one ACL GETUSER each when it is): before the
        first pod, and on every reconcile pass (a Redis restarted without an ACL file lost it). Raises
        `AclRefused` when Redis refuses ACL commands, a `redis.RedisError` when it cannot answer."""
        if not self.topology_users:
            return
        if self._redis_password is None:
            self.ensure_config()  # the password is the Secret's
        assert self._redis_password is not None
        ensure_topology_user(
            self.client, self.topology.namespace, self.topology.name, self._redis_password, force=not self._user_set
        )
        self._user_set = True
        if self.user_keeper is not None:
            self.user_keeper.keep(self.topology.namespace, self.topology.name, self._redis_password)

    def delete_redis_user(self) -> None:
        """ACL DELUSER the topology's user on every node (its clients are disconnected with it)."""
        self._forget_user()
        if self.topology_users:
            delete_topology_user(self.client, self.topology.namespace, self.topology.name)

    def _forget_user(self) -> None:
        if self.user_keeper is not None:
            self.user_keeper.forget(self.topology.namespace, self.topology.name)

    def ensure_network_policy(self) -> None:
        """The topology's NetworkPolicy (with `settings.network_policy`), created or brought back to what it
        should be; one that is not the topology's raises `NotOwned` and is left alone."""
        from kubernetes.client.exceptions import ApiException

        if not self.settings.network_policy:
            return
        if self.networking is None:
            raise BackendError("network policies are on but the operator has no networking.k8s.io client")
        body = worker_network_policy(self.topology, self.owner, self.settings)
        name = network_policy_name(self.topology)
        current = self._read("NetworkPolicy", self.networking.read_namespaced_network_policy, name)
        try:
            if current is None:
                self.networking.create_namespaced_network_policy(self.namespace, body)
            else:
                self.networking.patch_namespaced_network_policy(name, self.namespace, {"spec": body["spec"]})
        except ApiException as exc:
            raise BackendError(f"NetworkPolicy {name}: {exc.reason}: {_api_message(exc)}") from None

    def ensure_disruption_budget(self) -> None:
        """The topology's PodDisruptionBudget (with `settings.disruption_budget` and a policy client), created or
        brought back to what it should be; one that is not the topology's raises `NotOwned`."""
        from kubernetes.client.exceptions import ApiException

        if not self.settings.disruption_budget or self.policy is None:
            return
        body = worker_disruption_budget(self.topology, self.owner)
        name = disruption_budget_name(self.topology)
        current = self._read("PodDisruptionBudget", self.policy.read_namespaced_pod_disruption_budget, name)
        try:
            if current is None:
                self.policy.create_namespaced_pod_disruption_budget(self.namespace, body)
            else:
                self.policy.patch_namespaced_pod_disruption_budget(name, self.namespace, {"spec": body["spec"]})
        except ApiException as exc:
            raise BackendError(f"PodDisruptionBudget {name}: {exc.reason}: {_api_message(exc)}") from None

    def _read(self, kind: str, read: Any, name: str) -> Any:
        """The object `name` (None when there is none), checked to be this topology's: one that is not raises
        `NotOwned` and is never patched or deleted."""
        from kubernetes.client.exceptions import ApiException

        try:
            found = read(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise BackendError(f"{kind} {name}: {exc.reason}") from None
        if not is_owned_by(found, self.owner):
            raise not_owned(kind, self.namespace, name, found, self.owner)
        return found

    def pods(self, fresh: bool = False) -> dict[str, Any]:
        """node -> its pod (a `V1Pod`), listed by the topology's labels and owned by it (a pod someone else
        labelled alike is no node of it; cached for `POD_CACHE_S`); a pod being deleted is not in it (its
        node is in `terminating_nodes` while its worker runs)."""
        now = time.monotonic()
        if fresh or now - self._pods_at > POD_CACHE_S:
            listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector_for(self.topology))
            owned = [p for p in listed.items if is_owned_by(p, self.owner)]
            self._pods = {_node_of(p): p for p in owned if p.metadata.deletion_timestamp is None}
            # deleted, but the worker runs on through its grace period (a drain moves its executors off)
            self._terminating = {
                _node_of(p)
                for p in owned
                if p.metadata.deletion_timestamp is not None and (p.status.phase or "Pending") == "Running"
            } - set(self._pods)
            self._pods_at = now
        return self._pods

    # --------------------------------------------------------------------------------- NodeBackend hooks
    def preflight(self) -> None:
        self.ensure_network_policy()  # before the first pod: no worker is ever reachable from outside
        self.ensure_disruption_budget()
        self.ensure_config()
        self.ensure_redis_user()  # before the first pod: its URL names the user

    def is_transient(self, exc: Exception) -> bool:
        return super().is_transient(exc) or is_api_unavailable(exc)

    def running_nodes(self) -> set[str]:
        pods = self.pods(fresh=True)
        running = {n for n, p in pods.items() if (p.status.phase or "Pending") in ("Pending", "Running")}
        return running | (self._terminating - self._released)

    def terminating_nodes(self) -> set[str]:
        """Nodes whose pod is being deleted (evicted, drained, `kubectl delete pod`) and whose worker still runs
        through its grace period: not failed until it stops (a drain may move its executors off first)."""
        self.pods()
        return set(self._terminating)

    def spawn(self, node: str, staged_version: int = 0) -> None:
        from kubernetes.client.exceptions import ApiException

        body = worker_pod(
            self.topology, node, self.owner, self.settings, staged_version, ca_file_of(self.redis_url) is not None
        )
        name = body["metadata"]["name"]
        deadline = time.monotonic() + 60.0
        while True:
            try:
                self.core.create_namespaced_pod(self.namespace, body)
                break
            except ApiException as exc:
                late = time.monotonic() > deadline
                if exc.status == 409 and not late:
                    # a dead pod of ours of the same name: make room; anyone else's: NotOwned, untouched
                    self._delete_pod(name, refuse=True)
                elif not is_api_unavailable(exc) or late:
                    # a quota, an admission webhook, a forbidden field: the API server's own words say which
                    raise BackendError(f"pod {name} not created: {exc.reason}: {_api_message(exc)}") from None
            except Exception as exc:
                if not is_api_unavailable(exc) or time.monotonic() > deadline:
                    raise BackendError(f"pod {name} not created: {exc}") from None
            time.sleep(0.5)
        self._released.discard(node)
        self._pods_at = 0.0

    def stop_nodes(self, nodes: Sequence[str]) -> None:
        self.tell_stop(list(nodes))  # so the SIGTERM of the deletion asks for no drain
        for node in nodes:
            self._released.add(node)
            self._delete_pod(pod_name(self.topology, node))
        self._pods_at = 0.0

    def release_nodes(self, nodes: Sequence[str]) -> None:
        # the workers exit by themselves after SWITCH; deleting the pods takes what is left away
        self.stop_nodes(nodes)

    def failed_nodes(self) -> dict[str, str]:
        if self.schedule is None:
            return {}
        pods = self.pods()
        wanted = set(self.schedule.nodes) | (set(self.prepared[0].nodes) if self.prepared else set())
        failed = {}
        for node in sorted(wanted - self._released - self._terminating):
            pod = pods.get(node)
            if pod is None:
                failed[node] = f"worker pod {pod_name(self.topology, node)} is gone (deleted or evicted)"
                continue
            phase = pod.status.phase or "Pending"
            if phase in ("Failed", "Succeeded"):
                failed[node] = f"worker pod {pod.metadata.name} {phase.lower()}: {_termination(pod)}"
        return failed

    def stop_workers(self, timeout_s: float = 30.0) -> None:
        """Delete every worker pod and wait until they are gone: a stopping worker still writes its last
        metrics and positions, which must not land after the topology's Redis keys are deleted."""
        from kubernetes.client.exceptions import ApiException

        self._forget_user()  # no worker left to keep the user for (the next start keeps it again)
        # one by one: the operator's RBAC grants `delete` on pods, not `deletecollection`
        self.stop_nodes(sorted(self.pods(fresh=True)))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector_for(self.topology))
            except ApiException as exc:
                log.warning("listing the worker pods of %s: %s", self.topology.name, exc.reason)
                return
            if not listed.items:
                return
            time.sleep(0.5)
        log.warning("worker pods of %s still terminating after %.0f s", self.topology.name, timeout_s)

    def describe(self, node: str) -> str:
        pod = self.pods(fresh=True).get(node)
        if pod is None:
            return "no pod"
        conditions = ", ".join(f"{c.type}={c.status}" for c in pod.status.conditions or [])
        why = _waiting_reason(pod)
        return f"pod {pod.metadata.name} {pod.status.phase} ({conditions}) {why or _termination(pod)}".strip()

    def pending_nodes(self) -> dict[str, str]:
        """Pods the scheduler cannot place (its message: which resources or constraints fail) and containers
        that cannot be created (an image that is not there: on kind, an image not `kind load`ed)."""
        pending = {}
        for node, pod in self.pods().items():
            if (pod.status.phase or "Pending") == "Pending":
                why = _waiting_reason(pod)
                if why:
                    pending[node] = f"pod {pod.metadata.name} {why}"
        return pending

    # ---------------------------------------------------------------------------------------------- adopt
    def start(self, schedule: Schedule) -> None:
        """Start `schedule`; after an operator restart, adopt the pods that already run it instead (nothing
        restarts; a pod that died meanwhile is a failure the controller's next tick recovers from)."""
        found = self.registry.schedule()
        if found is not None and found[1] == schedule and self.running_nodes():
            self.schedule, self.version = schedule, found[0]
            self.endpoints = self.registry.endpoints(found[0])
            log.info("adopted the worker pods of %s (schedule version %d)", self.topology.name, found[0])
            self.ensure_network_policy()
            self.ensure_disruption_budget()
            self.ensure_config()
            self.ensure_redis_user()
            return
        if self.running_nodes():  # pods of another schedule (a migration past COMMIT): its state is in Redis
            self.stop_workers()
        self._released.clear()
        super().start(schedule)
        self.ensure_config()

    def apply(self, schedule: Schedule, migration_id: str) -> None:
        super().apply(schedule, migration_id)
        self.ensure_config()  # the ConfigMap shows the schedule that runs now

    def _delete_pod(self, name: str, refuse: bool = False) -> None:
        """Delete the pod `name` if it is this topology's (its ownerReferences), and only that very pod (a uid
        precondition: not one created under the same name since it was read). A pod that is not the topology's
        is left alone: with `refuse` that raises `NotOwned`, else it is logged."""
        from kubernetes.client.exceptions import ApiException

        try:
            pod = self._read("Pod", self.core.read_namespaced_pod, name)
        except NotOwned as exc:
            if refuse:
                raise
            log.warning("%s", exc)
            return
        except BackendError as exc:
            log.warning("deleting pod %s: %s", name, exc)
            return
        if pod is None:
            return
        try:
            self.core.delete_namespaced_pod(
                name,
                self.namespace,
                grace_period_seconds=10,
                body={"preconditions": {"uid": pod.metadata.uid}},
            )
        except ApiException as exc:
            if exc.status not in (404, 409):  # 409: the precondition failed, the pod is another one now
                log.warning("deleting pod %s: %s", name, exc.reason)


#: container waiting reasons that need someone to act (a pod merely starting waits with ContainerCreating)
STUCK_WAITING = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError"}
)


def _node_of(pod: Any) -> str:
    return str((pod.metadata.labels or {}).get("elastream.dev/node", ""))


def _waiting_reason(pod: Any) -> str:
    """Why a pending pod is not running, when it is stuck: not schedulable, or its container not creatable."""
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"cannot be scheduled: {condition.message or condition.reason or 'no reason given'}"
    for status in pod.status.container_statuses or []:
        waiting = status.state.waiting if status.state else None
        if waiting is not None and waiting.reason in STUCK_WAITING:
            return f"cannot start: {waiting.reason}: {waiting.message or ''}".rstrip(": ")
    return ""


def _termination(pod: Any) -> str:
    for status in pod.status.container_statuses or []:
        terminated = status.state.terminated if status.state else None
        if terminated is not None:
            return f"exit code {terminated.exit_code} ({terminated.reason or 'terminated'})"
    return ""


def is_api_unavailable(exc: BaseException) -> bool:
    """The API server cannot answer now (down, overloaded, a connection reset), as opposed to refusing the
    request: worth waiting for."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return exc.status in (0, 429) or (exc.status or 0) >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def _decoded_entry(value: Any) -> str:
    """A Secret's `data` entry (base64) as text, "" when there is none or it is not base64 of UTF-8."""
    if not value:
        return ""
    try:
        return base64.b64decode(str(value), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return ""


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message", ""))
    except (TypeError, ValueError):
        return ""
