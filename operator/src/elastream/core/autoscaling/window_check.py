"""Whether an analysed window can be decided on at all, as pure functions.

On a busy machine, or with a broken worker, a window can hold numbers no policy can act on: a rate that is
NaN or infinite, a negative rate, a window with no duration, no nodes, a vertex with no executors or no
rates. Such a window decides nothing: `undecidable` says why in one line, and the decision layer
(`core.autoscaling.decision.recommend`) publishes an evaluation with action "none" and that reason instead
of calling a policy. What a policy meets inside a window that passed (a capacity estimated at zero, an
estimate that overflows) is the policy's to handle, vertex by vertex.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from elastream.core.metrics import MetricSnapshot, SnapshotError, VertexMetrics
from elastream.core.topology import Topology

#: `VertexMetrics` fields that count or measure something, so are never negative (the others are trends)
NON_NEGATIVE = (
    "processing_rate",
    "emit_rate",
    "executors",
    "input_rate",
    "busy_fraction",
    "true_processing_rate",
    "queue_length",
)
#: `VertexMetrics` fields that are slopes: any sign, but finite
SIGNED = ("queue_growth", "input_trend")


def bad_number(value: float | None, signed: bool = False) -> str | None:
    """What is wrong with one measurement ("nan", "inf", "-inf", "negative"), None when nothing is (a
    gap, None, is not wrong: the policies treat it as unmeasured)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"not a number ({type(value).__name__})"
    if not math.isfinite(value):
        return str(float(value))
    if not signed and value < 0:
        return "negative"
    return None


def vertex_problem(name: str, metrics: VertexMetrics) -> str | None:
    """The first field of one vertex's rates that no policy can use, as "a.processing_rate is nan"."""
    for field_name in (*NON_NEGATIVE, *SIGNED):
        what = bad_number(getattr(metrics, field_name), signed=field_name in SIGNED)
        if what is not None:
            return f"{name}.{field_name} is {what}"
    return None


def undecidable(
    topology: Topology,
    snapshot: MetricSnapshot,
    start: float,
    end: float,
    parallelism: Mapping[str, int],
    nodes: int,
    window_s: float,
    period_s: float,
) -> str | None:
    """Why this window cannot be decided on, in one line, or None when a policy may evaluate it."""
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        return f"the window is empty (start {start:g}, end {end:g})"
    if not math.isfinite(window_s) or window_s <= 0.0:
        return f"the window lasts {window_s:g} s"
    if not math.isfinite(period_s) or period_s < 0.0:
        return f"the evaluation period is {period_s:g} s"
    if nodes < 1:
        return f"{nodes} nodes run"
    for v in topology.order:
        degree = parallelism.get(v)
        if degree is None:
            return f"no degree is known for {v}"
        if degree < 1:
            return f"{v} runs {degree} executors"
    try:
        snapshot.check_against(topology)
    except SnapshotError as exc:
        return str(exc)
    problems = [p for v in topology.order if (p := vertex_problem(v, snapshot.vertices[v])) is not None]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return f"{problems[0]}{more} in the window"
    return None
