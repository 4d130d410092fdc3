"""A live what-if: what scaling a running topology to N nodes would do, read from what it runs now, applying
nothing (`elastream plan --live NAMESPACE/NAME --nodes N`).

What the live topology is. A running topology leaves in Redis, under its prefix `elastream:{namespace/name}:`,
the schedule it runs (`schedule`: version and executor -> node, `store.registry`) and its metric stream
(`metrics`); in local mode also the status fields (`last-scaling`, `last-recovery`, `control.local_mode`)
and the manifest `elastream run` started it from (`manifest`). Its spec (the DAG, costs, scaling settings)
is not in Redis on Kubernetes: it is the StreamTopology resource (the ConfigMap the workers read is a copy),
and the schedule alone cannot rebuild it (it names executors, not streams, groupings or costs). So the spec
is, in this order:
  1. `--manifest FILE` when given (its metadata must name the same topology);
  2. the manifest `elastream run` keeps in Redis (`<prefix>manifest`): a local run, from any machine with the
     Redis URL;
  3. the StreamTopology through the Kubernetes API (in the operator's pod its service account, which may list
     StreamTopologies: the chart grants list, not get, so it is read by a `metadata.name` field selector;
     elsewhere the kubeconfig), with its status.
Nothing found is an error naming each place looked at. The node count is the running schedule's, as the
controller's own topology is after its last scaling (spec.nodes may be ahead of it while a change runs).

The window. The controller's metric source (`control.metrics.StreamMetricSource`) reads the hot window of
the metric stream and the analysis (`elastream.analysis.Analyzer`) turns it into a snapshot, as for a scale
request. The window must not reach back before the current schedule settled: the samples since the latest
`finishedAt` of lastScaling and lastRecovery (Redis keys in local mode, the resource's status on Kubernetes)
plus `SETTLE_INTERVALS`, as the controller cuts it, and since the newest start of the executors reporting now
(a counter starting inside the window would read low). Fewer whole intervals than the window asks for is
an error saying how many there are ("wait or lower --window"); so is a stream whose newest sample is older
than `STALE_S` (the workers are not reporting: stopped or suspended).

The plan. `core.planner.plan_request` on the running schedule, the snapshot, N, the spec's strategy and
congestion rate: the one call `TopologyController.plan` makes for a scale request too, with the sinks'
processing rate in the window as the throughput now. The prediction is the
fluid model's throughput of the planned schedule, calibrated from the window.

Read-only. Nothing is written to Redis or the API: no scale request, no status field, no archive cursor, no
claim; the reads are GET, XRANGE/XREVRANGE (or the stream's read-only paging script) and, when a topology is
not found, a bounded SCAN for the names that are there. The Redis URL may hold a password: messages show it
through `store.registry.redacted` only.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from elastream.analysis import Analyzer
from elastream.analysis.sources import HotWindow, reported_by_all
from elastream.control.changes import settles_at
from elastream.control.local_mode import status_key
from elastream.control.metrics import StreamMetricSource, hot_window_budget
from elastream.control.resource_api import GROUP, PLURAL, VERSION, topology_from_resource
from elastream.core.metrics import MetricSample, MetricSnapshot
from elastream.core.planner import Plan, plan_request
from elastream.core.schedule import Schedule, ScheduleError
from elastream.core.topology import MAX_NODES, Topology, TopologyError, parse_manifest, topology_prefix
from elastream.core.window_analysis import GRID_SLACK, Analysis, check_window_args
from elastream.store.codec import optional_text
from elastream.store.metric_stream import MetricStream
from elastream.store.registry import Registry, stored_manifest

#: a stream whose newest sample is older than this (seconds; at least 10 intervals) has no worker reporting
STALE_S = 30.0
#: topologies named when the one asked for is not found, at most; SCAN calls made to find them, at most
KNOWN_NAMES = 10
SCAN_CALLS = 20
#: seconds a Kubernetes API request may take
API_TIMEOUT_S = 10.0

#: a namespace (DNS-1123 label) and a StreamTopology name (DNS-1123 subdomain), as the API server checks them
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class LivePlanError(Exception):
    """The what-if cannot be answered; the message says what was looked at and what to do."""


class WindowTooShort(LivePlanError):
    """The metric window holds fewer whole intervals than asked for."""

    def __init__(self, intervals: int, wanted: int, interval_s: float, why: str) -> None:
        self.intervals, self.wanted = intervals, wanted
        super().__init__(
            f"the metric window has {intervals} of {wanted} intervals ({why}); wait {wanted - intervals} "
            f"interval{'s' if wanted - intervals != 1 else ''} of {interval_s:g} s or lower --window"
        )


@dataclass(frozen=True)
class TopologyRef:
    """NAMESPACE/NAME of a topology (NAME alone: namespace default)."""

    namespace: str
    name: str

    @staticmethod
    def parse(text: str) -> TopologyRef:
        namespace, sep, name = text.rpartition("/")
        namespace = namespace if sep else "default"
        if not _NAMESPACE.match(namespace) or not _NAME.match(name):
            raise LivePlanError(
                f"--live: {text!r} is not NAMESPACE/NAME of a StreamTopology (lowercase letters, digits and -); "
                "e.g. --live analytics/pageload, or NAME for namespace default"
            )
        return TopologyRef(namespace, name)

    @property
    def prefix(self) -> str:
        return topology_prefix(self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class TopologyLister(Protocol):
    """What the what-if needs of `kubernetes.client.CustomObjectsApi`: StreamTopologies listed by name (the
    operator's role lists them; it has no get)."""

    def list_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        *,
        field_selector: str,
        _request_timeout: float,
    ) -> Any: ...


