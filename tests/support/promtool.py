"""promtool, Prometheus's rule checker and rule unit-test runner (Debian's `prometheus` package), for the tests of
the chart's alert rules and Grafana dashboard: found on PATH and run from the repository's root. Without it the
tests FAIL and say how to install it: rules nobody checked are not tested rules."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import yaml

from support.paths import REPO

MISSING = (
    "promtool is not installed: the alert-rule and dashboard tests need it. Run `bash scripts/system-deps.sh` "
    "(it installs Debian's `prometheus` package, which has /usr/bin/promtool)"
)


def promtool_binary() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail(MISSING, pytrace=False)
    return binary


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """`promtool ARGS` in the repository's root (relative paths are the repository's), its output captured."""
    return subprocess.run([promtool_binary(), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def check_recording_rules(exprs: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on one group of recording rules, record name -> expr: promtool parses every
    expression and names each rule (so each expression) it cannot parse."""
    rules: list[dict[str, Any]] = [{"record": name, "expr": expr} for name, expr in exprs.items()]
    return check_rule_groups([{"name": "expressions", "rules": rules}])


def check_rule_groups(groups: Sequence[Mapping[str, Any]]) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on a temporary rule file holding `groups`."""
    fd, path = tempfile.mkstemp(prefix="elastream-rules-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yaml.safe_dump({"groups": [dict(g) for g in groups]}, handle, sort_keys=False)
        return run_promtool("check", "rules", path)
    finally:
        os.unlink(path)
