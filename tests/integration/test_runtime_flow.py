"""The data plane under load and on the way out: back-pressure bounded in events, FIFO per channel, the
`all`/`global` groupings, spin costs, the log sink, step rate profiles, and signals to `elastream run`."""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from elastream.core.rates import RateProfile
from elastream.runtime.transport import INITIAL_WINDOW, MAX_BATCH
from elastream.store.metric_stream import MetricStream
from support.harness import ELASTREAM, running, sink_events, wait_for_sink, write_manifest
from support.manifests import edge, in_line, manifest, sink, src, work
from support.paths import EXAMPLES

pytestmark = pytest.mark.integration


def test_a_congested_vertex_holds_the_source_back_with_a_bounded_number_of_events_between(
    tmp_path, redis_url: str
) -> None:
    # 4,000 events/s offered, `slow` manages at most 2 x 250 = 500: the source must be held back, and what
    # waits between them is bounded in events (the credit windows), not in seconds of a shared machine.
    # Before credits (8 frames of 512 events per side of each channel) the sink's latency grew past 15 s here.
    doc = manifest(
        [
            src("src", 2, rate=4000, keys=100),
            work("slow", 2, costMs=4.0),
            {"name": "out", "parallelism": 1, "sink": {"type": "null"}},
        ],
        [edge("src", "slow"), edge("slow", "out")],
        name="congested",
        nodes=2,
        slotsPerNode=3,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        time.sleep(12.0)
        samples = MetricStream(cluster.client, topology.redis_prefix).read_since(None)
    last = {s.executor: s for s in sorted(samples, key=lambda s: s.ts)}
    sources, slows = [last[f"src#{i}"] for i in range(2)], [last[f"slow#{i}"] for i in range(2)]
    offered = sum(s.received for s in sources)  # what the sources' rate profile offered them by now
    emitted = sum(s.processed for s in sources)  # a source's `processed` is what it emitted
    processed = sum(s.processed for s in slows)
    # What sits between the sources and `slow` (sent, not yet processed) is bounded by the credits: a window
    # per channel (2 x 2 channels; a slow receiver's window shrinks from INITIAL_WINDOW to about WINDOW_SECONDS
    # of its drain, never grows past it) and a frame per executor on either side; a sample interval of `slow`
    # (at most 250 events) is below a frame. Without back-pressure the sources would emit what is offered,
    # 4,000/s: tens of thousands of events ahead of `slow` by now, and this fails.
    in_flight_bound = 4 * INITIAL_WINDOW + 4 * MAX_BATCH
    assert processed > 0 and emitted - processed <= in_flight_bound, (offered, emitted, processed)
    # ... and the sources are held back: most of what was offered waits in them (their backlog), not in the
    # data plane. A source that ignored the credits would have no backlog, and this fails.
    assert offered - emitted > 2 * emitted, (offered, emitted, processed)


def _pids(pattern: str) -> set[int]:
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True, check=False).stdout.split()
    return {int(p) for p in found}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_run_stops_it_and_leaves_no_process_behind(tmp_path, sig: signal.Signals) -> None:
    path = str(tmp_path / "linear.yaml")
    shutil.copy(os.path.join(EXAMPLES, "linear.yaml"), path)  # a path unique to this run, for pgrep
    env = {k: v for k, v in os.environ.items() if k != "ELASTREAM_REDIS_URL"}  # the embedded Redis
    proc = subprocess.Popen(
        [*ELASTREAM, "run", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(line.split()[:1] == ["2s"] for line in list(lines)):
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.2)
        workers = _pids(f"--topology {path}")
        redis_dir = os.path.dirname(re.search(r"--redis unix://(\S+)", "".join(lines)).group(1))  # type: ignore[union-attr]
        redis_pids = _pids(redis_dir)
        assert len(workers) == 6 and redis_pids, (workers, redis_pids, lines)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    assert code == 128 + sig, stderr
    assert "Traceback" not in stderr, stderr
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (_pids(f"--topology {path}") or _pids(redis_dir)):
        time.sleep(0.2)
    assert _pids(f"--topology {path}") == set()
    assert _pids(redis_dir) == set()
    assert all(not os.path.exists(f"/proc/{pid}") for pid in workers | redis_pids)


USEROPS = '''
import ast
import os


class Tag:
    """Emits which executor saw the event."""

    def open(self, context):
        self.index = context.index

    def process(self, event, emit):
        emit(self.index)


class Grumpy:
    def open(self, context):
        raise RuntimeError("cannot reach the reference data")

    def process(self, event, emit):
        emit(event.value)


class Collect:
    """A user sink: appends `id value` per event, using the Event attributes."""

    def open(self, context):
        self.handle = open(os.environ["COLLECT_FILE"], "a")

    def process(self, event, emit):
        self.handle.write(f"{event.id} {event.value}\\n")
        self.handle.flush()

    def close(self):
        self.handle.close()
'''


def user_env(tmp_path) -> dict[str, str]:
    (tmp_path / "flowops.py").write_text(USEROPS)
    return {
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "COLLECT_FILE": str(tmp_path / "collected.txt"),
    }


def rsink(name: str, parallelism: int = 1) -> dict[str, object]:
    return {"name": name, "parallelism": parallelism, "sink": {"type": "redis-stream"}}


@pytest.mark.parametrize("grouping", ["all", "global"])
def test_all_reaches_every_executor_and_global_only_the_first(tmp_path, redis_url: str, grouping: str) -> None:
    doc = manifest(
        [
            src("src", 2, rate=2000, limit=600),
            {"name": "tag", "parallelism": 3, "logic": {"module": "flowops:Tag"}},
            rsink("out"),
        ],
        [edge("src", "tag", grouping), edge("tag", "out")],
        name=f"grouping-{grouping}",
        nodes=3,
        slotsPerNode=2,
    )
    copies = 3 if grouping == "all" else 1
    with running(write_manifest(str(tmp_path), doc), redis_url, extra_env=user_env(tmp_path)) as (cluster, topology):
        assert wait_for_sink(cluster, topology, "out", 600 * copies) == 600 * copies
        events = sink_events(cluster.client, topology, "out")
    by_id: dict[int, list[str]] = defaultdict(list)
    for event in events:
        by_id[int(event["id"])].append(event["value"])
    assert set(by_id) == set(range(600))
    expected = ["0", "1", "2"] if grouping == "all" else ["0"]
    assert all(sorted(tags) == expected for tags in by_id.values())  # once per executor / only on #0


def test_each_channel_is_fifo_through_a_chain_across_processes(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [src("src", 1, rate=4000, limit=6000), work("a", 1), work("b", 1, costMs=0.05), rsink("out")],
        [edge("src", "a"), edge("a", "b"), edge("b", "out")],
        name="fifo",
        nodes=3,
        slotsPerNode=2,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        assert len(set(cluster.current_schedule().assignment.values())) == 3  # every hop crosses processes
        assert wait_for_sink(cluster, topology, "out", 6000) == 6000
        ids = [int(e["id"]) for e in sink_events(cluster.client, topology, "out")]
    assert ids == list(range(6000))  # one source executor emits them in order; every channel kept it


def test_spin_costs_burn_real_cpu(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [src("src", 1, rate=400), work("spin", 1, costMs=1.0, mode="spin"), {"name": "out", "sink": {"type": "null"}}],
        [edge("src", "spin"), edge("spin", "out")],
        name="spin",
        nodes=1,
        slotsPerNode=3,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        pid = cluster.workers["node-0"].process.pid
        time.sleep(2.0)
        cpu0 = _cpu_seconds(pid)
        time.sleep(4.0)
        cpu = _cpu_seconds(pid) - cpu0
        samples = MetricStream(cluster.client, topology.redis_prefix).read_last(40)
    spin = [s for s in samples if s.executor == "spin#0"]
    assert spin[-1].processed > 1000
    assert spin[-1].busy_s >= 0.8 * spin[-1].processed * 0.001  # 1 ms per event, spent
    assert cpu > 0.25 * 4.0  # 400 events/s x 1 ms spinning: at least 0.4 s of CPU per second (sleep: ~0)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_log_sink_prints_every_nth_event(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [src("src", 1, rate=1000, limit=50), {"name": "out", "sink": {"type": "log", "every": 10}}],
        [edge("src", "out")],
        name="logged",
        nodes=1,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, _):
        deadline = time.monotonic() + 30
        lines: list[str] = []
        while time.monotonic() < deadline and len(lines) < 5:
            time.sleep(0.3)
            with open(cluster.workers["node-0"].log_path, encoding="utf-8") as handle:
                lines = [line.strip() for line in handle if line.startswith("out#0: id=")]
        time.sleep(0.5)
    assert lines == [f"out#0: id={i} key={i % 1000} value={i}" for i in (9, 19, 29, 39, 49)]


def test_user_sinks_get_events_and_a_failing_open_is_reported(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [
            src("src", 1, rate=1000, limit=300),
            {"name": "grumpy", "logic": {"module": "flowops:Grumpy"}},
            {"name": "out", "sink": {"module": "flowops:Collect"}},
        ],
        [edge("src", "grumpy"), edge("grumpy", "out")],
        name="user-sink",
        nodes=2,
        slotsPerNode=2,
    )
    collected = tmp_path / "collected.txt"
    with running(write_manifest(str(tmp_path), doc), redis_url, extra_env=user_env(tmp_path)) as (cluster, topology):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not collected.exists() or len(collected.read_text().splitlines()) < 300):
            time.sleep(0.3)
        time.sleep(1.2)
        errors = {s.executor: s.errors for s in MetricStream(cluster.client, topology.redis_prefix).read_last(20)}
        logs = "".join(Path(w.log_path).read_text(encoding="utf-8") for w in cluster.workers.values())
        cluster.check_alive()
    assert sorted(collected.read_text().splitlines()) == sorted(f"{i} {i}" for i in range(300))
    assert errors["grumpy#0"] == 1
    assert "vertex grumpy: executor grumpy#0: open() raised RuntimeError: cannot reach the reference data" in logs


def test_a_step_profile_changes_the_rate_on_worker_processes(tmp_path, redis_url: str) -> None:
    profile = {"profile": "autoscale-5-step", "rate": 1000, "stepSeconds": 4, "fluctuation": 0}
    doc = manifest(
        [{"name": "src", "source": {"type": "synthetic", **profile}}, {"name": "out", "sink": {"type": "null"}}],
        [edge("src", "out")],
        name="steps",
        nodes=1,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        time.sleep(16.5)
        samples = [
            s for s in MetricStream(cluster.client, topology.redis_prefix).read_since(None) if s.executor == "src#0"
        ]
    # Steps of 4 s at 200, 1000, 400, 1000 and 200 events/s: what the source emitted by each sample is the
    # profile's integral at the sample's own time (`due`), in events. The tolerance is a second at the peak
    # rate: the sample's time against the source's last tick, and the executor's start against the sources'
    # clock. A source stuck at one rate is thousands of events off by the last steps (at 1,000/s throughout:
    # 16,000 by 16 s instead of 10,000; at 200/s: 3,200), a profile that stepped at other times too.
    offered = RateProfile(profile)
    tolerance = offered.peak * 1.0
    seen = [(s.ts - s.started_at, s.processed) for s in samples if s.ts - s.started_at <= 16.5]
    assert seen and max(t for t, _ in seen) > 13.0, seen  # the last steps are covered
    off = [(round(t, 1), n, round(offered.due(t))) for t, n in seen if abs(n - offered.due(t)) > tolerance]
    assert not off, off


def test_run_with_an_unreadable_csv_fails_before_starting_in_one_line(tmp_path, redis_url: str) -> None:
    doc = manifest(
        [src("src", csv="rates/missing.csv"), {"name": "out", "sink": {"type": "null"}}], [edge("src", "out")]
    )
    path = write_manifest(str(tmp_path), doc)
    result = subprocess.run(
        [*ELASTREAM, "run", path, "--duration", "2", "--redis", redis_url], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: spec.vertices[src].source.csv: {tmp_path}/rates/missing.csv: No such file or directory; fix the "
        "file or the path (relative paths start at the rate directory, ELASTREAM_RATE_DIR or else the manifest's "
        "directory)"
    ], result.stderr
    assert _pids(f"--topology {path}") == set()


def test_workers_die_with_a_killed_run(tmp_path, redis_url: str) -> None:
    doc = in_line([src("src", 2, rate=500), work("w", 2), sink("out")], name="orphans", nodes=3, slotsPerNode=2)
    path = write_manifest(str(tmp_path), doc)
    proc = subprocess.Popen(
        [*ELASTREAM, "run", path, "--redis", redis_url], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.split()[:1] == ["1s"]:
                break
        workers = _pids(f"--topology {path}")
        assert len(workers) == 3
        proc.kill()  # SIGKILL: no cleanup runs in `run`; the kernel tells the workers (PR_SET_PDEATHSIG)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _pids(f"--topology {path}"):
        time.sleep(0.2)
    assert _pids(f"--topology {path}") == set()


def test_window_emits_the_last_window_without_a_later_event(tmp_path, redis_url: str) -> None:
    # a finite source: after its last event nothing else arrives, so only the idle timer can close the
    # windows that are open then; every event must be counted in exactly one emitted window
    doc = manifest(
        [
            src("src", 1, rate=2000, limit=1000, keys=10),
            {"name": "win", "parallelism": 2, "logic": {"builtin": "window", "sizeMs": 300}},
            rsink("out"),
        ],
        [edge("src", "win", "fields", key="key"), edge("win", "out")],
        name="windows",
        nodes=2,
        slotsPerNode=2,
    )
    with running(write_manifest(str(tmp_path), doc), redis_url) as (cluster, topology):
        deadline = time.monotonic() + 30
        counted = 0
        while time.monotonic() < deadline and counted < 1000:
            time.sleep(0.3)
            counted = sum(ast.literal_eval(e["value"])[0] for e in sink_events(cluster.client, topology, "out"))
        time.sleep(1.0)  # nothing more may come
        events = sink_events(cluster.client, topology, "out")
    per_key: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in events:
        count, total = ast.literal_eval(event["value"])
        per_key[event["key"]][0] += count
        per_key[event["key"]][1] += total
    # key k holds the values k, k+10, ..., k+990: 100 of them, summing to 100 k + 49,500
    assert dict(per_key) == {str(k): [100, 100 * k + 49_500] for k in range(10)}