@dataclass(frozen=True)
class LiveTopology:
    """A running topology as the what-if sees it: its spec (with the running node count), the running
    schedule and its version, where the spec came from, and its last scaling and recovery records."""

    ref: TopologyRef
    topology: Topology
    schedule: Schedule
    version: int
    #: "manifest" (--manifest), "redis" (the stored manifest) or "kubernetes" (the resource)
    spec_from: str
    #: spec.nodes of the resource (the desired count: ahead of the running one while a change runs); None for a
    #: manifest (a local run's keeps the count it started with)
    spec_nodes: int | None
    last_scaling: Mapping[str, Any] | None = None
    last_recovery: Mapping[str, Any] | None = None

    def settled_since(self, interval_s: float) -> float:
        """When the running schedule settled, as the controller cuts its window: the latest `finishedAt` of
        the last scaling and recovery, plus `SETTLE_INTERVALS` (0.0 when neither happened)."""
        ends = [_finished_at(r) for r in (self.last_scaling, self.last_recovery)]
        known = [t for t in ends if t is not None]
        return settles_at(max(known), interval_s) if known else 0.0

    def where_spec(self) -> str:
        return {
            "manifest": "--manifest",
            "redis": f"Redis key {self.ref.prefix}manifest",
            "kubernetes": f"StreamTopology {self.ref} (Kubernetes API)",
        }[self.spec_from]


