"""Writes applied at most once: one MULTI/EXEC transaction that also records a token, so a retry of the same
writes after a lost reply (Redis stopped after EXEC, before its answer) writes nothing.

WATCH on the token's key makes the check and the transaction one: an earlier attempt with the same token
whose EXEC lands late (its reply lost, the command still in flight) either shows in the token or aborts this
EXEC, which then looks again. No script: a topology's Redis user may run none (`core.acl`). Used by an
executor's checkpoint save (`store.checkpoint_store.CheckpointStore.save`) and the at-least-once sink's batch
(`runtime.operators.sinks.xadd_batch_once`). On a Redis Cluster the token's key and every key written must
share a hash slot (`store.cluster.slot_mate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from elastream.store.codec import text


def apply_once(
    client: Any, marker: str, token: str, ttl_s: int, writes: Callable[[Any], bool], look_first: bool = True
) -> bool:
    """Queue `writes` (given the transaction's pipeline; it returns False when it queued nothing, and then
    nothing is written) and `SET marker token EX ttl_s`, in one MULTI/EXEC, unless `marker` already holds
    `token`. Returns whether this call applied them. `look_first` False says no attempt with this token was
    ever sent (its first): the token cannot be there, and the read is saved (a WATCH abort reads it still)."""
    while True:
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(marker)
                if look_first:
                    applied = pipe.get(marker)
                    if applied is not None and text(applied) == token:
                        return False  # an earlier attempt was applied (its reply was lost)
                pipe.multi()
                if not writes(pipe):
                    return False
                pipe.set(marker, token, ex=ttl_s)
                pipe.execute()
                return True
            except redis.WatchError:  # the token's key changed since the WATCH: look again
                look_first = True
