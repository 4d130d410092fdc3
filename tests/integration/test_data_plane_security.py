"""Attacks on the data plane of a running topology (real worker processes, real sockets, a real Redis): what a
pod of the cluster can do with a worker's inbox endpoint, which it finds in Redis (`endpoints:<version>`).

Before issue 21 every one of these succeeded: a plain DEALER's DATA frames reached the sink as events (the
exactly-once check below fails on the duplicates), its CONTROL frames went straight to `on_control`, and one
garbage frame raised in `Inbox.receive` and killed the executor (its worker exited). Now the topology runs on
exactly once, the attempts are refused or dropped, and the worker counts them (Prometheus) and says so (log).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import zmq

from elastream.control.backends.local import LocalCluster, node_host
from elastream.core.migration_protocol import ControlType
from elastream.crd import load_manifest
from elastream.runtime.security import secure_client
from elastream.runtime.transport import CONTROL, DATA, encode
from elastream.worker_inputs.keys import DataPlaneKeys
from support.harness import expected_copies, id_counts, running, sink_events, wait_for_sink, write_manifest
from support.manifests import edge, manifest, src, work
from support.ports import worker_port

pytestmark = pytest.mark.integration

EVENTS = 3000
SEQ = (1).to_bytes(8, "little")  # the credit count every channel frame starts with


def topology_doc(name: str) -> dict[str, Any]:
    return manifest(
        [
            src("src", 1, rate=500, limit=EVENTS, keys=50),
            work("w", 1),
            {"name": "out", "sink": {"type": "redis-stream"}},
        ],
        [edge("src", "w"), edge("w", "out")],
        name=name,
        nodes=2,
        slotsPerNode=2,
    )


def wait_until(what: str, condition: Callable[[], bool], cluster: LocalCluster, timeout_s: float = 30.0) -> None:
    """Wait (bounded) for `condition`; every worker must stay alive meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cluster.check_alive()
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def counters(node: str, port: int) -> dict[tuple[str, str], float]:
    """The worker's data-plane counters: (metric, reason) -> value, from its Prometheus endpoint."""
    body = urllib.request.urlopen(f"http://{node_host(node)}:{port}/metrics", timeout=5).read().decode()
    found = {}
    for line in body.splitlines():
        if line.startswith("elastream_data_plane_") and "_total{" in line:
            name = line.split("{", 1)[0]
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            found[(name, reason)] = float(line.rsplit(" ", 1)[1])
    return found


def refused(node: str, port: int, reason: str | None = None) -> float:
    """Handshakes `node` refused for `reason` (None: for any reason)."""
    return sum(
        value
        for (name, why), value in counters(node, port).items()
        if name == "elastream_data_plane_refused_handshakes_total" and reason in (None, why)
    )


def dropped(node: str, port: int, reason: str) -> float:
    return counters(node, port).get(("elastream_data_plane_dropped_frames_total", reason), 0.0)


def forged_frames(sender: str, ids: range) -> list[bytes]:
    """What a worker's channel sends, forged: events with ids the source also emits (duplicates at the sink
    if accepted) and ids it never emits, then the controller's and the upstream's control messages."""
    now = time.time()
    return [
        SEQ + encode(DATA, sender, [[i, f"k{i % 50}", i, now] for i in ids]),
        SEQ + encode(DATA, sender, [[EVENTS + i, "k0", 0, now] for i in range(100)]),
        SEQ + encode(CONTROL, sender, {"type": ControlType.BARRIER, "mid": "forged"}),
        SEQ + encode(CONTROL, sender, {"type": ControlType.COMMIT, "mid": "forged"}),
        SEQ + encode(CONTROL, sender, {"type": ControlType.PREPARE, "mid": "forged", "protocol": "dcr"}),
        SEQ + encode(CONTROL, sender, {"type": ControlType.ABORT, "mid": "forged"}),
        SEQ + encode(CONTROL, sender, {"type": ControlType.INIT, "mid": "forged"}),
    ]


def check_exactly_once(cluster: LocalCluster, topology: Any) -> None:
    expected = expected_copies(topology, range(EVENTS))["out"]
    wait_for_sink(cluster, topology, "out", sum(expected.values()), timeout_s=90)
    got = id_counts(sink_events(cluster.client, topology, "out"))
    assert got == expected, f"{sum(got.values())} events at the sink, {sum(expected.values())} expected"


