"""Offline commands on manifests and snapshots: validate, etp, plan, simulate; and `plan --live`.

They need no cluster, Redis or Spark: a manifest, and for etp a metric snapshot (JSON, the shape DESIGN.md
fixes; `elastream simulate --snapshot-out` writes one from the fluid model). `plan` without `--metrics`
plans from that fluid-model snapshot itself (`model_snapshot`). `plan --live NAMESPACE/NAME --nodes N` is the
one exception: it reads a running topology's schedule and metric window through its Redis
(`control.live_plan`) and prints the plan a scale request would make, applying nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import yaml

from elastream.cli import CommandError, print_table
from elastream.core.metrics import MetricSnapshot
from elastream.core.pareto import KNEE_FRACTION, ParetoError, ParetoPlan, pareto_plan
from elastream.core.planner import STRATEGIES, Plan, etp_table, make_plan
from elastream.core.schedule import Schedule, initial_schedule
from elastream.core.simulate import SimulationModel, SimulationResult, simulate, snapshot_from_simulation
from elastream.core.topology import MAX_NODES, Topology, split_executor_id
from elastream.crd import load_manifest

if TYPE_CHECKING:
    from elastream.control.live_plan import LivePlan

#: printed (to stderr) when `plan` has no --metrics
MODEL_NOTE = (
    "no --metrics: planning from the fluid model of the manifest (costMs, rates); pass --metrics for measured rates"
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    validate = subparsers.add_parser("validate", help="check a StreamTopology manifest")
    validate.add_argument("file", help="YAML file with one StreamTopology")
    validate.add_argument(
        "--crd",
        metavar="CRD.yaml",
        default=None,
        help="check against this StreamTopology CRD (its schema and CEL rules) instead of the packaged one",
    )
    validate.set_defaults(func=cmd_validate)

    etp = subparsers.add_parser("etp", help="congestion and ETP per vertex from a metric snapshot")
    etp.add_argument("file", help="YAML file with one StreamTopology")
    etp.add_argument("--metrics", required=True, metavar="SNAP.json", help="metric snapshot (JSON)")
    etp.add_argument("--congestion-rate", type=float, default=None, help="default: spec.scaling.congestionRate")
    etp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    etp.set_defaults(func=cmd_etp)

    plan = subparsers.add_parser(
        "plan",
        help="plan a scale-out or scale-in to --nodes N (of a manifest, or of a running topology with --live), "
        "or list the throughput/cost Pareto front (--pareto)",
    )
    plan.add_argument(
        "file", nargs="?", default=None, help="YAML file with one StreamTopology (not with --live: see --manifest)"
    )
    plan.add_argument(
        "--metrics",
        metavar="SNAP.json",
        help="metric snapshot (JSON); default: the fluid model's snapshot of the manifest (costMs, rates)",
    )
    target = plan.add_mutually_exclusive_group(required=True)
    target.add_argument("--nodes", type=int, help="node count after scaling")
    target.add_argument(
        "--pareto", action="store_true", help="list the Pareto-optimal (nodes, parallelism) configurations"
    )
    plan.add_argument(
        "--max-nodes",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --pareto: largest node count tried; default: spec.scaling.auto.maxNodes when autoscaling "
        "is enabled, else 2 × spec.nodes",
    )
    plan.add_argument("--strategy", choices=STRATEGIES, default=None, help="default: spec.scaling.strategy")
    plan.add_argument("--congestion-rate", type=float, default=None, help="default: spec.scaling.congestionRate")
    plan.add_argument("--seed", type=int, default=0, help="seed of the random strategy")
    plan.add_argument("--json", action="store_true", help="print JSON instead of text (as --output json)")
    plan.add_argument("--output", choices=("text", "json"), default=None, help="text (default) or json")
    live = plan.add_argument_group(
        "live what-if", "plan from a running topology's metric window and schedule; nothing is applied"
    )
    live.add_argument(
        "--live",
        metavar="NAMESPACE/NAME",
        default=None,
        help="the running topology (NAME alone: namespace default), read through its Redis",
    )
    live.add_argument(
        "--redis-url",
        "--redis",
        dest="redis_url",
        metavar="URL",
        default=None,
        help="the topology's Redis (default $ELASTREAM_REDIS_URL, which the operator's pod has)",
    )
    live.add_argument(
        "--manifest",
        metavar="FILE",
        default=None,
        help="the topology's spec; default: the manifest `elastream run` keeps in Redis, else the StreamTopology "
        "through the Kubernetes API",
    )
    live.add_argument("--window", type=int, default=None, help="intervals in the window (default spec.scaling.window)")
    live.add_argument("--interval", type=float, default=1.0, metavar="S", help="the workers' metric interval (1.0)")
    live.add_argument(
        "--engine",
        choices=("python", "spark"),
        default="python",
        help="metric analysis engine (python: no JVM beside the operator in its pod; same results as spark)",
    )
    plan.set_defaults(func=cmd_plan, usage_error=plan.error)

    sim = subparsers.add_parser("simulate", help="steady-state throughput of a schedule (fluid model)")
    sim.add_argument("file", help="YAML file with one StreamTopology")
    sim.add_argument("--schedule", metavar="SCHEDULE.json", help="a schedule or `elastream plan --json` output")
    sim.add_argument("--metrics", metavar="SNAP.json", help="calibrate vertices without costMs from a snapshot")
    sim.add_argument("--snapshot-out", metavar="SNAP.json", help="write the simulated metric snapshot here")
    sim.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sim.set_defaults(func=cmd_simulate)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give a node count ≥ 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1; give a node count ≥ 1")
    return value


def cmd_validate(args: argparse.Namespace) -> int:
    """Check the manifest against the CRD's schema and its CEL rules (what the API server checks on
    `kubectl apply`), then with the parser (what the CRD does not say: the graph, slots); every problem is one
    line (`elastream.crd.merge_problems`). A file too big, too deep or an alias bomb is refused by the
    bounded reader before either check walks it."""
    from elastream.core.topology import read_manifest_document
    from elastream.crd import RuleError, check_manifest, openapi_schema

    if args.crd is not None:
        try:
            openapi_schema(path=args.crd)
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
            raise CommandError(f"--crd {args.crd}: {str(exc).splitlines()[0]}; name a CRD file") from None
    document = read_manifest_document(args.file)
    try:
        topology = check_manifest(document, crd_path=args.crd)
    except RuleError as exc:
        raise CommandError(f"--crd {args.crd or 'packaged CRD'}: {exc}; fix the rule") from None
    print(
        f"{args.file}: valid — topology {topology.name}: {len(topology.vertices)} vertices, "
        f"{len(topology.streams)} streams, {topology.executors} executors on {topology.nodes} nodes "
        f"× {topology.slots_per_node} slots"
    )
    return 0


def _load_snapshot(path: str) -> MetricSnapshot:
    try:
        return MetricSnapshot.load(path)
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path}: byte {exc.start} is not UTF-8 ({exc.reason}); save it as UTF-8") from None


def _congestion_rate(args: argparse.Namespace, topology: Topology) -> float:
    rate = args.congestion_rate if args.congestion_rate is not None else topology.scaling.congestion_rate
    if rate < 1.0:
        raise CommandError(f"--congestion-rate: {rate} is below 1.0; use a value ≥ 1.0 (the paper uses 1.2)")
    return float(rate)


def cmd_etp(args: argparse.Namespace) -> int:
    topology = load_manifest(args.file)
    snapshot = _load_snapshot(args.metrics)
    table = etp_table(topology, snapshot, _congestion_rate(args, topology))
    if args.json:
        print(json.dumps(table.to_dict(), indent=2))
        return 0
    print_table(
        [("vertex", "<20"), ("input/s", ">12.1f"), ("processing/s", ">13.1f"), ("congested", ">9"), ("ETP", ">8.1%")],
        (
            (name, row.input_rate, row.processing_rate, "yes" if row.congested else "no", row.etp)
            for name, row in table.vertices.items()
        ),
    )
    print(f"throughput (sum of sinks): {table.throughput:.1f} tuples/s")
    priority = table.priority()
    print("scale-out priority: " + (", ".join(priority) if priority else "none congested (a source gets slots)"))
    return 0


def check_executors(topology: Topology, executors: Iterable[str], where: str) -> None:
    """Every executor id is `<vertex>#<i>` of a vertex of the topology; else one line naming `where`."""
    for executor in executors:
        try:
            vertex, _ = split_executor_id(executor)
        except ValueError as exc:
            raise CommandError(f"{where}: {exc}") from None
        if vertex not in topology.vertices:
            raise CommandError(f"{where}: executor {executor} belongs to no vertex of {topology.name}")


def current_schedule(topology: Topology, snapshot: MetricSnapshot) -> Schedule:
    """The schedule the snapshot was taken under (its placement), or the initial one when it has none."""
    if not snapshot.placement:
        return initial_schedule(topology)
    for node, executors in snapshot.placement.items():
        check_executors(topology, executors, f"snapshot.placement.{node}")
    schedule = Schedule.from_placement(snapshot.placement, topology.slots_per_node)
    missing = [v for v in topology.order if v not in schedule.parallelism()]
    if missing:
        raise CommandError(f"snapshot.placement: no executor of {', '.join(missing)}; place every vertex")
    return schedule


def _simulate(topology: Topology, schedule: Schedule, snapshot: MetricSnapshot | None = None) -> SimulationResult:
    """`simulate` with the model calibrated from the manifest (and `snapshot`); its errors as one line."""
    try:
        return simulate(topology, schedule, SimulationModel.from_topology(topology, snapshot))
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def model_inputs_missing(topology: Topology) -> list[str]:
    """One line per vertex the fluid model cannot bound from the manifest alone: logic and user-module vertices
    without costMs, sources with neither a rate nor costMs. (A built-in sink, or a source with a rate, without
    costMs is taken to cost nothing, as `simulate` does.)"""
    problems: list[str] = []
    for name in topology.order:
        vertex = topology.vertices[name]
        if vertex.cost_ms is not None:
            continue
        if vertex.kind == "source" and vertex.source_rate is None:
            problems.append(
                f"vertex {name}: a source with neither rate nor costMs emits without bound; add source.rate "
                f"(tuples/s) or source.costMs to the manifest, or pass --metrics SNAP.json with measured rates"
            )
        elif vertex.kind == "logic" or "module" in vertex.config:
            problems.append(
                f"vertex {name}: no costMs, so the fluid model cannot tell its capacity; add {vertex.kind}.costMs "
                f"(ms per tuple) to the manifest, or pass --metrics SNAP.json with measured rates"
            )
    return problems


def model_snapshot(topology: Topology) -> MetricSnapshot:
    """What `elastream simulate FILE --snapshot-out` writes: the manifest's own schedule at the fluid model's
    steady state. Raises `CommandError` naming every vertex the model cannot bound."""
    problems = model_inputs_missing(topology)
    if problems:
        raise CommandError("\n".join(problems))
    schedule = initial_schedule(topology)
    return snapshot_from_simulation(topology, schedule, _simulate(topology, schedule))


def _plan_snapshot(args: argparse.Namespace, topology: Topology) -> MetricSnapshot:
    """The --metrics snapshot, checked against the topology, or the model's snapshot (with the note)."""
    if args.metrics:
        snapshot = _load_snapshot(args.metrics)
        snapshot.check_against(topology)
        return snapshot
    snapshot = model_snapshot(topology)
    print(MODEL_NOTE, file=sys.stderr)
    return snapshot


