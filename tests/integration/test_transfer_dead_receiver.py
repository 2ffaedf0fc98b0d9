"""A prefill receiver that is down: a bounded error, a healthy server, no leaked sockets or threads."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from encoder_pod.receiver import EmbeddingReceiver
from tests.integration.encode_client import encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer, free_port

pytestmark = pytest.mark.integration

SEND_TIMEOUT = 0.5
IDLE_S = 1.0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _settled(pid: int) -> tuple[int, int]:
    """FD and thread counts once idle pooled sockets had time to close."""
    time.sleep(IDLE_S + 1.5)
    return _fds(pid), _threads(pid)


def test_dead_receiver_fails_fast_and_leaks_nothing(tiny_model):
    env = {
        "ENCODER_TRANSFER_BACKEND": "zmq_to_tokenizer",
        "ENCODER_WIRE_FORMAT": "encoderpool",  # the live receiver below is encoder_pod.receiver
        "ENCODER_SEND_TIMEOUT": str(SEND_TIMEOUT),
        "ENCODER_TRANSFER_MAX_SOCKETS": "8",
        "ENCODER_TRANSFER_SOCKET_IDLE_S": str(IDLE_S),
        "ENCODER_TRANSFER_LINGER_S": "0",
    }
    image = png_data_uri(40, 40)
    dead_ports = [free_port() for _ in range(20)]
    with EncoderServer(tiny_model("qwen2_vl"), env=env) as server:
        pid = server.proc.pid
        # The series a delivery alert reads exist at 0 before the first failure: rate() sees the first one.
        text = httpx.get(server.base_url + "/metrics", timeout=10).text
        assert 'encoder_delivery_failures_total{backend="zmq_to_tokenizer",kind="transfer_failed"} 0.0' in text
        assert 'encoder_items_total{modality="IMAGE"} 0.0' in text

        def push(i: int) -> tuple[int, str, float]:
            port = dead_ports[i % len(dead_ports)]
            started = time.monotonic()
            resp = encode(server.base_url, f"dead-{i}", [image], prefill_host="127.0.0.1", embedding_port=port)
            return resp.status_code, resp.json()["message"] if resp.content else "", time.monotonic() - started

        with ThreadPoolExecutor(25) as pool:
            # Warm up with the same concurrency, so lazily grown pools (media threads, the sender
            # thread, the ZMQ context) exist before the baseline: growth after it is a leak.
            status, message, elapsed = push(0)
            assert status == 502 and f"127.0.0.1:{dead_ports[0]} accepted no connection" in message
            assert SEND_TIMEOUT <= elapsed < SEND_TIMEOUT + 2
            list(pool.map(push, range(1, 100)))
            before = _settled(pid)
            results = list(pool.map(push, range(200)))
        statuses = {s for s, _, _ in results}
        assert statuses == {502}, statuses
        failed = server.metric("encoder_delivery_failures_total", 'backend="zmq_to_tokenizer"', 'kind="transfer_failed"')
        assert failed == 300 and server.metric("encoder_request_errors_total", 'code="502"', 'kind="transfer_failed"') == 300
        for i, (_, message, _) in enumerate(results):
            assert f"127.0.0.1:{dead_ports[i % len(dead_ports)]}" in message, message
        # Each waits its own SEND_TIMEOUT (plus encode and queueing behind 24 others on 2 cores).
        assert max(elapsed for _, _, elapsed in results) < SEND_TIMEOUT + 5
        after = _settled(pid)
        print(f"server fds/threads before={before} after={after}")
        assert after[0] == before[0], f"open FDs before {before[0]}, after {after[0]}"
        # Bounded executors (media, asyncio's default) may still add a lazy worker or two; a leak
        # would add about one thread per request.
        assert after[1] - before[1] <= 2, f"threads before {before[1]}, after {after[1]}"
        assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200
        # And a receiver that is up still gets its embedding.
        with EmbeddingReceiver() as rx:
            resp = encode(server.base_url, "alive", [image], prefill_host="127.0.0.1", embedding_port=rx.port)
            assert resp.status_code == 200, resp.text
            assert rx.wait("alive", timeout=10).embedding().shape[0] > 0
