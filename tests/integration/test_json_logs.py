"""`elastream run --log-format json` as a user runs it: every line on its stderr and every line of its local
workers' logs is one JSON object naming the topology (a worker's its node too): one setting, the whole run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from support.harness import ELASTREAM, write_manifest
from support.manifests import edge, manifest, sink, src, work

pytestmark = pytest.mark.integration

KEYS = ["time", "level", "logger", "message", "namespace", "topology"]


def test_a_json_run_and_its_workers_write_json_lines_naming_the_topology(tmp_path, redis_url: str) -> None:
    help_text = subprocess.run([*ELASTREAM, "worker", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--log-format text|json" in help_text
    doc = manifest(
        [src("src", 1, rate=200), work("w", 2, costMs=0.1), sink("out")],
        [edge("src", "w"), edge("w", "out")],
        name="json-logs",
        nodes=2,
        slotsPerNode=2,
    )
    path = write_manifest(str(tmp_path), doc)
    env = {k: v for k, v in os.environ.items() if k != "ELASTREAM_LOG_FORMAT"} | {"ELASTREAM_LOG_LEVEL": "INFO"}
    command = [*ELASTREAM, "run", path, "--redis", redis_url, "--engine", "python", "--duration", "4"]
    result = subprocess.run([*command, "--log-format", "json"], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"worker logs in (\S+)\)", result.stdout)
    assert found is not None, result.stdout[-2000:]
    run_dir = found.group(1)
    try:
        run_lines = result.stderr.splitlines()
        assert run_lines, "the run logged nothing at INFO"
        for line in run_lines:
            parsed = json.loads(line)  # every line, not only most
            assert list(parsed)[:6] == KEYS, line
            assert (parsed["namespace"], parsed["topology"]) == ("default", "json-logs"), line
        logs = sorted(name for name in os.listdir(run_dir) if name.endswith(".log"))
        assert logs == ["node-0.log", "node-1.log"]
        for name in logs:
            with open(os.path.join(run_dir, name), encoding="utf-8") as handle:
                lines = handle.read().splitlines()
            assert any("ready" in json.loads(line)["message"] for line in lines), lines[-5:]
            for line in lines:
                parsed = json.loads(line)
                assert list(parsed)[:7] == [*KEYS, "node"], line
                assert (parsed["namespace"], parsed["topology"], parsed["node"]) == (
                    "default",
                    "json-logs",
                    name.removesuffix(".log"),
                ), line
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
