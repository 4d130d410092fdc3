"""The objects of a topology's workers on Kubernetes, as manifests and names: the worker pod, its
NetworkPolicy and PodDisruptionBudget, labels, owner references and the ownership check every patch or
delete goes through, the Redis CA the ConfigMap carries, and the spec a ConfigMap records (read back when an
operator takes a topology over). Pure functions of the topology and `WorkerPodSettings`, except
`running_spec_of` (one read of the ConfigMap). `control.backends.kubernetes` creates and inspects them.

A topology's `spec.placement` reaches its pods only as far as the operator's `PlacementPolicy` allows (the
chart's `worker.placement`, `ELASTREAM_WORKER_PLACEMENT`): tolerations and node labels on its allow-lists,
affinity only when allowed, pod affinity within the topology's own namespace, and never a toleration of the
control plane's taints. `worker_pod` refuses anything else with `PlacementRefused`, naming the field and the fix.

A topology's `spec.podTemplate` (labels, annotations, env, envFrom, volumes, volumeMounts, serviceAccountName,
priorityClassName) is merged into its pods (`merge_pod_template`: the operator's own labels, environment, volumes,
service account, image, resources and security contexts win) as far as the operator's `PodTemplatePolicy` allows
(the chart's `worker.podTemplate`, `ELASTREAM_WORKER_POD_TEMPLATE`); `worker_pod` refuses anything else with
`PodTemplateRefused`, naming the field and the fix and never a value. The Secrets the topology's connectors name
(`secretRef`) are mounted read-only at `/etc/elastream/secrets/<name>/`, one volume each; the operator never
reads them.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastream import DEFAULT_WORKER_IMAGE
from elastream.core.ports import BackendError, CoreApi, NotOwned
from elastream.core.rates import shown
from elastream.core.topology import API_VERSION, KIND, Topology, TopologyError, manifest_document_from_text
from elastream.store.drain_requests import DRAIN_GRACE_ENV
from elastream.worker_inputs.keys import (
    AUTH_ENV,
    CLIENT_KEY_ENV,
    SECRET_CLIENT_KEY,
    SECRET_SERVER_KEY,
    SERVER_KEY_ENV,
)
from elastream.worker_inputs.secrets import DEFAULT_SECRETS_DIR

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


#: the environment variable carrying the operator's `PlacementPolicy` as JSON (the chart's worker.placement)
PLACEMENT_ENV = "ELASTREAM_WORKER_PLACEMENT"
#: the control plane's taints and node labels: a worker pod never tolerates nor selects them, whatever the policy
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True)
class AllowedToleration:
    """A toleration a topology may ask for: `key` and `value` are globs (`*` any characters) over the taint's key
    and the toleration's value, `effect` one effect or "" for any. A toleration of every value of a key
    (operator Exists) needs `value` "*"; one of every effect of a key (no effect) needs `effect` ""."""

    key: str
    value: str = "*"
    effect: str = ""

    def allows(self, key: str, value: str | None, effect: str) -> bool:
        """Whether this entry allows the toleration of `key` with `value` (None: operator Exists) and `effect`
        ("": every effect)."""
        if not fnmatch.fnmatchcase(key, self.key):
            return False
        if value is None and self.value != "*":
            return False
        if value is not None and not fnmatch.fnmatchcase(value, self.value):
            return False
        return self.effect in ("", effect)


#: tolerations every topology may have: how long its pods stay on a node that stopped answering (what the
#: DefaultTolerationSeconds admission gives every pod, 300 s); they never let a pod onto a node it could not use
DEFAULT_ALLOWED_TOLERATIONS = (
    AllowedToleration("node.kubernetes.io/not-ready", effect="NoExecute"),
    AllowedToleration("node.kubernetes.io/unreachable", effect="NoExecute"),
)
#: node labels every topology may select on: where a node is and what it is, never which node nor which pool
DEFAULT_NODE_SELECTOR_KEYS = (
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
)


@dataclass(frozen=True)
class PlacementPolicy:
    """What a topology's `spec.placement` may ask of the scheduler (the chart's worker.placement): tolerations
    each allowed by an `AllowedToleration`; nodeSelector keys, and the keys of node affinity's expressions and
    fields, matching a glob of `allowed_node_selector_keys`; `affinity` at all only with `allow_affinity`, and
    its pod (anti-)affinity only over the topology's own namespace (no namespaceSelector, no other namespace:
    a required anti-affinity over every namespace would keep other tenants' pods off the nodes it runs on).
    The control plane's taints and labels (`CONTROL_PLANE_KEYS`) and a toleration of every taint (no key) are
    refused whatever the lists say. topologySpreadConstraints only spread the topology's own pods: free."""

    allowed_tolerations: tuple[AllowedToleration, ...] = DEFAULT_ALLOWED_TOLERATIONS
    allowed_node_selector_keys: tuple[str, ...] = DEFAULT_NODE_SELECTOR_KEYS
    allow_affinity: bool = True

    @classmethod
    def from_json(cls, text: str) -> PlacementPolicy:
        """The policy of the chart's worker.placement as JSON (`{"allowedTolerations": [{"key", "value",
        "effect"}], "allowedNodeSelectorKeys": [...], "allowAffinity": true}`; a field not given keeps its
        default). Raises ValueError naming the field and the fix."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError("give a JSON object of allowedTolerations, allowedNodeSelectorKeys and allowAffinity")
        unknown = sorted(set(raw) - {"allowedTolerations", "allowedNodeSelectorKeys", "allowAffinity"})
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: unknown; use allowedTolerations, allowedNodeSelectorKeys, allowAffinity"
            )
        default = cls()
        tolerations = default.allowed_tolerations
        if "allowedTolerations" in raw:
            tolerations = tuple(_allowed_toleration(e, i) for i, e in enumerate(_listed(raw, "allowedTolerations")))
        keys = default.allowed_node_selector_keys
        if "allowedNodeSelectorKeys" in raw:
            keys = tuple(_listed(raw, "allowedNodeSelectorKeys"))
            for i, key in enumerate(keys):
                if not isinstance(key, str) or not key.strip():
                    raise ValueError(f"allowedNodeSelectorKeys[{i}]: {key!r}; give a node label key or a glob")
        affinity = raw.get("allowAffinity", default.allow_affinity)
        if not isinstance(affinity, bool):
            raise ValueError(f"allowAffinity: {affinity!r}; give true or false")
        return cls(tolerations, keys, affinity)

    def to_values(self) -> dict[str, Any]:
        """The policy in the chart's worker.placement shape (what `from_json` reads)."""
        return {
            "allowedTolerations": [
                {
                    "key": t.key,
                    **({"value": t.value} if t.value != "*" else {}),
                    **({"effect": t.effect} if t.effect else {}),
                }
                for t in self.allowed_tolerations
            ],
            "allowedNodeSelectorKeys": list(self.allowed_node_selector_keys),
            "allowAffinity": self.allow_affinity,
        }

    def key_allowed(self, key: str) -> bool:
        return key not in CONTROL_PLANE_KEYS and any(
            fnmatch.fnmatchcase(key, pattern) for pattern in self.allowed_node_selector_keys
        )


