"""`bench/kafka.py` without a broker, Redis or workers: its report and plot written from a made-up raw result
(the ratios, the per-run rows, a migration that did not succeed), the output gaps and buckets it measures
with, and the scale-out schedule its CCR runs migrate to."""

from __future__ import annotations

from typing import Any

import pytest

from elastream.core.schedule import Schedule
from support.bench_modules import load_bench

bench = load_bench("kafka.py")


def throughput(kind: str, delivery: str, per_s: float, n: int = 100_000) -> dict[str, Any]:
    return {
        "kind": kind,
        "delivery": delivery,
        "events": n,
        "visible": n,
        "start_s": 1.5,
        "first_s": 2.0 if delivery == "exactly-once" else 0.1,
        "seconds": n / per_s,
        "per_s": per_s,
        "first_to_last_per_s": per_s * 1.2,
        "cpu_s": {"worker": n * 10e-6, "broker": 1.5, "redis": 0.5, "bench": 0.2},
        "checkpoints": 3,
        "timeline": [100, 200],
    }


def migration(kind: str, delivery: str, pause_ms: float, outcome: str = "succeeded") -> dict[str, Any]:
    return {
        "kind": kind,
        "delivery": delivery,
        "outcome": outcome,
        "reason": "" if outcome == "succeeded" else "rolled back:\nworker node-0 exited with code 70",
        "pauseMs": pause_ms,
        "prepareMs": 1200.0,
        "phases": {"captureMs": 20.0, "commitMs": 10.0, "rebalanceMs": pause_ms - 50.0, "restoreMs": 20.0},
        "capturedEvents": 0,
        "pausedExecutors": 4,
        "executors": 4,
        "migrateMs": 1400.0,
        "outputAfterPauseMs": 700.0 if delivery == "exactly-once" else 1.0,
        "gapMs": 2400.0 if delivery == "exactly-once" else 150.0,
        "steadyGapMs": 1000.0 if delivery == "exactly-once" else 50.0,
        "written": 32_000,
        "visible": 32_000,
        "caughtUp": True,
        "lost": 0,
        "duplicated": 0,
        "events": [],
        "timeline": [200] * 90,
    }


def raw_result() -> dict[str, Any]:
    return {
        "meta": {
            "command": "python bench/kafka.py",
            "took_s": 480.0,
            "date": "2026-01-01",
            "machine": "a test machine",
            "code": "commit abc1234",
            "kafka": "4.1.1",
            "confluent_kafka": "2.16.1",
            "librdkafka": "2.16.0",
            "events": 100_000,
            "rounds": 2,
            "ccr_rounds": 1,
            "raw": "docs/benchmarks/kafka.json",
        },
        "limit": {
            "prefill": {"seconds": 2.0, "per_s": 50_000.0},
            "produce": {"seconds": 1.25, "per_s": 80_000.0},
            "produce-transactional": {"seconds": 1.6, "per_s": 62_500.0},
            "consume": {"seconds": 1.0, "per_s": 100_000.0},
            "copy": {"seconds": 2.0, "per_s": 50_000.0},
            "session": {"ms": [80.0, 120.0, 500.0], "median_ms": 120.0},
        },
        "throughput": [
            throughput("kafka", "at-least-once", 60_000.0),
            throughput("kafka", "at-least-once", 70_000.0),
            throughput("kafka", "exactly-once", 20_000.0),
            throughput("kafka", "exactly-once", 20_000.0),
            throughput("redis-stream", "at-least-once", 30_000.0),
            throughput("redis-stream", "at-least-once", 30_000.0),
            throughput("redis-stream", "exactly-once", 25_000.0),
            throughput("redis-stream", "exactly-once", 25_000.0),
        ],
        "ccr": [
            migration("kafka", "at-least-once", 100.0),
            migration("kafka", "exactly-once", 200.0),
            migration("kafka", "exactly-once", 5000.0, outcome="aborted"),
            migration("redis-stream", "at-least-once", 125.0),
            migration("redis-stream", "exactly-once", 100.0),
        ],
    }


