"""`elastream plan` without --metrics (the fluid model's snapshot of the manifest) and `plan --pareto`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from elastream.cli import main
from elastream.cli.offline import MODEL_NOTE
from support.manifests import edge, manifest, sink, src, work
from support.paths import EXAMPLES


def _chain_document(**a_config) -> dict:
    """s (2000/s) -> a (4 ms, up to 8 executors) -> z (1 ms), 3 slots per node (test_pareto's chain)."""
    return manifest(
        [
            {**src("s", 1, rate=2000), "maxParallelism": 4},
            {**work("a", 1, **({"costMs": 4} | a_config)), "maxParallelism": 8},
            {**sink("z", 1, costMs=1), "maxParallelism": 4},
        ],
        [edge("s", "a"), edge("a", "z")],
        name="chain",
        nodes=1,
        slotsPerNode=3,
    )


@pytest.fixture
def chain(tmp_path):
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(_chain_document()))
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "elastream", *args], capture_output=True, text=True, env=env)


def test_plan_without_metrics_plans_from_the_model_snapshot(tmp_path, capsys) -> None:
    pageload = os.path.join(EXAMPLES, "pageload.yaml")
    assert main(["plan", pageload, "--nodes", "8"]) == 0
    out, err = capsys.readouterr()
    assert err.strip() == MODEL_NOTE
    assert out.startswith("plan pageload: scale out 7 -> 8 nodes with stela")
    # the same plan as from the snapshot `simulate --snapshot-out` writes
    snap = tmp_path / "pageload.json"
    assert main(["simulate", pageload, "--snapshot-out", str(snap)]) == 0
    capsys.readouterr()
    assert main(["plan", pageload, "--nodes", "8", "--json"]) == 0
    without = json.loads(capsys.readouterr().out)
    assert main(["plan", pageload, "--metrics", str(snap), "--nodes", "8", "--json"]) == 0
    measured = capsys.readouterr()
    assert measured.err == ""
    assert json.loads(measured.out) == without


def test_pareto_table_marks_the_front_and_the_recommendation(chain, capsys) -> None:
    assert main(["plan", str(chain), "--pareto", "--max-nodes", "6"]) == 0
    out, err = capsys.readouterr()
    assert MODEL_NOTE in err
    lines = out.splitlines()
    assert lines[0] == "pareto chain: best parallelism for 1..4 nodes (of 1..6) × 3 slots, rates from the fluid model"
    assert "throughput bound: 2000.0 tuples/s at the sinks, the offered source rate (s 2000/s)" in lines[1]
    rows = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert [r[:4] for r in rows] == [
        ["1", "3", "250.0", "12.5%"],
        ["2", "6", "1000.0", "50.0%"],
        ["3", "9", "1500.0", "75.0%"],
        ["4", "11", "2000.0", "100.0%"],
    ]
    assert rows[3][4:6] == ["yes", "(rec)"] and "s=1 a=8 z=2" in " ".join(rows[3])
    assert lines[-1].startswith("recommended: 4 nodes, 11 executors, 2000.0 tuples/s")


def test_pareto_json_is_machine_readable_and_the_note_stays_off_stdout(chain, capsys, tmp_path) -> None:
    assert main(["plan", str(chain), "--pareto", "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert MODEL_NOTE in err
    assert data["rates_from"] == "model" and data["max_nodes"] == 2  # 2 × spec.nodes
    assert data["offered"] == {"s": 2000.0} and data["bound"] == pytest.approx(2000.0)
    assert [c["nodes"] for c in data["configurations"]] == [1, 2]
    assert data["recommended"] == 2 and data["configurations"][1]["parallelism"] == {"s": 1, "a": 4, "z": 1}
    # with a measured snapshot: no note, rates from it
    snap = tmp_path / "snap.json"
    assert main(["simulate", str(chain), "--snapshot-out", str(snap)]) == 0
    capsys.readouterr()
    assert main(["plan", str(chain), "--pareto", "--metrics", str(snap), "--json"]) == 0
    measured = capsys.readouterr()
    assert measured.err == "" and json.loads(measured.out)["rates_from"] == "metrics"


def test_default_node_bound_is_the_autoscalers_when_enabled(tmp_path, capsys) -> None:
    doc = _chain_document()
    doc["spec"]["scaling"] = {"auto": {"enabled": True, "minNodes": 1, "maxNodes": 3}}
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(path), "--pareto", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_nodes"] == 3 and [c["nodes"] for c in data["configurations"]] == [1, 2, 3]


def test_a_vertex_without_cost_is_a_clear_error_without_metrics(tmp_path) -> None:
    doc = _chain_document()
    del doc["spec"]["vertices"][1]["logic"]["costMs"]
    path = tmp_path / "nocost.yaml"
    path.write_text(yaml.safe_dump(doc))
    for argv in (["--pareto"], ["--nodes", "2"]):
        proc = _run("plan", str(path), *argv)
        assert proc.returncode == 1, proc.stdout
        assert "Traceback" not in proc.stderr
        assert proc.stderr.splitlines() == [
            "error: vertex a: no costMs, so the fluid model cannot tell its capacity; add logic.costMs (ms per "
            "tuple) to the manifest, or pass --metrics SNAP.json with measured rates"
        ]


def test_a_source_without_rate_or_cost_is_a_clear_error_without_metrics(tmp_path) -> None:
    doc = _chain_document()
    doc["spec"]["vertices"][0]["source"] = {"type": "redis-stream", "stream": "in"}
    path = tmp_path / "redis.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = _run("plan", str(path), "--pareto")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: vertex s: a source with neither rate nor costMs emits without bound")
    assert "pass --metrics SNAP.json" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pareto", "--max-nodes", "0"], "--max-nodes: 0 is below 1"),
        (["--pareto", "--max-nodes", "two"], "--max-nodes: 'two' is not an integer"),
        (["--nodes", "2", "--max-nodes", "3"], "--max-nodes goes with --pareto"),
        (["--nodes", "2", "--pareto"], "not allowed with argument"),
        ([], "one of the arguments --nodes --pareto is required"),
    ],
)
def test_bad_flags_are_usage_errors_exit_2(chain, capsys, argv, message) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(chain), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_node_bound_too_small_is_one_line(tmp_path) -> None:
    doc = _chain_document()
    doc["spec"]["slotsPerNode"] = 2
    doc["spec"]["nodes"] = 2
    path = tmp_path / "tight.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = _run("plan", str(path), "--pareto", "--max-nodes", "1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: --max-nodes 1: 3 executors (one per vertex, fixed ones as written) need 2 nodes × 2 slots; "
        "allow at least 2 nodes or raise spec.slotsPerNode to 3"
    ]
