"""The real kstatus (sigs.k8s.io/cli-utils, what Flux's health checks run) on the status documents the operator
writes in each state (tests/support/health_cases.py): Current when running as specified, InProgress while starting,
scaling, waiting for Redis or while observedGeneration lags the generation, Failed when Stalled.

The unit tier checks the same documents against a Python twin of kstatus' rules; this checks the twin. The
checker is built by scripts/kstatus-tool.sh (Go module proxy only, cached by cli-utils version)."""

from __future__ import annotations

import os
import subprocess
import sys

from support.paths import REPO


def test_kstatus_reads_each_status_the_operator_writes_as_meant() -> None:
    done = subprocess.run(
        ["bash", os.path.join(REPO, "scripts", "kstatus-tool.sh"), "--check"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, f"kstatus disagrees or did not build:\n{done.stdout}\n{done.stderr}"
    assert "WRONG" not in done.stdout and done.stdout.count("ok ") >= 10, done.stdout
