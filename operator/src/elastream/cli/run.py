"""Commands that run a topology: `elastream run` (local mode) and `elastream worker` (one node).

`run` starts every node as a local worker process on its own loopback address, with an embedded Redis when
no `--redis` is given, and prints one line of live throughput per interval until `--duration` has passed or
Ctrl-C; every process is reaped on the way out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from elastream.cli import CommandError
from elastream.control.backends.local import EmbeddedRedis, LocalCluster
from elastream.control.controller import TopologyController
from elastream.control.scaling import ScalingRecord
from elastream.core.outcomes import Outcome
from elastream.core.ports import BackendError
from elastream.core.topology import MAX_NODES, Topology, parse_manifest, read_manifest_document
from elastream.crd import load_manifest
from elastream.log_format import LOG_FORMAT_ENV, add_log_format_argument, checked_log_format
from elastream.log_format import configure_logging as configure_log_lines
from elastream.store.drain_requests import DRAIN_GRACE_ENV
from elastream.store.registry import RedisUnavailable, Registry, redacted
from elastream.worker_inputs.keys import DataPlaneConfigError, keys_from_env
from elastream.worker_inputs.user_code import OperatorLoadError, load_class


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = subparsers.add_parser("run", help="run a topology locally: one worker process per node")
    run.add_argument("file", help="YAML file with one StreamTopology")
    run.add_argument("--nodes", type=int, default=None, help="node count (default: spec.nodes)")
    run.add_argument("--duration", type=float, default=None, help="seconds to run (default: until Ctrl-C)")
    run.add_argument("--redis", default=os.environ.get("ELASTREAM_REDIS_URL"), help="default: an embedded Redis")
    run.add_argument("--interval", type=float, default=1.0, help="metric interval in seconds (default 1)")
    run.add_argument(
        "--engine", choices=("spark", "python"), default="spark", help="metric analysis engine for scaling (spark)"
    )
    run.add_argument(
        "--archive",
        metavar="PATH",
        default=os.environ.get("ELASTREAM_METRICS_ARCHIVE") or None,
        help="append the metric samples to this Parquet archive (a directory or a Hadoop URI; "
        "default $ELASTREAM_METRICS_ARCHIVE, else none)",
    )
    run.add_argument(
        "--archive-every", type=float, default=10.0, metavar="S", help="seconds between archive appends (10)"
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="P",
        help="serve the topology's Prometheus metrics (the operator's) at http://127.0.0.1:P/metrics, and each "
        "worker's at its node's loopback address and P (node-0: 127.0.0.2) (default 0: off)",
    )
    add_log_format_argument(run)
    run.set_defaults(func=cmd_run)

    demo = subparsers.add_parser("demo", help="run a topology locally, scale it out and in, report throughput")
    demo.add_argument("file", nargs="?", default=None, help="YAML file (default: examples/demo.yaml)")
    demo.add_argument("--redis", default=os.environ.get("ELASTREAM_REDIS_URL"), help="default: an embedded Redis")
    demo.add_argument("--phase", type=float, default=15.0, help="seconds to run before and after each scaling")
    demo.add_argument("--out", type=int, default=None, help="nodes after the scale-out (default: spec.nodes + 1)")
    demo.add_argument(
        "--in", dest="in_nodes", type=int, default=None, help="nodes after the scale-in (default: spec.nodes - 1)"
    )
    demo.add_argument("--engine", choices=("spark", "python"), default="spark", help="metric analysis engine")
    add_log_format_argument(demo)
    demo.set_defaults(func=cmd_demo)

    scale = subparsers.add_parser(
        "scale", help="ask a running `elastream run` to scale to --nodes N and/or new vertex degrees"
    )
    scale.add_argument("file", help="YAML file of the running StreamTopology")
    scale.add_argument("--nodes", type=int, default=None, help="node count after scaling (default: unchanged)")
    scale.add_argument(
        "--parallelism",
        action="append",
        default=[],
        metavar="VERTEX=K",
        help="set a vertex's parallelism (repeatable); the run migrates to it",
    )
    scale.add_argument("--redis", default=os.environ.get("ELASTREAM_REDIS_URL"), help="the run's Redis URL")
    scale.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the outcome")
    scale.set_defaults(func=cmd_scale)

    worker = subparsers.add_parser("worker", help="run one node's executors (started by a backend)")
    worker.add_argument("--topology", required=True, help="YAML file with the StreamTopology")
    worker.add_argument("--node", required=True, help="this node's name, e.g. node-0")
    worker.add_argument(
        "--redis",
        default=os.environ.get("ELASTREAM_REDIS_URL"),
        help="Redis URL: redis://[:PASSWORD@]HOST:PORT/DB, rediss://… (TLS), unix://PATH, "
        "redis+cluster://HOST:PORT[,HOST:PORT...] (a Redis Cluster; rediss+cluster:// for TLS) (default: "
        "$ELASTREAM_REDIS_URL, which keeps a password out of the process list)",
    )
    worker.add_argument(
        "--bind",
        default="127.0.0.1",
        help="HOST[:PORT] the executors' inboxes, /healthz and metrics listen on (0.0.0.0: every interface)",
    )
    worker.add_argument(
        "--advertise",
        default="",
        help="the address other workers reach this one at (needed when --bind listens on every interface; "
        "default: the --bind host)",
    )
    worker.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port")
    worker.add_argument(
        "--health-port", type=int, default=0, help="serve /healthz and /ready (executors ready) on this port"
    )
    worker.add_argument("--interval", type=float, default=1.0, help="metric interval in seconds")
    worker.add_argument("--redis-wait", type=float, default=300.0, help="seconds to retry Redis before giving up")
    worker.add_argument(
        "--schedule-version",
        type=int,
        default=0,
        help="start for this staged schedule version and idle until switched to it (a node a migration adds)",
    )
    worker.add_argument(
        "--drain-grace",
        default=os.environ.get(DRAIN_GRACE_ENV, "0"),
        help="seconds between SIGTERM and being killed: the first SIGTERM asks the controller to move this "
        f"node's executors off and waits for it within that (default ${DRAIN_GRACE_ENV}, else 0: no drains)",
    )
    add_log_format_argument(worker)
    worker.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from elastream.runtime.worker import ALL_INTERFACES, Worker, WorkerOptions, configure_logging

    if not args.redis:
        raise CommandError("--redis: no URL; pass one or set ELASTREAM_REDIS_URL")
    # The parser alone, within the reader's bounds: a worker's manifest is one its launcher checked against the
    # CRD already (the API server admitted it, or `elastream run` loaded it with `load_manifest`), and the CRD
    # check compiles its CEL rules, which cost every starting worker about half a second of CPU
    topology = parse_manifest(read_manifest_document(args.topology))
    host, _, port = args.bind.partition(":")
    if host in ALL_INTERFACES and not args.advertise:
        raise CommandError(
            f"--advertise: --bind {host} listens on every interface, so peers need the address to reach this "
            "worker at; pass --advertise HOST (on Kubernetes the pod IP, e.g. --advertise $(POD_IP))"
        )
    try:
        keys = keys_from_env()
    except DataPlaneConfigError as exc:
        raise CommandError(str(exc)) from None
    try:
        drain_grace = float(args.drain_grace)
    except ValueError:
        drain_grace = -1.0
    if not 0.0 <= drain_grace < 86400.0:
        raise CommandError(
            f"--drain-grace ({DRAIN_GRACE_ENV}): {args.drain_grace!r} is not a number of seconds; give the pod's "
            "terminationGracePeriodSeconds, or 0 for no drains"
        )
    configure_logging(args.node, log_format(args), topology)
    options = WorkerOptions(
        node=args.node,
        redis_url=args.redis,
        host=host,
        advertise=args.advertise,
        port=int(port or 0),
        metrics_port=args.metrics_port,
        interval_s=args.interval,
        redis_wait_s=args.redis_wait,
        manifest_dir=os.path.dirname(os.path.abspath(args.topology)),
        schedule_version=args.schedule_version,
        health_port=args.health_port,
        data_plane=keys,
        drain_grace_s=drain_grace,
    )
    return Worker(topology, options).run()


def log_format(args: argparse.Namespace) -> str:
    """`--log-format`, checked (its default comes from $ELASTREAM_LOG_FORMAT, which argparse does not check)."""
    try:
        return checked_log_format(args.log_format)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def local_log_lines(args: argparse.Namespace, topology: Topology) -> dict[str, str]:
    """`run`/`demo` with `--log-format json`: their log lines on stderr as JSON, each naming the topology (the
    level $ELASTREAM_LOG_LEVEL, else WARNING: the lines a text run shows); text leaves logging as it was. Returns
    the environment that makes its local workers log in the same format."""
    chosen = log_format(args)
    if chosen == "json":
        configure_log_lines(
            chosen,
            level=os.environ.get("ELASTREAM_LOG_LEVEL", "WARNING"),
            fields={"namespace": topology.namespace, "topology": topology.name},
        )
    return {LOG_FORMAT_ENV: chosen}


def check_operators(topology: Topology) -> None:
    """Load every user `module:Class` now, so a typo fails in one line before any process starts."""
    for vertex in topology.vertices.values():
        if "module" in vertex.config:
            try:
                load_class(vertex)
            except OperatorLoadError as exc:
                raise CommandError(str(exc)) from None


@contextmanager
def redis_for(url: str | None) -> Iterator[str]:
    """`url`, or an embedded Redis for the duration of the block."""
    if url:
        yield url
        return
    directory = tempfile.mkdtemp(prefix="elastream-redis-")
    embedded = EmbeddedRedis(directory)
    try:
        yield embedded.url
    finally:
        embedded.stop()
        shutil.rmtree(directory, ignore_errors=True)


def cmd_run(args: argparse.Namespace) -> int:
    from elastream.analysis import Analyzer
    from elastream.control.local_mode import local_controller
    from elastream.control.scaling import PrintEvents
    from elastream.control.topology_metrics import LocalTopologyMetrics, serve_local_metrics
    from elastream.store.registry import connect, store_manifest

    topology = load_manifest(args.file)
    if args.nodes is not None:
        topology = topology.with_nodes(args.nodes)
    check_operators(topology)
    worker_env = local_log_lines(args, topology)
    if args.archive_every <= 0:
        raise CommandError(f"--archive-every: {args.archive_every} is not a positive number of seconds; use e.g. 10")
    if not 0 <= args.metrics_port <= 65535:
        raise CommandError(f"--metrics-port: {args.metrics_port} is not a TCP port; use 1 to 65535 (0: off)")
    analyzer = Analyzer(engine=args.engine)
    # Spark starts and runs a first analysis while the workers come up, not at the first scaling request
    analyzer.start_warm_up(topology, report=lambda line: print(line, flush=True))
    with redis_for(args.redis) as url:
        try:
            cluster = LocalCluster(
                topology,
                os.path.abspath(args.file),
                url,
                interval_s=args.interval,
                extra_env=worker_env,
                metrics_port=args.metrics_port,
            )
            # the archive has its own connection: it makes a last pass after the cluster closed its client
            archive_client = connect(url, wait_s=10.0) if args.archive else None
        except (RedisUnavailable, BackendError) as exc:
            raise CommandError(str(exc)) from None
        store_manifest(cluster.client, topology)  # `elastream analyze --topology NAME` finds it there
        # the controller's events pass through its metrics (a planned rescale shows as phase Scaling)
        metrics = LocalTopologyMetrics(PrintEvents())
        controller = local_controller(
            topology,
            cluster,
            analyzer,
            events=metrics,
            archive=args.archive,
            archive_every_s=args.archive_every,
            archive_client=archive_client,
        )
        metrics.attach(controller)
        stop_metrics = None
        if args.metrics_port:
            try:
                stop_metrics = serve_local_metrics(metrics, args.metrics_port, cluster.client)
            except OSError as exc:
                cluster.close()
                if archive_client is not None:
                    archive_client.close()
                raise CommandError(
                    f"--metrics-port: 127.0.0.1:{args.metrics_port} cannot be served ({exc.strerror or exc}); "
                    "pick a free port"
                ) from None
        print(
            f"elastream run {topology.name}: {topology.nodes} nodes "
            f"({'embedded Redis' if not args.redis else redacted(url)}; worker logs in {cluster.run_dir})",
            flush=True,
        )
        print(f"scale it with: elastream scale {args.file} --redis {redacted(url)} --nodes N", flush=True)
        if args.archive:
            print(f"archiving metric samples to {redacted(args.archive)} every {args.archive_every:g} s", flush=True)
        if args.metrics_port:
            print(
                f"metrics at http://127.0.0.1:{args.metrics_port}/metrics, each worker's at its node's address "
                f"(node-0: http://127.0.0.2:{args.metrics_port}/metrics)",
                flush=True,
            )

        def on_tick(record: ScalingRecord | None) -> None:
            _print_scaling(analyzer, record)
            metrics.after_tick(record)

        try:
            with cluster, controller:
                metrics.refresh(started=False)  # Pending while the workers start
                controller.start()
                metrics.refresh()
                watch(controller, args.duration, on_tick=on_tick)
        except BackendError as exc:
            raise CommandError(str(exc)) from None
        finally:
            if stop_metrics is not None:
                stop_metrics()
            if controller.archiver is not None:
                archive_client.close()  # type: ignore[union-attr]
                print(
                    f"archived {getattr(controller.archiver, 'archived', 0)} metric samples to {args.archive}",
                    flush=True,
                )
    return 0


def _print_scaling(analyzer: Any, record: ScalingRecord | None) -> None:
    if record is not None:
        print_report(record.to_status())
        print(f"  analysis engine: {analyzer.engine_used or '-'}", flush=True)


def watch(
    controller: TopologyController,
    duration: float | None,
    on_tick: Callable[[ScalingRecord | None], None] | None = None,
) -> list[float]:
    """Tick the controller once per interval and print one line: total sink throughput, mean sink latency,
    then every vertex's processing rate. Returns the sink throughput of every interval."""
    topology, interval = controller.topology, controller.interval_s
    started = time.monotonic()
    throughputs: list[float] = []
    names = "  ".join(f"{v:>{max(8, len(v))}}" for v in topology.order)
    print(f"{'time':>6}  {'sinks/s':>9}  {'lat ms':>7}  {names}", flush=True)
    try:
        while duration is None or time.monotonic() - started < duration:
            time.sleep(interval)
            record = controller.tick()
            if on_tick is not None:
                on_tick(record)
            live = controller.live
            rates = live.rates()
            throughputs.append(live.throughput())
            cells = "  ".join(f"{rates[v]:>{max(8, len(v))}.1f}" for v in topology.order)
            elapsed = time.monotonic() - started
            print(f"{elapsed:>5.0f}s  {live.throughput():>9.1f}  {live.latency_ms():>7.1f}  {cells}", flush=True)
    except KeyboardInterrupt:
        print("stopping (Ctrl-C)", file=sys.stderr, flush=True)
        raise
    return throughputs


