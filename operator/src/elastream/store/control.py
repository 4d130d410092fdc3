"""The control channel: the controller's messages to executors (PREPARE, COMMIT to sources, INIT, RESUME,
ABORT) through Redis, one list per node (`<prefix>control:<node>`); each worker's control thread pops its
list and hands every message to the executor it names, ahead of that executor's queued input.

Redis rather than a direct socket: a worker always has its Redis connection up, so a control message never
waits for a new TCP connection into a worker that is busy with a flood of data; and the messages of a
node that is restarting wait in its list. In-band messages (COMMIT between executors, DCR's PREPARE) travel
on the data channels instead, behind the data they must follow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis

from elastream.core.schedule import Schedule

CONTROL_TTL_S = 3600


def control_key(prefix: str, node: str) -> str:
    return f"{prefix}control:{node}"


class ControlChannel:
    """The controller's end: `send(executor, message)` to the node that runs the executor now."""

    def __init__(self, client: redis.Redis, prefix: str, schedule: Schedule) -> None:
        self.client = client
        self.prefix = prefix
        self.schedule = schedule

    def update(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def send_many(self, executors: Any, message: Mapping[str, Any]) -> int:
        """Send `message` to every executor in one pipelined round trip; returns how many were addressed."""
        return self.send_each({executor: message for executor in executors})

    def send_each(self, messages: Mapping[str, Mapping[str, Any]]) -> int:
        """Send each executor its own message in one pipelined round trip; returns how many were addressed."""
        pipe = self.client.pipeline(transaction=False)
        count = 0
        for executor, message in messages.items():
            node = self.schedule.assignment.get(executor)
            if node is None:
                continue
            key = control_key(self.prefix, node)
            pipe.rpush(key, json.dumps({"executor": executor, "message": dict(message)}))
            pipe.expire(key, CONTROL_TTL_S)
            count += 1
        if count:
            pipe.execute()
        return count

    def send_nodes(self, nodes: Any, message: Mapping[str, Any]) -> int:
        """Send a message for the node itself (STAGE, SWITCH, UNSTAGE) to every node in `nodes`."""
        pipe = self.client.pipeline(transaction=False)
        count = 0
        for node in nodes:
            key = control_key(self.prefix, node)
            pipe.rpush(key, json.dumps({"executor": "", "message": dict(message)}))
            pipe.expire(key, CONTROL_TTL_S)
            count += 1
        if count:
            pipe.execute()
        return count


def pop_control(client: redis.Redis, prefix: str, node: str, timeout_s: float) -> tuple[str, dict[str, Any]] | None:
    """The worker's end: the next (executor, message) for this node, or None after `timeout_s`; the executor
    is "" for a message to the node itself."""
    item = client.blpop([control_key(prefix, node)], timeout=timeout_s)
    if item is None:
        return None
    data = json.loads(item[1])
    return str(data["executor"]), dict(data["message"])
