"""Log lines as text or as JSON (`--log-format text|json`, $ELASTREAM_LOG_FORMAT), each naming the topology it
concerns, never a secret: one setup for `elastream operator`, `elastream worker`, `elastream run` and `demo`.

JSON is one object per line (`JsonFormatter`), with these keys in this order:
- `time`: when, RFC 3339 in UTC with milliseconds (``2026-11-28T17:37:24.123Z``);
- `level`: Python's level name (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``, ``CRITICAL``);
- `logger`: the logger's name (``elastream.operator``, ``kopf.objects``, ...);
- `message`: the text a text line shows after its prefix, unchanged (an ``ns/name:`` it starts with included);
- `namespace`, `topology`: the StreamTopology the line concerns, on every such line and on no other;
- `node`: the worker node, on every line of a worker;
- `exception`: the formatted traceback, when the record carries one (`stack`: a `stack_info=True` stack).
kopf's own JSON (`kopf run --log-format=json`, python-json-logger) says `timestamp`, `severity` (``info``,
``warn``) and an `object` reference. Here kopf does not configure logging (`kopf.run` leaves it to the
caller; only kopf's own CLI calls `kopf.configure`), so its records go through this same handler and get these
same keys: one parser reads the operator's, kopf's and the workers' lines alike. `message` is the key both
use; `time` and `level` are the names the issue's contract fixes, and what log shippers read by default
(Fluent Bit's and Vector's JSON parsers, Loki's `| json`); kopf's `object` becomes `namespace` and `topology`,
flat, so a query filters on `topology` whichever component wrote the line.

Which topology a line concerns (`TopologyFields`, a filter on the one handler):
- fixed fields, for a process that serves one topology for its whole life (a worker, `elastream run`);
- else the `CURRENT_TOPOLOGY` context variable, which the operator sets where one topology's work starts (its
  kopf daemon and delete handler, `handlers.topology`; `topology_context` for a block) and which its reconcile
  pool carries into the thread a pass runs on (`control.reconcile_slots.ReconcilePool.submit` runs it in a copy
  of the submitter's context);
- else kopf's object reference (`k8s_ref` on kopf's per-object records) when it names a StreamTopology.
Threads a pass starts with `threading.Thread` begin with an empty context (Python does not copy it), so their
lines carry no topology unless they set it.

Secrets: the message and the traceback of every line (text and JSON) have each URL in them passed through
`store.registry.redacted`, so a Redis URL's password never reaches a log line even where a caller forgot to
redact it (the callers redact already; this is the second lock).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, TextIO

from elastream.store.registry import redacted

LOG_FORMAT_ENV = "ELASTREAM_LOG_FORMAT"
LOG_FORMATS = ("text", "json")

#: (namespace, name) of the StreamTopology the code running now works for; None: no one topology
CURRENT_TOPOLOGY: ContextVar[tuple[str, str] | None] = ContextVar("elastream_current_topology", default=None)

#: the fields a record may carry about what it concerns (set by `TopologyFields`, or a caller's `extra=`)
FIELDS = ("namespace", "topology", "node")

#: a URL in free text: scheme://, then up to the next white space (what `redacted` reads as one URL)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def scrubbed(text: str) -> str:
    """`text` with every URL in it `redacted` (a password, a secret query parameter: ***)."""
    return _URL.sub(lambda match: redacted(match.group(0)), text) if "://" in text else text


def checked_log_format(value: str | None) -> str:
    """`value` (`--log-format`, or $ELASTREAM_LOG_FORMAT as its default) when it is a log format; else a
    ValueError naming both and the accepted values."""
    if value in LOG_FORMATS:
        return value
    raise ValueError(f"--log-format (${LOG_FORMAT_ENV}): {value!r} is not a log format; give text or json")


def add_log_format_argument(parser: argparse.ArgumentParser) -> None:
    """`--log-format text|json`, default $ELASTREAM_LOG_FORMAT, else text (checked by `checked_log_format`:
    argparse does not check a default taken from the environment)."""
    parser.add_argument(
        "--log-format",
        default=os.environ.get(LOG_FORMAT_ENV) or "text",
        metavar="text|json",
        help=f"log lines as text or as JSON objects, one a line (default ${LOG_FORMAT_ENV}, else text)",
    )


@contextlib.contextmanager
def topology_context(namespace: str, name: str) -> Iterator[None]:
    """Lines logged within the block (and in what the reconcile pool runs for it) concern NAMESPACE/NAME."""
    token = CURRENT_TOPOLOGY.set((namespace, name))
    try:
        yield
    finally:
        CURRENT_TOPOLOGY.reset(token)


class TopologyFields(logging.Filter):
    """Sets `namespace`, `topology` (and `node`) on every record it sees: the fixed ones given, else the
    current context's topology, else kopf's object reference; a field the record has already (a caller's
    `extra=`) stays. Never drops a record."""

    def __init__(self, fixed: Mapping[str, str] | None = None) -> None:
        super().__init__()
        unknown = set(fixed or {}) - set(FIELDS)
        if unknown:
            raise ValueError(f"log fields: {', '.join(sorted(unknown))}; give {', '.join(FIELDS)}")
        self.fixed = dict(fixed or {})

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.fixed.items():
            if getattr(record, key, None) is None:
                setattr(record, key, value)
        if getattr(record, "topology", None) is None:
            concerns = CURRENT_TOPOLOGY.get() or _kopf_object(record)
            if concerns is not None:
                record.namespace, record.topology = concerns
        return True


def _kopf_object(record: logging.LogRecord) -> tuple[str, str] | None:
    """(namespace, name) of the StreamTopology kopf's per-object records name (`k8s_ref`), if they do."""
    ref = getattr(record, "k8s_ref", None)
    if isinstance(ref, Mapping) and ref.get("kind") == "StreamTopology" and ref.get("name"):
        return str(ref.get("namespace") or "default"), str(ref["name"])
    return None


