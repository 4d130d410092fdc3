"""Kafka to Kafka exactly once on the real API server (issue 39): the chart installed with helm, a real Kafka broker
(`support.kafka_broker.KafkaBroker`, KRaft, on this machine's loopback) whose listener for the topology takes
SASL/PLAIN only, the client credentials in a Secret of the topology's namespace that the source and both sinks name
by `secretRef`, the topology scaled out and in with `kubectl scale` while a producer writes, and a `read_committed`
consumer that then sees every input exactly once in the copy topic and, per key, running counts exactly 1..n.

How the worker pods reach the broker: as they reach everything in this tier. Every pod shares the host's network
namespace (docker `--network host`, or a local process) and has a loopback pod IP, and the bundled Redis is a pod
whose Service has a loopback ClusterIP (127.96.0.0/16) served by the kubelet stand-in's forwarder. The broker is
not a pod but a process of the test on 127.0.0.1, which is the same address inside every worker container, so it
advertises 127.0.0.1:PORT and `bootstrapServers` names that: nothing leaves loopback (no Service is needed, and an
Endpoints object could not hold a loopback address anyway).

The Secret holds librdkafka properties (security.protocol=SASL_PLAINTEXT, sasl.mechanism=PLAIN, sasl.username,
sasl.password), as a user's would; the operator mounts it in the worker pods at /etc/elastream/secrets/<name>/
and never reads it. The broker refuses a wrong password (checked with a client of the test's own, and through a
second topology whose Secret holds one: its worker says its source cannot read the topic, and it reads nothing),
and no password appears in any worker's output, the topologies' status or their events.

The worker pod mounts the Secret at /etc/elastream/secrets/<name>, beneath its read-only ConfigMap volume at
/etc/elastream: the kubelet makes such nested mount points (`MakeNestedMountpoints`), and so does the tier's
stand-in (`tests/e2e/kubelet.py`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from support.kafka_broker import KafkaBroker, unique_name
from support.kafka_checks import KEYS, check_exactly_once
from support.kafka_fixtures import running_broker
from support.waiting import wait_until

from .conftest import SYSTEM
from .test_operator import apply_topology, pods_of, scaled, status

pytestmark = pytest.mark.e2e

USER = "elastream-app"
SECRET = "kafka-client"
RATE = 150.0  # messages per second the producer writes while the topology is scaled


@pytest.fixture
def sasl_kafka() -> Iterator[tuple[KafkaBroker, str]]:
    """A broker of the test's own with a SASL_PLAINTEXT (PLAIN) listener that lets USER in with a fresh password;
    its PLAINTEXT listener is the test's (topics, the producer). Removed after the test."""
    password = secrets.token_urlsafe(18)
    with running_broker(sasl_plain_users={USER: password}) as broker:
        print(f"\ne2e: Kafka broker up in {broker.last_start_s:.1f} s: PLAINTEXT {broker.bootstrap} (the test's), "
              f"SASL_PLAINTEXT {broker.sasl_bootstrap} (the topology's); log {broker.log_path}")  # fmt: skip
        yield broker, password


class Writer(threading.Thread):
    """Writes `k<i % KEYS>` -> `i` for i = 0, 1, ... to `topic` at about `rate` per second until `stop()`; then
    `written` is how many the broker acknowledged (all of them, or the flush fails)."""

    def __init__(self, broker: KafkaBroker, topic: str, rate: float) -> None:
        super().__init__(daemon=True, name="kafka-writer")
        self.producer = Producer(broker.client_config({"enable.idempotence": True, "linger.ms": 5}))
        self.topic, self.rate = topic, rate
        self.written = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            began = time.monotonic()
            while not self.stopping.is_set():
                i = self.written
                self.producer.produce(self.topic, key=f"k{i % KEYS}", value=str(i))
                self.written += 1
                if self.written % 25 == 0:
                    self.producer.poll(0)
                    ahead = began + self.written / self.rate - time.monotonic()
                    if ahead > 0:
                        self.stopping.wait(ahead)
            left = self.producer.flush(60)
            assert left == 0, f"{left} messages not acknowledged"
        except BaseException as exc:  # seen by the test through stop()
            self.error = exc

    def stop(self) -> int:
        self.stopping.set()
        self.join(90)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        return self.written


