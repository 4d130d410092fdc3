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
from elastream.control.backends.local import EmbeddedRedis, LocalBackendError, LocalCluster
from elastream.control.monitor import LiveRates
from elastream.control.recovery import RecoveryFollowUp, measure_recovery
from elastream.core.schedule import initial_schedule
from elastream.core.topology import Topology, load_manifest
from elastream.runtime.operators import OperatorLoadError, load_class
from elastream.store.metric_stream import MetricStream
from elastream.store.registry import RedisUnavailable


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
    demo.set_defaults(func=cmd_demo)

    scale = subparsers.add_parser("scale", help="ask a running `elastream run` to scale to --nodes N")
    scale.add_argument("file", help="YAML file of the running StreamTopology")
    scale.add_argument("--nodes", type=int, required=True, help="node count after scaling")
    scale.add_argument("--redis", default=os.environ.get("ELASTREAM_REDIS_URL"), help="the run's Redis URL")
    scale.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the outcome")
    scale.set_defaults(func=cmd_scale)

    worker = subparsers.add_parser("worker", help="run one node's executors (started by a backend)")
    worker.add_argument("--topology", required=True, help="YAML file with the StreamTopology")
    worker.add_argument("--node", required=True, help="this node's name, e.g. node-0")
    worker.add_argument(
        "--redis",
        default=os.environ.get("ELASTREAM_REDIS_URL"),
        help="Redis URL: redis://[:PASSWORD@]HOST:PORT/DB, rediss://… (TLS), unix://PATH (default: "
        "$ELASTREAM_REDIS_URL, which keeps a password out of the process list)",
    )
    worker.add_argument("--bind", default="127.0.0.1", help="HOST[:PORT] for the executors' inboxes")
    worker.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port")
    worker.add_argument("--interval", type=float, default=1.0, help="metric interval in seconds")
    worker.add_argument("--redis-wait", type=float, default=300.0, help="seconds to retry Redis before giving up")
    worker.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from elastream.runtime.worker import Worker, WorkerOptions, configure_logging

    if not args.redis:
        raise CommandError("--redis: no URL; pass one or set ELASTREAM_REDIS_URL")
    topology = load_manifest(args.topology)
    host, _, port = args.bind.partition(":")
    configure_logging(args.node)
    options = WorkerOptions(
        node=args.node,
        redis_url=args.redis,
        host=host,
        port=int(port or 0),
        metrics_port=args.metrics_port,
        interval_s=args.interval,
        redis_wait_s=args.redis_wait,
        manifest_dir=os.path.dirname(os.path.abspath(args.topology)),
    )
    return Worker(topology, options).run()


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
    from elastream.store.registry import store_manifest

    topology = load_manifest(args.file)
    if args.nodes is not None:
        topology = topology.with_nodes(args.nodes)
    check_operators(topology)
    if args.archive_every <= 0:
        raise CommandError(f"--archive-every: {args.archive_every} is not a positive number of seconds; use e.g. 10")
    schedule = initial_schedule(topology)
    analyzer = Analyzer(engine=args.engine)
    # Spark starts and runs a first analysis while the workers come up, not at the first scaling request
    analyzer.start_warm_up(topology, report=lambda line: print(line, flush=True))
    with redis_for(args.redis) as url:
        try:
            cluster = LocalCluster(topology, os.path.abspath(args.file), url, interval_s=args.interval)
        except RedisUnavailable as exc:
            raise CommandError(str(exc)) from None
        store_manifest(cluster.client, topology)  # `elastream analyze --topology NAME` finds it there
        print(
            f"elastream run {topology.name}: {len(schedule)} executors on {len(schedule.nodes)} nodes "
            f"({'embedded Redis' if not args.redis else url}; worker logs in {cluster.run_dir})",
            flush=True,
        )
        print(f"scale it with: elastream scale {args.file} --redis {url} --nodes N", flush=True)
        archiver = None
        if args.archive:  # its own connection: it makes a last pass after the cluster closed its client
            from elastream.control.metrics import MetricArchiver
            from elastream.store.registry import connect

            try:
                archive_client = connect(url, wait_s=10.0)
            except RedisUnavailable as exc:
                raise CommandError(str(exc)) from None
            archiver = MetricArchiver(archive_client, topology, args.archive, analyzer, every_s=args.archive_every)
            archiver.start()
            print(f"archiving metric samples to {args.archive} every {args.archive_every:g} s", flush=True)
        try:
            with cluster:
                cluster.start(schedule)
                checkpointer = periodic_checkpoints(cluster, topology)
                try:
                    ticks = scale_requests(cluster, topology, analyzer)
                    watch(cluster, topology, args.duration, args.interval, on_tick=ticks)
                finally:
                    checkpointer.stop()
        except LocalBackendError as exc:
            raise CommandError(str(exc)) from None
        finally:
            if archiver is not None:  # after the workers stopped: their last samples are archived too
                total = archiver.stop()
                archiver.client.close()
                print(f"archived {total} metric samples to {args.archive}", flush=True)
    return 0