def rfc3339(created: float, msecs: float) -> str:
    """A record's time as RFC 3339 UTC with milliseconds, e.g. ``2026-11-28T17:37:24.123Z``."""
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(created))}.{int(msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (the keys: see the module)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": rfc3339(record.created, record.msecs),
            "level": record.levelname,
            "logger": record.name,
            "message": scrubbed(record.getMessage()),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = str(value)
        # cached on the record as logging.Formatter does, so a second handler does not format it again
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = scrubbed(record.exc_text)
        if record.stack_info:
            line["stack"] = scrubbed(self.formatStack(record.stack_info))
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """`logging.Formatter` whose lines have their URLs `redacted` (message and traceback alike)."""

    def format(self, record: logging.LogRecord) -> str:
        return scrubbed(super().format(record))


#: the text lines of the operator and of `elastream run`: time, level, logger, message
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_handler(
    log_format: str,
    fields: Mapping[str, str] | None = None,
    text_format: str = TEXT_FORMAT,
    stream: TextIO | None = None,
) -> logging.Handler:
    """A handler writing `log_format` lines to `stream` (stderr), each record given its topology fields."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(TopologyFields(fields))
    handler.setFormatter(JsonFormatter() if checked_log_format(log_format) == "json" else TextFormatter(text_format))
    return handler


def configure_logging(
    log_format: str,
    level: str | None = None,
    fields: Mapping[str, str] | None = None,
    text_format: str = TEXT_FORMAT,
) -> None:
    """The root logger writes `log_format` lines to stderr at `level` (default $ELASTREAM_LOG_LEVEL, else INFO);
    as `logging.basicConfig`, nothing changes when the root logger has a handler already."""
    logging.basicConfig(
        level=level or os.environ.get("ELASTREAM_LOG_LEVEL", "INFO"),
        handlers=[log_handler(log_format, fields, text_format)],
    )
