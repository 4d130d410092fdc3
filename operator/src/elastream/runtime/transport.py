"""The data plane between executors: ZeroMQ PUSH/PULL sockets carrying msgpack frames.

Every executor binds one PULL socket (its inbox) on its worker's address; every sender executor opens one
PUSH socket per downstream executor it feeds. One socket per (sender, receiver) pair gives FIFO order per
channel — which CCR's in-band COMMIT alignment needs — and back-pressure without head-of-line blocking:
when a receiver falls behind, its channel's high-water mark fills and only the senders feeding it block.
Because the topology is a DAG and sinks never block on output, blocking sends cannot deadlock.

A frame is ``msgpack([kind, sender, payload])``: DATA carries a list of events ``[id, key, value, ts]``,
CONTROL a dict (PREPARE, COMMIT, ... from the migration protocol).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import zmq

DATA = 0
CONTROL = 1

#: frames (batches) buffered per channel on each side before a sender blocks
HIGH_WATER_MARK = 8
#: kernel socket buffers, kept small: otherwise TCP buffers megabytes per channel, back-pressure reaches the
#: sources late and every migration has to capture (and latency includes) that whole backlog
SOCKET_BUFFER_BYTES = 8 * 1024
#: events per DATA frame at most; executors also flush at the end of every input batch and source tick
MAX_BATCH = 512

_packb = msgpack.Packer(use_bin_type=True).pack


def encode(kind: int, sender: str, payload: Any) -> bytes:
    return bytes(_packb([kind, sender, payload]))


def decode(frame: bytes | memoryview) -> list[Any]:
    return msgpack.unpackb(frame, raw=False, use_list=False, strict_map_key=False)  # type: ignore[no-any-return]


class Inbox:
    """An executor's PULL socket, bound to `host` (on `port`, or an ephemeral port when 0)."""

    def __init__(self, context: zmq.Context[Any], host: str, port: int = 0) -> None:
        self.socket = context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
        self.socket.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
        self.socket.setsockopt(zmq.LINGER, 0)
        if port:
            self.socket.bind(f"tcp://{host}:{port}")
        else:
            port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"

    def receive(self, timeout_ms: int) -> list[Any] | None:
        """The next frame, decoded, or None after `timeout_ms` (0: do not wait)."""
        if timeout_ms and not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        try:
            return decode(self.socket.recv(zmq.NOBLOCK, copy=False).buffer)
        except zmq.Again:
            return None

    def close(self) -> None:
        self.socket.close(0)


class Channel:
    """The sending end of one (sender executor -> receiver executor) channel."""

    def __init__(self, context: zmq.Context[Any], sender: str, receiver: str, endpoint: str) -> None:
        self.sender = sender
        self.receiver = receiver
        self.endpoint = endpoint
        self.socket = context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
        self.socket.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
        self.socket.setsockopt(zmq.LINGER, 2000)
        self.socket.connect(endpoint)

    def send_events(self, events: list[Any], stop: threading.Event) -> float:
        """Send one DATA frame; blocks while the channel is full (back-pressure) unless `stop` is set.
        Returns the seconds spent blocked, which executors do not count as busy."""
        return self._send(_packb([DATA, self.sender, events]), stop)

    def send_control(self, message: dict[str, Any], stop: threading.Event) -> float:
        return self._send(_packb([CONTROL, self.sender, message]), stop)

    def _send(self, frame: bytes, stop: threading.Event) -> float:
        try:
            self.socket.send(frame, zmq.NOBLOCK, copy=False)
            return 0.0
        except zmq.Again:
            pass
        start = time.perf_counter()
        while not stop.is_set():
            if self.socket.poll(100, zmq.POLLOUT):
                try:
                    self.socket.send(frame, zmq.NOBLOCK, copy=False)
                    break
                except zmq.Again:
                    continue
        return time.perf_counter() - start

    def close(self, linger_ms: int = 2000) -> None:
        self.socket.close(linger_ms)