def check_copies(broker: KafkaBroker, password: str, topics: dict[str, str], total: int) -> None:
    """`support.kafka_checks.check_exactly_once` as USER through the SASL listener, timed."""
    t0 = time.monotonic()
    copies = check_exactly_once(broker.sasl_client_config(USER, password), topics["copy"], topics["counts"], total)
    print(f"  read_committed: {len(copies)} messages in {topics['copy']} ({time.monotonic() - t0:.1f} s)")


def create_client_secret(kubectl, namespace: str, directory: str, name: str, password: str) -> None:
    """A Secret `name` of librdkafka properties for USER, one file per key (as `kubectl create secret generic
    --from-file=DIR` takes them): nothing of it on a command line or in the test's output."""
    os.makedirs(directory, exist_ok=True)
    for key, value in {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": USER,
        "sasl.password": password,
    }.items():
        with open(os.path.join(directory, key), "w", encoding="utf-8") as out:
            out.write(value)
    kubectl("create", "secret", "generic", name, "-n", namespace, f"--from-file={directory}")


def pipeline(name: str, bootstrap: str, topics: dict[str, str], secret: str) -> dict[str, Any]:
    """orders (kafka, 8 partitions) -> count (keyed) -> counts (kafka, exactly once); orders -> copy (kafka,
    exactly once); every connector with `secretRef` `secret`."""
    kafka = {"bootstrapServers": bootstrap, "secretRef": {"name": secret}}
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name},
        "spec": {
            "nodes": 2,
            "slotsPerNode": 4,
            "vertices": [
                {
                    "name": "orders",
                    "parallelism": 2,
                    "maxParallelism": 16,
                    "source": {"type": "kafka", "topic": topics["in"], "partitionDiscoverySeconds": 2, **kafka},
                },
                {
                    "name": "count",
                    "parallelism": 2,
                    "maxParallelism": 16,
                    "stateful": True,
                    "logic": {"builtin": "count", "key": "key"},
                },
                {
                    "name": "copy",
                    "maxParallelism": 16,
                    "sink": {"type": "kafka", "topic": topics["copy"], "delivery": "exactly-once", **kafka},
                },
                {
                    "name": "counts",
                    "maxParallelism": 16,
                    "sink": {"type": "kafka", "topic": topics["counts"], "delivery": "exactly-once", **kafka},
                },
            ],
            "streams": [
                {"from": "orders", "to": "count", "grouping": "fields", "key": "key"},
                {"from": "orders", "to": "copy", "grouping": "shuffle"},
                {"from": "count", "to": "counts", "grouping": "shuffle"},
            ],
            "scaling": {"strategy": "stela", "migration": "ccr", "checkpointIntervalSeconds": 2, "window": 5},
        },
    }


def wrong_password_refused(broker: KafkaBroker) -> str:
    """What a client with USER's name and a wrong password gets from the SASL listener: an authentication error
    (waited for at most 30 s)."""
    errors: list[KafkaError] = []
    quiet = logging.getLogger("e2e.kafka.wrong-password")
    quiet.setLevel(logging.CRITICAL)  # librdkafka's FAIL lines, one per retry
    consumer = Consumer(
        broker.sasl_client_config(
            USER, "not-" + secrets.token_hex(8), {"group.id": unique_name("wrong"), "error_cb": errors.append}
        ),
        logger=quiet,
    )
    try:
        wait_until(
            lambda: consumer.poll(0.5) is None and any(e.code() == KafkaError._AUTHENTICATION for e in errors),
            30,
            "an authentication error for a wrong password",
            detail=lambda: f"errors: {[e.str() for e in errors]}",
        )
    finally:
        consumer.close()
    return next(e.str() for e in errors if e.code() == KafkaError._AUTHENTICATION)


