"""The autoscaler's evaluation once per period, and what the controller is to do with its decision.

Each evaluation analyses the window and lets the spec's policy decide (`core.autoscaling.decision.recommend`).

`Autoscaler` holds what it uses (the backend for the running schedule, the clock, the metric interval and
the evaluation period) and remembers when it last evaluated; the rest is given per evaluation: the topology
(its node count changes with each scaling), the metric source and what the autoscaler remembers between
evaluations (`AutoscalerState`, which the controller's scalings update too). It changes nothing of the
controller: an evaluation returns an `Evaluation` (the recommendation published as `status.autoscaler`, the
new state, the events to say, the scaling to carry out), which `TopologyController` applies.

An evaluation never takes the controller down: anything the analysis of the window or the policy raises
(a Redis error aside, which the tick notes as Redis away) is logged with the window in one line, counted
(`elastream_autoscaler_evaluation_errors`), and returned as an evaluation that decided nothing, with the
error's one-line reason; the topology keeps running. The scaling an evaluation decides (the controller's
`scale_to`) is not covered here: it has its own handling (a failed migration keeps the schedule).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis

from elastream.control.changes import Said
from elastream.control.metric_series import series
from elastream.control.metrics import AUTOSCALER_EVALUATION_ERRORS
from elastream.core.autoscaling.decision import AutoscalerState, Recommendation, WindowInfo, recommend, undecided
from elastream.core.metrics import MetricSnapshot
from elastream.core.ports import Backend, Clock, MetricSource
from elastream.core.status import EventReason
from elastream.core.topology import Topology
from elastream.core.window_analysis import Analysis

log = logging.getLogger("elastream.control")

#: the longest error message an evaluation publishes in its reason (the log has it whole)
REASON_CHARS = 300


@dataclass(frozen=True)
class ScaleOrder:
    """The scaling an evaluation decided: to `nodes` nodes with the vertex degrees `parallelism`, planned on
    the window the evaluation analysed (`snapshot`: one analysis per evaluation, not two)."""

    nodes: int
    parallelism: Mapping[str, int] | None
    snapshot: MetricSnapshot


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation changed, for the controller to apply."""

    recommendation: Recommendation
    #: the recommendation's status shape (`status.autoscaler`)
    status: dict[str, Any]
    #: what the autoscaler remembers after this evaluation
    state: AutoscalerState
    #: the events to say, in order (after the status is published)
    said: tuple[Said, ...] = ()
    #: the scaling to carry out (None: none, also when `execute: false` only recommends)
    scale: ScaleOrder | None = None


@dataclass
class Autoscaler:
    backend: Backend
    clock: Clock
    interval_s: float = 1.0
    #: seconds between evaluations (None: two metric intervals)
    period_s: float | None = None
    #: when the last evaluation ran (None: none yet)
    evaluated_at: float | None = None

    def evaluate(self, topology: Topology, metrics: MetricSource, state: AutoscalerState) -> Evaluation | None:
        """Once per evaluation period: analyse the window and let the spec's policy decide; None when the
        period has not passed or the window has no samples. Raises only `redis.RedisError`."""
        now = self.clock.now()
        period = self.period_s or 2 * self.interval_s
        if self.evaluated_at is not None and now - self.evaluated_at < period:
            return None
        self.evaluated_at = now
        window = topology.scaling.window
        analysis: Analysis | None = None
        nodes: int | None = None
        try:
            analysis = metrics.analyse(window)
            if analysis.samples_used == 0:
                return None
            schedule = self.backend.current_schedule()
            nodes = len(schedule.nodes)
            span = WindowInfo(
                analysis.window_start,
                analysis.window_end,
                complete=analysis.window_end - analysis.window_start >= window * self.interval_s - 1e-6,
            )
            recommendation, decided = recommend(
                topology,
                analysis.snapshot,
                span,
                schedule.parallelism(),
                nodes,
                state,
                now,
                period_s=period,
                window_s=window * self.interval_s,
            )
            published = recommendation.to_status()
        except redis.RedisError:
            raise  # Redis away: the tick notes it (a condition and one event) and the next one tries again
        except Exception as exc:  # a policy never takes the controller down
            return evaluation_failed(topology, state, now, exc, analysis, nodes)
        if recommendation.action not in ("scale-out", "scale-in"):
            return Evaluation(recommendation, published, decided)
        message = f"{recommendation.action} to {recommendation.target_nodes} nodes: {recommendation.reason}"
        if not recommendation.execute:
            said = Said(EventReason.AUTOSCALER_RECOMMENDS, f"{message} (execute: false, nothing changed)")
            return Evaluation(recommendation, published, decided, (said,))
        order = ScaleOrder(recommendation.target_nodes, recommendation.parallelism, analysis.snapshot)
        return Evaluation(recommendation, published, decided, (Said(EventReason.AUTOSCALER_DECIDED, message),), order)


def evaluation_failed(
    topology: Topology,
    state: AutoscalerState,
    now: float,
    exc: Exception,
    analysis: Analysis | None,
    nodes: int | None,
) -> Evaluation:
    """An evaluation raised: log it with the window, count it, and return an evaluation that decided nothing
    with the error's one-line reason (forgetting the scale-in votes, as an undecided window does)."""
    reason = one_line(exc)
    series(AUTOSCALER_EVALUATION_ERRORS, topology.namespace, topology.name, topology.scaling.auto.policy).inc()
    log.error(
        "autoscaler evaluation of %s raised, nothing decided; %s: %s",
        topology.name,
        window_line(analysis, topology.order),
        reason,
        exc_info=exc,
    )
    known = nodes if nodes is not None else topology.nodes
    recommendation = undecided(topology, known, now, f"the evaluation failed ({reason})")
    return Evaluation(recommendation, recommendation.to_status(), replace(state, scale_in_votes=0))


def one_line(exc: BaseException, limit: int = REASON_CHARS) -> str:
    """`Type: message` on one line, at most `limit` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def window_line(analysis: Analysis | None, order: Sequence[str]) -> str:
    """The analysed window in one line: its span, its samples, and per vertex its input, processing and
    true processing rates (tuples/s) and executors."""
    if analysis is None:
        return "window not analysed"
    vertices = analysis.snapshot.vertices
    rates = "; ".join(
        f"{v} in {_rate(m.input_rate)} proc {_rate(m.processing_rate)} cap {_rate(m.true_processing_rate)} "
        f"x{m.executors}"
        for v in order
        if (m := vertices.get(v)) is not None
    )
    return (
        f"window {analysis.window_start:.3f}..{analysis.window_end:.3f}, {analysis.samples_used} samples, "
        f"rates: {rates or 'none'}"
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"