def _listed(raw: Mapping[str, Any], name: str) -> list[Any]:
    value = raw[name]
    if not isinstance(value, list):
        raise ValueError(f"{name}: {value!r} is not a list")
    return value


def _allowed_toleration(entry: Any, index: int) -> AllowedToleration:
    where = f"allowedTolerations[{index}]"
    if not isinstance(entry, dict) or not set(entry) <= {"key", "value", "effect"}:
        raise ValueError(f"{where}: {entry!r}; give an object of key (a glob), value (a glob) and effect")
    key, value, effect = entry.get("key"), entry.get("value", "*"), entry.get("effect", "")
    if not isinstance(key, str) or not key.strip():
        raise ValueError(
            f"{where}.key: {key!r}; give a taint key or a glob (a toleration of every taint is never allowed)"
        )
    if not isinstance(value, str):
        raise ValueError(f"{where}.value: {value!r}; give a glob (* any value)")
    if effect not in ("", *TAINT_EFFECTS):
        raise ValueError(f"{where}.effect: {effect!r}; give one of {', '.join(TAINT_EFFECTS)}, or none for any")
    return AllowedToleration(key, value, effect)


class PlacementRefused(BackendError):
    """A topology's spec.placement asks for what the operator's `PlacementPolicy` does not allow: no pod is
    created; the message names each field and the fix."""


#: at most this many refused fields in one message, and allowed entries shown in each
_MAX_SHOWN = 3


def _text(value: Any) -> str:
    """A name from the spec as a message shows it: as written when it is a short plain word, else its repr cut
    short (a tenant's text never floods nor breaks a condition's line)."""
    if isinstance(value, str) and 0 < len(value) <= 100 and value.isprintable() and " " not in value:
        return value
    return shown(value)


def _listing(items: Sequence[str], most: int = _MAX_SHOWN) -> str:
    listed = ", ".join(items[:most]) or "none"
    return listed + (f" and {len(items) - most} more" if len(items) > most else "")


def placement_problems(placement: Any, policy: PlacementPolicy, namespace: str) -> list[str]:
    """Why `placement` (a topology's spec.placement) may not reach its pods under `policy`: one line per
    refused field, naming it and the fix; empty when it may. `namespace` is the topology's (its pods')."""
    if not isinstance(placement, Mapping):
        return []
    problems: list[str] = []
    tolerations = placement.get("tolerations")
    if tolerations is not None:
        if not isinstance(tolerations, list):
            problems.append("spec.placement.tolerations: is not a list; write it as in a Pod")
        else:
            for i, toleration in enumerate(tolerations):
                problems.extend(_toleration_problems(toleration, f"spec.placement.tolerations[{i}]", policy))
    selector = placement.get("nodeSelector")
    if selector is not None:
        if not isinstance(selector, Mapping):
            problems.append("spec.placement.nodeSelector: is not a mapping; write it as in a Pod")
        else:
            for key in selector:
                problems.extend(_node_key_problems(key, f"spec.placement.nodeSelector[{_text(key)}]", policy))
    affinity = placement.get("affinity")
    if affinity is not None:
        if not policy.allow_affinity:
            problems.append(
                "spec.placement.affinity: the operator allows no affinity (worker.placement.allowAffinity: false); "
                "remove it (spec.placement.nodeSelector on an allowed label places pods too)"
            )
        else:
            problems.extend(_affinity_problems(affinity, namespace, policy))
    return problems


def _toleration_problems(toleration: Any, where: str, policy: PlacementPolicy) -> list[str]:
    if not isinstance(toleration, Mapping):
        return [f"{where}: is not a toleration; write it as in a Pod (key, operator, value, effect)"]
    key, operator, value, effect = (toleration.get(k) for k in ("key", "operator", "value", "effect"))
    if not all(v is None or isinstance(v, str) for v in (key, operator, value, effect)):
        return [f"{where}: key, operator, value and effect must be strings; write it as in a Pod"]
    if not key:
        return [
            f"{where}: tolerates every taint (no key), the control plane's too; name the taint's key, one the "
            "operator allows (worker.placement.allowedTolerations)"
        ]
    if key in CONTROL_PLANE_KEYS:
        return [f"{where}: tolerates the control plane's taint {key}; worker pods never run there: remove it"]
    exists = operator == "Exists"
    if any(entry.allows(key, None if exists else (value or ""), effect or "") for entry in policy.allowed_tolerations):
        return []
    asked = f"{_text(key)}{'' if exists else '=' + _text(value or '')}:{_text(effect) if effect else '(every effect)'}"
    allowed = [
        f"{e.key}{'' if e.value == '*' else '=' + e.value}:{e.effect or '*'}" for e in policy.allowed_tolerations
    ]
    return [
        f"{where}: the toleration {asked} is not one the operator allows (worker.placement.allowedTolerations: "
        f"{_listing(allowed)}); remove it, or have the operator's list extended"
    ]


