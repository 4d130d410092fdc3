"""The worker's health endpoint (a pod's probes): `/healthz` answers while the process runs, `/ready` when its
executors are bound and registered: running the current schedule, or staged and idle for a migration that
adds this node."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def serve_health(host: str, port: int, ready: Callable[[], bool]) -> ThreadingHTTPServer:
    """Serve /healthz and /ready on `host:port` from a daemon thread; returns the server (`shutdown()` it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                ok = True
            elif self.path == "/ready":
                ok = ready()
            else:
                self.send_error(404)
                return
            body = b"ok\n" if ok else b"not ready\n"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes every second: keep the log quiet
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
