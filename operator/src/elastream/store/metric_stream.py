"""The Redis metric stream `<prefix>metrics`: workers append samples, the analysis reads a window.

One stream entry per `MetricSample`, its fields the sample's fields as strings, so any Redis client (and
Spark, through a plain read) can decode it. The stream is capped approximately (MAXLEN ~) so it holds about
an hour of samples: workers size the cap for the executors of their schedule and their interval
(`metric_stream_maxlen`).

The stream lies under the topology's prefix, which its workers (the tenant's code) may write: what the
operator reads from it is bounded and checked, so a worker that appends a gigabyte, or one malformed entry,
costs the operator a bounded read and a counted skip, never its memory or an exception:

- every read is paged with `COUNT` (`PAGE_ENTRIES` entries a page) and stops at a budget of entries and of
  bytes looked at (`read_bytes`: 1 KiB an entry of the budget); a read that stops there says so
  (`StreamRead.truncated`);
- the pages are read by a short server-side script (`_SCAN`, on the operator's own connection) that returns
  an entry whole only when it has at most `MAX_ENTRY_FIELDS` fields, none longer than `MAX_FIELD_BYTES`, and
  only its id and size otherwise: an oversized entry never reaches the operator's memory. The script holds
  at most `_SCRIPT_CHUNK` entries at a time and stops a page after `PAGE_SCAN_BYTES`. Where scripts are
  refused (a Redis user without EVAL), plain XRANGE pages are used, smaller after a large entry was seen,
  and the same caps are checked on the operator's side;
- entries are decoded by `codec.decode_sample`, which refuses anything but a valid sample (NaN, a negative
  count, a missing field, ...); oversized and malformed entries are skipped and counted in the read's
  `StreamRead`, whose reader (the controller) reports them;
- readers resume by entry id (`read_forward` returns the bound to read on from), never by re-reading from a
  sample's timestamp, which the worker wrote.

A real sample has 12 fields of at most about 70 bytes (an executor id: a 63-character vertex name, '#' and
its index); the caps are well above that.
"""

from __future__ import annotations

import logging
import math
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from elastream.core.metrics import MetricSample, SnapshotError
from elastream.store.codec import decode_sample, text

log = logging.getLogger("elastream.store")

DEFAULT_MAXLEN = 3600 * 200  # an hour of 1 s samples for 200 executors (when the schedule is not known)
#: what the cap keeps at least, however few executors
MIN_MAXLEN = 10_000
HOUR_S = 3600.0

#: an entry with more field-value pairs than this is not a sample (a sample has 12)
MAX_ENTRY_FIELDS = 32
#: an entry with a field name or value longer than this (bytes) is not a sample (a sample's longest is ~70)
MAX_FIELD_BYTES = 256
#: entries a page (one XRANGE/XREVRANGE COUNT, one script call) looks at, at most
PAGE_ENTRIES = 1000
#: bytes (field names and values) after which a page stops: bounds one script call's time (a few ms)
PAGE_SCAN_BYTES = 1024 * 1024
#: the entries one read looks at when its caller gives no budget
READ_BUDGET_ENTRIES = 100_000
#: the bytes one read looks at, at most (oversized entries' included), per entry of its budget (about four
#: real samples), and at least READ_MIN_BYTES: bounds one read's time and traffic however large the entries
READ_BYTES_PER_ENTRY = 1024
READ_MIN_BYTES = 8 * 1024 * 1024
#: entries the server-side scan copies at a time at most (what it holds of a stream of huge entries at once):
#: it starts with one and copies about what is left of PAGE_SCAN_BYTES in entries like the largest seen
_SCRIPT_CHUNK = 32
#: the first plain (scriptless) page's COUNT; later pages fit PAGE_SCAN_BYTES by the largest entry seen
_PLAIN_FIRST_PAGE = 16

