"""The Kubernetes backend against an in-memory CoreV1Api: the objects it creates, which pods count as failed,
that a pod of a node it removed on purpose is not a failure, which pending pods are reported (and while a
start waits), and where a worker pod's listeners bind."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from elastream.control.backends.kubernetes import KubernetesBackend
from elastream.control.backends.worker_objects import WorkerPodSettings, owner_reference, running_spec_of, worker_pod
from elastream.core.ports import BackendError, NotOwned
from elastream.core.schedule import initial_schedule
from elastream.core.topology import parse_manifest
from support.manifests import assert_worker_binds, edge, manifest, sink, src


class FakeCore:
    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.config_maps: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, dict[str, Any]] = {}
        self.phase: dict[str, str] = {}
        #: pod -> (PodScheduled status, its message) and pod -> a container's waiting reason
        self.scheduled: dict[str, tuple[str, str]] = {}
        self.waiting: dict[str, str] = {}
        self.deleted: list[str] = []

    def _missing(self, store: dict[str, Any], name: str) -> None:
        from kubernetes.client.exceptions import ApiException as Real

        if name not in store:
            raise Real(status=404)

    @staticmethod
    def _metadata(body: dict[str, Any]) -> Any:
        """A client model's metadata: its uid and ownerReferences as attributes."""
        metadata = body["metadata"]
        refs = [
            SimpleNamespace(kind=r["kind"], name=r["name"], uid=r["uid"]) for r in metadata.get("ownerReferences") or []
        ]
        return SimpleNamespace(
            name=metadata["name"],
            uid=metadata.setdefault("uid", f"uid-{metadata['name']}-{id(body)}"),
            labels=metadata.get("labels"),
            owner_references=refs or None,
            deletion_timestamp=None,
        )

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        self._missing(self.config_maps, name)
        stored = self.config_maps[name]
        return SimpleNamespace(metadata=self._metadata(stored), data=dict(stored.get("data") or {}))

    def patch_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        """A strategic merge patch of `data`: keys not in the patch stay, a null removes one."""
        self._missing(self.config_maps, name)
        data = self.config_maps[name].setdefault("data", {})
        for key, value in body["data"].items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        self.config_maps[body["metadata"]["name"]] = body

    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        import base64

        self._missing(self.secrets, name)
        string_data = self.secrets[name]["stringData"]
        return SimpleNamespace(
            metadata=self._metadata(self.secrets[name]),
            data={k: base64.b64encode(v.encode()).decode() for k, v in string_data.items()},
        )

    def patch_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self._missing(self.secrets, name)
        self.secrets[name]["stringData"].update(body.get("stringData", {}))

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any]) -> None:
        self.secrets[body["metadata"]["name"]] = body

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException as Real

        if body["metadata"]["name"] in self.pods:
            raise Real(status=409, reason="AlreadyExists")
        self.pods[body["metadata"]["name"]] = body
        self.phase[body["metadata"]["name"]] = "Running"

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        self._missing(self.pods, name)
        return SimpleNamespace(metadata=self._metadata(self.pods[name]))

    def delete_namespaced_pod(
        self, name: str, namespace: str, grace_period_seconds: int = 0, body: dict[str, Any] | None = None
    ) -> None:
        from kubernetes.client.exceptions import ApiException as Real

        self._missing(self.pods, name)
        wanted = ((body or {}).get("preconditions") or {}).get("uid")
        if wanted is not None and wanted != self._metadata(self.pods[name]).uid:
            raise Real(status=409, reason="Conflict")
        self.pods.pop(name)
        self.deleted.append(name)

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        wanted = dict(pair.split("=") for pair in label_selector.split(","))
        items = []
        for name, pod in self.pods.items():
            labels = pod["metadata"]["labels"]
            if all(labels.get(k) == v for k, v in wanted.items()):
                terminated = SimpleNamespace(exit_code=137, reason="OOMKilled")
                waiting = SimpleNamespace(reason=self.waiting[name], message="") if name in self.waiting else None
                state = SimpleNamespace(
                    terminated=terminated if self.phase[name] == "Failed" else None, waiting=waiting
                )
                conditions = []
                if name in self.scheduled:
                    status, message = self.scheduled[name]
                    conditions.append(
                        SimpleNamespace(type="PodScheduled", status=status, reason="Unschedulable", message=message)
                    )
                items.append(
                    SimpleNamespace(
                        metadata=self._metadata(pod),
                        status=SimpleNamespace(
                            phase=self.phase[name],
                            conditions=conditions,
                            container_statuses=[SimpleNamespace(state=state)],
                        ),
                    )
                )
        return SimpleNamespace(items=items)


