"""The `elastream` command. Each sub-command lives in its own module here and registers itself.

A module in `COMMAND_MODULES` exposes `register(subparsers)`, which adds its parsers and sets
`func=handler` on each; a handler returns the process exit code. Expected failures (bad manifest, bad
snapshot, unreachable service) raise `CommandError` (or a domain error listed in `USER_ERRORS`) and are
printed as one `error:` line per problem, exit code 1, never a traceback.

SIGTERM is handled like Ctrl-C: the first SIGTERM or SIGINT raises KeyboardInterrupt in the main thread, so
every `with` block unwinds (workers stopped and reaped, an embedded Redis shut down), and later ones are
ignored until that cleanup is done. The exit code is 128 + the signal number.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from elastream import __version__

COMMAND_MODULES = (
    "elastream.cli.offline",
    "elastream.cli.run",
    "elastream.cli.analyze",
    "elastream.cli.operator",
    "elastream.cli.savepoint",
)


def print_table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[object]]) -> None:
    """A fixed-width table on stdout: `columns` are (header, format spec) pairs such as ("input/s", ">12.1f");
    the header takes the spec's alignment and width, each row's cells the whole spec; cells are space-separated."""
    widths = [re.match(r"[<>^]?\d*", spec).group(0) for _, spec in columns]  # type: ignore[union-attr]
    print(" ".join(f"{header:{width}}" for (header, _), width in zip(columns, widths, strict=True)))
    for row in rows:
        print(" ".join(f"{cell:{spec}}" for cell, (_, spec) in zip(row, columns, strict=True)))


class CommandError(Exception):
    """A user-facing failure: the message is printed as-is after `error:`."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from elastream.core.metrics import SnapshotError
    from elastream.core.planner import PlanningError
    from elastream.core.schedule import ScheduleError
    from elastream.core.topology import TopologyError
    from elastream.store.registry import RedisUnavailable

    return (CommandError, TopologyError, SnapshotError, ScheduleError, PlanningError, RedisUnavailable)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elastream", description="Elastic stream processing: plan, run, scale.")
    parser.add_argument("--version", action="version", version=f"elastream {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


class _Signals:
    """Turns the first SIGTERM/SIGINT into KeyboardInterrupt and shields the cleanup from later ones."""

    def __init__(self) -> None:
        self.received: int | None = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.handle)
            signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum: int, _frame: Any) -> None:
        if self.received is not None:
            print(f"{signal.Signals(signum).name}: already stopping, please wait", file=sys.stderr, flush=True)
            return
        self.received = signum
        raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    signals = _Signals()
    signals.install()
    try:
        return int(args.func(args) or 0)
    except _user_errors() as exc:
        for line in str(exc).splitlines() or ["failed"]:
            print(f"error: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        signum = signals.received or signal.SIGINT
        print(f"interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + int(signum)
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
