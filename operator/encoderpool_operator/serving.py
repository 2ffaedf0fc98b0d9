"""The operator's own HTTP endpoint: GET /healthz, GET /readyz and GET /metrics.

A small threaded server, so that a standby replica (waiting for the leader Lease, with no kopf
running) answers its liveness probe and shows its metrics like the leader does.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from encoderpool_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StatusServer:
    """Serves health and metrics on ``port`` (all interfaces) until closed."""

    def __init__(self, port: int, metrics: OperatorMetrics, healthy: Callable[[], bool], host: str = "0.0.0.0") -> None:
        self.metrics = metrics
        self.healthy = healthy
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path == "/metrics":
                    self._send(200, server.metrics.render(), METRICS_TYPE)
                elif self.path in ("/healthz", "/readyz"):
                    ok = server.healthy()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n", "text/plain")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
                log.debug("http: " + format, *args)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="status-http", daemon=True)

    @property
    def port(self) -> int:
        """The bound port (useful when 0 asked for any free one)."""
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