class FakeAclRedis:
    """The ACL commands of one Redis: users by name, each its `ACL SETUSER` rules."""

    def __init__(self) -> None:
        self.users: dict[str, list[str]] = {}
        self.commands: list[tuple[str, ...]] = []

    def execute_command(self, *args: str) -> Any:
        if args[0] == "INFO":
            return {"redis_version": "7.0.15"}
        self.commands.append(args[:3])
        verb, user = args[1], args[2]
        if verb == "SETUSER":
            self.users[user] = list(args[3:])
            return b"OK"
        if verb == "DELUSER":
            return int(self.users.pop(user, None) is not None)
        rules = self.users.get(user)
        if rules is None:
            return None
        import hashlib

        password = next(r[1:] for r in rules if r.startswith(">"))
        keys = next(r for r in rules if r.startswith("~"))
        return {"flags": ["on"], "passwords": [hashlib.sha256(password.encode()).hexdigest()], "keys": keys}


ADMIN_URL = "redis://:pw@r:6379/0?socket_timeout=5"


def backend(topology_users: bool = True):
    topology = parse_manifest(manifest([src("s", 2), sink("z", 2)], [edge("s", "z")], name="web", nodes=2))
    core = FakeCore()
    kube = KubernetesBackend(
        topology,
        FakeAclRedis(),  # type: ignore[arg-type]
        core,
        {"name": "web", "uid": "u"},
        ADMIN_URL,
        topology_users=topology_users,
    )
    kube.schedule = initial_schedule(topology)
    return kube, core