def cmd_plan(args: argparse.Namespace) -> int:
    if args.live is not None:
        return cmd_plan_live(args)
    live_only = [
        flag
        for flag, value in (("--redis-url", args.redis_url), ("--manifest", args.manifest), ("--window", args.window))
        if value is not None
    ]
    if live_only:
        args.usage_error(f"{', '.join(live_only)}: only with --live NAMESPACE/NAME (a running topology)")
    if args.file is None:
        args.usage_error("give a manifest FILE, or --live NAMESPACE/NAME for a running topology")
    args.json = args.json or args.output == "json"
    if not args.pareto and args.max_nodes is not None:
        args.usage_error("--max-nodes goes with --pareto; with --nodes N the node count is given")
    for flag, value in (("--nodes", args.nodes), ("--max-nodes", args.max_nodes)):
        if value is not None and value > MAX_NODES:  # planning for it would fill the memory first
            raise CommandError(f"{flag}: {value} is above {MAX_NODES}, the most a topology may have; ask for fewer")
    topology = load_manifest(args.file)
    snapshot = _plan_snapshot(args, topology)
    if args.pareto:
        return _pareto(args, topology, snapshot)
    schedule = current_schedule(topology, snapshot)
    strategy = args.strategy or topology.scaling.strategy
    plan = make_plan(
        topology, schedule, snapshot, args.nodes, strategy, _congestion_rate(args, topology), seed=args.seed
    )
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print_plan(topology, plan, snapshot, "measured now" if args.metrics else "fluid model now")
    return 0


