"""Autoscaling on worker processes: AUTOSCALE's 3-step and 5-step streams run by `elastream run`, not simulated.

bench/autoscale.py compares the policies in `elastream.sim.autoscaling`, a fluid simulator. This benchmark
runs the same `linear` topology (bench/autoscale.py's `linear`: spout -> intermediate, work 2 ms -> sink
80 ms; high rate 90 events/s; 4 slots and 4 emulated cores per node; maxParallelism 8) on real worker
processes: `python -m elastream run <manifest> --redis <url> --engine python --interval 1` as a subprocess
(as tests/support/harness.py `start_run` does), against an embedded Redis (`EmbeddedRedis`, as bench/stela.py).
Four policies per stream, in one run: **static-min** (ConfMin: parallelism 1, fewest nodes, autoscaling off),
**static-expert** (ConfExpt: per vertex the fewest executors that keep up with the profile's peak,
`sim.scenario.expert_parallelism`, fewest nodes; autoscaling off), **autoscale** and **rules**
(`spec.scaling.auto` with that policy, started from ConfMin as in the paper). Beside every run, the
simulator's prediction for the same `Topology` (the manifest the run used) and policy.

Shortened settings (module constants): the paper's steps last minutes and bench/autoscale.py's simulated
ones 120 s, with 20 s windows and 30 s of stabilization; eight runs of that length on real processes would
take well over an hour on the 2-core machine this runs on (shared with other work) and do not fit a
CI-time budget. Here a step lasts `STEP_SECONDS` = 20 s (3-step stream: 9.5 steps = 190 s; 5-step: 5 steps
= 100 s), the analysis window is `WINDOW` = 5 intervals of 1 s, `stabilizationSeconds` is
`STABILIZATION_S` = 10 s and the fluctuation stays `FLUCTUATION` = 5 %: the window and the stabilization
shrink with the step (a step still spans four windows), and the whole benchmark takes about 25 minutes.
`--quick` (a smoke check): steps of 8 s, the 5-step stream only, static-expert and autoscale only.

What a run measures:

- The sink is a `redis-stream` sink (at-least-once, costMs 80 like bench/autoscale.py's null sink), so
  every event that reaches it is in a Redis stream with its id and its source's emission stamp `ts`; the
  source gets a `limit`, the number of events its profile offers over one period, so it is finite and the
  ids a correct run delivers are exactly idOffset + 0 .. limit - 1 (the Synthetic source's numbering).
- Once a second the running schedule (`Registry.schedule()`) is read: executor-seconds and node-seconds
  are Σ parallelism and the node count integrated over the stream's length (the active schedule: a
  migration's new executors count from its switch, the simulator bills them from the decision), and every
  change of the schedule is a rescale (the `last-scaling` records are kept beside them).
- The run is stopped (SIGINT) once the source is exhausted and the sink idle (its stream holds `limit`
  entries and stopped growing, or stopped growing after the stream's end), at most `DRAIN_S` after the
  stream's end. Then: lost = expected ids missing from the sink stream, duplicated = ids in it more than
  once. A run stopped before it drained (ConfMin: its sink does 12.5 events/s against up to 94.5 offered)
  has ids never delivered: they are reported as undelivered, not as lost, and count as late.
- Latency is measured from when the event was DUE by the rate profile, not from its emission: a
  back-pressured source holds events back, and measuring from `ts` would hide exactly what ConfMin
  suffers. The Synthetic source's events fall due in sequence order on the vertex's clock, whatever its
  parallelism, so event seq (id - idOffset) is the (seq + 1)-th event offered and is due when the
  profile's cumulative `RateProfile(config).due(t - t0)` reaches seq + 1 (inverted by bisection).
  t0, the profile clock's start, is estimated from the events at the stream's start, which are not
  back-pressured: the `ts` (emission stamp) of an event minus its due time, for the smallest-seq event and
  every other event due in the first `EARLY_S` seconds, the smallest of these values (no event leaves before
  it is due, so each is an upper bound of t0; the smallest-seq event alone was 50-100 ms late in trials,
  as the first poll waits for the workers' connections, which made every latency look that much shorter;
  its estimate is kept in the JSON as `t0_first_event`). Arrival = the millisecond part of the Redis stream
  entry id. Late = latency above the simulator's `latency_bound_s` (1 s); an undelivered event counts with
  the stop time as its arrival (a lower bound, marked "≥" when it decides the p99).

Writes docs/benchmarks/autoscale-processes.json (every number, the settings, date, machine, command),
docs/benchmarks/autoscale-processes.md (a markdown fragment starting at "## On worker processes") and
autoscale-processes-3-step.png / -5-step.png. `--out DIR` writes elsewhere (`--quick` defaults to a
directory under /tmp, so a smoke check never overwrites the published results).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import itertools
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))  # support/
from support.paths import REPO

sys.path.insert(0, os.path.join(REPO, "operator", "src"))
sys.path.insert(0, os.path.join(REPO, "bench"))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import redis
import yaml

import autoscale as paper
from elastream.control.backends.local import EmbeddedRedis
from elastream.core.rates import RateProfile
from elastream.core.topology import API_VERSION, KIND, Topology, parse_manifest
from elastream.crd import load_manifest
from elastream.sim import autoscaling as sim
from elastream.sim import scenario
from elastream.store.registry import Registry

OUT = paper.OUT
QUICK_OUT = os.path.join(tempfile.gettempdir(), "elastream-autoscale-processes-quick")
PROFILES = paper.PROFILES
#: one step of the streams, shortened from bench/autoscale.py's 120 s (see the module docstring)
STEP_SECONDS = 20.0
QUICK_STEP_SECONDS = 8.0
#: analysis window: intervals of `INTERVAL_S`
WINDOW = 5
INTERVAL_S = 1.0
STABILIZATION_S = 10.0
FLUCTUATION = paper.FLUCTUATION
#: the late bound of the simulator (1 s)
LATE_S = scenario.SimSettings().latency_bound_s
#: after the stream's end: stop at the latest this much later, or once the sink was idle for `IDLE_S`
DRAIN_S = 30.0
IDLE_S = 4.0
#: what the run may take to start its workers and emit a first event, added to `--duration` as a hard cap
STARTUP_S = 60.0
POLL_S = 1.0
#: t0 is estimated from the events due in the stream's first seconds (see `measure`)
EARLY_S = 3.0
PROGRESS_S = 10.0
POLICIES: tuple[scenario.Policy, ...] = ("static-min", "static-expert", "autoscale", "rules")
QUICK_POLICIES: tuple[scenario.Policy, ...] = ("static-expert", "autoscale")
COLORS = paper.COLORS
#: the paper's mark for an adaptive policy against ConfExpt
SAVING_MARK = 0.20
LATE_MARK = 0.02


def log(message: str) -> None:
    print(message, flush=True)


# ---- manifests ---------------------------------------------------------------------------------------------


def short(profile: str) -> str:
    return profile.removeprefix("autoscale-")


def vertex_block(spec: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The `source:`/`sink:` block of the linear topology's (single) vertex of that kind."""
    return next(v[kind] for v in spec["vertices"] if kind in v)


