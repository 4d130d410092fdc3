"""The state epoch: proof that the Redis a topology runs on still holds the state it wrote.

`<prefix>epoch` is a random id written when a topology first starts, with no TTL; the controller keeps the
id (on Kubernetes also in the resource's `status.stateEpoch`, outside Redis) and checks it on every tick. A
Redis that lost its data — a new empty volume, a FLUSHALL, a wrong URL, a restart without persistence — no
longer has it: the topology is then `StateLost`, and nothing is restarted from it (sources would begin again
from their first event and exactly-once sinks would see everything twice).
"""

from __future__ import annotations

import uuid

import redis

from elastream.store.codec import text


def epoch_key(prefix: str) -> str:
    return f"{prefix}epoch"


class RedisEpoch:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.key = epoch_key(prefix)

    def read(self) -> str | None:
        value = self.client.get(self.key)
        return None if value is None else text(value)

    def create(self) -> str:
        """A new epoch (a topology starting from nothing)."""
        epoch = uuid.uuid4().hex[:16]
        self.client.set(self.key, epoch)
        return epoch
