"""The Stela paper's experiments (Xu, Peng, Gupta, IC2E 2016; docs/papers.md), end to end on real
worker processes: `make bench-paper`.

1. Scale-out by one node mid-run (the paper's Table I: star 4->5, linear 6->7, diamond 6->7, Page Load 7->8,
   Processing 8->9, Network Monitoring 8->9) with four plans: stela + CCR, stela-plus + CCR, least-link-load
   + CCR (the paper's [11]) and round-robin + restart (Storm's default: every executor reassigned, every
   worker restarted from the last checkpoint). Per run: throughput before and after, the post-scale
   improvement, the convergence time by the paper's definition (section IV-D), the time at zero
   throughput, events lost and duplicated at the sinks, events replayed, and the plan's predicted
   post-scale throughput next to the measured one.
2. Scale-in of Page Load from 8 to 4 nodes (the paper's Fig. 8): Stela's ETPSum picks the nodes, against
   two random groups of nodes (Storm's default has to be lucky), from an initial allocation where every
   node holds executors of at most 2 operators, as in the paper.

How a run goes (`Timing`): the topology's sinks write to Redis streams (same costs) and its sources are
finite, sized so they run out just after the measured window (`source_limit`); workers take a checkpoint
every CHECKPOINT_S. After the warm-up and the before window the controller analyses the window it saw (the
pure-Python reference of the Spark analysis, to keep 84 runs within 30 minutes), plans the scale with the
strategy on that snapshot (what `elastream plan` would say), migrates, and keeps running through the after
window. Once the sources are exhausted and the sinks idle, every sink stream is compared with the exact
multiset of ids a correct run delivers: lost = expected but missing, duplicated = delivered more than once.

Costs are sleep-based with an emulated 2-core CPU per node (`resources.limits.cpu`), so 9 nodes fit on a
2-core machine; a node's CPU is shared by the executors on it, which is what makes placement matter. The
paper measures throughput at saturation: the Page Load and Processing examples' sources offer more than any
plan on their node counts processes (examples/pageload.yaml, processing.yaml), so the plan, not the offered
rate, sets the post-scale throughput.

Writes docs/benchmarks/stela.md and stela-*.png (`--out` elsewhere). `--quick`: three topologies, one
repetition; `--smoke`: one topology, two plans, short windows (the integration test). `--topologies`,
`--plans` and `--(no-)scale-in` pick the runs (e.g. `--topologies pageload,processing --plans
stela,stela-plus,round-robin --no-scale-in --reps 1 --out /tmp/paper`).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))  # support/
from support.paths import REPO

sys.path.insert(0, os.path.join(REPO, "operator", "src"))

from elastream.control.backends.local import EmbeddedRedis, LocalCluster
from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
from elastream.control.migration import MigrationDriver
from elastream.core.metrics import MetricSample
from elastream.core.planner import make_plan
from elastream.core.schedule import Schedule, executor_order, initial_schedule, node_name
from elastream.core.simulate import SimulationModel, simulate, snapshot_from_simulation
from elastream.core.topology import Topology
from elastream.core.window_analysis import analyze_samples
from elastream.crd import load_manifest
from elastream.sim.throughput_measures import convergence_time, time_at_zero
from elastream.store.metric_stream import MetricStream
from support.harness import expected_copies, id_counts, sink_events, wait_for_sinks_idle

#: (example, nodes after): the paper's Table I, N -> N+1
SCALE_OUT = (("star", 5), ("linear", 7), ("diamond", 7), ("pageload", 8), ("processing", 9), ("netmon", 9))
#: (label, strategy, protocol, seed)
OUT_PLANS = (
    ("stela", "stela", "ccr", 0),
    ("stela-plus", "stela-plus", "ccr", 0),
    ("least-link-load", "least-link-load", "ccr", 0),
    ("round-robin", "round-robin", "restart", 0),
)
#: the paper's "Page Load Scaling" row: 8 -> 4 nodes; Storm's default with two random groups of nodes
SCALE_IN = ("pageload", 8, 4)
IN_PLANS = (
    ("stela", "stela", "ccr", 0),
    ("stela-plus", "stela-plus", "ccr", 0),
    ("random group 1", "random", "restart", 1),
    ("random group 2", "random", "restart", 2),
)
INTERVAL_S = 0.5  # metric sample interval of the workers
STEP_S = 0.5  # the timelines' resolution (1 s points for convergence and plots; the paper used 10 s windows)
CHECKPOINT_S = 2.0


@dataclass(frozen=True)
class Timing:
    warmup_s: float = 1.5  # after the start, before the measured window
    before_s: float = 3.0  # measured before the scale (and analysed for the plan)
    after_s: float = 7.0  # from the scale request to the end of the measured window
    measure_s: float = 3.5  # the last seconds of `after_s`: the post-scale throughput
    reps: int = 3
    # a scale-in moves more executors onto fewer nodes and takes longer to settle: a longer window
    in_after_s: float = 10.0
    in_measure_s: float = 4.0

    def of(self, experiment: str) -> Timing:
        """The timing of an "out" or "in" run (a scale-in's after window is its own)."""
        if experiment != "in":
            return self
        return replace(self, after_s=self.in_after_s, measure_s=self.in_measure_s)


FULL = Timing()
QUICK = Timing(reps=1)
SMOKE = Timing(warmup_s=2.0, before_s=3.0, after_s=6.0, measure_s=3.0, reps=1, in_after_s=6.0, in_measure_s=3.0)


@dataclass
class Run:
    experiment: str  # "out" or "in"
    topology: str
    plan: str
    rep: int
    nodes: tuple[int, int]
    before: float = 0.0
    after: float = 0.0
    predicted_before: float | None = None
    predicted: float | None = None
    convergence_s: float | None = None
    zero_s: float = 0.0
    lost: int = 0
    duplicated: int = 0
    replayed: int = 0
    captured: int = 0
    pause_ms: float | None = None
    outcome: str = ""
    exhausted_early: bool = False
    timeline: list[tuple[float, float]] = field(default_factory=list)

    @property
    def improvement(self) -> float:
        return self.after / self.before - 1.0 if self.before else 0.0

    @property
    def accuracy(self) -> float | None:
        return self.after / self.predicted if self.predicted else None


def log(message: str) -> None:
    print(message, flush=True)


def paper_manifest(directory: str, name: str, nodes: int, limit: int, tag: str) -> str:
    """The example with finite sources (`limit` ids each) and its sinks writing to Redis streams (same
    costs), named uniquely so every run has its own keys."""
    with open(os.path.join(REPO, "examples", f"{name}.yaml"), encoding="utf-8") as handle:
        doc = copy.deepcopy(yaml.safe_load(handle))
    spec = doc["spec"]
    spec["nodes"] = nodes
    for vertex in spec["vertices"]:
        if "source" in vertex:
            vertex["source"]["limit"] = limit
        if "sink" in vertex:
            vertex["sink"] = {**vertex["sink"], "type": "redis-stream"}
    doc["metadata"]["name"] = f"paper-{name}-{tag}"
    path = os.path.join(directory, f"{doc['metadata']['name']}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    return path


def packed_schedule(topology: Topology) -> Schedule:
    """Executors in topological order dealt in contiguous blocks over the nodes, so a node holds executors
    of at most 2 operators (the paper's initial allocation for its scale-in experiment)."""
    executors = executor_order(topology)
    nodes = [node_name(i) for i in range(topology.nodes)]
    per_node, extra = divmod(len(executors), len(nodes))
    placement: dict[str, list[str]] = {}
    cursor = 0
    for i, node in enumerate(nodes):
        size = per_node + (1 if i < extra else 0)
        placement[node] = executors[cursor : cursor + size]
        cursor += size
    return Schedule.from_placement(placement, topology.slots_per_node, nodes)


def source_limit(
    topology: Topology,
    before: Schedule,
    after: Schedule,
    timing: Timing,
    seen: tuple[float, float] | None,
    experiment: str = "out",
) -> int:
    """Ids per source so that the sources run out just after the measured window (a shorter drain before
    the exact count): the source rates before and after the scale over their durations, plus a margin. The
    rates are those the same plan's first repetition measured (`seen`, + 5 %) or else the fluid model's
    (+ 8 %: the processes run within a few % of it, mostly below). A scale-in gets + 20 % either way: its
    plan can differ between repetitions (each analyses its own window). A source that still runs out before
    the window ends is reported (`exhausted_early`)."""
    if seen is not None:
        rate_before, rate_after = seen
        margin = 1.05
    else:
        rate_before = max(simulate(topology, before).vertices[s].processing_rate for s in topology.sources)
        rate_after = max(simulate(topology, after).vertices[s].processing_rate for s in topology.sources)
        margin = 1.08
    if experiment == "in":
        margin = 1.2
    emitted = rate_before * (timing.warmup_s + timing.before_s + 0.5) + rate_after * timing.after_s
    return math.ceil(margin * emitted)


def counted_timeline(
    samples: Sequence[MetricSample], vertices: Sequence[str], at: float, start: float, end: float, step: float
) -> list[tuple[float, float]]:
    """The vertices' processing rate per `step` from `start` to `end` (seconds relative to `at`), from their
    cumulative counts interpolated linearly between samples (per executor incarnation, from zero at its
    start; held at its last sample after it stops). `core.rate_timeline.rate_timeline` adds up sample-to-sample
    rates per bucket, which at 1 s points jitters by a sample's worth when an executor's samples shift
    phase (they do after every migration): too much for the paper's 5 % convergence criterion."""
    wanted = set(vertices)
    series: dict[tuple[str, float], list[tuple[float, int]]] = {}
    for sample in sorted(samples, key=lambda s: s.ts):
        if sample.vertex in wanted:
            series.setdefault((sample.executor, sample.started_at), []).append((sample.ts, sample.processed))

    def total(t: float) -> float:
        count = 0.0
        for (_, started), points in series.items():
            if t <= started:
                continue
            previous = (started, 0)
            for ts, processed in points:
                if ts >= t:
                    span = ts - previous[0]
                    share = (t - previous[0]) / span if span > 0 else 1.0
                    count += previous[1] + share * (processed - previous[1])
                    break
                previous = (ts, processed)
            else:
                count += previous[1]
        return count

    times = [start + step * i for i in range(round((end - start) / step) + 1)]
    totals = [total(at + t) for t in times]
    return [(t, (b - a) / step) for t, a, b in zip(times, totals, totals[1:], strict=False)]


def mean_rate(points: Sequence[tuple[float, float]], start: float, end: float) -> float:
    rates = [rate for t, rate in points if start <= t < end]
    return statistics.fmean(rates) if rates else 0.0


def per_second(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """0.5 s points averaged into 1 s points (the convergence criterion's 5 % is too tight for half a
    second of a sink's output; the paper used 10 s windows)."""
    out = []
    for i in range(0, len(points) - 1, 2):
        (t0, r0), (_, r1) = points[i], points[i + 1]
        out.append((t0, (r0 + r1) / 2))
    return out


#: the paper's 5 % is the standard deviation of 10 s windows; for 1 s points of independent noise the same
#: steadiness is sqrt(10) times wider
CONVERGENCE_TOLERANCE = 0.05 * math.sqrt(10.0)


def converged_after(output: Sequence[tuple[float, float]], after: float, timing: Timing) -> float | None:
    """The paper's convergence time on a run's output timeline, up to where the finite sources ran dry."""
    drop = next((t for t, r in output if t >= timing.after_s and r < 0.5 * after), math.inf)
    steady = [(t, r) for t, r in output if t < drop - 1.0]
    return convergence_time(per_second(steady), reference=after, tolerance=CONVERGENCE_TOLERANCE)


def one_run(
    directory: str,
    url: str,
    experiment: str,
    name: str,
    nodes: tuple[int, int],
    plan_spec: tuple[str, str, str, int],
    rep: int,
    timing: Timing,
    seen: dict[tuple[str, str, str], tuple[float, float]] | None = None,
) -> Run:
    """One run; `seen` remembers each plan's measured source rates (one source's), so later repetitions
    size their sources from them."""
    seen = {} if seen is None else seen
    timing = timing.of(experiment)
    label, strategy, protocol, seed = plan_spec
    probe = load_manifest(paper_manifest(directory, name, nodes[0], 1, "probe"))
    before_schedule = packed_schedule(probe) if experiment == "in" else initial_schedule(probe)
    guess = make_plan(
        probe,
        before_schedule,
        snapshot_from_simulation(probe, before_schedule, simulate(probe, before_schedule)),
        nodes[1],
        strategy,
        seed=seed,
    )
    key = (experiment, name, label)
    limit = source_limit(probe, before_schedule, guess.new_schedule, timing, seen.get(key), experiment)
    tag = f"{experiment}-{label.replace(' ', '')}-{rep}"
    path = paper_manifest(directory, name, nodes[0], limit, tag)
    topology = load_manifest(path)
    run = Run(experiment, name, label, rep, nodes)
    with LocalCluster(topology, path, url, interval_s=INTERVAL_S) as cluster:
        cluster.start(before_schedule)
        checkpointer = Checkpointer(CheckpointDriver(topology, cluster, cluster.client), CHECKPOINT_S).start()
        time.sleep(timing.warmup_s + timing.before_s)
        stream = MetricStream(cluster.client, topology.redis_prefix)
        window = int(timing.before_s / INTERVAL_S)
        analysis = analyze_samples(
            topology,
            stream.read_since(time.time() - timing.before_s - 2.0),
            window=window,
            interval_s=INTERVAL_S,
            congestion_rate=topology.scaling.congestion_rate,
        )
        model = SimulationModel.from_topology(topology, analysis.snapshot)
        plan = make_plan(topology, before_schedule, analysis.snapshot, nodes[1], strategy, seed=seed, model=model)
        run.predicted_before = simulate(topology, before_schedule, model).throughput
        run.predicted = plan.predicted_throughput
        scaled_at = time.time()
        report = MigrationDriver(topology, cluster, cluster.client, protocol).migrate(plan.new_schedule).to_status()
        time.sleep(max(0.0, scaled_at + timing.after_s + INTERVAL_S - time.time()))
        checkpointer.stop()
        wait_for_sinks_idle(cluster, topology, quiet_s=0.6, timeout_s=60.0)
        samples = stream.read_since(None)
        first = -timing.warmup_s - timing.before_s
        last = max(s.ts for s in samples) - scaled_at + 1.0
        output = counted_timeline(samples, list(topology.sinks), scaled_at, first, last, STEP_S)
        inputs = counted_timeline(samples, list(topology.sources), scaled_at, first, last, STEP_S)
        lost = duplicated = 0
        for sink, expected in expected_copies(topology, range(limit)).items():
            got = id_counts(sink_events(cluster.client, topology, sink))
            lost += sum((expected - got).values())
            duplicated += sum((got - expected).values())
        for key in cluster.client.scan_iter(f"{topology.redis_prefix}*", count=1000):
            cluster.client.unlink(key)
    run.before = mean_rate(output, -timing.before_s, 0.0)
    run.after = mean_rate(output, timing.after_s - timing.measure_s, timing.after_s)
    run.exhausted_early = max((t for t, r in inputs if r > 0), default=0.0) < timing.after_s
    per_source = len(topology.sources)
    seen.setdefault(
        key,
        (
            mean_rate(inputs, -timing.before_s, 0.0) / per_source,
            mean_rate(inputs, timing.after_s - timing.measure_s, timing.after_s) / per_source,
        ),
    )
    run.convergence_s = converged_after(output, run.after, timing)
    run.zero_s = time_at_zero(output, 0.0, timing.after_s, STEP_S, floor=0.01 * run.before)
    run.lost, run.duplicated = lost, duplicated
    run.replayed = int(report.get("replayed", 0) or 0)
    run.captured = int(report.get("capturedEvents", 0) or 0)
    run.pause_ms = report.get("pauseMs")
    run.outcome = str(report.get("outcome", ""))
    run.timeline = [(t, r) for t, r in output if -timing.before_s - timing.warmup_s <= t]
    conv = "-" if run.convergence_s is None else f"{run.convergence_s:.1f}s"
    log(
        f"  {name:<10} {nodes[0]}->{nodes[1]} {label:<15} rep {rep}: {run.before:6,.0f} -> {run.after:6,.0f}/s "
        f"({run.improvement:+.0%}), predicted {run.predicted or 0:6,.0f} (x{run.accuracy or 0:.2f}), "
        f"converged {conv}, zero {run.zero_s:.1f}s, lost {lost}, dup {duplicated}, replayed {run.replayed}"
        + (" [sources ran out early]" if run.exhausted_early else "")
    )
    return run


# ---- the experiments --------------------------------------------------------------------------------------


def experiments(timing: Timing, topologies: Sequence[str], plans: Sequence[str], scale_in: bool) -> list[Any]:
    """(experiment, topology, (before, after nodes), plan) for every run of one repetition: the scale-outs of
    `topologies` and, with `scale_in`, Page Load's scale-in, each with the plans labelled in `plans`."""
    todo: list[Any] = []
    for name, after in SCALE_OUT:
        if name in topologies:
            for spec in OUT_PLANS:
                if spec[0] in plans:
                    todo.append(("out", name, (after - 1, after), spec))
    if scale_in:
        name, before, after = SCALE_IN
        todo += [("in", name, (before, after), spec) for spec in IN_PLANS if spec[0] in plans]
    return todo


def names(text: str, known: Sequence[str], what: str) -> list[str]:
    """A comma-separated list of `what`, each one of `known` (argparse type)."""
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what}: {', '.join(unknown)}; use some of: {', '.join(known)}")
    return chosen


def run_all(url: str, timing: Timing, todo: list[Any]) -> list[Run]:
    """Every run `timing.reps` times, repetitions interleaved (rep 1 of everything, then rep 2, ...) so a
    slow minute of the shared machine does not land on one plan."""
    runs: list[Run] = []
    seen: dict[tuple[str, str, str], tuple[float, float]] = {}
    started = time.monotonic()
    total = len(todo) * timing.reps
    with tempfile.TemporaryDirectory(prefix="elastream-paper-") as directory:
        for rep in range(timing.reps):
            for experiment, name, nodes, spec in todo:
                runs.append(one_run(directory, url, experiment, name, nodes, spec, rep, timing, seen))
                done = len(runs)
                elapsed = time.monotonic() - started
                left = elapsed / done * (total - done) / 60
                log(f"[{done}/{total}] {elapsed / 60:.1f} min, about {left:.1f} min left")
    return runs


# ---- the report -------------------------------------------------------------------------------------------

#: what the paper reports (text of sections IV-B..IV-E; its figures are bar charts and timelines)
PAPER_OUT = {
    "star": ("+65 %", "longer than Storm's (many bolts changed at once)"),
    "linear": ("+45 %", "about as long as Storm's"),
    "diamond": ("+120 %", "92 % shorter than Storm's"),
    "pageload": ("+125 % (+80 % over before)", "88 % shorter than Storm's"),
    "processing": ("+125 % (+80 % over before)", "75 % shorter than Storm's"),
    "netmon": ("Storm does not improve; Stela +21 % over before", "longer than Storm's (re-parallelization)"),
}
PAPER_IN = (
    "Stela keeps the throughput; the two random groups lose 80 % and 40 % (Stela 2-5x higher), with 87.5 % and "
    "75 % less time at zero throughput"
)

#: why our numbers differ from the paper's, written from the measurements of the run this file reports
NOTES: list[str] = [
    (
        "**Storm's default, restarted.** `round-robin` + `restart` restores every worker from a checkpoint at "
        "most 2 s old and its sources replay from there. In this run (2026-11-27, a quiet machine) it was at zero "
        "throughput for 1.0-2.5 s, converged in 16 of its 24 runs (the scale-in's random groups included) and "
        "ended level with its before (-5 % to +12 %). In the run before it, every starting worker still compiled "
        "the CRD's CEL rules (about 0.6 s of CPU, 8-9 workers at once on 2 cores; fixed in 507fd69): restart sat "
        "at zero 2.0-5.5 s and 2-53 % below its before, and every ratio to round-robin was higher. The paper's "
        "Storm rebalance stalled for tens of seconds, so this run is kinder to it than the paper's. Its cost also "
        "shows as duplicates at the at-least-once sinks (11,632-70,782 per topology and plan over 3 runs); every "
        "CCR run (stela, stela-plus, least-link-load) lost nothing, duplicated nothing and was never at zero."
    ),
    (
        "**Round-robin keeps every parallelism.** Storm's rebalance deals the same executors over one more node, "
        "so it cannot relieve a parallelism-bound vertex. Stela gives the new slots to the congested vertices: "
        "over before, star +64 % (the paper: +65 % over Storm), linear +30 % (the paper: +45 %), diamond +35 %, "
        "netmon +67 % (the paper: +21 % over before)."
    ),
    (
        "**stela-plus moves existing executors too** (opt-in; `stela` stays the paper's algorithm). A move costs "
        "about 0.1 s of pause with CCR, so on a scale-out it may move up to Stela's executors per node × the nodes"
        " added, and it packs the executors by CPU. Over before: star +99 %, linear +67 %, diamond +48 %, Page "
        "Load +74 %, Processing +80 %, netmon +117 %; over round-robin 1.42-2.10x, above Stela on every topology "
        "(Stela: 1.05-1.67x). On Page Load and Processing that is +76 % over Storm's default, against a restart "
        "that recovered to its before, so the +60 % target holds. Its largest model miss is the diamond: the plan "
        "predicts 9,573/s and measures 0.79 of it."
    ),
    (
        "**Page Load is keyed.** `sessionize` and `join` take `fields` streams: each executor owns a fixed share "
        "of the keys, so a vertex goes at the pace of its slowest executor, and Stela's new executors share the "
        "new node's 2 cores: +8 % over before (the model: 1,667/s, measured 0.85 of it). Spreading the keyed "
        "executors needs moving existing ones, outside Stela's space; stela-plus does, +74 %. Processing (also "
        "keyed): Stela +6 %, stela-plus +80 %. The paper's +80 % over before on the Yahoo topologies came from "
        "machines not CPU-bound this way."
    ),
    (
        "**Scale-in: ETPSum does not see CPU.** Stela removes the nodes whose executors have the lowest ETP "
        "(those upstream of the congested `join`) and deals their executors round-robin over the remaining 4, "
        "where the CPU-heavy keyed executors then share nodes: 729/s, 0.71x random group 1 (1,022/s) and 1.19x "
        "group 2 (614/s), where the paper has Stela 2-5x above random removal. stela-plus also weighs the nodes "
        "using least CPU and moves executors off crowded ones: 1,113/s, 1.09x and 1.81x the random groups, never "
        "at zero (the random groups 1.0-1.5 s: they restart). 2x random group 1 cannot be reached here: group 1 "
        "already carries 0.75 of what 4 nodes' 8 emulated cores can (the model: 1,040 of 1,379/s)."
    ),
    (
        "**Convergence in seconds, not minutes.** The paper's criterion (twice above and twice below the "
        "post-scale average, within 5 %) is on 10 s windows; on our 1 s points the tolerance is 5 % × √10. CCR "
        "runs converge in 0.5-3.5 s (45 of 60 within the window), restart runs in 1.5-9.5 s (16 of 24). A run "
        "shown as not converged oscillated by more than the tolerance through the window: the periodic "
        "checkpoint every 2 s pauses each executor at its barrier, which 1 s points see."
    ),
    (
        "**Prediction.** Post-scale, measured / predicted has median 0.93 and 65 % of the 84 runs within ±10 % "
        "(the run of 2026-11-25: 0.97 and 86 %); every Stela scale-out's median is 0.85-0.97. Below: stela-plus's "
        "moved plans (0.79 on the diamond, 0.81 on the scale-in; we have not pinned down what the model misses "
        "there), least-link-load on Page Load (0.75) and on the diamond (0.82), round-robin on Page Load (0.83). "
        "Before the scale, the same model on the schedule that ran: median 0.94, 64 % within ±10 %."
    ),
]


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def spread(values: Sequence[float | None], fmt: str) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    mid = statistics.median(present)
    if len(present) == 1:
        return format(mid, fmt)
    return f"{format(mid, fmt)} [{format(min(present), fmt)}–{format(max(present), fmt)}]"


def grouped(runs: Sequence[Run], experiment: str) -> dict[tuple[str, str], list[Run]]:
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        if run.experiment == experiment:
            groups.setdefault((run.topology, run.plan), []).append(run)
    return groups


def seconds(value: float | None) -> str:
    return "not within the run" if value is None else f"{value:.1f}"


def run_table(groups: dict[tuple[str, str], list[Run]], baseline: str) -> list[str]:
    lines = [
        f"| topology | nodes | plan | before /s | after /s | improvement | after vs {baseline} | convergence s "
        "| zero s | lost | duplicated | replayed | predicted /s | measured / predicted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, plan), runs in groups.items():
        base = median([r.after for r in groups.get((name, baseline), [])])
        conv = [r.convergence_s for r in runs]
        converged = sum(1 for c in conv if c is not None)
        conv_text = spread(conv, ".1f") + (f" ({converged}/{len(runs)} converged)" if converged < len(runs) else "")
        versus = spread([r.after / base for r in runs], ".2f") + "x" if base else "–"
        lines.append(
            f"| {name} | {runs[0].nodes[0]}→{runs[0].nodes[1]} | {plan} | {spread([r.before for r in runs], ',.0f')} "
            f"| {spread([r.after for r in runs], ',.0f')} | {spread([100 * r.improvement for r in runs], '+.0f')} % "
            f"| {versus} | {conv_text} | {spread([r.zero_s for r in runs], '.1f')} "
            f"| {sum(r.lost for r in runs)} | {sum(r.duplicated for r in runs):,} "
            f"| {spread([r.replayed for r in runs], ',.0f')} "
            f"| {spread([r.predicted for r in runs], ',.0f')} | {spread([r.accuracy for r in runs], '.2f')} |"
        )
    return lines


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def prediction_lines(runs: Sequence[Run]) -> list[str]:
    after = [r.accuracy for r in runs if r.accuracy is not None]
    before = [r.before / r.predicted_before for r in runs if r.predicted_before]
    lines = [
        "| prediction | runs | median | 10th pct | 90th pct | min | max | within ±10 % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, ratios in (("post-scale (the plan's)", after), ("before the scale (same model)", before)):
        if not ratios:
            continue
        within = sum(1 for x in ratios if abs(x - 1.0) <= 0.10) / len(ratios)
        lines.append(
            f"| {label} | {len(ratios)} | {statistics.median(ratios):.2f} | {percentile(ratios, 0.1):.2f} "
            f"| {percentile(ratios, 0.9):.2f} | {min(ratios):.2f} | {max(ratios):.2f} | {within:.0%} |"
        )
    return lines


def versus_paper(groups: dict[tuple[str, str], list[Run]]) -> list[str]:
    lines = [
        "| topology | paper: Stela after vs Storm after | ours: stela vs round-robin | ours: stela-plus vs "
        "round-robin | paper: Stela's convergence | ours: stela / round-robin convergence (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, _ in SCALE_OUT:
        rr = median([r.after for r in groups.get((name, "round-robin"), [])])
        if not rr:
            continue

        def ratio(plan: str, name: str = name, rr: float = rr) -> str:
            value = median([r.after for r in groups.get((name, plan), [])])
            return "–" if value is None else f"{value / rr - 1:+.0%}"

        conv = [median([r.convergence_s for r in groups.get((name, p), [])]) for p in ("stela", "round-robin")]
        paper_after, paper_conv = PAPER_OUT[name]
        lines.append(
            f"| {name} | {paper_after} | {ratio('stela')} | {ratio('stela-plus')} | {paper_conv} "
            f"| {seconds(conv[0])} / {seconds(conv[1])} |"
        )
    return lines


def report(out: str, runs: Sequence[Run], timing: Timing, minutes: float, argv: Sequence[str]) -> str:
    outs, ins = grouped(runs, "out"), grouped(runs, "in")
    lines = [
        "# The Stela experiments on real processes",
        "",
        "Generated by `bench/stela.py` (`make bench-paper`); "
        f"`{' '.join(['python bench/stela.py', *argv])}` took {minutes:.1f} min on this machine "
        f"({os.cpu_count()} cores, {platform_line()}).",
        "",
        "Every number is from worker processes exchanging events over sockets, a real Redis, real CCR and restart "
        "migrations. Costs are sleep-based with an emulated 2-core CPU per node, so up to 9 nodes fit on one "
        "machine; shapes follow the paper's Table I (examples/*.yaml say what is the paper's and what is ours). "
        f"Each run: {timing.warmup_s:g} s warm-up, {timing.before_s:g} s measured and analysed, the plan "
        f"made from that analysis and applied, {timing.after_s:g} s after the scale request of which the last "
        f"{timing.measure_s:g} s are the post-scale throughput (a scale-in: {timing.in_after_s:g} s, the last "
        f"{timing.in_measure_s:g} s); periodic checkpoints every {CHECKPOINT_S:.0f} s; "
        "then the finite sources run out and every sink stream is checked id by id. "
        f"Repetitions: {timing.reps}, interleaved; cells are median [min–max].",
        "",
        "Columns: *improvement* is after / before − 1; *convergence* is the paper's (section IV-D): from the scale "
        "request until the throughput has been twice above and twice below its post-scale average with a "
        "standard deviation within 5 % of it over 10 s windows (here 1 s points, so within 5 % × √10 = 16 %); "
        "*zero* is the time the sinks' output was below 1 % of its "
        "level before (0.5 s steps of the sinks' counts, interpolated between samples); *lost*/*duplicated* "
        "are summed over the repetitions; *replayed* is, for "
        "CCR, the in-flight events captured and replayed into the new executors (not duplicates) and, for "
        "restart, the events the sources emitted again since the checkpoint restored; *predicted* is the plan's "
        "post-scale throughput (`elastream plan` on the analysed window).",
        "",
        "## Scale-out by one node",
        "",
        *run_table(outs, "round-robin"),
        "",
        "![throughput timelines](stela-timelines.png)",
        "",
        "![post-scale throughput and convergence](stela-summary.png)",
        "",
        "### Beside the paper",
        "",
        *versus_paper(outs),
        "",
    ]
    if ins:
        lines += [
            "## Scale-in: Page Load from 8 to 4 nodes (the paper's Fig. 8)",
            "",
            "The initial allocation packs the executors in topological order, so every node holds executors of at "
            "most 2 operators (the paper's setup). Stela's ETPSum picks the nodes to remove and CCR moves their "
            "executors; Storm's default is two random groups of 4 nodes, restarted from the last checkpoint.",
            "",
            *run_table(ins, "random group 1"),
            "",
            f"The paper: {PAPER_IN}.",
            "",
            "![scale-in](stela-scalein.png)",
            "",
        ]
    lines += [
        "## How far to trust `elastream plan`",
        "",
        "Measured / predicted throughput over every run (post-scale: the plan's prediction for its schedule; "
        "before: the same calibrated model on the schedule that ran):",
        "",
        *prediction_lines(runs),
        "",
        "![predicted vs measured](stela-prediction.png)",
        "",
        "## Why we differ from the paper",
        "",
        *[f"- {note}" for note in NOTES],
        "",
    ]
    early = [r for r in runs if r.exhausted_early]
    if early:
        named = ", ".join(f"{r.topology} {r.plan} rep {r.rep}" for r in early)
        lines += [
            f"Runs whose sources stopped emitting before the end of the window: {len(early)} ({named}); the sinks "
            "may still have drained a backlog through the window, so their after is at most low.",
            "",
        ]
    path = os.path.join(out, "stela.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    return path


def platform_line() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or sys.platform


# ---- plots ------------------------------------------------------------------------------------------------

COLORS = {
    "stela": "tab:blue",
    "stela-plus": "tab:green",
    "least-link-load": "tab:orange",
    "round-robin": "tab:red",
    "random group 1": "tab:red",
    "random group 2": "tab:purple",
}


def window(timeline: Sequence[tuple[float, float]], timing: Timing) -> list[tuple[float, float]]:
    """1 s points up to the end of the measured window (after it the finite sources run out and the sinks
    drain, which is not the system's throughput)."""
    return [(t, v) for t, v in per_second(timeline) if t <= timing.after_s]


def plot(out: str, runs: Sequence[Run], timing: Timing) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outs = grouped(runs, "out")
    names = [n for n, _ in SCALE_OUT if any(k[0] == n for k in outs)]
    plans = [p[0] for p in OUT_PLANS if any(k[1] == p[0] for k in outs)]
    if names:
        cols = min(3, len(names))
        rows = math.ceil(len(names) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
        for ax, name in zip(axes.flat, names, strict=False):
            for plan in plans:
                for run in outs.get((name, plan), [])[:1]:  # the first repetition, like the paper's one run
                    points = window(run.timeline, timing.of("out"))
                    ax.plot(*zip(*points, strict=True), label=plan, color=COLORS[plan], lw=1.2)
            ax.axvline(0, color="grey", ls=":", lw=1)
            ax.set_title(f"{name} ({outs[(name, plans[0])][0].nodes[0]}→{outs[(name, plans[0])][0].nodes[1]} nodes)")
            ax.set_xlabel("s since the scale-out request")
            ax.set_ylabel("sink events/s")
            ax.set_ylim(bottom=0)
        for ax in list(axes.flat)[len(names) :]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=8)
        fig.suptitle("Scale-out throughput timelines (1 s points; the paper's Fig. 4 and 6 use 10 s windows)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "stela-timelines.png"), dpi=110)
        plt.close(fig)

        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4))
        width = 0.8 / len(plans)
        for i, plan in enumerate(plans):
            xs = [j + i * width for j in range(len(names))]
            for ax, value in ((left, "after"), (right, "convergence_s")):
                mids, lows, highs = [], [], []
                for name in names:
                    vals = [getattr(r, value) for r in outs.get((name, plan), []) if getattr(r, value) is not None]
                    mid = statistics.median(vals) if vals else 0.0
                    mids.append(mid)
                    lows.append(mid - min(vals) if vals else 0.0)
                    highs.append(max(vals) - mid if vals else 0.0)
                ax.bar(xs, mids, width, yerr=[lows, highs], label=plan, color=COLORS[plan], capsize=2)
        for ax, title in ((left, "post-scale throughput (events/s)"), (right, "convergence time (s, Fig. 7)")):
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
            ax.set_title(title)
        left.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "stela-summary.png"), dpi=110)
        plt.close(fig)

    ins = grouped(runs, "in")
    if ins:
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [2, 1]})
        labels = [p[0] for p in IN_PLANS]
        for plan in labels:
            for run in ins.get((SCALE_IN[0], plan), [])[:1]:
                points = window(run.timeline, timing.of("in"))
                left.plot(*zip(*points, strict=True), label=plan, color=COLORS[plan], lw=1.2)
        left.axvline(0, color="grey", ls=":", lw=1)
        left.set_xlabel("s since the scale-in request")
        left.set_ylabel("sink events/s")
        left.set_ylim(bottom=0)
        left.set_title("Page Load 8→4 nodes (Fig. 8b)")
        left.legend(fontsize=8)
        zero = [statistics.median([r.zero_s for r in ins.get((SCALE_IN[0], p), [])] or [0.0]) for p in labels]
        after = [statistics.median([r.after for r in ins.get((SCALE_IN[0], p), [])] or [0.0]) for p in labels]
        right.bar([p.replace(" ", "\n", 1) for p in labels], after, color=[COLORS[p] for p in labels])
        for i, z in enumerate(zero):
            right.annotate(f"zero {z:.1f} s", (i, after[i]), ha="center", va="bottom", fontsize=8)
        right.set_title("post-scale-in throughput (events/s)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "stela-scalein.png"), dpi=110)
        plt.close(fig)

    pairs = [(r.predicted, r.after, r.topology) for r in runs if r.predicted]
    if pairs:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
        top = max(max(p, m) for p, m, _ in pairs) * 1.1
        left.plot([0, top], [0, top], color="grey", lw=1)
        left.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.15, label="±10 %")
        for name in dict.fromkeys(t for _, _, t in pairs):
            pts = [(p, m) for p, m, t in pairs if t == name]
            left.scatter(*zip(*pts, strict=True), s=14, label=name)
        left.set_xlabel("predicted post-scale events/s (elastream plan)")
        left.set_ylabel("measured events/s")
        left.legend(fontsize=7)
        right.hist([m / p for p, m, _ in pairs], bins=20, color="tab:blue")
        right.axvline(1.0, color="grey", ls=":")
        right.set_xlabel("measured / predicted")
        right.set_ylabel("runs")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "stela-prediction.png"), dpi=110)
        plt.close(fig)