def read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def check_no_key_in_logs(cluster: LocalCluster) -> None:
    keys = cluster.data_plane
    assert keys is not None
    secrets = [keys.server_secret, keys.client_secret, keys.server_public, keys.client_public]
    for worker in cluster.workers.values():
        with open(worker.log_path, "rb") as handle:
            text = handle.read()
        assert b"data plane authenticated and encrypted" in text
        assert not any(key in text for key in secrets), f"a data-plane key in {worker.log_path}"


def start(tmp_path: Any, redis_url: str, name: str, port: int) -> Any:
    path = write_manifest(str(tmp_path), topology_doc(name))
    return running(path, redis_url, metrics_port=port)


def wait_for_the_sink(cluster: LocalCluster, topology: Any) -> None:
    wait_until(
        "the sink receives events", lambda: cluster.client.xlen(f"{topology.redis_prefix}sink:out") > 100, cluster
    )


def dealer(
    context: zmq.Context[Any], keys: DataPlaneKeys | None, endpoint: str, server_key: bytes | None = None
) -> zmq.Socket[Any]:
    """A channel's socket as an attacker opens it: plain without `keys`, else a CURVE client with them
    (and `server_key` in place of theirs), connected to `endpoint`."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    # a send waits at most this long: with no connection up (a refused handshake drops it) a DEALER's send
    # blocks, which hung this test for its whole timeout on a loaded machine
    socket.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    if keys is not None:
        secure_client(socket, keys)
    if server_key is not None:
        socket.curve_serverkey = server_key
    socket.connect(endpoint)
    return socket


SEND_TIMEOUT_MS = 5000


def send_refused(socket: zmq.Socket[Any], frames: list[bytes]) -> int:
    """Send an attacker's `frames` on a connection the worker refuses: how many were queued. ZeroMQ queues them
    while its handshake is tried, or has no connection to queue on once a refusal dropped it (then a send times
    out and the rest are not tried): either way, none may reach an executor, which the caller checks."""
    for sent, frame in enumerate(frames):
        try:
            socket.send(frame)
        except zmq.Again:
            return sent
    return len(frames)


def endpoints(cluster: LocalCluster) -> dict[str, str]:
    assert cluster.version is not None
    return cluster.registry.endpoints(cluster.version)


def test_an_unauthenticated_socket_injects_nothing_and_the_topology_stays_exactly_once(tmp_path, redis_url) -> None:
    port = worker_port(2)
    context: zmq.Context[Any] = zmq.Context()
    try:
        with start(tmp_path, redis_url, "plain-attack", port) as (cluster, topology):
            schedule = cluster.current_schedule()
            wait_for_the_sink(cluster, topology)
            plain = []
            for target, claimed in (("out#0", "w#0"), ("w#0", "src#0")):  # each as its real upstream
                socket = dealer(context, None, endpoints(cluster)[target])
                send_refused(socket, forged_frames(claimed, range(0, 500)))
                plain.append(socket)
            for target in ("out#0", "w#0"):
                node = schedule.node_of(target)
                wait_until(
                    f"{node} counts the refused handshake",
                    lambda node=node: refused(node, port) > 0,  # a protocol error or the peer gone mid-handshake
                    cluster,
                )
            check_exactly_once(cluster, topology)
            for target in ("out#0", "w#0"):
                node = schedule.node_of(target)
                reasons = ("malformed", "unauthenticated", "sender", "control")
                assert all(dropped(node, port, r) == 0 for r in reasons)  # refused before any frame came
            wait_until(
                "a worker logs what it refused",
                lambda: any("handshakes refused (" in read(w.log_path) for w in cluster.workers.values()),
                cluster,
            )
            check_no_key_in_logs(cluster)
            for socket in plain:
                socket.close(0)
    finally:
        context.destroy(0)


def other_topologys_keys(tmp_path: Any, redis_url: str) -> DataPlaneKeys:
    """The keys another topology's workers hold: what its own cluster generates for it (not started)."""
    path = write_manifest(str(tmp_path), topology_doc("neighbour"))
    other = LocalCluster(load_manifest(path), path, redis_url)
    try:
        assert other.data_plane is not None
        return other.data_plane
    finally:
        other.close()


