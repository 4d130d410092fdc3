"""spec.scaling (strategy, migration, the autoscaler's settings) and spec.resources (a node's CPU)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastream.core.rates import shown
from elastream.core.topology.fields import _int_field, _number
from elastream.core.topology.limits import (
    _CPU_RE,
    AUTOSCALE_COMBINES,
    AUTOSCALE_POLICIES,
    DEFAULT_CONGESTION_RATE,
    DEFAULT_WINDOW,
    MAX_CONGESTION_RATE,
    MAX_INTERVAL_SECONDS,
    MAX_NODE_CPU,
    MAX_NODES,
    MAX_SLOTS_PER_NODE,
    MAX_WINDOW,
    MIGRATIONS,
    STRATEGIES,
)
from elastream.core.topology.model import AutoScalingSpec, ScalingSpec


def _parse_scaling(raw: Any, problems: list[str]) -> ScalingSpec:
    if raw is None:
        return ScalingSpec()
    if not isinstance(raw, Mapping):
        problems.append("spec.scaling: is not a mapping; see the CRD for its fields")
        return ScalingSpec()
    strategy = raw.get("strategy", "stela")
    if strategy not in STRATEGIES:
        problems.append(f"spec.scaling.strategy: {shown(strategy)} is unknown; use one of: {', '.join(STRATEGIES)}")
    migration = raw.get("migration", "ccr")
    if migration not in MIGRATIONS:
        problems.append(f"spec.scaling.migration: {shown(migration)} is unknown; use one of: {', '.join(MIGRATIONS)}")
    rate = raw.get("congestionRate", DEFAULT_CONGESTION_RATE)
    if not _number(rate) or not 1.0 <= rate <= MAX_CONGESTION_RATE:
        problems.append(
            f"spec.scaling.congestionRate: {shown(rate)} must be a number in [1, {MAX_CONGESTION_RATE}] "
            "(the paper uses 1.2)"
        )
        rate = DEFAULT_CONGESTION_RATE
    window = (
        _int_field(
            raw, "window", "spec.scaling.window", problems, default=DEFAULT_WINDOW, minimum=2, maximum=MAX_WINDOW
        )
        or DEFAULT_WINDOW
    )
    checkpoint_interval = _int_field(
        raw,
        "checkpointIntervalSeconds",
        "spec.scaling.checkpointIntervalSeconds",
        problems,
        default=10,
        minimum=0,
        maximum=MAX_INTERVAL_SECONDS,
    )
    return ScalingSpec(
        strategy=str(strategy),
        migration=migration if migration in MIGRATIONS else "ccr",
        congestion_rate=float(rate),
        window=window,
        checkpoint_interval_s=10 if checkpoint_interval is None else checkpoint_interval,
        auto=_parse_auto(raw.get("auto"), problems),
    )


#: where the autoscaler's settings are in a manifest
_AUTO = "spec.scaling.auto"


def _parse_auto(raw: Any, problems: list[str]) -> AutoScalingSpec:
    if raw is None:
        return AutoScalingSpec()
    if not isinstance(raw, Mapping):
        problems.append(f"{_AUTO}: is not a mapping; write {{enabled: true, minNodes: 1, maxNodes: 10}}")
        return AutoScalingSpec()
    default = AutoScalingSpec()
    min_nodes, max_nodes = _node_bounds(raw, problems)
    policy, combine = _auto_choices(raw, default, problems)
    stabilization = _stabilization(raw, default, problems)
    thresholds = _Thresholds.parse(raw.get("thresholds") or {}, default, problems)
    return AutoScalingSpec(
        enabled=bool(raw.get("enabled", False)),
        policy=policy,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        theta_min=thresholds.theta_min,
        theta_max=thresholds.theta_max,
        combine=combine,
        capacity_threshold=thresholds.capacity,
        executors_per_node=thresholds.per_node,
        high_threshold=thresholds.high,
        low_threshold=thresholds.low,
        stabilization_s=stabilization,
        execute=bool(raw.get("execute", True)),
    )


def _node_bounds(raw: Mapping[str, Any], problems: list[str]) -> tuple[int, int]:
    min_nodes = _int_field(raw, "minNodes", f"{_AUTO}.minNodes", problems, default=1, minimum=1, maximum=MAX_NODES)
    max_nodes = _int_field(raw, "maxNodes", f"{_AUTO}.maxNodes", problems, default=20, minimum=1, maximum=MAX_NODES)
    # that minNodes does not exceed maxNodes is the CRD's CEL rule (elastream.resources runs it before the parser)
    return min_nodes or 1, max_nodes or 20


def _auto_choices(raw: Mapping[str, Any], default: AutoScalingSpec, problems: list[str]) -> tuple[str, str]:
    """policy and combine, and the two flags checked."""
    policy = raw.get("policy", default.policy)
    if policy not in AUTOSCALE_POLICIES:
        problems.append(f"{_AUTO}.policy: {shown(policy)} is unknown; use one of: {', '.join(AUTOSCALE_POLICIES)}")
    combine = raw.get("combine", default.combine)
    if combine not in AUTOSCALE_COMBINES:
        problems.append(
            f"{_AUTO}.combine: {shown(combine)} is unknown; use max (never short of capacity) or min (fewest resources)"
        )
    for flag in ("enabled", "execute"):
        if flag in raw and not isinstance(raw[flag], bool):
            problems.append(f"{_AUTO}.{flag}: {shown(raw[flag])} is not a boolean; write true or false")
    return str(policy), str(combine)


def _stabilization(raw: Mapping[str, Any], default: AutoScalingSpec, problems: list[str]) -> float:
    stabilization = raw.get("stabilizationSeconds", default.stabilization_s)
    if not _number(stabilization) or not 0 <= stabilization <= MAX_INTERVAL_SECONDS:
        problems.append(
            f"{_AUTO}.stabilizationSeconds: {shown(stabilization)} must be a number of seconds in "
            f"[0, {MAX_INTERVAL_SECONDS}] (e.g. 30)"
        )
        return default.stabilization_s
    return float(stabilization)


@dataclass(frozen=True)
class _Thresholds:
    """spec.scaling.auto.thresholds, checked (a wrong share falls back to its default)."""

    theta_min: float
    theta_max: float
    low: float
    high: float
    per_node: int | None
    capacity: float

    @staticmethod
    def parse(raw: Any, default: AutoScalingSpec, problems: list[str]) -> _Thresholds:
        path = f"{_AUTO}.thresholds"
        if not isinstance(raw, Mapping):
            problems.append(f"{path}: is not a mapping; write {{thetaMin: 0.3, thetaMax: 0.8}}")
            raw = {}

        def share(key: str, fallback: float) -> float:
            value = raw.get(key, fallback)
            if not _number(value) or not 0.0 < value <= 1.0:
                problems.append(f"{path}.{key}: {shown(value)} must be a number in (0, 1]")
                return fallback
            return float(value)

        theta_min, theta_max = share("thetaMin", default.theta_min), share("thetaMax", default.theta_max)
        if theta_min >= theta_max:
            problems.append(f"{path}.thetaMin: {theta_min:g} is not below thetaMax {theta_max:g}; lower it")
        low, high = share("low", default.low_threshold), share("high", default.high_threshold)
        if low >= high:
            problems.append(f"{path}.low: {low:g} is not below high {high:g}; lower it")
        per_node = None
        if "executorsPerNode" in raw:
            per_node = _int_field(
                raw,
                "executorsPerNode",
                f"{path}.executorsPerNode",
                problems,
                default=None,
                minimum=1,
                maximum=MAX_SLOTS_PER_NODE,
            )
        return _Thresholds(theta_min, theta_max, low, high, per_node, share("capacity", default.capacity_threshold))


def parse_cpu(value: Any) -> float:
    """A Kubernetes CPU quantity ("2", "500m", 1.5) in cores. Raises ValueError when it is not one."""
    if _number(value):
        return float(value)
    match = _CPU_RE.match(str(value).strip())
    if not match:
        raise ValueError(f"{shown(value)} is not a CPU quantity")
    number = float(match.group(1))
    return number / 1000.0 if match.group(3) else number


def _parse_node_cpu(raw: Any, problems: list[str]) -> float | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append("spec.resources: is not a mapping; write {limits: {cpu: '1'}}")
        return None
    limits = raw.get("limits")
    if limits is None:
        return None
    if not isinstance(limits, Mapping):
        problems.append(f"spec.resources.limits: {shown(limits)} is not a mapping; write limits: {{cpu: '2'}}")
        return None
    cpu = limits.get("cpu")
    if cpu is None:
        return None
    try:
        cores = parse_cpu(cpu)
    except ValueError:
        problems.append(f"spec.resources.limits.cpu: {shown(cpu)} is not a CPU quantity; write e.g. '2' or '500m'")
        return None
    if not math.isfinite(cores) or not 0 < cores <= MAX_NODE_CPU:
        problems.append(f"spec.resources.limits.cpu: {shown(cpu)} must be above 0 and at most {MAX_NODE_CPU} cores")
        return None
    return cores
