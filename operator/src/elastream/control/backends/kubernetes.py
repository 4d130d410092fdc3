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
drain (`control.controller_drains`) and its executors move off within the pod's terminationGracePeriodSeconds
(`WorkerPodSettings.termination_grace_s`); it is failed once its container stopped or the pod is gone while
its node is still in the schedule. The operator's own deletions send STOP first (no drain). With
`disruption_budget`, a PodDisruptionBudget `<topology>-workers` (maxUnavailable 1) lets evictions take one
worker at a time.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
import yaml

from elastream.control.backends.nodes import NodeBackend
from elastream.control.backends.worker_objects import (
    PREVIOUS_SPEC_KEY,
    REDIS_CA_KEY,
    SECRET_REDIS_PASSWORD,
    WORKER_REDIS_CA_PATH,
    WorkerPodSettings,
    api_message,
    config_map_name,
    disruption_budget_name,
    is_api_unavailable,
    is_owned_by,
    labels_for,
    manifest_document,
    network_policy_name,
    not_owned,
    object_field,
    owner_reference,
    pod_name,
    read_redis_ca,
    secret_name,
    selector_for,
    worker_disruption_budget,
    worker_network_policy,
    worker_pod,
)
from elastream.control.retrying import retry_within
from elastream.core.acl import topology_user
from elastream.core.ports import BackendError, Clock, CoreApi, NetworkingApi, NotOwned, PolicyApi
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology
from elastream.core.topology.limits import MigrationScope
from elastream.store.acl import UserKeeper, delete_topology_user, ensure_topology_user, topology_url
from elastream.store.registry import ca_file_of, client_for, with_ca_file
from elastream.store.retry import backoff
from elastream.worker_inputs.keys import (
    SECRET_CLIENT_KEY,
    SECRET_SERVER_KEY,
    generate_keys,
)

log = logging.getLogger("elastream.kubernetes")

#: how long a list of the topology's pods is reused (failure checks run every few ms during a migration)
POD_CACHE_S = 0.5
#: how long a pod's creation is retried while the API server is away or an old pod of ours holds its name
CREATE_WAIT_S = 60.0


