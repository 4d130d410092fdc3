"""`elastream operator`: the Kubernetes operator (what the chart's Deployment runs)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from elastream import DEFAULT_WORKER_IMAGE
from elastream.cli import CommandError
from elastream.control.backends.worker_objects import PlacementPolicy
from elastream.control.leader import LEASE_NAME, LeaderElection
from elastream.control.operator_options import OperatorOptions, worker_policy, worker_settings_from_env
from elastream.log_format import add_log_format_argument, checked_log_format, configure_logging


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
    # kopf always runs standalone now (leader election decides which replica acts); accepted, so a manifest
    # or chart that still passes it keeps working
    parser.add_argument("--standalone", action="store_true", help=argparse.SUPPRESS)
    election = parser.add_argument_group(
        "leader election",
        "With more than one replica exactly one acts: the one holding the coordination.k8s.io Lease "
        f"{LEASE_NAME!r}; a standby takes over within a lease duration when it dies, at once when it stops.",
    )
    election.add_argument(
        "--leader-elect",
        action="store_true",
        help="acquire the Lease before acting, and exit when it is lost (off: this process acts alone, at once)",
    )
    election.add_argument(
        "--leader-elect-lease-duration",
        type=int,
        default=15,
        metavar="SECONDS",
        help="how long a standby waits, after the Lease was last renewed, before taking it (15)",
    )
    election.add_argument(
        "--leader-elect-renew-deadline",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long the leader keeps acting without renewing before it exits; below the lease duration (10)",
    )
    election.add_argument(
        "--leader-elect-retry-period",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often a standby tries to acquire and the leader renews (2)",
    )
    election.add_argument(
        "--leader-elect-namespace",
        default=os.environ.get("POD_NAMESPACE") or "default",
        metavar="NAMESPACE",
        help="the Lease's namespace (default $POD_NAMESPACE, else default); the identity is $POD_NAME, "
        "else <hostname>-<pid>-<random>",
    )
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (0: off)")
    parser.add_argument("--health-port", type=int, default=8081, help="liveness endpoint /healthz port (0: off)")
    parser.add_argument(
        "--worker-image",
        default=os.environ.get("ELASTREAM_WORKER_IMAGE", DEFAULT_WORKER_IMAGE),
        help="worker image when a topology's spec.image is empty (default $ELASTREAM_WORKER_IMAGE, else "
        f"{DEFAULT_WORKER_IMAGE})",
    )
    parser.add_argument(
        "--worker-image-pull-policy",
        choices=("Always", "IfNotPresent", "Never"),
        default="IfNotPresent",
        help="imagePullPolicy of every worker pod (IfNotPresent)",
    )
    parser.add_argument(
        "--worker-image-pull-secret",
        action="append",
        default=[],
        metavar="SECRET",
        help="a Secret in the topology's namespace the kubelet pulls worker images with (repeatable)",
    )
    parser.add_argument(
        "--allowed-image",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a worker image a topology's spec.image may name (repeatable; none: any): a repository (any tag or "
        "digest of it), a path ending in / (every image under it) or a glob with * ; anything else is InvalidSpec",
    )
    parser.add_argument(
        "--worker-placement",
        default=os.environ.get("ELASTREAM_WORKER_PLACEMENT") or None,
        metavar="JSON",
        help='what a topology\'s spec.placement may ask for, as JSON: {"allowedTolerations": [{"key": GLOB, '
        '"value": GLOB, "effect": EFFECT}], "allowedNodeSelectorKeys": [GLOB], "allowAffinity": BOOL}; '
        "anything else is refused, and the control plane's taints always (default $ELASTREAM_WORKER_PLACEMENT, the "
        "chart's worker.placement; unset: the not-ready/unreachable tolerations, zone, region, arch, os and "
        "instance-type labels, affinity within the topology's namespace)",
    )
    parser.add_argument(
        "--network-policies",
        action="store_true",
        help="keep a NetworkPolicy <topology>-workers per topology: its worker pods accept traffic from its own "
        "worker pods only, and their metrics port from --metrics-from",
    )
    parser.add_argument(
        "--metrics-from",
        default="[]",
        metavar="JSON",
        help="with --network-policies: who may scrape the workers' metrics port, a JSON list of NetworkPolicy "
        'peers, e.g. \'[{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": '
        '"prometheus"}}}]\' (default none)',
    )
    parser.add_argument(
        "--redis-topology-users",
        choices=("on", "off"),
        default=os.environ.get("ELASTREAM_REDIS_TOPOLOGY_USERS", "on"),
        help="give each topology's workers a Redis ACL user of its own, its keys only (on, the default; needs "
        "+acl rights for the operator's Redis user on every node); off: workers get the operator's Redis URL "
        "(default $ELASTREAM_REDIS_TOPOLOGY_USERS, else on)",
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
    parser.add_argument(
        "--reconcile-workers",
        type=int,
        default=8,
        metavar="N",
        help="reconcile passes doing work at once, shared by every topology; a pass that waits (pods not ready, "
        "a migration's barriers) gives its slot back while it waits (8)",
    )
    parser.add_argument(
        "--waiting-passes",
        type=int,
        default=256,
        metavar="N",
        help="passes that may wait at once beside them, each on a thread of its own; past this, passes queue "
        "for a thread (256)",
    )
    parser.add_argument(
        "--status-every",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="seconds between status writes for the rates alone; other changes are written at once (15)",
    )
    parser.add_argument(
        "--worker-grace-period",
        type=int,
        default=30,
        metavar="SECONDS",
        help="worker pods' terminationGracePeriodSeconds: a worker told to stop (eviction, node drain, kubectl "
        "delete pod) has this long for its executors to be moved off by CCR before it is killed (30)",
    )
    parser.add_argument(
        "--drains",
        choices=("on", "off"),
        default="on",
        help="on SIGTERM, workers ask for a graceful drain (their executors moved off by CCR, nothing replayed); "
        "off: they stop at once and the topology rolls back to the last checkpoint (on)",
    )
    parser.add_argument(
        "--disruption-budgets",
        choices=("on", "off"),
        default="on",
        help="keep a PodDisruptionBudget <topology>-workers (maxUnavailable 1) per topology, so evictions (kubectl "
        "drain) take one worker at a time (on; needs policy/poddisruptionbudgets rights)",
    )
    add_log_format_argument(parser)  # the operator's lines, kopf's and its worker pods' (the chart's logFormat)
    parser.set_defaults(func=cmd_operator)


def cmd_operator(args: argparse.Namespace) -> int:
    import importlib

    if not args.redis:
        raise CommandError("--redis: no URL; pass one or set ELASTREAM_REDIS_URL (the chart sets it from a Secret)")
    from elastream.worker_inputs.keys import DataPlaneConfigError, auth_enabled

    try:
        auth_enabled()  # what the worker pods get: a typo fails here, not in every pod
    except DataPlaneConfigError as exc:
        raise CommandError(str(exc)) from None
    options = operator_options(args)
    # before kopf is imported and runs: its lines go through this handler too (`elastream.handlers.main`)
    configure_logging(options.worker.log_format)
    # loaded only for this command: kopf (which only `elastream.handlers` imports) stays out of every other one
    main = importlib.import_module("elastream.handlers.main")
    return int(main.run(options))


def operator_options(args: argparse.Namespace) -> OperatorOptions:
    """The parsed command line as the operator's settings (`elastream.control.operator_options`)."""
    if not 0 < args.worker_start_timeout <= 3600:
        raise CommandError(f"--worker-start-timeout: {args.worker_start_timeout:g} s; give 1 to 3600 seconds")
    if not 1 <= args.reconcile_workers <= 256:
        raise CommandError(f"--reconcile-workers: {args.reconcile_workers}; give 1 to 256 slots")
    if not 0 <= args.waiting_passes <= 4096:
        raise CommandError(f"--waiting-passes: {args.waiting_passes}; give 0 to 4096 threads")
    if not 1 <= args.status_every <= 3600:
        raise CommandError(f"--status-every: {args.status_every:g} s; give 1 to 3600 seconds")
    for pattern in args.allowed_image:
        if not pattern.strip() or any(c.isspace() for c in pattern):
            raise CommandError(f"--allowed-image: {pattern!r}; give an image, a path ending in / or a glob")
    if not 0 <= args.worker_grace_period <= 3600:
        raise CommandError(f"--worker-grace-period: {args.worker_grace_period} s; give 0 to 3600 seconds")
    metrics_from = network_peers(args.metrics_from)
    placement = worker_placement(args.worker_placement)
    durable_commits()
    if args.redis_topology_users not in ("on", "off"):  # the environment's value is not checked by argparse
        raise CommandError(f"--redis-topology-users: {args.redis_topology_users!r}; give on or off")
    try:
        log_format = checked_log_format(args.log_format)  # $ELASTREAM_LOG_FORMAT is not checked by argparse either
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    return OperatorOptions(
        redis_url=args.redis,
        namespaces=tuple(args.namespace),
        leader_election=leader_election(args) if args.leader_elect else None,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        allowed_images=tuple(args.allowed_image),
        redis_topology_users=args.redis_topology_users == "on",
        engine=args.engine,
        worker_start_timeout_s=args.worker_start_timeout,
        reconcile_workers=args.reconcile_workers,
        waiting_passes=args.waiting_passes,
        status_every_s=args.status_every,
        worker=dataclasses.replace(
            worker_settings_from_env(),
            image=args.worker_image,
            image_pull_policy=args.worker_image_pull_policy,
            image_pull_secrets=tuple(args.worker_image_pull_secret),
            log_format=log_format,
            listen_on_pod_ip=args.listen_on_pod_ip,
            network_policy=args.network_policies,
            metrics_from=metrics_from,
            termination_grace_s=args.worker_grace_period,
            drains=args.drains == "on",
            disruption_budget=args.disruption_budgets == "on",
            placement=placement,
        ),
    )


