"""The kafka connectors' faults and signals on worker processes and a real broker: a topic that does not exist
is a ConnectorError naming it (an event, no crash loop), once created the pipeline runs (an at-least-once kafka
sink writes every input), and deleted it is a ConnectorError again; a topic that gains partitions is read whole;
the consumer lag is the sources' backlog: a producer that steps above the topology's capacity gets an automatic
scale-out from it, and the lag drains."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from test_control_faults import Events, ticking
from test_kafka_pipeline import Writer

from elastream.analysis import Analyzer
from elastream.control.backends.local import LocalCluster
from elastream.crd import load_manifest
from elastream.store.codec import unpack
from support.harness import controlled, read_log, start_run, stop_run, write_manifest
from support.kafka_broker import KafkaBroker, unique_name
from support.kafka_checks import read_committed
from support.manifests import edge, manifest, work

pytestmark = pytest.mark.integration


def worker_logs(cluster: LocalCluster) -> str:
    """The tail of every worker's log (for a failure's message)."""
    import glob

    tails = []
    for path in sorted(glob.glob(f"{cluster.run_dir}/*.log")):
        with open(path, encoding="utf-8", errors="replace") as handle:
            tails.append(f"--- {path}\n" + "".join(handle.readlines()[-30:]))
    return "\n".join(tails)


def copy_topology(name: str, bootstrap: str, source_topic: str, sink_topic: str, **spec: Any) -> dict[str, Any]:
    kafka = {"bootstrapServers": bootstrap}
    return manifest(
        [
            {"name": "in", "parallelism": 2, "source": {"type": "kafka", "topic": source_topic, **kafka}},
            {"name": "out", "sink": {"type": "kafka", "topic": sink_topic, **kafka}},
        ],
        [edge("in", "out")],
        name=name,
        **spec,
    )


@pytest.mark.timeout(300)
def test_a_missing_or_deleted_topic_is_a_connector_error_naming_it(
    tmp_path, redis_url: str, kafka_broker: KafkaBroker
) -> None:
    bootstrap = kafka_broker.bootstrap
    source_topic, sink_topic = unique_name("late"), unique_name("copy")
    kafka_broker.create_topic(sink_topic, 2)
    path = write_manifest(str(tmp_path), copy_topology(unique_name("missing"), bootstrap, source_topic, sink_topic))
    topology = load_manifest(path)
    events = Events()
    cluster, controller = controlled(topology, path, redis_url, Analyzer(engine="python"), events)
    with cluster, controller:
        controller.start()
        ticking(controller, 60.0, until=lambda: "ConnectorError" in events.reasons())
        assert "ConnectorError" in events.reasons(), (events.seen, worker_logs(cluster))
        said = dict(events.seen)["ConnectorError"]
        assert source_topic in said and said.startswith("in#"), said
        assert source_topic in controller.connectors.error
        assert not cluster.failed_nodes()  # it waits; nothing crashes
        kafka_broker.create_topic(source_topic, 4)
        writer = Writer(bootstrap, source_topic, 2000, rate=1000.0)
        writer.start()
        writer.join(timeout=60)
        ticking(controller, 60.0, until=lambda: "ConnectorRecovered" in events.reasons())
        assert controller.connectors.error == ""
        copies = read_committed({"bootstrap.servers": bootstrap}, sink_topic, 2000, timeout_s=90)
        # deleted while it is read: the same condition and event again, and still no crash
        kafka_broker.delete_topic(source_topic)
        ticking(controller, 60.0, until=lambda: events.reasons().count("ConnectorError") >= 2)
        assert events.reasons().count("ConnectorError") >= 2, (events.seen, worker_logs(cluster))
        assert source_topic in controller.connectors.error
        assert not cluster.failed_nodes()
    values = {int(m.value()) for m in copies}
    assert values == set(range(2000))  # at-least-once: every input (a replay could repeat some; none here)


@pytest.mark.timeout(300)
def test_partitions_the_topic_gains_are_read_from_their_start(
    tmp_path, redis_url: str, kafka_broker: KafkaBroker
) -> None:
    bootstrap = kafka_broker.bootstrap
    source_topic, sink_topic = unique_name("growing"), unique_name("copy")
    kafka_broker.create_topic(source_topic, 2)
    kafka_broker.create_topic(sink_topic, 2)
    doc = copy_topology(unique_name("growing"), bootstrap, source_topic, sink_topic)
    doc["spec"]["vertices"][0]["source"]["partitionDiscoverySeconds"] = 1
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    cluster, controller = controlled(topology, path, redis_url, Analyzer(engine="python"), Events())
    with cluster, controller:
        controller.start()
        first = Writer(bootstrap, source_topic, 1000, rate=1000.0)
        first.start()
        first.join(timeout=60)
        ticking(controller, 3.0)
        kafka_broker.add_partitions(source_topic, 6)
        second = Writer(bootstrap, source_topic, 3000, rate=1000.0, start=1000)  # keyed over all 6 partitions
        second.start()
        second.join(timeout=60)
        ticking(controller, 5.0)
        copies = read_committed({"bootstrap.servers": bootstrap}, sink_topic, 4000, timeout_s=90)
    assert {int(m.value()) for m in copies} == set(range(4000))
    assert {m.partition() for m in copies} <= {0, 1}  # (the copy topic: 2 partitions)


def lag_total(client: redis.Redis, prefix: str) -> int | None:
    """The consumer lag the kafka source's executors published last (None before the first)."""
    raw = client.hgetall(f"{prefix}lag")
    if not raw:
        return None
    return sum(sum(unpack(blob).values()) for blob in raw.values())


