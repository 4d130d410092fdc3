"""Running the operator: wire the shared pieces (Redis, the Kubernetes API, one analysis session, Prometheus)
and hand over to kopf, which calls the handlers in `elastream.handlers.topology`: the reconcile loop and its
pool reach them in kopf's operator memo (`OperatorMemo`, given to `kopf.run`), which kopf copies into each
resource's memo.

kopf always runs standalone (no kopf peering). With leader election (`--leader-elect`, what the chart runs)
the process first acquires the Lease (`elastream.control.leader`), answering /healthz meanwhile, and only then
starts kopf; losing the Lease ends the process at once with exit code `LOST_LEASE_EXIT`, so a replica that
lost it never acts next to the new leader; a clean shutdown releases it, so a standby takes over at once.

Logging is `elastream operator`'s (`elastream.log_format`, set up before this module is loaded): `kopf.run`
configures none (only kopf's own CLI calls `kopf.configure`), so kopf's lines go through the same handler and
`--log-format json` makes them the same JSON, their object reference turned into `namespace` and `topology`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import kopf

from elastream.control.leader import LeaderElection, LeaderElector
from elastream.control.operator_options import OperatorOptions
from elastream.control.pacing import LoopSettings
from elastream.control.reconcile_slots import ReconcilePool, ReconcileSlots
from elastream.control.reconciler import TopologyReconciler
from elastream.handlers.topology import OperatorMemo
from elastream.store.acl import UserKeeper

log = logging.getLogger("elastream.operator")

#: the exit code of an operator that lost its Lease (as controller-runtime, it exits rather than carry on)
LOST_LEASE_EXIT = 1


def load_kubernetes_config() -> None:
    """In a pod: the service account; elsewhere: the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    from kubernetes import config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


def listen_address(on_pod_ip: bool) -> str:
    """Every interface (so `kubectl port-forward`, which connects to localhost in the pod, works), or the
    pod's own address when asked (host-network clusters share one port space)."""
    if not on_pod_ip:
        return "0.0.0.0"
    pod_ip = os.environ.get("POD_IP")
    if not pod_ip:
        raise SystemExit("--listen-on-pod-ip: POD_IP is not set (the chart sets it from status.podIP)")
    return pod_ip


@contextlib.contextmanager
def standby_health(host: str, port: int) -> Iterator[None]:
    """/healthz answers 200 while the process waits for the Lease: kopf's liveness endpoint only starts with
    kopf, and the kubelet must not restart a standby that is merely waiting. Closed before kopf binds the port."""
    if not port:
        yield
        return
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?", 1)[0] == "/healthz"
            body = b'{"standby": true}\n' if ok else b"not found\n"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json" if ok else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # the kubelet probes every few seconds
            pass

    server = ThreadingHTTPServer((host, port), Health)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def exit_on_lost_lease(reason: str) -> None:
    """Called by the elector's renew thread when the Lease is lost: end the process now, whatever kopf and the
    topology controllers are doing, so this replica never acts next to the new leader."""
    log.critical("leader election lost (%s): exiting with code %d so that only the new leader acts",
                 reason, LOST_LEASE_EXIT)  # fmt: skip
    for handler in logging.getLogger().handlers:  # os._exit skips every cleanup: flush the line above
        handler.flush()
    os._exit(LOST_LEASE_EXIT)


def elect(election: LeaderElection, host: str, health_port: int) -> LeaderElector | None:
    """Block until this replica holds the Lease (renewing from then on); None when stopped first."""
    from kubernetes import client

    elector = LeaderElector(client.CoordinationV1Api(), election, on_lost=exit_on_lost_lease)
    stop = threading.Event()  # SIGTERM/SIGINT reach the main thread as KeyboardInterrupt (elastream.cli)
    try:
        with standby_health(host, health_port):
            acquired = elector.acquire(stop)
    except BaseException:
        elector.release()  # interrupted, perhaps right after a write that made us the holder
        raise
    return elector if acquired else None


def redis_at_start(url: str, wait_s: float = 10.0) -> Any:
    """The Redis client of the operator. Redis away at start (restarting beside the operator, say) does not stop
    the operator: it starts, serves its probes and takes the Lease, and every topology's status says
    RedisUnavailable until Redis is back (its passes retry). Refused credentials or a malformed URL are a
    configuration error: exit."""
    from elastream.store.registry import RedisMisconfigured, RedisUnavailable, client_for, connect

    try:
        return connect(url, wait_s=wait_s)
    except RedisMisconfigured:  # a malformed URL, a refused password: exit with the one line that says so
        raise
    except RedisUnavailable as exc:
        log.warning("%s; starting anyway: each topology's status says RedisUnavailable until it is back", exc)
        return client_for(url)


def reconcile_pool(options: OperatorOptions) -> tuple[ReconcileSlots, ReconcilePool]:
    """The slots every topology's passes share and the threads the kopf daemons run them on
    (`control.reconcile_slots`): `reconcile_workers` passes doing work, up to `waiting_passes` more waiting."""
    slots = ReconcileSlots(options.reconcile_workers)
    return slots, ReconcilePool(slots, options.waiting_passes)


def run(options: OperatorOptions) -> int:
    from kubernetes import client
    from prometheus_client import start_http_server

    from elastream.analysis import Analyzer

    load_kubernetes_config()
    redis_client = redis_at_start(options.redis_url)
    slots, pool = reconcile_pool(options)
    topologies = TopologyReconciler(
        redis_client=redis_client,
        redis_url=options.redis_url,
        core_api=client.CoreV1Api(),
        custom_api=client.CustomObjectsApi(),
        analyzer=Analyzer(engine=options.engine),
        settings=options.worker,
        allowed_images=options.allowed_images,
        networking_api=client.NetworkingV1Api() if options.worker.network_policy else None,
        policy_api=client.PolicyV1Api() if options.worker.disruption_budget else None,
        user_keeper=UserKeeper(redis_client) if options.redis_topology_users else None,
        loop=LoopSettings.of_options(options),
        slots=slots,
    )
    host = listen_address(options.worker.listen_on_pod_ip)
    if options.metrics_port:
        from elastream.control.topology_metrics import register_topology_metrics

        # each topology's phase, conditions, nodes, checkpoint age and backlog, read at scrape time
        register_topology_metrics(topologies, redis_client)
        start_http_server(options.metrics_port, addr=host)
    elector = None
    if options.leader_election is not None:
        elector = elect(options.leader_election, host, options.health_port)
        if elector is None:
            return 0
    scope = f"namespaces {', '.join(options.namespaces)}" if options.namespaces else "all namespaces"
    log.info("elastream operator: watching StreamTopology resources in %s", scope)
    try:
        # always standalone: which replica acts is the Lease's decision, not kopf peering's
        kopf.run(
            standalone=True,
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            liveness_endpoint=f"http://{host}:{options.health_port}/healthz" if options.health_port else None,
            memo=OperatorMemo(topologies=topologies, pool=pool),
        )
    finally:
        if elector is not None:
            # no pass may still run when the standby takes over: asyncio.run (in kopf.run) joined the loop's
            # default executor; the reconcile pool is drained here
            pool.shutdown(wait=True, cancel_futures=True)
            elector.release()
    return 0