def _node_key_problems(key: Any, where: str, policy: PlacementPolicy) -> list[str]:
    if not isinstance(key, str):
        return [f"{where}: is not a node label key; write it as in a Pod"]
    if key in CONTROL_PLANE_KEYS:
        return [f"{where}: selects the control plane's nodes ({key}); worker pods never run there: remove it"]
    if policy.key_allowed(key):
        return []
    return [
        f"{where}: the node label {_text(key)} is not one the operator allows selecting on "
        f"(worker.placement.allowedNodeSelectorKeys: {_listing(list(policy.allowed_node_selector_keys))}); remove "
        "it, or have the operator's list extended"
    ]


def _affinity_problems(affinity: Any, namespace: str, policy: PlacementPolicy) -> list[str]:
    """Node affinity's keys as nodeSelector's; pod (anti-)affinity over the topology's own namespace only."""
    where = "spec.placement.affinity"
    if not isinstance(affinity, Mapping):
        return [f"{where}: is not a mapping; write it as in a Pod"]
    problems: list[str] = []
    node = affinity.get("nodeAffinity")
    if node is not None:
        at = f"{where}.nodeAffinity"
        required = [
            (f"{at}.{_REQUIRED}.nodeSelectorTerms[{i}]", t)
            for i, t in _each(_field(node, _REQUIRED), "nodeSelectorTerms")
        ]
        for path, term in required + _preferred(node, at, "preference"):
            for part in ("matchExpressions", "matchFields"):
                for j, expression in enumerate(_items(_field(term, part))):
                    problems.extend(_node_key_problems(_field(expression, "key"), f"{path}.{part}[{j}].key", policy))
    for kind in ("podAffinity", "podAntiAffinity"):
        pods = affinity.get(kind)
        at = f"{where}.{kind}"
        required = [(f"{at}.{_REQUIRED}[{i}]", t) for i, t in enumerate(_items(_field(pods, _REQUIRED)))]
        for path, term in required + _preferred(pods, at, "podAffinityTerm"):
            if _field(term, "namespaceSelector") is not None:
                problems.append(
                    f"{path}.namespaceSelector: reaches pods of other namespaces; remove it (a worker's pod affinity "
                    f"may only name pods of its own namespace, {namespace})"
                )
            for name in _items(_field(term, "namespaces")):
                if name != namespace:
                    problems.append(
                        f"{path}.namespaces: names {shown(name)}, another namespace; name only {namespace} (a worker's "
                        "pod affinity may only name pods of its own namespace)"
                    )
    return problems


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _each(obj: Any, key: str) -> list[tuple[int, Any]]:
    return list(enumerate(_items(_field(obj, key))))


def _preferred(block: Any, at: str, inner: str) -> list[tuple[str, Any]]:
    """(path, term) of each preferred term of an affinity `block` (its `inner` field: preference, podAffinityTerm)."""
    return [(f"{at}.{_PREFERRED}[{i}].{inner}", _field(p, inner)) for i, p in _each(block, _PREFERRED)]


def _field(obj: Any, key: str) -> Any:
    """`obj[key]` of a mapping, None otherwise (a malformed affinity is the API server's to refuse)."""
    return obj.get(key) if isinstance(obj, Mapping) else None


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


# ---------------------------------------------------------------------------------------------- spec.podTemplate

