"""How values read back from Redis are decoded: one place for the bytes-or-str answers of redis-py (a client
made with or without `decode_responses`) and for a metric sample's stream fields."""

from __future__ import annotations

from collections.abc import Mapping

from elastream.core.metrics import MetricSample


def text(value: bytes | str) -> str:
    """A Redis reply as text."""
    return value.decode() if isinstance(value, bytes) else value


def optional_text(value: bytes | str | None) -> str | None:
    return None if value is None else text(value)


def as_bytes(value: bytes | str) -> bytes:
    """A Redis reply as bytes (state, events and positions are msgpack blobs)."""
    return value.encode() if isinstance(value, str) else value


def decode_sample(fields: Mapping[bytes | str, bytes | str]) -> MetricSample:
    """A metric stream entry's fields as a `MetricSample` (the inverse of `MetricStream.publish`)."""
    return MetricSample.from_dict({text(k): text(v) for k, v in fields.items()})
