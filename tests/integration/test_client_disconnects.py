"""Clients that go away are not server errors: on a real server with raw sockets, callers that
close mid-body, or after the body but before their answer, are counted as 499 (never 500), leave
no traceback in the log, log at most a bounded number of lines, and the server keeps serving."""

from __future__ import annotations

import json
import socket
import struct
import time

import httpx
import pytest

from tests.integration.encode_client import embedding, encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration


def _head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: encoder\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _send_then_close(port: int, data: bytes, reset: bool) -> None:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(data)
        time.sleep(0.05)  # let the server start reading before the close
        if reset:  # an abortive close (RST), as a killed client's kernel sends
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        s.close()


def _wait_metric(server: EncoderServer, want: float, *labels: str, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while (got := server.metric("encoder_requests_total", *labels)) < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


@pytest.mark.timeout(300)
def test_clients_gone_mid_body_or_before_the_answer_are_499_not_500_and_log_one_line(tiny_model):
    """Fails before 499 was recorded for them: each mid-body close was a 500 with two tracebacks."""
    with EncoderServer(tiny_model("qwen2_vl")) as server:
        uri = png_data_uri(64, 64)
        body = json.dumps({"req_id": "gone", "modality": "IMAGE", "mm_items": [uri] * 4}).encode()
        log_before = len(server.log_text())
        partial = 0
        for i in range(40):  # mid-body: the head promises the whole body, a third of it comes
            _send_then_close(server.port, _head("/encode", len(body)) + body[: len(body) // 3], reset=i % 2 == 1)
            partial += 1
        for i in range(10):  # the control endpoints read bodies too
            _send_then_close(server.port, _head("/scheduler_receive_url", 1000) + b'{"req_id": ', reset=i % 2 == 1)
        whole = 0
        slow = [png_data_uri(224, 224, seed=i) for i in range(16)]  # an encode that outlasts the close
        for i in range(10):  # the whole body, then gone before the answer
            b = json.dumps({"req_id": f"early-{i}", "modality": "IMAGE", "mm_items": slow}).encode()
            _send_then_close(server.port, _head("/encode", len(b)) + b, reset=i % 2 == 1)
            whole += 1
        # Each is answered once: 499 (gone mid-body, or before the encode finished) or 200 (the
        # encode won the race with the close and its answer went nowhere).
        _wait_metric(server, partial + whole)
        gone = server.metric("encoder_requests_total", 'code="499"')
        assert server.metric("encoder_request_errors_total", 'code="499"', 'kind="client_gone"') == gone
        # The server still serves.
        ok = encode(server.base_url, "after", [uri], timeout=60)
        assert embedding(ok).size > 0
        assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
        errors = server.metric("encoder_requests_total", 'code="500"')
        answered = server.metric("encoder_requests_total")
        ok_count = server.metric("encoder_requests_total", 'code="200"')
        log = server.log_text()[log_before:]
    lines = [line for line in log.splitlines() if "disconnect" in line.lower() or "gone" in line.lower()]
    print(f"\n{partial} mid-body + {whole} early closes on /encode, 10 on /scheduler_receive_url: "
          f"499s {gone:g}, 500s {errors:g}, log {len(log)} bytes, {len(lines)} disconnect lines: {lines[:3]}")
    assert errors == 0, log
    assert answered == partial + whole + 1 == gone + ok_count
    assert gone >= partial
    assert "Traceback" not in log, log
    assert len(lines) <= 3, log
    assert len(log) < 4000, log
