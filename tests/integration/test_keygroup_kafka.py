"""Key groups that migrate a few at a time, in band (`spec.scaling.migrationScope: keyGroups`), with Kafka in
and out, on worker processes, a real Redis and a real Kafka broker: a kafka source reading an 8-partition topic
while a producer writes to it, a keyed count, and two exactly-once kafka sinks (a copy of the input, the
running counts). Scaled out and back in by key-group batches (the keyed count grows and shrinks, the copy sink
moves node, the counts sink grows and shrinks, a source hands over), and a worker SIGKILLed once some steps
have flipped (the topology rolls back to the last periodic checkpoint); either way a `read_committed` consumer
then sees every input exactly once in the copy and, per key, running counts exactly 1..n."""

from __future__ import annotations

import time

import pytest
from test_kafka_pipeline import Writer, make_topics, pipeline, worker_tail
from test_keygroup_migration import KillAfterFirstStep, batched

from elastream.control.checkpoint_driver import CheckpointDriver, Checkpointer
from elastream.control.migration import MigrationDriver
from elastream.core.schedule import Schedule
from support.harness import running, write_manifest
from support.kafka_broker import KafkaBroker, unique_name
from support.kafka_checks import check_exactly_once
from support.waiting import wait_until

pytestmark = pytest.mark.integration

#: the executors the scale-out adds on node-2 or moves there: the keyed count and the counts sink grow by one,
#: the copy sink and the second source move (the source hands over its partitions' positions)
ON_THE_NEW_NODE = ("count#2", "counts#1", "copy#0", "orders#1")


def scaled_out(old: Schedule) -> Schedule:
    """`old` (two nodes) with a third node that `ON_THE_NEW_NODE` go to."""
    nodes = (*old.nodes, "node-2")
    return Schedule({**old.assignment, **dict.fromkeys(ON_THE_NEW_NODE, "node-2")}, nodes, old.slots_per_node)


def kafka_keygroups(tmp_path, bootstrap: str, topics: dict[str, str], checkpoint_s: float) -> str:
    """The manifest of test_kafka_pipeline's pipeline (two sources, two nodes of 4 slots) with scope
    `keyGroups` and periodic checkpoints every `checkpoint_s` seconds (0: none)."""
    scaling = {"checkpointIntervalSeconds": checkpoint_s, "migrationScope": "keyGroups"}
    doc = pipeline(unique_name("kafka-kg"), bootstrap, topics, 2, nodes=2, slotsPerNode=4, scaling=scaling)
    return write_manifest(str(tmp_path), doc)


def changes(old: Schedule, new: Schedule) -> set[str]:
    """The vertices whose parallelism or an executor's node differs between `old` and `new`."""
    grown = {v for v, k in new.parallelism().items() if old.parallelism().get(v) != k}
    moved = {e.split("#")[0] for e, n in new.assignment.items() if old.assignment.get(e) not in (None, n)}
    return grown | moved


@pytest.mark.timeout(300)
def test_kafka_exactly_once_sinks_through_key_group_batches_out_and_in(
    tmp_path, redis_url: str, kafka_broker: KafkaBroker
) -> None:
    bootstrap = kafka_broker.bootstrap
    topics = make_topics(kafka_broker, 8)
    total = 5000
    writer = Writer(bootstrap, topics["in"], total, rate=250.0)
    with running(kafka_keygroups(tmp_path, bootstrap, topics, 1), redis_url) as (cluster, topology):
        original = cluster.current_schedule()
        out = scaled_out(original)
        # back in is the same change reversed
        assert {"count", "counts", "copy"} <= changes(original, out), "else the test shows nothing"
        assert (original.parallelism()["count"], out.parallelism()["count"]) == (2, 3)
        assert original.node_of("copy#0") != out.node_of("copy#0")
        checkpointer = Checkpointer(CheckpointDriver(topology, cluster, cluster.client), interval_s=1.0).start()
        try:
            writer.start()
            wait_until(lambda: checkpointer.completed >= 1, 60, "a periodic checkpoint")
            time.sleep(2.0)  # mid-stream: the sinks hold processed, uncommitted output
            for new in (out, original):
                report = MigrationDriver(topology, cluster, cluster.client, "ccr", scope="keyGroups").migrate(new)
                assert report.outcome == "succeeded", f"{report}\n{worker_tail(cluster)}"
                assert report.scope == "keyGroups"
                assert (report.batches or 0) >= 1, report
                assert cluster.current_schedule() == new
                assert writer.is_alive(), "the rescales must happen while the producer writes"
                time.sleep(2.0)
            writer.join(timeout=120)
            assert not writer.is_alive()
            check_exactly_once({"bootstrap.servers": bootstrap}, topics["copy"], topics["counts"], total)
        finally:
            checkpointer.stop()
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None  # cleaned up


@pytest.mark.timeout(300)
def test_a_worker_killed_in_the_middle_of_kafka_key_group_batches_rolls_back_exactly_once(
    tmp_path, redis_url: str, kafka_broker: KafkaBroker
) -> None:
    """The node of the copy sink (and of a source, a count and the first counts) SIGKILLed once a step has
    flipped: the migration ends, the topology rolls back to the last periodic checkpoint, the kafka sinks'
    open transactions are aborted and what they held is processed again from the sources' saved offsets."""
    bootstrap = kafka_broker.bootstrap
    topics = make_topics(kafka_broker, 8)
    total = 3000
    writer = Writer(bootstrap, topics["in"], total, rate=250.0)
    with running(kafka_keygroups(tmp_path, bootstrap, topics, 0), redis_url) as (cluster, topology):
        old = cluster.current_schedule()
        new = scaled_out(old)
        writer.start()
        time.sleep(2.0)  # mid-stream
        victim = old.node_of("copy#0")
        kill = KillAfterFirstStep(cluster, victim)
        report = batched(topology, cluster, before_step=kill).migrate(new)
        if not kill.killed:
            pytest.fail(f"the plan has one step only: nothing to kill in the middle of ({report})")
        assert report.outcome == "aborted", f"{report}\n{worker_tail(cluster)}"
        assert "rolled back to checkpoint" in report.reason, report.reason
        assert report.scope == "keyGroups"
        assert cluster.current_schedule() == old
        assert cluster.workers[victim].process.pid != kill.killed[0], "the dead worker was started again"
        assert cluster.client.get(f"{topology.redis_prefix}mig:current") is None
        assert writer.is_alive(), "the kill must happen while the producer writes"
        checkpointer = Checkpointer(CheckpointDriver(topology, cluster, cluster.client), interval_s=1.0).start()
        try:
            writer.join(timeout=120)
            assert not writer.is_alive()
            check_exactly_once({"bootstrap.servers": bootstrap}, topics["copy"], topics["counts"], total)
        finally:
            checkpointer.stop()
