"""What connectors report reaches the status: a problem in a metric sample becomes the Degraded condition
(ConnectorError) with events when it starts, changes (rate-limited) and ends; a kafka source's lag is the
vertex's `lag` and its partitions' `partitionLag`, read only as far as the topology's executors and sane values
go."""

from __future__ import annotations

from typing import Any

from elastream.control.connectors import (
    RETELL_S,
    ConnectorWatch,
    connector_message,
    partition_lag,
    status_lag,
)
from elastream.control.monitor import LiveRates
from elastream.core import topology
from elastream.core.metrics import MAX_PROBLEM_CHARS, MetricSample
from elastream.core.status import CONNECTOR_ERROR, DEGRADED, StatusFacts, desired_conditions
from elastream.runtime.worker_metrics import connector_problem
from elastream.store.codec import pack
from support.fakes import FakeClock, ListEvents
from support.manifests import edge, manifest


def sample(executor: str, ts: float = 10.0, queue_len: int = 0, problem: str = "") -> MetricSample:
    vertex = executor.split("#")[0]
    return MetricSample(ts, "node-0", vertex, executor, 0.0, 0, 0, 0, 0.0, queue_len, problem=problem)


def test_a_problem_starts_changes_and_ends_with_events_and_a_change_is_retold_at_most_every_minute() -> None:
    events, clock = ListEvents(), FakeClock()
    watch = ConnectorWatch(events, clock)
    assert watch.note({}) == "" and events.events == []
    topic_gone = {"in#0": "topic 'orders': Broker: Unknown topic or partition"}
    assert watch.note(topic_gone) == "in#0: topic 'orders': Broker: Unknown topic or partition"
    assert events.events == [("ConnectorError", "in#0: topic 'orders': Broker: Unknown topic or partition", True)]
    watch.note(topic_gone)  # the same: not told again
    watch.note({"in#0": "kafka client: all brokers down"})  # changed within a minute: the condition, no event
    assert len(events.events) == 1 and watch.error == "in#0: kafka client: all brokers down"
    clock.t += RETELL_S
    watch.note({"in#0": "kafka client: authentication failed"})
    assert len(events.events) == 2
    watch.note({})
    assert events.events[-1][0] == "ConnectorRecovered" and watch.error == ""


def test_the_message_names_three_executors_and_counts_the_rest() -> None:
    problems = {f"out#{i}": "cannot write topic 'copy'" for i in range(5)}
    message = connector_message(problems)
    assert message.startswith("out#0: cannot write topic 'copy'; out#1:") and message.endswith("(and 2 more executors)")


def test_a_connector_error_makes_the_topology_degraded_naming_it() -> None:
    facts = StatusFacts(desired_nodes=2, ready_nodes=2, started=True, connector_error="in#0: topic 'x' not authorised")
    degraded = next(c for c in desired_conditions(facts) if c["type"] == DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", CONNECTOR_ERROR)
    assert "topic 'x' not authorised" in degraded["message"]


def test_a_samples_problem_is_bounded_and_round_trips_and_an_empty_one_costs_no_field() -> None:
    assert "problem" not in sample("in#0").to_dict()
    long = sample("in#0", problem="x" * 1000).to_dict()
    assert len(MetricSample.from_dict(long).problem) == MAX_PROBLEM_CHARS

    class Source:
        problem = "é" * 300  # two bytes each: cut by bytes, never mid-character

    cut = connector_problem(Source())
    assert len(cut.encode()) <= MAX_PROBLEM_CHARS and set(cut) == {"é"}


def kafka_topology() -> topology.Topology:
    return topology.parse_manifest(
        manifest(
            [
                {
                    "name": "in",
                    "source": {"type": "kafka", "topic": "t", "bootstrapServers": "k:9092"},
                    "parallelism": 2,
                },
                {"name": "out", "sink": {"type": "null"}},
            ],
            [edge("in", "out")],
        )
    )


def test_live_rates_give_the_fresh_problems_and_each_sources_backlog() -> None:
    live = LiveRates(kafka_topology(), stale_s=3.0)
    live.add(
        [
            sample("in#0", ts=10.0, queue_len=40, problem="topic 't': not authorised"),
            sample("in#1", ts=10.0, queue_len=2),
            sample("in#1", ts=4.0, queue_len=999),  # older than the newest: ignored
            sample("out#0", ts=10.0, problem="sink trouble"),
            sample("in#7", ts=2.0, problem="stale"),  # long silent: not fresh
        ]
    )
    assert live.connector_problems() == {"in#0": "topic 't': not authorised", "out#0": "sink trouble"}
    assert live.source_backlog() == {"in": 42}


class Lags:
    def __init__(self, blobs: dict[str, bytes]) -> None:
        self.blobs = blobs
        self.asked: list[str] = []

    def partition_lag(self, executors: Any) -> dict[str, bytes]:
        self.asked = list(executors)
        return {e: self.blobs[e] for e in self.asked if e in self.blobs}


def test_partition_lags_merge_per_vertex_and_what_is_not_a_lag_map_is_skipped() -> None:
    store = Lags(
        {
            "in#0": pack({0: 5, 4: 0}),
            "in#1": pack({2: 7, -1: 3, "x": 1, 6: -2}),  # a negative partition, a name, a negative lag: skipped
            "in#2": b"\xc1 not msgpack",
            "in#3": pack([1, 2, 3]),
        }
    )
    assert partition_lag(store, ["in#0", "in#1", "in#2", "in#3"]) == {"in": {0: 5, 4: 0, 2: 7}}
    assert store.asked == ["in#0", "in#1", "in#2", "in#3"]  # asked by name, never the whole hash


def test_the_status_lists_the_64_largest_partition_lags() -> None:
    lags = {p: p for p in range(100)}
    shown = status_lag(lags)
    assert len(shown) == 64 and min(int(p) for p in shown) == 36 and shown["99"] == 99


def test_the_metric_streams_decoder_keeps_a_problem_and_bounds_it() -> None:
    from elastream.store.codec import decode_sample

    fields = {k: str(v) for k, v in sample("in#0", problem="topic 'x': gone").to_dict().items()}
    assert decode_sample(fields).problem == "topic 'x': gone"
    fields["problem"] = "y" * 250
    assert decode_sample(fields).problem == "y" * MAX_PROBLEM_CHARS
    del fields["problem"]
    assert decode_sample(fields).problem == ""
