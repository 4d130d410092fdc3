"""The worker's fault rules without a Redis: what counts as an outage, `retry_redis` waiting one out (logged
once when it starts and once when it ends, nothing dropped, a stop honoured), and the test-only crash hook's
parsing, and a Redis URL shown in a message without its password."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

import pytest
import redis

from elastream.runtime.executor import TEST_CRASH_ENV, injected_crash_after
from elastream.store.registry import redacted
from elastream.store.retry import AnyOf, RedisOutage, RetryCancelled, is_redis_outage, retry_redis


def no_wait() -> Iterator[float]:
    return repeat(0.0)


def failing(times: int, exc: Exception, result: object = "ok") -> tuple[Callable[[], object], list[int]]:
    """A call that raises `exc` `times` times, then returns `result`; the list counts the calls."""
    calls = [0]

    def call() -> object:
        calls[0] += 1
        if calls[0] <= times:
            raise exc
        return result

    return call, calls


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
        redis.ConnectionError("Connection reset by peer"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.ResponseError("LOADING Redis is loading the dataset in memory"),
        redis.ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
        redis.ResponseError("READONLY You can't write against a read only replica."),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("timed out"),
    ],
)
def test_unreachable_or_loading_redis_is_an_outage(exc: Exception) -> None:
    assert is_redis_outage(exc)


@pytest.mark.parametrize(
    "exc",
    [
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        redis.ResponseError("ERR unknown command 'XADDD'"),
        redis.ResponseError("NOPERM this user has no permissions to run the 'xadd' command"),
        redis.ResponseError(""),
        ValueError("not a Redis error"),
        KeyError("executor"),
    ],
)
def test_a_mistake_in_the_call_is_not_an_outage(exc: Exception) -> None:
    assert not is_redis_outage(exc)


def test_retry_waits_out_an_outage_and_logs_its_start_and_end_once(caplog: pytest.LogCaptureFixture) -> None:
    outage = RedisOutage(logging.getLogger("test.redis"))
    call, calls = failing(5, redis.ConnectionError("Connection refused"))
    with caplog.at_level(logging.INFO, logger="test.redis"):
        assert retry_redis(call, "sink s#0: cannot write stream out", outage=outage, delays=no_wait()) == "ok"
    assert calls[0] == 6  # every attempt made, nothing skipped
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("sink s#0: cannot write stream out: Redis unreachable (ConnectionError: Connection")
    assert lines[1].startswith("Redis reachable again after")
    assert outage.count == 1 and not outage.active


def test_many_callers_in_one_outage_log_it_once(caplog: pytest.LogCaptureFixture) -> None:
    outage = RedisOutage(logging.getLogger("test.redis"))
    with caplog.at_level(logging.INFO, logger="test.redis"):
        for what in ("metrics", "control list", "sink"):
            outage.failed(what, redis.ConnectionError("refused"))
        outage.succeeded()
        outage.succeeded()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "metrics: Redis unreachable",
        "Redis reachable again after 0.0 s",
    ]


def test_a_call_that_started_before_the_outage_ended_does_not_open_another() -> None:
    outage = RedisOutage(logging.getLogger("test.redis"))
    started = time.monotonic()  # a call sent during the outage, its failure reported after Redis is back
    outage.failed("a", redis.ConnectionError("refused"))
    outage.succeeded()
    outage.failed("b", redis.ConnectionError("reset"), attempt_started=started)
    assert outage.count == 1 and not outage.active
    outage.failed("c", redis.ConnectionError("refused"), attempt_started=time.monotonic())
    assert outage.count == 2 and outage.active  # a new call failing is a new outage


def test_retry_does_not_retry_a_mistake() -> None:
    call, calls = failing(1, redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"))
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        retry_redis(call, "x", outage=RedisOutage(), delays=no_wait())
    assert calls[0] == 1


def test_retry_gives_up_when_stopped_not_otherwise() -> None:
    stop = threading.Event()
    attempts = [0]

    def call() -> None:
        attempts[0] += 1
        if attempts[0] == 3:
            stop.set()  # the executor is told to stop while Redis is still away
        raise redis.ConnectionError("refused")

    with pytest.raises(RetryCancelled, match="x: stopped while waiting for Redis"):
        retry_redis(call, "x", stop=stop, outage=RedisOutage(), delays=no_wait())
    assert attempts[0] == 3


def test_retry_uses_the_one_backoff_by_default() -> None:
    from elastream.store.retry import backoff, redis_backoff

    delays = redis_backoff()
    assert [round(next(delays), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    reference = backoff(0.1, 2.0, 1.0)
    assert [next(reference) for _ in range(3)] == [0.1, 0.2, 0.4]


def test_a_loop_that_goes_on_between_attempts_backs_off_and_starts_over_after_a_success() -> None:
    from elastream.store.retry import RetryLater, backoff

    retry = RetryLater(lambda: backoff(0.1, 2.0, 1.0))
    assert retry.due(0.0)
    retry.failed(10.0)
    assert not retry.due(10.05) and retry.due(10.1)
    retry.failed(10.1)
    assert not retry.due(10.25) and retry.due(10.35)  # the second delay is twice the first
    retry.succeeded()
    retry.failed(20.0)
    assert not retry.due(20.05) and retry.due(20.1)  # from the first delay again


def test_any_of_is_set_when_either_event_is() -> None:
    a, b = threading.Event(), threading.Event()
    either = AnyOf(a, b)
    assert not either.is_set() and not either.wait(0.01)
    threading.Timer(0.05, b.set).start()
    assert either.wait(10.0)  # returns once b is set, well before the bound
    assert either.is_set()


@pytest.mark.parametrize(
    ("value", "executor", "expected"),
    [
        ("", "w#0", None),
        ("w#0:500", "w#0", 500),
        ("w#0:500", "w#1", None),
        ("src#1:0", "src#1", 0),
        ("w#0:many", "w#0", None),
        ("w#0", "w#0", None),
    ],
)
def test_the_crash_hook_names_one_executor_and_a_count(value: str, executor: str, expected: int | None) -> None:
    assert injected_crash_after(executor, {TEST_CRASH_ENV: value}) == expected
    assert injected_crash_after(executor, {}) is None


class FlakyStore:
    """A checkpoint store whose Redis refuses the first `failures` calls of each kind."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: dict[str, int] = {}
        self.saves: list[tuple[str, object, str | None]] = []
        self.acks: list[tuple[str, str, str]] = []

    def _flaky(self, kind: str) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        if self.calls[kind] <= self.failures:
            raise redis.ConnectionError("Connection refused")

    def save(self, mid: str, checkpoint: object, token: str | None = None) -> None:
        self._flaky("save")
        self.saves.append((mid, checkpoint, token))

    def ack(self, mid: str, phase: str, executor: str, info: object = None) -> None:
        self._flaky("ack")
        self.acks.append((mid, phase, executor))

    def load_positions(self, mid: str) -> dict[str, bytes]:
        self._flaky("positions")
        return {}


