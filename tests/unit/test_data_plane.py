"""The data plane's defences on real ZeroMQ sockets in one process: frames that are not ours are counted and
dropped (never raised into an executor's loop), CURVE admits only the topology's peers, and an executor
takes only in-band control messages from its upstream executors off its inbox."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import zmq
from zmq.utils import z85

from elastream.core.migration_protocol import ControlType, ExecutorParticipant
from elastream.runtime.executor import ExecutorThread
from elastream.runtime.operators import Context
from elastream.runtime.participant import Migration
from elastream.runtime.security import PEER_USER_ID, PeerAuthenticator
from elastream.runtime.transport import (
    CONTROL,
    DATA,
    Channel,
    DataPlaneStats,
    Inbox,
    WarmChannels,
    await_handshakes,
    parse,
    wait_for_any_credit,
)
from elastream.worker_inputs.keys import DataPlaneConfigError, DataPlaneKeys, generate_keys, keys_from_env

SEQ = (1).to_bytes(8, "little")


def pack(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def receive_all(inbox: Inbox, until: Callable[[list[list[Any]]], bool], timeout_s: float = 10.0) -> list[list[Any]]:
    """Frames `inbox` delivers until `until(frames)` holds or `timeout_s` passed (a bound, not a measurement)."""
    frames: list[list[Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not until(frames):
        frame = inbox.receive(50)
        if frame is not None:
            frames.append(frame)
    return frames


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.destroy(0)


GARBAGE = [
    b"\xc1",  # a byte msgpack never uses
    b"\x93\x00",  # an array of 3 that ends after one item
    pack(7),
    pack([0, "a#0"]),
    pack([0, 5, []]),  # the sender is not a name
    pack([0, "a#0", 5]),  # DATA whose payload is no list of events
    pack([0, "a#0", [[1, "k", 1]]]),  # an event of 3 fields
    pack([0, "a#0", [[1, "k", 1, "yesterday"]]]),  # a timestamp that is no number
    pack([0, "a#0", ["abcd"]]),  # an event that is a string
    pack([1, "a#0", ["commit"]]),  # CONTROL whose payload is no map
    pack([9, "a#0", {}]),  # no such kind
    pack([[0], "a#0", []]),
    b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion items
    b"\x91" * 100_000,  # nested beyond msgpack's stack
]


def test_garbage_frames_are_counted_and_dropped_and_good_frames_still_arrive(context) -> None:
    stats = DataPlaneStats()
    inbox = Inbox(context, "127.0.0.1", stats=stats)
    peer = context.socket(zmq.DEALER)
    peer.connect(inbox.endpoint)
    for garbage in GARBAGE:
        peer.send(SEQ + garbage)
    peer.send(b"short")  # no room for the credit count
    peer.send_multipart([SEQ, b"two", b"parts"])
    good = [(1, "k", {"v": 1}, 1.5), (2, None, None, 2)]
    peer.send(SEQ + pack([DATA, "a#0", good]))
    peer.send(SEQ + pack([CONTROL, "a#0", {"type": "commit", "mid": "m"}]))
    frames = receive_all(inbox, lambda got: len(got) >= 2)
    assert [f[:3] for f in frames] == [
        [DATA, "a#0", tuple(good)],
        [CONTROL, "a#0", {"type": "commit", "mid": "m"}],
    ]
    dropped, refused = stats.snapshot()
    assert dropped == {"malformed": len(GARBAGE) + 2} and refused == {}
    peer.close(0)
    inbox.close()


def test_parse_refuses_every_garbage_shape_and_keeps_good_ones() -> None:
    assert all(parse(g) is None for g in GARBAGE)
    assert parse(pack([DATA, "a#0", []])) == (DATA, "a#0", ())
    assert parse(pack([CONTROL, "a#0", {"type": "barrier"}])) == (CONTROL, "a#0", {"type": "barrier"})


def test_a_connection_cannot_change_the_sender_it_started_with(context) -> None:
    stats = DataPlaneStats()
    inbox = Inbox(context, "127.0.0.1", stats=stats)
    peer = context.socket(zmq.DEALER)
    peer.connect(inbox.endpoint)
    peer.send(SEQ + pack([DATA, "a#0", [[1, 0, 0, 0.0]]]))
    peer.send(SEQ + pack([DATA, "a#1", [[2, 0, 0, 0.0]]]))  # claims another executor's channel
    peer.send(SEQ + pack([DATA, "a#0", [[3, 0, 0, 0.0]]]))
    frames = receive_all(inbox, lambda got: len(got) >= 2)
    assert [(f[1], f[2][0][0]) for f in frames] == [("a#0", 1), ("a#0", 3)]
    assert stats.snapshot()[0] == {"sender": 1}
    peer.close(0)
    inbox.close()


@pytest.fixture
def secured(context) -> Iterator[tuple[zmq.Context[Any], DataPlaneKeys, Inbox, DataPlaneStats]]:
    keys = generate_keys()
    authenticator = PeerAuthenticator(context, keys)
    authenticator.start()
    stats = DataPlaneStats()
    inbox = Inbox(context, "127.0.0.1", keys=keys, stats=stats)
    yield context, keys, inbox, stats
    inbox.close()
    authenticator.stop()


def refusals(inbox: Inbox, stats: DataPlaneStats, reason: str, timeout_s: float = 10.0) -> list[list[Any]]:
    """What `inbox` delivers until a handshake refused for `reason` is counted (or `timeout_s`)."""

    def counted(_: list[list[Any]]) -> bool:
        inbox.take_refusals()
        return stats.snapshot()[1].get(reason, 0) > 0

    return receive_all(inbox, counted, timeout_s)


def test_a_channel_opened_ahead_knows_its_curve_handshake_is_done_and_a_refused_one_is_not_waited_for_long(
    secured,
) -> None:
    """WARM (a key-group migration) opens channels before the FLIP that sends on them and waits for their
    handshakes, which go through the receiving worker's ZAP thread; a handshake that never completes (the
    wrong topology's keys) ends the wait at its bound."""
    context, keys, inbox, _ = secured
    channel = Channel(context, "a#0", "b#0", inbox.endpoint, keys)
    assert await_handshakes([channel], 10.0) == 1
    assert channel.handshaken
    stranger = Channel(context, "a#0", "b#0", inbox.endpoint, generate_keys())  # another topology's keys
    started = time.monotonic()
    assert await_handshakes([channel, stranger], 0.3) == 1
    assert not stranger.handshaken
    assert time.monotonic() - started < 5.0  # bounded (not a timing claim: 0.3 s asked, 5 s is a hang)
    stranger.close(0)
    channel.close(0)


