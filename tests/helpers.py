"""Small builders for unit tests: manifests as dicts and snapshots from rate tables."""

from __future__ import annotations

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