def test_an_executor_retries_its_checkpoint_and_ack_through_an_outage_with_one_token(monkeypatch) -> None:
    from elastream.core.migration_protocol import ExecutorParticipant
    from elastream.runtime import participant
    from elastream.runtime.participant import Migration

    tokens: list[str | None] = []
    store = FlakyStore(failures=3)
    original = store.save

    def save(mid: str, checkpoint: object, token: str | None = None) -> None:
        tokens.append(token)
        original(mid, checkpoint, token)

    store.save = save  # type: ignore[method-assign]
    monkeypatch.setattr(participant, "retry_redis", _instant(participant.retry_redis))
    migration = Migration("count#0", store, ExecutorParticipant("count#0", frozenset()))  # type: ignore[arg-type]
    migration.capture("src#0", [(1, "k", "v", 0.0)])
    migration.checkpoint("m1", object())
    migration.ack("m1", "committing", captured=1)
    assert len(store.saves) == 1 and store.acks == [("m1", "committing", "count#0")]  # each applied, once
    assert len(tokens) == 4 and len(set(tokens)) == 1 and tokens[0]  # every retry carries the save's token
    assert migration.merged_positions("m1") == {}

    stop = threading.Event()
    stop.set()
    stopped = Migration("w#0", FlakyStore(failures=10**6), ExecutorParticipant("w#0", frozenset()), stop=stop)  # type: ignore[arg-type]
    with pytest.raises(RetryCancelled):
        stopped.ack("m1", "preparing")


def _instant(retry: Callable[..., object]) -> Callable[..., object]:
    """`retry_redis` without the waits between attempts."""

    def call(*args: object, **kwargs: object) -> object:
        return retry(*args, **kwargs, delays=no_wait(), outage=RedisOutage(logging.getLogger("test.redis")))

    return call


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@redis.example:6379/0", "redis://:***@redis.example:6379/0"),
        ("rediss://app:s3cret@[::1]:6380/1?ssl_ca_certs=/ca.pem", "rediss://app:***@[::1]:6380/1?ssl_ca_certs=/ca.pem"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),
        # malformed (a port that is no number, an unclosed IPv6 bracket): still shown, never raising
        ("redis://:s3cret@host:port/0", "redis://:***@host:port/0"),
        ("redis://:s3cret@[::1/0", "redis://:***@[::1/0"),
        # the password as a query parameter (redis-py's form for unix sockets)
        ("unix:///run/redis.sock?db=0&password=s3cret", "unix:///run/redis.sock?db=0&password=***"),
        ("redis://h:6379/0?PASSWORD=s3cret&ssl=1", "redis://h:6379/0?PASSWORD=***&ssl=1"),
        # an unencoded / ? # or @ in the password ends the host part early: hidden up to the last @
        ("redis://app:s3c/ret@redis.example:6379/0", "redis://app:***@redis.example:6379/0"),
        ("redis://:s3c?ret@h/0", "redis://:***@h/0"),
        ("redis://:s3c#ret@h/0", "redis://:***@h/0"),
        ("redis://:s3c@ret@h/0", "redis://:***@h/0"),
        ("not a url s3cret", "not a url s3cret"),
    ],
)
def test_a_redis_url_in_a_message_never_shows_its_password(url: str, shown: str) -> None:
    assert redacted(url) == shown
    if "://" in url:
        assert "s3c" not in redacted(url) and "ret@" not in redacted(url)