def test_a_lost_receiver_still_frees_a_channels_credit_beside_handshake_events(context) -> None:
    """The channel's monitor reports handshakes too now: only a disconnection drops what was in flight."""
    inbox = Inbox(context, "127.0.0.1")
    stop = threading.Event()
    channel = Channel(context, "a#0", "b#0", inbox.endpoint)
    assert await_handshakes([channel], 10.0) == 1
    channel.send_events([(1, "k", 1, 0.5)], stop)
    assert channel.in_flight == 1  # the inbox never acks: it takes nothing for processing
    wait_for_any_credit([channel], stop, 100)
    assert channel.in_flight == 1  # the handshake event freed nothing
    inbox.close()
    deadline = time.monotonic() + 10.0
    while channel.in_flight and time.monotonic() < deadline:
        wait_for_any_credit([channel], stop, 100)
    assert channel.in_flight == 0
    channel.close(0)


def test_warm_channels_go_to_the_sender_they_were_opened_for_once_and_the_rest_are_closed(context) -> None:
    inbox = Inbox(context, "127.0.0.1")
    warm = WarmChannels()
    to_b = Channel(context, "a#0", "b#0", inbox.endpoint)
    to_c = Channel(context, "a#0", "c#0", inbox.endpoint)
    warm.put([to_b, to_c])
    assert warm.take("a#1", "b#0", inbox.endpoint) is None  # another sender's: not this one's
    assert warm.take("a#0", "b#0", inbox.endpoint) is to_b
    assert warm.take("a#0", "b#0", inbox.endpoint) is None  # taken once
    again = Channel(context, "a#0", "c#0", inbox.endpoint)
    warm.put([again])  # a repeated WARM: the newer channel replaces (and closes) the older
    assert to_c.socket.closed
    assert warm.close() == 1
    assert again.socket.closed and len(warm) == 0
    to_b.close(0)
    inbox.close()