@pytest.mark.timeout(600)
def test_a_producer_above_capacity_gets_a_scale_out_from_the_lag_and_the_lag_drains(
    tmp_path, redis_url: str, kafka_broker: KafkaBroker
) -> None:
    bootstrap = kafka_broker.bootstrap
    source_topic = unique_name("load")
    kafka_broker.create_topic(source_topic, 8)
    # work costs 5 ms: one executor does 200/s. The producer offers 100/s, then 350/s: the source reads only as
    # fast as `work` takes (back-pressure), so the step shows only as consumer lag, the source's backlog. The
    # source has one key group (all 8 partitions in one executor): AUTOSCALE's forecast of the start's ramp
    # (0 -> 100/s) sized the source at 2 executors, 4 executors on 3-slot nodes, in a fresh CI run below
    # capacity; what this test is about is the lag reaching the vertex that limits it
    doc = manifest(
        [
            {
                "name": "in",
                "parallelism": 1,
                "maxParallelism": 1,
                "source": {"type": "kafka", "topic": source_topic, "bootstrapServers": bootstrap},
            },
            work("work", 1, costMs=5.0),
            {"name": "out", "sink": {"type": "null"}},
        ],
        [edge("in", "work"), edge("work", "out")],
        name=unique_name("lag"),
        nodes=1,
        slotsPerNode=3,
        scaling={
            "window": 5,
            "auto": {"enabled": True, "policy": "autoscale", "minNodes": 1, "maxNodes": 4, "stabilizationSeconds": 10},
        },
    )
    path = write_manifest(str(tmp_path), doc)
    prefix = load_manifest(path).redis_prefix
    run, log_path = start_run(str(tmp_path), path, redis_url, duration_s=400.0)
    client = redis.Redis.from_url(redis_url)
    below = Writer(bootstrap, source_topic, 3000, rate=100.0)
    above = Writer(bootstrap, source_topic, 35_000, rate=350.0, start=3000)
    scaled: dict[str, Any] | None = None
    lags: list[tuple[float, int]] = []
    try:
        # the producer starts once the source reads (its lag is published): a backlog piled up while the workers
        # start would itself be a reason to scale out
        deadline = time.monotonic() + 120.0
        while lag_total(client, prefix) is None:
            assert time.monotonic() < deadline and run.poll() is None, read_log(log_path)[-3000:]
            time.sleep(0.5)
        below.start()
        below.join(timeout=120)
        assert run.poll() is None, read_log(log_path)[-3000:]
        assert client.get(f"{prefix}last-scaling") is None, "no scaling below capacity"
        above.start()
        started = time.monotonic()
        while scaled is None and time.monotonic() - started < 100.0:
            assert run.poll() is None, read_log(log_path)[-3000:]
            raw = client.get(f"{prefix}last-scaling")
            if raw is not None and json.loads(raw).get("trigger") == "autoscaler":
                scaled = json.loads(raw)
            lag = lag_total(client, prefix)
            if lag is not None:
                lags.append((time.monotonic() - started, lag))
            time.sleep(1.0)
        assert scaled is not None, f"no automatic scale-out; lags {lags[-10:]}\n{read_log(log_path)[-3000:]}"
        assert scaled.get("direction") == "out" and scaled.get("toNodes", 0) > 1, scaled
        # the step shows as lag while the producer is above capacity: it grows by 150/s until the decision and
        # through the migration's pause. How much depends on the machine: over 1,000 on a quiet one, 88 in a loaded
        # CI run whose autoscaler projected the step and decided two seconds in; what must hold is that it is seen
        while above.is_alive() and time.monotonic() - started < 300.0:
            lag = lag_total(client, prefix)
            if lag is not None:
                lags.append((time.monotonic() - started, lag))
            time.sleep(1.0)
        assert max(lag for _, lag in lags) > 50, lags
        above.join(timeout=30)
        deadline = time.monotonic() + 120.0
        while (lag := lag_total(client, prefix)) is None or lag > 50:
            assert time.monotonic() < deadline, f"the lag did not drain: {lag}"
            time.sleep(1.0)
    finally:
        stop_run(run, 90)
        client.close()
