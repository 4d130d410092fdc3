"""The per-topology series of the labelled Prometheus metrics, remembered so a deleted topology's can go.

Every labelled metric whose first two labels are namespace and topology (`topology_metrics.RESCALES`,
`metrics.AUTOSCALER_EVALUATION_ERRORS`, ...) makes its series through `series`, which remembers each one
per topology; `forget_topology` removes them all when the topology is deleted, so its series do not stay
on the scrape. A module of its own below both metric modules: the counters of the controller's parts and
the scrape-time collector share it without importing each other.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TypeVar

from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)

#: every labelled series made through `series`, per (namespace, topology): what `forget_topology` removes
_SERIES: dict[tuple[str, str], dict[tuple[int, tuple[str, ...]], tuple[MetricWrapperBase, tuple[str, ...]]]] = {}
_SERIES_LOCK = threading.Lock()


def series(metric: M, namespace: str, topology: str, *labels: str) -> M:
    """`metric`'s series of this topology (its first two labels are namespace and topology), remembered so
    that `forget_topology` can remove it."""
    values = (namespace, topology, *labels)
    with _SERIES_LOCK:
        _SERIES.setdefault((namespace, topology), {})[(id(metric), values)] = (metric, values)
    return metric.labels(*values)


def forget_topology(namespace: str, topology: str) -> None:
    """Remove every series `series` made for this topology (it was deleted: its series must not stay)."""
    with _SERIES_LOCK:
        made = _SERIES.pop((namespace, topology), {})
    for metric, values in made.values():
        with contextlib.suppress(KeyError):  # removed already
            metric.remove(*values)
