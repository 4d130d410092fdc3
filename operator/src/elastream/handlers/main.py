"""Running the operator: wire the shared pieces (Redis, the Kubernetes API, one analysis session, Prometheus)
and hand over to kopf, which calls the handlers in `elastream.handlers.topology`."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from typing import Literal

import kopf

from elastream.control.backends.kubernetes import WorkerPodSettings
from elastream.control.resources import ManagedTopologies
from elastream.handlers import topology as handlers

log = logging.getLogger("elastream.operator")


@dataclass(frozen=True)
class OperatorOptions:
    redis_url: str
    namespaces: tuple[str, ...] = ()
    standalone: bool = True
    peering: str | None = None
    metrics_port: int = 8080
    health_port: int = 8081
    worker_image: str = "elastream-worker:dev"
    engine: Literal["spark", "python"] = "spark"
    interval_s: float = 1.0
    #: metrics and health listen on the pod IP ($POD_IP) instead of every interface, and so do the worker
    #: pods: for clusters whose pods share the host's network (one port space), like the e2e tier
    listen_on_pod_ip: bool = False
    #: how long a worker pod may take to be scheduled, started and ready before a start or scale fails
    worker_start_timeout_s: float = 180.0


def load_kubernetes_config() -> None:
    """In a pod: the service account; elsewhere: the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    from kubernetes import config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


def worker_pod_settings(options: OperatorOptions) -> WorkerPodSettings:
    """What the operator's options decide for every worker pod."""
    return WorkerPodSettings(
        image=options.worker_image,
        log_level=os.environ.get("ELASTREAM_LOG_LEVEL", "INFO"),
        listen_on_pod_ip=options.listen_on_pod_ip,
    )


def listen_address(on_pod_ip: bool) -> str:
    """Every interface (so `kubectl port-forward`, which connects to localhost in the pod, works), or the
    pod's own address when asked (host-network clusters share one port space)."""
    if not on_pod_ip:
        return "0.0.0.0"
    pod_ip = os.environ.get("POD_IP")
    if not pod_ip:
        raise SystemExit("--listen-on-pod-ip: POD_IP is not set (the chart sets it from status.podIP)")
    return pod_ip


def run(options: OperatorOptions) -> int:
    from kubernetes import client
    from prometheus_client import start_http_server

    from elastream.analysis import Analyzer
    from elastream.store.registry import connect

    load_kubernetes_config()
    redis_client = connect(options.redis_url, wait_s=60.0)
    handlers.TOPOLOGIES = ManagedTopologies(
        redis_client=redis_client,
        redis_url=options.redis_url,
        core_api=client.CoreV1Api(),
        custom_api=client.CustomObjectsApi(),
        analyzer=Analyzer(engine=options.engine),
        settings=worker_pod_settings(options),
        interval_s=options.interval_s,
        start_timeout_s=options.worker_start_timeout_s,
    )
    host = listen_address(options.listen_on_pod_ip)
    if options.metrics_port:
        start_http_server(options.metrics_port, addr=host)
    scope = f"namespaces {', '.join(options.namespaces)}" if options.namespaces else "all namespaces"
    log.info("elastream operator: watching StreamTopology resources in %s", scope)
    kopf.run(
        standalone=options.standalone,
        peering_name=options.peering,
        # replicas with equal priorities would all pause: a random one makes exactly one of them active
        priority=random.randint(1, 1_000_000) if options.peering else 0,
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        liveness_endpoint=f"http://{host}:{options.health_port}/healthz" if options.health_port else None,
    )
    return 0
