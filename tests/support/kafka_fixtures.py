"""pytest fixtures for a real Kafka broker (`support.kafka_broker.KafkaBroker`, one KRaft node on loopback):

- `kafka_broker` (session): one broker for the whole session, started at first use, removed at the end. Tests
  share it, so each uses topics (and transactional ids, group ids) of its own: `support.kafka_broker.unique_name`
  makes them.
- `kafka_bootstrap`: its bootstrap string, "127.0.0.1:PORT".
- `restartable_kafka`: a broker of the test's own, for fault tests that `stop()`/`kill()` and `start()` it
  (ports, topics and data are kept); removed after the test.

Make them known to tests with `from support.kafka_fixtures import kafka_bootstrap, kafka_broker,
restartable_kafka  # noqa: F401` in tests/conftest.py (or `pytest_plugins = ["support.kafka_fixtures"]` there).
A test module that should run without that imports `*` (`__all__` is the three fixtures): importing them by name
there makes ruff report every test parameter of the same name as a redefinition (F811).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from support.kafka_broker import KafkaBroker

__all__ = ["kafka_bootstrap", "kafka_broker", "restartable_kafka"]


@contextlib.contextmanager
def running_broker(**options: Any) -> Iterator[KafkaBroker]:
    """A started `KafkaBroker(**options)`, removed when the block ends; no jars or no java fails the test with
    how to get them, without a traceback."""
    try:
        broker = KafkaBroker(**options)
    except RuntimeError as exc:  # no jars (no mvn, no Maven Central) or no java: say how, without a traceback
        pytest.fail(f"{exc}\nKafka tests need a real broker: run `make setup`, then scripts/kafka-jars.sh")
    try:
        broker.start()
        yield broker
    finally:
        broker.remove()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """One real Kafka broker for the session (started once, removed at the end)."""
    with running_broker() as broker:
        yield broker


@pytest.fixture
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """The session broker's bootstrap servers, "127.0.0.1:PORT"."""
    return kafka_broker.bootstrap


@pytest.fixture
def restartable_kafka() -> Iterator[KafkaBroker]:
    """A broker of the test's own, started; `stop()` or `kill()` and `start()` again keep its ports and data."""
    with running_broker() as broker:
        yield broker