@pytest.mark.timeout(1500)
def test_kafka_to_kafka_with_sasl_credentials_from_a_secret_scaled_with_kubectl_exactly_once(
    installed, runtime_mode, sasl_kafka, kubectl, kubelet, e2e_namespace, tmp_path
) -> None:
    if runtime_mode != "docker":
        pytest.fail(
            "the kafka connectors' Secrets need docker mode: a worker reads them from the fixed path "
            "/etc/elastream/secrets/<name> (elastream.worker_inputs.secrets), and the process runtime rewrites "
            "mount paths only where they appear in a pod's command, args or env; a worker pod whose env named "
            "ELASTREAM_SECRETS_DIR=/etc/elastream/secrets would work in both",
            pytrace=False,
        )
    broker, password = sasl_kafka
    try:
        run_pipeline(broker, password, kubectl, kubelet, e2e_namespace, tmp_path)
    except BaseException:
        print(f"\n---- e2e: the Kafka broker's log ----\n{broker.log_tail(80)}")
        print("\n---- e2e: the operator's last lines ----")
        kubectl("logs", "-n", SYSTEM, "-l", "app.kubernetes.io/component=operator", "--tail=150", check=False)
        raise


def run_pipeline(broker: KafkaBroker, password: str, kubectl, kubelet, namespace: str, tmp_path) -> None:
    t_start = time.monotonic()
    # the listener the topology uses takes SASL/PLAIN only, and the right password only
    refused = wrong_password_refused(broker)
    print(f"  a wrong password: {refused}")
    topics = {role: unique_name(role) for role in ("in", "copy", "counts")}
    broker.create_topic(topics["in"], 8)
    broker.create_topic(topics["copy"], 3)
    broker.create_topic(topics["counts"], 3)

    create_client_secret(kubectl, namespace, str(tmp_path / "secret"), SECRET, password)
    name = apply_topology(kubectl, namespace, tmp_path, pipeline("orders", broker.sasl_bootstrap, topics, SECRET))
    t_available = time.monotonic()
    kubectl("get", "topo,pods", "-n", namespace, "-o", "wide")
    # the operator mounted the Secret read-only in every worker pod, where the connectors read it
    for pod in pods_of(kubectl, namespace, name):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"].endswith(f"/{SECRET}")]
        assert len(mounts) == 1 and mounts[0]["mountPath"] == f"/etc/elastream/secrets/{SECRET}", mounts
        assert mounts[0]["readOnly"] is True
        assert volumes[mounts[0]["name"]]["secret"]["secretName"] == SECRET

    writer = Writer(broker, topics["in"], RATE)
    writer.start()
    time.sleep(8)  # a window of metrics (and a checkpoint or two) before the first decision
    for nodes in (3, 2):
        kubectl("scale", "topo", name, "-n", namespace, f"--replicas={nodes}")
        out = scaled(kubectl, namespace, name, nodes, 300)
        assert writer.is_alive(), "the scaling must happen while the producer writes"
        assert len(pods_of(kubectl, namespace, name)) == nodes
        print(f"  scaled to {nodes}: {json.dumps(out['lastScaling'])[:600]}")
        kubectl("get", "topo", "-n", namespace)
        time.sleep(5)
    total = writer.stop()
    print(f"  the producer wrote {total} messages to {topics['in']} (8 partitions)")
    t_written = time.monotonic()

    check_copies(broker, password, topics, total)
    t_checked = time.monotonic()
    final = status(kubectl, namespace, name)
    assert final.get("nodes") == 2 and final.get("readyNodes") == 2, final

    # the password is in no worker's output, nor in the topology's status and events
    for pod, text in worker_logs_of(kubectl, kubelet, namespace, name).items():
        assert password not in text, f"pod {pod} printed the password"
    shown = kubectl("get", "topo,events", "-n", namespace, "-o", "json", quiet=True).stdout
    assert password not in shown

    # a Secret with a wrong password: the worker says its source cannot read the topic, and reads nothing
    bad = wrong_secret_topology(broker, kubectl, kubelet, namespace, tmp_path, topics["in"])
    timings = {
        "available": t_available - t_start,
        "writing and two scalings": t_written - t_available,
        "read_committed check": t_checked - t_written,
        "wrong-password topology": bad,
    }
    print("  timings: " + ", ".join(f"{what} {seconds:.0f} s" for what, seconds in timings.items()))
    kubectl("delete", "topo", name, "-n", namespace, "--timeout=120s")