#: the environment variable carrying the operator's `PodTemplatePolicy` as JSON (the chart's worker.podTemplate)
POD_TEMPLATE_ENV = "ELASTREAM_WORKER_POD_TEMPLATE"
#: where the Secret a connector's `secretRef` names is mounted in every worker pod of its topology, read-only:
#: `<SECRETS_DIR>/<Secret>/<key>` (what `elastream.worker_inputs.secrets` reads, $ELASTREAM_SECRETS_DIR's default)
SECRETS_DIR = DEFAULT_SECRETS_DIR
#: the files of those mounts: the worker (runAsUser and fsGroup WORKER_UID) reads them through its group; nobody
#: writes them
SECRET_MODE = 0o440
#: the operator's volumes and where the worker container mounts them (the connectors' Secrets under the first);
#: a tenant's volume is never named like them, nor mounted at, under or above them
OPERATOR_VOLUMES = ("topology", "tmp")
OPERATOR_VOLUME_PREFIX = "elastream-"
OPERATOR_MOUNT_PATHS = ("/etc/elastream", "/tmp")
#: every volume type of a Pod (`VolumeSource`'s fields), and the two never allowed whatever the policy says: a
#: node's own files (hostPath), and a git clone the kubelet runs on the node (gitRepo, deprecated, CVE-2024-10220)
VOLUME_TYPES = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi", "downwardAPI",
    "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs", "hostPath",
    "image", "iscsi", "nfs", "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume", "projected",
    "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume",
)  # fmt: skip
NEVER_VOLUME_TYPES = {"hostPath": "a node's own files", "gitRepo": "a git clone the kubelet runs on the node"}
#: what the default policy allows: the namespace's own ConfigMaps and Secrets, scratch space, the pod's own fields
DEFAULT_VOLUME_TYPES = ("configMap", "secret", "emptyDir", "projected", "downwardAPI")
#: where a tenant's volumes may be mounted by default: never over the image's code, libraries or /etc
DEFAULT_MOUNT_PATHS = ("/mnt/*", "/data/*")
#: the sources a projected volume may combine (serviceAccountToken only with an allowed serviceAccountName)
PROJECTED_SOURCES = ("configMap", "secret", "downwardAPI", "serviceAccountToken", "clusterTrustBundle")
#: environment variables the operator sets or keeps for itself: never a tenant's
OPERATOR_ENV = ("ELASTREAM_*", "POD_IP", "POD_NAME")
#: environment variables that change what code the image runs (a preloaded library, a Python path, a JVM agent,
#: the PATH the entrypoint is looked up in): never a tenant's, or `worker.allowedImages` would mean nothing
CODE_ENV = (
    "LD_*", "PYTHON*", "PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "BASH_ENV", "ENV",
    "NODE_OPTIONS", "NODE_PATH", "PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT", "RUBYLIB", "GCONV_PATH",
    "GLIBC_TUNABLES",
)  # fmt: skip
#: the PYTHON* variables that change no code: a tenant may set them
HARMLESS_PYTHON_ENV = (
    "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8",
    "PYTHONFAULTHANDLER",
)  # fmt: skip
#: label and annotation key prefixes (DNS domains, and their subdomains) that are the operator's or Kubernetes':
#: never a tenant's (an AppArmor profile is an annotation of kubernetes.io's); app.kubernetes.io labels other than
#: the operator's own (part-of, version) are the tenant's
RESERVED_KEY_DOMAINS = ("elastream.dev", "kubernetes.io", "k8s.io")
#: the labels the operator puts on every worker pod (`labels_for`): its own, whatever a template says
OPERATOR_LABEL_KEYS = (
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by", "elastream.dev/node",
)  # fmt: skip
#: the fields of spec.podTemplate
POD_TEMPLATE_FIELDS = (
    "labels", "annotations", "env", "envFrom", "volumes", "volumeMounts", "serviceAccountName", "priorityClassName",
)  # fmt: skip
#: the entries of an operator's list a refusal shows (they are the platform team's, and short)
_MOST_ALLOWED = 8
#: a tenant's volume source (the CRD keeps its fields as written) is at most this big, as JSON
MAX_VOLUME_JSON = 8192
#: the name of a Secret the operator keeps for every topology (`<topology>-redis`: its Redis password and data
#: plane keys): no tenant's reference may name one, its own topology's or another's
OPERATOR_SECRET_SUFFIX = "-redis"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class PodTemplatePolicy:
    """What a topology's `spec.podTemplate` may add to its worker pods (the chart's worker.podTemplate): volumes
    of `allowed_volume_types` (never hostPath nor gitRepo) mounted at paths matching a glob of
    `allowed_mount_paths`, a serviceAccountName and a priorityClassName matching a glob of their lists (empty:
    none may be set), label and annotation keys matching a glob of theirs. Whatever the lists say, the operator's
    and Kubernetes' label and annotation keys, the operator's environment variables and those that change what
    code the image runs, mounts at, under or above the operator's paths, priority classes `system-*`, a Secret
    named `<topology>-redis`, and an envFrom without a prefix are refused (`pod_template_problems`)."""

    allowed_volume_types: tuple[str, ...] = DEFAULT_VOLUME_TYPES
    allowed_mount_paths: tuple[str, ...] = DEFAULT_MOUNT_PATHS
    allowed_service_accounts: tuple[str, ...] = ()
    allowed_priority_classes: tuple[str, ...] = ()
    allowed_label_keys: tuple[str, ...] = ("*",)
    allowed_annotation_keys: tuple[str, ...] = ("*",)

    #: the chart's names of the fields, in order
    _FIELDS = (
        ("allowedVolumeTypes", "allowed_volume_types"),
        ("allowedMountPaths", "allowed_mount_paths"),
        ("allowedServiceAccounts", "allowed_service_accounts"),
        ("allowedPriorityClasses", "allowed_priority_classes"),
        ("allowedLabelKeys", "allowed_label_keys"),
        ("allowedAnnotationKeys", "allowed_annotation_keys"),
    )

    @classmethod
    def from_json(cls, text: str) -> PodTemplatePolicy:
        """The policy of the chart's worker.podTemplate as JSON (`{"allowedVolumeTypes": [...],
        "allowedMountPaths": [...], "allowedServiceAccounts": [...], "allowedPriorityClasses": [...],
        "allowedLabelKeys": [...], "allowedAnnotationKeys": [...]}`; a field not given keeps its default). Raises
        ValueError naming the field and the fix."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        names = [name for name, _ in cls._FIELDS]
        if not isinstance(raw, dict):
            raise ValueError(f"give a JSON object of {', '.join(names)}")
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise ValueError(f"{', '.join(map(str, unknown))}: unknown; use {', '.join(names)}")
        values: dict[str, tuple[str, ...]] = {}
        for name, attribute in cls._FIELDS:
            if name not in raw:
                continue
            entries = _listed(raw, name)
            for i, entry in enumerate(entries):
                if not isinstance(entry, str) or not entry.strip() or any(c.isspace() for c in entry):
                    raise ValueError(f"{name}[{i}]: {entry!r}; give a name or a glob (* any characters)")
            values[attribute] = tuple(entries)
        for i, kind in enumerate(values.get("allowed_volume_types", ())):
            if kind in NEVER_VOLUME_TYPES:
                raise ValueError(
                    f"allowedVolumeTypes[{i}]: {kind} is never allowed ({NEVER_VOLUME_TYPES[kind]}); remove it"
                )
            if kind not in VOLUME_TYPES:
                raise ValueError(f"allowedVolumeTypes[{i}]: {kind!r} is no volume type of a Pod; give e.g. configMap")
        for i, path in enumerate(values.get("allowed_mount_paths", ())):
            if not path.startswith("/") or path.strip("/*") == "":
                raise ValueError(
                    f"allowedMountPaths[{i}]: {path!r}; give an absolute path or glob below / (e.g. /mnt/*), never / "
                    "itself (the image's code and libraries are there)"
                )
        return cls(**values)

    def to_values(self) -> dict[str, Any]:
        """The policy in the chart's worker.podTemplate shape (what `from_json` reads)."""
        return {name: list(getattr(self, attribute)) for name, attribute in self._FIELDS}


