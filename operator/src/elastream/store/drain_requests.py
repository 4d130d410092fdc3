"""Drain requests in Redis: a worker told to stop (SIGTERM) asks the controller to move its executors off.

One hash per topology, `<prefix>drains`: node -> {"requestedAt", "deadline"} (wall-clock seconds; after the
deadline the worker exits whether or not its drain ran). The worker writes its entry (its ACL user reaches
only its topology's prefix, so a topology's workers can ask to drain only that topology's nodes); the
controller reads them every tick (`RedisDrainRequests.pending`) and deletes an entry once it is handled or
stale (`done`). Being in Redis, a request outlives an operator restart: the next controller takes it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import redis

from elastream.core.ports import DrainRequest
from elastream.core.topology import MAX_NODES

log = logging.getLogger("elastream.drains")

#: a worker's grace period (seconds between SIGTERM and being killed) in its environment; 0 or unset: no drains
DRAIN_GRACE_ENV = "ELASTREAM_DRAIN_GRACE_S"
#: more pending requests than this is no drain (a topology has at most MAX_NODES nodes): the hash is dropped
MAX_PENDING = MAX_NODES
#: the hash lives at most this long untouched (a request nobody took: every worker's deadline is far shorter)
DRAINS_TTL_S = 3600


def drains_key(prefix: str) -> str:
    return f"{prefix}drains"


def request_drain(client: redis.Redis, prefix: str, node: str, requested_at: float, deadline: float) -> None:
    """The worker's end: ask for `node` to be drained before `deadline` (one round trip)."""
    key = drains_key(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.hset(key, node, json.dumps({"requestedAt": requested_at, "deadline": deadline}))
    pipe.expire(key, DRAINS_TTL_S)
    pipe.execute()


def cancel_drain(client: redis.Redis, prefix: str, node: str) -> None:
    """The worker's end: take its request back (its backend stopped it: that SIGTERM asked for nothing)."""
    client.hdel(drains_key(prefix), node)


@dataclass
class RedisDrainRequests:
    """The controller's end (`core.ports.DrainRequests`)."""

    client: redis.Redis
    prefix: str

    def pending(self) -> dict[str, DrainRequest]:
        found: dict[str, DrainRequest] = {}
        key = drains_key(self.prefix)
        if int(self.client.hlen(key)) > MAX_PENDING:
            # workers run the topology author's code and write here: a flood must not stall the operator's
            # pass (shared by every topology); no real topology has that many nodes asking at once
            self.client.delete(key)
            log.warning("%s: more than %d drain requests, all dropped (not a real drain)", key, MAX_PENDING)
            return found
        for raw_node, raw in self.client.hgetall(key).items():
            node = raw_node.decode() if isinstance(raw_node, bytes) else str(raw_node)
            try:
                data = json.loads(raw)
                found[node] = DrainRequest(node, float(data["requestedAt"]), float(data["deadline"]))
            except (ValueError, KeyError, TypeError):
                found[node] = DrainRequest(node, 0.0, 0.0)  # unreadable: handled as one past its deadline
        return found

    def done(self, node: str) -> None:
        self.client.hdel(drains_key(self.prefix), node)