def print_plan(
    topology: Topology, plan: Plan, snapshot: MetricSnapshot | None = None, now_label: str = "measured now"
) -> None:
    now = sum(snapshot.vertices[s].processing_rate for s in topology.sinks) if snapshot else None
    predicted = "n/a" if plan.predicted_throughput is None else f"{plan.predicted_throughput:.1f} tuples/s"
    words = {"out": "scale out", "in": "scale in", "none": "no change"}[plan.direction]
    print(f"plan {topology.name}: {words} {plan.from_nodes} -> {plan.to_nodes} nodes with {plan.strategy}")
    print(f"  predicted throughput: {predicted}" + (f" ({now_label}: {now:.1f} tuples/s)" if now is not None else ""))
    if plan.added_nodes:
        print(f"  added nodes: {', '.join(plan.added_nodes)}")
    if plan.removed_nodes:
        print(f"  removed nodes: {', '.join(plan.removed_nodes)}")
    if plan.new_executors:
        print("  new executors: " + ", ".join(f"{e} -> {n}" for e, n in plan.new_executors))
    print(
        f"  moves: {len(plan.moves)}"
        + (": " + ", ".join(f"{e} {a}->{b}" for e, a, b in plan.moves[:12]) if plan.moves else "")
    )
    if len(plan.moves) > 12:
        print(f"         ... and {len(plan.moves) - 12} more")
    print("  parallelism: " + ", ".join(f"{v}={k}" for v, k in plan.parallelism.items()))
    for step in plan.steps:
        print("  " + describe_step(step))