class PodTemplateRefused(BackendError):
    """A topology's spec.podTemplate (or a connector's secretRef) asks for what the operator's
    `PodTemplatePolicy` does not allow: no pod is created; the message names each field and the fix, never a
    value (an env value or an annotation may hold a secret)."""


def _allowed(entries: Sequence[str]) -> str:
    """An operator's list as a refusal shows it (the platform team's, and short: up to 8 entries)."""
    return _listing(list(entries), _MOST_ALLOWED)


def _matches(name: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in globs)


def _reserved_key(key: str) -> bool:
    """A label or annotation key of the operator's or Kubernetes' domains (app.kubernetes.io aside)."""
    domain = key.rsplit("/", 1)[0] if "/" in key else ""
    if domain == "app.kubernetes.io":
        return False
    return any(domain == d or domain.endswith("." + d) for d in RESERVED_KEY_DOMAINS)


def _qualified(key: str) -> bool:
    """A label or annotation key as Kubernetes takes it: [prefix/]name, prefix a DNS subdomain."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(_QUALIFIED_NAME.fullmatch(name))


def _env_refusal(name: str) -> str | None:
    """Why a tenant may not set the environment variable `name` (None: it may)."""
    if _matches(name, OPERATOR_ENV):
        return "is the operator's (ELASTREAM_*, POD_IP, POD_NAME)"
    if _matches(name, CODE_ENV) and name not in HARMLESS_PYTHON_ENV:
        return "changes what code the worker image runs (a library, a path, an agent)"
    return None


def _prefix_refusal(prefix: str) -> str | None:
    """Why an envFrom `prefix` could make a variable a tenant may not set (None: every name it makes is free)."""
    for pattern in (*OPERATOR_ENV, *CODE_ENV):
        stem = pattern[:-1] if pattern.endswith("*") else None
        if stem is not None and (prefix.startswith(stem) or stem.startswith(prefix)):
            return f"names made with it could be {pattern}"
        if stem is None and pattern.startswith(prefix) and pattern != prefix:
            return f"a key could make it {pattern}"
    return None


def _operator_secret(name: Any) -> bool:
    return isinstance(name, str) and name.endswith(OPERATOR_SECRET_SUFFIX)


def _secret_refusal(where: str, name: str) -> str:
    return (
        f"{where}: names the Secret {_text(name)}; a Secret named <topology>{OPERATOR_SECRET_SUFFIX} is the "
        "operator's (a topology's Redis password and data-plane keys): name a Secret of your own"
    )


def _path_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def connector_secrets(spec: Mapping[str, Any]) -> list[str]:
    """The Secrets the topology's sources and sinks name (`secretRef.name`), each once, sorted: mounted in every
    worker pod at `SECRETS_DIR/<name>/`."""
    names: set[str] = set()
    for vertex in _items(spec.get("vertices")):
        for kind in ("source", "sink"):
            ref = _field(_field(vertex, kind), "secretRef")
            name = _field(ref, "name")
            if isinstance(name, str) and name:
                names.add(name)
    return sorted(names)


def pod_template_problems(spec: Any, settings: WorkerPodSettings) -> list[str]:
    """Why a topology's spec.podTemplate, or a Secret its connectors' secretRef name, may not reach its pods under
    `settings.pod_template`: one line per refused field, naming it and the fix (never a value: an env value or an
    annotation may hold a secret); empty when they may. `spec` is the topology's whole spec."""
    if not isinstance(spec, Mapping):
        return []
    problems: list[str] = []
    for i, vertex in enumerate(_items(spec.get("vertices"))):
        for kind in ("source", "sink"):
            name = _field(_field(_field(vertex, kind), "secretRef"), "name")
            if _operator_secret(name):
                problems.append(_secret_refusal(f"spec.vertices[{i}].{kind}.secretRef.name", name))
    template = spec.get("podTemplate")
    if template is None:
        return problems
    where = "spec.podTemplate"
    if not isinstance(template, Mapping):
        return [*problems, f"{where}: is not a mapping; give {', '.join(POD_TEMPLATE_FIELDS)}"]
    policy = settings.pod_template
    for key in template:
        if key not in POD_TEMPLATE_FIELDS:
            problems.append(
                f"{where}.{_text(key)}: not a field the operator takes (containers, securityContext, image and "
                f"resources are the operator's); use {', '.join(POD_TEMPLATE_FIELDS)}"
            )
    reserved_labels = {*OPERATOR_LABEL_KEYS, *settings.extra_labels}
    for field_name, allowed, setting in (
        ("labels", policy.allowed_label_keys, "allowedLabelKeys"),
        ("annotations", policy.allowed_annotation_keys, "allowedAnnotationKeys"),
    ):
        problems.extend(_key_problems(template.get(field_name), field_name, allowed, setting, reserved_labels))
    problems.extend(_env_problems(template.get("env")))
    problems.extend(_env_from_problems(template.get("envFrom")))
    service_account = template.get("serviceAccountName")
    account_ok = False
    if service_account is not None:
        at = f"{where}.serviceAccountName"
        if not isinstance(service_account, str) or not _DNS_SUBDOMAIN.fullmatch(service_account):
            problems.append(f"{at}: is not a ServiceAccount's name; give a DNS-1123 name")
        elif not _matches(service_account, policy.allowed_service_accounts):
            problems.append(
                f"{at}: {_text(service_account)} is not a ServiceAccount the operator lets worker pods run as "
                f"(worker.podTemplate.allowedServiceAccounts: {_allowed(policy.allowed_service_accounts)}); "
                "remove it, or have the operator's list extended"
            )
        else:
            account_ok = True
    volumes, volume_problems = _volume_problems(template.get("volumes"), policy, account_ok)
    problems.extend(volume_problems)
    problems.extend(_mount_problems(template.get("volumeMounts"), volumes, policy))
    priority = template.get("priorityClassName")
    if priority is not None:
        at = f"{where}.priorityClassName"
        if not isinstance(priority, str) or not _DNS_SUBDOMAIN.fullmatch(priority):
            problems.append(f"{at}: is not a PriorityClass's name; give a DNS-1123 name")
        elif priority.startswith("system-"):
            problems.append(
                f"{at}: {_text(priority)} is Kubernetes' own (system-*); worker pods never take it: remove it"
            )
        elif not _matches(priority, policy.allowed_priority_classes):
            problems.append(
                f"{at}: {_text(priority)} is not a PriorityClass the operator allows (worker.podTemplate."
                f"allowedPriorityClasses: {_allowed(policy.allowed_priority_classes)}); remove it, or have "
                "the operator's list extended"
            )
    return problems


