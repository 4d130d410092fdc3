"""A time-stepped fluid simulation of a running topology that drives the production autoscaling code.

`run` advances a topology one metric interval at a time (1 s by default) and, every evaluation period,
hands the window's `MetricSnapshot` to the same `core.autoscaling.decision.recommend` the controller calls, applies a
scale-out/scale-in through the same `core.planner.make_plan`, and reports what happened per interval. No
worker process runs: this is the fluid model of `core.simulate` (per-executor capacity 1000 / costMs,
executors sharing their node's CPU max-min fairly, shuffle spreading evenly), made time-dependent with
queues. Everything is deterministic; there is no I/O.

Per interval (split into segments where a migration pauses the sources or switches the schedule):

- a source is offered events by its rate profile (`rate`, `steps` or a `profile` preset of `core.rates`,
  with its deterministic fluctuation), split evenly over its executors; what it cannot emit waits in its
  backlog (the source's `queue_len`, as the runtime reports it);
- in topological order every executor processes min(queue + arrivals, its rate × segment length), its rate
  being min(1000 / costMs, CPU share / cost); processed × selectivity goes to every child, split over the
  child's executors by the stream's grouping (shuffle evenly, fields by key-group share, all: a copy each,
  global: executor 0). Events pass through a whole pipeline within one segment when nothing queues
  (the fluid approximation);
- CPU: with `resources.limits.cpu` the executors of a node share it max-min fairly by their demand (the
  work they have, capped at one core each), as `core.simulate` does; without a limit it never binds.

Every `period_s` the snapshot is the analysis's own: the last `window` intervals' totals per vertex
(processed, emitted, offered, busy seconds, queues, and the trend sums Σ (k - c) × count) go to
`core.window_analysis.analysis_from_totals`, where both analysis engines end, so rates, demand-aware input
rates, `input_trend`, `busy_fraction`, `true_processing_rate` and `queue_length` are computed by the
production code from the simulated counts.

A change (`make_plan` with the recommendation's nodes and degrees) is modelled as CCR carries it out, with
the medians of docs/benchmarks/migration.md: a prepare phase while everything runs (1.2 s when nodes are
added: they start and bind their inboxes; 14 ms otherwise), then the sources paused for 152 ms while the
rest keeps processing, then the new schedule. Nothing is lost: each vertex's pending items are re-dealt
over its new executors. New executors count as resources from the decision on, removed ones until the
switch. The autoscaler's state is told `changed(switch time, direction)`; no evaluation runs while a
migration is in flight (the controller's `scale_to` is synchronous). The change is `settled` once the sinks'
output has been within ±10 % of the input level (offered × the topology's gain) for three intervals, or
after `settle_timeout_s` (the controller's recovery timeout).

Latency per interval: along every source-to-sink path, each vertex adds its service time (1 / its
per-executor rate) and the wait of an event joining its FIFO queues now (queue ahead / the executor's drain
rate, averaged over the executors by the share of input each receives); the interval's end-to-end latency
is the largest path sum. Percentiles weigh each interval by the events offered in it.

Policies: ``static-min`` (AUTOSCALE's ConfMin: parallelism 1 everywhere, fewest nodes), ``static-expert``
(ConfExpt: per vertex the fewest executors that keep up with the profile's peak input, computed from the
costs, selectivities and the maximum offered rate; fewest nodes for them), ``autoscale`` and ``rules`` (the
topology's `scaling.auto` with that policy, enabled, started from ConfMin unless `start` says "expert").
They, the settings and the results are `sim.scenario`'s; this module is the run.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from elastream.core.autoscaling.decision import AutoscalerState, Recommendation, WindowInfo, recommend
from elastream.core.metrics import MetricSnapshot
from elastream.core.planner import PlanningError, make_plan
from elastream.core.schedule import Schedule
from elastream.core.simulate import INF, SimulationModel, VertexModel, fair_shares, input_shares
from elastream.core.topology import Topology, split_executor_id
from elastream.core.window_analysis import WindowTotals, analysis_from_totals, trend_center
from elastream.sim.scenario import (
    POLICIES,
    Change,
    Interval,
    Policy,
    SimResult,
    SimSettings,
    VertexInterval,
    expert_parallelism,
    gains,
    min_parallelism,
    nodes_for,
    offered_rates,
    schedule_for,
    with_policy,
)

# ---- the run -----------------------------------------------------------------------------------------------


@dataclass
class _Pending:
    decided_at: float
    switch_at: float
    schedule: Schedule
    change: Change


@dataclass
class _Totals:
    received: float = 0.0
    processed: float = 0.0
    emitted: float = 0.0
    busy_s: float = 0.0


def run(
    topology: Topology,
    policy: Policy,
    settings: SimSettings | None = None,
    start: Literal["min", "expert"] = "min",
) -> SimResult:
    """Simulate `topology` under `policy` for `settings.duration_s` (see the module docstring)."""
    settings = settings or SimSettings()
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is unknown; use one of: {', '.join(POLICIES)}")
    adaptive = policy in ("autoscale", "rules")
    if adaptive:
        topology = with_policy(topology, policy)
    return Simulation(topology, policy, settings, start).run()


class Simulation:
    def __init__(self, topology: Topology, policy: Policy, settings: SimSettings, start: str) -> None:
        self.topology = topology
        self.policy = policy
        self.settings = settings
        self.adaptive = policy in ("autoscale", "rules")
        self.model = SimulationModel.from_topology(topology)
        self.rates = offered_rates(topology)
        self.window = settings.window or topology.scaling.window
        if policy == "static-expert" or (self.adaptive and start == "expert"):
            degrees = expert_parallelism(topology, self.model)
        else:
            degrees = min_parallelism(topology)
        nodes = nodes_for(topology, degrees)
        if self.adaptive:
            auto = topology.scaling.auto
            nodes = max(auto.min_nodes, min(auto.max_nodes, nodes))
        self.share_cache: dict[tuple[str, int], dict[str, list[float]]] = {}
        self._use(schedule_for(topology, degrees, nodes))
        self.topology = topology.with_nodes(len(self.schedule.nodes))
        self.queues: dict[str, float] = dict.fromkeys(self.schedule.assignment, 0.0)
        self.state = AutoscalerState()
        self.pending: _Pending | None = None
        self.unsettled: Change | None = None
        self.intervals: list[Interval] = []
        self.changes: list[Change] = []
        self.evaluations: list[Recommendation] = []
        self.rejected: list[tuple[float, str]] = []

    # ---- main loop

    def run(self) -> SimResult:
        dt = self.settings.interval_s
        duration = self.settings.duration_s or max(r.period for r in self.rates.values())
        steps = max(1, math.ceil(round(duration / dt, 9)))
        period_steps = max(1, round(self.settings.period_s / dt))
        for k in range(steps):
            self._interval(k * dt, (k + 1) * dt)
            now = (k + 1) * dt
            self._follow_settling(now)
            if self.adaptive and self.pending is None and (k + 1) % period_steps == 0:
                self._evaluate(now)
        if self.unsettled is not None:
            self.changes[-1] = self.unsettled
        return SimResult(
            self.policy,
            self.settings,
            tuple(self.intervals),
            tuple(self.changes),
            tuple(self.evaluations),
            tuple(self.rejected),
        )

    def _interval(self, t0: float, t1: float) -> None:
        totals = {v: _Totals() for v in self.topology.order}
        cuts = {t0, t1}
        pause_from = switch_at = INF
        if self.pending is not None:
            switch_at = self.pending.switch_at
            pause_from = switch_at - self.settings.delays.pause_s
            cuts.update(t for t in (pause_from, switch_at) if t0 < t < t1)
        edges = sorted(cuts)
        node_s = executor_s = 0.0
        offered = expected = 0.0
        for a, b in itertools.pairwise(edges):
            if self.pending is not None and a >= self.pending.switch_at - 1e-12:
                self._switch()
            paused = pause_from - 1e-12 <= a < switch_at - 1e-12
            seg_offered, seg_expected = self._segment(a, b, paused, totals)
            offered += seg_offered
            expected += seg_expected
            nodes, executors = self._billed()
            node_s += nodes * (b - a)
            executor_s += executors * (b - a)
        if self.pending is not None and t1 >= self.pending.switch_at - 1e-12:
            self._switch()
        parallelism = self.schedule.parallelism()
        vertices = {
            v: VertexInterval(
                t.received, t.processed, t.emitted, t.busy_s, sum(self.queues[e] for e in self._executors(v))
            )
            for v, t in totals.items()
        }
        self.intervals.append(
            Interval(
                end=t1,
                offered=offered,
                delivered=sum(totals[s].processed for s in self.topology.sinks),
                expected=expected,
                latency_s=self._latency(),
                node_seconds=node_s,
                executor_seconds=executor_s,
                nodes=len(self.schedule.nodes),
                parallelism={v: parallelism[v] for v in self.topology.order},
                vertices=vertices,
            )
        )

    def _billed(self) -> tuple[int, int]:
        nodes, executors = len(self.schedule.nodes), len(self.schedule)
        if self.pending is not None:
            nodes = max(nodes, len(self.pending.schedule.nodes))
            executors = max(executors, len(self.pending.schedule))
        return nodes, executors

    def _executors(self, v: str) -> list[str]:
        return self.by_vertex[v]

    def _shares(self, v: str, parent: str) -> list[float]:
        """The fraction of `parent`'s output each executor of `v` receives (by the stream's grouping)."""
        k = len(self.by_vertex[v])
        key = (v, k)
        if key not in self.share_cache:
            self.share_cache[key] = input_shares(self.topology, v, k)
        return self.share_cache[key][parent]

    def _use(self, schedule: Schedule) -> None:
        self.schedule = schedule
        parallelism = schedule.parallelism()
        self.by_vertex = {v: [f"{v}#{i}" for i in range(parallelism.get(v, 0))] for v in self.topology.order}
        self.gain = gains(self.topology, self.model, parallelism)

    # ---- one segment of flow

    def _segment(self, a: float, b: float, paused: bool, totals: Mapping[str, _Totals]) -> tuple[float, float]:
        dur = b - a
        topology, model = self.topology, self.model
        by_vertex = self.by_vertex
        offered_total = expected = 0.0
        arrivals: dict[str, float] = dict.fromkeys(self.schedule.assignment, 0.0)
        for s in topology.sources:
            offered = self.rates[s].due(b) - self.rates[s].due(a)
            offered_total += offered
            expected += offered * self.gain[s]
            totals[s].received += offered
            for e in by_vertex[s]:
                arrivals[e] += offered / len(by_vertex[s])
        shares = self._cpu_shares(dur, arrivals, by_vertex, paused)
        for v in topology.order:
            vm = model.vertices[v]
            processed_v = 0.0
            source = topology.graph.in_degree(v) == 0
            for e in by_vertex[v]:
                available = self.queues[e] + arrivals[e]
                rate = 0.0 if source and paused else _rate(vm, shares[e])
                done = min(available, rate * dur)
                self.queues[e] = available - done
                processed_v += done
                if not source:
                    totals[v].received += arrivals[e]
                if done > 0.0 and not math.isinf(rate):
                    totals[v].busy_s += done / rate
            emitted = processed_v * vm.selectivity
            totals[v].processed += processed_v
            totals[v].emitted += emitted
            for c in topology.children(v):
                fractions = self._shares(c, v)
                for e, fraction in zip(by_vertex[c], fractions, strict=True):
                    arrivals[e] += emitted * fraction
        return offered_total, expected

    def _cpu_shares(
        self, dur: float, arrivals: Mapping[str, float], by_vertex: Mapping[str, list[str]], paused: bool
    ) -> dict[str, float]:
        """Each executor's CPU share (cores) for the segment: unlimited without a node CPU limit, else the
        max-min fair split of its node by demand. Demand is estimated from each executor's own queue and
        arrivals so far plus what its parents could pass on at full speed (one pass in topological order)."""
        shares = dict.fromkeys(self.schedule.assignment, INF)
        cpu = self.topology.node_cpu
        if cpu is None:
            return shares
        topology, model = self.topology, self.model
        incoming = dict(arrivals)
        demand: dict[str, float] = {}
        for v in topology.order:
            vm = model.vertices[v]
            source = topology.graph.in_degree(v) == 0
            out = 0.0
            for e in by_vertex[v]:
                rate = 0.0 if source and paused else min((self.queues[e] + incoming[e]) / dur, vm.capacity)
                demand[e] = rate * vm.cost_s
                out += rate * dur
            for c in topology.children(v):
                fractions = self._shares(c, v)
                for e, fraction in zip(by_vertex[c], fractions, strict=True):
                    incoming[e] += out * vm.selectivity * fraction
        return fair_shares(demand, dict(self.schedule.assignment), cpu, self.schedule.nodes)

    def _latency(self) -> float:
        topology, model = self.topology, self.model
        by_vertex = self.by_vertex
        shares = dict.fromkeys(self.schedule.assignment, INF)
        if topology.node_cpu is not None:
            # the drain rate of a backed-up executor: its share when every executor of the node is busy
            demand = {
                e: 1.0 if model.vertices[split_executor_id(e)[0]].cost_s > 0.0 else 0.0
                for e in self.schedule.assignment
            }
            shares = fair_shares(demand, dict(self.schedule.assignment), topology.node_cpu, self.schedule.nodes)
        path: dict[str, float] = {}
        for v in topology.order:
            vm = model.vertices[v]
            executors = by_vertex[v]
            parents = topology.parents(v)
            if parents:
                weights = [0.0] * len(executors)
                for p in parents:
                    for i, fraction in enumerate(self._shares(v, p)):
                        weights[i] += fraction / len(parents)
            else:
                weights = [1.0 / len(executors)] * len(executors)
            total_weight = sum(weights) or 1.0
            wait = service = 0.0
            for e, w in zip(executors, weights, strict=True):
                rate = _rate(vm, shares[e])
                if math.isinf(rate) or rate <= 0.0:
                    continue
                wait += (w / total_weight) * self.queues[e] / rate
                service += (w / total_weight) / rate
            path[v] = max((path[p] for p in parents), default=0.0) + wait + service
        return max(path[s] for s in topology.sinks)

    # ---- changes

    def _switch(self) -> None:
        assert self.pending is not None
        new = self.pending.schedule
        old_queues = self.queues
        self.queues = dict.fromkeys(new.assignment, 0.0)
        new_parallelism = new.parallelism()
        for v in self.topology.order:
            total = sum(q for e, q in old_queues.items() if split_executor_id(e)[0] == v)
            k = new_parallelism[v]
            parents = self.topology.parents(v)
            weights = [1.0 / k] * k
            if parents:
                weights = [0.0] * k
                for p in parents:
                    for i, fraction in enumerate(input_shares(self.topology, v, k)[p]):
                        weights[i] += fraction
            norm = sum(weights) or 1.0
            for i in range(k):
                self.queues[f"{v}#{i}"] = total * weights[i] / norm
        self._use(new)
        self.topology = self.topology.with_nodes(len(new.nodes))
        self.unsettled = self.pending.change
        self.pending = None

    def _follow_settling(self, now: float) -> None:
        change = self.unsettled
        if change is None or self.pending is not None:
            return
        hold = self.settings.settle_hold
        recent = [i for i in self.intervals[-hold:] if i.end - self.settings.interval_s >= change.applied_at - 1e-9]
        tol = self.settings.settle_tolerance
        back = len(recent) == hold and all(abs(i.delivered - i.expected) <= tol * i.expected for i in recent)
        if back or now - change.applied_at >= self.settings.settle_timeout_s:
            self.state = self.state.settled(now)
            self.changes[-1] = dataclasses.replace(change, settled_at=now)
            self.unsettled = None

    def _evaluate(self, now: float) -> None:
        dt = self.settings.interval_s
        window_s = self.window * dt
        snapshot = self.snapshot()
        span = WindowInfo(now - window_s, now, complete=len(self.intervals) >= self.window)
        rec, self.state = recommend(
            self.topology,
            snapshot,
            span,
            self.schedule.parallelism(),
            len(self.schedule.nodes),
            self.state,
            now,
            period_s=self.settings.period_s,
            window_s=window_s,
        )
        self.evaluations.append(rec)
        if rec.action not in ("scale-out", "scale-in") or not rec.execute:
            return
        scaling = self.topology.scaling
        try:
            plan = make_plan(
                self.topology,
                self.schedule,
                snapshot,
                rec.target_nodes,
                scaling.strategy,
                scaling.congestion_rate,
                parallelism=rec.parallelism,
            )
        except PlanningError as exc:
            self.rejected.append((now, str(exc)))
            return
        if plan.direction == "none":
            return
        delays = self.settings.delays
        prepare = delays.prepare_out_s if plan.added_nodes else delays.prepare_in_s
        switch_at = now + prepare + delays.pause_s
        before = self.schedule.parallelism()
        after = plan.new_schedule.parallelism()
        change = Change(
            decided_at=now,
            applied_at=switch_at,
            action=rec.action,
            direction=plan.direction,
            from_nodes=plan.from_nodes,
            to_nodes=plan.to_nodes,
            from_parallelism={v: before[v] for v in self.topology.order},
            to_parallelism={v: after[v] for v in self.topology.order},
            reason=rec.reason,
        )
        self.changes.append(change)
        self.pending = _Pending(now, switch_at, plan.new_schedule, change)
        self.state = self.state.changed(switch_at, plan.direction)

    # ---- the analysis of the last window

    def snapshot(self) -> MetricSnapshot:
        """What the metric analysis reports for the last `window` intervals: the window's per-vertex totals
        (counts, busy seconds, queues and the trend sums Σ (k - c) × count per interval) handed to the
        analysis's own `analysis_from_totals`, as both analysis engines do."""
        topology = self.topology
        dt = self.settings.interval_s
        recent = self.intervals[-self.window :]
        center = trend_center(len(recent))
        parallelism = self.schedule.parallelism()

        def total(v: str, name: str) -> float:
            return float(sum(getattr(i.vertices[v], name) for i in recent))

        def trend(v: str, name: str) -> float:
            return float(sum((k - center) * round(getattr(i.vertices[v], name)) for k, i in enumerate(recent)))

        totals = {
            v: WindowTotals(
                processed=round(total(v, "processed")),
                emitted=round(total(v, "emitted")),
                busy_s=total(v, "busy_s"),
                executors=parallelism[v],
                received=round(total(v, "received")),
                queue_first=round(recent[0].vertices[v].queue) if recent else 0,
                queue_last=round(sum(self.queues[e] for e in self._executors(v))),
                processed_trend=trend(v, "processed"),
                emitted_trend=trend(v, "emitted"),
                received_trend=trend(v, "received"),
                samples=len(recent) * parallelism[v],
            )
            for v in topology.order
        }
        end = recent[-1].end if recent else 0.0
        analysis = analysis_from_totals(
            topology,
            totals,
            dict(self.schedule.assignment),
            end - len(recent) * dt,
            end,
            max(1, len(recent)),
            dt,
            topology.scaling.congestion_rate,
        )
        return analysis.snapshot


def _rate(vm: VertexModel, cpu: float) -> float:
    """One executor's processing rate (tuples/s) with `cpu` cores: min(1000 / costMs, cpu / cost)."""
    limit = vm.capacity
    if vm.cost_s > 0.0 and not math.isinf(cpu):
        limit = min(limit, cpu / vm.cost_s)
    return limit
