"""The operator's settings (`elastream operator`'s options, which the CLI parses and `handlers.main` runs with),
and what follows from them for every worker pod: here, below both, so the CLI builds them without importing the
handlers (kopf) and the handlers read them without importing the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from elastream.control.backends.worker_objects import (
    POD_TEMPLATE_ENV,
    PlacementPolicy,
    PodTemplatePolicy,
    WorkerPodSettings,
)
from elastream.control.leader import LeaderElection
from elastream.worker_inputs.keys import auth_enabled

#: the operator's policies over what a topology may ask of its pods, each read from the chart's JSON
Policy = TypeVar("Policy", PlacementPolicy, PodTemplatePolicy)


def worker_policy(kind: type[Policy], text: str | None, source: str) -> Policy:
    """A worker policy from its JSON (`text`), the default one when unset or empty; JSON it cannot read is a
    ValueError whose message starts with `source` (where the text came from), for the one line that stops the
    operator at start (rather than every topology's pods failing later)."""
    if not text:
        return kind()
    try:
        return kind.from_json(text)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def pod_template_policy_from_env() -> PodTemplatePolicy:
    """What a topology's spec.podTemplate may ask for: $ELASTREAM_WORKER_POD_TEMPLATE (the chart's
    worker.podTemplate as JSON), the default policy when unset; a value it cannot read stops the operator."""
    source = f"${POD_TEMPLATE_ENV} (the chart's worker.podTemplate)"
    try:
        return worker_policy(PodTemplatePolicy, os.environ.get(POD_TEMPLATE_ENV), source)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def worker_settings_from_env() -> WorkerPodSettings:
    """What the operator's environment, not its command line, decides for every worker pod: the log level
    ($ELASTREAM_LOG_LEVEL, else INFO), the data plane's auth (`auth_enabled`) and the pod-template policy
    (`pod_template_policy_from_env`); every other setting at `WorkerPodSettings`' default, for the command line
    (`cli.operator.operator_options`) to replace."""
    return WorkerPodSettings(
        log_level=os.environ.get("ELASTREAM_LOG_LEVEL", "INFO"),
        data_plane_auth=auth_enabled(),
        pod_template=pod_template_policy_from_env(),
    )


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
    #: the images a topology's spec.image may name (`elastream.core.images`); empty: any
    allowed_images: tuple[str, ...] = ()
    #: give each topology's workers a Redis ACL user of its own (`elastream.store.acl`); off: the operator's URL
    redis_topology_users: bool = True
    engine: Literal["spark", "python"] = "spark"
    interval_s: float = 1.0
    #: how long a worker pod may take to be scheduled, started and ready before a start or scale fails
    worker_start_timeout_s: float = 180.0
    #: reconcile passes doing work at once, shared by every topology (`control.reconcile_slots`)
    reconcile_workers: int = 8
    #: passes that may wait at once beside them (pods not ready yet, a migration's barriers), each on a thread
    #: of its own with its slot given back; past this, passes queue for a thread
    waiting_passes: int = 256
    #: seconds between status writes for the rates alone (everything else is written when it changes)
    status_every_s: float = 15.0
    #: what the operator decides for every worker pod (image, pulls, drains, placement, pod template,
    #: NetworkPolicy and PodDisruptionBudget...); its `log_format` and `listen_on_pod_ip` are the operator's own too
    worker: WorkerPodSettings = field(default_factory=worker_settings_from_env)
