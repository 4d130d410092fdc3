"""A real Apache Kafka broker on loopback for tests: `KafkaBroker`, one KRaft node (broker and controller in one
JVM) on free ports, its data in a temporary directory, run from the jars scripts/kafka-jars.sh caches (Maven
Central, the machine's Java 17). Restartable with its ports and data (`stop()`/`kill()`, then `start()`), for
fault tests such as "the broker restarted mid-checkpoint"; tuned for one node (replication 1, few internal
partitions, no rebalance delay, no auto-created topics).

Every wait is bounded and says what it waited for; a broker that does not answer in time fails with the tail
of its log (`broker.log` in its directory: log4j's output and the JVM's own).
"""

from __future__ import annotations

import base64
import ctypes
import functools
import itertools
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from support.paths import REPO
from support.ports import free_port
from support.waiting import wait_until

#: scripts/kafka-jars.sh: fetches the broker's jars once, prints their directory
KAFKA_JARS_SCRIPT = os.path.join(REPO, "scripts", "kafka-jars.sh")

#: the JVM: a small heap, and what keeps a start short on two cores (measured on the 2-core machine: start to
#: answering 1.9 s with these, 2.4 s with the JVM's defaults, G1 and C2)
JVM_FLAGS = (
    "-Xmx512m",
    "-Xms128m",
    "-XX:+UseSerialGC",  # no concurrent GC threads competing with startup on 2 cores
    "-XX:TieredStopAtLevel=1",  # C1 only: startup is dominated by JIT work, not peak speed
    "-Xss512k",
    "-Djava.awt.headless=true",
)

#: one node's settings (the listeners, node and directories are added per broker)
BROKER_CONFIG: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    # one node: every internal topic has one replica and needs one in sync
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "min.insync.replicas": "1",
    "default.replication.factor": "1",
    # few internal partitions: each is a log and a coordinator load at first use
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    "num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    # a broker restarted after kill() registers again once the controller has fenced its old session: 4 s,
    # not the default 9 (restart after a crash: 6 s instead of 12)
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "500",
    "auto.create.topics.enable": "false",
    # a transaction past its client's transaction.timeout.ms is aborted within a second, not ten
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    # few threads: two cores
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "background.threads": "2",
    "log.cleaner.threads": "1",
}

#: log4j2: everything at INFO to the console (stdout, which goes to broker.log), the chattiest loggers at WARN
LOG4J2_PROPERTIES = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""

log = logging.getLogger(__name__)


