"""How values go into Redis and come back: msgpack blobs (state, captured events, source positions: `pack`,
`unpack`, written by the workers and read by both the workers and the controller), the bytes-or-str answers of
redis-py (a client made with or without `decode_responses`) and a metric sample's stream fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from elastream.core.metrics import MetricSample


def pack(value: Any) -> bytes:
    """`value` as a msgpack blob (binary strings kept apart from text)."""
    return bytes(msgpack.packb(value, use_bin_type=True))


def unpack(blob: bytes | memoryview) -> Any:
    """The inverse of `pack`: lists come back as tuples, map keys may be any type."""
    return msgpack.unpackb(blob, raw=False, use_list=False, strict_map_key=False)


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