def _finished_at(record: Mapping[str, Any] | None) -> float | None:
    value = (record or {}).get("finishedAt")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_live(
    client: redis.Redis,
    ref: TopologyRef,
    where: str,
    manifest: Topology | None = None,
    kubernetes: Callable[[], tuple[TopologyLister | None, str]] | None = None,
) -> LiveTopology:
    """The running topology `ref` on the Redis `client` reaches (`where`: its redacted URL, for messages);
    its spec from `manifest`, else the manifest kept in Redis, else the resource through `kubernetes()` (a
    lister, or None and why there is no API). Raises `LivePlanError` naming what was looked for."""
    try:
        running = Registry(client, ref.prefix).schedule()
    except (ValueError, KeyError, TypeError, ScheduleError) as exc:  # the key is under the prefix its workers write
        reason = " ".join(str(exc).split())[:120]
        raise LivePlanError(
            f"Redis key {ref.prefix}schedule is not a schedule ({type(exc).__name__}: {reason}); "
            "is the topology being recreated? ask again once it runs"
        ) from None
    if running is None:
        known = known_topologies(client)
        raise LivePlanError(
            f"no topology {ref} runs on Redis at {where}: no key {ref.prefix}schedule (NAMESPACE/NAME as in the "
            "StreamTopology, NAME alone for namespace default); "
            + (f"topologies there: {', '.join(known)}" if known else "no topology runs there")
        )
    version, schedule = running
    status: Mapping[str, Any] = {}
    if manifest is not None:
        if (manifest.namespace, manifest.name) != (ref.namespace, ref.name):
            raise LivePlanError(
                f"--manifest names {manifest.namespace}/{manifest.name}, not {ref}; pass the manifest of {ref}"
            )
        topology, spec_from = manifest, "manifest"
    elif (document := _stored(client, ref)) is not None:
        topology, spec_from = _parse(document, f"Redis key {ref.prefix}manifest"), "redis"
    else:
        body = find_resource(ref, kubernetes, where)
        topology, spec_from = _parse_resource(body, ref), "kubernetes"
        status = body.get("status") or {}
    if spec_from != "kubernetes":
        status = _local_status(client, topology)
    _check_schedule(topology, schedule, ref)
    nodes = len(schedule.nodes)
    return LiveTopology(
        ref=ref,
        topology=topology if topology.nodes == nodes else topology.with_nodes(nodes),
        schedule=schedule,
        version=version,
        spec_from=spec_from,
        spec_nodes=topology.nodes if spec_from == "kubernetes" else None,
        last_scaling=_mapping(status.get("lastScaling")),
        last_recovery=_mapping(status.get("lastRecovery")),
    )


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _stored(client: redis.Redis, ref: TopologyRef) -> dict[str, Any] | None:
    try:
        return stored_manifest(client, str(ref))
    except (ValueError, UnicodeDecodeError):
        raise LivePlanError(
            f"Redis key {ref.prefix}manifest is not JSON; pass the topology's manifest with --manifest FILE"
        ) from None


def _parse(document: Any, where: str) -> Topology:
    try:
        return parse_manifest(document)
    except TopologyError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise LivePlanError(f"{where}: {first}; pass the topology's manifest with --manifest FILE") from None


def _parse_resource(body: Mapping[str, Any], ref: TopologyRef) -> Topology:
    try:
        return topology_from_resource(body)
    except TopologyError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise LivePlanError(f"StreamTopology {ref}: {first}") from None


def _local_status(client: redis.Redis, topology: Topology) -> dict[str, Any]:
    """Local mode's status fields the window needs (`control.local_mode.RedisStatus`); absent ones are left out,
    unreadable ones too (a what-if does not fail on a record it only uses to cut its window)."""
    status: dict[str, Any] = {}
    for field_name in ("lastScaling", "lastRecovery"):
        raw = optional_text(client.get(status_key(topology, field_name)))
        if raw is None:
            continue
        try:
            status[field_name] = json.loads(raw)
        except ValueError:
            continue
    return status


def find_resource(
    ref: TopologyRef, kubernetes: Callable[[], tuple[TopologyLister | None, str]] | None, where: str
) -> Mapping[str, Any]:
    """The StreamTopology `ref` through the Kubernetes API; `LivePlanError` naming every place looked at."""
    looked = f"Redis at {where} keeps no manifest of it (no key {ref.prefix}manifest: only `elastream run` does)"
    api, why = kubernetes() if kubernetes is not None else (None, "not asked")
    if api is None:
        raise LivePlanError(
            f"no spec for {ref}: {looked}, and the Kubernetes API cannot be used ({why}); pass its manifest with "
            "--manifest FILE, or run the command where the API is reachable (the operator's pod: kubectl exec)"
        )
    try:
        listed = api.list_namespaced_custom_object(
            GROUP,
            VERSION,
            ref.namespace,
            PLURAL,
            field_selector=f"metadata.name={ref.name}",
            _request_timeout=API_TIMEOUT_S,
        )
    except Exception as exc:  # any failure of the API is one line: refused, unreachable, timed out
        raise LivePlanError(
            f"no spec for {ref}: {looked}, and listing StreamTopologies in namespace {ref.namespace} failed "
            f"({_api_reason(exc)}); pass its manifest with --manifest FILE"
        ) from None
    items = listed.get("items") if isinstance(listed, Mapping) else None
    found = [i for i in items or [] if isinstance(i, Mapping) and (i.get("metadata") or {}).get("name") == ref.name]
    if not found:
        raise LivePlanError(
            f"no StreamTopology {ref} in the Kubernetes API, yet Redis at {where} holds a schedule under "
            f"{ref.prefix} (deleted, or another cluster's?); pass its manifest with --manifest FILE"
        )
    return found[0]


