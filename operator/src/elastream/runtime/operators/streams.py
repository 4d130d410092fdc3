"""What the `redis-stream` source and sink share: a Redis client of their own, made when they open, and their
stream's key under the topology's prefix (`core.topology.stream_key`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elastream.core.topology import stream_key
from elastream.runtime.operators.api import Context


class RedisStreamEnd:
    """The common part of `RedisStreamSource` and `RedisStreamSink`."""

    def __init__(self, client_factory: Callable[[], Any], prefix: str) -> None:
        self.client_factory = client_factory
        self.prefix = prefix

    def open_stream(self, context: Context, role: str) -> None:
        """Make the client and name the stream `<prefix><role>:<NAME>` (NAME: `stream`, else the vertex's name);
        `stop` (the executor's) ends a wait for Redis."""
        self.client = self.client_factory()
        self.stream = stream_key(self.prefix, role, str(context.config.get("stream", context.vertex)))
        self.stop = context.stop
