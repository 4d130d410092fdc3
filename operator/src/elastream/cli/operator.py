"""`elastream operator`: the Kubernetes operator (what the chart's Deployment runs)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from elastream.cli import CommandError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("operator", help="run the Kubernetes operator for StreamTopology resources")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace (the default)")
    parser.add_argument(
        "--redis",
        default=os.environ.get("ELASTREAM_REDIS_URL"),
        help="Redis URL (default $ELASTREAM_REDIS_URL, which keeps a password out of the process list)",
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--standalone", action="store_true", help="one replica, no peering (the default)")
    peering.add_argument(
        "--peering", default=None, help="kopf peering name, for more than one replica (one is active at a time)"
    )
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (0: off)")
    parser.add_argument("--health-port", type=int, default=8081, help="liveness endpoint /healthz port (0: off)")
    parser.add_argument(
        "--worker-image",
        default=os.environ.get("ELASTREAM_WORKER_IMAGE", "elastream-worker:dev"),
        help="worker image when a topology's spec.image is empty (default $ELASTREAM_WORKER_IMAGE)",
    )
    parser.add_argument("--engine", choices=("spark", "python"), default="spark", help="metric analysis engine")
    parser.add_argument(
        "--listen-on-pod-ip",
        action="store_true",
        help="metrics, health and the worker pods listen on the pod IP ($POD_IP) instead of every interface: "
        "for clusters whose pods share the host's network (the chart's listenOnPodIP)",
    )
    parser.add_argument(
        "--worker-start-timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="how long worker pods may take to be scheduled and ready before a start or scale fails (180)",
    )
    parser.set_defaults(func=cmd_operator)


def cmd_operator(args: argparse.Namespace) -> int:
    import importlib

    if not args.redis:
        raise CommandError("--redis: no URL; pass one or set ELASTREAM_REDIS_URL (the chart sets it from a Secret)")
    logging.basicConfig(
        level=os.environ.get("ELASTREAM_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # loaded only for this command: kopf (which only `elastream.handlers` imports) stays out of every other one
    main = importlib.import_module("elastream.handlers.main")
    return int(main.run(operator_options(args)))


def operator_options(args: argparse.Namespace) -> Any:
    """The parsed command line as `elastream.handlers.main.OperatorOptions`."""
    import importlib

    if not 0 < args.worker_start_timeout <= 3600:
        raise CommandError(f"--worker-start-timeout: {args.worker_start_timeout:g} s; give 1 to 3600 seconds")
    main = importlib.import_module("elastream.handlers.main")
    return main.OperatorOptions(
        redis_url=args.redis,
        namespaces=tuple(args.namespace),
        standalone=args.peering is None,
        peering=args.peering,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        worker_image=args.worker_image,
        engine=args.engine,
        listen_on_pod_ip=args.listen_on_pod_ip,
        worker_start_timeout_s=args.worker_start_timeout,
    )