def _api_reason(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if isinstance(status, int) and status:
        return f"HTTP {status} {reason or ''}".strip()
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


def kubernetes_lister() -> tuple[TopologyLister | None, str]:
    """A CustomObjectsApi with the pod's service account, else the kubeconfig; (None, why) when neither."""
    try:
        from kubernetes import client, config
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        return None, f"the kubernetes package is missing: {exc}"
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except Exception as exc:  # no kubeconfig, a broken one: say so, the caller names the other ways
            return None, f"not in a pod and no usable kubeconfig: {' '.join(str(exc).split())[:200]}"
    lister: TopologyLister = client.CustomObjectsApi()
    return lister, ""


def known_topologies(client: redis.Redis) -> list[str]:
    """NAMESPACE/NAME of up to `KNOWN_NAMES` topologies with a running schedule on this Redis (a bounded SCAN;
    [] when the server or the client does not allow it)."""
    names: set[str] = set()
    cursor = 0
    try:
        for _ in range(SCAN_CALLS):
            cursor, keys = client.scan(cursor, match="elastream:{*}:schedule", count=1000)
            for key in keys:
                text = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
                names.add(text[len("elastream:{") : -len("}:schedule")])
            if not cursor or len(names) >= KNOWN_NAMES:
                break
    except Exception:  # a Redis Cluster, an ACL user without SCAN: the message just names none
        return []
    return sorted(names)[:KNOWN_NAMES]


def _check_schedule(topology: Topology, schedule: Schedule, ref: TopologyRef) -> None:
    """The running schedule's executors belong to the spec's vertices (a --manifest of another version of the
    topology would plan nonsense)."""
    vertices = set(topology.vertices)
    strangers = sorted({v for v in schedule.parallelism() if v not in vertices})
    if strangers:
        raise LivePlanError(
            f"the schedule {ref} runs has executors of {', '.join(strangers)}, which the spec has no vertex for; "
            "pass the manifest it was started from"
        )


@dataclass(frozen=True)
class LivePlan:
    """The what-if's answer: the plan, the window it came from and the throughput measured in it."""

    live: LiveTopology
    plan: Plan
    analysis: Analysis
    measured_throughput: float
    intervals: int
    interval_s: float
    engine: str
    congestion_rate: float

    @property
    def congested(self) -> list[str]:
        return [v for v in self.live.topology.order if self.analysis.congested.get(v)]

    def to_dict(self) -> dict[str, Any]:
        live = self.live
        return {
            "topology": str(live.ref),
            "spec_from": live.spec_from,
            "schedule_version": live.version,
            "spec_nodes": live.spec_nodes,
            "window": {
                "intervals": self.intervals,
                "interval_s": self.interval_s,
                "start": self.analysis.window_start,
                "end": self.analysis.window_end,
                "samples": self.analysis.samples_used,
                "engine": self.engine,
            },
            "congestion_rate": self.congestion_rate,
            "congested": self.congested,
            "measured_throughput": self.measured_throughput,
            "predicted_throughput": self.plan.predicted_throughput,
            "applied": False,
            "plan": self.plan.to_dict(),
        }


def covered_intervals(samples: list[MetricSample], not_before: float, interval_s: float) -> tuple[int, str]:
    """Whole intervals of the window the samples cover, and what limits them: from the later of `not_before`
    and the newest start of the executors reporting at the end (their latest incarnation), to the newest
    sample. A sample up to `GRID_SLACK` of an interval late counts on its grid time, as the analysis does."""
    end = max(s.ts for s in samples)
    latest: dict[tuple[str, str], MetricSample] = {}
    for s in samples:
        seen = latest.get((s.vertex, s.executor))
        if seen is None or s.ts >= seen.ts:
            latest[(s.vertex, s.executor)] = s
    started = max(s.started_at for s in latest.values())
    if not_before > started:
        begin, why = not_before, "the running schedule settled"
    else:
        begin, why = started, "its newest executor started"
    intervals = max(0, int((end - begin) / interval_s + GRID_SLACK))
    return intervals, f"{why} {end - begin:.1f} s before the newest sample"


def plan_live(
    client: redis.Redis,
    live: LiveTopology,
    nodes: int,
    analyzer: Analyzer,
    *,
    window: int | None = None,
    interval_s: float = 1.0,
    strategy: str | None = None,
    congestion_rate: float | None = None,
    seed: int = 0,
    parallelism: Mapping[str, int] | None = None,
    now: Callable[[], float] = time.time,
) -> LivePlan:
    """Read the live window, analyse it and plan a move to `nodes` as a scale request would (`window`,
    `strategy`, `congestion_rate`: the spec's unless given). Writes nothing. Raises `LivePlanError` (with
    `WindowTooShort`) when the window cannot be analysed, `PlanningError` when no plan fits."""
    topology = live.topology
    window = topology.scaling.window if window is None else window
    rate = topology.scaling.congestion_rate if congestion_rate is None else congestion_rate
    try:
        check_window_args(window, interval_s, rate)
    except ValueError as exc:
        raise LivePlanError(_flag(str(exc))) from None
    if not 1 <= nodes <= MAX_NODES:
        raise LivePlanError(f"--nodes: {nodes} is outside [1, {MAX_NODES}]; ask for 1 to {MAX_NODES} nodes")
    not_before = live.settled_since(interval_s)
    source = StreamMetricSource(client, topology, analyzer, interval_s, not_before=not_before)
    # the source's own hot window, read here first to check the span; its analysis then reads only what came since
    source.hot = HotWindow(MetricStream(client, topology.redis_prefix), hot_window_budget(topology, window, interval_s))
    samples = reported_by_all(source.hot.read(window, interval_s, not_before), interval_s)
    samples = [s for s in samples if s.vertex in topology.vertices]
    if not samples:
        raise WindowTooShort(0, window, interval_s, _no_samples(client, live, not_before))
    newest = max(s.ts for s in samples)
    stale = max(STALE_S, 10 * interval_s)
    if now() - newest > stale:
        raise LivePlanError(
            f"the newest metric sample of {live.ref} is {now() - newest:.0f} s old: its workers are not reporting "
            "(stopped or suspended?); a live what-if needs a running topology"
        )
    intervals, why = covered_intervals(samples, not_before, interval_s)
    if intervals < window:
        raise WindowTooShort(intervals, window, interval_s, why)
    analysis = source.analyse(window)
    plan, throughput = plan_window(
        live, analysis.snapshot, nodes, strategy=strategy, congestion_rate=rate, seed=seed, parallelism=parallelism
    )
    return LivePlan(
        live=live,
        plan=plan,
        analysis=analysis,
        measured_throughput=throughput,
        intervals=window,
        interval_s=interval_s,
        engine=source.engine or analyzer.engine,
        congestion_rate=rate,
    )


def plan_window(
    live: LiveTopology,
    snapshot: MetricSnapshot,
    nodes: int,
    *,
    strategy: str | None = None,
    congestion_rate: float | None = None,
    seed: int = 0,
    parallelism: Mapping[str, int] | None = None,
) -> tuple[Plan, float]:
    """The plan a scale request to `nodes` makes from the analysed window `snapshot`, and the sinks' throughput
    in it: `plan_request` on the running schedule, as `TopologyController.plan` calls it (unless `strategy`,
    `congestion_rate` say otherwise)."""
    return plan_request(
        live.topology,
        live.schedule,
        snapshot,
        nodes,
        parallelism,
        strategy=strategy,
        congestion_rate=congestion_rate,
        seed=seed,
    )


def _no_samples(client: redis.Redis, live: LiveTopology, not_before: float) -> str:
    if client.exists(f"{live.ref.prefix}metrics"):
        if not_before:
            return "no sample since the running schedule settled"
        return "no sample of its vertices in the stream's newest entries"
    return f"no worker has reported yet: {live.ref.prefix}metrics is empty"


def _flag(message: str) -> str:
    """`check_window_args`'s message with the command's flag names."""
    for name, flag in (("window", "--window"), ("interval", "--interval"), ("congestion rate", "--congestion-rate")):
        if message.startswith(f"{name}:"):
            return flag + message[len(name) :]
    return message
