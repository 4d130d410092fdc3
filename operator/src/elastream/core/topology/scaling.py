"""spec.scaling (strategy, migration, the autoscaler's settings) and spec.resources (a node's CPU).

Every quantity of spec.resources is checked by its value too: the CRD's patterns take `-1Gi`, `0` and `1e999`,
which no pod can have."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from elastream.core.rates import is_finite_number, shown
from elastream.core.topology.limits import (
    _CPU_RE,
    _QUANTITY_RE,
    DEFAULT_CONGESTION_RATE,
    DEFAULT_WINDOW,
    MAX_NODE_CPU,
    MAX_NODE_MEMORY,
    MIN_CPU,
    MIN_NODE_MEMORY,
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
    """A Kubernetes CPU quantity ("2", "500m", 1.5) in cores (an integer too large for a float: infinity).
    Raises ValueError when it is not one."""
    if is_finite_number(value):
        return _as_float(value)
    match = _CPU_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"{shown(value)} is not a CPU quantity")
    number = float(match.group(1))
    return number / 1000.0 if match.group(3) else number


#: the multipliers of a quantity's suffixes: binary SI, and decimal SI as a power of ten
_BINARY_SI = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity (resource.Quantity: "512Mi", "2G", "1e9", "500m", 1073741824) as a number, of bytes
    for a memory; infinity for one too large for a float, the smallest positive float for a positive one too
    small for it. Raises ValueError when it is not one. As quick for `1e999999999` or a thousand digits as for
    "2Gi": nothing is computed at the size the text names."""
    if is_finite_number(value):
        return _as_float(value)
    match = _QUANTITY_RE.fullmatch(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"{shown(value)} is not a quantity")
    sign, number, binary, decimal, exponent = match.groups()
    mantissa = float(number)  # infinity for more digits than a float holds
    if binary:
        magnitude = mantissa * _BINARY_SI[binary]
    else:
        if exponent is None:
            power = _DECIMAL_SI[decimal or ""]
        else:
            digits = exponent.lstrip("+-").lstrip("0")
            power = int(exponent) if len(digits) <= 6 else (-(10**6) if exponent.startswith("-") else 10**6)
        try:
            magnitude = mantissa * 10.0**power
        except OverflowError:
            magnitude = math.inf
        if mantissa > 0 and magnitude == 0.0:
            magnitude = math.ulp(0.0)  # positive, however small: never read as 0
    return -magnitude if sign == "-" and magnitude else magnitude


def _as_float(value: int | float) -> float:
    """An int or a float as a float, an integer too large for one as an infinity of its sign."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _parse_node_cpu(raw: Any, problems: list[str]) -> float | None:
    """spec.resources: every quantity's value checked (the form is the CRD's pattern, the value past what a
    schema says) and each request within its limit, as the API server checks a pod's, so a spec no worker pod
    can have is refused where it is written, not when its pods are created. Returns limits.cpu in cores (None
    when it is not given or is refused), the CPU one node may use in the planner's model."""
    if not isinstance(raw, Mapping):
        return None  # not a mapping: the CRD's to say
    amounts: dict[tuple[str, str], float] = {}
    for group in ("limits", "requests"):
        section = raw.get(group)
        if not isinstance(section, Mapping):
            continue
        for resource in ("cpu", "memory"):
            value = section.get(resource)
            if value is None:
                continue
            amount, problem = _resource_amount(group, resource, value)
            if problem is not None:
                problems.append(f"spec.resources.{group}.{resource}: {shown(value)} {problem}")
            else:
                amounts[group, resource] = amount
    for resource in ("cpu", "memory"):
        limit, request = amounts.get(("limits", resource)), amounts.get(("requests", resource))
        if limit is not None and request is not None and request > limit:
            problems.append(
                f"spec.resources.requests.{resource}: {shown(raw['requests'][resource])} is above limits.{resource} "
                f"{shown(raw['limits'][resource])} (Kubernetes refuses such a pod); lower the request or raise the "
                "limit"
            )
    return amounts.get(("limits", "cpu"))


_MAX_MEMORY, _MIN_MEMORY = f"{MAX_NODE_MEMORY // 2**40}Ti", f"{MIN_NODE_MEMORY // 2**20}Mi"


def _resource_amount(group: str, resource: str, value: Any) -> tuple[float, str | None]:
    """(the amount, in cores or bytes; why it cannot be one worker pod's `group` of `resource`, or None)."""
    limit = group == "limits"
    if resource == "cpu":
        example = "'2' or '500m'"
        try:
            cores = parse_cpu(value)
        except ValueError:
            return 0.0, f"is not a CPU quantity; write e.g. {example}"
        if cores < 0:
            return cores, f"is negative; give the CPU one worker may use, e.g. {example}"
        if not cores <= MAX_NODE_CPU:
            return cores, f"is above {MAX_NODE_CPU} cores; give at most {MAX_NODE_CPU}, e.g. {example}"
        if cores == 0 and limit:
            return cores, f"is 0: a worker with no CPU cannot run; give e.g. {example}, or remove the limit"
        if 0 < cores < MIN_CPU:
            return cores, f"is below 1m, Kubernetes' smallest CPU amount; give at least 1m, e.g. {example}"
        return cores, None
    example = "512Mi or 2Gi"
    try:
        size = parse_quantity(value)
    except ValueError:
        return 0.0, f"is not a Kubernetes quantity; write e.g. {example}"
    milli = isinstance(value, str) and value.endswith("m")
    hint = " (m is milli: write Mi for mebibytes)" if milli else ""
    if size < 0:
        return size, f"is negative; give the memory one worker may use, e.g. {example}"
    if not size <= MAX_NODE_MEMORY:
        return size, f"is above {_MAX_MEMORY}; give at most {_MAX_MEMORY}, e.g. {example}"
    if limit and size < MIN_NODE_MEMORY:
        return size, f"is below {_MIN_MEMORY}, too little for a worker to start{hint}; give e.g. {example}"
    if 0 < size < 1:
        return size, f"is less than one byte{hint}; give e.g. 128Mi, or 0"
    return size, None