def build_doc(profile: str, policy: scenario.Policy, step_s: float, name: str) -> dict[str, Any]:
    """bench/autoscale.py's `linear` manifest with the shortened settings, a finite source and a redis-stream
    sink; static policies: autoscaling off at their configuration; adaptive ones: on, from ConfMin."""
    spec = copy.deepcopy(dict(paper.linear(profile).spec))
    source = vertex_block(spec, "source")
    source.update(stepSeconds=step_s, fluctuation=FLUCTUATION)
    source["limit"] = offered_events(source)
    for vertex in spec["vertices"]:
        if "sink" in vertex:
            cost = vertex["sink"].get("costMs")
            vertex["sink"] = {"type": "redis-stream", "delivery": "at-least-once", "costMs": cost}
    scaling = spec["scaling"]
    scaling["window"] = WINDOW
    auto = scaling["auto"]
    auto["stabilizationSeconds"] = STABILIZATION_S
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
    topology = parse_manifest(doc)
    if policy in ("autoscale", "rules"):
        auto.update(enabled=True, policy=policy)
        degrees = scenario.min_parallelism(topology)
        nodes = max(int(auto.get("minNodes", 1)), min(int(auto["maxNodes"]), scenario.nodes_for(topology, degrees)))
    else:
        auto["enabled"] = False
        expert = policy == "static-expert"
        degrees = scenario.expert_parallelism(topology) if expert else scenario.min_parallelism(topology)
        nodes = scenario.nodes_for(topology, degrees)
    for vertex in spec["vertices"]:
        vertex["parallelism"] = degrees[vertex["name"]]
    spec["nodes"] = nodes
    parse_manifest(doc)  # still valid
    return doc


def offered_events(source: Mapping[str, Any]) -> int:
    """Events the source's profile offers over one period (the run's `limit`)."""
    profile = RateProfile(source)
    return math.floor(profile.due(profile.period) + 1e-6)


def due_time(profile: RateProfile, n: float) -> float:
    """The first t ≥ 0 (seconds on the profile's clock) at which `profile.due(t)` reaches n, by bisection."""
    if n <= 0:
        return 0.0
    lo, hi = 0.0, max(profile.period, 1.0)
    while profile.due(hi) < n:
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        if hi - lo < 1e-6:
            break
        mid = 0.5 * (lo + hi)
        if profile.due(mid) >= n:
            hi = mid
        else:
            lo = mid
    return hi


# ---- one run on worker processes ---------------------------------------------------------------------------


@dataclass
class Sample:
    wall: float
    version: int | None
    parallelism: dict[str, int]
    nodes: int
    sink: int

    @property
    def executors(self) -> int:
        return sum(self.parallelism.values())


@dataclass
class Measured:
    label: str
    stream: str
    policy: str
    manifest: dict[str, Any]
    limit: int
    length_s: float
    samples: list[Sample] = field(default_factory=list)
    scalings: list[dict[str, Any]] = field(default_factory=list)
    returncode: int | None = None
    error: str = ""
    stopped_by: str = ""
    log_tail: str = ""
    decisions: int = 0
    # computed from the sink stream
    t0: float | None = None
    #: min over the delivered events of (emission - due): ≈ 0 when t0 is right, negative when it is late
    t0_slack_s: float | None = None
    #: the estimate from the smallest-seq event alone (t0 itself: the min over the first EARLY_S)
    t0_first_event: float | None = None
    stop_wall: float = 0.0
    drained: bool = False
    delivered: int = 0
    distinct: int = 0
    missing: int = 0
    lost: int | None = None
    undelivered: int = 0
    gaps: int = 0
    duplicated: int = 0
    extra_copies: int = 0
    late_fraction: float | None = None
    #: share of all events that were late and due before the first rescale (the start on ConfMin)
    late_before_first_change: float | None = None
    p99_s: float | None = None
    p99_lower_bound: bool = False
    p99_from_emission_s: float | None = None
    source_lag_p99_s: float | None = None
    source_lag_max_s: float | None = None
    executor_seconds: float | None = None
    node_seconds: float | None = None
    rescales: list[dict[str, Any]] = field(default_factory=list)
    rescales_after_stream: int = 0
    #: per second of the profile clock: events delivered (first copies) in it
    delivered_per_s: list[int] = field(default_factory=list)
    #: per second of the stream (by due time): the most an event due in it was held back at the source
    source_lag_per_s: list[float] = field(default_factory=list)
    #: per second of the stream (by due time): the largest latency of an event due in it
    latency_max_per_s: list[float] = field(default_factory=list)


