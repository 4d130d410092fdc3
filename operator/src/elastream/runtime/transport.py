"""The data plane between executors: ZeroMQ DEALER/ROUTER sockets carrying msgpack frames, with credits.

Every executor binds one ROUTER socket (its inbox) on its worker's address; every sender executor opens one
DEALER socket per downstream executor it feeds. One socket per (sender, receiver) pair gives FIFO order per
channel — which CCR's in-band COMMIT alignment needs — and back-pressure without head-of-line blocking:
when a receiver falls behind, only the senders feeding it block.

Back-pressure is counted in events, not frames: a channel may have at most `window` events in flight (sent
but not yet taken for processing by the receiver, wherever they are: the sender's or receiver's ZeroMQ
queue, kernel buffers, the receiver's read-ahead). Each DATA frame travels with the sender's cumulative
event count; when the receiver takes the frame for processing it returns that count on the same connection
(a cumulative ack, so a lost or stale ack is harmless). The window adapts to what the receiver drains from
this channel: about `WINDOW_SECONDS` of it, between `MIN_WINDOW` and `MAX_WINDOW` events. A slow receiver
therefore holds a fraction of a second of input per channel however large the sender's batches, and a
fast one gets windows large enough that credits never limit it. Frames hold at most half a window.
Because the topology is a DAG and sinks never block on output, blocking sends cannot deadlock.

A frame is ``msgpack([kind, sender, payload])``: DATA carries a list of events ``[id, key, value, ts]``,
CONTROL a dict (PREPARE, COMMIT, ... from the migration protocol). Control frames need no credit.

With the topology's `DataPlaneKeys` (`elastream.worker_inputs.keys`; sockets secured by
`elastream.runtime.security`) inboxes are CURVE servers and channels CURVE clients: only peers holding the
topology's keys connect, and everything on the wire is encrypted.
Whatever arrives is checked before an executor sees it: a frame that does not decode, or is not the shape
above, or (with keys) comes over a connection no ZAP handler accepted, or names another sender than the
first frame of its connection did, is dropped and counted in the worker's `DataPlaneStats`, never raised.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from elastream.runtime.security import PEER_USER_ID, secure_client, secure_server
from elastream.worker_inputs.keys import DataPlaneKeys

DATA = 0
CONTROL = 1

#: frames ZeroMQ may queue per channel on each side: only a safety net, the credit window binds first
HIGH_WATER_MARK = 64
#: kernel socket buffers, kept small so that bytes do not pile up below the credit accounting
SOCKET_BUFFER_BYTES = 8 * 1024
#: events per DATA frame at most; executors also flush at the end of every input batch and source tick
MAX_BATCH = 512
#: credit window bounds, in events per channel, and the receiver drain time a window aims to cover
MIN_WINDOW = 32
MAX_WINDOW = 8192
INITIAL_WINDOW = 256
WINDOW_SECONDS = 0.2
#: how often the window is re-sized from the measured drain rate
WINDOW_UPDATE_S = 0.5
#: a sender with credit to spare takes the acks that have arrived at most this often
ACK_TAKE_S = 0.05
#: a sender blocked on one channel logs which one every this many seconds
BLOCKED_LOG_S = 5.0
#: ZeroMQ reconnects to a lost peer after 100 ms, backing off to this at most
RECONNECT_IVL_MAX_MS = 5000
#: how often an inbox looks at the handshakes it refused (its monitor socket)
MONITOR_EVERY_S = 1.0
#: connections an inbox remembers the sender of (a fresh one is checked again): more than any topology has
MAX_PEERS = 4096

log = logging.getLogger("elastream.worker")

_packb = msgpack.Packer(use_bin_type=True).pack
#: pyzmq's flags as plain ints: its enum members cost an enum construction per `&` and per call on hot paths
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
#: what a channel's monitor reports: a lost receiver, and a completed handshake (`await_handshakes`)
_MONITORED = int(zmq.EVENT_DISCONNECTED) | int(zmq.EVENT_HANDSHAKE_SUCCEEDED)


def encode(kind: int, sender: str, payload: Any) -> bytes:
    return bytes(_packb([kind, sender, payload]))


def decode(frame: bytes | memoryview) -> list[Any]:
    return msgpack.unpackb(frame, raw=False, use_list=False, strict_map_key=False)  # type: ignore[no-any-return]


def parse(frame: bytes | memoryview) -> tuple[int, str, Any] | None:
    """A received frame as ``(kind, sender, payload)``, or None when it is not one: it does not decode, or
    is not ``[DATA, str, [[id, key, value, ts], ...]]`` (ts a number) or ``[CONTROL, str, {...}]``. Garbage
    from a peer must never reach an executor's loop, where a bad shape would raise outside any operator."""
    try:
        decoded: Any = decode(frame)
    except Exception:  # msgpack raises ValueError subclasses, TypeError, ... for arbitrary bytes
        return None
    if type(decoded) is not tuple or len(decoded) != 3:
        return None
    kind, sender, payload = decoded
    if type(sender) is not str:
        return None
    if kind == DATA and type(kind) is int:
        if type(payload) is not tuple:
            return None
        for event in payload:  # ~30 ns an event
            if type(event) is not tuple or len(event) != 4:
                return None
            ts = event[3]
            if type(ts) is not float and type(ts) is not int:
                return None
    elif kind != CONTROL or type(kind) is not int or type(payload) is not dict:
        return None
    return kind, sender, payload


