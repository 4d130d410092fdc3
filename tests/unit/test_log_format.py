"""`--log-format json` (`elastream.log_format`): one JSON object a line with exactly the documented keys, the
topology a line concerns (from a worker's fixed fields, from the context a kopf handler sets, carried into the
reconcile pool's threads, from kopf's object reference), no secret, and the setting reaching the worker pods."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from elastream.control.backends.worker_objects import WorkerPodSettings, worker_pod
from elastream.control.reconcile_slots import ReconcilePool, ReconcileSlots
from elastream.core.topology import parse_manifest
from elastream.log_format import CURRENT_TOPOLOGY, checked_log_format, log_handler, topology_context
from support.manifests import edge, manifest, sink, src
from support.paths import EXAMPLES

RFC3339_UTC_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class Captured:
    """The lines a `log_handler` wrote for the logger `elastream.test.<name>` (not propagated to the root)."""

    def __init__(self, name: str, log_format: str = "json", fields: dict[str, str] | None = None) -> None:
        self.stream = io.StringIO()
        self.logger = logging.getLogger(f"elastream.test.{name}")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self.handler = log_handler(log_format, fields, stream=self.stream)
        self.logger.handlers = [self.handler]

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def objects(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines()]


@pytest.fixture
def captured(request: pytest.FixtureRequest) -> Iterator[Captured]:
    capture = Captured(request.node.name)
    yield capture
    capture.logger.handlers = []


def test_a_line_is_one_json_object_with_time_level_logger_message(captured: Captured) -> None:
    captured.logger.info("pods of %s ready\nnext line", "web")
    captured.logger.warning("careful")
    first, second = captured.objects()
    assert list(first) == ["time", "level", "logger", "message"]
    assert RFC3339_UTC_MS.match(first["time"]), first["time"]
    assert first["level"] == "INFO" and second["level"] == "WARNING"
    assert first["logger"] == captured.logger.name
    assert first["message"] == "pods of web ready\nnext line"  # a message of two lines is still one line
    assert len(captured.lines()) == 2


def test_a_line_about_a_topology_names_it_and_keeps_its_text(captured: Captured) -> None:
    with topology_context("team-a", "web"):
        captured.logger.info("team-a/web: scaled to 3 nodes")
    captured.logger.info("watching all namespaces")
    about, other = captured.objects()
    assert list(about) == ["time", "level", "logger", "message", "namespace", "topology"]
    assert (about["namespace"], about["topology"], about["message"]) == (
        "team-a",
        "web",
        "team-a/web: scaled to 3 nodes",
    )
    assert "namespace" not in other and "topology" not in other  # after the block: no topology
    assert CURRENT_TOPOLOGY.get() is None


def test_a_worker_s_every_line_names_its_topology_and_node() -> None:
    worker = Captured("worker", fields={"namespace": "default", "topology": "web", "node": "node-1"})
    try:
        worker.logger.info("node node-1 ready")
        with topology_context("other", "elsewhere"):  # a worker's own fields win over any context
            worker.logger.error("stopped")
        for line in worker.objects():
            assert list(line) == ["time", "level", "logger", "message", "namespace", "topology", "node"]
            assert (line["namespace"], line["topology"], line["node"]) == ("default", "web", "node-1")
    finally:
        worker.logger.handlers = []


def test_an_exception_is_its_formatted_traceback_in_the_same_line(captured: Captured) -> None:
    try:
        raise RuntimeError("the pass failed")
    except RuntimeError:
        captured.logger.exception("reconcile of %s failed", "team-a/web")
    (line,) = captured.lines()
    parsed = json.loads(line)
    assert list(parsed) == ["time", "level", "logger", "message", "exception"]
    assert parsed["level"] == "ERROR" and parsed["message"] == "reconcile of team-a/web failed"
    assert parsed["exception"].startswith("Traceback (most recent call last):")
    assert parsed["exception"].rstrip().endswith("RuntimeError: the pass failed")
    assert "test_an_exception_is_its_formatted_traceback" in parsed["exception"]


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_no_password_of_a_url_reaches_a_line(log_format: str) -> None:
    capture = Captured(f"secrets-{log_format}", log_format)
    url = "redis://elastream:s3cr3t-pa55@redis.example:6379/0"
    try:
        capture.logger.warning("cannot reach Redis at %s", url)
        capture.logger.warning("socket at unix:///run/redis.sock?password=an0ther-s3cr3t&db=2")
        try:
            raise ConnectionError(f"Error connecting to {url}")
        except ConnectionError:
            capture.logger.exception("connect")
        output = capture.stream.getvalue()
        assert "s3cr3t-pa55" not in output and "an0ther-s3cr3t" not in output
        assert "redis://elastream:***@redis.example:6379/0" in output  # what it is stays readable
        assert "password=***" in output
        if log_format == "json":
            assert capture.objects()[0]["message"] == (
                "cannot reach Redis at redis://elastream:***@redis.example:6379/0"
            )
    finally:
        capture.logger.handlers = []


def test_kopf_s_lines_about_a_topology_name_it_from_kopf_s_object_reference(captured: Captured) -> None:
    ref = {"apiVersion": "elastream.dev/v1alpha1", "kind": "StreamTopology", "name": "web", "namespace": "team-a"}
    captured.logger.info("Handler 'stop' succeeded.", extra={"k8s_ref": ref, "k8s_skip": False})
    captured.logger.info("a pod", extra={"k8s_ref": {**ref, "kind": "Pod"}})
    about, pod = captured.objects()
    assert (about["namespace"], about["topology"]) == ("team-a", "web")
    assert list(about) == ["time", "level", "logger", "message", "namespace", "topology"]  # nothing of kopf's own
    assert "topology" not in pod


def test_every_pass_on_the_reconcile_pool_names_the_topology_its_daemon_set(captured: Captured) -> None:
    """As the kopf daemons do: one asyncio task per topology sets it, then runs passes on the pool's threads
    (asyncio's run_in_executor does not carry the context: the pool does)."""
    slots = ReconcileSlots(2)
    pool = ReconcilePool(slots, waiting=0)
    topologies = [("team-a", f"web-{i}") for i in range(6)]
    threads: set[str] = set()

    def one_pass(name: str, number: int) -> None:
        threads.add(threading.current_thread().name)
        captured.logger.info("pass %d of %s", number, name)

    async def daemon(namespace: str, name: str) -> None:
        CURRENT_TOPOLOGY.set((namespace, name))
        loop = asyncio.get_running_loop()
        for number in range(5):
            await loop.run_in_executor(pool, one_pass, name, number)

    async def every_daemon() -> None:
        await asyncio.gather(*(daemon(namespace, name) for namespace, name in topologies))

    try:
        asyncio.run(every_daemon())
    finally:
        pool.shutdown(wait=True)
    lines = captured.objects()
    assert len(lines) == 30 and threads and all(name.startswith("reconcile_") for name in threads)  # the pool's
    for line in lines:
        assert line["message"].endswith(f" of {line['topology']}") and line["namespace"] == "team-a", line
    assert CURRENT_TOPOLOGY.get() is None  # nothing leaked into the caller's context


def test_a_log_format_other_than_text_or_json_is_refused_naming_the_variable() -> None:
    assert checked_log_format("json") == "json" and checked_log_format("text") == "text"
    for bad in ("JSON", "xml", "", None):
        with pytest.raises(ValueError, match=r"^--log-format \(\$ELASTREAM_LOG_FORMAT\): .* give text or json$"):
            checked_log_format(bad)


def test_elastream_commands_refuse_a_bad_environment_value_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from elastream.cli import main

    monkeypatch.setenv("ELASTREAM_LOG_FORMAT", "yaml")
    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@127.0.0.1:1/0")
    assert main(["operator"]) == 1
    assert capsys.readouterr().err == (
        "error: --log-format ($ELASTREAM_LOG_FORMAT): 'yaml' is not a log format; give text or json\n"
    )
    # on the command line too (argparse does not check it), before any process starts
    monkeypatch.delenv("ELASTREAM_LOG_FORMAT")
    assert main(["run", os.path.join(EXAMPLES, "linear.yaml"), "--log-format", "xml", "--engine", "python"]) == 1
    assert capsys.readouterr().err == (
        "error: --log-format ($ELASTREAM_LOG_FORMAT): 'xml' is not a log format; give text or json\n"
    )


def test_the_operator_s_format_reaches_its_worker_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastream.cli import build_parser
    from elastream.cli.operator import operator_options

    monkeypatch.setenv("ELASTREAM_REDIS_URL", "redis://:pw@redis:6379/0")
    monkeypatch.delenv("ELASTREAM_LOG_FORMAT", raising=False)
    assert operator_options(build_parser().parse_args(["operator"])).worker.log_format == "text"
    options = operator_options(build_parser().parse_args(["operator", "--log-format", "json"]))
    topology = parse_manifest(manifest([src("s"), sink("out")], [edge("s", "out")], name="web"))
    pod = worker_pod(topology, "node-0", {"name": "web", "uid": "u"}, options.worker)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["ELASTREAM_LOG_FORMAT"] == "json"
    plain = worker_pod(topology, "node-0", {"name": "web", "uid": "u"}, WorkerPodSettings())
    assert {e["name"]: e.get("value") for e in plain["spec"]["containers"][0]["env"]}["ELASTREAM_LOG_FORMAT"] == "text"