def test_the_zap_handler_admits_only_a_curve_client_that_presents_the_topologys_key(context) -> None:
    """Its answer is a function of the request alone (RFC 27 frames), so it is read without starting it."""
    keys = generate_keys()
    handler = PeerAuthenticator(context, keys)
    ours, theirs = z85.decode(keys.client_public), z85.decode(generate_keys().client_public)
    assert handler.reply([b"1.0", b"r1", b"", b"127.0.0.1", b"", b"CURVE", ours]) == [
        b"1.0",
        b"r1",
        b"200",
        b"OK",
        PEER_USER_ID.encode(),
        b"",
    ]
    refused = [
        [b"1.0", b"r2", b"", b"127.0.0.1", b"", b"CURVE", theirs],  # another topology's client key
        [b"1.0", b"r3", b"", b"127.0.0.1", b"", b"PLAIN", b"user", b"password"],
        [b"1.0", b"r4", b"", b"127.0.0.1", b"", b"NULL"],
        [b"2.0", b"r5", b"", b"127.0.0.1", b"", b"CURVE", ours],  # a version it does not speak
        [b"1.0", b"r6", b"", b"127.0.0.1", b"", b"CURVE", ours[:31]],
        [b"1.0", b"r7"],
        [],
    ]
    for request in refused:
        reply = handler.reply(request)
        assert reply[2] == b"400" and reply[4] == b"", request  # no user id: an inbox drops its frames
        assert reply[1] == (request[1] if len(request) > 1 else b"")
    assert handler.refused == 1  # only a well-formed CURVE request with a wrong key counts as a refused key
    handler.stop()  # never started: nothing to stop, and no error


def test_curve_admits_the_topologys_peer_and_refuses_a_plain_socket(secured) -> None:
    context, keys, inbox, stats = secured
    stop = threading.Event()
    channel = Channel(context, "a#0", "b#0", inbox.endpoint, keys)
    channel.send_events([(1, "k", 1, 0.5)], stop)
    frames = receive_all(inbox, lambda got: len(got) >= 1)
    assert [f[:3] for f in frames] == [[DATA, "a#0", ((1, "k", 1, 0.5),)]]
    plain = context.socket(zmq.DEALER)  # any pod of the cluster: no keys
    plain.connect(inbox.endpoint)
    plain.send(SEQ + pack([DATA, "a#0", [[666, "k", 1, 0.5]]]))
    plain.send(SEQ + pack([CONTROL, "a#0", {"type": "commit", "mid": "m"}]))
    assert refusals(inbox, stats, "protocol") == []  # refused at the handshake: nothing delivered
    assert stats.snapshot()[0] == {}
    plain.close(0)
    channel.close(0)


@pytest.mark.parametrize("knows_our_server_key", [False, True])
def test_curve_refuses_another_topologys_keys(secured, knows_our_server_key: bool) -> None:
    context, keys, inbox, stats = secured
    other = generate_keys()
    if knows_our_server_key:  # public keys are no secret: the client key must still be ours
        other = dataclasses.replace(other)
        object.__setattr__(other, "server_public", keys.server_public)
    stop = threading.Event()
    intruder = Channel(context, "a#0", "b#0", inbox.endpoint, other)
    intruder.send_events([(666, "k", 1, 0.5)], stop)
    intruder.send_control({"type": "commit", "mid": "m"}, stop)
    assert refusals(inbox, stats, "auth" if knows_our_server_key else "protocol") == []
    intruder.close(0)


def test_an_inbox_drops_frames_of_connections_no_zap_handler_checked(context) -> None:
    keys = generate_keys()  # a CURVE server in a context without the authenticator: libzmq lets anyone in
    stats = DataPlaneStats()
    inbox = Inbox(context, "127.0.0.1", keys=keys, stats=stats)
    channel = Channel(context, "a#0", "b#0", inbox.endpoint, keys)
    channel.send_events([(1, "k", 1, 0.5)], threading.Event())
    frames = receive_all(inbox, lambda _: stats.snapshot()[0].get("unauthenticated", 0) > 0)
    assert frames == []
    channel.close(0)
    inbox.close()


