"""Random topologies for property tests and benchmarks: layered DAGs with costs that congest some vertices.

`random_manifest(rng, n)` returns a StreamTopology document (a dict, as users write it), so generated cases
go through the same parser and validation as real manifests.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from elastream.core.topology import Topology, parse_manifest

#: the default mix: half shuffle, then fields, all and global
MIXED_GROUPINGS = ("shuffle", "shuffle", "shuffle", "fields", "all", "global")
#: groupings that split a stream over executors (no copies, no single receiver)
PARTITIONED_GROUPINGS = ("shuffle", "shuffle", "shuffle", "fields")


def random_manifest(
    rng: random.Random,
    vertices: int,
    *,
    nodes: int = 4,
    slots_per_node: int | None = None,
    max_parallelism: int = 16,
    node_cpu: float | None = 2.0,
    fanout: float = 1.6,
    name: str = "random",
    groupings: Sequence[str] = MIXED_GROUPINGS,
) -> dict[str, Any]:
    """A layered DAG of `vertices` ≥ 3 vertices: 1-3 sources, a few layers, every vertex reachable and
    reaching a sink, diamonds and merges included; per-vertex costs drawn so that roughly a third of
    the vertices are congested at the sources' rates. Each stream's grouping is drawn from `groupings`
    (repeats weight it): by default half shuffle and the rest fields, all and global; `PARTITIONED_GROUPINGS`
    keeps to shuffle and fields, where Stela's (k+1)/k projection holds."""
    if vertices < 3:
        raise ValueError("a random topology needs at least 3 vertices")
    n_sources = min(max(1, vertices // 8), 3)
    n_layers = max(2, min(int(vertices**0.5), vertices - n_sources))
    names = [f"v{i}" for i in range(vertices)]
    layers: list[list[str]] = [names[:n_sources]]
    rest = names[n_sources:]
    per_layer = max(1, len(rest) // n_layers)
    for start in range(0, len(rest), per_layer):
        layers.append(rest[start : start + per_layer])
    streams: list[dict[str, Any]] = []
    edges: set[tuple[str, str]] = set()
    for depth in range(1, len(layers)):
        upstream = [v for layer in layers[:depth] for v in layer]
        for v in layers[depth]:
            parents = {rng.choice(layers[depth - 1])}
            while rng.random() < fanout - 1.0 and len(parents) < len(upstream):
                parents.add(rng.choice(upstream))
            for p in sorted(parents):
                edges.add((p, v))
    has_child = {a for a, _ in edges}
    for depth in range(len(layers) - 1):
        for v in layers[depth]:
            if v not in has_child:
                edges.add((v, rng.choice(layers[depth + 1])))
    index = {v: i for i, v in enumerate(names)}
    for a, b in sorted(edges, key=lambda e: (index[e[0]], index[e[1]])):
        grouping = rng.choice(list(groupings))
        stream: dict[str, Any] = {"from": a, "to": b, "grouping": grouping}
        if grouping == "fields":
            stream["key"] = "key"
        streams.append(stream)
    has_child = {a for a, _ in edges}
    sinks = {v for v in names if v not in has_child}
    spec_vertices: list[dict[str, Any]] = []
    total_executors = 0
    sources = set(layers[0])
    for v in names:
        parallelism = rng.randint(1, 3)
        total_executors += parallelism
        entry: dict[str, Any] = {"name": v, "parallelism": parallelism, "maxParallelism": max_parallelism}
        if v in sources:
            entry["source"] = {"type": "synthetic", "rate": float(rng.choice([500, 1000, 2000, 4000]))}
        elif v in sinks:
            entry["sink"] = {"type": "null", "costMs": round(rng.uniform(0.05, 1.5), 3)}
        else:
            entry["logic"] = {
                "builtin": "work",
                "costMs": round(rng.uniform(0.05, 3.0), 3),
                "selectivity": rng.choice([0.5, 1.0, 1.0, 1.0, 1.5]),
            }
        spec_vertices.append(entry)
    slots = slots_per_node or max(4, -(-total_executors // nodes) + 2)
    spec: dict[str, Any] = {
        "nodes": nodes,
        "slotsPerNode": slots,
        "vertices": spec_vertices,
        "streams": streams,
    }
    if node_cpu is not None:
        spec["resources"] = {"limits": {"cpu": str(node_cpu)}}
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name},
        "spec": spec,
    }


def random_topology(rng: random.Random, vertices: int, **options: Any) -> Topology:
    # a program's topology for the simulator, up to thousands of vertices: not held to a manifest's maxima
    return parse_manifest(random_manifest(rng, vertices, **options), bounded=False)
