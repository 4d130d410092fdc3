"""The pure parts of the kafka source and sink: which executor reads which partition (spread, stable when the
topic grows), the outbox marker's encoding, client properties from a mounted Secret (reserved properties
refused, values never in an error), and the manifest's kafka blocks."""

from __future__ import annotations

import logging
import os
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastream.core import topology
from elastream.core.schedule import key_group_ranges
from elastream.runtime.operators.kafka import (
    KafkaSettingsError,
    client_properties,
    make_client,
    marker_entry,
    marker_offset,
    partition_lane,
    topology_identity,
)
from elastream.store.checkpoint_store import CheckpointScope
from elastream.worker_inputs.secrets import SecretUnavailable, secret_properties
from support.manifests import edge, manifest


def owners(partitions: int, parallelism: int, lanes: int = 128) -> Counter[int]:
    """How many partitions each executor of `parallelism` reads."""
    ranges = key_group_ranges(lanes, parallelism)
    counts: Counter[int] = Counter({i: 0 for i in range(parallelism)})
    for p in range(partitions):
        lane = partition_lane(p, lanes)
        counts[next(i for i, r in enumerate(ranges) if lane in r)] += 1
    return counts


@pytest.mark.parametrize(
    ("partitions", "parallelism", "expected"),
    [
        (8, 2, [4, 4]),
        (8, 3, [3, 3, 2]),
        (8, 4, [2, 2, 2, 2]),
        (8, 8, [1] * 8),
        (4, 8, [1, 1, 1, 1, 0, 0, 0, 0]),  # more executors than partitions: some read nothing
        (1, 2, [1, 0]),
    ],
)
def test_partitions_spread_evenly_over_the_executors(partitions: int, parallelism: int, expected: list[int]) -> None:
    assert sorted(owners(partitions, parallelism).values(), reverse=True) == sorted(expected, reverse=True)


@given(st.integers(1, 64), st.integers(1, 16), st.sampled_from([16, 128, 4096]))
def test_no_executor_reads_more_than_about_its_share(partitions: int, parallelism: int, lanes: int) -> None:
    counts = owners(partitions, min(parallelism, lanes), lanes)
    share = partitions / min(parallelism, lanes)
    # the radical inverse's discrepancy: within a few partitions of the share, for any count
    assert max(counts.values()) <= share + 1 + partitions.bit_length()


@given(st.integers(0, 100_000), st.sampled_from([1, 16, 128, 4096]))
def test_a_partition_keeps_its_lane_and_lanes_are_in_range(partition: int, lanes: int) -> None:
    lane = partition_lane(partition, lanes)
    assert 0 <= lane < lanes
    assert lane == partition_lane(partition, lanes)  # nothing but the number decides it


@given(st.integers(0, 2**43 - 1), st.integers(0, 2**20 - 1))
def test_the_marker_orders_and_round_trips_outbox_entry_ids(ms: int, seq: int) -> None:
    entry = f"{ms}-{seq}"
    offset = marker_offset(entry)
    assert 0 <= offset < 2**63 and marker_entry(offset) == entry
    assert marker_offset(f"{ms}-{seq + 1}" if seq + 1 < 2**20 else f"{ms + 1}-0") > offset


def test_no_marker_is_the_outbox_start() -> None:
    assert marker_entry(-1001) == "0-0"  # OFFSET_INVALID: nothing committed yet
    with pytest.raises(ValueError, match="over 2\\*\\*20"):
        marker_offset(f"1-{2**20}")


def test_the_identity_names_namespace_topology_and_vertex() -> None:
    assert topology_identity(topology.topology_prefix("team-a", "orders"), "out") == "elastream.team-a.orders.out"


def write_secret(root: str, name: str, values: dict[str, str]) -> None:
    os.makedirs(os.path.join(root, name, "..data"), exist_ok=True)  # Kubernetes' own entries are skipped
    for key, value in values.items():
        with open(os.path.join(root, name, key), "w", encoding="utf-8") as handle:
            handle.write(value)


def test_a_secrets_keys_become_client_properties_and_the_connectors_own_win(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ELASTREAM_SECRETS_DIR", str(tmp_path))
    write_secret(str(tmp_path), "kafka-auth", {"sasl.username": "app\n", "sasl.password": "hunter2\n"})
    config = {"bootstrapServers": "b:9092", "secretRef": {"name": "kafka-auth"}}
    properties = client_properties(config, {"group.id": "g"})
    assert properties == {
        "sasl.username": "app",
        "sasl.password": "hunter2",
        "bootstrap.servers": "b:9092",
        "group.id": "g",
    }


def test_a_secret_that_sets_what_the_connector_sets_is_refused_by_name(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ELASTREAM_SECRETS_DIR", str(tmp_path))
    write_secret(str(tmp_path), "bad", {"transactional.id": "someone-elses", "isolation.level": "read_uncommitted"})
    with pytest.raises(KafkaSettingsError) as info:
        client_properties({"bootstrapServers": "b:9092", "secretRef": {"name": "bad"}}, {})
    assert "isolation.level, transactional.id" in str(info.value)
    assert "someone-elses" not in str(info.value) and "read_uncommitted" not in str(info.value)


def test_a_missing_or_misnamed_secret_says_what_to_do(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ELASTREAM_SECRETS_DIR", str(tmp_path))
    with pytest.raises(SecretUnavailable, match=r"'absent' is not mounted .* create it"):
        secret_properties("absent")
    with pytest.raises(SecretUnavailable, match="not a Secret name"):
        secret_properties("../etc")


def test_a_refused_property_is_named_and_its_value_never_shown() -> None:
    from confluent_kafka import Producer

    with pytest.raises(KafkaSettingsError) as info:
        make_client(Producer, {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "s3cr3t-value"}, "sink out#0")
    message = str(info.value)
    assert "security.protocol" in message and "s3cr3t-value" not in message


def test_what_librdkafka_logs_of_the_settings_hides_their_values(caplog) -> None:
    from confluent_kafka import Producer

    caplog.set_level(logging.DEBUG, logger="elastream.kafka")
    producer = make_client(Producer, {"bootstrap.servers": "127.0.0.1:9", "sasl.mechanism": "PL41N-s3cr3t"}, "out#0")
    producer.poll(0.5)  # the library's log lines reach the logger as the client is served
    producer.flush(0.1)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("elastream.kafka")]
    assert any("sasl.mechanism" in line for line in lines), lines  # it warned about the property ...
    assert not any("PL41N-s3cr3t" in line for line in lines)  # ... and showed no value


def kafka_manifest(sink: dict[str, object]) -> dict[str, object]:
    return manifest(
        [
            {"name": "in", "source": {"type": "kafka", "topic": "orders", "bootstrapServers": "k:9092"}},
            {"name": "out", "sink": sink, "maxParallelism": 8},
        ],
        [edge("in", "out")],
        name="k",
    )


def test_an_exactly_once_kafka_sinks_outbox_is_in_the_commit_and_an_at_least_once_ones_is_not() -> None:
    sink = {"type": "kafka", "topic": "copy", "bootstrapServers": "k:9092", "delivery": "exactly-once"}
    scope = CheckpointScope.of(topology.parse_manifest(kafka_manifest(sink)))
    assert [(s.vertex, s.stream, s.max_parallelism) for s in scope.sinks] == [
        ("out", f"{topology.topology_prefix('default', 'k')}outbox:out", 8)
    ]
    at_least_once = dict(sink, delivery="at-least-once")
    assert CheckpointScope.of(topology.parse_manifest(kafka_manifest(at_least_once))).sinks == ()
