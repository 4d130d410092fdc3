"""What a hostile worker image of one tenant tries against another tenant's topology (run in a pod by
tests/e2e/test_operator.py::test_two_tenants_cannot_reach_each_others_keys_or_sockets).

The pod has exactly what a worker of the attacking topology has: its Redis URL (the topology's own ACL user, TLS
with the CA from its ConfigMap) and its data-plane keys, from the topology's Secret. It is told the victim's key
prefix and one of the victim's inbox endpoints (which it could not read from Redis itself). It prints one JSON
line: for every Redis command tried on the victim's keys, "allowed" or the error's first word; whether its own
keys work (so a refusal is not just bad credentials); and how many frames it pushed at the victim's inbox.
"""

from __future__ import annotations

import json
import os
import time

import msgpack
import redis
import zmq


def attempt(call) -> str:
    try:
        call()
    except redis.ResponseError as exc:
        if "no permissions" in str(exc).lower():  # redis-py drops the NOPERM word of the reply
            return "NOPERM"
        return str(exc).split(" ", 1)[0] or type(exc).__name__
    except redis.RedisError as exc:
        return type(exc).__name__
    return "allowed"


def redis_attacks(client: redis.Redis, own: str, victim: str) -> dict[str, str]:
    return {
        "own SET": attempt(lambda: client.set(f"{own}attack-probe", "1", ex=60)),
        "GET schedule": attempt(lambda: client.get(f"{victim}schedule")),
        "XRANGE sink": attempt(lambda: client.xrange(f"{victim}sink:out", count=1)),
        "SET": attempt(lambda: client.set(f"{victim}attack", "1")),
        "DEL checkpoint": attempt(lambda: client.delete(f"{victim}checkpoint:latest")),
        "RPUSH control": attempt(lambda: client.rpush(f"{victim}control:node-0", '{"type": "ABORT"}')),
        "HSET endpoints": attempt(lambda: client.hset(f"{victim}endpoints:1", "count#0", "tcp://127.0.0.1:1")),
        "XADD metrics": attempt(lambda: client.xadd(f"{victim}metrics", {"fake": "1"})),
        "EVAL": attempt(lambda: client.eval("return redis.call('GET', KEYS[1])", 1, f"{victim}schedule")),
        "SCAN": attempt(lambda: client.scan(0, match="*", count=1000)),
        "KEYS": attempt(lambda: client.keys("*")),
        "RANDOMKEY": attempt(lambda: client.randomkey()),
        "DBSIZE": attempt(lambda: client.dbsize()),
        "PUBLISH": attempt(lambda: client.publish(f"{victim}events", "x")),
        "FLUSHALL": attempt(lambda: client.flushall()),
        "CONFIG GET": attempt(lambda: client.config_get("requirepass")),
        "ACL SETUSER": attempt(lambda: client.acl_setuser("intruder", enabled=True, keys=["*"], commands=["+@all"])),
    }


def socket_attacks(endpoint: str, server_secret: bytes, client_secret: bytes, seconds: float) -> dict[str, int]:
    """Frames pushed at the victim's inbox: with this topology's CURVE keys, and with no CURVE at all."""
    context = zmq.Context.instance()
    sent = {"curve": 0, "plain": 0}
    with_keys = context.socket(zmq.DEALER)
    with_keys.curve_secretkey = client_secret
    with_keys.curve_publickey = zmq.curve_public(client_secret)
    with_keys.curve_serverkey = zmq.curve_public(server_secret)  # our server key: all we know
    plain = context.socket(zmq.DEALER)
    for sock in (with_keys, plain):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100)
        sock.connect(endpoint)
    forged = msgpack.packb([0, "clicks#0", [[i, f"k{i}", i, time.time()] for i in range(10**6, 10**6 + 50)]])
    control = msgpack.packb([1, "clicks#0", {"type": "COMMIT", "version": 99}])
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, sock in (("curve", with_keys), ("plain", plain)):
            for frame in (forged, control, b"\xc1garbage"):
                try:
                    sock.send_multipart([frame, b"1"], flags=zmq.NOBLOCK)
                    sent[name] += 1
                except zmq.Again:
                    pass  # no connection took it: the handshake was refused
        time.sleep(0.05)
    for sock in (with_keys, plain):
        sock.close()
    return sent


def main() -> None:
    client = redis.Redis.from_url(os.environ["ELASTREAM_REDIS_URL"], socket_timeout=10, socket_connect_timeout=5)
    report = {"redis": redis_attacks(client, os.environ["OWN_PREFIX"], os.environ["VICTIM_PREFIX"])}
    report["whoami"] = str(client.acl_whoami())
    report["sockets"] = socket_attacks(
        os.environ["VICTIM_ENDPOINT"],
        os.environ["ELASTREAM_DATA_PLANE_SERVER_KEY"].encode(),
        os.environ["ELASTREAM_DATA_PLANE_CLIENT_KEY"].encode(),
        float(os.environ.get("ATTACK_SECONDS", "5")),
    )
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