def _key_problems(mapping: Any, field_name: str, allowed: Sequence[str], setting: str, reserved: set[str]) -> list[str]:
    where = f"spec.podTemplate.{field_name}"
    if mapping is None:
        return []
    if not isinstance(mapping, Mapping):
        return [f"{where}: is not a mapping of keys to strings; write it as in a Pod's metadata"]
    problems: list[str] = []
    for key, value in mapping.items():
        at = f"{where}[{_text(key)}]"
        if not isinstance(key, str) or not _qualified(key):
            problems.append(f"{at}: is not a {field_name[:-1]} key; give [prefix/]name as Kubernetes takes it")
        elif key in reserved or _reserved_key(key):
            problems.append(
                f"{at}: the key is the operator's or Kubernetes' (elastream.dev, kubernetes.io, k8s.io); remove it"
            )
        elif not _matches(key, allowed):
            problems.append(
                f"{at}: the key is not one the operator allows (worker.podTemplate.{setting}: "
                f"{_allowed(allowed)}); remove it, or have the operator's list extended"
            )
        elif not isinstance(value, str) or (field_name == "labels" and not _LABEL_VALUE.fullmatch(value)):
            # the value is never shown: an annotation may hold anything
            problems.append(f"{at}: the value is not a valid {field_name[:-1]} value; give a string as in a Pod")
    return problems


def _env_problems(env: Any) -> list[str]:
    where = "spec.podTemplate.env"
    if env is None:
        return []
    if not isinstance(env, list):
        return [f"{where}: is not a list; write it as a container's env"]
    problems: list[str] = []
    for i, entry in enumerate(env):
        at = f"{where}[{i}]"
        name = _field(entry, "name")
        if not isinstance(entry, Mapping) or not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            problems.append(f"{at}: is not an environment variable; give a name and a value or valueFrom")
            continue
        refusal = _env_refusal(name)
        if refusal is not None:
            problems.append(f"{at}.name: {_text(name)} {refusal}; name the variable otherwise")
        source = entry.get("valueFrom")
        secret = _field(_field(source, "secretKeyRef"), "name")
        if _operator_secret(secret):
            problems.append(_secret_refusal(f"{at}.valueFrom.secretKeyRef.name", secret))
        container = _field(_field(source, "resourceFieldRef"), "containerName")
        if container not in (None, "", "worker"):
            problems.append(f"{at}.valueFrom.resourceFieldRef.containerName: the pod has one container, worker")
    return problems


def _env_from_problems(env_from: Any) -> list[str]:
    where = "spec.podTemplate.envFrom"
    if env_from is None:
        return []
    if not isinstance(env_from, list):
        return [f"{where}: is not a list; write it as a container's envFrom"]
    problems: list[str] = []
    for i, entry in enumerate(env_from):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping) or len({"configMapRef", "secretRef"} & set(entry)) != 1:
            problems.append(f"{at}: give one configMapRef or secretRef, and a prefix")
            continue
        prefix = entry.get("prefix")
        if not isinstance(prefix, str) or not prefix or not _ENV_NAME.fullmatch(prefix):
            problems.append(
                f"{at}.prefix: none; give one (e.g. APP_): the operator never reads what the "
                f"{'Secret' if 'secretRef' in entry else 'ConfigMap'} holds, and a key such as LD_PRELOAD or "
                "PYTHONPATH would change what code the worker image runs"
            )
        elif (refusal := _prefix_refusal(prefix)) is not None:
            problems.append(f"{at}.prefix: {_text(prefix)}: {refusal}; choose another prefix (e.g. APP_)")
        secret = _field(entry.get("secretRef"), "name")
        if _operator_secret(secret):
            problems.append(_secret_refusal(f"{at}.secretRef.name", secret))
    return problems


