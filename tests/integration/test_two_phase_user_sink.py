"""The operator API's two-phase sink on worker processes and a real Redis: a user sink with `delivery:
exactly-once` whose target is a SQLite database (a real one, with transactions: each batch's rows and its marker
in one), fed by a keyed count, scaled out and in by CCR and with the worker of its executor 0 (the publisher)
SIGKILLed; the database then holds every event exactly once and, per key, running counts exactly 1..n."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections import Counter, defaultdict

import pytest
from test_control_faults import Events, ticking

from elastream.analysis import Analyzer
from elastream.crd import load_manifest
from support.harness import controlled, write_manifest
from support.kafka_checks import recovery_seen
from support.manifests import by_key, edge, manifest, src

pytestmark = pytest.mark.integration

SINK = '''
import os
import sqlite3


class SqliteSink:
    """Stores events and the batch marker in one SQLite transaction (the two-phase sink's contract)."""

    def open(self, context):
        self.db = sqlite3.connect(os.environ["SQLITE_SINK"], timeout=30, check_same_thread=False)
        with self.db:
            self.db.execute("create table if not exists events (id integer, key text, value integer)")
            self.db.execute("create table if not exists marker (one integer primary key, marker text)")

    def last_committed(self):
        row = self.db.execute("select marker from marker where one = 1").fetchone()
        return None if row is None else row[0]

    def commit_batch(self, marker, events):
        with self.db:  # one transaction: the rows and the marker, or neither
            self.db.executemany("insert into events values (?, ?, ?)", [(e.id, e.key, e.value) for e in events])
            self.db.execute("insert or replace into marker values (1, ?)", (marker,))

    def close(self):
        self.db.close()
'''

EVENTS = 6000


@pytest.mark.timeout(600)
def test_a_user_two_phase_sink_stores_every_event_once_through_rescales_and_a_killed_publisher(
    tmp_path, redis_url: str
) -> None:
    (tmp_path / "sqlitesink.py").write_text(SINK)
    database = tmp_path / "out.db"
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "SQLITE_SINK": str(database)}
    doc = manifest(
        [
            src("src", 2, rate=250, limit=EVENTS, keys=11),
            {"name": "count", "parallelism": 2, "stateful": True, "logic": {"builtin": "count"}},
            {"name": "out", "parallelism": 2, "sink": {"module": "sqlitesink:SqliteSink", "delivery": "exactly-once"}},
        ],
        [by_key("src", "count"), edge("count", "out")],
        name="two-phase",
        nodes=2,
        slotsPerNode=4,
        scaling={"checkpointIntervalSeconds": 1},
    )
    path = write_manifest(str(tmp_path), doc)
    topology = load_manifest(path)
    cluster, controller = controlled(topology, path, redis_url, Analyzer(engine="python"), Events(), extra_env=env)
    with cluster, controller:
        controller.start()
        ticking(controller, 4.0)
        for nodes in (3, 2):
            record = controller.scale_to(nodes)
            ticking(controller, 60.0, until=lambda: controller.migrator.unfinished() is None)
            assert record.outcome == "succeeded", record
            ticking(controller, 2.0)
        victim = cluster.current_schedule().node_of("out#0")
        os.kill(cluster.workers[victim].process.pid, signal.SIGKILL)
        recovered = recovery_seen(controller, cluster)
        ticking(controller, 180.0, until=recovered)
        assert recovered(), recovered.recoveries

        def stored() -> int:
            with sqlite3.connect(database, timeout=30) as db:
                return int(db.execute("select count(*) from events").fetchone()[0])

        ticking(controller, 120.0, until=lambda: stored() >= EVENTS)
        ticking(controller, 3.0)  # an extra copy would show now
    with sqlite3.connect(database) as db:
        rows = db.execute("select id, key, value from events").fetchall()
    ids = Counter(row[0] for row in rows)
    assert sorted(ids) == list(range(EVENTS)) and set(ids.values()) == {1}, (len(rows), ids.most_common(3))
    per_key: dict[str, list[int]] = defaultdict(list)
    for _, key, value in rows:
        per_key[key].append(value)
    for key, counts in per_key.items():
        assert sorted(counts) == list(range(1, len(counts) + 1)), key
