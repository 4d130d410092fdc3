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

import logging
import threading
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

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
    """The ZAP credentials check: only the topology's client key; refusals counted."""

    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed
        self.lock = threading.Lock()
        self.refused = 0

    def callback(self, domain: str, key: bytes) -> bool:
        if key == self.allowed:
            return True
        with self.lock:
            self.refused += 1
        return False


class _Authenticator(ThreadAuthenticator):
    def curve_user_id(self, client_public_key: bytes) -> str:
        return PEER_USER_ID  # not the key: user ids may end up in logs


class PeerAuthenticator:
    """The ZAP handler of one ZeroMQ context (one per worker process): CURVE connections to the context's
    inboxes are accepted only with the topology's client key. Start it before any inbox binds; stop it
    before the context terminates."""

    def __init__(self, context: zmq.Context[Any], keys: DataPlaneKeys) -> None:
        self.peers = _Peers(keys.client_public)
        # its own logger, quiet below WARNING: pyzmq's authenticator logs client keys at DEBUG
        quiet = logging.getLogger("elastream.zap")
        quiet.setLevel(logging.WARNING)
        self.authenticator = _Authenticator(context, log=quiet)

    @property
    def refused(self) -> int:
        """Handshakes refused for a key that is not the topology's."""
        return self.peers.refused

    def start(self) -> None:
        self.authenticator.start()
        self.authenticator.configure_curve_callback(domain="*", credentials_provider=self.peers)

    def stop(self) -> None:
        self.authenticator.stop()