@functools.cache
def kafka_lib_dir() -> str:
    """The directory of the broker's jars, fetched (once per cache, seconds) by scripts/kafka-jars.sh; asked once
    per process. RuntimeError saying why when it cannot be had."""
    if shutil.which("java") is None:
        raise RuntimeError("java is not installed: run `make setup` (it installs it)")
    try:
        done = subprocess.run(["bash", KAFKA_JARS_SCRIPT], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{KAFKA_JARS_SCRIPT} took over 600 s: {exc.stderr!s:.2000}") from exc
    lib = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not os.path.isdir(lib):
        raise RuntimeError(
            f"{KAFKA_JARS_SCRIPT} failed (exit {done.returncode}), so there is no Kafka broker to test with:\n"
            f"{done.stderr[-3000:]}"
        )
    return lib


_names = itertools.count(1)


def unique_name(prefix: str) -> str:
    """A topic, group or transactional id no other test of this session (nor another session's) uses: tests
    share the session's broker."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def _die_with_parent() -> None:
    """In the broker's process before exec: SIGKILL it when the test process dies, so a test run killed
    without its teardown leaves no JVM behind (Linux's PR_SET_PDEATHSIG; elsewhere nothing). Only for a broker
    the main thread starts (see `start`)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def random_cluster_id() -> str:
    """What `kafka-storage random-uuid` prints (a UUID in URL-safe base64, not starting with '-'), without
    starting a JVM for it."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """A real one-node Kafka (KRaft) in a temporary directory on free loopback ports. `start()` formats its
    storage the first time and waits until it answers; `stop()`/`kill()` and `start()` again keep its ports,
    topics and data. `config` adds or overrides server properties. `sasl_plain_users` (user -> password) adds a
    SASL_PLAINTEXT listener with mechanism PLAIN for those users (`sasl_bootstrap`, `sasl_client_config`); the
    PLAINTEXT one stays (`bootstrap`, `admin()`)."""

    def __init__(self, config: dict[str, str] | None = None, sasl_plain_users: dict[str, str] | None = None) -> None:
        self.lib_dir = kafka_lib_dir()
        self.java = shutil.which("java") or "java"
        self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        #: with `sasl_plain_users` (user -> password): a SASL_PLAINTEXT listener (mechanism PLAIN) on a port of its
        #: own that only those users get through; 0 without one
        self.sasl_port = 0
        while sasl_plain_users and self.sasl_port in (0, self.port, self.controller_port):
            self.sasl_port = free_port()
        self.dir = tempfile.mkdtemp(prefix="elastream-kafka-")
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "broker.log")
        self.config_path = os.path.join(self.dir, "server.properties")
        self.log4j_path = os.path.join(self.dir, "log4j2.properties")
        self.cluster_id = random_cluster_id()
        self.config = {
            **BROKER_CONFIG,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "log.dirs": self.data_dir,
            **(self._sasl_config(sasl_plain_users) if sasl_plain_users else {}),
            **(config or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.formatted = False
        #: seconds the last `start()` took (format included), for reports
        self.last_start_s = 0.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        """The SASL_PLAINTEXT listener's bootstrap, "127.0.0.1:PORT" (with `sasl_plain_users` only)."""
        if not self.sasl_port:
            raise RuntimeError("this broker has no SASL listener: make it with sasl_plain_users")
        return f"127.0.0.1:{self.sasl_port}"

    def _sasl_config(self, users: dict[str, str]) -> dict[str, str]:
        """The server properties of a listener SASL (SASL_PLAINTEXT, PLAIN) beside PLAINTEXT: the same listeners
        plus it, with `users` as the PLAIN login module's `user_<name>="<password>"` entries. The controller and
        the broker's own connections stay on their PLAINTEXT listeners."""
        for user, password in users.items():
            if not re.fullmatch(r"[A-Za-z0-9._-]+", user) or '"' in password or "\\" in password:
                raise ValueError(f"SASL user {user!r}: a plain name and a password without quotes or backslashes")
        entries = " ".join(f'user_{user}="{password}"' for user, password in users.items())
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port},"
            f"SASL://127.0.0.1:{self.sasl_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},SASL://127.0.0.1:{self.sasl_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT",
            "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {entries};"
            ),
        }

    def _java(self, main: str, *args: str, heap: str = "-Xmx512m") -> list[str]:
        flags = [f for f in JVM_FLAGS if not f.startswith("-Xmx")]
        return [
            self.java,
            heap,
            *flags,
            f"-Dlog4j2.configurationFile={self.log4j_path}",
            "-cp",
            os.path.join(self.lib_dir, "*"),
            main,
            *args,
        ]

    def _write_config(self) -> None:
        with open(self.config_path, "w") as out:
            out.writelines(f"{key}={value}\n" for key, value in self.config.items())
        with open(self.log4j_path, "w") as out:
            out.write(LOG4J2_PROPERTIES)

    def _format(self) -> None:
        """`kafka-storage format --standalone`: the node's log dir, with this cluster id and itself as the only
        controller (KRaft's dynamic quorum)."""
        with open(self.log_path, "ab") as out:
            done = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    *("format", "-t", self.cluster_id, "-c", self.config_path, "--standalone"),
                    heap="-Xmx256m",
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=120,
            )
        if done.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed (exit {done.returncode}):\n{self.log_tail()}")
        self.formatted = True

    def start(self, timeout_s: float = 90.0) -> KafkaBroker:
        """Start the broker (formatting its storage on the first start only) and wait, at most `timeout_s`, until
        it answers a metadata request; TimeoutError with the tail of its log otherwise."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        t0 = time.monotonic()
        self._write_config()
        if not self.formatted:
            self._format()
        with open(self.log_path, "ab") as out:
            out.write(f"---- elastream: starting the broker on {self.bootstrap} ----\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", self.config_path),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                # the death signal follows the *thread* that forks: a broker started from a thread (a fault
                # test restarting it later) would be killed when that thread ends, so only the main thread asks
                preexec_fn=_die_with_parent if threading.current_thread() is threading.main_thread() else None,
            )
        try:
            wait_until(
                self._answers, timeout_s, f"the Kafka broker on {self.bootstrap} to answer", detail=self.log_tail
            )
        except BaseException:
            self.kill()
            raise
        self.last_start_s = time.monotonic() - t0
        log.info("Kafka broker on %s answered after %.1f s", self.bootstrap, self.last_start_s)
        return self

    def _answers(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise RuntimeError(f"the Kafka broker exited (code {code}) before it answered:\n{self.log_tail()}")
        with socket.socket() as sock:  # no client (and no client log lines) before the port is open
            sock.settimeout(1.0)
            if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                return False
        try:
            metadata = self.admin().list_topics(timeout=5)
        except KafkaException:
            return False
        return bool(metadata.brokers)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown: logs flushed, clean-shutdown marker written), then SIGKILL if it has
        not exited within `timeout_s`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("Kafka broker on %s ignored SIGTERM for %g s: SIGKILL", self.bootstrap, timeout_s)
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL now: a crash (no flush, no clean-shutdown marker; the next start recovers its logs)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def remove(self) -> None:
        """Kill it (its data is being thrown away, so no controlled shutdown) and delete its directory."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = 60) -> str:
        """The broker log's last `lines` lines, after its last ERROR/FATAL lines (the cause of a failed start
        is often well before the shutdown lines that end the log)."""
        try:
            with open(self.log_path, errors="replace") as log_file:
                all_lines = log_file.readlines()
        except OSError as exc:
            return f"(no broker log: {exc})"
        errors = [line for line in all_lines[:-lines] if " ERROR " in line or " FATAL " in line][-10:]
        tail = all_lines[-lines:]
        head = f"---- its last {len(errors)} ERROR/FATAL lines before those ----\n" + "".join(errors) if errors else ""
        return f"---- last {len(tail)} lines of {self.log_path} ----\n" + "".join(tail) + head

    # ---- clients and topics ----------------------------------------------------------------------------------

    def client_config(self, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        """A confluent_kafka client's settings for this broker: its bootstrap, plus `settings`."""
        return {"bootstrap.servers": self.bootstrap, **(settings or {})}

    def sasl_client_config(self, user: str, password: str, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        """A confluent_kafka client's settings for the SASL listener as `user` with `password`, plus `settings`."""
        return {
            "bootstrap.servers": self.sasl_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": password,
            **(settings or {}),
        }

    def admin(self) -> AdminClient:
        return AdminClient(self.client_config())

    def create_topic(self, name: str, partitions: int = 1, timeout_s: float = 30.0, **config: str) -> None:
        """Create `name` with `partitions` partitions (one replica each) and wait until the metadata shows every
        partition with a leader."""
        admin = self.admin()  # held until the result is in: a client destroyed earlier fails its futures
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)],
            operation_timeout=timeout_s,
        )
        futures[name].result(timeout=timeout_s)
        self.wait_partitions(name, partitions, timeout_s)

    def add_partitions(self, name: str, total: int, timeout_s: float = 30.0) -> None:
        """Grow `name` to `total` partitions and wait until the metadata shows them all with a leader."""
        admin = self.admin()
        futures = admin.create_partitions([NewPartitions(name, total)], operation_timeout=timeout_s)
        futures[name].result(timeout=timeout_s)
        self.wait_partitions(name, total, timeout_s)

    def delete_topic(self, name: str, timeout_s: float = 30.0) -> None:
        """Delete `name` and wait until the metadata no longer lists it."""
        admin = self.admin()
        futures = admin.delete_topics([name], operation_timeout=timeout_s)
        futures[name].result(timeout=timeout_s)
        wait_until(
            lambda: name not in self.admin().list_topics(timeout=5).topics,
            timeout_s,
            f"topic {name!r} to be gone from the metadata",
        )

    def partitions_with_leaders(self, name: str) -> int:
        """How many partitions of `name` the broker's metadata shows with a leader (0: no such topic)."""
        topic = self.admin().list_topics(topic=name, timeout=5).topics.get(name)
        if topic is None or topic.error is not None:
            return 0
        return sum(1 for p in topic.partitions.values() if p.leader >= 0 and p.error is None)

    def wait_partitions(self, name: str, partitions: int, timeout_s: float = 30.0) -> None:
        """Wait until the metadata shows `partitions` partitions of `name` with a leader (after a restart, say)."""
        wait_until(
            lambda: self.partitions_with_leaders(name) == partitions,
            timeout_s,
            f"the {partitions} partitions of topic {name!r} to have leaders",
            detail=lambda: f"{self.partitions_with_leaders(name)} have one",
        )