def watch(
    cluster: LocalCluster,
    topology: Topology,
    duration: float | None,
    interval: float,
    on_tick: Callable[[], None] | None = None,
) -> list[float]:
    """Print one line per interval: total sink throughput, then every vertex's processing rate. Returns the
    sink throughput of every interval."""
    stream = MetricStream(cluster.client, topology.redis_prefix)
    live = LiveRates(topology, stale_s=3 * interval)
    started = time.monotonic()
    since = time.time()
    throughputs: list[float] = []
    names = "  ".join(f"{v:>{max(8, len(v))}}" for v in topology.order)
    print(f"{'time':>6}  {'sinks/s':>9}  {'lat ms':>7}  {names}", flush=True)
    try:
        while duration is None or time.monotonic() - started < duration:
            time.sleep(interval)
            if on_tick is not None:
                on_tick()
            cluster.check_alive()
            samples = stream.read_since(since)
            if samples:
                since = max(s.ts for s in samples) + 0.001
                live.add(samples)
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
    from elastream.control.metrics import StreamMetricSource
    from elastream.control.scaling import ScalingController

    path = args.file or default_demo_manifest()
    topology = load_manifest(path)
    check_operators(topology)
    out_nodes = args.out or topology.nodes + 1
    in_nodes = args.in_nodes or max(1, topology.nodes - 1)
    interval = 1.0
    analyzer = Analyzer(engine=args.engine)
    # the analysis session starts, and runs a first analysis, while the topology warms up
    warm = analyzer.start_warm_up(topology)
    rows: list[tuple[str, int, float, float | None, float | None, float | None]] = []
    with redis_for(args.redis) as url:
        try:
            cluster = LocalCluster(topology, path, url, interval_s=interval)
        except RedisUnavailable as exc:
            raise CommandError(str(exc)) from None
        metrics = StreamMetricSource(cluster.client, topology, analyzer, interval)
        controller = ScalingController(topology, migrating_backend(cluster, topology), metrics)
        print(
            f"elastream demo {topology.name}: {topology.nodes} nodes -> {out_nodes} -> {in_nodes}, "
            f"{args.phase:.0f} s per phase, strategy {topology.scaling.strategy} (worker logs in {cluster.run_dir})",
            flush=True,
        )
        try:
            with cluster:
                cluster.start(initial_schedule(topology))
                checkpointer = periodic_checkpoints(cluster, topology)
                metrics.not_before = time.time() + 2 * interval  # skip the start-up transient
                seen = watch(cluster, topology, args.phase, interval)
                rows.append(("start", topology.nodes, steady(seen), None, None, None))
                for label, nodes in (("scale-out", out_nodes), ("scale-in", in_nodes)):
                    warm.join()
                    record = controller.scale_to(nodes)
                    print_report(record.to_status())
                    if metrics.last is not None:
                        print(
                            f"  analysis ({analyzer.engine_used}): "
                            + ", ".join(
                                f"{v}{' (congested)' if metrics.last.congested[v] else ''}" for v in topology.order
                            ),
                            flush=True,
                        )
                    if record.outcome == "failed":
                        raise CommandError(record.reason or "scaling failed")
                    metrics.not_before = time.time() + 2 * interval
                    seen = watch(cluster, topology, args.phase, interval)
                    catch_up, stable = measure_recovery(cluster.client, topology, record.started_at, bucket_s=interval)
                    print(
                        f"  recovery after the {label}: catch-up {_seconds(catch_up)}, "
                        f"stabilization {_seconds(stable)} (sink output back to 90 % / within ±10 % of before)",
                        flush=True,
                    )
                    rows.append((label, nodes, steady(seen), record.predicted_throughput, catch_up, stable))
                checkpointer.stop()
        except LocalBackendError as exc:
            raise CommandError(str(exc)) from None
    print("\nphase       nodes   measured/s   predicted/s   catch-up   stabilization")
    for label, nodes, measured, predicted, catch_up, stable in rows:
        shown = "-" if predicted is None else f"{predicted:.0f}"
        print(f"{label:<10} {nodes:>6} {measured:>12.0f} {shown:>13} {_seconds(catch_up):>10} {_seconds(stable):>15}")
    return 0


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def steady(throughputs: list[float]) -> float:
    """Mean throughput over the second half of a phase (the first half holds the restart transient)."""
    tail = throughputs[len(throughputs) // 2 :]
    return sum(tail) / len(tail) if tail else 0.0


def periodic_checkpoints(cluster: LocalCluster, topology: Topology) -> Any:
    """Start taking a checkpoint every `spec.scaling.checkpointIntervalSeconds` (what `restart` restores
    and what a dead worker's topology rolls back to)."""
    from elastream.control.checkpoints import CheckpointDriver, Checkpointer

    driver = CheckpointDriver(topology, cluster, cluster.client)
    return Checkpointer(driver, float(topology.scaling.checkpoint_interval_s)).start()


def migrating_backend(cluster: LocalCluster, topology: Topology) -> Any:
    from elastream.control.migration import MigratingBackend, MigrationDriver
    from elastream.control.scaling import PrintEvents

    driver = MigrationDriver(topology, cluster, cluster.client, events=PrintEvents())
    return MigratingBackend(cluster, driver, topology.scaling.migration)  # type: ignore[arg-type]


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


def scale_request_key(topology: Topology) -> str:
    return f"{topology.redis_prefix}scale-request"


def last_scaling_key(topology: Topology) -> str:
    return f"{topology.redis_prefix}last-scaling"


def scale_requests(cluster: LocalCluster, topology: Topology, analyzer: Any = None) -> Callable[[], None]:
    """A tick handler for `run`: carry out `elastream scale` requests found in Redis (analyse with `analyzer`,
    the run's warm one; plan, migrate) and publish the outcome where `elastream scale` waits for it."""
    from elastream.analysis import Analyzer
    from elastream.control.metrics import StreamMetricSource
    from elastream.control.scaling import ScalingController

    analyzer = analyzer if analyzer is not None else Analyzer()
    metrics = StreamMetricSource(cluster.client, topology, analyzer, cluster.interval_s)
    controller = ScalingController(topology, migrating_backend(cluster, topology), metrics)
    recovery = RecoveryFollowUp(cluster.client, topology, bucket_s=cluster.interval_s)

    def publish(status: dict[str, Any]) -> None:
        cluster.client.set(last_scaling_key(topology), json.dumps(status, default=str))

    def recovered(status: dict[str, Any]) -> None:
        print(
            f"  recovery: catch-up {_seconds(_ms_to_s(status['catchUpMs']))}, "
            f"stabilization {_seconds(_ms_to_s(status['stabilizationMs']))} ({status['recovery']})",
            flush=True,
        )
        publish(status)

    def tick() -> None:
        recovery.tick()
        raw = cluster.client.getdel(scale_request_key(topology))
        if raw is None:
            return
        nodes = int(raw)
        record = controller.scale_to(nodes)
        print_report(record.to_status())
        print(f"  analysis engine: {analyzer.engine_used or '-'}", flush=True)
        metrics.not_before = time.time() + 2 * cluster.interval_s
        status = {**record.to_status(), "requestedNodes": nodes, "analysisEngine": analyzer.engine_used}
        if record.outcome == "succeeded":
            recovery.follow(status, record.started_at, recovered)  # catch-up and stabilization, on later ticks
        publish(status)

    return tick


def _ms_to_s(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def cmd_scale(args: argparse.Namespace) -> int:
    from elastream.store.registry import connect

    topology = load_manifest(args.file)
    if args.nodes < 1:
        raise CommandError(f"--nodes: {args.nodes} is below 1; ask for at least 1 node")
    if not args.redis:
        raise CommandError("--redis: no URL; pass the one `elastream run` printed (or set ELASTREAM_REDIS_URL)")
    try:
        client = connect(args.redis, wait_s=5.0)
    except RedisUnavailable as exc:
        raise CommandError(str(exc)) from None
    client.delete(last_scaling_key(topology))
    client.set(scale_request_key(topology), str(args.nodes))
    print(f"asked {topology.name} to scale to {args.nodes} nodes; waiting for the outcome", flush=True)
    deadline = time.monotonic() + args.timeout
    announced = False
    while time.monotonic() < deadline:
        raw = client.get(last_scaling_key(topology))
        if raw is not None:
            status = json.loads(raw)
            if status.get("recovery") == "measuring":  # migrated; the run measures catch-up and stabilization
                if not announced:
                    print(f"{status.get('outcome')}; measuring catch-up and stabilization", flush=True)
                    announced = True
                time.sleep(0.5)
                continue
            print(json.dumps(status, indent=2))
            return 0 if status.get("outcome") in ("succeeded", "unchanged") else 1
        time.sleep(0.5)
    raise CommandError(f"no outcome after {args.timeout:.0f} s; is `elastream run {args.file}` running on that Redis?")