def describe_step(step: dict[str, Any] | Any) -> str:
    if "removed" in step and "etp_sum" in step:
        sums = ", ".join(f"{n}={s:.3f}" for n, s in step["etp_sum"].items())
        return f"step {step['iteration']}: ETPSum {sums} -> remove {step['removed']}"
    if "removed" in step:
        return f"random removal of {', '.join(step['removed'])} (seed {step['seed']})"
    if step.get("target") is None:
        return f"step {step['iteration']}: {step.get('reason', 'no target')}"
    etp = ", ".join(f"{v}={e:.3f}" for v, e in step.get("etp", {}).items())
    skipped = ", ".join(step.get("skipped", {}))
    return (
        f"step {step['iteration']}: ETP {{{etp}}} -> {step['target']} on {step['node']}"
        + (f" ({step['reason']})" if "reason" in step and "source" in step["reason"] else "")
        + (f" (skipped {skipped}: fed only through global)" if skipped else "")
    )


def cmd_plan_live(args: argparse.Namespace) -> int:
    """`plan --live NAMESPACE/NAME --nodes N`: the plan a scale request to N would make now, from the running
    topology's schedule and metric window (`control.live_plan`), printed and never applied."""
    import redis

    from elastream.analysis import Analyzer
    from elastream.control.live_plan import LivePlanError, TopologyRef, kubernetes_lister, plan_live, read_live
    from elastream.store.registry import connect, redacted

    if args.file is not None:
        args.usage_error(f"--live reads the running topology; give its spec as --manifest {args.file}, not as FILE")
    if args.pareto or args.metrics or args.max_nodes is not None:
        args.usage_error("--live plans to --nodes N from the live window: leave out --pareto, --metrics, --max-nodes")
    if args.nodes < 1 or args.nodes > MAX_NODES:
        raise CommandError(f"--nodes: {args.nodes} is outside [1, {MAX_NODES}]; ask for 1 to {MAX_NODES} nodes")
    url = args.redis_url or os.environ.get("ELASTREAM_REDIS_URL")
    if not url:
        raise CommandError(
            "--redis-url: no URL; pass the topology's Redis URL or set ELASTREAM_REDIS_URL (the operator's pod "
            "has it: kubectl exec -n elastream-system deploy/elastream -- elastream plan --live ...)"
        )
    try:
        ref = TopologyRef.parse(args.live)
    except LivePlanError as exc:
        raise CommandError(str(exc)) from None
    manifest = load_manifest(args.manifest) if args.manifest else None
    client = connect(url, wait_s=LIVE_REDIS_WAIT_S)  # RedisUnavailable: one line, the URL redacted
    analysis_log = logging.getLogger("elastream.analysis")
    quiet = analysis_log.disabled
    analysis_log.disabled = True  # a Spark fallback is said once below, as `warning:` (as `analyze` does)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)  # the analysis' fallback notices, not others
            live = read_live(client, ref, redacted(url), manifest=manifest, kubernetes=kubernetes_lister)
            result = plan_live(
                client,
                live,
                args.nodes,
                Analyzer(engine=args.engine),
                window=args.window,
                interval_s=args.interval,
                strategy=args.strategy,
                congestion_rate=args.congestion_rate,
                seed=args.seed,
            )
        for warning in caught:
            print(f"warning: {warning.message}", file=sys.stderr)
    except LivePlanError as exc:
        raise CommandError(str(exc)) from None
    except redis.RedisError as exc:
        # redis-py's messages name host and port, never the password; the URL is shown redacted
        raise CommandError(
            f"Redis at {redacted(url)} failed while reading {ref}: {type(exc).__name__}: {exc}; check that it is up"
        ) from None
    finally:
        analysis_log.disabled = quiet
        client.close()
    if args.json or args.output == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_live_plan(result)
    return 0