def worker_placement(text: str | None) -> PlacementPolicy:
    """`--worker-placement` (or $ELASTREAM_WORKER_PLACEMENT) as a `PlacementPolicy`; the default one when unset."""
    try:
        return worker_policy(PlacementPolicy, text, "--worker-placement ($ELASTREAM_WORKER_PLACEMENT)")
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def durable_commits() -> None:
    """$ELASTREAM_DURABLE_COMMITS* checked at start: a value the operator cannot read stops it with one line,
    rather than failing every topology's controller later (each reads them when it is built)."""
    from elastream.store.checkpoint_store import DurableCommits

    try:
        DurableCommits.from_env()
    except ValueError as exc:
        raise CommandError(str(exc)) from None


PEER_KEYS = frozenset({"podSelector", "namespaceSelector", "ipBlock"})


def network_peers(text: str) -> tuple[dict[str, Any], ...]:
    """`--metrics-from`: a JSON list of NetworkPolicy peers (objects of podSelector, namespaceSelector, ipBlock)."""
    import json

    try:
        peers = json.loads(text)
    except ValueError as exc:
        raise CommandError(f"--metrics-from: not JSON ({exc})") from None
    if not isinstance(peers, list) or not all(
        isinstance(p, dict) and p and set(p) <= PEER_KEYS and all(isinstance(v, dict) for v in p.values())
        for p in peers
    ):
        raise CommandError(
            "--metrics-from: give a JSON list of NetworkPolicy peers, each an object of podSelector, "
            "namespaceSelector and/or ipBlock objects"
        )
    return tuple(peers)


