"""How values go into Redis and come back: msgpack blobs (state, captured events, source positions: `pack`,
`unpack`, written by the workers and read by both the workers and the controller), the bytes-or-str answers of
redis-py (a client made with or without `decode_responses`) and a metric sample's stream fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from elastream.core.metrics import MAX_PROBLEM_CHARS, MetricSample, SnapshotError


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


#: a metric sample's text fields (node, vertex, executor) are names of at most 63 characters, an executor's with
#: '#' and its index after it: longer is not a sample
MAX_SAMPLE_NAME_CHARS = 256
#: the largest timestamp (seconds since the epoch, about the year 5138) and the largest value of a float field
#: (busy seconds, latency): finite and far above any real one, so sums and differences of many stay finite
MAX_SAMPLE_TS = 1e11
MAX_SAMPLE_FLOAT = 1e15
#: the largest counter (events since the executor started): 2^53, the last integer a float holds exactly
MAX_SAMPLE_COUNT = 2**53
_FLOATS = ("ts", "started_at", "busy_s", "latency_ms")
_COUNTS = ("received", "processed", "emitted", "queue_len", "errors")
_NAMES = ("node", "vertex", "executor")
_OPTIONAL = {"latency_ms": 0.0, "errors": 0}


def decode_sample(fields: Mapping[bytes | str, bytes | str], names: dict[str, str] | None = None) -> MetricSample:
    """A metric stream entry's fields as a `MetricSample` (the inverse of `MetricStream.publish`).

    The fields are written by a tenant's workers, so nothing about them is trusted: a missing or unparsable
    field, text that is not UTF-8, a NaN or infinite number, a negative count or duration, or a value beyond
    the bounds above raises `SnapshotError` with a short reason (never the whole value). Extra fields are
    ignored. `names` (optional) shares equal node, vertex and executor strings among the samples of one read."""
    data: dict[str, str] = {}
    for key, value in fields.items():
        try:
            data[text(key)] = text(value)
        except (UnicodeDecodeError, AttributeError):
            raise SnapshotError(f"metric sample field {_brief(key)} is not UTF-8 text") from None
    values: dict[str, object] = {}
    for name in _NAMES:
        name_value = _field(data, name)
        if not name_value or len(name_value) > MAX_SAMPLE_NAME_CHARS:
            raise SnapshotError(
                f"metric sample {name} {_brief(name_value)} is empty or longer than {MAX_SAMPLE_NAME_CHARS}"
            )
        values[name] = name_value if names is None else names.setdefault(name_value, name_value)
    for name in _FLOATS:
        raw: str | None = data.get(name) if name in _OPTIONAL else _field(data, name)
        if raw is None:
            values[name] = _OPTIONAL[name]
            continue
        try:
            number = float(raw)
        except ValueError:
            raise SnapshotError(f"metric sample {name} {_brief(raw)} is not a number") from None
        bound = MAX_SAMPLE_TS if name in ("ts", "started_at") else MAX_SAMPLE_FLOAT
        if not 0.0 <= number <= bound:  # False for NaN too
            raise SnapshotError(f"metric sample {name} {_brief(raw)} is not between 0 and {bound:g}")
        values[name] = number
    for name in _COUNTS:
        raw = data.get(name) if name in _OPTIONAL else _field(data, name)
        if raw is None:
            values[name] = _OPTIONAL[name]
            continue
        if len(raw) > 20:  # int() of a long digit string is slow, and no count has more than 16 digits
            raise SnapshotError(f"metric sample {name} {_brief(raw)} is not a count")
        try:
            count = int(raw)
        except ValueError:
            raise SnapshotError(f"metric sample {name} {_brief(raw)} is not an integer") from None
        if not 0 <= count <= MAX_SAMPLE_COUNT:
            raise SnapshotError(f"metric sample {name} {_brief(raw)} is not between 0 and 2^53")
        values[name] = count
    problem = data.get("problem")
    if problem:  # a connector's words: kept as text, cut to the bound (the field itself is at most 256 bytes)
        values["problem"] = problem[:MAX_PROBLEM_CHARS]
    return MetricSample(**values)  # type: ignore[arg-type]


def _field(data: Mapping[str, str], name: str) -> str:
    try:
        return data[name]
    except KeyError:
        raise SnapshotError(f"metric sample has no {name}") from None


def _brief(value: object, chars: int = 40) -> str:
    """A value in an error message: its repr, cut to `chars` characters (a tenant chose it, and its size)."""
    shown = repr(value)
    return shown if len(shown) <= chars else f"{shown[:chars]}... ({len(shown)} characters)"
