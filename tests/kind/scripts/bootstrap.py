"""TEST-ONLY stand-in for SGLang's EncoderBootstrapServer: the three endpoints of its API that the
encoder pods call (POST /register_encoder_url, DELETE /unregister_encoder_url) and that prefill
servers read (GET /list_encoder_urls), keeping the registered URLs in memory.

    python bootstrap.py PORT
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

urls: list = []
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def _body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")

    def _send(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        url = self._body()["url"]
        with lock:
            if url not in urls:
                urls.append(url)
        print("registered", url, flush=True)
        self._send({"status": "ok"})

    def do_DELETE(self) -> None:  # noqa: N802
        url = self._body()["url"]
        with lock:
            urls[:] = [u for u in urls if u != url]
        print("unregistered", url, flush=True)
        self._send({"status": "ok"})

    def do_GET(self) -> None:  # noqa: N802
        with lock:
            self._send({"encoder_urls": list(urls)})

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