def _volume_problems(volumes: Any, policy: PodTemplatePolicy, account_ok: bool) -> tuple[set[str], list[str]]:
    """(the names of the tenant's volumes that may be mounted, the problems of spec.podTemplate.volumes)."""
    where = "spec.podTemplate.volumes"
    if volumes is None:
        return set(), []
    if not isinstance(volumes, list):
        return set(), [f"{where}: is not a list; write it as a Pod's volumes"]
    names: set[str] = set()
    problems: list[str] = []
    for i, volume in enumerate(volumes):
        at = f"{where}[{i}]"
        name = _field(volume, "name")
        if not isinstance(volume, Mapping) or not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
            problems.append(f"{at}: is not a volume; give a name (a DNS-1123 label) and one volume type")
            continue
        if name in OPERATOR_VOLUMES or name.startswith(OPERATOR_VOLUME_PREFIX):
            problems.append(
                f"{at}.name: {name} is the operator's ({', '.join(OPERATOR_VOLUMES)}, {OPERATOR_VOLUME_PREFIX}*); "
                "name the volume otherwise"
            )
            continue
        if name in names:
            problems.append(f"{at}.name: {name} is a volume's name already; give each volume its own")
            continue
        kinds = [k for k in volume if k != "name"]
        if len(kinds) != 1:
            problems.append(f"{at}: give exactly one volume type (configMap, secret, emptyDir, ...)")
            continue
        (kind,) = kinds
        source = volume[kind]
        if kind in NEVER_VOLUME_TYPES:
            problems.append(
                f"{at}.{kind}: never allowed ({NEVER_VOLUME_TYPES[kind]}); use a configMap, a secret or an emptyDir"
            )
            continue
        if kind not in policy.allowed_volume_types:
            problems.append(
                f"{at}.{_text(kind)}: not a volume type the operator allows (worker.podTemplate.allowedVolumeTypes: "
                f"{_allowed(policy.allowed_volume_types)}); remove it, or have the operator's list extended"
            )
            continue
        if not isinstance(source, Mapping):
            problems.append(f"{at}.{kind}: is not a mapping; write it as in a Pod")
            continue
        if len(json.dumps(source, default=str)) > MAX_VOLUME_JSON:
            problems.append(f"{at}.{kind}: is over {MAX_VOLUME_JSON} bytes as JSON; write a smaller volume")
            continue
        source_problems = _source_problems(kind, source, f"{at}.{kind}", account_ok)
        problems.extend(source_problems)
        if not source_problems:
            names.add(name)
    return names, problems


def _source_problems(kind: str, source: Mapping[str, Any], at: str, account_ok: bool) -> list[str]:
    if kind == "secret" and _operator_secret(source.get("secretName")):
        return [_secret_refusal(f"{at}.secretName", source["secretName"])]
    if kind != "projected":
        return []
    problems: list[str] = []
    for j, projection in enumerate(_items(source.get("sources"))):
        kinds = list(projection) if isinstance(projection, Mapping) else []
        if len(kinds) != 1 or kinds[0] not in PROJECTED_SOURCES:
            problems.append(f"{at}.sources[{j}]: give one of {', '.join(PROJECTED_SOURCES)}")
        elif kinds[0] == "serviceAccountToken" and not account_ok:
            problems.append(
                f"{at}.sources[{j}].serviceAccountToken: worker pods hold no API token of their own unless "
                "spec.podTemplate.serviceAccountName names a ServiceAccount the operator allows; remove it"
            )
        elif kinds[0] == "secret" and _operator_secret(_field(projection["secret"], "name")):
            problems.append(_secret_refusal(f"{at}.sources[{j}].secret.name", projection["secret"]["name"]))
    return problems


def _mount_problems(mounts: Any, volumes: set[str], policy: PodTemplatePolicy) -> list[str]:
    where = "spec.podTemplate.volumeMounts"
    if mounts is None:
        return []
    if not isinstance(mounts, list):
        return [f"{where}: is not a list; write it as a container's volumeMounts"]
    problems: list[str] = []
    paths: set[str] = set()
    for i, mount in enumerate(mounts):
        at = f"{where}[{i}]"
        name, path = _field(mount, "name"), _field(mount, "mountPath")
        if not isinstance(name, str) or not isinstance(path, str):
            problems.append(f"{at}: is not a volume mount; give a name and a mountPath")
            continue
        if name not in volumes:
            problems.append(
                f"{at}.name: {_text(name)} is no volume of spec.podTemplate.volumes the operator takes; mount one"
            )
        segments = path.split("/")
        if not path.startswith("/") or not all(_PATH_SEGMENT.fullmatch(s) for s in segments[1:]):
            problems.append(f"{at}.mountPath: {_text(path)}; give an absolute path without ., .. or //")
            continue
        if any(_path_under(path, root) or _path_under(root, path) for root in OPERATOR_MOUNT_PATHS):
            problems.append(
                f"{at}.mountPath: {_text(path)} is at, under or above the operator's mounts "
                f"({', '.join(OPERATOR_MOUNT_PATHS)}); mount it elsewhere, e.g. under /mnt/"
            )
        elif not _matches(path, policy.allowed_mount_paths):
            problems.append(
                f"{at}.mountPath: {_text(path)} is not where the operator lets volumes be mounted (worker.podTemplate."
                f"allowedMountPaths: {_allowed(policy.allowed_mount_paths)}); mount it there, or have the "
                "operator's list extended"
            )
        elif path in paths:
            problems.append(f"{at}.mountPath: {_text(path)} is mounted already; give each mount its own path")
        paths.add(path)
        sub_path = _field(mount, "subPath")
        if sub_path not in (None, "") and (
            not isinstance(sub_path, str) or not all(_PATH_SEGMENT.fullmatch(s) for s in sub_path.split("/"))
        ):
            problems.append(f"{at}.subPath: {_text(sub_path)}; give a relative path without ., .. or //")
    return problems


