"""What the topology's connectors report: what they cannot do (a Kafka topic missing or not authorised, its
brokers away), from the executors' metric samples, as one line for the Degraded condition (ConnectorError)
and events when it starts, when it changes and when it is over; and the kafka sources' lag per partition
(`partition_lag`, for the status). A source waits and a sink retries meanwhile, so nothing
is lost: the condition is there to say why nothing moves, not to stop anything.

The text is the executors' own (a tenant's workers write the metric stream): it is bounded where samples are
read (`core.metrics.MAX_PROBLEM_CHARS`), and only this topology's status and events carry it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from elastream.core.ports import Clock, EventSink
from elastream.core.status import EventReason
from elastream.core.topology import split_executor_id
from elastream.store.codec import unpack

#: executors named in the condition's message at most (the rest are counted)
SHOWN = 3
#: a changed problem is told again at most this often (seconds); its start and its end are always told
RETELL_S = 60.0


def connector_message(problems: Mapping[str, str]) -> str:
    """One line for `problems` (executor -> its words): the first `SHOWN` executors, then how many more."""
    if not problems:
        return ""
    items = sorted(problems.items())
    line = "; ".join(f"{executor}: {problem}" for executor, problem in items[:SHOWN])
    return line + (f" (and {len(items) - SHOWN} more executors)" if len(items) > SHOWN else "")


@dataclass
class ConnectorWatch:
    """The ConnectorError condition's message, and its events."""

    events: EventSink
    clock: Clock
    #: the condition's message now ("" when every connector works)
    error: str = ""
    told_at: float = float("-inf")

    def note(self, problems: Mapping[str, str]) -> str:
        message = connector_message(problems)
        now = self.clock.now()
        started = message and not self.error
        changed = message and message != self.error and now - self.told_at >= RETELL_S
        if started or changed:
            self.events.emit(EventReason.CONNECTOR_ERROR, message, warning=True)
            self.told_at = now
        elif not message and self.error:
            self.events.emit(EventReason.CONNECTOR_RECOVERED, "every source and sink reaches its system again")
        self.error = message
        return message


#: partitions listed per source vertex in the status at most (the largest lags; the total counts them all)
STATUS_PARTITIONS = 64
#: how often the controller reads the kafka sources' partition lags (seconds)
LAG_READ_S = 5.0


class LagSource(Protocol):
    def partition_lag(self, executors: Iterable[str]) -> dict[str, bytes]: ...


def partition_lag(store: LagSource, executors: Iterable[str]) -> dict[str, dict[int, int]]:
    """Per vertex: partition -> messages not read yet, merged over `executors` (`<vertex>#<i>`, the kafka
    source executors of the schedule). What a worker wrote that is not such a map is left out."""
    merged: dict[str, dict[int, int]] = {}
    for executor, blob in store.partition_lag(executors).items():
        try:
            lags = unpack(blob)
        except Exception:  # written by a tenant's worker: anything that does not decode is skipped
            continue
        if not isinstance(lags, Mapping):
            continue
        vertex = split_executor_id(executor)[0]
        into = merged.setdefault(vertex, {})
        for partition, messages in lags.items():
            if isinstance(partition, int) and isinstance(messages, int) and partition >= 0 and messages >= 0:
                into[partition] = messages
    return merged


def status_lag(lags: Mapping[int, int]) -> dict[str, int]:
    """The status' `partitionLag` of one vertex: its `STATUS_PARTITIONS` largest lags, by partition number."""
    largest = sorted(lags.items(), key=lambda item: (-item[1], item[0]))[:STATUS_PARTITIONS]
    return {str(p): n for p, n in sorted(largest)}
