"""One StreamTopology resource through the Kubernetes API, as the reconcile loop reaches it: the resource as a
`Topology`, its status subresource and `spec.nodes` (`ResourceApi`), core/v1 Events on it
(`KubernetesEvents`), and `NoRequests` (on Kubernetes a scale request is a change of the spec)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastream.core.ports import Clock, CoreApi, CustomObjectsApi, ScaleRequest, SystemClock
from elastream.core.topology import (
    API_VERSION,
    Topology,
    parse_manifest,
)

log = logging.getLogger("elastream.operator")


GROUP, VERSION = API_VERSION.split("/")
PLURAL = "streamtopologies"


def topology_from_resource(body: Mapping[str, Any]) -> Topology:
    """The resource as a `Topology` (raises `TopologyError` naming each field and fix)."""
    metadata = body.get("metadata") or {}
    document = {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", "StreamTopology"),
        "metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace", "default")},
        "spec": dict(body.get("spec") or {}),
    }
    return parse_manifest(document)


#: the field manager of the autoscaler's writes of spec.nodes (metadata.managedFields): a GitOps tool told to
#: ignore what it manages (Argo CD's ignoreDifferences.managedFieldsManagers) leaves the autoscaler's count alone
AUTOSCALER_FIELD_MANAGER = "elastream-autoscaler"


@dataclass
class ResourceApi:
    """One StreamTopology through the API: its status subresource (merge patches, the status writer's
    `send`) and `spec.nodes` (the autoscaler's writes)."""

    api: CustomObjectsApi
    namespace: str
    name: str
    #: seconds any one request may take (the API server away must not hold a reconcile for long)
    timeout_s: float = 10.0

    def patch_status(self, patch: dict[str, Any]) -> None:
        """Apply a merge patch to the status (a resource deleted meanwhile: nothing to report to)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                {"status": patch},
                _request_timeout=self.timeout_s,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def remove_annotation(self, key: str) -> None:
        try:
            self.api.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                {"metadata": {"annotations": {key: None}}},
                _request_timeout=self.timeout_s,
            )
        except Exception as exc:
            log.warning("annotation %s of %s/%s not removed: %s", key, self.namespace, self.name, exc)

    def patch_spec_nodes(self, nodes: int) -> int:
        """Write an automatic change to `spec.nodes`, as a HorizontalPodAutoscaler writes replicas: the spec
        stays the desired state. Returns the resource's new generation (0 if it could not be written)."""
        from kubernetes.client.exceptions import ApiException

        try:
            updated = self.api.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                {"spec": {"nodes": int(nodes)}},
                field_manager=AUTOSCALER_FIELD_MANAGER,
                _request_timeout=self.timeout_s,
            )
        except Exception as exc:  # the next reconcile sees spec.nodes unchanged and moves back: say why
            if not (isinstance(exc, ApiException) and exc.status == 404):
                log.warning("spec.nodes of %s/%s not patched: %s", self.namespace, self.name, exc)
            return 0
        return int(((updated or {}).get("metadata") or {}).get("generation") or 0)


class KubernetesEvents:
    """An `EventSink` posting core/v1 Events on the resource (what `kubectl describe` shows). The same fact
    (reason and message) is not posted again within `repeat_s`; it is counted instead."""

    def __init__(
        self, core_api: CoreApi, body: Mapping[str, Any], repeat_s: float = 300.0, clock: Clock | None = None
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        metadata = body["metadata"]
        self.core_api = core_api
        self.namespace = metadata.get("namespace", "default")
        self.involved = {
            "apiVersion": body.get("apiVersion", API_VERSION),
            "kind": body.get("kind", "StreamTopology"),
            "name": metadata["name"],
            "namespace": self.namespace,
            "uid": metadata.get("uid"),
        }
        self.repeat_s = repeat_s
        self.recent: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        now = self.clock.monotonic()
        with self._lock:
            if now - self.recent.get((reason, message), -1e9) < self.repeat_s:
                return
            self.recent[(reason, message)] = now
        # the Event's time is written down: the clock's wall time (`Clock.now`), in UTC to the second
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock.now()))
        event = {
            "metadata": {"generateName": f"{self.involved['name']}.", "namespace": self.namespace},
            "involvedObject": self.involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "elastream-operator"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        log.log(
            logging.WARNING if warning else logging.INFO,
            "%s/%s %s: %s",
            self.namespace,
            self.involved["name"],
            reason,
            message,
        )
        try:
            self.core_api.create_namespaced_event(self.namespace, event)
        except Exception as exc:  # an event that cannot be posted must not stop the operation it reports
            log.warning("event %s not posted: %s", reason, exc)


@dataclass
class NoRequests:
    """On Kubernetes a request is a change of `spec.nodes`: the handler calls `scale_to` itself."""

    def take(self) -> ScaleRequest | None:
        return None