#: seconds `plan --live` retries a Redis that does not answer before it gives up
LIVE_REDIS_WAIT_S = 2.0


def print_live_plan(result: LivePlan) -> None:
    """The live what-if as text: where it read from, the window, then the plan as `plan` prints it."""
    live, plan = result.live, result.plan
    nodes = len(live.schedule.nodes)
    print(
        f"live {live.ref}: {nodes} nodes running (schedule version {live.version}"
        + (f"; spec.nodes {live.spec_nodes}" if live.spec_nodes not in (None, nodes) else "")
        + f"), spec from {live.where_spec()}"
    )
    analysis = result.analysis
    age = max(0.0, time.time() - analysis.window_end)
    print(
        f"  window: {result.intervals} intervals of {result.interval_s:g} s up to {age:.1f} s ago, "
        f"{analysis.samples_used} samples, {result.engine} analysis; congested now: "
        + (", ".join(result.congested) or "none")
    )
    print_plan(live.topology, plan, analysis.snapshot, "measured now")
    changes = plan.parallelism_changes
    if changes:
        print("  parallelism changes: " + ", ".join(f"{v} {a}->{b}" for v, (a, b) in changes.items()))
    if plan.direction == "none":
        print("nothing to apply")
        return
    how = (
        f"kubectl scale topo {live.ref.name} -n {live.ref.namespace} --replicas={plan.to_nodes}"
        if live.spec_from == "kubernetes"
        else f"elastream scale FILE --nodes {plan.to_nodes}"
    )
    print(f"nothing applied; to apply: {how}")


