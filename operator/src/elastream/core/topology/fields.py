"""Checks of one scalar field of a manifest block, each appending a problem line naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastream.core.rates import is_finite_number, shown


def _int_field(
    block: Mapping[str, Any],
    key: str,
    path: str,
    problems: list[str],
    *,
    default: int | None,
    minimum: int,
    maximum: int,
) -> int | None:
    value = block.get(key, default)
    if value is None:
        problems.append(f"{path}: is missing; set it to an integer in [{minimum}, {maximum}]")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{path}: {shown(value)} is not an integer; set it to an integer in [{minimum}, {maximum}]")
        return None
    if value < minimum:
        problems.append(f"{path}: {shown(value)} is below {minimum}; set it to at least {minimum}")
        return None
    if value > maximum:
        problems.append(f"{path}: {shown(value)} is above {maximum}, the most allowed; set it to at most {maximum}")
        return None
    return value


def _bounded_number(
    block: Mapping[str, Any], key: str, path: str, problems: list[str], low: float, high: float, *, above: bool = False
) -> bool:
    """Whether `block[key]` (present) is a finite number in [low, high] ((low, high] with `above`); a problem
    line naming the field and the range otherwise."""
    value = block[key]
    low_ok = is_finite_number(value) and (value > low if above else value >= low)
    if low_ok and value <= high:
        return True
    interval = f"{'(' if above else '['}{low}, {high}]"
    if low_ok:
        problems.append(f"{path}: {shown(value)} is above {high}, the most allowed; set it to at most {high}")
    else:
        problems.append(f"{path}: {shown(value)} is not a finite number in {interval}; fix it")
    return False


def _number(value: Any) -> bool:
    return is_finite_number(value)
