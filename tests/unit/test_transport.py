"""Channels on real ZeroMQ sockets in one process: credit windows bound what is in flight in events, and a
sender blocked on a channel says which one."""

from __future__ import annotations

import logging
import socket
import threading
import time

import zmq

from elastream.runtime import transport
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
