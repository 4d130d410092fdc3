"""elastream's Prometheus alert rules (charts/elastream/files/alerts.yaml, the `spec` of the chart's
PrometheusRule): `promtool check rules` accepts them, their unit tests (tests/promtool/*.yaml, `promtool test
rules`) pass, and every alert has a test case in which it fires and one in which it does not, so an alert added
without tests fails here. Each alert is one per topology (aggregated by namespace and topology), carries a
severity, a summary and a description naming the topology, and a runbook in docs/troubleshooting.md.

These tests need promtool (Debian's `prometheus` package, which `scripts/system-deps.sh` installs): without it
they FAIL, saying so.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from support.paths import REPO
from support.promtool import check_rule_groups, run_promtool

ALERTS = os.path.join("charts", "elastream", "files", "alerts.yaml")
PROMTOOL_TESTS = os.path.join("tests", "promtool")
RUNBOOKS = "https://github.com/elastream/elastream/blob/main/docs/troubleshooting.md"
#: the alerts of issue 40's contract (group `elastream`)
EXPECTED_ALERTS = {
    "ElastreamTopologyStalled",
    "ElastreamTopologyDegraded",
    "ElastreamScalingFailed",
    "ElastreamCheckpointTooOld",
    "ElastreamBacklogGrowing",
    "ElastreamRedisMemoryNearLimit",
}
#: alerts on the operator's Redis: its metrics carry no topology, so these are one per operator (the scrape's
#: namespace) rather than one per topology
PER_OPERATOR = {"ElastreamRedisMemoryNearLimit"}
#: alerts on a condition (a 0/1 series): their descriptions name the condition's reason (a query), not the value
ON_A_CONDITION = {"ElastreamTopologyStalled", "ElastreamTopologyDegraded"}
AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\s*(?:(by|without)\s*\(([^)]*)\))?\s*\(")


def load_yaml(path: str) -> Any:
    with open(os.path.join(REPO, path), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def alert_rules() -> dict[str, Mapping[str, Any]]:
    """alert name -> its rule, from every group of alerts.yaml."""
    spec = load_yaml(ALERTS)
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule}


def promtool_test_files() -> list[str]:
    return sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, PROMTOOL_TESTS, "*.yaml")))


def assert_promtool_ok(*args: str) -> str:
    proc = run_promtool(*args)
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_promtool_check_rules_accepts_the_alerts() -> None:
    out = assert_promtool_ok("check", "rules", ALERTS)
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in out, out


def test_promtool_check_rules_refuses_a_broken_rule() -> None:
    """The check above could fail: promtool refuses an expression that does not parse and a bad template."""
    groups = load_yaml(ALERTS)["groups"]
    broken = [dict(groups[0], rules=[dict(groups[0]["rules"][0], expr="max by (namespace (x)")])]
    proc = check_rule_groups(broken)
    assert proc.returncode != 0 and "could not parse expression" in proc.stdout + proc.stderr, proc.stdout
    bad_template = dict(groups[0]["rules"][0], annotations={"summary": "{{ $labels.namespace "})
    proc = check_rule_groups([dict(groups[0], rules=[bad_template])])
    assert proc.returncode != 0, proc.stdout


def test_promtool_unit_tests_pass() -> None:
    files = promtool_test_files()
    assert files, f"no promtool tests in {PROMTOOL_TESTS}"
    out = assert_promtool_ok("test", "rules", *files)
    assert out.count("SUCCESS") == len(files), out


def test_the_alerts_are_the_contracts_in_group_elastream() -> None:
    spec = load_yaml(ALERTS)
    assert list(spec) == ["groups"], "alerts.yaml is a PrometheusRule's spec: a top-level `groups:` list only"
    assert [group["name"] for group in spec["groups"]] == ["elastream"]
    assert set(alert_rules()) == EXPECTED_ALERTS


def test_every_alert_has_a_test_where_it_fires_and_one_where_it_does_not() -> None:
    rules = alert_rules()
    fires: dict[str, list[str]] = {name: [] for name in rules}
    quiet: dict[str, list[str]] = {name: [] for name in rules}
    unknown: list[str] = []
    for path in promtool_test_files():
        suite = load_yaml(path)
        assert [os.path.normpath(os.path.join(os.path.dirname(path), f)) for f in suite["rule_files"]] == [
            os.path.normpath(ALERTS)
        ], f"{path}: rule_files must be {ALERTS} alone (relative to the test file)"
        for test in suite["tests"]:
            for case in test.get("alert_rule_test") or []:
                name = case["alertname"]
                where = f"{path}: {test.get('name', '?')} at {case['eval_time']}"
                if name not in rules:  # promtool passes "no alert" of an alert that does not exist
                    unknown.append(f"{where}: {name}")
                elif case.get("exp_alerts"):
                    fires[name].append(where)
                else:
                    quiet[name].append(where)
    assert not unknown, f"promtool test cases of alerts alerts.yaml does not have: {unknown}"
    assert not [n for n, cases in fires.items() if not cases], f"alerts no promtool test sees firing: {fires}"
    assert not [n for n, cases in quiet.items() if not cases], f"alerts no promtool test sees quiet: {quiet}"


def test_the_firing_cases_expect_the_alerts_labels_and_annotations() -> None:
    """A firing case names the whole alert (its severity, namespace, topology and the three annotations), so a
    changed label, summary or description shows up in a test, not only in an inbox."""
    rules = alert_rules()
    for path in promtool_test_files():
        for test in load_yaml(path)["tests"]:
            for case in test.get("alert_rule_test") or []:
                for alert in case.get("exp_alerts") or []:
                    rule = rules[case["alertname"]]
                    where = f"{path}: {test.get('name')} at {case['eval_time']}"
                    assert alert["exp_labels"]["severity"] == rule["labels"]["severity"], where
                    assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}, where
                    if case["alertname"] not in PER_OPERATOR:
                        assert {"namespace", "topology"} <= set(alert["exp_labels"]), where


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_alert_shape(name: str) -> None:
    rule = alert_rules()[name]
    assert rule["labels"]["severity"] in ("critical", "warning")
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["runbook_url"] == f"{RUNBOOKS}#{name.lower()}"
    if name in PER_OPERATOR:
        grouping = "namespace"
    else:
        grouping = "namespace, topology"
        for key in ("summary", "description"):
            assert "{{ $labels.namespace }}/{{ $labels.topology }}" in annotations[key], key
    if name in ON_A_CONDITION:
        assert "| query" in annotations["description"] and 'label "reason"' in annotations["description"]
    else:
        assert "$value" in annotations["description"]
    aggregations = AGGREGATION.findall(rule["expr"])
    assert aggregations, f"{name}: its expression aggregates nothing, so it fires once per series"
    for function, how, labels in aggregations:
        assert how == "by" and [label.strip() for label in labels.split(",")] == grouping.split(", "), (
            f"{name}: `{function} {how} ({labels})`: every aggregation is `by ({grouping})`"
        )