def test_the_report_and_its_plot_are_written_from_raw_results(tmp_path: Any) -> None:
    bench.write_report(raw_result(), str(tmp_path))
    text = (tmp_path / "kafka.md").read_text()
    assert "commit abc1234" in text and "a test machine" in text and "Kafka 4.1.1" in text
    # the limit table and the publisher's session start
    assert "| idempotent producer | produce, until every message is acknowledged | 1.25 | 80,000 |" in text
    assert "80, 120, 500 ms" in text
    # the runs, their median, first -> last, the CPU per message (10 µs), the worker's share of a core (1 s of CPU
    # over 1.67 and 1.43 s) and the broker / Redis CPU
    row = "| kafka -> kafka | at-least-once | 60,000, 70,000 | 65,000 | 78,000 | 0.10 | 10.0 | 0.65 | 1.5 / 0.5 |"
    assert row in text
    # the ratios: 65,000 / 50,000 copy loop; 20,000 / 62,500 transactional; Kafka / redis-stream
    assert "| Kafka pipeline ÷ raw copy loop | 1.30 | 0.40 |" in text
    assert "| Kafka pipeline ÷ raw produce (idempotent; transactional for exactly-once) | 0.81 | 0.32 |" in text
    assert "| Kafka ÷ redis-stream | 2.17 | 0.80 |" in text
    assert "Exactly-once ÷ at-least-once: Kafka 0.31" in text and "redis-stream 0.83" in text
    # every migration has its row (beside the throughput table's); the aborted one is marked, its reason on one
    # line, and it is left out of the medians
    assert text.count("| kafka -> kafka | exactly-once |") == 1 + 2
    assert "| **aborted** | 5,000 |" in text
    assert "kafka exactly-once, aborted: rolled back: worker node-0 exited with code 70" in text
    assert "at-least-once: pause 0.80, output gap 1.00; exactly-once: pause 2.00, output gap 1.00" in text
    assert "1 of 5 migrations did not succeed" in text
    assert "## What the numbers mean" in text and "Exactly-once ÷ at-least-once, Kafka: 0.31" in text
    assert "a whole core would carry about 100,000 messages/s; it got 0.60-0.70 of a core" in text
    assert "No migration lost or duplicated a message." in text
    assert (tmp_path / "kafka.png").stat().st_size > 10_000


def test_a_report_without_ccr_runs_still_renders(tmp_path: Any) -> None:
    raw = raw_result()
    raw["ccr"] = []
    bench.write_report(raw, str(tmp_path))
    text = (tmp_path / "kafka.md").read_text()
    assert "pause -, output gap -" in text
    assert (tmp_path / "kafka.png").exists()


def test_the_longest_output_gap_counts_the_outputs_around_the_window() -> None:
    batches = [(10.0, 5), (10.1, 5), (10.2, 5), (11.0, 5), (11.05, 5), (13.0, 5)]
    assert bench.longest_gap(batches, 10.0, 10.5) == pytest.approx(0.8)
    # the window's edges: the last output before it and the first after it count
    assert bench.longest_gap(batches, 10.0, 11.05) == pytest.approx(1.95)
    assert bench.longest_gap(batches, 11.5, 12.5) == pytest.approx(1.95)
    # a steady window's end is its last edge: the gap from 11.05 runs into what follows, counted up to 12.0
    assert bench.longest_gap(batches, 10.0, 12.0, past_end=False) == pytest.approx(0.95)
    assert bench.longest_gap(batches, 9.0, 9.5, past_end=False) is None
    assert bench.longest_gap(batches, 14.0, 15.0) is None
    assert bench.bucketed(batches, 10.0, 0.0, 1.0, 0.5) == [15, 0]
    assert bench.bucketed(batches, 11.0, -1.0, 3.0, 1.0) == [15, 10, 0, 5]


def test_the_ccr_runs_migrate_to_one_more_node_with_one_more_executor_of_every_vertex() -> None:
    old = Schedule({"in#0": "node-0", "out#0": "node-1", "in#1": "node-1", "out#1": "node-0"}, ("node-0", "node-1"), 4)
    new = bench.scaled_out(old)
    assert new.nodes == ("node-0", "node-1", "node-2")
    assert new.executors_on("node-2") == ("in#2", "out#2")
    assert {e: n for e, n in new.assignment.items() if n != "node-2"} == dict(old.assignment)
    assert new.parallelism() == {"in": 3, "out": 3}


def test_the_topologies_are_valid_streamtopologies(tmp_path: Any) -> None:
    from elastream.crd import load_manifest
    from support.harness import write_manifest

    for kind in bench.KINDS:
        for delivery in bench.DELIVERIES:
            doc = bench.topology_doc(
                f"t-{kind}-{delivery}", kind, delivery, 2, 2, {"in": "a", "out": "b"}, "127.0.0.1:9092"
            )
            topology = load_manifest(write_manifest(str(tmp_path), doc))
            assert list(topology.sources) == ["in"] and list(topology.sinks) == ["out"]
            assert topology.scaling.checkpoint_interval_s == bench.CHECKPOINT_S