#: KEYS[1] the stream; ARGV: direction ("fwd"/"rev"), the low and high bounds, the most entries, the most
#: field-value pairs and bytes of one field, the bytes after which to stop, the most entries copied at a
#: time. Returns {stopped_by_bytes,
#: {id, {fields...}} or {id, size} for an oversized entry, ...}. Reads only; no key but KEYS[1].
_SCAN = """
local key = KEYS[1]
local reverse = ARGV[1] == 'rev'
local lo, hi = ARGV[2], ARGV[3]
local limit = tonumber(ARGV[4])
local max_items = 2 * tonumber(ARGV[5])
local max_len = tonumber(ARGV[6])
local max_scan = tonumber(ARGV[7])
local max_chunk = tonumber(ARGV[8])
local out = {}
local n = 0
local scanned = 0
local chunk = 1
while n < limit and scanned < max_scan do
  local want = math.min(chunk, limit - n)
  local got
  if reverse then
    got = redis.call('XREVRANGE', key, hi, lo, 'COUNT', want)
  else
    got = redis.call('XRANGE', key, lo, hi, 'COUNT', want)
  end
  local biggest = 1
  for j = 1, #got do
    local id, fields = got[j][1], got[j][2]
    local ok = #fields <= max_items
    local size = 0
    for i = 1, #fields do
      local len = #fields[i]
      size = size + len
      if len > max_len then ok = false end
    end
    if size > biggest then biggest = size end
    n = n + 1
    scanned = scanned + size
    if ok then out[n] = {id, fields} else out[n] = {id, size} end
    if reverse then hi = '(' .. id else lo = '(' .. id end
    if scanned >= max_scan then break end
  end
  if #got < want then break end
  -- the next chunk: about what is left to scan, in entries like the largest of this one
  chunk = math.max(1, math.min(max_chunk, 2 * want, math.floor((max_scan - scanned) / biggest)))
end
if scanned >= max_scan then return {1, out} end
return {0, out}
"""

#: one entry of a page: its id, its fields (None: oversized, not returned) and their bytes
Entry = tuple[str, Mapping[Any, Any] | None, int]

_ID = re.compile(r"\(?(\d{1,20})-(\d{1,20})")
_ID_MAX = 2**64 - 1
#: clients whose Redis refused the scan script: their reads use plain pages
_NO_SCRIPTS: weakref.WeakSet[Any] = weakref.WeakSet()


def metric_stream_maxlen(executors: int, interval_s: float, keep_s: float = HOUR_S) -> int:
    """Entries that hold `keep_s` seconds of samples of `executors` executors publishing every `interval_s`."""
    per_second = max(1, executors) / max(interval_s, 0.001)
    return max(MIN_MAXLEN, int(keep_s * per_second + 0.5))


def metric_stream_key(prefix: str) -> str:
    return f"{prefix}metrics"


def read_bytes(entries: int) -> int:
    """The bytes a read of at most `entries` entries looks at, at most."""
    return max(READ_MIN_BYTES, entries * READ_BYTES_PER_ENTRY)


def stream_start(ts: float | None) -> str:
    """The range bound of the first entry added at or after `ts` (seconds; Redis' clock makes the ids)."""
    if ts is None or not math.isfinite(ts) or ts <= 0:
        return "-"
    return f"{min(int(ts * 1000), _ID_MAX)}-0"


def id_order(bound: str) -> tuple[int, int, int]:
    """A sort key of a stream range bound ("-", "+", "<ms>-<seq>", "(<ms>-<seq>" exclusive)."""
    if bound == "-":
        return (-1, 0, 0)
    if bound == "+":
        return (2**64, 0, 0)
    match = _ID.fullmatch(bound)
    if match is None:
        raise ValueError(f"not a stream id: {bound[:40]!r}")
    return (int(match.group(1)), int(match.group(2)), 1 if bound.startswith("(") else 0)


def is_entry_id(value: str | None) -> bool:
    """Whether `value` is a stream entry id (`<ms>-<seq>`): a cursor read back from Redis may be anything."""
    match = None if value is None or value.startswith("(") else _ID.fullmatch(value)
    return match is not None and int(match.group(1)) <= _ID_MAX and int(match.group(2)) <= _ID_MAX


