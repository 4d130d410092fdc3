"""The data plane's keys: a topology's two ZeroMQ CURVE key pairs, where they come from and where they go.

Every topology has two CURVE key pairs, generated when it is first started and shared by all its workers: the
*server* pair, which every executor inbox of the topology uses, and the *client* pair, which every sending
channel uses (`elastream.runtime.security` makes sockets of them and checks peers). This module is what both
sides of a worker's start need: whoever starts workers (the local backend, the Kubernetes backend, the CLI and
the operator's settings) generates the keys or checks the switch, and the worker reads them.

Delivery of the keys: the *secret* keys travel in the environment of the worker process only
(`ELASTREAM_DATA_PLANE_SERVER_KEY`, `ELASTREAM_DATA_PLANE_CLIENT_KEY`, Z85 text); the public keys are derived
from them. On Kubernetes the operator writes them into the topology's Secret (`<topology>-redis`, keys
`dataPlaneServerKey`, `dataPlaneClientKey`) the first time it creates it and never changes them while the
topology lives; the worker pods read them with `secretKeyRef`. `elastream run` (the local backend) generates
a pair per run. Keys are never on a command line, in a log line, an event, a status or an error message:
`DataPlaneKeys` does not show them in its repr, and the errors here name the variable, never its value.

`ELASTREAM_DATA_PLANE_AUTH=off` turns authentication off (plain ZeroMQ TCP); it is on by default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import zmq

#: on | off (also true/false, 1/0, yes/no); default on
AUTH_ENV = "ELASTREAM_DATA_PLANE_AUTH"
#: the topology's CURVE secret keys (Z85, 40 characters): the inboxes' and the channels'
SERVER_KEY_ENV = "ELASTREAM_DATA_PLANE_SERVER_KEY"
CLIENT_KEY_ENV = "ELASTREAM_DATA_PLANE_CLIENT_KEY"
#: where they are in a topology's Kubernetes Secret
SECRET_SERVER_KEY = "dataPlaneServerKey"
SECRET_CLIENT_KEY = "dataPlaneClientKey"

_ON = ("on", "true", "1", "yes")
_OFF = ("off", "false", "0", "no")
_Z85_KEY_LENGTH = 40


class DataPlaneConfigError(ValueError):
    """The data-plane settings in the environment are missing or malformed (the message never holds a key)."""


@dataclass(frozen=True, repr=False)
class DataPlaneKeys:
    """A topology's CURVE keys (Z85 bytes). The public keys are derived from the secret ones."""

    server_secret: bytes
    client_secret: bytes
    server_public: bytes = field(init=False)
    client_public: bytes = field(init=False)

    def __post_init__(self) -> None:
        for name, key in (("server", self.server_secret), ("client", self.client_secret)):
            if len(key) != _Z85_KEY_LENGTH:
                raise DataPlaneConfigError(f"the data plane's {name} key is not a 40-character Z85 CURVE key")
        try:
            object.__setattr__(self, "server_public", zmq.curve_public(self.server_secret))
            object.__setattr__(self, "client_public", zmq.curve_public(self.client_secret))
        except (ValueError, zmq.ZMQError):
            raise DataPlaneConfigError("a data-plane key is not valid Z85 text") from None

    def __repr__(self) -> str:
        return "DataPlaneKeys(<hidden>)"

    def env(self) -> dict[str, str]:
        """The environment a worker process of this topology reads them from."""
        return {
            AUTH_ENV: "on",
            SERVER_KEY_ENV: self.server_secret.decode("ascii"),
            CLIENT_KEY_ENV: self.client_secret.decode("ascii"),
        }

    def secret_data(self) -> dict[str, str]:
        """The entries of the topology's Kubernetes Secret."""
        return {
            SECRET_SERVER_KEY: self.server_secret.decode("ascii"),
            SECRET_CLIENT_KEY: self.client_secret.decode("ascii"),
        }


def generate_keys() -> DataPlaneKeys:
    """Fresh keys for one topology (libzmq's CSPRNG)."""
    _, server_secret = zmq.curve_keypair()
    _, client_secret = zmq.curve_keypair()
    return DataPlaneKeys(server_secret, client_secret)


def auth_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    raw = environ.get(AUTH_ENV, "").strip().lower()
    if not raw or raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise DataPlaneConfigError(f"{AUTH_ENV}={raw!r}: expected on or off")


def keys_from_env(environ: Mapping[str, str] = os.environ) -> DataPlaneKeys | None:
    """The topology's keys from the worker's environment; None when `ELASTREAM_DATA_PLANE_AUTH=off`.
    Raises `DataPlaneConfigError` (naming the variable, never a value) when auth is on and a key is absent
    or malformed."""
    if not auth_enabled(environ):
        return None
    missing = [name for name in (SERVER_KEY_ENV, CLIENT_KEY_ENV) if not environ.get(name, "").strip()]
    if missing:
        raise DataPlaneConfigError(
            f"{' and '.join(missing)} not set: the data plane is authenticated by default and the topology's "
            f"keys come from its Secret (Kubernetes) or from `elastream run`; set {AUTH_ENV}=off to run "
            "without authentication"
        )
    try:
        return DataPlaneKeys(
            environ[SERVER_KEY_ENV].strip().encode("ascii"), environ[CLIENT_KEY_ENV].strip().encode("ascii")
        )
    except UnicodeEncodeError:
        raise DataPlaneConfigError(f"{SERVER_KEY_ENV} or {CLIENT_KEY_ENV} is not Z85 text") from None
    except DataPlaneConfigError as exc:
        raise DataPlaneConfigError(f"{SERVER_KEY_ENV} / {CLIENT_KEY_ENV}: {exc}") from None
