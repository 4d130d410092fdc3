"""elastream's Grafana dashboard (charts/elastream/files/dashboard.json, the chart's dashboard ConfigMap): a
dashboard model Grafana provisions as it is (uid, title, the variables datasource, namespace and topology, every
panel a timeseries on `${datasource}`), whose every query, with the variables substituted, is PromQL that
Prometheus parses (`promtool check rules` on the queries as recording rules: it names each one it cannot parse),
selects the chosen topology, and names only metrics elastream serves. The alert rules
(charts/elastream/files/alerts.yaml) are held to the same metric names.

These tests need promtool (Debian's `prometheus` package, which `scripts/system-deps.sh` installs): without it
they FAIL, saying so.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml
from test_metrics_doc import documented

from support.paths import REPO
from support.prometheus import substitute, vector_selectors
from support.promtool import check_recording_rules

DASHBOARD = os.path.join(REPO, "charts", "elastream", "files", "dashboard.json")
ALERTS = os.path.join(REPO, "charts", "elastream", "files", "alerts.yaml")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: what the variables are set to when the queries are checked
VARIABLES = {"namespace": "streams", "topology": "pageload"}

#: the metrics elastream serves, from docs/metrics.md (which test_metrics_doc keeps equal to the code): name on
#: the wire -> Prometheus type (a histogram is served as its _bucket, _sum and _count series)
CONTRACT_METRICS: dict[str, str] = {name: kind for name, (kind, _) in documented().items()}
#: the contract's metrics without namespace and topology labels (the operator's Redis)
OPERATOR_WIDE = {"elastream_redis_memory_used_bytes", "elastream_redis_memory_limit_bytes"}
#: each panel of the contract, by the metrics its queries must read
CONTRACT_PANELS = {
    "throughput per vertex": {"elastream_executor_processed_total"},
    "sink latency": {"elastream_sink_latency_seconds_bucket"},
    "backlog per source vertex": {"elastream_source_backlog_events"},
    "nodes desired vs ready": {"elastream_topology_desired_nodes", "elastream_topology_ready_nodes"},
    "checkpoint age": {"elastream_checkpoint_age_seconds"},
    "Redis memory used vs limit": {"elastream_redis_memory_used_bytes", "elastream_redis_memory_limit_bytes"},
}
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def series_names() -> set[str]:
    """Every series name the contract's metrics are served as."""
    names: set[str] = set()
    for name, kind in CONTRACT_METRICS.items():
        names |= {f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    with open(DASHBOARD, encoding="utf-8") as handle:
        loaded: dict[str, Any] = json.load(handle)
    return loaded


def variables(dashboard: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def prometheus_annotations(dashboard: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [a for a in dashboard["annotations"]["list"] if a.get("datasource") == DATASOURCE]


def slug(title: str) -> str:
    """`title` as a part of a recording rule's name ([a-z0-9_])."""
    return re.sub(r"\W+", "_", title.lower()).strip("_")


def queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(a recording-rule name saying where the query is, the query) for every PromQL query of the dashboard:
    the panels' targets, the annotations and the selectors of the variables' label_values()."""
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield f"dashboard:panel_{panel['id']}_{slug(panel['title'])}:{target['refId']}", target["expr"]
    for annotation in prometheus_annotations(dashboard):
        yield f"dashboard:annotation:{slug(annotation['name'])}", annotation["expr"]
    for name, variable in variables(dashboard).items():
        if variable["type"] == "query":
            match = LABEL_VALUES.match(variable["query"])
            assert match, f"variable {name}: {variable['query']!r} is not label_values(selector, label)"
            yield f"dashboard:variable:{name}", match["selector"]


def alert_texts() -> Iterator[tuple[str, str]]:
    """(alert name, text) of each alert's expression and of its annotations (their query templates)."""
    with open(ALERTS, encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)
    for group in spec["groups"]:
        for rule in group["rules"]:
            yield rule["alert"], rule["expr"]
            for key, text in rule["annotations"].items():
                yield f"{rule['alert']} {key}", text


def test_dashboard_model(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "elastream-topology"
    assert dashboard["title"]
    assert dashboard["id"] is None, "a provisioned dashboard has no id: Grafana gives it one"
    assert 36 <= dashboard["schemaVersion"] <= 41
    panels = dashboard["panels"]
    assert [p["id"] for p in panels] == sorted({p["id"] for p in panels}), "panel ids unique, in order"
    for panel in panels:
        assert panel["type"] == "timeseries", panel["title"]
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, (panel["title"], target["refId"])
    cells = [
        (x, y)
        for p in panels
        for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
        for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)), "panels overlap"
    assert all(x < 24 for x, _ in cells), "a panel past the grid's 24 columns"


def test_variables(dashboard: dict[str, Any]) -> None:
    found = variables(dashboard)
    assert list(found) == ["datasource", "namespace", "topology"]
    assert found["datasource"]["type"] == "datasource" and found["datasource"]["query"] == "prometheus"
    assert found["namespace"]["query"] == "label_values(elastream_topology_phase, namespace)"
    assert found["topology"]["query"] == 'label_values(elastream_topology_phase{namespace="$namespace"}, topology)'
    for name in ("namespace", "topology"):
        assert found[name]["type"] == "query"
        assert found[name]["datasource"] == DATASOURCE
        assert found[name]["refresh"] == 2, "refreshed when the time range changes: topologies come and go"


def test_rescales_are_an_annotation(dashboard: dict[str, Any]) -> None:
    (annotation,) = prometheus_annotations(dashboard)
    assert annotation["enable"] is True
    assert "changes(elastream_rescales_total{" in annotation["expr"] and annotation["expr"].endswith("> 0")
    assert {"direction", "outcome", "trigger"} <= set(annotation["tagKeys"].split(","))


def test_every_query_parses_as_promql(dashboard: dict[str, Any]) -> None:
    substituted = {name: substitute(expr, VARIABLES) for name, expr in queries(dashboard)}
    assert len(substituted) >= len(dashboard["panels"]) + 3
    for name, expr in substituted.items():
        assert "$" not in expr, f"{name}: a variable left in {expr!r}"
    proc = check_recording_rules(substituted)
    assert proc.returncode == 0, f"promtool cannot parse these queries:\n{proc.stdout}\n{proc.stderr}"


def test_the_promql_check_names_a_query_it_cannot_parse() -> None:
    """The check above could fail, and would say which query: promtool names the bad rule."""
    proc = check_recording_rules(
        {"dashboard:panel_1_good:A": "sum by (vertex) (rate(x[1m]))", "dashboard:panel_2_bad:A": "rate(x[$y])"}
    )
    errors = proc.stderr
    assert proc.returncode != 0
    assert '"dashboard:panel_2_bad:A": could not parse expression' in errors, errors
    assert "dashboard:panel_1_good:A" not in errors, errors


def test_the_dashboard_and_the_alerts_name_only_the_contracts_metrics(dashboard: dict[str, Any]) -> None:
    known = series_names()
    texts = [*queries(dashboard), *alert_texts()]
    unknown = {f"{where}: {name}" for where, text in texts for name, _ in vector_selectors(text) if name not in known}
    assert not unknown, f"metrics elastream does not serve (issue 40's contract): {sorted(unknown)}"
    assert {name for _, text in alert_texts() for name, _ in vector_selectors(text)}, "the alerts name no metric?"


def test_the_panels_of_the_contract_are_there(dashboard: dict[str, Any]) -> None:
    used = [
        {name for target in panel["targets"] for name, _ in vector_selectors(target["expr"])}
        for panel in dashboard["panels"]
    ]
    missing = [title for title, metrics in CONTRACT_PANELS.items() if not any(metrics <= u for u in used)]
    assert not missing, f"no panel reads what these need: {missing}"
    (latency,) = [p for p, u in zip(dashboard["panels"], used, strict=True) if CONTRACT_PANELS["sink latency"] <= u]
    quantiles = sorted(re.findall(r"histogram_quantile\((0\.\d+),", " ".join(t["expr"] for t in latency["targets"])))
    assert quantiles == ["0.5", "0.95", "0.99"]


def test_every_query_of_a_topology_selects_the_chosen_one(dashboard: dict[str, Any]) -> None:
    """A per-topology metric is read for $namespace/$topology only (else a panel mixes topologies); the
    operator's Redis, which has no such labels, for none."""
    for where, expr in queries(dashboard):
        if where.startswith("dashboard:variable:"):
            continue
        for name, matchers in vector_selectors(expr):
            labels = {(label, op, value) for label, op, value in matchers}
            if name in OPERATOR_WIDE:
                assert not {label for label, _, _ in matchers} & {"namespace", "topology"}, (where, name)
            else:
                assert {("namespace", "=", "$namespace"), ("topology", "=", "$topology")} <= labels, (where, name)
