"""testkit.load, the load generator of the tests and the benchmarks, against a real HTTP server on
loopback that answers as a pod does (200, a draining 503, a 400), and against a closed port."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from testkit.load import Answer, ClosedLoop, image_bodies, refused_or_unreachable, run_load
from testkit.server import free_port

pytestmark = pytest.mark.integration


class _Pod(BaseHTTPRequestHandler):
    """200 with the body's req_id until ``drain_after`` requests were answered, then the drain's 503."""

    protocol_version = "HTTP/1.1"  # kept-alive connections, as the pod serves them
    answered = 0
    drain_after = 10**9
    lock = threading.Lock()
    req_ids: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with _Pod.lock:
            _Pod.req_ids.append(body["req_id"])
            draining = _Pod.answered >= _Pod.drain_after
            _Pod.answered += 1
        if self.path == "/bad":
            self._send(400, {"status": "error", "message": "field 'modality': required", "req_id": body["req_id"]})
        elif draining:
            self._send(503, {"status": "error", "message": "draining: try another pod", "req_id": body["req_id"]},
                       {"Retry-After": "1", "Connection": "close"})
        else:
            time.sleep(0.005)
            self._send(200, {"status": "ok", "req_id": body["req_id"]})

    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def pod() -> Iterator[str]:
    _Pod.answered, _Pod.drain_after, _Pod.req_ids = 0, 10**9, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pod)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_run_load_sends_exactly_total_requests_with_unique_ids_and_summarises_them(pod: str) -> None:
    finished: list[int] = []

    async def finish(n: int, answer: Answer) -> None:
        assert answer.status == 200 and json.loads(answer.body)["req_id"] == f"t-{n}"
        finished.append(n)

    result = asyncio.run(run_load(pod, image_bodies(["data:,a", "data:,b"], "t"), 4, 40, 1, finish=finish))
    assert result["requests"] == 40 and result["errors"] == 0 and result["concurrency"] == 4
    assert sorted(finished) == list(range(40))
    assert sorted(_Pod.req_ids) == sorted(f"t-{n}" for n in range(40))
    assert result["images_per_s"] > 0 and 0 < result["p50_ms"] <= result["p99_ms"]


def test_a_target_per_request_is_asked_with_the_request_number(pod: str) -> None:
    asked: list[int] = []

    def target(n: int) -> str:
        asked.append(n)
        return pod

    result = asyncio.run(run_load(target, image_bodies(["x"], "c"), 3, 12))
    assert result["requests"] == 12 and sorted(asked) == list(range(12))


def test_errors_are_counted_and_their_message_kept(pod: str) -> None:
    loop = ClosedLoop(pod, 2, image_bodies(["x"]), path="/bad", total=6)
    outcomes = asyncio.run(loop.run())
    assert [o.status for o in outcomes] == [400] * 6
    assert {o.message for o in outcomes} == {"field 'modality': required"}
    assert asyncio.run(run_load(pod, image_bodies(["x"]), 2, 4, path="/bad"))["errors"] == 4


def test_on_a_thread_each_client_stops_after_a_draining_refusal(pod: str) -> None:
    _Pod.drain_after = 20
    load = ClosedLoop(pod, 4, image_bodies(["x"]), stop_after=refused_or_unreachable).start()
    load.wait_ok(20, 30)
    deadline = time.monotonic() + 30
    while sum(o.draining_refusal for o in load.answers()) < 4:  # every client was refused once, then stopped
        assert time.monotonic() < deadline, load.answers()[-5:]
        time.sleep(0.05)
    outcomes = load.stop()
    refused = [o for o in outcomes if o.status != 200]
    assert len(refused) == 4 and all(o.draining_refusal for o in refused), refused
    assert {o.client for o in refused} == {0, 1, 2, 3}
    assert all(o.sent <= o.done for o in outcomes)


def test_a_closed_port_is_unreachable_and_ends_the_client() -> None:
    load = ClosedLoop(f"http://127.0.0.1:{free_port()}", 2, image_bodies(["x"]), stop_after=refused_or_unreachable)
    outcomes = asyncio.run(load.run())
    assert len(outcomes) == 2 and all(o.unreachable and isinstance(o.status, str) for o in outcomes), outcomes


def test_stop_new_sends_nothing_more_and_duration_bounds_a_run(pod: str) -> None:
    load = ClosedLoop(pod, 2, image_bodies(["x"])).start()
    load.wait_ok(4, 30)
    load.stop_new()
    time.sleep(0.2)
    count = len(load.answers())
    time.sleep(0.3)
    assert len(load.stop()) == count
    started = time.monotonic()
    result = asyncio.run(run_load(pod, image_bodies(["x"]), 2, 10**9, duration=0.5))
    assert time.monotonic() - started < 5 and result["requests"] > 0