def _load_schedule(path: str, topology: Topology) -> Schedule:
    """A schedule file: `{placement: {node: [executors]}, slotsPerNode, nodes}`, a bare placement, or
    `elastream plan --json` output (its `schedule`). Every shape error is one line naming the field."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise CommandError(f"{path}: cannot read ({exc.strerror}); check the path") from None
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path}: byte {exc.start} is not UTF-8 ({exc.reason}); save it as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise CommandError(f"{path}: line {exc.lineno} is not valid JSON ({exc.msg})") from None
    if isinstance(data, dict) and "schedule" in data:
        data = data["schedule"]
    if not isinstance(data, dict):
        raise CommandError(f"{path}: is not a schedule; give {{placement: {{node: [executors]}}}}")
    if "placement" not in data:
        data = {"placement": data}
    placement = data["placement"]
    if not isinstance(placement, dict) or not placement:
        raise CommandError(f'{path}: placement is not a mapping of node -> [executors]; write {{"node-0": ["v#0"]}}')
    for node, executors in placement.items():
        if not isinstance(executors, list) or not all(isinstance(e, str) for e in executors):
            raise CommandError(f'{path}: placement.{node} is not a list of executor ids; write ["<vertex>#<i>", ...]')
        check_executors(topology, executors, f"{path}: placement.{node}")
    slots = data.get("slotsPerNode", topology.slots_per_node)
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise CommandError(f"{path}: slotsPerNode {slots!r} is not an integer ≥ 1; fix it or leave it out")
    nodes = data.get("nodes")
    if nodes is not None and (not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes)):
        raise CommandError(f"{path}: nodes {nodes!r} is not a list of node names; fix it or leave it out")
    return Schedule.from_dict({"placement": placement, "slotsPerNode": slots, "nodes": nodes})


def cmd_simulate(args: argparse.Namespace) -> int:
    topology = load_manifest(args.file)
    schedule = _load_schedule(args.schedule, topology) if args.schedule else initial_schedule(topology)
    snapshot = _load_snapshot(args.metrics) if args.metrics else None
    result = _simulate(topology, schedule, snapshot)
    if args.snapshot_out:
        with open(args.snapshot_out, "w", encoding="utf-8") as handle:
            handle.write(snapshot_from_simulation(topology, schedule, result).to_json() + "\n")
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print_table(
        [
            ("vertex", "<20"),
            ("executors", ">9"),
            ("input/s", ">12.1f"),
            ("processing/s", ">13.1f"),
            ("emit/s", ">12.1f"),
        ],
        (
            (name, flow.executors, flow.input_rate, flow.processing_rate, flow.emit_rate)
            for name, flow in result.vertices.items()
        ),
    )
    print(f"throughput (sum of sinks): {result.throughput:.1f} tuples/s on {len(schedule.nodes)} nodes")
    return 0


def default_max_nodes(topology: Topology) -> int:
    """--max-nodes when not given: the autoscaler's spec.scaling.auto.maxNodes when it is enabled (it never
    goes past it), else twice spec.nodes."""
    auto = topology.scaling.auto
    return auto.max_nodes if auto.enabled else 2 * topology.nodes


def _pareto(args: argparse.Namespace, topology: Topology, snapshot: MetricSnapshot) -> int:
    model = SimulationModel.from_topology(topology, snapshot)
    max_nodes = args.max_nodes or default_max_nodes(topology)
    try:
        front = pareto_plan(topology, model, max_nodes)
    except ParetoError as exc:
        raise CommandError(f"--max-nodes {max_nodes}: {exc}") from None
    except ValueError as exc:  # from simulate: a source the model cannot bound
        raise CommandError(str(exc)) from None
    offered = {s: model.vertices[s].source_rate for s in topology.sources}
    if args.json:
        data = {
            "topology": topology.name,
            "rates_from": "metrics" if args.metrics else "model",
            "max_nodes": max_nodes,
            "offered": offered,
            **front.to_dict(),
        }
        print(json.dumps(data, indent=2))
    else:
        print_pareto(topology, front, offered, max_nodes, "--metrics" if args.metrics else "the fluid model")
    return 0


def print_pareto(
    topology: Topology, front: ParetoPlan, offered: dict[str, float | None], max_nodes: int, rates_from: str
) -> None:
    first = front.configurations[0].nodes
    print(
        f"pareto {topology.name}: best parallelism for {first}..{front.configurations[-1].nodes} nodes "
        f"(of {first}..{max_nodes}) × {topology.slots_per_node} slots, rates from {rates_from}"
    )
    rates = ", ".join(f"{s} {r:g}/s" if r is not None else f"{s} as fast as it can" for s, r in offered.items())
    if front.bound is None:
        print(f"  throughput bound: no offered rate to bound it ({rates})")
    else:
        print(f"  throughput bound: {front.bound:.1f} tuples/s at the sinks, the offered source rate ({rates})")
    if front.bound is None or front.ceiling < front.bound * (1 - 1e-9):
        print(f"  at most {front.ceiling:.1f} tuples/s with every vertex at maxParallelism")
    if front.fixed:
        print(f"  parallelism kept as written: {', '.join(front.fixed)} (redis-stream source)")
    rows = [" ".join(f"{v}={k}" for v, k in c.parallelism.items()) for c in front.configurations]
    width = max(len("parallelism"), *(len(r) for r in rows))
    header = f"{'nodes':>5} {'executors':>9} {'tuples/s':>10} {'of bound':>8}  {'pareto':<10}"
    print(f"{header} {'parallelism':<{width}}  limit")
    for c, parallelism in zip(front.configurations, rows, strict=True):
        share = f"{c.throughput / front.bound:.1%}" if front.bound else "-"
        mark = ("yes" if c.nodes in front.front else "") + (" (rec)" if c.nodes == front.recommended else "")
        print(
            f"{c.nodes:>5} {c.executors:>9} {c.throughput:>10.1f} {share:>8}  {mark:<10} {parallelism:<{width}}  "
            f"{c.limit}"
        )
    if front.stopped:
        print(f"  stopped: {front.stopped}")
    rec = next((c for c in front.configurations if c.nodes == front.recommended), None)
    if rec is not None:
        print(
            f"recommended: {rec.nodes} nodes, {rec.executors} executors, {rec.throughput:.1f} tuples/s "
            f"(the fewest nodes within {1 - KNEE_FRACTION:.0%} of the highest throughput)"
        )