def test_config_map_and_secret_hold_the_topology_and_the_topologys_own_redis_url() -> None:
    kube, core = backend()
    kube.ensure_config()
    assert "kind: StreamTopology" in core.config_maps["web-topology"]["data"]["topology.yaml"]
    assert '"version"' in core.config_maps["web-topology"]["data"]["schedule.json"]
    data = core.secrets["web-redis"]["stringData"]
    password = data["redisPassword"]
    assert len(password) == 64 and int(password, 16) >= 0  # 32 random bytes, hex
    # the operator's URL with the topology's user: host, port, db and TLS options kept, the admin password gone
    assert data["url"] == f"redis://elastream.default.web:{password}@r:6379/0?socket_timeout=5"
    assert ":pw@" not in str(core.secrets["web-redis"])
    assert core.secrets["web-redis"]["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_the_redis_password_is_made_once_and_kept_across_passes_and_operators() -> None:
    kube, core = backend()
    kube.ensure_config()
    first = dict(core.secrets["web-redis"]["stringData"])
    kube.ensure_config()  # a later pass
    again = KubernetesBackend(kube.topology, kube.client, core, kube.owner, ADMIN_URL)  # a restarted operator
    again.ensure_config()
    assert core.secrets["web-redis"]["stringData"]["redisPassword"] == first["redisPassword"]
    assert core.secrets["web-redis"]["stringData"]["url"] == first["url"]


def test_the_user_is_set_before_the_first_pod_checked_cheaply_after_and_set_again_when_redis_lost_it() -> None:
    from elastream.core.acl import topology_acl_rules

    kube, core = backend()
    redis = kube.client
    kube.preflight()
    password = core.secrets["web-redis"]["stringData"]["redisPassword"]
    assert redis.users["elastream.default.web"] == topology_acl_rules("default", "web", password)  # type: ignore[attr-defined]
    redis.commands.clear()  # type: ignore[attr-defined]
    kube.ensure_redis_user()  # a reconcile pass: one look
    assert redis.commands == [("ACL", "GETUSER", "elastream.default.web")]  # type: ignore[attr-defined]
    redis.users.clear()  # type: ignore[attr-defined]  # Redis restarted without an ACL file
    kube.ensure_redis_user()
    assert redis.users["elastream.default.web"] == topology_acl_rules("default", "web", password)  # type: ignore[attr-defined]
    kube.delete_redis_user()
    assert redis.users == {}  # type: ignore[attr-defined]


def test_with_topology_users_off_the_secret_holds_the_operators_url_and_redis_is_not_asked() -> None:
    kube, core = backend(topology_users=False)
    kube.preflight()
    assert core.secrets["web-redis"]["stringData"]["url"] == ADMIN_URL
    assert "redisPassword" not in core.secrets["web-redis"]["stringData"]
    assert kube.client.commands == []  # type: ignore[attr-defined]


def test_the_secret_holds_data_plane_keys_made_once_and_pods_read_them_from_it() -> None:
    from elastream.worker_inputs.keys import DataPlaneKeys, keys_from_env

    kube, core = backend()
    kube.ensure_config()
    data = core.secrets["web-redis"]["stringData"]
    keys = DataPlaneKeys(data["dataPlaneServerKey"].encode(), data["dataPlaneClientKey"].encode())
    kube.ensure_config()  # a later pass (a new operator, an apply) keeps them: running pods hold them
    assert core.secrets["web-redis"]["stringData"]["dataPlaneServerKey"] == keys.server_secret.decode()
    assert core.secrets["web-redis"]["stringData"]["dataPlaneClientKey"] == keys.client_secret.decode()
    other, other_core = backend()
    other_core.secrets.clear()
    other.ensure_config()  # every topology (here: a fresh Secret) gets its own
    assert other_core.secrets["web-redis"]["stringData"]["dataPlaneClientKey"] != keys.client_secret.decode()
    pod = worker_pod(kube.topology, "node-0", kube.owner, WorkerPodSettings())
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["ELASTREAM_DATA_PLANE_AUTH"]["value"] == "on"
    for name, key in (("SERVER", "dataPlaneServerKey"), ("CLIENT", "dataPlaneClientKey")):
        ref = env[f"ELASTREAM_DATA_PLANE_{name}_KEY"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "web-redis", "key": key}
    assert keys.server_secret.decode() not in str(pod) and keys.client_secret.decode() not in str(pod)
    resolved = {
        name: data[e["valueFrom"]["secretKeyRef"]["key"]]
        for name, e in env.items()
        if "DATA_PLANE_" in name and "valueFrom" in e
    }
    assert keys_from_env({**resolved, "ELASTREAM_DATA_PLANE_AUTH": "on"}).client_public == keys.client_public  # type: ignore[union-attr]
    off = worker_pod(kube.topology, "node-0", kube.owner, WorkerPodSettings(data_plane_auth=False))
    off_env = {e["name"]: e for e in off["spec"]["containers"][0]["env"]}
    assert off_env["ELASTREAM_DATA_PLANE_AUTH"]["value"] == "off" and "ELASTREAM_DATA_PLANE_SERVER_KEY" not in off_env


def test_a_secret_made_before_data_plane_keys_gets_them_and_keeps_its_url() -> None:
    kube, core = backend()
    core.secrets["web-redis"] = {
        "metadata": {"name": "web-redis", "ownerReferences": [owner_reference(kube.owner)]},
        "stringData": {"url": "redis://old"},
    }
    kube.ensure_config()
    data = core.secrets["web-redis"]["stringData"]
    assert data["url"].startswith("redis://elastream.default.web:") and len(data["dataPlaneServerKey"]) == 40
    assert len(data["redisPassword"]) == 64


CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_a_tls_url_s_ca_goes_to_the_workers_configmap_and_their_url_names_it_there(tmp_path: Any) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    kube, core = backend()
    kube.redis_url = f"rediss://:pw@r.sys.svc:6379/0?ssl_ca_certs={ca}"
    kube.ensure_config()
    assert core.config_maps["web-topology"]["data"]["redis-ca.crt"] == CA_PEM
    password = core.secrets["web-redis"]["stringData"]["redisPassword"]
    assert core.secrets["web-redis"]["stringData"]["url"] == (
        f"rediss://elastream.default.web:{password}@r.sys.svc:6379/0?ssl_ca_certs=/etc/elastream/redis-ca.crt"
    )
    kube.spawn("node-0")
    volume = core.pods["web-node-0"]["spec"]["volumes"][0]["configMap"]
    assert {"key": "redis-ca.crt", "path": "redis-ca.crt"} in volume["items"]
    mounts = core.pods["web-node-0"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "topology", "mountPath": "/etc/elastream", "readOnly": True} in mounts


def test_without_a_ca_file_nothing_extra_is_mounted() -> None:
    kube, core = backend()
    kube.ensure_config()
    kube.spawn("node-0")
    assert "redis-ca.crt" not in core.config_maps["web-topology"]["data"]
    assert [i["key"] for i in core.pods["web-node-0"]["spec"]["volumes"][0]["configMap"]["items"]] == ["topology.yaml"]


@pytest.mark.parametrize(
    ("content", "says"),
    [(None, "cannot be read: No such file"), ("not a cert", "holds no PEM certificate"), ("x" * 300_000, "is over")],
)
def test_an_unusable_ca_file_is_one_clear_error_naming_the_fix(tmp_path: Any, content: str | None, says: str) -> None:
    ca = tmp_path / "ca.crt"
    if content is not None:
        ca.write_text(content)
    kube, core = backend()
    kube.redis_url = f"rediss://:secretpw@r:6379/0?ssl_ca_certs={ca}"
    with pytest.raises(BackendError) as raised:
        kube.ensure_config()
    assert says in str(raised.value) and "redis.tls" in str(raised.value)
    assert "secretpw" not in str(raised.value)
    assert "web-redis" not in core.secrets  # nothing half made: no Secret pointing at a CA the pods lack


def test_missing_and_failed_pods_are_failures_and_removed_nodes_are_not() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    kube.spawn("node-1")
    assert kube.running_nodes() == {"node-0", "node-1"}
    assert kube.failed_nodes() == {}
    core.phase["web-node-1"] = "Failed"
    kube._pods_at = 0.0
    failed = kube.failed_nodes()
    assert list(failed) == ["node-1"] and "exit code 137 (OOMKilled)" in failed["node-1"]
    del core.pods["web-node-0"]
    kube._pods_at = 0.0
    assert "is gone" in kube.failed_nodes()["node-0"]
    kube.stop_nodes(["node-0", "node-1"])  # removed on purpose: not failures
    assert kube.failed_nodes() == {}
    kube.spawn("node-1")  # started again: watched again
    core.phase["web-node-1"] = "Failed"
    kube._pods_at = 0.0
    assert list(kube.failed_nodes()) == ["node-1"]


def test_stop_workers_deletes_every_pod_of_the_topology() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    kube.spawn("node-1")
    core.create_namespaced_pod("default", {"metadata": {"name": "other", "labels": {"app": "x"}}})
    kube.stop_workers()
    assert list(core.pods) == ["other"]


def someone_elses(name: str, owner: dict[str, str] | None = None) -> dict[str, Any]:
    """An object of that name made by someone else: a user's, another controller's (`owner`: kind, name, uid)."""
    refs = [{"apiVersion": "v1", "controller": True, **owner}] if owner else []
    return {
        "metadata": {"name": name, "uid": f"their-{name}", "labels": {"app": "theirs"}, "ownerReferences": refs},
        "stringData": {"url": "redis://theirs"},
        "data": {"theirs": "1"},
    }


@pytest.mark.parametrize(
    ("owner", "whose"),
    [
        ({}, "it has no owner"),
        ({"kind": "Deployment", "name": "billing", "uid": "d1"}, "it is owned by Deployment billing"),
        ({"kind": "StreamTopology", "name": "web", "uid": "old"}, "an earlier StreamTopology web"),
    ],
)
def test_a_config_map_or_secret_the_topology_does_not_own_is_never_patched(owner: dict[str, str], whose: str) -> None:
    for store, kind, name in (("config_maps", "ConfigMap", "web-topology"), ("secrets", "Secret", "web-redis")):
        kube, core = backend()
        theirs = someone_elses(name, owner)
        getattr(core, store)[name] = theirs
        before = repr(theirs)
        with pytest.raises(NotOwned) as refused:
            kube.ensure_config()
        message = str(refused.value)
        assert message.startswith(f"{kind} default/{name} exists and is not this StreamTopology's")
        assert whose in message and message.endswith("delete or rename it")
        assert repr(getattr(core, store)[name]) == before  # untouched


def test_a_config_map_and_secret_the_topology_owns_are_patched() -> None:
    kube, core = backend()
    kube.ensure_config()
    stored = core.config_maps["web-topology"]
    kube.topology = dataclasses.replace(kube.topology, spec={**kube.topology.spec, "image": "web:2"})
    kube.ensure_config()  # a later pass: read, found ours, patched (not made again)
    assert core.config_maps["web-topology"] is stored and "image: web:2" in stored["data"]["topology.yaml"]


def test_a_pod_in_the_way_of_a_new_worker_is_deleted_only_if_it_is_the_topologys() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    ours = core.pods["web-node-0"]
    core.phase["web-node-0"] = "Failed"  # a dead pod of ours holds the name: it makes room
    kube.spawn("node-0")
    assert core.deleted == ["web-node-0"] and core.pods["web-node-0"] is not ours
    # someone else's pod of that name: NotOwned, never deleted, no pod created
    core.pods["web-node-1"] = someone_elses("web-node-1", {"kind": "ReplicaSet", "name": "web-abc", "uid": "r1"})
    core.phase["web-node-1"] = "Running"
    with pytest.raises(NotOwned, match=r"Pod default/web-node-1 exists .*ReplicaSet web-abc.*delete or rename it"):
        kube.spawn("node-1")
    assert core.deleted == ["web-node-0"] and core.pods["web-node-1"]["metadata"]["labels"] == {"app": "theirs"}


def test_pods_labelled_like_the_topologys_but_not_owned_are_no_nodes_and_never_deleted() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    forged = someone_elses("web-node-7")
    labels = core.pods["web-node-0"]["metadata"]["labels"]
    forged["metadata"]["labels"] = {**labels, "elastream.dev/node": "node-7"}
    core.pods["web-node-7"] = forged
    core.phase["web-node-7"] = "Running"
    assert kube.running_nodes() == {"node-0"}
    kube.stop_nodes(["node-7"])  # even asked by name: left alone
    kube.stop_workers(timeout_s=0.1)
    assert core.deleted == ["web-node-0"] and list(core.pods) == ["web-node-7"]


def test_a_delete_is_only_of_the_pod_that_was_read() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    read = core.read_namespaced_pod

    def replaced_meanwhile(name: str, namespace: str) -> Any:
        found = read(name, namespace)
        core.pods[name] = dict(core.pods[name], metadata=dict(core.pods[name]["metadata"], uid="another"))
        return found

    core.read_namespaced_pod = replaced_meanwhile  # type: ignore[method-assign]
    kube.stop_nodes(["node-0"])  # the uid precondition fails (409): the other pod stays
    assert "web-node-0" in core.pods and core.deleted == []


UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available."


def test_pods_no_node_can_take_and_missing_images_are_reported_as_pending() -> None:
    kube, core = backend()
    for node in ("node-0", "node-1"):
        kube.spawn(node)
        core.phase[f"web-{node}"] = "Pending"
    core.scheduled["web-node-0"] = ("False", UNSCHEDULABLE)
    assert kube.pending_nodes() == {"node-0": f"pod web-node-0 cannot be scheduled: {UNSCHEDULABLE}"}
    # a scheduled pod whose container is being created is on its way: not reported
    core.waiting["web-node-1"] = "ContainerCreating"
    kube._pods_at = 0.0
    assert set(kube.pending_nodes()) == {"node-0"}
    # an image that is not there (on kind: not `kind load`ed) is
    core.waiting["web-node-1"] = "ErrImageNeverPull"
    kube._pods_at = 0.0
    assert kube.pending_nodes()["node-1"] == "pod web-node-1 cannot start: ErrImageNeverPull"
    assert "cannot be scheduled" in kube.describe("node-0")


def test_a_start_reports_pending_pods_while_it_waits_and_fails_at_its_bound() -> None:
    kube, core = backend()
    kube.start_timeout_s = 1.0
    kube.spawn("node-0")
    core.phase["web-node-0"] = "Pending"
    core.scheduled["web-node-0"] = ("False", UNSCHEDULABLE)
    seen: list[dict[str, str]] = []
    kube.on_waiting = lambda pending: seen.append(dict(pending))
    with pytest.raises(BackendError, match=r"not ready after 1 s .*Insufficient cpu"):
        kube._wait_for(["node-0"], set, "ready")
    assert seen == [{"node-0": f"pod web-node-0 cannot be scheduled: {UNSCHEDULABLE}"}]  # once, not every poll


def test_once_the_pods_are_placed_the_wait_reports_nothing_pending() -> None:
    kube, core = backend()
    kube.spawn("node-0")
    core.phase["web-node-0"] = "Pending"
    core.scheduled["web-node-0"] = ("False", UNSCHEDULABLE)
    seen: list[dict[str, str]] = []
    polls = iter([set(), set(), set(), {"node-0"}])

    def reached() -> set[str]:
        value = next(polls)
        if value:
            core.scheduled["web-node-0"] = ("True", "")
        return value

    kube.on_waiting = lambda pending: seen.append(dict(pending))
    kube._wait_for(["node-0"], reached, "ready")
    assert seen[0] and seen[-1] == {}


@pytest.mark.parametrize("on_pod_ip", [False, True])
def test_worker_listeners_bind_every_interface_unless_the_setting_says_the_pod_ip(on_pod_ip: bool) -> None:
    kube, _ = backend()
    pod = worker_pod(kube.topology, "node-0", kube.owner, WorkerPodSettings(listen_on_pod_ip=on_pod_ip))
    assert_worker_binds(pod, on_pod_ip)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_a_wait_goes_on_while_redis_is_away_for_a_moment() -> None:
    import redis

    kube, _ = backend()
    kube.failed_nodes = dict  # type: ignore[method-assign]  # the worker runs; only Redis is away
    polls = iter([redis.ConnectionError("refused"), redis.BusyLoadingError("loading"), {"node-0"}])

    def reached() -> set[str]:
        value = next(polls)
        if isinstance(value, Exception):
            raise value
        return value

    kube._wait_for(["node-0"], reached, "ready")  # no exception: Redis came back before the deadline


class VersionRegistry:
    """The registry calls `apply` makes, with versions counted."""

    def __init__(self) -> None:
        self.staged: list[int] = []
        self.active = 0

    def stage_schedule(self, schedule: Any, after: int = 0) -> int:
        self.staged.append(after + 1)
        return after + 1

    def activate_schedule(self, version: int) -> None:
        self.active = version

    def ready_nodes(self, version: int) -> set[str]:
        return {"node-0", "node-1", "node-2"}

    def endpoints(self, version: int) -> dict[str, str]:
        return {}


def test_an_apply_retried_after_redis_went_away_switches_to_the_same_version() -> None:
    import redis

    kube, _ = backend()
    schedule = initial_schedule(kube.topology)
    kube.schedule, kube.version = schedule, 4
    kube.registry = VersionRegistry()  # type: ignore[assignment]
    switches: list[int] = []
    kube.control = lambda s: SimpleNamespace(  # type: ignore[method-assign]
        send_nodes=lambda nodes, message: switches.append(message["version"])
    )
    kube.running_nodes = lambda: set(schedule.nodes)  # type: ignore[method-assign]
    kube.failed_nodes = dict  # type: ignore[method-assign]
    target = initial_schedule(kube.topology.with_nodes(len(schedule.nodes)))
    away = [True]

    def release(nodes: Any) -> None:
        if away.pop() if away else False:
            raise redis.ConnectionError("Redis went away after the switch was sent")

    kube.release_nodes = release  # type: ignore[method-assign]
    with pytest.raises(redis.ConnectionError):
        kube.apply(target, "m1")
    kube.apply(target, "m1")  # the migration's retry
    assert kube.registry.staged == [5] and switches == [5, 5] and kube.version == 5  # type: ignore[attr-defined]
    assert kube.applying is None


class FakeNetworking:
    """An in-memory NetworkingV1Api: NetworkPolicies by name."""

    def __init__(self) -> None:
        self.policies: dict[str, dict[str, Any]] = {}
        self.patches: list[str] = []

    def read_namespaced_network_policy(self, name: str, namespace: str) -> Any:
        from kubernetes.client.exceptions import ApiException as Real

        if name not in self.policies:
            raise Real(status=404)
        return SimpleNamespace(metadata=FakeCore._metadata(self.policies[name]))

    def create_namespaced_network_policy(self, namespace: str, body: dict[str, Any]) -> None:
        self.policies[body["metadata"]["name"]] = body

    def patch_namespaced_network_policy(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.policies[name]["spec"] = body["spec"]
        self.patches.append(name)


SCRAPER = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}


def policy_backend() -> tuple[KubernetesBackend, FakeCore, FakeNetworking]:
    kube, core = backend()
    networking = FakeNetworking()
    kube.networking = networking
    kube.settings = WorkerPodSettings(network_policy=True, metrics_from=(SCRAPER,))
    return kube, core, networking


def test_each_topology_gets_a_network_policy_its_workers_alone_pass_before_any_pod_starts() -> None:
    kube, _, networking = policy_backend()
    kube.preflight()
    policy = networking.policies["web-workers"]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u"
    spec = policy["spec"]
    pod = worker_pod(kube.topology, "node-0", kube.owner, kube.settings)
    selected = spec["podSelector"]["matchLabels"]
    assert selected.items() <= pod["metadata"]["labels"].items()  # it selects the topology's pods
    assert spec["policyTypes"] == ["Ingress"]  # egress (Redis, DNS, sources, sinks) is not restricted
    data, metrics = spec["ingress"]
    assert data == {"from": [{"podSelector": {"matchLabels": selected}}]}  # same namespace, same topology
    assert selected["app.kubernetes.io/instance"] == "web"  # not another topology's workers
    assert metrics == {"from": [SCRAPER], "ports": [{"protocol": "TCP", "port": 9100}]}
    # a later pass brings it back to what it should be
    networking.policies["web-workers"]["spec"] = {"podSelector": {}, "ingress": [{}]}
    kube.preflight()
    assert networking.policies["web-workers"]["spec"] == spec and networking.patches == ["web-workers"]


def test_without_a_scraper_the_workers_metrics_port_stays_closed() -> None:
    kube, _, networking = policy_backend()
    kube.settings = WorkerPodSettings(network_policy=True)
    kube.ensure_network_policy()
    assert len(networking.policies["web-workers"]["spec"]["ingress"]) == 1


def test_a_network_policy_of_that_name_that_is_not_the_topologys_is_left_alone() -> None:
    kube, core, networking = policy_backend()
    theirs = someone_elses("web-workers")
    theirs["spec"] = {"podSelector": {}}
    networking.policies["web-workers"] = theirs
    with pytest.raises(NotOwned, match=r"NetworkPolicy default/web-workers exists .*delete or rename it"):
        kube.preflight()
    assert networking.policies["web-workers"]["spec"] == {"podSelector": {}} and networking.patches == []
    assert core.pods == {} and core.secrets == {}  # nothing started without its policy


def test_network_policies_off_make_no_call() -> None:
    kube, _ = backend()
    kube.networking = None
    kube.ensure_network_policy()  # off by default: no client needed


def test_a_suspended_schedule_is_assumed_without_a_pod_and_the_restore_starts_every_one() -> None:
    kube, core = backend()  # a restarted operator's backend: nothing started by it
    schedule = initial_schedule(kube.topology)
    kube.schedule, kube.version = None, 0

    class Suspended(VersionRegistry):
        def schedule(self) -> tuple[int, Any]:
            return 4, schedule  # the version it ran when it was suspended, kept in Redis

    kube.registry = Suspended()  # type: ignore[assignment]
    kube.control = lambda s: SimpleNamespace(send_nodes=lambda nodes, message: None)  # type: ignore[method-assign]
    kube.assume(schedule)
    assert (kube.schedule, kube.version) == (schedule, 4) and core.pods == {}
    assert set(kube.failed_nodes()) == set(schedule.nodes)  # what the restore starts: every node
    kube.apply(schedule, "r1")  # the restore's apply: a pod per node, the next version of the other parity
    assert set(core.pods) == {f"web-{n}" for n in schedule.nodes} and kube.version == 5


def test_the_running_spec_and_an_upgrade_in_flight_are_read_back_from_the_topologys_own_config_map() -> None:
    kube, core = backend()
    owner = {"name": "web", "uid": "u"}
    assert running_spec_of(core, kube.topology, owner) == (None, None)  # a new topology
    kube.ensure_config()
    running, previous = running_spec_of(core, kube.topology, owner)
    assert running is not None and running["spec"]["nodes"] == 2 and previous is None
    older = parse_manifest(manifest([src("s", 1), sink("z", 1)], [edge("s", "z")], name="web", nodes=1))
    kube.record_upgrade(older)
    kube.ensure_config()  # a later write of the ConfigMap keeps the record
    running, previous = running_spec_of(core, kube.topology, owner)
    assert previous is not None and previous["spec"]["nodes"] == 1
    kube.record_upgrade(None)
    assert running_spec_of(core, kube.topology, owner)[1] is None
    # another topology's ConfigMap of that name (another uid) is not read
    assert running_spec_of(core, kube.topology, {"name": "web", "uid": "someone-else"}) == (None, None)


def test_a_hostile_spec_in_the_config_map_is_not_expanded(caplog: pytest.LogCaptureFixture) -> None:
    kube, core = backend()
    kube.ensure_config()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    )
    core.config_maps["web-topology"]["data"]["topology.yaml"] = "kind: StreamTopology\n" + bomb
    assert running_spec_of(core, kube.topology, {"name": "web", "uid": "u"}) == (None, None)
    assert "100000 values" in caplog.text  # refused by the manifest bounds, never expanded


@pytest.mark.timeout(30)
def test_every_wait_of_the_backend_runs_on_its_clock() -> None:
    """A start bound of an hour passes at once on a fake clock: a wait that read `time.monotonic` or slept with
    `time.sleep` instead of the backend's clock would hold this test for an hour (and fail its timeout)."""
    from support.fakes import FakeClock

    kube, core = backend()
    clock = FakeClock()
    kube.clock = clock
    kube.start_timeout_s = 3600.0
    kube.spawn("node-0")
    core.phase["web-node-0"] = "Pending"
    before = clock.t
    with pytest.raises(BackendError, match=r"not ready after 3600 s"):
        kube._wait_for(["node-0"], set, "ready")
    assert clock.t - before >= 3600.0
