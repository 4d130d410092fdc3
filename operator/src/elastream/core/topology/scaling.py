"""spec.scaling (strategy, migration, the autoscaler's settings) and spec.resources (a node's CPU)."""

from __future__ import annotations

import math
from collections.abc import Mapping
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
        migration=str(migration),
        congestion_rate=float(rate),
        window=window,
        checkpoint_interval_s=10 if checkpoint_interval is None else checkpoint_interval,
        auto=_parse_auto(raw.get("auto"), problems),
    )


def _parse_auto(raw: Any, problems: list[str]) -> AutoScalingSpec:
    if raw is None:
        return AutoScalingSpec()
    if not isinstance(raw, Mapping):
        problems.append("spec.scaling.auto: is not a mapping; write {enabled: true, minNodes: 1, maxNodes: 10}")
        return AutoScalingSpec()
    path = "spec.scaling.auto"
    default = AutoScalingSpec()
    min_nodes = _int_field(raw, "minNodes", f"{path}.minNodes", problems, default=1, minimum=1, maximum=MAX_NODES) or 1
    max_nodes = (
        _int_field(raw, "maxNodes", f"{path}.maxNodes", problems, default=20, minimum=1, maximum=MAX_NODES) or 20
    )
    if max_nodes < min_nodes:
        problems.append(f"{path}.maxNodes: {max_nodes} is below minNodes {min_nodes}; raise maxNodes")
    policy = raw.get("policy", default.policy)
    if policy not in AUTOSCALE_POLICIES:
        problems.append(f"{path}.policy: {shown(policy)} is unknown; use one of: {', '.join(AUTOSCALE_POLICIES)}")
    combine = raw.get("combine", default.combine)
    if combine not in AUTOSCALE_COMBINES:
        problems.append(
            f"{path}.combine: {shown(combine)} is unknown; use max (never short of capacity) or min (fewest resources)"
        )
    for flag in ("enabled", "execute"):
        if flag in raw and not isinstance(raw[flag], bool):
            problems.append(f"{path}.{flag}: {shown(raw[flag])} is not a boolean; write true or false")
    stabilization = raw.get("stabilizationSeconds", default.stabilization_s)
    if not _number(stabilization) or not 0 <= stabilization <= MAX_INTERVAL_SECONDS:
        problems.append(
            f"{path}.stabilizationSeconds: {shown(stabilization)} must be a number of seconds in "
            f"[0, {MAX_INTERVAL_SECONDS}] (e.g. 30)"
        )
        stabilization = default.stabilization_s
    thresholds = raw.get("thresholds") or {}
    if not isinstance(thresholds, Mapping):
        problems.append(f"{path}.thresholds: is not a mapping; write {{thetaMin: 0.3, thetaMax: 0.8}}")
        thresholds = {}

    def share(key: str, fallback: float) -> float:
        value = thresholds.get(key, fallback)
        if not _number(value) or not 0.0 < value <= 1.0:
            problems.append(f"{path}.thresholds.{key}: {shown(value)} must be a number in (0, 1]")
            return fallback
        return float(value)

    theta_min, theta_max = share("thetaMin", default.theta_min), share("thetaMax", default.theta_max)
    if theta_min >= theta_max:
        problems.append(f"{path}.thresholds.thetaMin: {theta_min:g} is not below thetaMax {theta_max:g}; lower it")
    low, high = share("low", default.low_threshold), share("high", default.high_threshold)
    if low >= high:
        problems.append(f"{path}.thresholds.low: {low:g} is not below high {high:g}; lower it")
    per_node = None
    if "executorsPerNode" in thresholds:
        per_node = _int_field(
            thresholds,
            "executorsPerNode",
            f"{path}.thresholds.executorsPerNode",
            problems,
            default=None,
            minimum=1,
            maximum=MAX_SLOTS_PER_NODE,
        )
    return AutoScalingSpec(
        enabled=bool(raw.get("enabled", False)),
        policy=str(policy),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        theta_min=theta_min,
        theta_max=theta_max,
        combine=str(combine),
        capacity_threshold=share("capacity", default.capacity_threshold),
        executors_per_node=per_node,
        high_threshold=high,
        low_threshold=low,
        stabilization_s=float(stabilization),
        execute=bool(raw.get("execute", True)),
    )


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
