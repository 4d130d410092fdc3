"""`elastream analyze`: the newest window of metric samples -> snapshot, congestion, ETP and ETPSum.

Samples come from the topology's Redis metric stream (`--redis`) or a Parquet archive (`--parquet`, a local
path or any Hadoop URI). `--topology` is a manifest file or the name (NAME or NAMESPACE/NAME) of a topology
`elastream run` started, whose manifest it keeps in Redis. The analysis runs on Spark
(`ELASTREAM_SPARK_MASTER`, default local[*]) and falls back to the Python reference, with a warning, when
Spark cannot start or fails on a window; `--engine python` skips Spark.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING

from elastream.analysis import Analyzer, SparkUnavailable
from elastream.analysis.session import spark_error_reason
from elastream.cli import CommandError, print_table
from elastream.core.metrics import MetricSample
from elastream.core.topology import Topology
from elastream.core.window_analysis import Analysis, check_window_args
from elastream.crd import check_manifest, load_manifest
from elastream.store.registry import client_for, redacted

if TYPE_CHECKING:
    import redis


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    analyze = subparsers.add_parser("analyze", help="analyse the newest window of metric samples (Spark)")
    analyze.add_argument("--redis", metavar="URL", help="Redis holding the metric stream, e.g. redis://host:6379/0")
    analyze.add_argument(
        "--topology",
        required=True,
        metavar="FILE|NAME",
        help="YAML file with one StreamTopology, or the name of one `elastream run` runs on --redis",
    )
    analyze.add_argument("--window", type=int, default=None, help="intervals per window (default spec.scaling.window)")
    analyze.add_argument("--interval", type=float, default=1.0, metavar="S", help="sample interval in s (1.0)")
    analyze.add_argument("--congestion-rate", type=float, default=None, help="default: spec.scaling.congestionRate")
    analyze.add_argument("--parquet", metavar="PATH", help="read samples from this Parquet archive instead of Redis")
    analyze.add_argument("--engine", choices=("spark", "python"), default="spark", help="spark (default) or python")
    analyze.add_argument("--json", action="store_true", help="print the snapshot and ETP table as JSON")
    analyze.set_defaults(func=cmd_analyze)


def _redis_client(url: str) -> redis.Redis:
    try:
        return client_for(url, socket_connect_timeout=3, socket_timeout=10)
    except ValueError:
        # not the exception's text: redis-py's reasons quote pieces of the URL, a password's among them
        raise CommandError(
            f"--redis: {redacted(url)} is not a Redis URL; use redis://[user:password@]host:6379/0 "
            "(redis+cluster://host:port for a Redis Cluster)"
        ) from None


def _unreachable(url: str, exc: Exception) -> CommandError:
    return CommandError(
        f"cannot reach Redis at {redacted(url)}: {str(exc).rstrip('.')}; check --redis and that Redis is up"
    )


def resolve_topology(spec: str, url: str | None) -> Topology:
    """`--topology`: a manifest file, else a name whose manifest `elastream run` stored in Redis."""
    if os.path.exists(spec) or spec.endswith((".yaml", ".yml", ".json")):
        return load_manifest(spec)
    if not url:
        raise CommandError(
            f"--topology: {spec} is not a file; give the manifest file, or --redis URL to look up the topology "
            f"{spec} that `elastream run` runs there"
        )
    import redis
    from redis.exceptions import RedisClusterException

    from elastream.store.registry import manifest_key, stored_manifest

    client = _redis_client(url)
    try:
        document = stored_manifest(client, spec)
    except (redis.RedisError, RedisClusterException) as exc:
        raise _unreachable(url, exc) from None
    finally:
        client.close()
    if document is None:
        raise CommandError(
            f"--topology: no topology {spec} in Redis at {redacted(url)} (no key {manifest_key(spec)}); pass its "
            f"manifest file, or start it there with `elastream run FILE --redis {redacted(url)}` (NAMESPACE/NAME "
            "outside default)"
        )
    return check_manifest(document)


def _read_redis(url: str, topology: Topology, window: int, interval_s: float) -> list[MetricSample]:
    import redis
    from redis.exceptions import RedisClusterException

    from elastream.analysis.sources import read_hot_window
    from elastream.store.metric_stream import MetricStream

    client = _redis_client(url)
    try:
        return read_hot_window(MetricStream(client, topology.redis_prefix), window, interval_s)
    except (redis.RedisError, RedisClusterException) as exc:
        raise _unreachable(url, exc) from None
    finally:
        client.close()


def cmd_analyze(args: argparse.Namespace) -> int:
    topology = resolve_topology(args.topology, args.redis)
    window = args.window if args.window is not None else topology.scaling.window
    rate = args.congestion_rate if args.congestion_rate is not None else topology.scaling.congestion_rate
    try:
        check_window_args(window, args.interval, rate)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if not args.redis and not args.parquet:
        raise CommandError("no samples: give --redis URL (the metric stream) or --parquet PATH (an archive)")
    analyzer = Analyzer(args.engine)
    logger = logging.getLogger("elastream.analysis")
    quiet = logger.disabled
    logger.disabled = True  # the fallback warning is printed once below, as `warning:`
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if args.parquet:
                analysis = _analyze_parquet(analyzer, topology, args.parquet, window, args.interval, rate)
            else:
                samples = _read_redis(args.redis, topology, window, args.interval)
                analysis = analyzer.analyze(
                    topology, samples, window=window, interval_s=args.interval, congestion_rate=rate
                )
    finally:
        logger.disabled = quiet
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    if args.json:
        print(json.dumps(analysis.to_dict(topology), indent=2, sort_keys=True))
    else:
        print_analysis(topology, analysis, analyzer.engine_used or args.engine)
    return 0


def _analyze_parquet(
    analyzer: Analyzer, topology: Topology, path: str, window: int, interval_s: float, rate: float
) -> Analysis:
    spark = analyzer.spark()
    try:
        if spark is not None:
            from elastream.analysis.sources import read_parquet

            frame = read_parquet(spark, path)
            return analyzer.analyze(topology, frame, window=window, interval_s=interval_s, congestion_rate=rate)
        from elastream.analysis.sources import read_parquet_local

        samples = read_parquet_local(path)
    except CommandError:
        raise
    except SparkUnavailable as exc:  # Spark started but failed on the archive
        raise CommandError(str(exc)) from None
    except Exception as exc:
        if "PATH_NOT_FOUND" in str(exc) or isinstance(exc, FileNotFoundError):
            raise CommandError(f"--parquet: {path} does not exist; check the path") from None
        raise CommandError(f"--parquet: cannot read {path}: {spark_error_reason(exc)}") from None
    return analyzer.analyze(topology, samples, window=window, interval_s=interval_s, congestion_rate=rate)


def print_analysis(topology: Topology, analysis: Analysis, engine: str) -> None:
    snap = analysis.snapshot
    print(
        f"topology {topology.name}: window ({analysis.window_start:.3f}, {analysis.window_end:.3f}] s, "
        f"{analysis.samples_used} samples, engine {engine}"
    )
    print_table(
        [
            ("vertex", "<20"),
            ("executors", ">9"),
            ("input/s", ">12.1f"),
            ("processing/s", ">13.1f"),
            ("busy", ">6.1%"),
            ("trend/s²", ">9.2f"),
            ("congested", ">9"),
            ("ETP", ">8.1%"),
        ],
        (
            (
                name,
                snap.vertices[name].executors,
                snap.vertices[name].input_rate or 0.0,
                snap.vertices[name].processing_rate,
                snap.vertices[name].busy_fraction or 0.0,
                snap.vertices[name].input_trend or 0.0,
                "yes" if analysis.congested[name] else "no",
                analysis.etp[name],
            )
            for name in topology.order
        ),
    )
    throughput = sum(snap.vertices[s].processing_rate for s in topology.sinks)
    print(f"throughput (sum of sinks): {throughput:.1f} tuples/s")
    if analysis.node_etp_sum:
        print_table(
            [("node", "<20"), ("executors", ">9"), ("ETPSum", ">8.3f")],
            ((node, len(snap.placement[node]), total) for node, total in analysis.node_etp_sum.items()),
        )
    else:
        print("no executor reported in the window")
