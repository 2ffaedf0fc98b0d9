"""Clients that go away are not server errors: on a real server with raw sockets, callers that
close mid-body, or after the body but before their answer, are counted as 499 (never 500), leave
no traceback in the log, log at most a bounded number of lines, and the server keeps serving. A caller gone while its
request is queued, by any face (HTTP, vLLM's chat route, a cancelled gRPC call, on the mooncake
backend too), takes its work out of the queue: the batches after it never hold its items."""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

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


def _inflight(server: EncoderServer) -> int:
    return int(httpx.get(server.base_url + "/server_info", timeout=10).json()["inflight"])


def _until(check, what: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.timeout(600)
def test_queued_work_of_a_client_gone_by_vllms_face_or_grpc_is_dropped_before_compute(tiny_model, tmp_path):
    """Behind a long batch (one request at a time): a chat request whose client closes and a gRPC
    Encode the client cancels leave the queue; the next batches hold only the others' items."""
    from concurrent.futures import ThreadPoolExecutor

    import zmq

    from tests.integration.test_lifecycle import _flat_png
    from tests.support.grpc_client import GrpcClient
    from testkit.server import free_port

    grpc_port = free_port()
    env = {"ENCODER_MAX_BATCH_SIZE": "1", "ENCODER_NUM_THREADS": "1", "ENCODER_GRPC_PORT": str(grpc_port),
           "ENCODER_VLLM_STORAGE_PATH": str(tmp_path)}
    ctx = zmq.Context()
    sink = ctx.socket(zmq.PULL)
    sink_port = sink.bind_to_random_port("tcp://127.0.0.1")
    client = GrpcClient(grpc_port)
    chat = {"model": "m", "stream": False, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": png_data_uri(40, 40, seed=3)}, "uuid": "gone-chat"}]}]}
    try:
        with EncoderServer(tiny_model("qwen2_vl", preset="moderate"), env=env) as server, ThreadPoolExecutor(1) as pool:
            def count(*series: str) -> float:
                return server.metric(*series)

            before = {"dropped": count("encoder_dropped_requests_total", 'reason="client_gone"'),
                      "items": count("encoder_batch_items_sum"), "gone": count("encoder_requests_total", 'code="499"')}
            blocker = pool.submit(encode, server.base_url, "big", [_flat_png(448)] * 20, timeout=300)  # ~10 s of forward
            _until(lambda: _inflight(server) == 1, "the long request was never admitted")
            time.sleep(0.5)
            with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
                httpx.post(server.base_url + "/v1/chat/completions", json=chat, timeout=1.0)
            call = client.encode_future("gone-grpc", [png_data_uri(40, 40, seed=4)], ports=[sink_port])
            _until(lambda: _inflight(server) == 2, "the chat request was not released, or the gRPC call never admitted")
            call.cancel()
            assert not blocker.done(), "the long batch ended before the cancels: nothing was queued behind it"
            assert blocker.result().status_code == 200
            _until(lambda: count("encoder_dropped_requests_total", 'reason="client_gone"') == before["dropped"] + 2,
                   "the two requests were not dropped")
            assert count("encoder_batch_items_sum") == before["items"] + 20  # only the long request was encoded
            assert count("encoder_requests_total", 'code="499"') == before["gone"] + 2
            assert not (tmp_path / "gone-chat").exists()
            after = httpx.post(server.base_url + "/v1/chat/completions", json=chat, timeout=60)
            assert after.status_code == 200 and (tmp_path / "gone-chat" / "encoder_cache.safetensors").is_file()
            assert count("encoder_batch_items_sum") == before["items"] + 21
            assert "Traceback" not in server.log_text()
    finally:
        client.close()
        sink.close(0)
        ctx.term()


@pytest.mark.timeout(600)
def test_a_grpc_encode_cancelled_while_queued_on_a_mooncake_pod_stages_nothing_and_frees_its_req_id(tiny_model):
    """TRANSFER_BACKEND=mooncake, behind a long batch: the cancelled call is dropped before compute, a
    Send for it finds nothing staged, and the same req_id encodes, stages and sends at once."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    import numpy as np
    import torch
    import zmq
    from smg_grpc_proto import sglang_encoder_pb2 as pb

    from tests.integration.test_lifecycle import _flat_png
    from tests.integration.test_transfer_mooncake import Rank
    from tests.support.grpc_client import GrpcClient, failure
    from testkit.server import free_port

    grpc_port = free_port()
    env = {"ENCODER_MAX_BATCH_SIZE": "1", "ENCODER_NUM_THREADS": "1", "ENCODER_GRPC_PORT": str(grpc_port),
           "ENCODER_TRANSFER_BACKEND": "mooncake", "ENCODER_MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"}
    image = png_data_uri(40, 40, seed=5)
    ctx = zmq.Context()
    client = GrpcClient(grpc_port)
    rank = Rank(ctx, 4 << 20)
    try:
        with EncoderServer(tiny_model("qwen2_vl", preset="moderate"), env=env) as server, ThreadPoolExecutor(1) as pool:
            want = embedding(encode(server.base_url, "reference", [image], timeout=60))  # inline: no prefill_host
            dropped = server.metric("encoder_dropped_requests_total", 'reason="client_gone"')
            items = server.metric("encoder_batch_items_sum")
            blocker = pool.submit(encode, server.base_url, "big", [_flat_png(448)] * 20, timeout=300)
            _until(lambda: _inflight(server) == 1, "the long request was never admitted")
            time.sleep(0.5)
            call = client.encode_future("mc-gone", [image], ports=[9])  # mooncake ignores the ports
            _until(lambda: _inflight(server) == 2, "the gRPC call was never admitted")
            call.cancel()
            assert not blocker.done(), "the long batch ended before the cancel: nothing was queued behind it"
            assert blocker.result().status_code == 200
            _until(lambda: server.metric("encoder_dropped_requests_total", 'reason="client_gone"') == dropped + 1,
                   "the cancelled call was not dropped")
            assert server.metric("encoder_batch_items_sum") == items + 20

            def send() -> Any:
                return client.encoder.Send(pb.SendRequest(
                    req_id="mc-gone", prefill_host="127.0.0.1", embedding_port=rank.port, session_id=rank.session,
                    buffer_address=rank.buffer.data_ptr()), timeout=30)

            code, details, _ = failure(send)
            assert code is grpc.StatusCode.UNAVAILABLE and "no staged embedding" in details, (code, details)
            response = client.encode("mc-gone", [image], ports=[9], timeout=60)  # the req_id is free at once
            assert (response.embedding_len, response.embedding_dim) == want.shape
            send()
            rank.ack()
            landed = rank.buffer[: response.embedding_size].view(torch.float32).reshape(want.shape).numpy()
            np.testing.assert_allclose(landed, want, rtol=1e-4, atol=1e-5)
    finally:
        rank.close()
        client.close()
        ctx.term()