def leader_election(args: argparse.Namespace) -> LeaderElection:
    """`--leader-elect-*` as the operator's `LeaderElection`, after checking that the timings guarantee one
    leader (client-go's rules, which the chart checks too): a renew deadline shorter than the lease duration and
    longer than 1.2 x the retry period."""
    from elastream.control.leader import default_identity
    from elastream.core.lease import JITTER_FACTOR, LeaseTiming

    duration, deadline, retry = (
        args.leader_elect_lease_duration,
        args.leader_elect_renew_deadline,
        args.leader_elect_retry_period,
    )
    if duration < 1:
        raise CommandError(f"--leader-elect-lease-duration: {duration} s; give at least 1 second")
    if retry <= 0:
        raise CommandError(f"--leader-elect-retry-period: {retry:g} s; give a positive number of seconds")
    if deadline >= duration:
        raise CommandError(
            f"--leader-elect-renew-deadline: {deadline:g} s must be shorter than --leader-elect-lease-duration "
            f"({duration} s), so a leader gives up before a standby may take over"
        )
    if deadline <= JITTER_FACTOR * retry:
        raise CommandError(
            f"--leader-elect-renew-deadline: {deadline:g} s must be longer than {JITTER_FACTOR:g} x "
            f"--leader-elect-retry-period ({retry:g} s), so one failed renew does not lose the Lease"
        )
    if not args.leader_elect_namespace:
        raise CommandError("--leader-elect-namespace: empty; give the namespace the Lease lives in")
    return LeaderElection(
        namespace=args.leader_elect_namespace,
        identity=default_identity(),
        timing=LeaseTiming(duration, deadline, retry),
    )