@pytest.mark.parametrize("knows_our_server_key", [False, True])
def test_a_pod_of_another_topology_is_refused(tmp_path, redis_url, knows_our_server_key: bool) -> None:
    port = worker_port(2)
    neighbour = other_topologys_keys(tmp_path, redis_url)
    context: zmq.Context[Any] = zmq.Context()
    try:
        with start(tmp_path, redis_url, f"neighbour-attack-{int(knows_our_server_key)}", port) as (cluster, topology):
            assert cluster.data_plane is not None
            assert neighbour.client_public != cluster.data_plane.client_public  # keys are per topology
            schedule = cluster.current_schedule()
            wait_for_the_sink(cluster, topology)
            sockets = []
            for target, claimed in (("out#0", "w#0"), ("w#0", "src#0")):
                # what a worker of the other topology's channel does; knowing our server's key (a public key,
                # say, read from somewhere), its client key still is not ours
                server_key = cluster.data_plane.server_public if knows_our_server_key else None
                socket = dealer(context, neighbour, endpoints(cluster)[target], server_key)
                send_refused(socket, forged_frames(claimed, range(0, 500)))
                sockets.append(socket)
            reason = "auth" if knows_our_server_key else None  # None: the box cannot be opened, any reason
            for target in ("out#0", "w#0"):
                node = schedule.node_of(target)
                wait_until(
                    f"{node} refuses the neighbour ({reason or 'any reason'})",
                    lambda node=node: refused(node, port, reason) > 0,
                    cluster,
                )
            check_exactly_once(cluster, topology)
            check_no_key_in_logs(cluster)
            for socket in sockets:
                socket.close(0)
    finally:
        context.destroy(0)


def garbage(sender: str) -> list[list[bytes]]:
    """What a buggy or compromised peer holding the topology's keys might send on a connection that began as
    `sender`'s channel (each a multipart message): 12 malformed frames, 4 control messages no executor sends
    in-band, and events claiming another sender (duplicates of ids the source emits: accepted, they would
    break exactly-once)."""
    now = time.time()
    pack = msgpack.packb
    return [
        [SEQ + b"\xc1\xc1\xc1"],
        [SEQ + bytes(range(256))],
        [SEQ + pack([DATA, sender])],
        [SEQ + pack([DATA, sender, 42])],
        [SEQ + pack([DATA, sender, [[1, "k", 1]]])],
        [SEQ + pack([DATA, sender, [[1, "k", 1, "not a time"]]])],
        [SEQ + pack([CONTROL, sender, ["commit"]])],
        [SEQ + pack([5, sender, {}])],
        [SEQ + b"\x91" * 50_000],
        [SEQ + b"\xdd\xff\xff\xff\xff"],
        [b"short"],
        [SEQ, b"two", b"parts"],
        [SEQ + encode(CONTROL, sender, {"type": {"nested": True}})],
        [SEQ + encode(CONTROL, sender, {"type": ControlType.INIT, "mid": "forged"})],  # the controller's
        [SEQ + encode(CONTROL, sender, {"type": ControlType.ABORT, "mid": "forged"})],
        [SEQ + encode(CONTROL, sender, {"type": ControlType.CHECKPOINT_ABORT, "mid": "forged"})],
        [SEQ + encode(DATA, "impostor#0", [[i, "k0", i, now] for i in range(50)])],
    ]


def test_garbage_from_an_authenticated_peer_is_counted_and_dropped_and_the_executors_live(tmp_path, redis_url) -> None:
    port = worker_port(2)
    context: zmq.Context[Any] = zmq.Context()
    try:
        with start(tmp_path, redis_url, "garbage-attack", port) as (cluster, topology):
            assert cluster.data_plane is not None
            schedule = cluster.current_schedule()
            wait_for_the_sink(cluster, topology)
            sockets = []
            for target, upstream in (("out#0", "w#0"), ("w#0", "src#0")):
                socket = dealer(context, cluster.data_plane, endpoints(cluster)[target])  # this topology's keys
                socket.send(SEQ + encode(DATA, upstream, []))  # no events: this connection is `upstream`'s
                for frame in garbage(upstream):
                    socket.send_multipart(frame)
                stranger = dealer(context, cluster.data_plane, endpoints(cluster)[target])  # not upstream: a COMMIT
                stranger.send(SEQ + encode(CONTROL, "nobody#0", {"type": ControlType.COMMIT, "mid": "forged"}))
                sockets += [socket, stranger]
            for target in ("out#0", "w#0"):
                node = schedule.node_of(target)

                def all_dropped(node: str = node) -> bool:
                    return (
                        dropped(node, port, "malformed") >= 12
                        and dropped(node, port, "control") >= 5
                        and dropped(node, port, "sender") >= 1
                    )

                wait_until(f"{node} drops and counts every garbage frame", all_dropped, cluster)
            check_exactly_once(cluster, topology)  # the executors lived: every event still arrived, once
            assert cluster.failed_nodes() == {}
            check_no_key_in_logs(cluster)
            for socket in sockets:
                socket.close(0)
    finally:
        context.destroy(0)
