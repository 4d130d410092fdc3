"""A synthetic source's `steps`, `csv` and `profile`: validated in the manifest (one line naming the field),
CSV paths resolved against the manifest's directory."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from elastream.core.rates import rate_config_problems
from elastream.core.topology import TopologyError, parse_manifest
from elastream.crd import check_manifest, load_manifest
from elastream.runtime.operators.sources import RateProfile
from elastream.worker_inputs.rate_files import resolve_rate_file
from elastream.worker_inputs.user_code import OperatorLoadError
from support.manifests import edge, manifest, sink


def with_source(**config: object) -> dict:
    return manifest([{"name": "src", "source": {"type": "synthetic", **config}}, sink("out")], [edge("src", "out")])


def problems(**config: object) -> list[str]:
    with pytest.raises(TopologyError) as info:
        check_manifest(with_source(**config))
    return info.value.problems


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"steps": "fast"}, "spec.vertices[0].source.steps: 'fast' is not a list"),
        ({"steps": []}, "spec.vertices[0].source.steps: has 0 items; give at least 1"),
        ({"steps": [{"rate": 10}]}, "spec.vertices[0].source.steps[0].seconds: is missing"),
        ({"steps": [{"rate": 10, "seconds": 0}]}, "spec.vertices[0].source.steps[0].seconds: 0 is not above 0"),
        ({"steps": [{"rate": -1, "seconds": 1}]}, "spec.vertices[0].source.steps[0].rate: -1 is below 0"),
        ({"steps": [5]}, "spec.vertices[0].source.steps[0]: 5 is not a mapping"),
        ({"steps": [{"rate": 1, "seconds": 1, "ramp": 2}]}, "spec.vertices[0].source.steps[0].ramp: unknown field"),
        ({"csv": 3}, "spec.vertices[0].source.csv: 3 is not a string"),
        ({"csv": "r.csv", "steps": [{"rate": 1, "seconds": 1}]}, "has steps and csv; give at most one"),
        ({"profile": "autoscale-7-step", "rate": 10}, "source.profile: 'autoscale-7-step' is unknown"),
        ({"profile": "autoscale-3-step"}, "spec.vertices[0].source.rate: None is not a number > 0"),
        (
            {"profile": "autoscale-3-step", "rate": 9, "stepSeconds": "1m"},
            "source.stepSeconds: '1m' is not a number; set it to a number in (0, 86400]",
        ),
    ],
)
def test_bad_rate_configs_are_one_line_naming_the_field(config: dict, expected: str) -> None:
    found = problems(**config)
    assert len(found) == 1, found
    assert expected in found[0]


@pytest.mark.parametrize(
    ("config", "rates_at"),
    [
        # steps repeat after their last one: t = 3.5 is back in the first step
        ({"steps": [{"rate": 100, "seconds": 2}, {"rate": 0, "seconds": 1}]}, {0.5: 100, 2.5: 0, 3.5: 100}),
        # AUTOSCALE's 5-step stream scaled to 500/s: 20 %, 100 %, 40 %, 100 %, 20 % for 5 s each
        (
            {"profile": "autoscale-5-step", "rate": 500, "stepSeconds": 5, "fluctuation": 0},
            {2: 100, 7: 500, 12: 200, 17: 500, 22: 100, 27: 100},
        ),
    ],
)
def test_valid_rate_configs_pass_and_give_their_rates(config: dict, rates_at: dict[float, float]) -> None:
    assert rate_config_problems(config, "spec.vertices[0].source") == []
    topology = parse_manifest(with_source(**config))
    assert dict(topology.vertices["src"].config) == {"type": "synthetic", **config}
    profile = RateProfile(topology.vertices["src"].config)
    assert {t: profile.rate_at(t) for t in rates_at} == pytest.approx(rates_at)


def test_a_csv_rate_file_passes_validation_unread() -> None:
    # The file is resolved against the manifest's directory when the source starts, not when it is parsed.
    assert rate_config_problems({"csv": "rates.csv"}, "spec.vertices[0].source") == []
    topology = parse_manifest(with_source(csv="rates.csv"))
    assert topology.vertices["src"].config["csv"] == "rates.csv"


def test_a_relative_csv_is_read_from_the_manifest_directory(tmp_path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "rates.csv").write_text("# rate per second\n100\n300\n")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(with_source(csv="profiles/rates.csv")))
    topology = load_manifest(str(path))
    config = resolve_rate_file(topology.vertices["src"], str(tmp_path))
    assert config["csv"] == str(tmp_path / "profiles" / "rates.csv")
    assert RateProfile(config).due(2.0) == pytest.approx(400)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file or directory"),
        ("10\nlots\n", "line 2: the first column is not a number"),
        ("10\nnan\n", "line 2: the rate is not a finite number in [0, 1e+07] events/s"),
        ("10\n1e9\n", "line 2: the rate is not a finite number in [0, 1e+07] events/s"),
        ("# none\n", "holds no rate"),
    ],
)
def test_a_bad_csv_fails_with_the_field_and_the_file(tmp_path, content: str | None, reason: str) -> None:
    if content is not None:
        (tmp_path / "rates.csv").write_text(content)
    topology = parse_manifest(with_source(csv="rates.csv"))
    with pytest.raises(OperatorLoadError) as info:
        resolve_rate_file(topology.vertices["src"], str(tmp_path))
    message = str(info.value)
    assert message.startswith(f"spec.vertices[src].source.csv: {tmp_path}/rates.csv: {reason}")
    assert "lots" not in message and "nan" not in message and "1e9" not in message  # never the file's content


def test_validate_reports_a_bad_step_in_one_line(tmp_path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(with_source(csv="missing.csv")))
    result = subprocess.run(
        [sys.executable, "-m", "elastream", "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr  # the manifest itself is fine; the file is checked at start
    path.write_text(yaml.safe_dump(with_source(steps=[{"rate": 10, "seconds": -1}])))
    result = subprocess.run(
        [sys.executable, "-m", "elastream", "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "error: spec.vertices[0].source.steps[0].seconds: -1 is not above 0; set it above 0" in result.stderr


def test_a_csv_path_out_of_the_rate_directory_is_refused(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the parser refuses ~, .. and absolute paths; a link inside the directory that leads out of it is
    # caught where the file is opened, and so is a vertex built without the parser
    from dataclasses import replace

    (tmp_path / "secret").write_text("hunter2\n")
    rates_dir = tmp_path / "rates"
    rates_dir.mkdir()
    (rates_dir / "out.csv").symlink_to(tmp_path / "secret")
    vertex = parse_manifest(with_source(csv="out.csv")).vertices["src"]
    monkeypatch.setenv("ELASTREAM_RATE_DIR", str(rates_dir))
    with pytest.raises(OperatorLoadError) as info:
        resolve_rate_file(vertex, "/nowhere")
    assert str(info.value).startswith("spec.vertices[src].source.csv: 'out.csv' leads out of the rate directory")
    assert "hunter2" not in str(info.value)
    for path in ("/etc/passwd", "../secret", "~/secret"):
        hostile = replace(vertex, config={**vertex.config, "csv": path})
        with pytest.raises(
            OperatorLoadError, match=r"^spec\.vertices\[src\]\.source\.csv: .* inside the rate directory"
        ):
            resolve_rate_file(hostile, str(rates_dir))


def test_the_rate_directory_comes_from_the_environment(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rates.csv").write_text("5\n")
    vertex = parse_manifest(with_source(csv="rates.csv")).vertices["src"]
    monkeypatch.setenv("ELASTREAM_RATE_DIR", str(tmp_path))
    assert resolve_rate_file(vertex, "/nowhere")["csv"] == str(tmp_path / "rates.csv")
    monkeypatch.delenv("ELASTREAM_RATE_DIR")
    with pytest.raises(OperatorLoadError, match="No such file"):
        resolve_rate_file(vertex, "/nowhere")


def test_a_rate_file_that_is_no_regular_file_is_refused_without_waiting(tmp_path) -> None:
    import os

    os.mkfifo(tmp_path / "rates.csv")  # opening a FIFO for reading would wait for a writer forever
    vertex = parse_manifest(with_source(csv="rates.csv")).vertices["src"]
    with pytest.raises(OperatorLoadError, match=r"rates\.csv: is not a regular file"):
        resolve_rate_file(vertex, str(tmp_path))