def merge_pod_template(pod: Mapping[str, Any], template: Any) -> dict[str, Any]:
    """The worker `pod` with a topology's spec.podTemplate merged in: its labels, annotations, env, envFrom,
    volumes, volumeMounts, serviceAccountName and priorityClassName, and nothing else of it. The operator's own
    win on any conflict: its labels and annotations, its environment (and every OPERATOR_ENV name), its volumes
    and their mount paths, its service account; image, resources and security contexts are not the template's
    to give. Pure: `pod` is not changed, nothing of the template is shared with the result. Call it on a
    template `pod_template_problems` passed: this only settles conflicts, it allows nothing."""
    merged = copy.deepcopy(dict(pod))
    if not isinstance(template, Mapping):
        return merged
    template = copy.deepcopy(dict(template))
    metadata, spec = merged["metadata"], merged["spec"]
    for key in ("labels", "annotations"):
        mine = template.get(key)
        if isinstance(mine, Mapping) and mine:
            metadata[key] = {**{k: v for k, v in mine.items() if isinstance(v, str)}, **(metadata.get(key) or {})}
    container = spec["containers"][0]
    env = container.setdefault("env", [])
    taken = {e.get("name") for e in env}
    env.extend(
        e
        for e in _items(template.get("env"))
        if isinstance(e, Mapping) and e.get("name") not in taken and not _matches(str(e.get("name")), OPERATOR_ENV)
    )
    env_from = [e for e in _items(template.get("envFrom")) if isinstance(e, Mapping)]
    if env_from:
        container["envFrom"] = env_from
    operator_volumes = {v["name"] for v in spec.get("volumes", [])}
    added = {
        v["name"]: v
        for v in _items(template.get("volumes"))
        if isinstance(v, Mapping) and isinstance(v.get("name"), str) and v["name"] not in operator_volumes
    }
    spec.setdefault("volumes", []).extend(added.values())
    mounts = container.setdefault("volumeMounts", [])
    operator_paths = [m["mountPath"] for m in mounts]
    mounts.extend(
        m
        for m in _items(template.get("volumeMounts"))
        if isinstance(m, Mapping)
        and m.get("name") in added
        and isinstance(m.get("mountPath"), str)
        and not any(_path_under(m["mountPath"], p) or _path_under(p, m["mountPath"]) for p in operator_paths)
    )
    for key in ("serviceAccountName", "priorityClassName"):
        if isinstance(template.get(key), str) and not spec.get(key):
            spec[key] = template[key]
    return merged


def connector_secret_volumes(spec: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volume mounts) of the Secrets the topology's connectors name: one volume per distinct Secret
    (`elastream-secret-<i>`, mode SECRET_MODE, not optional: a pod whose Secret is missing waits for it, as
    the kubelet says in its events), mounted read-only at `SECRETS_DIR/<name>`. The operator never reads them."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, name in enumerate(connector_secrets(spec)):
        volume = f"{OPERATOR_VOLUME_PREFIX}secret-{i}"
        volumes.append({"name": volume, "secret": {"secretName": name, "defaultMode": SECRET_MODE, "optional": False}})
        mounts.append({"name": volume, "mountPath": f"{SECRETS_DIR}/{name}", "readOnly": True})
    return volumes, mounts


@dataclass(frozen=True)
class WorkerPodSettings:
    """What the operator decides for every worker pod (the rest comes from the topology's spec)."""

    image: str = DEFAULT_WORKER_IMAGE
    image_pull_policy: str = "IfNotPresent"
    #: names of Secrets (in the topology's namespace) the kubelet pulls the worker image with
    image_pull_secrets: tuple[str, ...] = ()
    log_level: str = "INFO"
    #: the workers' log lines: text or json ($ELASTREAM_LOG_FORMAT in their env; the operator's `--log-format`)
    log_format: str = "text"
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
    #: what a topology's spec.placement may ask for (the chart's worker.placement)
    placement: PlacementPolicy = field(default_factory=PlacementPolicy)
    #: what a topology's spec.podTemplate may add to its pods (the chart's worker.podTemplate)
    pod_template: PodTemplatePolicy = field(default_factory=PodTemplatePolicy)


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
    secret_volumes, secret_mounts = connector_secret_volumes(spec)
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
            {"name": "ELASTREAM_LOG_FORMAT", "value": settings.log_format},
            # where the connectors' Secrets are mounted, said in the env so a runtime that moves mounts (the test
            # tier's process mode) can point the worker at them
            {"name": "ELASTREAM_SECRETS_DIR", "value": SECRETS_DIR},
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
            *secret_mounts,
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
            *secret_volumes,
        ],
    }
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in settings.image_pull_secrets]
    placement = spec.get("placement")
    if isinstance(placement, Mapping):
        # every worker pod passes here, whatever made its spec (the resource, the ConfigMap an upgrade reads)
        refused = placement_problems(placement, settings.placement, topology.namespace)
        if refused:
            more = f" (and {len(refused) - _MAX_SHOWN} more)" if len(refused) > _MAX_SHOWN else ""
            raise PlacementRefused(f"{'; '.join(refused[:_MAX_SHOWN])}{more}")
        for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
            if key in placement:
                pod_spec[key] = placement[key]
    # likewise spec.podTemplate and the connectors' Secrets (as the reconcile pass checks them: InvalidSpec)
    refused = pod_template_problems(spec, settings)
    if refused:
        more = f" (and {len(refused) - _MAX_SHOWN} more)" if len(refused) > _MAX_SHOWN else ""
        raise PodTemplateRefused(f"{'; '.join(refused[:_MAX_SHOWN])}{more}")
    if spec.get("spreadOverNodes") and "topologySpreadConstraints" not in pod_spec:
        pod_spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": labels_for(topology)},
            }
        ]
    pod = {
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
    template = spec.get("podTemplate")
    return merge_pod_template(pod, template) if isinstance(template, Mapping) else pod


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
