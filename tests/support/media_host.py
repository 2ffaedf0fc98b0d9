"""A real HTTP media host on loopback whose responses a test can hold back (a slow origin)."""

from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from testkit.media import png_data_uri

MAX_HOLD_S = 30.0
"""A held response is released after this long even if the test never releases it."""


class MediaHost:
    """Serves ``/img/<w>x<h>.png`` at once and ``/held/<w>x<h>.png`` only after :meth:`release`."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.hits = 0
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                host.hits += 1
                kind, _, name = self.path.strip("/").partition("/")
                if kind == "held":
                    host.gate.wait(MAX_HOLD_S)
                try:
                    w, h = (int(v) for v in name.removesuffix(".png").split("x"))
                except ValueError:
                    self.send_error(404)
                    return
                body = base64.b64decode(png_data_uri(w, h).split(",", 1)[1])
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def release(self) -> None:
        """Let every held response (and later ones) through."""
        self.gate.set()

    def __enter__(self) -> "MediaHost":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self._server.shutdown()
        self._server.server_close()
