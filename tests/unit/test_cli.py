"""The offline CLI: JSON shapes, human output, and one-line errors with exit code 1 on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from elastream.cli import main
from support.manifests import edge, manifest, sink, src, work


@pytest.fixture
def files(tmp_path):
    doc = manifest(
        [
            src("spout", 2, rate=3000),
            work("parse", 2, costMs=2),
            work("enrich", 2, costMs=0.2),
            sink("out", costMs=0.1),
        ],
        [edge("spout", "parse"), edge("parse", "enrich"), edge("enrich", "out", "fields", key="user")],
        name="demo",
        nodes=2,
    )
    topo = tmp_path / "demo.yaml"
    topo.write_text(yaml.safe_dump(doc))
    snap = tmp_path / "snap.json"
    assert main(["simulate", str(topo), "--snapshot-out", str(snap)]) == 0
    return topo, snap


def run_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_validate(files, capsys) -> None:
    topo, _ = files
    assert main(["validate", str(topo)]) == 0
    assert "valid — topology demo: 4 vertices" in capsys.readouterr().out


def test_etp_json(files, capsys) -> None:
    topo, snap = files
    data = run_json(capsys, "etp", str(topo), "--metrics", str(snap))
    assert set(data) == {"throughput", "vertices"}
    assert set(data["vertices"]["parse"]) == {"input_rate", "processing_rate", "congested", "etp"}
    assert data["vertices"]["parse"]["congested"] is True
    assert data["vertices"]["parse"]["etp"] == 1.0
    assert data["throughput"] == pytest.approx(2 * 500.0)


def test_plan_json_and_text(files, capsys) -> None:
    topo, snap = files
    data = run_json(capsys, "plan", str(topo), "--metrics", str(snap), "--nodes", "3")
    assert data["direction"] == "out" and data["from_nodes"] == 2 and data["to_nodes"] == 3
    assert data["added_nodes"] == ["node-2"] and data["removed_nodes"] == []
    assert data["steps"][0]["target"] == "parse"
    # enrich and out have headroom (their true rates are known): no slot for them, parse gets most
    vertices = [e["vertex"] for e in data["new_executors"]]
    assert "enrich" not in vertices and "out" not in vertices
    assert vertices.count("parse") >= 3
    assert data["moves"] == []
    assert data["predicted_throughput"] > 1000.0
    assert data["steps"][0]["etp"]["parse"] == 1.0
    capsys.readouterr()
    assert main(["plan", str(topo), "--metrics", str(snap), "--nodes", "1", "--strategy", "stela"]) == 0
    text = capsys.readouterr().out
    assert "scale in 2 -> 1 nodes with stela" in text and "ETPSum" in text


def test_simulate_schedule_from_plan_output(files, capsys, tmp_path) -> None:
    topo, snap = files
    plan = run_json(capsys, "plan", str(topo), "--metrics", str(snap), "--nodes", "3")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = run_json(capsys, "simulate", str(topo), "--schedule", str(path))
    assert result["throughput"] == pytest.approx(plan["predicted_throughput"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["validate", "{bad}"], "spec.nodes: 0 is below 1"),
        (["etp", "{topo}", "--metrics", "{missing}"], "cannot read"),
        (["plan", "{topo}", "--metrics", "{snap}", "--nodes", "0"], "at least 1 node"),
        (["plan", "{topo}", "--metrics", "{wrong}", "--nodes", "3"], "snapshot.vertices: no rates for"),
        # a node count no shared cluster gives one topology: refused before anything is planned or sent
        (["plan", "{topo}", "--metrics", "{snap}", "--nodes", "1000000000"], "--nodes: 1000000000 is above 1000"),
        (["plan", "{topo}", "--pareto", "--max-nodes", "5000"], "--max-nodes: 5000 is above 1000"),
        (["scale", "{topo}", "--nodes", "1000000000"], "--nodes: 1000000000 is outside [1, 1000]"),
        (["demo", "{topo}", "--out", "1000000000", "--engine", "python"], "--out: 1000000000 is outside [1, 1000]"),
        (["etp", "{topo}", "--metrics", "{snap}", "--congestion-rate", "0.5"], "--congestion-rate"),
        # every interface needs the address peers reach the worker at
        (
            [
                "worker",
                "--topology",
                "{topo}",
                "--node",
                "node-0",
                "--redis",
                "redis://127.0.0.1:1/0",
                "--bind",
                "0.0.0.0:7000",
            ],
            "--advertise: --bind 0.0.0.0 listens on every interface",
        ),
        (
            ["operator", "--redis", "redis://127.0.0.1:1/0", "--worker-start-timeout", "0"],
            "--worker-start-timeout: 0 s; give 1 to 3600 seconds",
        ),
        (
            ["operator", "--redis", "redis://127.0.0.1:1/0", "--waiting-passes", "-1"],
            "--waiting-passes: -1; give 0 to 4096 threads",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(files, tmp_path, argv, message) -> None:
    topo, snap = files
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load(topo.read_text())
    doc["spec"]["nodes"] = 0
    bad.write_text(yaml.safe_dump(doc))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"vertices": {"spout": {"processing_rate": 1, "emit_rate": 1}}}))
    names = {"bad": bad, "topo": topo, "snap": snap, "missing": tmp_path / "nope.json", "wrong": wrong}
    args = [a.format(**names) for a in argv]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "elastream", *args], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert all(line.startswith("error: ") for line in proc.stderr.splitlines())


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({}, "ELASTREAM_DATA_PLANE_SERVER_KEY and ELASTREAM_DATA_PLANE_CLIENT_KEY not set"),
        (
            {"ELASTREAM_DATA_PLANE_SERVER_KEY": "x" * 39 + "!", "ELASTREAM_DATA_PLANE_CLIENT_KEY": "short-secret"},
            "ELASTREAM_DATA_PLANE_SERVER_KEY / ELASTREAM_DATA_PLANE_CLIENT_KEY:",
        ),
        ({"ELASTREAM_DATA_PLANE_AUTH": "maybe"}, "ELASTREAM_DATA_PLANE_AUTH='maybe': expected on or off"),
    ],
)
def test_a_worker_without_valid_data_plane_keys_says_which_variable_never_its_value(files, keys, message) -> None:
    topo, _ = files
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTREAM_DATA_PLANE")}
    env.update(keys, PYTHONWARNINGS="ignore")
    argv = ["worker", "--topology", str(topo), "--node", "node-0", "--redis", "redis://127.0.0.1:1/0"]
    proc = subprocess.run([sys.executable, "-m", "elastream", *argv], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and message in proc.stderr and "Traceback" not in proc.stderr
    assert "short-secret" not in proc.stderr and "x" * 39 not in proc.stderr


@pytest.mark.parametrize("command", ["run", "operator"])
def test_run_and_operator_with_a_bad_data_plane_switch_are_one_line(files, command: str) -> None:
    topo, _ = files
    env = dict(os.environ, PYTHONWARNINGS="ignore", ELASTREAM_DATA_PLANE_AUTH="sometimes")
    argv = ["run", str(topo), "--engine", "python", "--duration", "1"] if command == "run" else ["operator"]
    argv += ["--redis", "redis://127.0.0.1:1/0"]
    proc = subprocess.run([sys.executable, "-m", "elastream", *argv], capture_output=True, text=True, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "error: ELASTREAM_DATA_PLANE_AUTH='sometimes': expected on or off" in proc.stderr
    assert "Traceback" not in proc.stderr


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "elastream", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"placement": ["node-0"]}', "placement is not a mapping of node -> [executors]"),
        ('{"placement": {"node-0": "spout#0"}}', "placement.node-0 is not a list of executor ids"),
        ('{"placement": {"node-0": [1, 2]}}', "placement.node-0 is not a list of executor ids"),
        ('{"placement": {"node-0": ["spout"]}}', "placement.node-0: executor id 'spout' is not of the form"),
        ('{"placement": {"node-0": ["ghost#0"]}}', "executor ghost#0 belongs to no vertex of demo"),
        ('{"placement": {"node-0": ["spout#0"]}, "slotsPerNode": "8"}', "slotsPerNode '8' is not an integer"),
        ('{"placement": {"node-0": ["spout#0"]}, "nodes": "node-0"}', "nodes 'node-0' is not a list"),
        ('{"placement": {"node-0": ["spout#0"]}}', "schedule has no executor of vertex parse"),
        ('{"schedule": 3}', "is not a schedule"),
        ("[1, 2]", "is not a schedule"),
    ],
)
def test_a_malformed_schedule_file_is_one_line(files, tmp_path, content: str, message: str) -> None:
    topo, _ = files
    path = tmp_path / "schedule.json"
    path.write_text(content)
    proc = _run("simulate", str(topo), "--schedule", str(path))
    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert message in proc.stderr


def test_non_utf8_files_are_one_line(files, tmp_path) -> None:
    topo, _ = files
    manifest_path = tmp_path / "latin1.yaml"
    manifest_path.write_bytes(topo.read_bytes().replace(b"name: demo", b"name: d\xe9mo"))
    snap_path = tmp_path / "latin1.json"
    snap_path.write_bytes(b'{"vertices": {"caf\xe9": 1}}')
    for argv in (["validate", str(manifest_path)], ["etp", str(topo), "--metrics", str(snap_path)]):
        proc = _run(*argv)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and "is not UTF-8" in proc.stderr, proc.stderr


def test_plan_to_the_same_node_count_is_direction_none(files, capsys) -> None:
    topo, snap = files
    data = run_json(capsys, "plan", str(topo), "--metrics", str(snap), "--nodes", "2")
    assert data["direction"] == "none"
    assert data["moves"] == [] and data["new_executors"] == [] and data["added_nodes"] == []


def test_a_worker_refuses_a_manifest_its_parser_refuses_in_one_line_naming_the_field(tmp_path) -> None:
    doc = manifest([src("a", 1, rate=10), work("b", 1)], [edge("a", "b"), edge("b", "a")], name="cyclic")
    topo = tmp_path / "cyclic.yaml"
    topo.write_text(yaml.safe_dump(doc))
    proc = _run("worker", "--topology", str(topo), "--node", "node-0", "--redis", "redis://127.0.0.1:1/0")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and "spec.streams" in proc.stderr and "Traceback" not in proc.stderr


def test_a_worker_does_not_check_its_manifest_against_the_crd_again(files, monkeypatch, capsys) -> None:
    """A worker's manifest was checked by its launcher; the CRD check (its CEL rules compiled) would cost every
    starting worker about half a second of CPU. Here the check raises if called: the worker must get past the
    manifest and stop at the next thing it lacks (the data plane's keys)."""
    import elastream.crd

    def refused(*_args, **_kwargs):
        raise AssertionError("the worker ran the CRD check")

    monkeypatch.setattr(elastream.crd, "check_manifest", refused)  # what `load_manifest` calls
    for name in [k for k in os.environ if k.startswith("ELASTREAM_DATA_PLANE")]:
        monkeypatch.delenv(name)
    topo, _ = files
    assert main(["worker", "--topology", str(topo), "--node", "node-0", "--redis", "redis://127.0.0.1:1/0"]) == 1
    assert "ELASTREAM_DATA_PLANE_SERVER_KEY and ELASTREAM_DATA_PLANE_CLIENT_KEY not set" in capsys.readouterr().err