def default_demo_manifest() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in ("examples/demo.yaml", os.path.join(here, "..", "..", "..", "..", "examples", "demo.yaml")):
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    raise CommandError("no topology given and examples/demo.yaml not found; pass a manifest: elastream demo FILE")


def cmd_demo(args: argparse.Namespace) -> int:
    """Start, warm up, scale out, scale in, and report measured against predicted throughput."""
    from elastream.analysis import Analyzer
    from elastream.control.catch_up import measure_catch_up
    from elastream.control.local_mode import local_controller
    from elastream.core.rate_timeline import reference_phrase

    path = args.file or default_demo_manifest()
    topology = load_manifest(path)
    check_operators(topology)
    worker_env = local_log_lines(args, topology)
    out_nodes = args.out or topology.nodes + 1
    in_nodes = args.in_nodes or max(1, topology.nodes - 1)
    for flag, value in (("--out", out_nodes), ("--in", in_nodes)):
        if not 1 <= value <= MAX_NODES:
            raise CommandError(f"{flag}: {value} is outside [1, {MAX_NODES}]; ask for 1 to {MAX_NODES} nodes")
    analyzer = Analyzer(engine=args.engine)
    # the analysis session starts, and runs a first analysis, while the topology warms up
    warm = analyzer.start_warm_up(topology)
    rows: list[tuple[str, int, float, float | None, float | None, float | None, float | None, str]] = []
    with redis_for(args.redis) as url:
        try:
            cluster = LocalCluster(topology, path, url, interval_s=1.0, extra_env=worker_env)
        except (RedisUnavailable, BackendError) as exc:
            raise CommandError(str(exc)) from None
        controller = local_controller(topology, cluster, analyzer)
        print(
            f"elastream demo {topology.name}: {topology.nodes} nodes -> {out_nodes} -> {in_nodes}, "
            f"{args.phase:.0f} s per phase, strategy {topology.scaling.strategy}, migration "
            f"{topology.scaling.migration} (worker logs in {cluster.run_dir})",
            flush=True,
        )
        try:
            with cluster, controller:
                controller.start()
                seen = watch(controller, args.phase)
                rows.append(("start", topology.nodes, steady(seen), None, None, None, None, "-"))
                for label, nodes in (("scale-out", out_nodes), ("scale-in", in_nodes)):
                    warm.join()
                    record = controller.scale_to(nodes)
                    print_report(record.to_status())
                    last = getattr(controller.metrics, "last", None)
                    if last is not None:
                        print(
                            f"  analysis ({analyzer.engine_used}): "
                            + ", ".join(f"{v}{' (congested)' if last.congested[v] else ''}" for v in topology.order),
                            flush=True,
                        )
                    if record.outcome == Outcome.FAILED:
                        raise CommandError(record.reason or "scaling failed")
                    seen = watch(controller, args.phase)
                    found = measure_catch_up(
                        controller.feed, topology, record.started_at, resumed_at=record.finished_at
                    )
                    catch_up, stable = found.catch_up, found.stabilization
                    against = reference_phrase(found.reference, found.level_before, found.level_after)
                    print(
                        f"  after the {label}: catch-up {_seconds(catch_up)}, stabilization {_seconds(stable)} "
                        f"(sink output back to 90 % / within ±10 % of {against}"
                        + ("" if found.level_after is not None else "; the output has not settled yet")
                        + ")"
                        + (
                            "; congested before: the sources were offered more than they could emit"
                            if found.congested_before
                            else ""
                        ),
                        flush=True,
                    )
                    pause = record.report.get("pauseMs")
                    reference = "new level" if found.reference == "newLevel" else "before"
                    rows.append(
                        (label, nodes, steady(seen), record.predicted_throughput, pause, catch_up, stable, reference)
                    )
        except BackendError as exc:
            raise CommandError(str(exc)) from None
    print("\nphase       nodes   measured/s   predicted/s   pause   catch-up   stabilization   against")
    for label, nodes, measured, predicted, pause, catch_up, stable, reference in rows:
        shown = "-" if predicted is None else f"{predicted:.0f}"
        paused = "-" if pause is None else f"{pause:.0f} ms"
        print(
            f"{label:<10} {nodes:>6} {measured:>12.0f} {shown:>13} {paused:>7} {_seconds(catch_up):>10} "
            f"{_seconds(stable):>15}   {reference}"
        )
    print(
        "against: the level catch-up and stabilization are measured from: before = the sink output's level before\n"
        "         the request; new level = the level it settled at after the pause, more than 10 % away from\n"
        "         before (the scale changed what a congested topology delivers)"
    )
    return 0


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def steady(throughputs: list[float]) -> float:
    """Mean throughput over the second half of a phase (the first half holds the restart transient)."""
    tail = throughputs[len(throughputs) // 2 :]
    return sum(tail) / len(tail) if tail else 0.0


def print_report(status: dict[str, Any]) -> None:
    phases = status.get("phases") or {}
    shown = ", ".join(f"{k} {v:.0f}" for k, v in phases.items() if v is not None)
    print(
        f"  {status.get('migration')}: {status.get('outcome')}"
        + (f" ({shown})" if shown else "")
        + (f", {status['capturedEvents']} events captured" if status.get("capturedEvents") is not None else "")
        + (f"; {status['reason']}" if status.get("reason") else ""),
        flush=True,
    )


def parse_parallelism(topology: Topology, items: list[str]) -> dict[str, int]:
    """`--parallelism VERTEX=K` arguments as {vertex: K}, each checked against the manifest."""
    result: dict[str, int] = {}
    for item in items:
        vertex, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise CommandError(f"--parallelism: {item!r} is not VERTEX=K; write e.g. --parallelism parse=4")
        if vertex not in topology.vertices:
            known = ", ".join(topology.order)
            raise CommandError(f"--parallelism: {vertex!r} is not a vertex of {topology.name}; use one of: {known}")
        k, bound = int(value), topology.vertices[vertex].max_parallelism
        if not 1 <= k <= bound:
            raise CommandError(f"--parallelism: {vertex}={k} is outside [1, {bound}] (its maxParallelism)")
        result[vertex] = k
    return result


def cmd_scale(args: argparse.Namespace) -> int:
    from elastream.control.local_mode import scale_request_key, status_key
    from elastream.store.registry import connect

    topology = load_manifest(args.file)
    parallelism = parse_parallelism(topology, args.parallelism)
    if args.nodes is None and not parallelism:
        raise CommandError("--nodes or --parallelism: give at least one (e.g. --nodes 3 or --parallelism parse=4)")
    if args.nodes is not None and not 1 <= args.nodes <= MAX_NODES:
        raise CommandError(f"--nodes: {args.nodes} is outside [1, {MAX_NODES}]; ask for 1 to {MAX_NODES} nodes")
    if not args.redis:
        raise CommandError("--redis: no URL; pass the one `elastream run` printed (or set ELASTREAM_REDIS_URL)")
    try:
        client = connect(args.redis, wait_s=5.0)
    except RedisUnavailable as exc:
        raise CommandError(str(exc)) from None
    nodes = args.nodes
    if nodes is None:
        running = Registry(client, topology.redis_prefix).schedule()
        if running is None:
            raise CommandError(
                f"{topology.name} is not running on {redacted(args.redis)}; start `elastream run {args.file}`"
            )
        nodes = len(running[1].nodes)
    client.delete(status_key(topology, "lastScaling"))
    client.set(scale_request_key(topology), json.dumps({"nodes": nodes, "parallelism": parallelism or None}))
    asked = f"{nodes} nodes" + (
        f", parallelism {', '.join(f'{v}={k}' for v, k in parallelism.items())}" if parallelism else ""
    )
    print(f"asked {topology.name} to scale to {asked}; waiting for the outcome", flush=True)
    deadline = time.monotonic() + args.timeout
    announced = False
    while time.monotonic() < deadline:
        raw = client.get(status_key(topology, "lastScaling"))
        if raw is not None:
            status = json.loads(raw)
            if status.get("catchUp") == "measuring":  # migrated; the run measures catch-up and stabilization
                if not announced:
                    print(f"{status.get('outcome')}; measuring catch-up and stabilization", flush=True)
                    announced = True
                time.sleep(0.5)
                continue
            print(json.dumps(status, indent=2))
            return 0 if status.get("outcome") in (Outcome.SUCCEEDED, Outcome.UNCHANGED) else 1
        time.sleep(0.5)
    raise CommandError(f"no outcome after {args.timeout:.0f} s; is `elastream run {args.file}` running on that Redis?")
