"""docs/metrics.md lists every metric elastream serves with its type and labels: this test builds the same list
from the code (every prometheus_client metric any elastream module registers, the operator's scrape-time
families, a worker's collector over executors of every kind) and compares. A metric added, renamed or
relabelled without its line in the page fails here; so does a line for a metric the code no longer has."""

from __future__ import annotations

import importlib
import os
import pkgutil
import re

from prometheus_client.metrics import MetricWrapperBase
from test_worker_metrics import worker

import elastream
from elastream.control.topology_metrics import RedisMemory, TopologyCollector
from elastream.runtime.worker_metrics import WorkerCollector
from support.paths import REPO

DOC = os.path.join(REPO, "docs", "metrics.md")
#: a table row of the page: | `name` | type | `label`, `label` | unit | meaning |
ROW = re.compile(r"^\| `(elastream_[a-z_]+)` \| (counter|gauge|histogram) \|([^|]*)\|")

Catalogue = dict[str, tuple[str, frozenset[str]]]


def exposed(name: str, kind: str) -> str:
    """The name a scrape shows: a counter's with `_total` (prometheus_client keeps it without)."""
    return f"{name}_total" if kind == "counter" and not name.endswith("_total") else name


def documented() -> Catalogue:
    rows: Catalogue = {}
    with open(DOC, encoding="utf-8") as page:
        for line in page:
            match = ROW.match(line)
            if match:
                name, kind, labels = match.groups()
                assert name not in rows, f"docs/metrics.md lists {name} twice"
                rows[name] = (kind, frozenset(re.findall(r"`([a-z_]+)`", labels)))
    return rows


def registered_by_modules() -> Catalogue:
    """Every prometheus_client metric object at module level in any elastream module."""
    found: Catalogue = {}
    for module in pkgutil.walk_packages(elastream.__path__, "elastream."):
        if module.name.endswith("__main__"):
            continue
        for value in vars(importlib.import_module(module.name)).values():
            if isinstance(value, MetricWrapperBase):
                found[exposed(value._name, value._type)] = (value._type, frozenset(value._labelnames))
    return found


def operator_families() -> Catalogue:
    """The operator's scrape-time families (the topology gauges and the Redis memory)."""
    collector = TopologyCollector(lambda: [], redis_memory=RedisMemory(client=None))
    return {
        exposed(family.name, family.type): (family.type, frozenset(getattr(family, "_labelnames", ())))
        for family in collector.describe()
    }


def worker_families() -> Catalogue:
    """A worker's families, over a source (a kafka-like one with partitions), a middle vertex and a sink."""
    found: Catalogue = {}
    for family in WorkerCollector(worker()).collect():
        assert family.samples, f"the fake worker shows no {family.name}: give it what the metric needs"
        labels = frozenset(key for sample in family.samples for key in sample.labels if key != "le")
        found[exposed(family.name, family.type)] = (family.type, labels)
    return found


def test_the_metrics_page_lists_exactly_what_the_code_serves() -> None:
    code = {**registered_by_modules(), **operator_families(), **worker_families()}
    page = documented()
    assert sorted(set(code) - set(page)) == [], "served but not in docs/metrics.md"
    assert sorted(set(page) - set(code)) == [], "in docs/metrics.md but not served"
    wrong = {name: (page[name], found) for name, found in code.items() if page[name] != found}
    assert wrong == {}, "type or labels differ (page, code)"


def test_every_per_topology_series_names_its_namespace_and_topology() -> None:
    shared = {"elastream_redis_memory_used_bytes", "elastream_redis_memory_limit_bytes"}  # one Redis, all topologies
    for name, (_, labels) in documented().items():
        if name not in shared:
            assert {"namespace", "topology"} <= labels, name
