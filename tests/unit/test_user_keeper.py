"""The operator's Redis user keeper (`store.acl.UserKeeper`, issue 38): its one thread survives any error of a look
(not only Redis away or ACL refused), logs it without its text (which may quote a password), backs off while
unexpected errors go on, and is back at its pace once a look succeeds."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import redis

from elastream.store import acl
from elastream.store.acl import AclRefused, UserKeeper

PASSWORD = "s3cret-of-the-topology"


class Looks:
    """A stand-in for `restore_missing_users`: raises what `plan` says, in order, then succeeds."""

    def __init__(self, plan: list[BaseException | None]) -> None:
        self.plan = list(plan)
        self.calls = 0
        self.succeeded = threading.Event()

    def __call__(self, client: Any, users: dict[tuple[str, str], str]) -> list[str]:
        self.calls += 1
        outcome = self.plan.pop(0) if self.plan else None
        if outcome is not None:
            raise outcome
        self.succeeded.set()
        return []


def test_the_keeper_survives_any_error_and_never_logs_its_text(monkeypatch, caplog) -> None:
    looks = Looks(
        [
            KeyError(f"password {PASSWORD}"),  # a bug whose text quotes the password
            TypeError(f"'int' object is not iterable ({PASSWORD})"),
            redis.ConnectionError("Connection refused"),
            AclRefused("Redis refused ACL USERS (NOPERM)"),
            ValueError(PASSWORD),
        ]
    )
    monkeypatch.setattr(acl, "restore_missing_users", looks)
    keeper = UserKeeper(object(), every_s=0.01, max_backoff_s=0.05)  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG, logger="elastream.store")
    try:
        keeper.keep("prod", "payments", PASSWORD)
        assert looks.succeeded.wait(10.0), f"the keeper stopped looking after {looks.calls} looks"
        assert keeper._thread is not None and keeper._thread.is_alive()
    finally:
        keeper.stop()
    assert looks.calls >= 6 and keeper.failed_looks == 5 and keeper.failures == 0
    assert PASSWORD not in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3, warnings  # the three unexpected errors; Redis away and ACL refused at DEBUG
    assert warnings[0].startswith("Redis users not checked: KeyError at test_user_keeper.py:")
    assert "failure 1 in a row" in warnings[0] and "failure 2 in a row" in warnings[1]
    assert "failure 1 in a row" in warnings[2]  # the Redis errors between were no bug: the count started again


def test_unexpected_errors_back_off_and_redis_errors_do_not(monkeypatch) -> None:
    looks = Looks([RuntimeError("x")] * 5 + [redis.ConnectionError("refused"), RuntimeError("x"), None])
    monkeypatch.setattr(acl, "restore_missing_users", looks)
    keeper = UserKeeper(object(), every_s=1.0, max_backoff_s=8.0)  # type: ignore[arg-type]
    keeper._users[("prod", "payments")] = PASSWORD  # kept without starting the thread: each look by hand
    outcomes, delays = [], []
    for _ in range(8):
        outcomes.append(keeper.look())
        delays.append(keeper._delay())
    assert outcomes == [False] * 7 + [True]
    assert delays == [2.0, 4.0, 8.0, 8.0, 8.0, 1.0, 2.0, 1.0]


def test_a_reply_nobody_expected_does_not_end_the_keeper(caplog) -> None:
    """The real `restore_missing_users` over a Redis whose ACL USERS answers something that is no list."""

    class Odd:
        def __init__(self) -> None:
            self.calls = 0

        def execute_command(self, *args: Any) -> Any:
            self.calls += 1
            return 42  # not iterable: a TypeError inside restore_missing_users

    odd = Odd()
    keeper = UserKeeper(odd, every_s=0.01, max_backoff_s=0.02)  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger="elastream.store")
    try:
        keeper.keep("prod", "payments", PASSWORD)
        deadline = time.monotonic() + 10.0
        while odd.calls < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert odd.calls >= 3 and keeper._thread is not None and keeper._thread.is_alive()
    finally:
        keeper.stop()
    assert "TypeError at acl.py:" in caplog.text and PASSWORD not in caplog.text


@pytest.mark.parametrize("max_backoff_s", [0.0, 0.5])
def test_the_backoff_is_never_below_the_pace(max_backoff_s: float) -> None:
    keeper = UserKeeper(object(), every_s=1.0, max_backoff_s=max_backoff_s)  # type: ignore[arg-type]
    keeper.failures = 100
    assert keeper._delay() == 1.0