def sink_key(topology: Topology) -> str:
    return f"{topology.redis_prefix}sink:{topology.sinks[0]}"


def read_stream(client: redis.Redis, key: str) -> list[tuple[int, dict[str, str]]]:
    """(arrival ms, fields) of every entry, read in pages."""
    entries: list[tuple[int, dict[str, str]]] = []
    start = "-"
    while True:
        page = client.xrange(key, start, "+", count=5000)
        if not page:
            return entries
        for entry_id, fields in page:
            entries.append((int(entry_id.split(b"-")[0]), {k.decode(): v.decode() for k, v in fields.items()}))
        start = "(" + page[-1][0].decode()


def log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


def count_in_log(path: str, needle: str) -> int:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return sum(1 for line in handle if needle in line)
    except OSError:
        return 0


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (as Ctrl-C: the run stops its workers), then SIGTERM and SIGKILL to its own process group."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(60)
        return
    except subprocess.TimeoutExpired:
        pass
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_one(url: str, directory: str, run: Measured, tag: str) -> None:
    path = os.path.join(directory, f"{run.manifest['metadata']['name']}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(run.manifest, handle)
    topology = load_manifest(path)
    source = topology.vertices[topology.sources[0]].config
    profile = RateProfile(source)
    key = sink_key(topology)
    prefix = topology.redis_prefix
    log_path = os.path.join(directory, f"{run.manifest['metadata']['name']}.log")
    cap = run.length_s + DRAIN_S + STARTUP_S
    command = [sys.executable, "-m", "elastream", "run", path, "--redis", url, "--engine", "python"]
    command += ["--interval", f"{INTERVAL_S:g}", "--duration", f"{cap:g}"]
    client = redis.Redis.from_url(url)
    registry = Registry(client, prefix)
    launched = time.time()
    with open(log_path, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    est_t0: float | None = None
    last_len, grown_at, printed = -1, time.time(), 0.0
    seen_scalings: set[str] = set()
    previous: Sample | None = None
    try:
        while True:
            time.sleep(POLL_S)
            now = time.time()
            if process.poll() is not None:
                run.stopped_by = f"the run exited by itself (code {process.returncode})"
                break
            try:
                got = registry.schedule()
                length = int(client.xlen(key))
                raw = client.get(f"{prefix}last-scaling")
            except redis.RedisError as exc:
                log(f"    Redis: {exc}")
                continue
            if got is not None:
                version, schedule = got
                sample = Sample(now, version, dict(schedule.parallelism()), len(schedule.nodes), length)
                if previous is not None and (
                    sample.parallelism != previous.parallelism or sample.nodes != previous.nodes
                ):
                    moved = ", ".join(
                        f"{v} {previous.parallelism.get(v, 0)}->{k}"
                        for v, k in sample.parallelism.items()
                        if previous.parallelism.get(v, 0) != k
                    )
                    at = now - (est_t0 or launched)
                    log(
                        f"    {at:5.0f} s  rescale: executors {previous.executors} -> {sample.executors} "
                        f"({moved or 'same'}), nodes {previous.nodes} -> {sample.nodes}"
                    )
                run.samples.append(sample)
                previous = sample
            if raw:
                status = json.loads(raw)
                marker = f"{status.get('startedAt')}"
                if marker not in seen_scalings:
                    seen_scalings.add(marker)
                    run.scalings.append(status)
            if length != last_len:
                last_len, grown_at = length, now
            if est_t0 is None and length > 0:
                head = [
                    (int(i.split(b"-")[0]), {k.decode(): v.decode() for k, v in f.items()})
                    for i, f in client.xrange(key, "-", "+", count=200)
                ]
                est_t0 = estimate_t0(head, profile, source)
            if now - printed >= PROGRESS_S:
                printed = now
                clock = f"{now - est_t0:5.0f} s of {run.length_s:.0f}" if est_t0 else f"{now - launched:5.0f} s (start)"
                execs = f"{previous.executors} executors on {previous.nodes} node(s)" if previous else "no schedule"
                log(f"    {tag} {run.label}: {clock}, {execs}, sink {length:,} of {run.limit:,}")
            if est_t0 is None:
                if now - launched > STARTUP_S:
                    run.error = f"no event at the sink within {STARTUP_S:g} s of the start"
                    run.stopped_by = run.error
                    break
                continue
            end = est_t0 + run.length_s
            if length >= run.limit and now - grown_at >= IDLE_S:
                run.stopped_by = "drained: every event at the sink, the sink idle"
                break
            if now > end and now - grown_at >= IDLE_S:
                run.stopped_by = f"the sink idle for {IDLE_S:g} s after the stream's end"
                break
            if now > end + DRAIN_S:
                run.stopped_by = f"the bounded wait: {DRAIN_S:g} s after the stream's end"
                break
    finally:
        run.stop_wall = time.time()
        stop_process(process)
    run.returncode = process.returncode
    run.decisions = count_in_log(log_path, "AutoscalerDecided:")
    run.log_tail = log_tail(log_path)
    entries = read_stream(client, key)
    client.close()
    measure(run, entries, profile, source)


def estimate_t0(
    entries: Sequence[tuple[int, dict[str, str]]], profile: RateProfile, source: Mapping[str, Any]
) -> float | None:
    """The profile clock's start: `ts` of the smallest-seq event minus that event's due time."""
    if not entries:
        return None
    offset = int(source.get("idOffset", 0))
    first = min(entries, key=lambda e: int(e[1]["id"]))
    seq = int(first[1]["id"]) - offset
    return float(first[1]["ts"]) - due_time(profile, seq + 1)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def measure(run: Measured, entries: list[tuple[int, dict[str, str]]], profile: RateProfile, source: Mapping) -> None:
    offset = int(source.get("idOffset", 0))
    stride = int(run.manifest["spec"]["vertices"][0].get("maxParallelism", 1))
    run.delivered = len(entries)
    counts = Counter(int(fields["id"]) for _, fields in entries)
    run.distinct = len(counts)
    run.duplicated = sum(1 for n in counts.values() if n > 1)
    run.extra_copies = sum(n - 1 for n in counts.values() if n > 1)
    expected = range(offset, offset + run.limit)
    missing = [i for i in expected if i not in counts]
    run.missing = len(missing)
    # drained: the sink had every event, or went idle after the stream's end (the source was exhausted)
    run.drained = run.missing == 0 or run.stopped_by.startswith(("drained", "the sink idle"))
    # below the highest delivered id of its lane: emitted (a lane's ids leave in order) yet not delivered
    top: dict[int, int] = {}
    for i in counts:
        seq = i - offset
        if 0 <= seq < run.limit:
            top[seq % stride] = max(top.get(seq % stride, -1), seq)
    run.gaps = sum(1 for i in missing if (i - offset) < top.get((i - offset) % stride, -1))
    if run.drained:
        run.lost = run.missing
    else:
        run.undelivered = run.missing
    first: dict[int, tuple[int, float]] = {}
    for ms, fields in entries:
        i = int(fields["id"])
        if i not in first or ms < first[i][0]:
            first[i] = (ms, float(fields["ts"]))
    if not first:
        return
    due_at = {seq: due_time(profile, seq + 1) for seq in range(run.limit)}
    # t0: no event leaves before it is due, so ts - due(seq) ≥ t0 for every event; the smallest-seq event's
    # value is the brief estimate, the smallest over the events due in the first EARLY_S the tighter one
    # (the very first event can leave some 50-100 ms late while the workers connect)
    smallest = min(first)
    run.t0_first_event = first[smallest][1] - due_at[smallest - offset]
    early = [
        ts - due_at[i - offset]
        for i, (_, ts) in first.items()
        if 0 <= i - offset < run.limit and due_at[i - offset] <= EARLY_S
    ]
    run.t0 = min([run.t0_first_event, *early])
    t0 = run.t0
    latencies: list[tuple[float, bool]] = []
    #: when each late event was due, on the profile's clock
    late_due: list[float] = []
    lags: list[float] = []
    from_emission: list[float] = []
    horizon = math.ceil(run.length_s) + int(DRAIN_S) + 120
    per_s = [0] * horizon
    lag_per_s = [0.0] * math.ceil(run.length_s)
    latency_per_s = [0.0] * math.ceil(run.length_s)
    for i, (ms, ts) in first.items():
        seq = i - offset
        if not 0 <= seq < run.limit:
            continue
        due = t0 + due_at[seq]
        latency, lag = ms / 1000.0 - due, ts - due
        latencies.append((latency, False))
        if latency > LATE_S:
            late_due.append(due_at[seq])
        lags.append(lag)
        from_emission.append(ms / 1000.0 - ts)
        k = int(ms / 1000.0 - t0)
        if 0 <= k < horizon:
            per_s[k] += 1
        d = min(len(lag_per_s) - 1, int(due_at[seq]))
        lag_per_s[d] = max(lag_per_s[d], lag)
        latency_per_s[d] = max(latency_per_s[d], latency)
    for i in missing:
        seq = i - offset
        latency = run.stop_wall - (t0 + due_at[seq])
        latencies.append((latency, True))
        if latency > LATE_S:
            late_due.append(due_at[seq])
        d = min(len(latency_per_s) - 1, int(due_at[seq]))
        latency_per_s[d] = max(latency_per_s[d], latency)
    run.delivered_per_s = per_s
    run.source_lag_per_s = lag_per_s
    run.latency_max_per_s = latency_per_s
    run.t0_slack_s = min(lags)
    run.late_fraction = sum(1 for lat, _ in latencies if lat > LATE_S) / len(latencies)
    ordered = sorted(latencies)
    index = max(0, math.ceil(0.99 * len(ordered)) - 1)
    run.p99_s = ordered[index][0]
    run.p99_lower_bound = any(bound for _, bound in ordered[: index + 1])
    run.p99_from_emission_s = percentile(from_emission, 0.99)
    run.source_lag_p99_s = percentile(lags, 0.99)
    run.source_lag_max_s = max(lags)
    integrate(run)
    if run.rescales:
        first_change = run.rescales[0]["at_s"]
        run.late_before_first_change = sum(1 for d in late_due if d < first_change) / len(latencies)


def integrate(run: Measured) -> None:
    """Executor- and node-seconds over [t0, t0 + length] from the once-a-second schedule samples (each held
    until the next), and the rescales (schedule changes) within and after that span."""
    assert run.t0 is not None
    start, end = run.t0, run.t0 + run.length_s
    samples = run.samples
    if not samples:
        return
    executor_s = node_s = 0.0
    for k, s in enumerate(samples):
        a = start if k == 0 else max(start, s.wall)
        b = samples[k + 1].wall if k + 1 < len(samples) else max(end, s.wall)
        a, b = max(a, start), min(b, end)
        if b > a:
            executor_s += s.executors * (b - a)
            node_s += s.nodes * (b - a)
    run.executor_seconds, run.node_seconds = executor_s, node_s
    for a, b in itertools.pairwise(samples):
        if a.parallelism == b.parallelism and a.nodes == b.nodes:
            continue
        change = {
            "at_s": b.wall - run.t0,
            "direction": "out" if b.executors > a.executors else "in" if b.executors < a.executors else "move",
            "from": a.parallelism,
            "to": b.parallelism,
            "nodes": [a.nodes, b.nodes],
        }
        if b.wall <= end:
            run.rescales.append(change)
        else:
            run.rescales_after_stream += 1


# ---- the simulator's prediction ----------------------------------------------------------------------------


def predict(topology: Topology, policy: scenario.Policy) -> scenario.SimResult:
    """`sim.autoscaling` on the manifest the run used: its window, stabilization and stream; the controller's
    evaluation period (two intervals) and recovery timeout (the simulator's defaults)."""
    return sim.run(topology, policy, scenario.SimSettings(interval_s=INTERVAL_S), start="min")


def predicted_dict(result: scenario.SimResult) -> dict[str, Any]:
    return {
        "executor_seconds": result.executor_seconds,
        "node_seconds": result.node_seconds,
        "late_fraction": result.late_fraction,
        "p99_s": result.latency_percentile(0.99),
        "throughput_kept": result.throughput_kept,
        "rescales": [
            {
                "at_s": c.applied_at,
                "decided_s": c.decided_at,
                "direction": c.direction,
                "from": dict(c.from_parallelism),
                "to": dict(c.to_parallelism),
                "nodes": [c.from_nodes, c.to_nodes],
            }
            for c in result.changes
        ],
        "timeline": [[i.end, i.executors, i.nodes] for i in result.intervals],
    }


# ---- the whole benchmark -----------------------------------------------------------------------------------


@dataclass
class Stream:
    profile: str
    step_s: float
    runs: dict[str, Measured] = field(default_factory=dict)
    predicted: dict[str, scenario.SimResult] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return short(self.profile)

    @property
    def png(self) -> str:
        return f"autoscale-processes-{self.short}.png"


def stream_length(profile: str, step_s: float) -> float:
    return RateProfile({"profile": profile, "rate": 1.0, "stepSeconds": step_s, "fluctuation": 0.0}).period


def run_all(url: str, directory: str, profiles: Sequence[str], policies: Sequence[scenario.Policy], step_s: float):
    streams: list[Stream] = []
    total = len(profiles) * len(policies)
    done = 0
    stamp = time.strftime("%H%M%S")
    for profile in profiles:
        stream = Stream(profile, step_s)
        length = stream_length(profile, step_s)
        for policy in policies:
            done += 1
            name = f"aps-{short(profile)}-{policy}-{stamp}"
            doc = build_doc(profile, policy, step_s, name)
            limit = int(vertex_block(doc["spec"], "source")["limit"])
            run = Measured(policy, profile, policy, doc, limit, length)
            tag = f"[{done}/{total}]"
            log(f"{tag} {profile} × {policy}: {length:.0f} s stream, {limit:,} events (manifest {name})")
            began = time.monotonic()
            try:
                run_one(url, directory, run, tag)
            except Exception as exc:  # one broken run must not lose the others: it is reported
                run.error = f"{type(exc).__name__}: {exc}"
            stream.runs[policy] = run
            stream.predicted[policy] = predict(parse_manifest(doc), policy)
            p = stream.predicted[policy]
            log(
                f"    {run.stopped_by or run.error}; {time.monotonic() - began:.0f} s wall. measured: executor-s "
                f"{num(run.executor_seconds)}, late {pct(run.late_fraction)}, p99 {p99_cell(run)}, rescales "
                f"{len(run.rescales)}, lost {num(run.lost)}, undelivered {run.undelivered:,}, duplicated "
                f"{run.duplicated}; predicted: executor-s {p.executor_seconds:,.0f}, late {pct(p.late_fraction)}, "
                f"p99 {secs(p.latency_percentile(0.99))}, rescales {len(p.changes)}"
            )
            if run.error:
                log(f"    error: {run.error}\n{run.log_tail}")
        streams.append(stream)
    return streams


# ---- report ------------------------------------------------------------------------------------------------


def pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100.0 * x:.{digits}f} %"


def num(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def secs(x: float | None) -> str:
    if x is None:
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f} s"
    if abs(x) >= 1:
        return f"{x:.1f} s"
    return f"{x * 1000:.0f} ms"


def p99_cell(run: Measured) -> str:
    return ("≥ " if run.p99_lower_bound else "") + secs(run.p99_s)


def rescale_cell(changes: Sequence[Any]) -> str:
    def direction(c: Any) -> str:
        return c["direction"] if isinstance(c, dict) else c.direction

    outs = sum(1 for c in changes if direction(c) == "out")
    ins = sum(1 for c in changes if direction(c) == "in")
    return f"{len(changes)} ({outs} out, {ins} in)" if changes else "0"


def saved(stream: Stream, policy: str) -> float | None:
    expert = stream.runs.get("static-expert")
    run = stream.runs.get(policy)
    if expert is None or run is None or not expert.executor_seconds or run.executor_seconds is None:
        return None
    return 1.0 - run.executor_seconds / expert.executor_seconds


def predicted_saved(stream: Stream, policy: str) -> float | None:
    if "static-expert" not in stream.predicted or policy not in stream.predicted:
        return None
    return 1.0 - stream.predicted[policy].executor_seconds / stream.predicted["static-expert"].executor_seconds


def stream_table(stream: Stream) -> list[str]:
    lines = [
        "| policy | executor-s measured | saved vs expert | executor-s predicted | late measured / predicted "
        "| p99 measured / predicted | rescales measured / predicted | lost | duplicated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy in POLICIES:
        run = stream.runs.get(policy)
        if run is None:
            continue
        p = stream.predicted[policy]
        lost = num(run.lost) if run.lost is not None else f"— ({run.undelivered:,} undelivered¹)"
        if run.error and run.t0 is None:
            lost = "run failed"
        lines.append(
            f"| {policy} | {num(run.executor_seconds)} | {pct(saved(stream, policy))} | {p.executor_seconds:,.0f} "
            f"| {pct(run.late_fraction)} / {pct(p.late_fraction)} | {p99_cell(run)} / "
            f"{secs(p.latency_percentile(0.99))} | {rescale_cell(run.rescales)} / {rescale_cell(p.changes)} "
            f"| {lost} | {run.duplicated:,} |"
        )
    return lines


def verdict(stream: Stream) -> str:
    run = stream.runs.get("autoscale")
    s = saved(stream, "autoscale")
    if run is None or s is None or run.late_fraction is None:
        return f"On the {stream.short} stream there is no autoscale and static-expert pair to compare."
    meets = s >= SAVING_MARK and run.late_fraction <= LATE_MARK
    expert = stream.runs["static-expert"]
    ps = predicted_saved(stream, "autoscale")
    misses = []
    if s < SAVING_MARK:
        misses.append(f"it saved less than {pct(SAVING_MARK, 0)}")
    if run.late_fraction > LATE_MARK:
        misses.append(f"more than {pct(LATE_MARK, 0)} of its events were late")
    return (
        f"On the {stream.short} stream autoscale used {pct(abs(s))} {'fewer' if s >= 0 else 'more'} executor-seconds "
        f"than static-expert with {pct(run.late_fraction)} of its events late (static-expert: "
        f"{pct(expert.late_fraction)}): "
        + (
            f"it meets the mark of ≥ {pct(SAVING_MARK, 0)} saved with ≤ {pct(LATE_MARK, 0)} late."
            if meets
            else f"it does not meet the mark of ≥ {pct(SAVING_MARK, 0)} saved with ≤ {pct(LATE_MARK, 0)} late "
            f"({' and '.join(misses)})."
        )
        + f" The simulator predicted {pct(ps)} saved with {pct(stream.predicted['autoscale'].late_fraction)} late."
        + start_share(run)
    )


def start_share(run: Measured) -> str:
    """Where the late events of an adaptive run went: how many were due before its first rescale."""
    if run.late_before_first_change is None or not run.rescales or not run.late_fraction:
        return ""
    before, first = run.late_before_first_change, run.rescales[0]["at_s"]
    return (
        f" Of its late events, {pct(before / run.late_fraction, 0)} ({pct(before)} of all events) were due before "
        f"its first rescale at {first:.0f} s: the start on ConfMin, under-provisioned for the stream's first step "
        "until the first decision, which waits for a complete window that starts after the topology did (two "
        f"settling intervals and {WINDOW} intervals) by design, and then for the backlog to drain; "
        f"{pct(run.late_fraction - before)} of all events were late after it."
    )


def change_line(run: Measured, result: scenario.SimResult) -> str:
    def fmt(at: float, direction: str, a: Mapping[str, int], b: Mapping[str, int], nodes: Sequence[int]) -> str:
        moved = ", ".join(f"{v} {a.get(v, 0)}→{k}" for v, k in b.items() if a.get(v, 0) != k) or "nodes only"
        extra = f"; nodes {nodes[0]}→{nodes[1]}" if nodes[0] != nodes[1] else ""
        return f"{at:.0f} s {direction}: {moved}{extra}"

    measured = "; ".join(fmt(c["at_s"], c["direction"], c["from"], c["to"], c["nodes"]) for c in run.rescales)
    predicted = "; ".join(
        fmt(c.applied_at, c.direction, c.from_parallelism, c.to_parallelism, (c.from_nodes, c.to_nodes))
        for c in result.changes
    )
    after = f" (and {run.rescales_after_stream} after the stream's end)" if run.rescales_after_stream else ""
    return f"- {run.policy}: measured {measured or 'none'}{after}; predicted {predicted or 'none'}."


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
        model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    return {
        "cpu": model or platform.processor() or sys.platform,
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def settings_dict(step_s: float, policies: Sequence[str], profiles: Sequence[str]) -> dict[str, Any]:
    return {
        "topology": "linear (bench/autoscale.py)",
        "profiles": list(profiles),
        "policies": list(policies),
        "step_seconds": step_s,
        "paper_step_seconds_in_bench_autoscale": paper.STEP_SECONDS,
        "window_intervals": WINDOW,
        "interval_s": INTERVAL_S,
        "evaluation_period_s": scenario.SimSettings().period_s,
        "stabilization_s": STABILIZATION_S,
        "fluctuation": FLUCTUATION,
        "late_bound_s": LATE_S,
        "drain_wait_s": DRAIN_S,
        "idle_s": IDLE_S,
        "engine": "python",
        "sink": "redis-stream, at-least-once",
    }


def run_dict(run: Measured, result: scenario.SimResult) -> dict[str, Any]:
    t0 = run.t0 or 0.0
    data = {
        k: v
        for k, v in run.__dict__.items()
        if k not in ("samples", "manifest", "delivered_per_s", "log_tail", "stop_wall", "t0", "t0_first_event")
    }
    data.update(
        manifest=run.manifest,
        stopped_after_s=run.stop_wall - t0 if run.t0 else None,
        t0_first_event_minus_t0_s=run.t0_first_event - t0 if run.t0 and run.t0_first_event else None,
        timeline=[[s.wall - t0, s.executors, s.nodes, s.sink] for s in run.samples],
        delivered_per_s=run.delivered_per_s,
        predicted=predicted_dict(result),
    )
    if run.error:
        data["log_tail"] = run.log_tail
    return data


def write_json(path: str, streams: Sequence[Stream], meta: dict[str, Any]) -> None:
    data = {
        **meta,
        "streams": {
            s.profile: {
                "length_s": stream_length(s.profile, s.step_s),
                "events": next(iter(s.runs.values())).limit if s.runs else None,
                "runs": {p: run_dict(r, s.predicted[p]) for p, r in s.runs.items()},
            }
            for s in streams
        },
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, default=str)
        handle.write("\n")


def write_md(path: str, streams: Sequence[Stream], meta: dict[str, Any]) -> None:
    st = meta["settings"]
    m = meta["machine"]
    lines = [
        "## On worker processes",
        "",
        "The same linear topology and streams on real worker processes instead of the simulator: each run is "
        "`elastream run` (the Python analysis engine, 1 s metric interval) with its worker nodes as local "
        "processes and an embedded Redis; the sink writes every event to a Redis stream "
        "(`redis-stream`, at-least-once, 80 ms per event as above) and the source is finite, so every event can "
        "be counted and timed. Beside each run, `sim.autoscaling`'s prediction for the same manifest.",
        "",
        "Reproduce: `make bench-autoscale` (`.venv/bin/python bench/autoscale_processes.py`, about 25 min). "
        f"This run: `{meta['command']}` on {meta['date']}, {meta['took_min']:.1f} min wall, on {m['cpu']} "
        f"({m['cores']} cores, shared with other work), {m['system']}, Python {m['python']}.",
        "",
        "Settings, shortened from the simulator runs above so that eight runs fit a shared 2-core machine and a "
        "CI-time budget (the paper's steps last minutes):",
        "",
        "| setting | here | simulator runs above |",
        "|---|---|---|",
        f"| stream step | {st['step_seconds']:g} s | {paper.STEP_SECONDS:g} s |",
        f"| window | {st['window_intervals']} intervals of {st['interval_s']:g} s | {paper.WINDOW} intervals of 1 s |",
        f"| stabilizationSeconds | {st['stabilization_s']:g} s | {paper.STABILIZATION_S:g} s |",
        f"| fluctuation | {pct(st['fluctuation'], 0)} | {pct(paper.FLUCTUATION, 0)} |",
        f"| evaluation period | {st['evaluation_period_s']:g} s | the same |",
        "",
        f"Window and stabilization shrink with the step (a step spans "
        f"{st['step_seconds'] / (st['window_intervals'] * st['interval_s']):g} windows). Executor-seconds "
        "integrate the running schedule, read once a second, over the stream's length; a rescale is a change of "
        "that schedule. Latency is measured from when an event was *due* by the rate profile (the profile clock's "
        "start estimated from the emission stamps of the events due in the first seconds), not from its "
        "emission: a back-pressured source "
        "holds events back, and ConfMin's lateness is exactly that. Late = over "
        f"{st['late_bound_s']:g} s. Lost = expected ids missing at the sink, duplicated = ids there more than "
        f"once. A run stops once its sink has every event and is idle, at the latest {DRAIN_S:g} s after the "
        "stream's end.",
        "",
    ]
    undrained = False
    for stream in streams:
        if not stream.runs:
            continue
        limit = next(iter(stream.runs.values())).limit
        length = stream_length(stream.profile, stream.step_s)
        lines += [f"### {stream.short} stream ({length:.0f} s, {limit:,} events)", "", *stream_table(stream), ""]
        lines += [verdict(stream), ""]
        lags = ", ".join(f"{p} {secs(r.source_lag_p99_s)}" for p, r in stream.runs.items())
        emission = ", ".join(f"{p} {secs(r.p99_from_emission_s)}" for p, r in stream.runs.items())
        lines += [
            f"Events held back at the source (emission − due), p99: {lags}. "
            f"For comparison, p99 latency from emission instead of from due: {emission}.",
            "",
        ]
        for policy in ("autoscale", "rules"):
            if policy in stream.runs:
                lines.append(change_line(stream.runs[policy], stream.predicted[policy]))
        failed = [f"{p}: {r.error}" for p, r in stream.runs.items() if r.error]
        if failed:
            lines += ["", "Failed runs: " + "; ".join(failed) + "."]
        lines += ["", f"![{stream.short} stream on worker processes]({stream.png})", ""]
        undrained = undrained or any(r.lost is None and r.t0 is not None for r in stream.runs.values())
    if undrained:
        lines += [
            f"¹ The run was stopped {DRAIN_S:g} s after the stream's end with events never delivered: not yet "
            "emitted by the held-back source or still queued (the bounded wait), so they are not counted as "
            "lost; they count as late, with the stop time as a lower bound of their latency (p99 marked ≥).",
            "",
        ]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines).rstrip() + "\n")


# ---- plots -------------------------------------------------------------------------------------------------


def plot(path: str, stream: Stream) -> None:
    policies = [p for p in POLICIES if p in stream.runs]
    fig, axes = plt.subplots(len(policies), 1, figsize=(10, 2.6 * len(policies) + 0.6), sharex=True, squeeze=False)
    length = stream_length(stream.profile, stream.step_s)
    source = vertex_block(stream.runs[policies[0]].manifest["spec"], "source")
    profile = RateProfile(source)
    seconds = list(range(math.ceil(length)))
    offered = [profile.due(k + 1) - profile.due(k) for k in seconds]
    stops = [r.stop_wall - r.t0 for r in stream.runs.values() if r.t0 is not None]
    x_end = max([length, *stops]) + 2.0
    top_rate = max([*offered, *(max(r.delivered_per_s, default=0) for r in stream.runs.values())]) * 1.5
    top_exec = max([*(s.executors for r in stream.runs.values() for s in r.samples), 10]) * 1.5
    for ax, policy in zip(axes[:, 0], policies, strict=True):
        run = stream.runs[policy]
        result = stream.predicted[policy]
        color = COLORS.get(policy, "tab:blue")
        rate_ax = ax.twinx()
        rate_ax.plot([k + 1 for k in seconds], offered, color="black", lw=0.8, alpha=0.6, label="offered")
        if run.delivered_per_s and run.t0 is not None:
            shown = min(len(run.delivered_per_s), math.ceil(run.stop_wall - run.t0))
            rate_ax.plot(
                [k + 1 for k in range(shown)],
                run.delivered_per_s[:shown],
                color="tab:green",
                lw=0.7,
                alpha=0.6,
                label="delivered (measured)",
            )
        rate_ax.set_ylabel("events/s")
        rate_ax.set_ylim(0, top_rate)
        if run.t0 is not None and run.samples:
            times = [s.wall - run.t0 for s in run.samples]
            ax.step(times, [s.executors for s in run.samples], where="post", color=color, lw=1.8, label="measured")
        ax.step(
            [0.0] + [i.end for i in result.intervals],
            [result.intervals[0].executors] + [i.executors for i in result.intervals],
            where="pre",
            color="black" if policy == "static-expert" else color,
            lw=1.1,
            ls="--",
            label="predicted",
        )
        ax.set_ylabel("executors")
        ax.set_ylim(0, top_exec)
        ax.set_title(policy if not run.error else f"{policy} (failed: {run.error[:60]})", fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()
        more = rate_ax.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, ncol=4, loc="upper right")
    axes[-1, 0].set_xlabel("seconds on the stream's clock (t0: the rate profile's start)")
    axes[-1, 0].set_xlim(0, x_end)
    fig.suptitle(
        f"linear topology, {stream.profile} stream ({stream.step_s:g} s steps) on worker processes: "
        "executors measured (solid) vs the simulator (dashed)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- entry point -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help=f"where the report, JSON and plots go (default {OUT})")
    parser.add_argument(
        "--quick", action="store_true", help="smoke check: 8 s steps, the 5-step stream, static-expert and autoscale"
    )
    args = parser.parse_args(argv)
    out = args.out or (QUICK_OUT if args.quick else OUT)
    os.makedirs(out, exist_ok=True)
    step_s = QUICK_STEP_SECONDS if args.quick else STEP_SECONDS
    profiles = ("autoscale-5-step",) if args.quick else PROFILES
    policies = QUICK_POLICIES if args.quick else POLICIES
    expect = sum(stream_length(p, step_s) + 35.0 for p in profiles) * len(policies)
    log(
        f"{len(profiles) * len(policies)} runs on worker processes, {step_s:g} s steps, about {expect / 60:.0f} min; "
        f"writing to {out}"
    )
    directory = tempfile.mkdtemp(prefix="elastream-autoscale-processes-")
    embedded = EmbeddedRedis(directory)
    started = time.monotonic()
    try:
        streams = run_all(embedded.url, directory, profiles, policies, step_s)
    finally:
        embedded.stop()
        shutil.rmtree(directory, ignore_errors=True)
    took = time.monotonic() - started
    used = sys.argv[1:] if argv is None else argv
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "command": " ".join([".venv/bin/python", "bench/autoscale_processes.py", *used]),
        "took_min": took / 60.0,
        "quick": bool(args.quick),
        "settings": settings_dict(step_s, policies, profiles),
    }
    write_json(os.path.join(out, "autoscale-processes.json"), streams, meta)
    write_md(os.path.join(out, "autoscale-processes.md"), streams, meta)
    for stream in streams:
        if stream.runs:
            plot(os.path.join(out, stream.png), stream)
    log(f"wrote {os.path.join(out, 'autoscale-processes.md')}, its JSON and {len(streams)} plot(s) in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
