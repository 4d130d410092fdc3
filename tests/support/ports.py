"""Free loopback ports, given by the OS (bind to port 0), never computed from a pid or hard-coded: two
test sessions on one machine cannot pick the same one."""

from __future__ import annotations

import socket

from elastream.control.backends.local import node_host


def free_port(*hosts: str) -> int:
    """A TCP port that was free a moment ago on every one of `hosts` (127.0.0.1 by default): the OS picks
    it on the first host, and it is checked on the others (local worker nodes each have a loopback address
    of their own, and a metrics port is bound on every one of them)."""
    first, *others = hosts or ("127.0.0.1",)
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind((first, 0))
            port = int(sock.getsockname()[1])
        if all(_free_on(host, port) for host in others):
            return port
    raise RuntimeError(f"no port the OS gave on {first} was free on {', '.join(others)} too (50 tries)")


def _free_on(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def worker_port(nodes: int) -> int:
    """A port free on the loopback address of each of a local topology's first `nodes` nodes (what
    `LocalCluster(metrics_port=...)` binds on every one)."""
    return free_port(*(node_host(f"node-{i}") for i in range(nodes)))