def test_keys_are_never_shown_and_bad_settings_name_the_variable_not_the_value() -> None:
    keys = generate_keys()
    assert keys.server_secret.decode() not in repr(keys) and keys.client_secret.decode() not in f"{keys}"
    assert keys_from_env({"ELASTREAM_DATA_PLANE_AUTH": "off"}) is None
    again = keys_from_env(keys.env())
    assert again is not None and again.client_public == keys.client_public
    with pytest.raises(DataPlaneConfigError) as missing:
        keys_from_env({})
    assert "ELASTREAM_DATA_PLANE_SERVER_KEY" in str(missing.value)
    broken = {**keys.env(), "ELASTREAM_DATA_PLANE_CLIENT_KEY": keys.env()["ELASTREAM_DATA_PLANE_CLIENT_KEY"][:-1]}
    with pytest.raises(DataPlaneConfigError) as short:
        keys_from_env(broken)
    assert broken["ELASTREAM_DATA_PLANE_CLIENT_KEY"] not in str(short.value)


class _Store:
    def save(self, *args: Any, **kwargs: Any) -> None:
        pass

    def ack(self, *args: Any, **kwargs: Any) -> None:
        pass


def executor_of_t(inbox: Inbox) -> ExecutorThread:
    """Executor t#0 on `inbox`, with s#0 as its one upstream executor (no operator: only its inbox reads run)."""
    migration = Migration("t#0", _Store(), ExecutorParticipant("t#0", frozenset({"s#0"})))  # type: ignore[arg-type]
    return ExecutorThread(
        "t#0",
        object(),
        Context("t", 0, 1, 1, {}),
        inbox,
        None,
        threading.Event(),
        False,
        migration,  # type: ignore[arg-type]
    )


def test_an_executor_takes_only_in_band_control_from_its_upstream_off_its_inbox(context) -> None:
    stats = DataPlaneStats()
    inbox = Inbox(context, "127.0.0.1", stats=stats)
    thread = executor_of_t(inbox)
    stop = threading.Event()
    upstream = Channel(context, "s#0", "t#0", inbox.endpoint)
    stranger = Channel(context, "x#0", "t#0", inbox.endpoint)
    for message in (
        {"type": ControlType.INIT, "mid": "m"},  # the controller's: never on a socket
        {"type": ControlType.ABORT, "mid": "m"},
        {"type": ControlType.CHECKPOINT_ABORT, "mid": "m"},
        {"type": ControlType.PREPARE, "mid": "m"},  # CCR's PREPARE comes from the controller
        {"type": {"nested": 1}, "mid": "m"},
        {"type": ControlType.COMMIT, "mid": "m"},  # kept
        {"type": ControlType.PREPARE, "mid": "m", "protocol": "dcr"},  # kept
        {"type": ControlType.BARRIER, "mid": "c"},  # kept
    ):
        upstream.send_control(message, stop)
    stranger.send_control({"type": ControlType.COMMIT, "mid": "m"}, stop)  # not upstream of t#0
    taken: list[list[Any]] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(taken) < 3 or sum(stats.snapshot()[0].values()) < 6):
        frame = thread._next_frame()
        if frame is not None:
            taken.append(frame)
    assert [(f[1], f[2]["type"]) for f in taken] == [
        ("s#0", ControlType.COMMIT),
        ("s#0", ControlType.PREPARE),
        ("s#0", ControlType.BARRIER),
    ]
    assert stats.snapshot()[0] == {"control": 6}
    upstream.close(0)
    stranger.close(0)
    inbox.close()


def test_an_executor_whose_only_input_is_a_dropped_control_message_waits_on(context) -> None:
    stats = DataPlaneStats()
    inbox = Inbox(context, "127.0.0.1", stats=stats)
    thread = executor_of_t(inbox)
    channel = Channel(context, "s#0", "t#0", inbox.endpoint)
    channel.send_control({"type": ControlType.INIT, "mid": "forged"}, threading.Event())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not stats.snapshot()[0]:
        assert thread._next_frame() is None  # nothing to process: no frame, and no exception either
    assert stats.snapshot()[0] == {"control": 1}
    channel.close(0)
    inbox.close()