def worker_logs_of(kubectl, kubelet, namespace: str, name: str) -> dict[str, str]:
    """The output of the topology's worker pods (those still there)."""
    return {
        p["metadata"]["name"]: kubelet.logs(namespace, p["metadata"]["name"], markers=False)
        for p in pods_of(kubectl, namespace, name, terminating=True)
    }


def wrong_secret_topology(broker: KafkaBroker, kubectl, kubelet, namespace: str, tmp_path, topic: str) -> float:
    """A one-node topology reading `topic` with a Secret whose password is wrong: its worker says the source cannot
    read the topic, nothing is read, the password is nowhere. Returns the seconds it took."""
    t0 = time.monotonic()
    wrong = "not-" + secrets.token_hex(8)
    create_client_secret(kubectl, namespace, str(tmp_path / "wrong-secret"), "kafka-wrong", wrong)
    doc = {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": "wrong-password"},
        "spec": {
            "nodes": 1,
            "slotsPerNode": 2,
            "vertices": [
                {
                    "name": "orders",
                    "source": {
                        "type": "kafka",
                        "topic": topic,
                        "bootstrapServers": broker.sasl_bootstrap,
                        "secretRef": {"name": "kafka-wrong"},
                    },
                },
                {"name": "out", "sink": {"type": "log", "every": 1}},
            ],
            "streams": [{"from": "orders", "to": "out", "grouping": "shuffle"}],
        },
    }
    name = apply_topology(kubectl, namespace, tmp_path, doc)

    # the worker says its source cannot read the topic (kubectl logs shows it)
    def complaint() -> str:
        for text in worker_logs_of(kubectl, kubelet, namespace, name).values():
            for line in text.splitlines():
                if "WARNING" in line and "source orders#0:" in line and topic in line:
                    return line
        return ""

    line = wait_until(complaint, 90, "the worker to say that its source cannot read the topic", poll_s=1.0)
    print(f"  the wrong Secret's worker: {line.strip()[:300]}")
    # the source names the cause the client was told (its error callback, served before it says so)
    cause = wait_until(
        lambda: next(
            (
                ln
                for text in worker_logs_of(kubectl, kubelet, namespace, name).values()
                for ln in text.splitlines()
                if "source orders#0:" in ln and "authentication" in ln.lower()
            ),
            "",
        ),
        60,
        "the worker to say that the broker refused the credentials",
        poll_s=1.0,
    )
    print(f"  ... and why: {cause.strip()[:300]}")

    def degraded() -> str:
        for condition in status(kubectl, namespace, name).get("conditions") or []:
            if condition.get("type") == "Degraded" and condition.get("reason") == "ConnectorError":
                return str(condition.get("message", ""))
        return ""

    message = wait_until(degraded, 90, "the topology to be Degraded with reason ConnectorError", poll_s=1.0)
    assert "orders#0" in message and topic in message, message
    time.sleep(3)  # what it would read with the right password is there: give it the time to (not) print it
    logs = worker_logs_of(kubectl, kubelet, namespace, name)
    assert all(wrong not in text for text in logs.values()), "a worker printed the wrong password"
    printed = [ln for text in logs.values() for ln in text.splitlines() if "out#0: id=" in ln]
    assert not printed, f"read with a wrong password: {printed[:3]}"
    shown = status(kubectl, namespace, name)
    conditions = [(c.get("type"), c.get("status"), c.get("reason")) for c in shown.get("conditions") or []]
    print(f"  its status: phase {shown.get('phase')}, throughput {shown.get('throughput')}, conditions {conditions}")
    shown_text = kubectl("get", "topo,events", "-n", namespace, "-o", "json", quiet=True).stdout
    assert wrong not in shown_text
    kubectl("delete", "topo", name, "-n", namespace, "--timeout=120s")
    return time.monotonic() - t0