PASSWORD_URLS = [
    "redis://app:s3cret@127.0.0.1:1/0",  # nothing listens on port 1: refused at once
    "redis://127.0.0.1:1/0?password=s3cret",
    "redis://app:s3c/ret@127.0.0.1:1/0",  # malformed: redis-py's own reason quotes "s3c"
    "redis://app:s3c:ret@127.0.0.1:notaport/0",
]


@pytest.mark.parametrize("url", PASSWORD_URLS)
def test_no_message_of_a_failed_connect_shows_the_password(url: str) -> None:
    # what a worker logs every 2 s while Redis is away (on_retry), and what it, the operator and the CLI
    # print when they give up
    from elastream.store.registry import RedisUnavailable, connect

    retries: list[str] = []
    with pytest.raises(RedisUnavailable) as info:
        connect(url, wait_s=0.3, on_retry=lambda reason, delay: retries.append(reason))
    for message in [str(info.value), *retries]:
        assert "s3c" not in message and "ret@" not in message, message
        assert "127.0.0.1" in message or "not a Redis URL" in message  # still says where, or what is wrong


def test_options_that_hold_the_redis_url_never_show_it_in_a_repr() -> None:
    from elastream.control.operator_options import OperatorOptions
    from elastream.control.reconciler import TopologyReconciler
    from elastream.runtime.worker import WorkerOptions

    url = "redis://app:s3cret@redis:6379/0"
    for options in (
        WorkerOptions(node="node-0", redis_url=url),
        OperatorOptions(redis_url=url),
        TopologyReconciler(redis_client=None, redis_url=url, core_api=None, custom_api=None, analyzer=None),  # type: ignore[arg-type]
    ):
        assert "s3cret" not in repr(options)


@pytest.mark.parametrize("url", PASSWORD_URLS)
def test_elastream_run_never_prints_the_password_of_an_unreachable_redis(
    url: str, tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import elastream.control.backends.local as local
    from elastream.cli import main
    from elastream.store import registry
    from support.paths import EXAMPLES

    # the real connect, waiting 0.3 s instead of 10 (the python engine: no Spark)
    monkeypatch.setattr(local, "connect", lambda u, wait_s=0.0, **kw: registry.connect(u, min(wait_s, 0.3), **kw))
    code = main(["run", f"{EXAMPLES}/demo.yaml", "--redis", url, "--engine", "python", "--duration", "1"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "s3c" not in out + err and "ret@" not in out + err, out + err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_a_node_with_nothing_to_publish_does_not_end_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    # a staged node (no executors yet) publishes no sample and no position: that touched no Redis, so it
    # must not log "reachable again" while the control-list reader still fails (it did, twice a second)
    from types import SimpleNamespace

    from elastream.core.ports import SystemClock
    from elastream.runtime import worker_metrics
    from elastream.runtime.transport import DataPlaneStats

    outage = RedisOutage(logging.getLogger("test.redis"))
    monkeypatch.setattr(worker_metrics, "REDIS", outage)
    outage.failed("node node-3: cannot read its control list", redis.ConnectionError("refused"))
    written: list[object] = []
    samples_written = [0]  # what the metric stream says it wrote
    stores = SimpleNamespace(
        metrics=SimpleNamespace(publish=lambda samples: len(list(samples)) + samples_written[0]),
        store=SimpleNamespace(publish_positions=written.append),
    )
    node = worker_metrics.MetricsReporting(
        "node-3",
        SystemClock(),
        stores,  # type: ignore[arg-type]
        lambda: None,  # staged: no generation runs
        DataPlaneStats(),
    )
    node.publish_metrics()
    assert outage.active and outage.count == 1
    samples_written[0] = 1  # a node with executors reached Redis: the outage is over
    node.publish_metrics()
    assert not outage.active


def test_elastream_analyze_never_prints_the_password_of_a_malformed_url(capsys: pytest.CaptureFixture[str]) -> None:
    from elastream.cli import main

    code = main(["analyze", "--redis", "redis://app:s3c/ret@127.0.0.1:1/0", "--topology", "t", "--engine", "python"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: --redis: redis://app:***@127.0.0.1:1/0 is not a Redis URL"), err
    assert "s3c" not in err and len(err.splitlines()) == 1


def test_other_urls_in_messages_go_through_the_same_redaction() -> None:
    # a Spark master or a metric archive URI may carry credentials too; the one helper hides them
    from elastream.analysis.session import SparkUnavailable, master_addresses

    with pytest.raises(SparkUnavailable) as info:
        master_addresses("spark://admin:s3cret@master:port")
    assert "spark://admin:***@master:port" in str(info.value) and "s3cret" not in str(info.value)
