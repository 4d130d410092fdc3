"""Channels on real ZeroMQ sockets in one process: credit windows bound what is in flight in events, a sender
blocked on a channel says which one, and a shuffle stream's balance decides who gets what."""

from __future__ import annotations

import logging
import socket
import threading
import time

import zmq

from elastream.core.topology import Stream
from elastream.runtime import transport
from elastream.runtime.routing import OutputStream, Router
from elastream.runtime.transport import DATA, Channel, Inbox


def test_in_flight_events_stay_within_the_credit_window() -> None:
    context = zmq.Context()
    inbox = Inbox(context, "127.0.0.1")
    channel = Channel(context, "a#0", "b#0", inbox.endpoint)
    stop = threading.Event()
    received: list[int] = []

    def slow_receiver() -> None:  # takes a frame every 50 ms: at most 1,000 events/s in 50-event frames
        while not stop.is_set():
            frame = inbox.receive(50)
            if frame is not None:
                time.sleep(0.05)
                inbox.ack(frame[3])
                assert frame[0] == DATA
                received.extend(e[0] for e in frame[2])

    thread = threading.Thread(target=slow_receiver, daemon=True)
    thread.start()
    worst = 0
    try:
        for i in range(0, 20_000, 50):
            channel.send_events([[j, 0, j, 0.0] for j in range(i, i + 50)], stop)
            worst = max(worst, channel.in_flight - channel.window)
            if len(received) >= 2_000:
                break
    finally:
        stop.set()
        thread.join(5)
        channel.close(0)
        inbox.close()
        context.term()
    assert worst <= 50  # never more than one frame beyond the window
    assert received == list(range(len(received)))  # FIFO
    assert channel.window < transport.INITIAL_WINDOW  # it shrank to ~0.2 s of what this receiver drains


def test_a_sender_blocked_on_a_peer_that_never_reads_says_which(monkeypatch, caplog) -> None:
    monkeypatch.setattr(transport, "BLOCKED_LOG_S", 0.2)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens here once the probe is closed
    context = zmq.Context()
    channel = Channel(context, "parse#0", "transform#3", f"tcp://127.0.0.1:{port}")
    stop = threading.Event()
    sender = threading.Thread(
        target=lambda: [channel.send_events([[i, 0, i, 0.0]] * 100, stop) for i in range(100)], daemon=True
    )
    with caplog.at_level(logging.WARNING, logger="elastream.worker"):
        sender.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "blocked on channel" not in caplog.text:
            time.sleep(0.05)
        stop.set()
        sender.join(5)
    channel.close(0)
    context.term()
    assert f"blocked on channel parse#0 -> transform#3 (tcp://127.0.0.1:{port}) for" in caplog.text


def _shuffle_split(balance: str, seconds_per_frame: tuple[float, float]) -> tuple[list[list[int]], float]:
    """Route 6,000 events over a shuffle stream with `balance` to two receivers that take a frame every
    `seconds_per_frame[i]`; returns the event ids each received, in order, and the sender's blocked time."""
    context = zmq.Context()
    inboxes = [Inbox(context, "127.0.0.1") for _ in range(2)]
    channels = [Channel(context, "a#0", f"b#{i}", inbox.endpoint) for i, inbox in enumerate(inboxes)]
    output = OutputStream(Stream("a", "b", "shuffle", None, balance), 128, channels)
    stop = threading.Event()
    router = Router([output], stop)
    received: list[list[int]] = [[], []]
    total = 6_000

    def receiver(i: int) -> None:
        while sum(map(len, received)) < total and not stop.is_set():
            frame = inboxes[i].receive(20)
            if frame is not None:
                time.sleep(seconds_per_frame[i])
                inboxes[i].ack(frame[3])
                received[i].extend(e[0] for e in frame[2])

    threads = [threading.Thread(target=receiver, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        for i in range(total):
            router.route([i, 0, i, 0.0])
            if i % 100 == 99:
                router.flush()  # as an executor does at the end of each input batch
        router.flush()
        deadline = time.monotonic() + 30
        while sum(map(len, received)) < total and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        for channel in channels:
            channel.close(0)
        for inbox in inboxes:
            inbox.close()
        context.term()
    return received, router.take_blocked()


def test_load_aware_shuffle_sends_more_to_the_receiver_that_drains_faster() -> None:
    received, _ = _shuffle_split("load-aware", (0.0, 0.02))
    fast, slow = received
    assert sorted(fast + slow) == list(range(6_000))  # every event exactly once
    assert fast == sorted(fast) and slow == sorted(slow)  # FIFO per channel
    assert len(fast) > 3 * len(slow), (len(fast), len(slow))


def test_round_robin_shuffle_deals_equal_shares_whatever_the_receivers_manage() -> None:
    received, _ = _shuffle_split("round-robin", (0.0, 0.005))
    fast, slow = received
    assert sorted(fast + slow) == list(range(6_000))
    assert fast == sorted(fast) and slow == sorted(slow)
    assert len(fast) == len(slow) == 3_000


def test_load_aware_shuffle_deals_equal_receivers_in_turn() -> None:
    received, _ = _shuffle_split("load-aware", (0.0, 0.0))
    assert sorted(received[0] + received[1]) == list(range(6_000))
    assert min(map(len, received)) > 1_000, list(map(len, received))  # ties go to the next channel


def test_an_inbox_on_every_interface_advertises_the_address_peers_reach_it_at() -> None:
    context = zmq.Context()
    inbox = Inbox(context, "0.0.0.0", 0, advertise="127.0.0.1")
    channel = Channel(context, "a#0", "b#0", inbox.endpoint)
    stop = threading.Event()
    try:
        assert inbox.endpoint.startswith("tcp://127.0.0.1:")
        channel.send_events([[7, 0, 7, 0.0]], stop)
        frame = inbox.receive(5000)
        assert frame is not None and frame[0] == DATA and [e[0] for e in frame[2]] == [7]
    finally:
        channel.close(0)
        inbox.close()
        context.term()