# ---- entry point ------------------------------------------------------------------------------------------


def save(out: str, runs: Sequence[Run], timing: Timing, minutes: float, argv: Sequence[str]) -> None:
    import json

    with open(os.path.join(out, "stela-runs.json"), "w", encoding="utf-8") as handle:
        json.dump(
            {
                "timing": timing.__dict__,
                "minutes": minutes,
                "argv": list(argv),
                "runs": [{**r.__dict__, "nodes": list(r.nodes)} for r in runs],
            },
            handle,
            indent=0,
        )


def load(out: str) -> tuple[list[Run], Timing, float, list[str]]:
    import json

    with open(os.path.join(out, "stela-runs.json"), encoding="utf-8") as handle:
        data = json.load(handle)
    runs = []
    for r in data["runs"]:
        r["nodes"] = tuple(r["nodes"])
        r["timeline"] = [tuple(p) for p in r["timeline"]]
        runs.append(Run(**r))
    return runs, Timing(**data["timing"]), float(data["minutes"]), list(data["argv"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="star, linear and diamond, one repetition")
    parser.add_argument("--smoke", action="store_true", help="linear, stela and round-robin, short windows")
    parser.add_argument("--reps", type=int, help="repetitions (default 3)")
    out_names = [n for n, _ in SCALE_OUT]
    plan_labels = list(dict.fromkeys(p[0] for p in (*OUT_PLANS, *IN_PLANS)))
    parser.add_argument(
        "--topologies",
        type=lambda text: names(text, out_names, "topologies"),
        help=f"comma-separated scale-outs to run (default: all; --quick, --smoke: theirs): {', '.join(out_names)}",
    )
    parser.add_argument(
        "--plans",
        type=lambda text: names(text, plan_labels, "plans"),
        help=f"comma-separated plans to run, scale-out and scale-in (default: all): {', '.join(plan_labels)}",
    )
    parser.add_argument(
        "--scale-in",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run Page Load's scale-in 8 -> 4 (default: yes, but not with --smoke)",
    )
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks"), help="where tables and plots go")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report and plots from --out/stela-runs.json"
    )
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.report_only:
        runs, timing, minutes, used = load(args.out)
        for run in runs:
            run.convergence_s = converged_after(run.timeline, run.after, timing.of(run.experiment))
        report(args.out, runs, timing, minutes, used)
        plot(args.out, runs, timing)
        return 0
    timing = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.reps:
        timing = Timing(**{**timing.__dict__, "reps": args.reps})
    if args.smoke:
        topologies, plans, scale_in = ["linear"], ["stela", "round-robin"], False
    elif args.quick:
        topologies, plans, scale_in = ["star", "linear", "diamond"], plan_labels, True
    else:
        topologies, plans, scale_in = out_names, plan_labels, True
    todo = experiments(
        timing,
        topologies if args.topologies is None else args.topologies,
        plans if args.plans is None else args.plans,
        scale_in if args.scale_in is None else args.scale_in,
    )
    if not todo:
        parser.error("nothing to run: --topologies, --plans and --scale-in leave no run")
    log(f"{len(todo)} runs x {timing.reps} repetitions")
    directory = tempfile.mkdtemp(prefix="elastream-redis-")
    redis = EmbeddedRedis(directory)
    started = time.monotonic()
    try:
        runs = run_all(redis.url, timing, todo)
    finally:
        redis.stop()
        shutil.rmtree(directory, ignore_errors=True)
    minutes = (time.monotonic() - started) / 60
    used = sys.argv[1:] if argv is None else argv
    save(args.out, runs, timing, minutes, used)
    path = report(args.out, runs, timing, minutes, used)
    plot(args.out, runs, timing)
    log(f"wrote {path} and its plots ({minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