_SEQ_BYTES = 8

#: the handshake failures an inbox's monitor reports, and the reason each is counted under
_HANDSHAKE_FAILURES: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth",  # a CURVE client with a key that is not the topology's
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",  # no CURVE, another server key, garbage bytes
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other",
}


class DataPlaneStats:
    """What a worker's inboxes dropped and refused, by reason, cumulative since the worker started. One
    object for all the worker's inboxes (executor threads count into it, the worker reads it).

    Dropped frames: `malformed` (does not decode or has the wrong shape), `unauthenticated` (a connection
    no ZAP handler accepted), `sender` (a sender name other than the one its connection started with),
    `control` (a control message executors never send in-band, or from an executor that is not upstream).
    Refused handshakes (with keys; such a peer delivers nothing at all): `auth` (not the topology's client
    key), `protocol` (no CURVE or not the topology's server key), `other`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dropped: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    def drop(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] += 1

    def refuse(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.refused[reason] += n

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            return dict(self.dropped), dict(self.refused)


class Inbox:
    """An executor's ROUTER socket, bound to `host` (on `port`, or an ephemeral port when 0). Its `endpoint`,
    which peers connect to, names `advertise` instead when given (a socket listening on 0.0.0.0 is reached
    at the pod's address). With `keys` it is a CURVE server: only the topology's peers connect (the
    context's `PeerAuthenticator` checks them), and their frames are encrypted.

    `receive` returns ``[kind, sender, payload, ack]``; the executor calls `ack(frame)` when it takes the
    frame for processing, which returns the credit to the sender. What it drops is counted in `stats`."""

    def __init__(
        self,
        context: zmq.Context[Any],
        host: str,
        port: int = 0,
        advertise: str = "",
        keys: DataPlaneKeys | None = None,
        stats: DataPlaneStats | None = None,
    ) -> None:
        self.keys = keys
        self.stats = stats or DataPlaneStats()
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
        self.socket.setsockopt(zmq.SNDHWM, 0)  # acks are tiny and cumulative; never drop them for a full pipe
        self.socket.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.monitor: zmq.Socket[Any] | None = None
        if keys is not None:
            secure_server(self.socket, keys)
            self.monitor = self.socket.get_monitor_socket(sum(_HANDSHAKE_FAILURES))
        self._next_monitor = 0.0
        #: the sender name of each connection (its routing id), fixed by its first frame
        self._peers: dict[bytes, str] = {}
        try:
            if port:
                self.socket.bind(f"tcp://{host}:{port}")
            else:
                port = self.socket.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError:
            self.close()
            raise
        self.endpoint = f"tcp://{advertise or host}:{port}"

    def receive(self, timeout_ms: int) -> list[Any] | None:
        """The next frame, decoded, with its ack token last, or None after `timeout_ms` (0: do not wait) or
        when the frame that came was dropped (counted in `stats`)."""
        if self.monitor is not None and time.monotonic() >= self._next_monitor:
            self.take_refusals()
        socket = self.socket
        if timeout_ms and not socket.poll(timeout_ms, _POLLIN):
            return None
        try:
            parts = [socket.recv(_NOBLOCK, copy=False)]
        except zmq.Again:
            return None
        while parts[-1].more:  # the parts of a message arrive together
            parts.append(socket.recv(_NOBLOCK, copy=False))
        if len(parts) != 2 or len(parts[1]) <= _SEQ_BYTES:
            self.stats.drop("malformed")  # not a channel of ours
            return None
        peer, message = parts
        buffer = message.buffer
        frame = parse(buffer[_SEQ_BYTES:])
        if frame is None:
            self.stats.drop("malformed")
            return None
        kind, sender, payload = frame
        routing = peer.bytes
        known = self._peers.get(routing)
        if known is None:
            if self.keys is not None and _user_id(message) != PEER_USER_ID:
                self.stats.drop("unauthenticated")  # the connection was never checked by a ZAP handler
                return None
            if len(self._peers) >= MAX_PEERS:
                self._peers.clear()  # every live connection is simply checked again
            self._peers[routing] = sender
        elif known != sender:
            self.stats.drop("sender")
            return None
        return [kind, sender, payload, (routing, bytes(buffer[:_SEQ_BYTES]))]

    def take_refusals(self) -> None:
        """Count the handshakes refused since the last look (the monitor's events; called from `receive`,
        by the thread that owns the inbox, at most every `MONITOR_EVERY_S`)."""
        self._next_monitor = time.monotonic() + MONITOR_EVERY_S
        monitor = self.monitor
        if monitor is None:
            return
        while True:
            try:
                event = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:  # closed underneath
                return
            kind = int.from_bytes(event[0][:2], "little") if event and len(event[0]) >= 2 else 0
            self.stats.refuse(_HANDSHAKE_FAILURES.get(kind, "other"))

    def ack(self, token: tuple[bytes, bytes]) -> None:
        """Return the credit of a frame taken for processing (its sender's cumulative count)."""
        routing, count = token
        with contextlib.suppress(zmq.ZMQError):  # the sender is gone; a later (cumulative) ack supersedes
            self.socket.send(routing, _SNDMORE_NOBLOCK)  # (send_multipart: an enum per call for its SNDMORE)
            self.socket.send(count, _NOBLOCK)

    def close(self) -> None:
        if self.monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.socket.disable_monitor()
            self.monitor.close(0)
        self.socket.close(0)


def _user_id(message: zmq.Frame) -> str | None:
    try:
        value = message.get("User-Id")
    except zmq.ZMQError:  # no such property: no ZAP handler accepted this connection
        return None
    return value if isinstance(value, str) else None


class Channel:
    """The sending end of one (sender executor -> receiver executor) channel."""

    def __init__(
        self,
        context: zmq.Context[Any],
        sender: str,
        receiver: str,
        endpoint: str,
        keys: DataPlaneKeys | None = None,
        window: int = INITIAL_WINDOW,
    ) -> None:
        self.sender = sender
        self.receiver = receiver
        self.endpoint = endpoint
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
        self.socket.setsockopt(zmq.LINGER, 2000)
        self.socket.setsockopt(zmq.RECONNECT_IVL, 100)
        self.socket.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        if keys is not None:
            secure_client(self.socket, keys)
        self.monitor = self.socket.get_monitor_socket(_MONITORED)
        #: whether a connection to the receiver completed its handshake (CURVE's included) at least once
        self.handshaken = False
        self.socket.connect(endpoint)
        #: events sent, and the highest cumulative count the receiver has acked
        self.sent = 0
        self.acked = 0
        #: a channel that replaces one (a migration) starts from the window its predecessor learned: a fresh
        #: INITIAL_WINDOW to a slow receiver queues seconds of events at once, which users feel as latency
        self.window = max(MIN_WINDOW, min(MAX_WINDOW, window))
        self._window_started = time.monotonic()
        self._window_acked = 0
        self._next_take = 0.0

    @property
    def window(self) -> int:
        return self._window

    @window.setter
    def window(self, events: int) -> None:
        self._window = events
        #: events per DATA frame at most: half the window, so two frames can be in flight (a plain
        #: attribute: the router reads it for every event)
        self.frame_limit = max(1, min(MAX_BATCH, events // 2))

    @property
    def in_flight(self) -> int:
        return self.sent - self.acked

    def free_credit(self) -> int:
        """Events this channel can take now without blocking (the acks that have arrived are taken first
        when less than half the window looks free, so a caller waiting for credit sees it)."""
        if 2 * self.in_flight >= self.window or time.monotonic() >= self._next_take:
            self._take_acks()
        return max(0, self.window - self.in_flight)

    def send_events(self, events: list[Any], stop: threading.Event) -> float:
        """Send one DATA frame; blocks while the channel has no credit for it (back-pressure) unless `stop`
        is set. Returns the seconds spent blocked, which executors do not count as busy."""
        blocked = 0.0
        n = len(events)
        if self.in_flight + n > self.window or time.monotonic() >= self._next_take:
            self._take_acks()  # looking costs ~50 µs: only when short of credit, else every ACK_TAKE_S
        if self.in_flight > 0 and self.in_flight + n > self.window:
            blocked = self._wait_for_credit(n, stop)
            if stop.is_set():
                return blocked
        self.sent += n
        return blocked + self._send(_packb([DATA, self.sender, events]), stop)

    def send_control(self, message: dict[str, Any], stop: threading.Event) -> float:
        return self._send(_packb([CONTROL, self.sender, message]), stop)

    def _take_acks(self) -> None:
        self._next_take = time.monotonic() + ACK_TAKE_S
        socket = self.socket
        while socket.getsockopt(_EVENTS) & _POLLIN:
            try:
                ack = int.from_bytes(socket.recv(_NOBLOCK), "little")
            except zmq.Again:
                break
            if ack > self.acked:
                self.acked = min(ack, self.sent)
        now = time.monotonic()
        elapsed = now - self._window_started
        if elapsed >= WINDOW_UPDATE_S:
            drained = self.acked - self._window_acked
            if drained > 0 or self.in_flight > 0:
                # what the receiver took from this channel, over WINDOW_SECONDS; a demand-limited channel
                # measures its demand, which is enough window for it
                target = int(drained / elapsed * WINDOW_SECONDS)
                self.window = max(MIN_WINDOW, min(MAX_WINDOW, target))
            self._window_started, self._window_acked = now, self.acked

    def _wait_for_credit(self, n: int, stop: threading.Event) -> float:
        start = time.perf_counter()
        last_log = time.monotonic()
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while not stop.is_set():
            ready = dict(poller.poll(100))
            if self.monitor in ready:
                self._on_monitor_event()
            self._take_acks()
            if self.in_flight == 0 or self.in_flight + n <= self.window:
                break
            last_log = self._log_blocked(start, last_log, "%d events in flight, window %d", self.in_flight, self.window)
        return time.perf_counter() - start

    def _on_monitor_event(self) -> None:
        try:
            while True:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.handshaken = True
                else:  # the receiver went away: what was in flight to it is lost, do not wait for its credit
                    self.acked = self.sent
        except zmq.Again:
            pass

    def _send(self, frame: bytes, stop: threading.Event) -> float:
        message = self.sent.to_bytes(_SEQ_BYTES, "little") + frame  # the ack to return: our count so far
        try:
            self.socket.send(message, _NOBLOCK)
            return 0.0
        except zmq.Again:
            pass
        start = time.perf_counter()
        last_log = time.monotonic()
        while not stop.is_set():
            if self.socket.poll(100, zmq.POLLOUT):
                try:
                    self.socket.send(message, zmq.NOBLOCK)
                    break
                except zmq.Again:
                    continue
            last_log = self._log_blocked(start, last_log, "the peer takes no frames")
        return time.perf_counter() - start

    def _log_blocked(self, start: float, last_log: float, why: str, *args: Any) -> float:
        """Log that this channel has been blocked since `start` (perf_counter), at most every `BLOCKED_LOG_S`
        after `last_log` (monotonic); returns when it last logged."""
        now = time.monotonic()
        if now - last_log < BLOCKED_LOG_S:
            return last_log
        log.warning(
            "blocked on channel %s -> %s (%s) for %.0f s: " + why,
            self.sender,
            self.receiver,
            self.endpoint,
            time.perf_counter() - start,
            *args,
        )
        return now

    def close(self, linger_ms: int = 2000) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.socket.disable_monitor()
        self.monitor.close(0)
        self.socket.close(linger_ms)


def wait_for_any_credit(channels: list[Channel], stop: threading.Event, timeout_ms: int = 100) -> float:
    """Wait up to `timeout_ms` for an ack (or a lost receiver) on any of `channels`, then take what came;
    returns the seconds waited. A load-aware sender calls it while none of its channels has room."""
    start = time.perf_counter()
    if stop.is_set():
        return 0.0
    poller = zmq.Poller()
    for channel in channels:
        poller.register(channel.socket, zmq.POLLIN)
        poller.register(channel.monitor, zmq.POLLIN)
    ready = dict(poller.poll(timeout_ms))
    for channel in channels:
        if channel.monitor in ready:
            channel._on_monitor_event()
        if channel.socket in ready:
            channel._take_acks()
    return time.perf_counter() - start


def await_handshakes(channels: Iterable[Channel], timeout_s: float) -> int:
    """Wait up to `timeout_s` for every one of `channels` to have completed its handshake with its receiver;
    returns how many did. With CURVE a handshake waits for the receiving worker's ZAP handler, a Python
    thread: tens of ms on a busy worker, which frames sent on a new channel would wait out."""
    waiting = [c for c in channels if not c.handshaken]
    deadline = time.monotonic() + timeout_s
    while waiting:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        poller = zmq.Poller()
        for channel in waiting:
            poller.register(channel.monitor, zmq.POLLIN)
        ready = dict(poller.poll(left_ms))
        for channel in waiting:
            if channel.monitor in ready:
                channel._on_monitor_event()
        waiting = [c for c in waiting if not c.handshaken]
    return sum(1 for c in channels if c.handshaken)


class WarmChannels:
    """Channels opened ahead of their first frame (`Generations.warm`: a key-group migration's senders to the
    new instances, before the FLIP that routes to them), by (sender, receiver, endpoint). The sender's thread
    takes its own when it needs it; what nobody took is closed when the migration ends. Filled by the worker's
    control thread, taken by executor threads: a socket changes threads here, behind the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, str, str], Channel] = {}

    def __len__(self) -> int:
        return len(self._channels)

    def put(self, channels: Iterable[Channel]) -> None:
        with self._lock:
            for channel in channels:
                replaced = self._channels.pop((channel.sender, channel.receiver, channel.endpoint), None)
                if replaced is not None:
                    replaced.close(0)
                self._channels[(channel.sender, channel.receiver, channel.endpoint)] = channel

    def take(self, sender: str, receiver: str, endpoint: str) -> Channel | None:
        with self._lock:
            return self._channels.pop((sender, receiver, endpoint), None)

    def close(self) -> int:
        """Close what nobody took; returns how many."""
        with self._lock:
            left, self._channels = list(self._channels.values()), {}
        for channel in left:
            channel.close(0)
        return len(left)


def learned_windows(channels: Iterable[Channel]) -> dict[tuple[str, str], int]:
    """(sender executor, receiver vertex) -> the mean window `channels` have learned, for the channels that
    replace them in a migration (`Channel(window=...)`)."""
    windows: dict[tuple[str, str], list[int]] = {}
    for channel in channels:
        windows.setdefault((channel.sender, channel.receiver.rpartition("#")[0]), []).append(channel.window)
    return {key: sum(found) // len(found) for key, found in windows.items()}
