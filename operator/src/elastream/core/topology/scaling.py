"""spec.scaling (strategy, migration, the autoscaler's settings) and spec.resources (a node's CPU)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from elastream.core.rates import is_finite_number, shown
from elastream.core.topology.limits import (
    _CPU_RE,
    DEFAULT_CONGESTION_RATE,
    DEFAULT_WINDOW,
    MAX_NODE_CPU,
)
from elastream.core.topology.model import AutoScalingSpec, ScalingSpec


def _parse_scaling(raw: Mapping[str, Any] | None, problems: list[str]) -> ScalingSpec:
    """spec.scaling with its defaults; its types, enums and ranges are the CRD's."""
    if raw is None:
        return ScalingSpec()
    return ScalingSpec(
        strategy=raw.get("strategy", "stela"),
        migration=raw.get("migration", "ccr"),
        migration_scope=raw.get("migrationScope", "all"),
        congestion_rate=float(raw.get("congestionRate", DEFAULT_CONGESTION_RATE)),
        window=raw.get("window", DEFAULT_WINDOW),
        checkpoint_interval_s=raw.get("checkpointIntervalSeconds", 10),
        auto=_parse_auto(raw.get("auto"), problems),
    )


#: where the autoscaler's settings are in a manifest
_AUTO = "spec.scaling.auto"


def _parse_auto(raw: Mapping[str, Any] | None, problems: list[str]) -> AutoScalingSpec:
    """spec.scaling.auto with its defaults and the orders the CRD does not state (thetaMin below thetaMax, low
    below high; minNodes not above maxNodes is the CRD's rule)."""
    default = AutoScalingSpec()
    if raw is None:
        return default
    thresholds: Mapping[str, Any] = raw.get("thresholds") or {}

    def share(key: str, fallback: float) -> float:
        return float(thresholds.get(key, fallback))

    theta_min, theta_max = share("thetaMin", default.theta_min), share("thetaMax", default.theta_max)
    if theta_min >= theta_max:
        problems.append(f"{_AUTO}.thresholds.thetaMin: {theta_min:g} is not below thetaMax {theta_max:g}; lower it")
    low, high = share("low", default.low_threshold), share("high", default.high_threshold)
    if low >= high:
        problems.append(f"{_AUTO}.thresholds.low: {low:g} is not below high {high:g}; lower it")
    return AutoScalingSpec(
        enabled=raw.get("enabled", False) is True,
        policy=raw.get("policy", default.policy),
        min_nodes=raw.get("minNodes", 1),
        max_nodes=raw.get("maxNodes", 20),
        theta_min=theta_min,
        theta_max=theta_max,
        combine=raw.get("combine", default.combine),
        capacity_threshold=share("capacity", default.capacity_threshold),
        executors_per_node=thresholds.get("executorsPerNode"),
        high_threshold=high,
        low_threshold=low,
        stabilization_s=float(raw.get("stabilizationSeconds", default.stabilization_s)),
        execute=raw.get("execute", True) is not False,
    )


def parse_cpu(value: Any) -> float:
    """A Kubernetes CPU quantity ("2", "500m", 1.5) in cores. Raises ValueError when it is not one."""
    if is_finite_number(value):
        return float(value)
    match = _CPU_RE.match(str(value).strip())
    if not match:
        raise ValueError(f"{shown(value)} is not a CPU quantity")
    number = float(match.group(1))
    return number / 1000.0 if match.group(3) else number


def _parse_node_cpu(raw: Mapping[str, Any] | None, problems: list[str]) -> float | None:
    """spec.resources.limits.cpu in cores (None when not given); the quantity's form is the CRD's pattern, its
    size is checked here (a string's value is past what a schema says)."""
    cpu = ((raw or {}).get("limits") or {}).get("cpu")
    if cpu is None:
        return None
    cores = parse_cpu(cpu)
    if not math.isfinite(cores) or not 0 < cores <= MAX_NODE_CPU:
        problems.append(f"spec.resources.limits.cpu: {shown(cpu)} must be above 0 and at most {MAX_NODE_CPU} cores")
        return None
    return cores
