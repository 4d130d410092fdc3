"""Who drives a topology's migration or checkpoint now: an owner lease beside the claim in Redis.

`<prefix>mig:current` says *what* holds the topology (a migration id, `ckpt-<n>`); it lives as long as the
migration's record (24 h), because a migration past COMMIT must be finishable by whoever comes next.
`<prefix>mig:owner` says *who* drives it: the controller's identity, with a short TTL the owner renews while
it works (`renew`, a heartbeat). A controller that finds an unfinished migration takes it over only when its
owner's lease has run out (`holder()` is None) or is its own: a live owner is never pre-empted, a dead one is
within `OWNER_TTL_S`. If Redis itself is away longer than the TTL, the lease is gone when it returns and the
owner takes it again at its next heartbeat (one operator is active at a time: the Kubernetes Lease).
"""

from __future__ import annotations

import os
import socket
import uuid

import redis

from elastream.store.codec import text

#: seconds an owner's lease lasts without a heartbeat
OWNER_TTL_S = 30

#: set the owner if there is none or it is already the caller; 1 if the caller holds the lease now
_RENEW = """
local holder = redis.call('GET', KEYS[1])
if (not holder) or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
  return 1
end
return 0
"""

#: delete the owner only if it is the caller
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def controller_identity() -> str:
    """This process as an owner: `$POD_NAME` (the operator pod) or the host name, the pid and a random part,
    the same for every driver of this process (its migrations and checkpoints never block each other), new
    for a restarted one."""
    global _IDENTITY
    if _IDENTITY is None:
        base = os.environ.get("POD_NAME") or socket.gethostname()
        _IDENTITY = f"{base}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return _IDENTITY


_IDENTITY: str | None = None


def owner_key(prefix: str) -> str:
    return f"{prefix}mig:owner"


class OwnerLease:
    """One controller's lease on driving a topology's migrations and checkpoints."""

    def __init__(self, client: redis.Redis, prefix: str, identity: str, ttl_s: int = OWNER_TTL_S) -> None:
        self.client = client
        self.key = owner_key(prefix)
        self.identity = identity
        self.ttl_s = ttl_s
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def renew(self) -> bool:
        """Take or extend the lease; False when another live owner holds it."""
        return bool(self._renew(keys=[self.key], args=[self.identity, self.ttl_s]))

    def holder(self) -> str | None:
        value = self.client.get(self.key)
        return None if value is None else text(value)

    def held_by_another(self) -> str | None:
        """The identity of another live owner, or None (no owner, or this one)."""
        holder = self.holder()
        return holder if holder is not None and holder != self.identity else None

    def release(self) -> None:
        self._release(keys=[self.key], args=[self.identity])