@dataclass
class StreamRead:
    """What one read of the metric stream found: the valid samples (oldest first) and what it skipped."""

    samples: list[MetricSample] = field(default_factory=list, repr=False)
    #: entries looked at, and the bytes of their field names and values
    scanned: int = 0
    scanned_bytes: int = 0
    #: entries skipped: not a valid sample / too many or too large fields
    malformed: int = 0
    oversized: int = 0
    #: the budget ended the read before the range did (more entries may lie beyond it)
    truncated: bool = False
    #: where a forward read goes on from (the exclusive bound after its last entry), else its start
    next_start: str = "-"
    #: the first skipped entry, said briefly (for a warning)
    problem: str = ""

    @property
    def skipped(self) -> int:
        return self.malformed + self.oversized

    def note(self, problem: str) -> None:
        if not self.problem:
            self.problem = problem


class MetricStream:
    def __init__(self, client: redis.Redis, prefix: str, maxlen: int = DEFAULT_MAXLEN) -> None:
        self.client = client
        self.key = metric_stream_key(prefix)
        self.maxlen = maxlen
        #: the last read's findings (read_since and read_last return only the samples)
        self.last_read = StreamRead()
        self._plain_count = _PLAIN_FIRST_PAGE
        self._script: Any = None

    def publish(self, samples: Iterable[MetricSample]) -> int:
        """Append samples in one pipelined round trip; returns how many were written."""
        pipe = self.client.pipeline(transaction=False)
        count = 0
        for sample in samples:
            fields = {k: str(v) for k, v in sample.to_dict().items()}
            pipe.xadd(self.key, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            count += 1
        if count:
            pipe.execute()
        return count

    # ------------------------------------------------------------------------------------------- reads

    def read_since(self, since_ts: float | None = None, count: int | None = None, end: str = "+") -> list[MetricSample]:
        """Samples of the entries added at or after `since_ts` (all when None) and up to the range bound `end`,
        oldest first: the newest `count` entries of them at most (default `READ_BUDGET_ENTRIES`), and
        `read_bytes(count)`."""
        self.last_read = self.scan(stream_start(since_ts), end, reverse=True, max_entries=count)
        return self.last_read.samples

    def read_last(self, count: int) -> list[MetricSample]:
        """The samples among the newest `count` entries, oldest first."""
        self.last_read = self.scan("-", "+", reverse=True, max_entries=count)
        return self.last_read.samples

    def read_forward(self, start: str, max_entries: int | None = None) -> StreamRead:
        """The entries from the range bound `start` on, oldest first, within the budget: go on from the
        read's `next_start` (an entry id, never a sample's timestamp)."""
        self.last_read = self.scan(start, "+", reverse=False, max_entries=max_entries)
        return self.last_read

    def newest_id(self) -> str | None:
        """The id of the newest entry (its fields are not read), None for an empty stream or another type."""
        try:
            page, _ = self._page("-", "+", True, 1, 1)
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            return None
        return page[0][0] if page else None

    def scan(
        self,
        start: str,
        end: str,
        reverse: bool = False,
        max_entries: int | None = None,
        max_bytes: int | None = None,
    ) -> StreamRead:
        """The valid samples of the entries between the bounds `start` and `end`, oldest first; `reverse`
        reads from `end` down (the newest first, where the budget cuts the oldest off). At most
        `max_entries` entries (default `READ_BUDGET_ENTRIES`) and `max_bytes` bytes (default
        `read_bytes(max_entries)`) are looked at."""
        budget = READ_BUDGET_ENTRIES if max_entries is None else max(0, max_entries)
        max_bytes = read_bytes(budget) if max_bytes is None else max_bytes
        read = StreamRead(next_start=start)
        names: dict[str, str] = {}
        lo, hi = start, end
        samples: list[MetricSample] = []
        exhausted = False
        while read.scanned < budget and read.scanned_bytes < max_bytes:
            want = min(PAGE_ENTRIES, budget - read.scanned)
            try:
                page, ended = self._page(lo, hi, reverse, want, min(PAGE_SCAN_BYTES, max_bytes - read.scanned_bytes))
            except redis.ResponseError as exc:
                if "WRONGTYPE" not in str(exc):
                    raise
                read.malformed += 1
                read.note(f"{self.key} is not a stream")
                exhausted = True
                break
            for entry_id, fields, size in page:
                read.scanned += 1
                read.scanned_bytes += size
                if fields is None:
                    read.oversized += 1
                    read.note(
                        f"entry {entry_id}: more than {MAX_ENTRY_FIELDS} fields or one longer than "
                        f"{MAX_FIELD_BYTES} bytes ({size} bytes)"
                    )
                    continue
                try:
                    samples.append(decode_sample(fields, names))
                except SnapshotError as exc:
                    read.malformed += 1
                    read.note(f"entry {entry_id}: {exc}")
            if page:
                last = page[-1][0]
                if reverse:
                    hi = f"({last}"
                else:
                    lo = read.next_start = f"({last}"
            if not page or ended:
                exhausted = True
                break
        read.truncated = not exhausted
        if reverse:
            samples.reverse()
        read.samples = samples
        return read

    # ------------------------------------------------------------------------------------------- pages

    def _page(self, lo: str, hi: str, reverse: bool, count: int, max_bytes: int) -> tuple[list[Entry], bool]:
        """One page: (id, fields or None when oversized, bytes) per entry, in read order, and whether the range
        ended within it."""
        if self.client not in _NO_SCRIPTS:
            try:
                return self._script_page(lo, hi, reverse, count, max_bytes)
            except redis.ResponseError as exc:
                if not _scripts_refused(exc):
                    raise
                # a Redis user without EVAL/EVALSHA (or scripting off): plain pages, checked here
                log.warning("metric stream reads without the scan script (%s): plain XRANGE pages", exc)
                _NO_SCRIPTS.add(self.client)
        return self._plain_page(lo, hi, reverse, count, max_bytes)

    def _script_page(self, lo: str, hi: str, reverse: bool, count: int, max_bytes: int) -> tuple[list[Entry], bool]:
        if self._script is None:
            self._script = self.client.register_script(_SCAN)
        args = ["rev" if reverse else "fwd", lo, hi, count, MAX_ENTRY_FIELDS, MAX_FIELD_BYTES, max_bytes, _SCRIPT_CHUNK]
        stopped_by_bytes, entries = self._script(keys=[self.key], args=args)
        page: list[Entry] = []
        for entry in entries:
            entry_id, body = text(entry[0]), entry[1]
            if isinstance(body, int):
                page.append((entry_id, None, body))
            else:
                page.append((entry_id, _pairs(body), sum(len(x) for x in body)))
        return page, len(page) < count and not int(stopped_by_bytes)

    def _plain_page(self, lo: str, hi: str, reverse: bool, count: int, max_bytes: int) -> tuple[list[Entry], bool]:
        want = max(1, min(count, self._plain_count))
        if reverse:
            entries = self.client.xrevrange(self.key, max=hi, min=lo, count=want) or []
        else:
            entries = self.client.xrange(self.key, min=lo, max=hi, count=want) or []
        page: list[Entry] = []
        largest = 1
        for entry_id, reply in entries:
            fields = reply or {}
            items = [x for pair in fields.items() for x in pair]
            size = sum(len(x) for x in items)
            largest = max(largest, size)
            fits = len(fields) <= MAX_ENTRY_FIELDS and all(len(x) <= MAX_FIELD_BYTES for x in items)
            page.append((text(entry_id or b""), fields if fits else None, size))
        del entries
        if count > 1:  # the next page holds about PAGE_SCAN_BYTES of entries like the largest of this one
            self._plain_count = max(1, min(PAGE_ENTRIES, 2 * want, max_bytes // largest))
        return page, len(page) < want


def _scripts_refused(exc: redis.ResponseError) -> bool:
    """Whether this Redis will never run the scan script for this user (not a passing refusal like BUSY)."""
    message = str(exc).lower()
    return isinstance(exc, redis.exceptions.NoPermissionError) or "unknown command" in message or "noperm" in message


def _pairs(flat: Sequence[Any]) -> dict[Any, Any]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat) - 1, 2)}
