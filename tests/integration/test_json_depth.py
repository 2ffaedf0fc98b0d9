"""Deeply nested JSON is a 400 naming the depth limit on every route that reads a body, on a real
server; ordinary bodies (with more brackets than the limit, but shallow) are unaffected; a
bootstrap server answering such JSON does not stop the pod's registration loop."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from encoder_pod.discovery.registrar import Registrar
from encoder_pod.json_limits import MAX_DEPTH
from tests.integration.encode_client import embedding, encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

DEEP = b"[" * 100_000  # what json.loads answers with RecursionError
DEEP_CONTROL = b"[" * 60_000  # the same, under the control routes' 64 KiB body limit
ROUTES = ["/encode", "/scheduler_receive_url", "/scheduler_receive_meta_data", "/send", "/start_profile"]


@pytest.mark.timeout(300)
def test_deep_json_is_400_naming_the_limit_on_every_route_and_shallow_bodies_still_work(tiny_model):
    with EncoderServer(tiny_model("qwen2_vl")) as server:
        answers = {}
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            for route in ROUTES:
                body = DEEP if route == "/encode" else DEEP_CONTROL
                answers[route] = http.post(route, content=body, headers={"content-type": "application/json"})
            # Above the small-body size: parsed off the loop by the sliced parser, bounded the same.
            big = b'{"req_id": "big", "mm_items": ' + b"[" * 300_000 + b"]" * 300_000 + b"}"
            answers["/encode (large body)"] = http.post("/encode", content=big)
            # Shallow, but with more brackets and braces than the limit: the depth-counting path.
            items = [{"url": png_data_uri(28, 28, seed=i)} for i in range(MAX_DEPTH + 6)]
            many = encode(server.base_url, "many", items, timeout=120)
            plain = encode(server.base_url, "plain", [png_data_uri(32, 32)], timeout=60)
        errors = server.metric("encoder_requests_total", 'code="500"')
        log = server.log_text()
    for route, resp in answers.items():
        print(f"\n{route}: {resp.status_code} {resp.text[:140]}", end="")
    for route, resp in answers.items():
        assert resp.status_code == 400, (route, resp.text)
        assert f"deeper than {MAX_DEPTH} levels (the limit)" in resp.json()["message"], (route, resp.text)
    assert embedding(many).shape[0] == sum(many.json()["item_token_counts"]) and len(many.json()["item_token_counts"]) == len(items)
    assert embedding(plain).size > 0
    assert errors == 0
    assert "RecursionError" not in log and "Traceback" not in log


class _Bootstrap(BaseHTTPRequestHandler):
    """An SGLang bootstrap server gone wrong: it registers, then lists with 100,000-deep JSON."""

    lists = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._answer(b"{}")

    def do_GET(self) -> None:  # noqa: N802
        type(self).lists += 1
        self._answer(DEEP)

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_bootstrap_answering_deep_json_does_not_stop_registration():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bootstrap)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    async def main() -> tuple[int, bool]:
        registrar = Registrar([f"http://127.0.0.1:{server.server_port}"], "http://pod:30000", check_interval=0.05)
        registrar.start()
        try:
            await asyncio.sleep(2.0)
            state = next(iter(registrar.states.values()))
            return _Bootstrap.lists, state.registered
        finally:
            await registrar.withdraw()

    try:
        lists, registered = asyncio.run(main())
    finally:
        server.shutdown()
        server.server_close()
    print(f"\nlist checks answered with deep JSON in 2 s: {lists}")
    assert registered
    assert lists >= 5, "the registration loop died at the first deep answer"
