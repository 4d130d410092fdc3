"""`bench/stela.py --smoke` end to end: real worker processes scale out mid-run under two plans, and the
report, its raw runs and its plots are written; every run is exact where its protocol promises it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.paths import REPO

# worker processes and a Redis like the rest of the integration tier; `bench` says a benchmark script runs
# (at smoke size: `-m "not bench"` leaves it out, the default selection and CI keep it)
pytestmark = [pytest.mark.integration, pytest.mark.bench]


def test_bench_paper_smoke_writes_the_report_and_loses_nothing(tmp_path: str) -> None:
    out = os.path.join(str(tmp_path), "bench")
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "stela.py"), "--smoke", "--out", out],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for name in ("stela.md", "stela-runs.json", "stela-timelines.png", "stela-summary.png", "stela-prediction.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    with open(os.path.join(out, "stela-runs.json"), encoding="utf-8") as handle:
        runs = {r["plan"]: r for r in json.load(handle)["runs"]}
    assert set(runs) == {"stela", "round-robin"}
    for run in runs.values():
        assert run["outcome"] == "succeeded", run
        assert run["lost"] == 0, run  # both protocols restore everything
        assert run["before"] > 0 and run["predicted"] > 0 and run["timeline"]
    assert runs["stela"]["duplicated"] == 0  # CCR: exactly once
    assert runs["stela"]["nodes"] == [6, 7]
    with open(os.path.join(out, "stela.md"), encoding="utf-8") as handle:
        report = handle.read()
    assert "| linear | 6→7 | stela |" in report and "How far to trust `elastream plan`" in report