class KubernetesBackend(NodeBackend):
    """Worker pods of one topology. `core` is a `kubernetes.client.CoreV1Api`; `owner` the topology's
    metadata (name, uid); `redis_url` goes into the topology's Secret for its workers."""

    def __init__(
        self,
        topology: Topology,
        client: redis.Redis,
        core: CoreApi,
        owner: Mapping[str, Any],
        redis_url: str,
        settings: WorkerPodSettings | None = None,
        start_timeout_s: float = 180.0,
        networking: NetworkingApi | None = None,
        topology_users: bool = True,
        user_keeper: UserKeeper | None = None,
        policy: PolicyApi | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(topology, client, start_timeout_s, clock)
        #: give the workers a Redis user of the topology's own (else the operator's URL, `redis_url`)
        self.topology_users = topology_users
        #: the password of that user, as the topology's Secret holds it (known once `ensure_config` ran)
        self._redis_password: str | None = None
        #: set the user unconditionally the first time (rules of an older operator are replaced)
        self._user_set = False
        #: `topology_connection`'s client (None until first used, and again once the workers are stopped)
        self._as_topology: redis.Redis | None = None
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
        metadata: dict[str, Any] = {
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
        held = dict(object_field(existing, "data", "data") or {}) if existing is not None else {}
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

    def topology_connection(self) -> redis.Redis | None:
        """A connection to Redis as the topology's own user (made on first use), for the operator's work that
        concerns this topology alone: a checkpoint's completion (`store.checkpoint_store.CheckpointStore.commit_as`),
        so Redis' ACLs hold it to the topology's keys. None without topology users, or before the password
        is known (`ensure_config`)."""
        if not self.topology_users or self._redis_password is None:
            return None
        if self._as_topology is None:
            user = topology_user(self.topology.namespace, self.topology.name)
            self._as_topology = client_for(topology_url(self.redis_url, user, self._redis_password))
        return self._as_topology

    def ensure_network_policy(self) -> None:
        """The topology's NetworkPolicy (with `settings.network_policy`), created or brought back to what it
        should be; one that is not the topology's raises `NotOwned` and is left alone."""
        if not self.settings.network_policy:
            return
        if self.networking is None:
            raise BackendError("network policies are on but the operator has no networking.k8s.io client")
        self._ensure(
            "NetworkPolicy",
            network_policy_name(self.topology),
            worker_network_policy(self.topology, self.owner, self.settings),
            self.networking.read_namespaced_network_policy,
            self.networking.create_namespaced_network_policy,
            self.networking.patch_namespaced_network_policy,
        )

    def ensure_disruption_budget(self) -> None:
        """The topology's PodDisruptionBudget (with `settings.disruption_budget` and a policy client), created or
        brought back to what it should be; one that is not the topology's raises `NotOwned`."""
        if not self.settings.disruption_budget or self.policy is None:
            return
        self._ensure(
            "PodDisruptionBudget",
            disruption_budget_name(self.topology),
            worker_disruption_budget(self.topology, self.owner),
            self.policy.read_namespaced_pod_disruption_budget,
            self.policy.create_namespaced_pod_disruption_budget,
            self.policy.patch_namespaced_pod_disruption_budget,
        )

    def _ensure(
        self,
        kind: str,
        name: str,
        body: dict[str, Any],
        read: Callable[..., Any],
        create: Callable[..., Any],
        patch: Callable[..., Any],
    ) -> None:
        """Create the object `name` of the topology's, or patch its spec back to `body`'s (`_read` checks that
        one found is the topology's first); an API refusal is a `BackendError` naming the object."""
        from kubernetes.client.exceptions import ApiException

        current = self._read(kind, read, name)
        try:
            if current is None:
                create(self.namespace, body)
            else:
                patch(name, self.namespace, {"spec": body["spec"]})
        except ApiException as exc:
            raise BackendError(f"{kind} {name}: {exc.reason}: {api_message(exc)}") from None

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
        now = self.clock.monotonic()
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

        def make_room(exc: Exception) -> None:
            if isinstance(exc, ApiException) and exc.status == 409:
                # a dead pod of ours of the same name: make room; anyone else's: NotOwned, untouched
                self._delete_pod(name, refuse=True)

        try:
            retry_within(
                lambda: self.core.create_namespaced_pod(self.namespace, body),
                transient=lambda exc: (isinstance(exc, ApiException) and exc.status == 409) or is_api_unavailable(exc),
                within_s=CREATE_WAIT_S,
                clock=self.clock,
                delays=backoff(0.5, 1.0, 0.5),
                on_failure=make_room,
            )
        except ApiException as exc:
            # a quota, an admission webhook, a forbidden field: the API server's own words say which
            raise BackendError(f"pod {name} not created: {exc.reason}: {api_message(exc)}") from None
        except BackendError:
            raise  # NotOwned: the pod in the way is someone else's
        except Exception as exc:
            raise BackendError(f"pod {name} not created: {exc}") from None
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
        if self._as_topology is not None:  # nor a completion to run as it (the next one connects again)
            connection, self._as_topology = self._as_topology, None
            with contextlib.suppress(Exception):
                connection.close()
        # one by one: the operator's RBAC grants `delete` on pods, not `deletecollection`
        self.stop_nodes(sorted(self.pods(fresh=True)))
        deadline = self.clock.monotonic() + timeout_s
        while self.clock.monotonic() < deadline:
            try:
                listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector_for(self.topology))
            except ApiException as exc:
                log.warning("listing the worker pods of %s: %s", self.topology.name, exc.reason)
                return
            if not listed.items:
                return
            self.clock.sleep(0.5)
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

    def apply(self, schedule: Schedule, migration_id: str, scope: MigrationScope = "all") -> None:
        super().apply(schedule, migration_id, scope)
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


def _decoded_entry(value: Any) -> str:
    """A Secret's `data` entry (base64) as text, "" when there is none or it is not base64 of UTF-8."""
    if not value:
        return ""
    try:
        return base64.b64decode(str(value), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return ""
