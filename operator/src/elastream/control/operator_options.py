"""The operator's settings (`elastream operator`'s options, which the CLI parses and `handlers.main` runs with),
and what follows from them for every worker pod: here, below both, so the CLI builds them without importing the
handlers (kopf) and the handlers read them without importing the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from elastream import DEFAULT_WORKER_IMAGE
from elastream.control.backends.worker_objects import (
    POD_TEMPLATE_ENV,
    PlacementPolicy,
    PodTemplatePolicy,
    WorkerPodSettings,
)
from elastream.control.leader import LEASE_NAME
from elastream.worker_inputs.keys import auth_enabled


@dataclass(frozen=True)
class LeaderElection:
    """`--leader-elect` and its timings: one active replica, holding the Lease `name` in `namespace`."""

    namespace: str
    identity: str
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    name: str = LEASE_NAME


def pod_template_policy_from_env() -> PodTemplatePolicy:
    """What a topology's spec.podTemplate may ask for: $ELASTREAM_WORKER_POD_TEMPLATE (the chart's
    worker.podTemplate as JSON), the default policy when unset. A value it cannot read stops the operator at start
    with one line naming the variable (rather than every topology's pods failing later)."""
    text = os.environ.get(POD_TEMPLATE_ENV)
    if not text:
        return PodTemplatePolicy()
    try:
        return PodTemplatePolicy.from_json(text)
    except ValueError as exc:
        raise SystemExit(f"error: ${POD_TEMPLATE_ENV} (the chart's worker.podTemplate): {exc}") from None


@dataclass(frozen=True)
class OperatorOptions:
    """What `elastream operator` runs with: its command line (`cli.operator.operator_options`), defaults as there."""

    #: never in a repr (a log line, a traceback's locals): it may hold a password
    redis_url: str = field(repr=False)
    namespaces: tuple[str, ...] = ()
    #: None: this process acts alone, at once (outside a cluster, one replica); else first the Lease
    leader_election: LeaderElection | None = None
    metrics_port: int = 8080
    health_port: int = 8081
    worker_image: str = DEFAULT_WORKER_IMAGE
    #: the pull policy and pull Secrets of every worker pod
    worker_image_pull_policy: str = "IfNotPresent"
    worker_image_pull_secrets: tuple[str, ...] = ()
    #: the images a topology's spec.image may name (`elastream.core.images`); empty: any
    allowed_images: tuple[str, ...] = ()
    #: keep a NetworkPolicy per topology (its workers reachable from its own workers only), whose metrics port
    #: accepts `metrics_from` (NetworkPolicyPeers: the Prometheus that scrapes the workers)
    network_policies: bool = False
    metrics_from: tuple[dict[str, Any], ...] = ()
    #: give each topology's workers a Redis ACL user of its own (`elastream.store.acl`); off: the operator's URL
    redis_topology_users: bool = True
    engine: Literal["spark", "python"] = "spark"
    interval_s: float = 1.0
    #: metrics and health listen on the pod IP ($POD_IP) instead of every interface, and so do the worker
    #: pods: for clusters whose pods share the host's network (one port space), like the e2e tier
    listen_on_pod_ip: bool = False
    #: how long a worker pod may take to be scheduled, started and ready before a start or scale fails
    worker_start_timeout_s: float = 180.0
    #: reconcile passes doing work at once, shared by every topology (`control.reconcile_slots`)
    reconcile_workers: int = 8
    #: passes that may wait at once beside them (pods not ready yet, a migration's barriers), each on a thread
    #: of its own with its slot given back; past this, passes queue for a thread
    waiting_passes: int = 256
    #: seconds between status writes for the rates alone (everything else is written when it changes)
    status_every_s: float = 15.0
    #: worker pods' terminationGracePeriodSeconds, the time a drain has before the worker is killed
    worker_grace_period_s: int = 30
    #: workers ask for a graceful drain on SIGTERM (off: they stop at once, the topology rolls back)
    drains: bool = True
    #: keep a PodDisruptionBudget (maxUnavailable 1) per topology
    disruption_budgets: bool = True
    #: what a topology's spec.placement may ask for (`--worker-placement`, $ELASTREAM_WORKER_PLACEMENT)
    worker_placement: PlacementPolicy = field(default_factory=PlacementPolicy)
    #: what a topology's spec.podTemplate may add to its pods ($ELASTREAM_WORKER_POD_TEMPLATE)
    worker_pod_template: PodTemplatePolicy = field(default_factory=pod_template_policy_from_env)
    #: the operator's log lines (`--log-format`: text or json, `elastream.log_format`), and its worker pods'
    log_format: str = "text"


def worker_pod_settings(options: OperatorOptions) -> WorkerPodSettings:
    """What the operator's options decide for every worker pod."""
    return WorkerPodSettings(
        image=options.worker_image,
        image_pull_policy=options.worker_image_pull_policy,
        image_pull_secrets=options.worker_image_pull_secrets,
        log_level=os.environ.get("ELASTREAM_LOG_LEVEL", "INFO"),
        log_format=options.log_format,
        listen_on_pod_ip=options.listen_on_pod_ip,
        data_plane_auth=auth_enabled(),
        network_policy=options.network_policies,
        metrics_from=options.metrics_from,
        termination_grace_s=options.worker_grace_period_s,
        drains=options.drains,
        disruption_budget=options.disruption_budgets,
        placement=options.worker_placement,
        pod_template=options.worker_pod_template,
    )
