"""The server's own connection limits, on a real server with real sockets: connections that never
finish their headers are closed (its file descriptors come back), connections beyond the limit
are answered 503 at once, and a normal request keeps working meanwhile."""

from __future__ import annotations

import json
import os
import select
import socket
import time

import httpx
import pytest

from tests.integration.encode_client import encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

PARTIAL = b"GET /health HTTP/1.1\r\nHost: encoder\r\nUser-Agent: slow\r\n"  # the blank line never comes


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _wait_fds(pid: int, ok, timeout: float) -> tuple[float, int]:
    started = time.monotonic()
    while not ok(n := _fds(pid)):
        assert time.monotonic() - started < timeout, f"server holds {n} file descriptors after {timeout}s"
        time.sleep(0.1)
    return time.monotonic() - started, n


def _open_slow(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(PARTIAL)
        socks.append(s)
    return socks


def _read_answer(s: socket.socket) -> bytes:
    """One whole HTTP answer (headers and its content-length body), however the bytes arrive."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, f"closed before the headers were complete: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(4096)
        assert chunk, f"closed before the body was complete: {data + body!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.5)
    try:
        return s.recv(4096) == b""
    except (TimeoutError, socket.timeout):
        return False
    except ConnectionResetError:
        return False


@pytest.mark.timeout(300)
@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_connections_that_never_finish_their_headers_are_closed_and_fds_come_back(tiny_model, parser):
    header_timeout = 3.0
    env = {"ENCODER_HTTP_HEADER_TIMEOUT": str(header_timeout), "ENCODER_HTTP_KEEPALIVE_TIMEOUT": "1",
           "ENCODER_HTTP_PARSER": parser}
    with EncoderServer(tiny_model("qwen2_vl"), env=env) as server:
        pid = server.proc.pid
        time.sleep(1.0)
        baseline = _fds(pid)
        slow = _open_slow(server.port, 500)
        try:
            _, held = _wait_fds(pid, lambda n: n >= baseline + 500, 30)
            # While they are held, the server answers normally.
            assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
            assert encode(server.base_url, "normal", [png_data_uri(32, 32)], timeout=60).status_code == 200
            back_s, after = _wait_fds(pid, lambda n: n <= baseline + 2, header_timeout + 15)
            closed = sum(_closed_by_server(s) for s in slow[:20])
        finally:
            for s in slow:
                s.close()
        # An idle keep-alive connection is closed after HTTP_KEEPALIVE_TIMEOUT.
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as kept:
            kept.sendall(b"GET /livez HTTP/1.1\r\nHost: encoder\r\n\r\n")
            answer = _read_answer(kept)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            started = time.monotonic()
            assert kept.recv(4096) == b""
            keepalive_s = time.monotonic() - started
    print(
        f"\n500 connections without complete headers: server FDs {baseline} -> {held} -> {after}, "
        f"back within {back_s:.1f}s of the normal requests (HTTP_HEADER_TIMEOUT={header_timeout:g}s); "
        f"{closed}/20 sampled clients saw the close; idle keep-alive closed after {keepalive_s:.1f}s"
    )
    assert closed == 20
    assert keepalive_s < 5


@pytest.mark.timeout(300)
@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_connections_beyond_the_limit_get_503_and_fds_stay_bounded(tiny_model, parser):
    limit = 50
    env = {"ENCODER_HTTP_MAX_CONNECTIONS": str(limit), "ENCODER_HTTP_HEADER_TIMEOUT": "60", "ENCODER_HTTP_PARSER": parser}
    with EncoderServer(tiny_model("qwen2_vl"), env=env) as server:
        pid = server.proc.pid
        time.sleep(1.0)
        baseline = _fds(pid)
        held = _open_slow(server.port, limit)
        try:
            _wait_fds(pid, lambda n: n >= baseline + limit, 30)
            over = []
            for _ in range(20):
                with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: encoder\r\n\r\n")
                    answer = b""
                    while chunk := s.recv(4096):
                        answer += chunk
                over.append(answer)
            peak = _fds(pid)
        finally:
            for s in held:
                s.close()
        _wait_fds(pid, lambda n: n <= baseline + 2, 15)
        assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    print(f"\nHTTP_MAX_CONNECTIONS={limit}: {limit} held, 20 more answered {over[0].split(b' ', 2)[1].decode()}; server FDs {baseline} -> {peak}")
    for answer in over:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head and b"connection: close" in head, answer
        assert b"ENCODER_HTTP_MAX_CONNECTIONS" in body
    assert peak <= baseline + limit + 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_oversized_heads_are_refused_and_large_bodies_on_one_connection_are_not(tiny_model, parser):
    """A request head over 16 KiB gets a 4xx and the connection closes (h11 bounds it itself, the
    httptools protocol counts it); bodies many times that size, one after another on one
    keep-alive connection, are not heads and all succeed."""
    with EncoderServer(tiny_model("qwen2_vl"), env={"ENCODER_HTTP_PARSER": parser}) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: encoder\r\n")
            for _ in range(40):  # up to 40 KiB of header lines, in pieces, never finished
                s.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
                # Stop once the server answered (a client that goes on sending: the next tests).
                if select.select([s], [], [], 0.2)[0]:
                    break
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        status = int(answer.split(b" ", 2)[1])
        assert status in (400, 431), answer
        big = png_data_uri(160, 160)  # a ~100 KB body
        assert len(big) > 4 * 16 * 1024
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            for i in range(4):
                resp = client.post("/encode", json={"req_id": f"big-{i}", "modality": "IMAGE", "mm_items": [big]})
                assert resp.status_code == 200, resp.text
            assert client.get("/health").status_code == 200
    print(f"\n{parser}: a 40 KiB head was answered {status} and closed; four 100 KB bodies on one connection: 200")


def _head_of(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_answers_on_one_keep_alive_connection_stay_whole_and_in_order(tiny_model, parser):
    """The connection limits' protocol still serves HTTP/1.1 as clients use it: an answer to HEAD,
    100 Continue, an error and a binary answer arrive whole, in order, on one connection."""
    body = json.dumps({"req_id": "kept", "modality": "IMAGE", "mm_items": [png_data_uri(32, 32)]}).encode()
    with EncoderServer(tiny_model("qwen2_vl"), env={"ENCODER_HTTP_PARSER": parser}) as server, \
            socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: encoder\r\n\r\n")
        assert _read_answer(s).endswith(b'{"status":"alive"}')
        # An answer to HEAD is a head only (a 405 here: /livez is GET): it must still come, and the next after it.
        s.sendall(b"HEAD /livez HTTP/1.1\r\nHost: encoder\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(4096)
        assert data.startswith(b"HTTP/1.1 405") and data.endswith(b"\r\n\r\n"), data
        # Expect: 100-continue: the client sends the body only once told to.
        s.sendall(b"POST /encode HTTP/1.1\r\nHost: encoder\r\nContent-Type: application/json\r\n"
                  b"Accept: application/octet-stream\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += s.recv(4096)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        s.sendall(body)
        answer = _read_answer(s)
        assert answer.startswith(b"HTTP/1.1 200") and b"content-type: application/octet-stream" in _head_of(answer).lower()
        assert len(answer) - len(_head_of(answer)) - 4 > 1000  # the embedding itself
        # An error answer, then a normal one, on the same connection.
        s.sendall(b"POST /encode HTTP/1.1\r\nHost: encoder\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{]")
        error = _read_answer(s)
        assert error.startswith(b"HTTP/1.1 400") and b"not valid JSON" in error, error
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: encoder\r\n\r\n")
        assert _read_answer(s).startswith(b"HTTP/1.1 200")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("parser", ["httptools", "h11"])
@pytest.mark.parametrize("case", ["oversized head", "unparsable request"])
def test_a_refused_request_is_answered_even_while_its_client_keeps_sending(tiny_model, parser, case):
    """A 400/431 goes out, the write side is shut, and what the client still sends is dropped
    until it closes: closing at once would reset the connection and could destroy the answer."""
    opening = {
        "oversized head": b"GET /health HTTP/1.1\r\nHost: encoder\r\n" + b"X-Filler: " + b"a" * 40_000 + b"\r\n",
        "unparsable request": b"GET /health HTTP/1.1\r\nHost encoder\r\n\r\n",  # a header line with no colon
    }[case]
    with EncoderServer(tiny_model("qwen2_vl"), env={"ENCODER_HTTP_PARSER": parser}) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(opening)
            # Keep sending after the server has refused: 2 MB that it never parses.
            sent = 0
            try:
                while sent < 2_000_000:
                    sent += s.send(b"b" * 65536)
            except OSError as exc:  # the server closed first: its answer must still be readable
                print(f"\nsend stopped after {sent} bytes: {exc}")
            answer = _read_answer(s)
            status = int(answer.split(b" ", 2)[1])
            message = json.loads(answer.partition(b"\r\n\r\n")[2])["message"]
            started = time.monotonic()
            try:
                closed = s.recv(4096) == b""
            except ConnectionResetError:
                closed = True  # the close after the linger, with our input unread
            closed_s = time.monotonic() - started
        assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    print(f"\n{parser}, {case}: answered {status} ({message!r}) after {sent} more bytes; closed {closed_s:.1f}s later")
    assert (case, status) in (("oversized head", 400), ("oversized head", 431), ("unparsable request", 400))
    assert message and closed and closed_s < 10
