"""Small builders for unit tests: manifests as dicts and snapshots from rate tables; what a worker pod's
listeners bind."""

from __future__ import annotations

import itertools
from typing import Any

from elastream.core.metrics import MetricSnapshot, VertexMetrics


def manifest(vertices: list[dict[str, Any]], streams: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": spec.pop("name", "t")},
        "spec": {"nodes": 2, "slotsPerNode": 8, "vertices": vertices, "streams": streams, **spec},
    }


def src(name: str, parallelism: int = 1, **config: Any) -> dict[str, Any]:
    return {"name": name, "parallelism": parallelism, "source": {"type": "synthetic", **config}}


def work(name: str, parallelism: int = 1, **config: Any) -> dict[str, Any]:
    return {"name": name, "parallelism": parallelism, "logic": {"builtin": "work", **config}}


def sink(name: str, parallelism: int = 1, **config: Any) -> dict[str, Any]:
    return {"name": name, "parallelism": parallelism, "sink": {"type": "null", **config}}


def edge(a: str, b: str, grouping: str = "shuffle", **extra: Any) -> dict[str, Any]:
    return {"from": a, "to": b, "grouping": grouping, **extra}


def in_line(vertices: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A manifest of `vertices` in a line, each feeding the next by shuffle."""
    names = [v["name"] for v in vertices]
    return manifest(vertices, [edge(a, b) for a, b in itertools.pairwise(names)], **spec)


def count(name: str = "count", parallelism: int = 1) -> dict[str, Any]:
    """A stateful running count per `key` (feed it with `by_key`)."""
    return {"name": name, "parallelism": parallelism, "stateful": True, "logic": {"builtin": "count", "key": "key"}}


def by_key(a: str, b: str) -> dict[str, Any]:
    return edge(a, b, "fields", key="key")


def keyed_count_pipeline(name: str, cost_ms: float, count_parallelism: int, slots_per_node: int) -> dict[str, Any]:
    """src (300/s over 32 keys) -> w (`cost_ms` per event) -> count (keyed) -> out (null), on 2 nodes."""
    return manifest(
        [
            src("src", 1, rate=300, keys=32),
            work("w", 1, costMs=cost_ms),
            count(parallelism=count_parallelism),
            sink("out"),
        ],
        [edge("src", "w"), by_key("w", "count"), edge("count", "out")],
        name=name,
        nodes=2,
        slotsPerNode=slots_per_node,
    )


def snapshot(
    rows: dict[str, tuple[float, float, float | None]],
    placement: dict[str, list[str]] | None = None,
    executors: dict[str, int] | None = None,
) -> MetricSnapshot:
    """rows: vertex -> (input_rate or None, processing_rate, emit_rate)."""
    return MetricSnapshot(
        {
            v: VertexMetrics(processing_rate=p, emit_rate=e, executors=(executors or {}).get(v, 1), input_rate=i)
            for v, (i, p, e) in rows.items()
        },
        placement or {},
    )


def assert_worker_binds(pod: dict[str, Any], on_pod_ip: bool) -> None:
    """A worker pod's inboxes, /ready and metrics listen on every interface and tell peers the pod IP, or
    (`on_pod_ip`) listen on the pod IP only."""
    args = pod["spec"]["containers"][0]["args"]
    bind = args[args.index("--bind") + 1]
    if on_pod_ip:
        assert bind == "$(POD_IP):7000" and "--advertise" not in args
    else:
        assert bind == "0.0.0.0:7000" and args[args.index("--advertise") + 1] == "$(POD_IP)"
