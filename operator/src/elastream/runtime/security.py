"""The data plane's authentication and encryption: ZeroMQ CURVE with keys per topology.

Every topology has two CURVE key pairs, generated when it is first started and shared by all its workers: the
*server* pair, which every executor inbox (a ROUTER socket) of the topology uses, and the *client* pair,
which every sending channel (a DEALER socket) uses. A handshake therefore succeeds only when

- the client knows the server's public key and the server proves it holds the server secret key (a client
  does not talk to an impostor inbox), and
- the client proves it holds the topology's client secret key: the worker's ZAP handler
  (`PeerAuthenticator`) accepts exactly the topology's client public key and refuses every other one, so a
  pod of another topology (other keys) or a socket without CURVE is refused before any frame is delivered.

After the handshake every frame is encrypted and authenticated (CurveZMQ: Curve25519, XSalsa20, Poly1305).
Accepted connections carry the ZAP user id `PEER_USER_ID`; an inbox that sees a frame without it (no ZAP
handler answered: the connection was never checked) drops it.

The keys themselves (`DataPlaneKeys`, where they come from and how they are generated) are
`elastream.worker_inputs.keys`: whoever starts a worker needs them too, and reaches no runtime module.
"""

from __future__ import annotations

import hmac
import threading
from typing import Any

import zmq
from zmq.utils import z85

from elastream.worker_inputs.keys import DataPlaneKeys

#: the ZAP user id of a connection that presented the topology's client key (what inboxes check)
PEER_USER_ID = "elastream-topology-peer"


def secure_server(socket: zmq.Socket[Any], keys: DataPlaneKeys) -> None:
    """Make `socket` (an inbox, before it binds) a CURVE server with the topology's server key."""
    socket.curve_secretkey = keys.server_secret
    socket.curve_publickey = keys.server_public
    socket.curve_server = True


def secure_client(socket: zmq.Socket[Any], keys: DataPlaneKeys) -> None:
    """Make `socket` (a channel, before it connects) a CURVE client of the topology's inboxes."""
    socket.curve_secretkey = keys.client_secret
    socket.curve_publickey = keys.client_public
    socket.curve_serverkey = keys.server_public


class _Peers:
    """The ZAP credentials check: only the topology's client key (Z85); refusals counted."""

    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed
        self.lock = threading.Lock()
        self.refused = 0

    def admits(self, z85_key: bytes) -> bool:
        if hmac.compare_digest(z85_key, self.allowed):
            return True
        with self.lock:
            self.refused += 1
        return False


#: where libzmq sends a context's ZAP requests (RFC 27), and the protocol version it speaks
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_ZAP_VERSION = b"1.0"


class PeerAuthenticator:
    """The ZAP handler of one ZeroMQ context (one per worker process): CURVE connections to the context's
    inboxes are accepted only with the topology's client key. Start it before any inbox binds; stop it
    before the context terminates.

    A plain thread that waits in a poll on the ZAP socket and answers each request at once, not pyzmq's
    `ThreadAuthenticator`: that one runs an asyncio loop, whose several steps per request each wait for the
    GIL behind a busy worker's executor threads; a key-group migration's handshakes took 20-45 ms there, and
    the events sent on a new channel waited for them."""

    def __init__(self, context: zmq.Context[Any], keys: DataPlaneKeys) -> None:
        self.context = context
        self.peers = _Peers(keys.client_public)
        self._stop = threading.Event()
        self._socket: zmq.Socket[Any] | None = None
        self._thread = threading.Thread(target=self._serve, name="zap", daemon=True)

    @property
    def refused(self) -> int:
        """Handshakes refused for a key that is not the topology's."""
        return self.peers.refused

    def start(self) -> None:
        socket = self.context.socket(zmq.REP)
        socket.linger = 0
        socket.bind(ZAP_ENDPOINT)
        self._socket = socket
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        elif self._socket is not None:  # never started its thread
            self._socket.close(0)

    def _serve(self) -> None:
        socket = self._socket
        assert socket is not None
        try:
            while not self._stop.is_set():
                if socket.poll(100, zmq.POLLIN):  # a bounded wait: a stop is seen within 100 ms
                    socket.send_multipart(self.reply(socket.recv_multipart()))
        finally:
            socket.close(0)

    def reply(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply to `request`: 200 with `PEER_USER_ID` for a CURVE client that presented the topology's
        client key, 400 for anything else (nothing of the request is logged: keys are credentials)."""
        request_id = request[1] if len(request) > 1 else b""
        if len(request) >= 7:
            version, _, _domain, _address, _identity, mechanism, key = request[:7]
            if (
                version == _ZAP_VERSION
                and mechanism == b"CURVE"
                and len(key) == 32
                and self.peers.admits(z85.encode(key))
            ):
                return [_ZAP_VERSION, request_id, b"200", b"OK", PEER_USER_ID.encode(), b""]
        return [_ZAP_VERSION, request_id, b"400", b"NO ACCESS", b"", b""]
