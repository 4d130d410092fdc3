"""Migration benchmark: CCR vs DCR vs restart on the CCR paper's five DAGs, scale-out and scale-in.

1. For every DAG, direction and protocol: the topology runs on real worker processes with finite sources,
   migrates mid-stream to the plan Stela makes, and runs to the end. Reported: the paper's phase durations
   (capture/drain, commit, rebalance, restore), captured events, and — from the sinks, against the exact
   multiset a correct run delivers — events lost and events duplicated (replayed). Every run takes a
   periodic checkpoint every CHECKPOINT_S seconds (aligned barriers), as a production job would, before the
   migration and after it; `restart` is the Storm/Flink default: every worker stops, the new schedule starts
   from the last checkpoint and the sources replay what they emitted after it. `ccr-partial` (CCR that
   pauses only the executors that move, `MigrationDriver(..., scope="moving")`) runs beside them when the
   driver has its `scope` field.
2. What users feel (issue 24): end-to-end latency (p50, p99, max) and sink throughput in 100 ms buckets from
   5 s before the rescale request to 10 s after it, against the 5 s before as the steady reference, and the
   issue's targets (p99 during a rescale ≤ 2x steady, worst 100 ms bucket ≥ 90 % of steady). Read after the
   run from the sinks' Redis streams: an entry's latency is its entry ID's time (Redis's clock when it was
   written) less the time the event was due at the source (so a paused source's late emissions count their
   wait; `bench/latency.py`); throughput is entries per bucket. Only
   the DAG's own sinks count: the `audit-*` sinks `with_audit` adds after stateful vertices are a test's
   instrument (their counts prove the state moved), not output a user reads, and they would weigh the
   stateful half of a DAG twice. The maths (buckets, nearest-rank percentiles, ratios) is `bench/latency.py`.
   One figure per DAG (`migration-latency-<dag>.png`): p99 and throughput per bucket, protocols overlaid,
   scale-out and scale-in as two rows. Runs are WARMUP_S + 5 s of sources before the request and 10 s +
   TAIL_S after it.
3. Restore time as the in-flight volume grows: a source flooding a vertex that sleeps, so its input channels
   fill; the volume captured is whatever the channels held (reported as measured).
4. A timeline of input (source) and output (sink) rate around a migration, like the paper's Fig. 7.

Writes migration.md, migration.png and migration-latency-<dag>.png to `--out` (default docs/benchmarks/).
Each run takes about 25 s (18.5 s of sources, then start, drain and stop), so an estimated 13 min for the
three protocols on a quiet 2-core machine and 17 min with `ccr-partial`; the report's header says how long it
took. `--quick`: two DAGs, the same run length (7.5-8.5 min on a busy machine).

`--cluster`: the checkpoint and migration figures on one Redis and on a 3-primary Redis Cluster side by side
in one run (both redis-server processes on loopback TCP, persistence off; the cluster started with
`redis-cli --cluster create`, `--cluster-replicas` replicas per primary), alternating between the two so
both see the same machine load: the checkpoint store alone (save and load of N captured events) in the
layout elastream uses (every key of a topology under its hash tag: one slot) and in the alternative (each
key group's keys in a slot of their own, the checkpoint's pointer flipped in the topology's slot), and CCR
migrations of the DAGs, scale-out and scale-in. Writes docs/benchmarks/migration-cluster.md.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))  # support/
from support.paths import REPO

sys.path.insert(0, os.path.join(REPO, "operator", "src"))

from elastream.control.backends.local import EmbeddedRedis, LocalCluster
from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
from elastream.control.migration import MigrationDriver
from elastream.core.planner import make_plan
from elastream.core.rate_timeline import rate_timeline, recovery_times
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.simulate import SimulationModel, simulate, snapshot_from_simulation
from elastream.core.topology import Topology
from elastream.crd import load_manifest
from elastream.store.metric_stream import MetricStream
from elastream.store.registry import client_for
from host_cpu import HostCpu
from latency import (
    AFTER_S,
    BUCKET_S,
    P99_TARGET,
    STEADY_S,
    THROUGHPUT_TARGET,
    Sample,
    buckets,
    due_clock,
    sample,
    share_met,
    summarize,
)
from support.harness import expected_copies, id_counts, sink_events, sink_key, wait_for_sinks_idle, with_audit

NODES = {"ccr-grid": 4, "ccr-traffic": 3}
#: partial CCR (only the executors that move pause), compared once the driver has its `scope` field
PARTIAL = "scope" in {f.name for f in dataclasses.fields(MigrationDriver)}
#: the protocols compared, by their labels in the report; `ccr-partial` is CCR with `scope="moving"`
PROTOCOLS = ("ccr", "ccr-partial", "ccr-keygroups", "dcr", "restart") if PARTIAL else ("ccr", "dcr", "restart")
#: the labels that are CCR (compared with DCR and restart, held to CCR's targets)
CCR_LIKE = tuple(p for p in PROTOCOLS if p.startswith("ccr"))
#: a run in which nothing is requested at the request's time: the same windows, read for the noise floor of
#: the goals on this machine (`bench/migration_noise.py`)
NO_RESCALE = "none"
#: seconds between periodic checkpoints in every run (Flink's jobs commonly use seconds to minutes)
CHECKPOINT_S = 2.0
#: a run's sources emit for WARMUP_S + STEADY_S before the rescale request and AFTER_S + TAIL_S after it
#: (at their rate: a pause or a restart's replay makes them finish later, never sooner), so the sinks still
#: receive at the end of the 10 s after the request, and the steady window leaves out the start-up and the
#: first periodic checkpoint (CHECKPOINT_S after the start), whose latency spikes stood out in --quick runs
WARMUP_S = 2.5
#: what a run offers: this share of its bottleneck's capacity under the slower of the two schedules. At 0.7
#: the diamond, star and grid runs still queued (steady p50 of 0.3-1.3 s): an emulated cost is a sleep, and
#: sleeps overrun on a shared 2-core machine, so the simulator's capacities are not quite reached
LOAD = 0.5
#: ... and the busiest node uses at most this share of its (emulated) cores under either schedule: the vertex
#: bound alone let ccr-star's scale-in target run a node at 95%, whose latency grew with no rescale at all
NODE_LOAD = 0.75
TAIL_S = 1.0
#: sink stream entries read per XRANGE
PAGE = 10_000


def driver_options(label: str) -> tuple[str, dict[str, Any]]:
    """The `MigrationDriver` protocol and extra fields of a protocol label (`ccr-partial` is CCR that pauses
    only the executors that move)."""
    if label == "ccr-partial":
        return "ccr", {"scope": "moving"}
    if label == "ccr-keygroups":
        return "ccr", {"scope": "keyGroups"}
    return label, {}


def log(message: str) -> None:
    print(message, flush=True)


def write(directory: str, doc: dict[str, Any]) -> str:
    path = os.path.join(directory, f"{doc['metadata']['name']}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    return path


def one_run(
    directory: str,
    url: str,
    name: str,
    direction: str,
    protocol: str,
    before_s: float,
    after_s: float,
    round_number: int = 0,
) -> dict[str, Any]:
    """One migration of `name` (scale-`direction`, `protocol` a label of PROTOCOLS, or `NO_RESCALE`: the old
    schedule runs on through the request's time, for the noise floor of the same windows): the sources emit for
    `before_s` before the request and `after_s` after it at their rate, and run to the end. Each run has a
    topology name of its own (`round_number` too): a repeated one would read the sinks an earlier run wrote."""
    with open(os.path.join(REPO, "examples", f"{name}.yaml"), encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    doc["metadata"]["name"] = f"{name}-{direction}-{protocol}" + (f"-{round_number}" if round_number else "")
    doc["spec"]["nodes"] = NODES.get(name, 2) + (1 if direction == "in" else 0)
    # the plan is Stela's for the example as written (congested); the run offers what both schedules sustain
    doc = with_audit(doc, 1)
    planned = load_manifest(write(directory, doc))
    old = initial_schedule(planned)
    target = len(old.nodes) + (1 if direction == "out" else -1)
    new = make_plan(planned, old, snapshot_from_simulation(planned, old, simulate(planned, old)), target, "stela")
    share = sustainable_share(planned, [old, new.new_schedule])
    sources = [v["source"] for v in doc["spec"]["vertices"] if "source" in v]
    rate = min(round(source["rate"] * share, 1) for source in sources)
    events = int(rate * (before_s + after_s))
    for source in sources:
        source.update(rate=round(source["rate"] * share, 1), limit=events)
    path = write(directory, doc)
    topology = load_manifest(path)
    with LocalCluster(topology, path, url, interval_s=0.5) as cluster, HostCpu() as cpu:
        cluster.start(old)
        new = new.new_schedule
        checkpoints = CheckpointDriver(topology, cluster, cluster.client)
        checkpointer = Checkpointer(checkpoints, CHECKPOINT_S).start()
        time.sleep(before_s)
        checkpointer.stop()
        migration_at = time.time()  # the rescale request: latencies and throughputs are relative to it
        if protocol == NO_RESCALE:
            report: dict[str, Any] = {"outcome": NO_RESCALE}
        else:
            kind, options = driver_options(protocol)
            driver = MigrationDriver(topology, cluster, cluster.client, kind, **options)
            report = driver.migrate(new).to_status()
        returned_at = time.time()  # the pause is over: catch-up and stabilization are searched from here
        # periodic checkpoints go on after the migration as before it, so the 10 s after the request see the
        # same barriers as the steady window they are compared with
        checkpointer = Checkpointer(checkpoints, CHECKPOINT_S).start()
        wait_for_sinks_idle(cluster, topology, quiet_s=2.0, timeout_s=2 * (before_s + after_s) + 10.0)
        checkpointer.stop()
        lost = duplicated = 0
        for sink, expected in expected_copies(topology, range(events)).items():
            got = id_counts(sink_events(cluster.client, topology, sink))
            lost += sum((expected - got).values())
            duplicated += sum((got - expected).values())
        timeline = rates_around(cluster, topology, migration_at)
        samples = sink_samples(cluster, topology, rate)
    phases = report.get("phases", {})
    row = {
        "dag": name,
        "direction": direction,
        "protocol": protocol,
        "captureMs": phases.get("captureMs"),
        "commitMs": phases.get("commitMs"),
        "rebalanceMs": phases.get("rebalanceMs"),
        "restoreMs": phases.get("restoreMs"),
        "pauseMs": report.get("pauseMs"),
        "prepareMs": report.get("prepareMs"),
        "paused": f"{report.get('pausedExecutors')} of {report.get('executors')}",
        "batches": report.get("batches"),
        "longestHoldMs": report.get("longestHoldMs"),
        "outcome": report.get("outcome"),
        "captured": report.get("capturedEvents", 0) or 0,
        "replayed": report.get("replayed", 0) or 0,
        "lost": lost,
        "duplicated": duplicated,
        "timeline": timeline,
        "resumedS": returned_at - migration_at,
        "latency": summarize(samples, migration_at),
        "buckets": buckets(samples, migration_at),
        # the last sink entry, relative to the request: before AFTER_S, the sinks ran dry inside the window
        "lastEntryS": max((t for t, _ in samples), default=migration_at) - migration_at,
        # the host's busy share of all cores in the steady window and in the window after the request (does
        # the new schedule cost the machine more?), and the share a hypervisor stole in each
        "cpuBefore": cpu.busy_between(migration_at - STEADY_S, migration_at),
        "cpuAfter": cpu.busy_between(migration_at, migration_at + AFTER_S),
        "stealBefore": cpu.steal_between(migration_at - STEADY_S, migration_at),
        "stealAfter": cpu.steal_between(migration_at, migration_at + AFTER_S),
    }
    total = sum(row[k] or 0 for k in ("captureMs", "commitMs", "rebalanceMs", "restoreMs"))
    felt = row["latency"]
    log(
        f"  {name:<12} {direction:<3} {protocol:<11} {row['outcome']}: total {total:7.0f} ms, pause "
        f"{row['pauseMs'] or 0:6.0f} ms, restore {row['restoreMs'] or 0:6.0f} ms, "
        f"captured {row['captured']:6d}, lost {lost:5d}, duplicated {duplicated:5d}; "
        f"p99 {ms(felt.steady_p99_s)} -> {ms(felt.during_p99_s)} ms, max {ms(felt.max_s)} ms, "
        f"worst 100 ms {fmt2(felt.throughput_ratio)} of {fmt(felt.steady_throughput)} events/s; host CPU "
        f"{fmt2(row['cpuBefore'])} -> {fmt2(row['cpuAfter'])} (steal {fmt2(row['stealBefore'])} -> "
        f"{fmt2(row['stealAfter'])})"
    )
    if row["lastEntryS"] < AFTER_S:
        log(f"  warning: the sinks' last entry came {row['lastEntryS']:.1f} s after the request, inside the window")
    return row


def sustainable_share(topology: Topology, schedules: list[Schedule]) -> float:
    """The share of the example's source rates at which, under every one of `schedules` (the simulator's
    capacities), the busiest vertex runs at `LOAD` of what its executors can do and the busiest node uses at
    most `NODE_LOAD` of its cores, at most 1. The CCR examples are congested on purpose (the paper's experiments
    relieve a bottleneck); a congested run has no steady state, its latency growing with the queues, and
    would measure a catch-up, not a rescale."""
    share = 1.0
    for schedule in schedules:
        result = simulate(topology, schedule)
        busiest = max(
            (flow.input_rate / capacity for v, flow in result.vertices.items() if (capacity := result.capacity.get(v))),
            default=0.0,
        )
        if busiest > 0:
            share = min(share, LOAD / busiest)
    cores = topology.node_cpu
    if not cores:
        return share
    model = SimulationModel.from_topology(topology)
    for _ in range(20):  # below saturation the nodes' use is linear in the rate: this settles in a round or two
        scaled = dataclasses.replace(
            model,
            vertices={
                v: vm if vm.source_rate is None else dataclasses.replace(vm, source_rate=vm.source_rate * share)
                for v, vm in model.vertices.items()
            },
        )
        use = max(max(simulate(topology, s, scaled).node_cpu_used.values(), default=0.0) / cores for s in schedules)
        if use <= NODE_LOAD * 1.001:
            break
        share *= NODE_LOAD / use
    return share


def real_sinks(topology: Topology) -> list[str]:
    """The sinks a user reads: the audit sinks `with_audit` adds after the stateful vertices are left out."""
    return [s for s in topology.sinks if not s.startswith("audit-")]


def sink_samples(cluster: LocalCluster, topology: Topology, rate: float) -> list[Sample]:
    """Every entry of the real sinks' streams as (arrival, latency from the time it was due at the source:
    `latency.sample`), read in pages. The CCR examples have one synthetic source, at `rate`; no event leaves
    before it is due (`Synthetic` paces every lane from the vertex's clock), so the earliest ``ts - id / rate``
    is the sources' clock start."""
    entries: list[tuple[Any, int, float]] = []
    for sink in real_sinks(topology):
        key, start = sink_key(topology, sink), "-"
        while True:
            page = cluster.client.xrange(key, start, "+", count=PAGE)
            entries += [(entry_id, int(fields[b"id"]), float(fields[b"ts"])) for entry_id, fields in page]
            if len(page) < PAGE:
                break
            last = page[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    if not entries:
        return []
    clock = due_clock(((event_id, ts) for _, event_id, ts in entries), rate)
    return [sample(entry_id, event_id, clock, rate) for entry_id, event_id, _ in entries]


def rates_around(cluster: LocalCluster, topology: Topology, at: float) -> dict[str, list[tuple[float, float]]]:
    """Source (input) and sink (output, the audit sinks left out) rates per 0.5 s, relative to the request."""
    samples = MetricStream(cluster.client, topology.redis_prefix).read_since(None)
    return rate_timeline(samples, topology.sources, real_sinks(topology), at=at, bucket_s=0.5)


def inflight_rows(directory: str, url: str, volumes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for volume in volumes:
        doc = {
            "apiVersion": "elastream.dev/v1alpha1",
            "kind": "StreamTopology",
            "metadata": {"name": f"inflight-{volume}"},
            "spec": {
                "nodes": 2,
                "slotsPerNode": 10,
                "vertices": [
                    {
                        "name": "src",
                        "parallelism": 8,
                        "maxParallelism": 8,
                        "source": {"type": "synthetic", "limit": volume},
                    },
                    {
                        "name": "slow",
                        "parallelism": 8,
                        "maxParallelism": 8,
                        "logic": {"builtin": "work", "costMs": 50},
                    },
                    {"name": "out", "parallelism": 1, "sink": {"type": "null"}},
                ],
                "streams": [{"from": "src", "to": "slow"}, {"from": "slow", "to": "out"}],
            },
        }
        path = write(directory, doc)
        topology = load_manifest(path)
        with LocalCluster(topology, path, url, interval_s=0.5) as cluster:
            cluster.start(initial_schedule(topology))
            time.sleep(1.0)  # the sources emit what the channels take; the slow vertex drains ~160/s
            new = copy.deepcopy(cluster.current_schedule())
            nodes = list(new.nodes)
            moved = {e: nodes[(nodes.index(n) + 1) % len(nodes)] for e, n in new.assignment.items()}
            from elastream.core.schedule import Schedule

            target = Schedule(moved, new.nodes, new.slots_per_node)
            driver = MigrationDriver(topology, cluster, cluster.client, "ccr")
            report = driver.migrate(target)
        row = {
            "volume": volume,
            "captured": report.captured_events,
            "commitMs": report.phases_ms.get("commitMs"),
            "restoreMs": report.phases_ms.get("restoreMs"),
            "rebalanceMs": report.phases_ms.get("rebalanceMs"),
        }
        log(
            f"  offered {volume:>7,}: captured {row['captured']:>7,}, commit {fmt(row['commitMs'])} ms, "
            f"restore {fmt(row['restoreMs'])} ms, {report.outcome}"
        )
        rows.append(row)
    return rows


def store_rows(url: str, volumes: list[int]) -> list[dict[str, Any]]:
    """Checkpoint store alone: one executor persists N captured events (16 key groups, msgpack events like
    the runtime's) and a new one loads them back; median of 5 rounds each."""
    import statistics

    from elastream.store.checkpoint_store import CheckpointStore, ExecutorCheckpoint
    from elastream.store.codec import pack

    client = client_for(url)
    store = CheckpointStore(client, "elastream:{bench/store}:")
    rows = []
    for volume in volumes:
        events = [pack((i, i % 64, i, time.time())) for i in range(volume)]
        pending = {str(g): events[g::16] for g in range(16)}
        state = {g: pack({k: k for k in range(4)}) for g in range(16)}
        saves, loads = [], []
        for attempt in range(5):
            mid = f"bench-{volume}-{attempt}"
            started = time.perf_counter()
            store.save(mid, ExecutorCheckpoint("v#0", "v", state=state, pending=pending))
            saves.append((time.perf_counter() - started) * 1000.0)
            started = time.perf_counter()
            loaded = store.load_pending(mid, "v", range(16), 0, 1)
            loads.append((time.perf_counter() - started) * 1000.0)
            assert len(loaded) == volume
            store.delete_migration(mid)
        rows.append({"volume": volume, "saveMs": statistics.median(saves), "loadMs": statistics.median(loads)})
        log(f"  store {volume:>7,} events: save {rows[-1]['saveMs']:7.1f} ms, load {rows[-1]['loadMs']:7.1f} ms")
    client.close()
    return rows


def secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def fmt2(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def ms(seconds: float | None) -> str:
    """A latency in seconds, in ms."""
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def label(protocol: str) -> str:
    """A protocol label as the report's prose names it."""
    return {"ccr": "CCR", "ccr-partial": "CCR-partial", "ccr-keygroups": "CCR-keygroups", "dcr": "DCR"}.get(
        protocol, protocol
    )


def listing(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def felt_section(runs: list[dict[str, Any]]) -> list[str]:
    """The latency and throughput the real sinks saw around the rescale request, one row per run."""
    lines = [
        "",
        "## What users feel: latency and throughput around the rescale",
        "",
        "Read from the real sinks' streams after each run (the `audit-*` sinks that prove the state moved are",
        "left out: a user reads the DAG's own sink). An entry's latency is the time Redis wrote it (its entry",
        "ID, ms) less the time the event was due at the source, on the same clock; the throughput counts",
        f"entries per {BUCKET_S * 1000:.0f} ms bucket by the time they were written (duplicates included: a user",
        "receives them). Buckets are aligned on the rescale request (`time.time()` just before",
        f"`MigrationDriver.migrate`). *Steady*: the {STEADY_S:g} s before the request, all its entries pooled",
        f"(p50, p99) or the mean of its buckets (events/s). *During*: the {AFTER_S:g} s after it: the worst",
        "bucket's p99, the highest latency, the lowest bucket's throughput as a share of steady. Percentiles are",
        "nearest-rank (a bucket of fewer than 100 entries has its maximum as p99); `bench/latency.py` holds the",
        f"maths. The two *{STEADY_S:g} s before* columns take the same worst-bucket figures over the steady window",
        "itself, where nothing rescales: the spread a bucket of this size shows at the sink's rate, which the",
        "targets are read against.",
        "",
        "Due, not emitted: a source paused by a migration emits what fell due meanwhile late, stamped late (its",
        "`ts`), so latency from `ts` would leave the pause out. Event `id` of the one synthetic source is due at",
        "the sources' clock start + id / rate, the start being the earliest `ts` - id / rate over the run's",
        "events (nothing is emitted before it is due: every executor of the source vertex paces its lanes from",
        "the vertex's clock, so a rescale of the source vertex moves no event's due time). After `restart`",
        "the sources replay from the checkpoint at the profile's rate, not in a burst (a recovery's choice,",
        "`Synthetic.pace_replay`), so its latency stays higher by the pause plus the checkpoint's age (up to",
        "2 s) for the rest of the run.",
        "Every run offers its sources at "
        f"{LOAD:.0%} of what the busiest vertex can take under the slower of its two schedules, and at most "
        f"{NODE_LOAD:.0%} of the busiest node's emulated cores under either (the",
        "simulator's capacities; the examples as written are congested on purpose, and a congested run has no",
        "steady state: its latency grows with its queues); Stela plans from the example as written.",
        "",
        f"| DAG | scale | protocol | steady p50 (ms) | steady p99 (ms) | p99 during (ms) | during / steady "
        f"| max during (ms) | steady (events/s) | worst {BUCKET_S * 1000:.0f} ms / steady "
        f"| {STEADY_S:g} s before: worst p99 / p99 | {STEADY_S:g} s before: worst {BUCKET_S * 1000:.0f} ms / steady "
        "| met (p99, throughput) |",
        "|---|---|---|" + "---:|" * 9 + "---|",
    ]
    dry = False
    for r in runs:
        f = r["latency"]
        short = r["lastEntryS"] < AFTER_S
        dry = dry or short
        lines.append(
            f"| {r['dag']} | {r['direction']} | {r['protocol']} | {ms(f.steady_p50_s)} | {ms(f.steady_p99_s)} | "
            f"{ms(f.during_p99_s)} | {fmt2(f.p99_ratio)} | {ms(f.max_s)} | {fmt(f.steady_throughput)} | "
            f"{fmt2(f.throughput_ratio)}{' †' if short else ''} | {fmt2(f.steady_p99_ratio)} | "
            f"{fmt2(f.steady_throughput_ratio)} | {yes_no(f.p99_met)}, {yes_no(f.throughput_met)} |"
        )
    if dry:
        lines += ["", f"† the sinks' last entry came before the {AFTER_S:g} s after the request were over."]
    lines += [""]
    for dag in dict.fromkeys(r["dag"] for r in runs):
        lines.append(
            f"![{dag}: p99 latency and sink throughput per {BUCKET_S * 1000:.0f} ms around the rescale request]"
            f"({felt_png(dag)})"
        )
    lines += [
        "",
        "### Latency timelines (the Megaphone paper's style)",
        "",
        "Per DAG, one panel per protocol and direction: the p50, p99 and highest latency of each",
        f"{BUCKET_S * 1000:.0f} ms bucket from 1 s before the request to 4 s after it (the first run of each),",
        "against the steady p99 and twice it (the target). A migration that moves state a few key groups at a",
        "time shows as a few buckets whose maximum rises while their p50 stays; a pause shows as every quantile",
        "rising together.",
        "",
    ]
    for dag in dict.fromkeys(r["dag"] for r in runs):
        lines.append(f"![{dag}: latency quantiles per bucket around the rescale request]({timeline_png(dag)})")
    return lines


def yes_no(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def felt_targets(runs: list[dict[str, Any]]) -> list[str]:
    """The issue's targets for what users feel, per protocol, and the same figures with no rescale."""

    def spread(values: list[float | None], unit: str) -> str:
        measured = sorted(v for v in values if v is not None)
        if not measured:
            return "-"
        return f"median {median(measured):.2f}{unit} ({measured[0]:.2f}-{measured[-1]:.2f}), {len(measured)} runs"

    p99_target = f"p99 during a rescale ≤ {P99_TARGET:g} × steady p99"
    tput_target = f"worst {BUCKET_S * 1000:.0f} ms bucket ≥ {THROUGHPUT_TARGET * 100:.0f} % of steady throughput"
    lines = []
    for p in PROTOCOLS:
        mine = [r["latency"] for r in runs if r["protocol"] == p]
        lines += [
            f"| {p99_target}: {p} | {spread([f.p99_ratio for f in mine], '×')} | "
            f"{share_met(f.p99_met for f in mine)} |",
            f"| {tput_target}: {p} | {spread([f.throughput_ratio for f in mine], '')} | "
            f"{share_met(f.throughput_met for f in mine)} |",
        ]
    steady = [r["latency"] for r in runs]
    lines += [
        f"| the same, {STEADY_S:g} s before the request (no rescale), p99: every run | "
        f"{spread([f.steady_p99_ratio for f in steady], '×')} | "
        f"{share_met(f.steady_p99_met for f in steady)} |",
        f"| the same, {STEADY_S:g} s before the request (no rescale), throughput: every run | "
        f"{spread([f.steady_throughput_ratio for f in steady], '')} | "
        f"{share_met(f.steady_throughput_met for f in steady)} |",
    ]
    return lines


def report(
    out: str, runs: list[dict[str, Any]], inflight: list[dict[str, Any]], store: list[dict[str, Any]], took: float
) -> None:
    lines = [
        "# Migration benchmark",
        "",
        f"Produced by `make bench` (`python bench/migration.py`) in {took:.0f} s on a shared 2-core machine (other",
        "jobs ran beside it: single runs vary by tens of percent), one run per row. Each run migrates mid-stream",
        f"(sources at {LOAD:.0%} of what the DAG's bottleneck takes and at most {NODE_LOAD:.0%} of the busiest node's "
        "cores under both schedules, finite: "
        f"{WARMUP_S + STEADY_S:g} s of events before the migration request,",
        f"{AFTER_S + TAIL_S:g} s after it) to the plan Stela makes, then runs to the end; lost and",
        "duplicated events are counted at the sinks against the exact multiset a correct run delivers. Phase",
        "times in ms. Every run takes a periodic checkpoint every",
        f"{CHECKPOINT_S:g} s (aligned barriers); `restart` is the Storm/Flink default: every worker stops, the new",
        "schedule starts from the last checkpoint (its rebalance) and is initialised from it (its restore), and",
        "the sources replay what they emitted after it (`replayed`, counted from the sources' positions).",
        "",
        "Catch-up and stabilization (s, from the migration request) follow the sinks' output rate (0.5 s",
        "buckets), from the moment the migration returned (its pause over), back to its level before the",
        "request (`recovery_times`: the median rate before it; back to 90 %, then within ±10 % for three",
        "buckets). A catch-up equal to the migration's own time means the output was back at once.",
        "",
        "`pause` is the time the sources are held: PREPARE sent (for `restart`: the workers told to stop) until",
        "every source is told to resume. `prepare` (CCR, DCR) is the work done before it, while everything",
        "runs: the nodes a scale-out adds start and bind their inboxes, staying workers bind their new",
        "executors' inboxes. No worker that stays is restarted by CCR or DCR; `restart` restarts all of them."
        + (
            " `ccr-partial` is CCR that pauses only the executors that move (`paused`: how many of the old"
            " schedule's executors did): its `pause` is how long those were held, every other executor and"
            " source running on. `ccr-keygroups` moves key groups a few at a time in band"
            " (`migrationScope: keyGroups`): its `capture/drain` is the OVERLAP (the new instances started beside"
            " the old ones), `commit` the steps of batches, `rebalance` the moving sources' hand-over, `restore`"
            " the switch; its `pause` is that hand-over (only a source that moves pauses), and `paused` counts"
            " those sources."
            if PARTIAL
            else ""
        ),
        "",
        "`to new (s)`: from the request until the migration returned, the new schedule running (prepare included).",
        "",
        "| DAG | scale | protocol | prepare | capture/drain | commit | rebalance | restore | pause | paused "
        "| to new (s) | catch-up (s) | stabilization (s) | captured | replayed | lost | duplicated |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        catch_up, stable = recovery_times(r["timeline"]["output"], resumed_at=r["resumedS"])
        lines.append(
            f"| {r['dag']} | {r['direction']} | {r['protocol']} | {fmt(r['prepareMs'])} | {fmt(r['captureMs'])} | "
            f"{fmt(r['commitMs'])} | {fmt(r['rebalanceMs'])} | {fmt(r['restoreMs'])} | {fmt(r['pauseMs'])} | "
            f"{r['paused']} | {r['resumedS']:.2f} | "
            f"{secs(catch_up)} | {secs(stable)} | "
            f"{r['captured']:,} | {r['replayed']:,} | {r['lost']:,} | {r['duplicated']:,} |"
        )
    lines += felt_section(runs)
    pairs = [(c, other) for c in CCR_LIKE for other in ("dcr", "restart")]
    lines += [
        "",
        "## Ratios (the paper: CCR restores Grid scale-in in 15 s against 41 s for DCR and 91 s for the default)",
        "",
        "Time to a running new schedule = capture + commit + rebalance + restore.",
        "",
        "| DAG | scale | " + " | ".join(f"{label(c)} / {label(o)}" for c, o in pairs) + " |",
        "|---|---|" + "---:|" * len(pairs),
    ]
    by = {(r["dag"], r["direction"], r["protocol"]): r for r in runs}

    def total(r: dict[str, Any]) -> float:
        return sum(r[k] or 0.0 for k in ("captureMs", "commitMs", "rebalanceMs", "restoreMs"))

    def over(dag: str, direction: str, mine: str, other: str) -> str:
        a, b = by.get((dag, direction, mine)), by.get((dag, direction, other))
        return "-" if a is None or b is None or total(b) == 0 else f"{total(a) / total(b):.2f}"

    for dag, direction in sorted({(r["dag"], r["direction"]) for r in runs}):
        if all((dag, direction, p) in by for p in PROTOCOLS):
            lines.append(f"| {dag} | {direction} | " + " | ".join(over(dag, direction, *pair) for pair in pairs) + " |")
    restarts = [r["duplicated"] for r in runs if r["protocol"] == "restart"]
    exact = all(r["lost"] == 0 and r["duplicated"] == 0 for r in runs if r["protocol"] != "restart")
    pauses = {
        p: sorted(r["pauseMs"] for r in runs if r["protocol"] == p and r["pauseMs"] is not None) for p in PROTOCOLS
    }
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for c in CCR_LIKE:
        ratios = sorted(
            total(by[(d, s, c)]) / total(by[(d, s, "restart")])
            for d, s in {(r["dag"], r["direction"]) for r in runs}
            if (d, s, c) in by and (d, s, "restart") in by and total(by[(d, s, "restart")]) > 0
        )
        ccr_pause = median(pauses[c])
        lines += [
            f"| {label(c)} pause ≤ 250 ms (median over DAGs and directions) | {fmt(ccr_pause)} ms "
            f"(range {fmt(min(pauses[c], default=None))}-{fmt(max(pauses[c], default=None))}) | "
            f"{'yes' if ccr_pause is not None and ccr_pause <= 250 else 'no'} |",
            f"| {label(c)} time to a running schedule ≤ 0.2 × restart's (same run) | {fmt2(median(ratios))} median "
            f"({fmt2(min(ratios, default=None))}-{fmt2(max(ratios, default=None))}) | "
            f"{'yes' if ratios and max(ratios) <= 0.2 else 'median' if ratios and median(ratios) <= 0.2 else 'no'} |",
        ]
    lines += felt_targets(runs)
    lines += [
        "",
        "Median pause: "
        + ", ".join(f"{label(p)} {fmt(median(pauses[p]))} ms" for p in PROTOCOLS)
        + f". {listing([label(p) for p in PROTOCOLS if p != 'restart'])} were "
        f"{'exactly-once in every run' if exact else 'NOT exactly-once in some run'}; restart, which loses "
        f"nothing either (state and positions come from the checkpoint), delivered "
        f"{min(restarts, default=0):,}-{max(restarts, default=0):,} events twice per run with at-least-once sinks "
        "(everything the sinks had seen since the checkpoint; `delivery: exactly-once` sinks hide those).",
    ]
    lines += [
        "",
        "## Restore time as the in-flight volume grows",
        "",
        "A source (8 executors) floods a vertex that sleeps 50 ms per event, so everything it emits waits in the",
        "channels; then every executor moves to another node with CCR. `captured` is what the channels held.",
        "",
        "| offered | captured | commit (ms) | rebalance (ms) | restore (ms) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in inflight:
        lines.append(
            f"| {r['volume']:,} | {r['captured']:,} | {fmt(r['commitMs'])} | {fmt(r['rebalanceMs'])} | "
            f"{fmt(r['restoreMs'])} |"
        )
    lines += [
        "",
        "## The checkpoint store alone (the paper checkpoints 2,000 events in about 100 ms)",
        "",
        "One executor persists N captured events spread over 16 key groups in one pipelined round trip",
        "(`CheckpointStore.save`), and a new executor loads them back (`load_pending`); embedded Redis on a",
        "Unix socket, median of 5.",
        "",
        "| events | save (ms) | load (ms) | vs the paper's 100 ms for 2,000 |",
        "|---:|---:|---:|---:|",
    ]
    for r in store:
        paper = 100.0 * r["volume"] / 2000
        lines.append(f"| {r['volume']:,} | {r['saveMs']:.1f} | {r['loadMs']:.1f} | {paper / r['saveMs']:.0f}x faster |")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "migration.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    plot(out, runs)
    plot_felt(out, runs)
    plot_timelines(out, runs)


def plot(out: str, runs: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dag = "ccr-grid" if any(r["dag"] == "ccr-grid" for r in runs) else runs[0]["dag"]
    chosen = [r for r in runs if r["dag"] == dag and r["direction"] == "in"]
    fig, axes = plt.subplots(1, len(chosen), figsize=(5 * len(chosen), 3.5), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], chosen, strict=True):
        for kind, style in (("input", "-"), ("output", "--")):
            points = r["timeline"][kind]
            ax.plot([t for t, _ in points], [v for _, v in points], style, label=f"{kind} rate")
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.set_title(f"{dag} scale-in, {r['protocol']}")
        ax.set_xlabel("seconds since the migration request")
    axes[0][0].set_ylabel("events/s")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "migration.png"), dpi=120)


#: one colour per protocol label in every figure, whether `ccr-partial` runs or not
COLOURS = {"ccr": "C0", "ccr-partial": "C2", "ccr-keygroups": "C4", "dcr": "C1", "restart": "C3"}


def felt_png(dag: str) -> str:
    return f"migration-latency-{dag}.png"


def timeline_png(dag: str) -> str:
    return f"migration-timeline-{dag}.png"


def plot_timelines(out: str, runs: list[dict[str, Any]]) -> None:
    """One figure per DAG in the Megaphone paper's style: latency quantiles (p50, p99, max) per bucket over
    time around the request, a panel per protocol (columns) and direction (rows), the first run of each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for dag in dict.fromkeys(r["dag"] for r in runs):
        directions = [d for d in ("out", "in") if any(r["dag"] == dag and r["direction"] == d for r in runs)]
        protocols = [p for p in PROTOCOLS if any(r["dag"] == dag and r["protocol"] == p for r in runs)]
        fig, axes = plt.subplots(
            len(directions),
            len(protocols),
            figsize=(3.2 * len(protocols), 2.8 * len(directions)),
            sharex=True,
            sharey=True,
            squeeze=False,
        )
        for row, direction in zip(axes, directions, strict=True):
            for ax, protocol in zip(row, protocols, strict=True):
                mine = [
                    r for r in runs if r["dag"] == dag and r["direction"] == direction and r["protocol"] == protocol
                ]
                if not mine:
                    continue
                run = mine[0]
                shown = [b for b in run["buckets"] if -1.0 <= b.start_s < 4.0]
                edges = [b.start_s for b in shown]
                for name, pick, style in (
                    ("max", lambda b: b.max_s, "-"),
                    ("p99", lambda b: b.p99_s, "-"),
                    ("p50", lambda b: b.p50_s, "-"),
                ):
                    values = [float("nan") if pick(b) is None else pick(b) * 1000 for b in shown]
                    ax.step(edges, values, where="post", linestyle=style, linewidth=1.0, label=name)
                steady = run["latency"].steady_p99_s
                if steady is not None:
                    ax.axhline(steady * 1000, color="grey", linestyle=":", linewidth=0.8)
                    ax.axhline(2 * steady * 1000, color="red", linestyle=":", linewidth=0.8)
                ax.axvline(0, color="grey", linewidth=0.8)
                ax.set_yscale("log")
                ax.grid(alpha=0.3)
                ax.set_title(f"{label(protocol)}, scale-{direction}", fontsize=9)
        for ax in axes[-1]:
            ax.set_xlabel("s since the request")
        for row in axes:
            row[0].set_ylabel("latency (ms)")
        axes[0][0].legend(fontsize=7, title="dotted: steady p99, 2x", title_fontsize=7)
        fig.suptitle(f"{dag}: latency quantiles per {BUCKET_S * 1000:.0f} ms bucket", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, timeline_png(dag)), dpi=100)
        plt.close(fig)


def plot_felt(out: str, runs: list[dict[str, Any]]) -> None:
    """One figure per DAG: p99 latency and sink throughput per bucket over time relative to the rescale request,
    protocols overlaid, a row of panels per direction; dotted: each protocol's steady level (the 5 s before)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter

    for dag in dict.fromkeys(r["dag"] for r in runs):
        directions = [d for d in ("out", "in") if any(r["dag"] == dag and r["direction"] == d for r in runs)]
        fig, axes = plt.subplots(len(directions), 2, figsize=(13, 3.6 * len(directions)), sharex=True, squeeze=False)
        for (lat, tput), direction in zip(axes, directions, strict=True):
            for r in runs:
                if r["dag"] != dag or r["direction"] != direction:
                    continue
                colour, f = COLOURS.get(r["protocol"]), r["latency"]
                # each bucket drawn over its width: the last one's value repeated at the window's end
                edges = [b.start_s for b in r["buckets"]] + [AFTER_S]
                p99 = [float("nan") if b.p99_s is None else b.p99_s * 1000 for b in r["buckets"]]
                rates = [b.throughput for b in r["buckets"]]
                lat.step(edges, p99 + p99[-1:], where="post", color=colour, linewidth=1.1, label=r["protocol"])
                tput.step(edges, rates + rates[-1:], where="post", color=colour, linewidth=1.1)
                if f.steady_p99_s is not None:
                    lat.axhline(f.steady_p99_s * 1000, color=colour, linestyle=":", linewidth=0.9)
                tput.axhline(f.steady_throughput, color=colour, linestyle=":", linewidth=0.9)
            for ax in (lat, tput):
                ax.axvline(0, color="grey", linewidth=0.8)
                ax.set_xlim(-STEADY_S, AFTER_S)
                ax.grid(alpha=0.3)
            lat.set_yscale("log")
            lat.yaxis.set_major_formatter(LogFormatter())
            lat.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
            lat.set_ylabel("p99 latency (ms)")
            tput.set_ylabel("sink events/s")
            tput.set_ylim(bottom=0)
            lat.set_title(f"{dag} scale-{direction}: p99 latency per {BUCKET_S * 1000:.0f} ms", fontsize=10)
            tput.set_title(f"{dag} scale-{direction}: sink throughput per {BUCKET_S * 1000:.0f} ms", fontsize=10)
        for ax in axes[-1]:
            ax.set_xlabel("seconds since the rescale request")
        axes[0][0].legend(title=f"dotted: steady ({STEADY_S:g} s before)", fontsize=8, title_fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, felt_png(dag)), dpi=110)
        plt.close(fig)


# ------------------------------------------------------------------------------------ one Redis vs a cluster


def spread_rows(url: str, volumes: list[int], rounds: int = 5) -> list[dict[str, Any]]:
    """The alternative layout for large keyed state: each key group's state and captured events under a tag
    of their own (`{bench/spread/<kg>}`, so the 16 groups fall on every shard), written in one pipeline that
    the cluster client splits per primary, then the checkpoint's pointer flipped in the topology's slot
    (SET). Loaded back the same way. Median of `rounds`; the same events as `store_rows`."""
    import statistics

    from elastream.store.codec import pack

    client = client_for(url)
    rows = []
    for volume in volumes:
        events = [pack((i, i % 64, i, time.time())) for i in range(volume)]
        pending = {g: events[g::16] for g in range(16)}
        state = {g: pack({k: k for k in range(4)}) for g in range(16)}
        saves, loads = [], []
        for attempt in range(rounds):
            mid = f"bench-{volume}-{attempt}"
            started = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for g in range(16):
                key = f"elastream:{{bench/spread/{g}}}:mig:{mid}"
                pipe.hset(f"{key}:state:v", str(g), state[g])
                pipe.rpush(f"{key}:pending:v:{g}", *pending[g])
                pipe.expire(f"{key}:state:v", 3600)
                pipe.expire(f"{key}:pending:v:{g}", 3600)
            pipe.execute()
            client.set("elastream:{bench/spread}:ckpt:latest", mid)  # the pointer, in the topology's slot
            saves.append((time.perf_counter() - started) * 1000.0)
            started = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for g in range(16):
                pipe.lrange(f"elastream:{{bench/spread/{g}}}:mig:{mid}:pending:v:{g}", 0, -1)
            loaded = sum(len(chunk) for chunk in pipe.execute())
            loads.append((time.perf_counter() - started) * 1000.0)
            assert loaded == volume
            for g in range(16):
                key = f"elastream:{{bench/spread/{g}}}:mig:{mid}"
                client.delete(f"{key}:state:v", f"{key}:pending:v:{g}")
        rows.append({"volume": volume, "saveMs": statistics.median(saves), "loadMs": statistics.median(loads)})
        log(f"  spread {volume:>7,} events: save {rows[-1]['saveMs']:7.1f} ms, load {rows[-1]['loadMs']:7.1f} ms")
    client.close()
    return rows


def cluster_main(args: argparse.Namespace) -> int:
    from support.redis_servers import LocalRedisCluster, RedisServer

    dags = ["ccr-linear", "ccr-grid"] if args.quick else ["ccr-linear", "ccr-diamond", "ccr-star", "ccr-grid"]
    volumes = [2_000, 20_000] if args.quick else [2_000, 20_000, 200_000]
    seconds = 3.0 if args.quick else 4.0
    started = time.monotonic()
    directory = tempfile.mkdtemp(prefix="elastream-bench-")
    one = RedisServer()
    cluster = LocalRedisCluster(masters=3, replicas=args.cluster_replicas)
    backends = {"one Redis": one, "cluster": cluster}
    store: dict[str, list[dict[str, Any]]] = {}
    spread: dict[str, list[dict[str, Any]]] = {}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in backends}
    try:
        one.start()
        cluster.start()
        log(f"[1/2] checkpoint store: one slot (elastream's layout) and per-key-group slots, {volumes}")
        for name, backend in backends.items():
            log(f" {name}")
            store[name] = store_rows(backend.url, volumes)
        log(" cluster, per-key-group slots")
        spread["cluster"] = spread_rows(cluster.url, volumes)
        log(f"[2/2] {len(dags)} DAGs x out/in x ccr, alternating one Redis and the cluster")
        for dag in dags:
            for direction in ("out", "in"):
                for name, backend in backends.items():
                    log(f" {name}")
                    runs[name].append(one_run(directory, backend.url, dag, direction, "ccr", seconds, seconds))
    finally:
        cluster.stop()
        one.remove()
        shutil.rmtree(directory, ignore_errors=True)
    took = time.monotonic() - started
    cluster_report(args.out, store, spread, runs, args.cluster_replicas, took)
    log(f"wrote {args.out}/migration-cluster.md in {took:.0f} s")
    return 0


def cluster_report(
    out: str,
    store: dict[str, list[dict[str, Any]]],
    spread: dict[str, list[dict[str, Any]]],
    runs: dict[str, list[dict[str, Any]]],
    replicas: int,
    took: float,
) -> None:
    def phase_total(r: dict[str, Any]) -> float:
        return sum(r[k] or 0.0 for k in ("captureMs", "commitMs", "rebalanceMs", "restoreMs"))

    lines = [
        "# Checkpoints and migrations on a Redis Cluster beside one Redis",
        "",
        f"Produced by `python bench/migration.py --cluster` in {took:.0f} s on a shared 2-core machine (single runs",
        "vary by tens of percent). One Redis: one redis-server on loopback TCP. Cluster: three primaries"
        + (f" with {replicas} replica{'s' if replicas != 1 else ''} each" if replicas else " without replicas")
        + ", redis-server",
        "processes on loopback TCP joined by `redis-cli --cluster create`, named by every node",
        "(`redis+cluster://127.0.0.1:PORT,127.0.0.1:PORT,...`).",
        "Persistence off on both. The two alternate in one run, so both see the same load.",
        "",
        "## The checkpoint store alone",
        "",
        "One executor saves N captured events over 16 key groups and a new one loads them back; median of 5.",
        "*one slot*: elastream's layout, every key under the topology's hash tag `{namespace/name}`",
        "(`CheckpointStore.save`: one pipelined round trip to the one primary serving the slot). *per-group",
        "slots*: the alternative for large keyed state, each key group's keys under a tag of their own (16 tags",
        "over the three primaries), written in one pipeline the cluster client splits per primary, then the",
        "checkpoint's pointer flipped in the topology's slot.",
        "",
        "| events | one Redis: save / load (ms) | cluster, one slot: save / load (ms) | "
        "cluster, per-group slots: save / load (ms) | one slot / per-group (save) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for mine, one_row, theirs in zip(store["cluster"], store["one Redis"], spread["cluster"], strict=True):
        lines.append(
            f"| {mine['volume']:,} | {one_row['saveMs']:.1f} / {one_row['loadMs']:.1f} | "
            f"{mine['saveMs']:.1f} / {mine['loadMs']:.1f} | {theirs['saveMs']:.1f} / {theirs['loadMs']:.1f} | "
            f"{mine['saveMs'] / theirs['saveMs']:.2f} |"
        )
    ratios_store = [m["saveMs"] / t["saveMs"] for m, t in zip(store["cluster"], spread["cluster"], strict=True)]
    lines += [
        "",
        f"One slot / per-group slots, save: {fmt2(min(ratios_store))}-{fmt2(max(ratios_store))} (below 1: one slot",
        "is faster). Here the three primaries share the machine's two cores, so the per-group layout's writes to",
        "three primaries at once cannot run in parallel; on primaries of their own it could divide the time of",
        "one very large checkpoint by up to the number of shards, which is the case that layout would serve.",
    ]
    lines += [
        "",
        "## CCR migrations",
        "",
        "Each DAG migrates mid-stream to Stela's plan (as in `migration.md`); phase times in ms; lost and",
        "duplicated counted at the sinks against the exact multiset a correct run delivers.",
        "",
        "| DAG | scale | Redis | capture | commit | rebalance | restore | pause | total | captured | lost "
        "| duplicated |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = []
    for mine, one_row in zip(runs["cluster"], runs["one Redis"], strict=True):
        for name, r in (("one", one_row), ("cluster", mine)):
            lines.append(
                f"| {r['dag']} | {r['direction']} | {name} | {fmt(r['captureMs'])} | {fmt(r['commitMs'])} | "
                f"{fmt(r['rebalanceMs'])} | {fmt(r['restoreMs'])} | {fmt(r['pauseMs'])} | {fmt(phase_total(r))} | "
                f"{r['captured']:,} | {r['lost']:,} | {r['duplicated']:,} |"
            )
        if phase_total(one_row) > 0:
            ratios.append(phase_total(mine) / phase_total(one_row))
    exact = all(r["lost"] == 0 and r["duplicated"] == 0 for rows in runs.values() for r in rows)
    pauses = {name: median([r["pauseMs"] for r in rows if r["pauseMs"] is not None]) for name, rows in runs.items()}
    lines += [
        "",
        f"Cluster / one Redis, time to a running new schedule (capture + commit + rebalance + restore): median "
        f"{fmt2(median(ratios))} (range {fmt2(min(ratios, default=None))}-{fmt2(max(ratios, default=None))}). "
        f"Median pause: one Redis {fmt(pauses['one Redis'])} ms, cluster {fmt(pauses['cluster'])} ms. "
        f"{'Every run was exactly-once.' if exact else 'NOT exactly-once in some run.'}",
    ]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "migration-cluster.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=1, help="repeat section 1 (the migrations) this many times")
    parser.add_argument("--dags", help="comma-separated DAGs of section 1 (default: all five; --quick: two)")
    parser.add_argument("--protocols", help=f"comma-separated labels of section 1 (default: {','.join(PROTOCOLS)})")
    parser.add_argument("--repeat", help="the labels the runs after the first take (default: every protocol)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks"))
    parser.add_argument(
        "--cluster", action="store_true", help="one Redis beside a 3-primary Redis Cluster: migration-cluster.md"
    )
    parser.add_argument("--cluster-replicas", type=int, default=0, help="replicas per primary with --cluster (0)")
    args = parser.parse_args(argv)
    if args.cluster:
        return cluster_main(args)
    dags = (
        args.dags.split(",")
        if args.dags
        else ["ccr-linear", "ccr-grid"]
        if args.quick
        else ["ccr-linear", "ccr-diamond", "ccr-star", "ccr-grid", "ccr-traffic"]
    )
    protocols = args.protocols.split(",") if args.protocols else list(PROTOCOLS)
    unknown = sorted(set(protocols) - set(PROTOCOLS))
    if unknown:
        parser.error(f"--protocols: unknown {', '.join(unknown)}; choose from {', '.join(PROTOCOLS)}")
    before_s, after_s = WARMUP_S + STEADY_S, AFTER_S + TAIL_S
    started = time.monotonic()
    directory = tempfile.mkdtemp(prefix="elastream-bench-")
    redis = EmbeddedRedis(directory)
    runs: list[dict[str, Any]] = []
    try:
        log(f"[1/3] {len(dags)} DAGs x out/in x {', '.join(protocols)}, {args.runs} run(s)")
        repeated = args.repeat.split(",") if args.repeat else protocols
        for round_number in range(args.runs):
            if args.runs > 1:
                log(f"  run {round_number + 1} of {args.runs}")
            for name in dags:
                for direction in ("out", "in"):
                    for protocol in protocols if round_number == 0 else [p for p in protocols if p in repeated]:
                        runs.append(
                            one_run(directory, redis.url, name, direction, protocol, before_s, after_s, round_number)
                        )
        log("[2/3] restore time vs in-flight volume")
        inflight = inflight_rows(
            directory, redis.url, [100, 1_000, 10_000] if args.quick else [100, 1_000, 10_000, 100_000]
        )
        log("[3/3] checkpoint store")
        store = store_rows(redis.url, [2_000, 20_000, 200_000])
    finally:
        redis.stop()
        shutil.rmtree(directory, ignore_errors=True)
    report(args.out, runs, inflight, store, time.monotonic() - started)
    log(f"wrote {args.out}/migration.md and migration.png in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
