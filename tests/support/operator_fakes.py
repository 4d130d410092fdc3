"""In-memory stand-ins for an operator serving many StreamTopology resources: the custom-objects API of several
resources (`InMemoryStreamTopologies`, what `tests/unit/test_reconciler.py`'s `FakeCustomApi` is for one), the
core API's events (`InMemoryEvents`), workers that are alive but never acknowledge a checkpoint
(`SilentWorkers`, a `support.fakes.FakeBackend`), and pods that never become ready (`UnreadyWorkers`, the
real `NodeBackend` over Redis with pods the scheduler cannot place).

Every call is thread-safe: the operator's reconcile passes run on a pool of threads."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from elastream.control.backends.nodes import NodeBackend
from support.fakes import FakeBackend


def apply_merge_patch(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 applied to `target` in place (a null deletes the key); returns `target`."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            apply_merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class InMemoryStreamTopologies:
    """StreamTopology resources as the API server keeps them: a status patch is merged into the stored status
    and kept with the time it arrived (`history`), a patch of the spec raises the generation (the autoscaler's
    write of spec.nodes), annotations are patched as metadata. Unknown resources answer 404."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._stored: dict[tuple[str, str], dict[str, Any]] = {}
        #: (namespace, name) -> [(when, the whole status after the patch)]
        self._history: dict[tuple[str, str], list[tuple[float, dict[str, Any]]]] = {}

    def add(self, body: Mapping[str, Any]) -> None:
        metadata = body["metadata"]
        with self._lock:
            key = (metadata.get("namespace", "default"), metadata["name"])
            self._stored[key] = copy.deepcopy(dict(body))
            self._history[key] = []

    def set_spec(self, namespace: str, name: str, spec: Mapping[str, Any]) -> int:
        """A user's change of the spec (`kubectl apply`): the generation moves on; returns it."""
        with self._lock:
            stored = self._stored[(namespace, name)]
            stored["spec"] = copy.deepcopy(dict(spec))
            stored["metadata"]["generation"] = int(stored["metadata"].get("generation") or 0) + 1
            return int(stored["metadata"]["generation"])

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._stored[(namespace, name)])

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get(namespace, name).get("status") or {}

    def history(self, namespace: str, name: str) -> list[tuple[float, dict[str, Any]]]:
        """Every status the resource had, with when it was written (`clock`), oldest first."""
        with self._lock:
            return list(self._history[(namespace, name)])

    def _found(self, namespace: str, name: str) -> dict[str, Any]:
        found = self._stored.get((namespace, name))
        if found is None:
            from kubernetes.client.exceptions import ApiException

            raise ApiException(status=404, reason="Not Found")
        return found

    def patch_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **_: Any
    ) -> dict[str, Any]:
        with self._lock:
            stored = self._found(namespace, name)
            status = apply_merge_patch(stored.setdefault("status", {}), body.get("status") or {})
            self._history[(namespace, name)].append((self.clock(), copy.deepcopy(status)))
            return copy.deepcopy(stored)

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **_: Any
    ) -> dict[str, Any]:
        with self._lock:
            stored = self._found(namespace, name)
            if body.get("spec"):
                apply_merge_patch(stored["spec"], body["spec"])
                stored["metadata"]["generation"] = int(stored["metadata"].get("generation") or 0) + 1
            apply_merge_patch(stored["metadata"], body.get("metadata") or {})
            return copy.deepcopy(stored)


class InMemoryEvents:
    """The core API's events (what `kubectl describe` would list), kept in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []

    def create_namespaced_event(self, namespace: str, body: Any) -> None:
        with self._lock:
            self.events.append(copy.deepcopy(body))

    def reasons(self, name: str) -> list[str]:
        with self._lock:
            return [e["reason"] for e in self.events if e["involvedObject"]["name"] == name]


class SilentWorkers(FakeBackend):
    """Workers that are alive and never acknowledge a checkpoint: nothing reads their control lists, so a
    round's barriers stay unanswered until its deadline."""

    def check_alive(self) -> None:
        return None


class UnreadyWorkers(NodeBackend):
    """The real `NodeBackend` (the schedule published in Redis, the readiness wait of `start`) whose worker
    pods are created and never become ready, as pods of an image that cannot be pulled are: pending, with
    the kubelet's reason, until the test ends them (`gone`: each wait ends then as a worker that died)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pods: set[str] = set()
        self.gone = threading.Event()
        #: set once a wait for these pods began (the start published its schedule and created them)
        self.waiting = threading.Event()

    def running_nodes(self) -> set[str]:
        return set(self._pods)

    def spawn(self, node: str, staged_version: int = 0) -> None:
        self._pods.add(node)

    def stop_nodes(self, nodes: Any) -> None:
        self._pods.difference_update(nodes)

    def release_nodes(self, nodes: Any) -> None:
        self._pods.difference_update(nodes)

    def stop_workers(self) -> None:
        self._pods.clear()

    def failed_nodes(self) -> dict[str, str]:
        if self.gone.is_set():
            return {n: f"pod of {n} deleted (the test is over)" for n in sorted(self._pods)}
        return {}

    def pending_nodes(self) -> dict[str, str]:
        self.waiting.set()
        return {n: f"pod of {n}: ImagePullBackOff (the image cannot be pulled)" for n in sorted(self._pods)}
