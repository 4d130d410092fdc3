"""A synthetic source's `csv:` rate file: where it is looked up, how it is checked, how it is read.

A worker reads the file when its source opens (`elastream.runtime.operators.sources.RateProfile`); whoever
starts workers (the local backend) resolves it first, so a bad path fails in one line before any process
starts. Both sides use this module, which needs nothing of the runtime or the control plane.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from elastream.core import rates
from elastream.core.rates import parse_rates
from elastream.core.topology import Vertex
from elastream.worker_inputs.user_code import OperatorLoadError

#: the environment variable naming the directory `csv:` rate files are read from (and confined to); unset,
#: it is the manifest's directory (for `elastream run` the file's, for a worker pod /etc/elastream)
RATE_DIR_ENV = "ELASTREAM_RATE_DIR"
#: a rate file larger than this is refused unread (MAX_CSV_RATES lines of a few bytes each fit well within)
MAX_RATE_FILE_BYTES = 4 * 1_048_576


def rate_directory(manifest_dir: str) -> str:
    """The directory `csv:` paths are relative to and must stay inside: $ELASTREAM_RATE_DIR, else `manifest_dir`."""
    return os.environ.get(RATE_DIR_ENV) or manifest_dir


def read_rate_file(path: str) -> list[float]:
    """The rates of a `csv:` file; OSError or ValueError (naming the line, never its content) when it cannot
    be used. Only a regular file of at most MAX_RATE_FILE_BYTES is read (a FIFO or a device would hang or
    never end)."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses anything but a regular file
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("is not a regular file")
        data = handle.read(MAX_RATE_FILE_BYTES + 1)
    if len(data) > MAX_RATE_FILE_BYTES:
        raise ValueError(
            f"is larger than {MAX_RATE_FILE_BYTES // 1_048_576} MiB; one rate per line, one line per second"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"byte {exc.start} is not UTF-8; save the file as UTF-8") from None
    return parse_rates(text.splitlines())


def resolve_rate_file(vertex: Vertex, manifest_dir: str) -> Mapping[str, Any]:
    """The vertex's config with its `csv:` path made absolute inside the rate directory (`rate_directory`),
    checked readable: `OperatorLoadError` names the field and the file otherwise. The path, links resolved,
    must stay inside that directory; the file's content never appears in a message."""
    config = vertex.config
    if vertex.kind != "source" or not isinstance(config.get("csv"), str):
        return config
    csv = str(config["csv"])
    field_path = f"spec.vertices[{vertex.name}].source.csv"
    base = rate_directory(manifest_dir)
    why = rates.csv_path_problem(csv)
    path = os.path.join(base, csv)
    if why is None:
        root = os.path.realpath(base)
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            why = f"leads out of the rate directory {base} (through a link)"
    if why is not None:
        raise OperatorLoadError(
            f"{field_path}: {rates.shown(csv)} {why}; give a path inside the rate directory ({RATE_DIR_ENV}, else "
            "the manifest's directory)"
        )
    try:
        read_rate_file(path)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise OperatorLoadError(
            f"{field_path}: {path}: {reason}; fix the file or the path (relative paths start at the rate directory, "
            f"{RATE_DIR_ENV} or else the manifest's directory)"
        ) from None
    return {**config, "csv": path}
