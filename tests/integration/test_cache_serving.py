"""The embedding cache behind a real server: single flight under a burst, a computing client
that disconnects, and what /metrics and /server_info show.

ENCODER_MAX_WAIT_MS holds each batch open for a few seconds, so the burst and the disconnect
happen while the first computation of an item is certainly still under way (the window is long
on purpose: the test machine is shared and loaded; nothing asserts how fast anything is).
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import httpx
import numpy as np
import pytest

from tests.integration.encode_client import embedding, encode, encode_concurrently
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

WINDOW_MS = 4000
BUDGET_MB = 32


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[EncoderServer]:
    env = {"ENCODER_CACHE_SIZE_MB": str(BUDGET_MB), "ENCODER_MAX_WAIT_MS": str(WINDOW_MS), "ENCODER_MAX_BATCH_SIZE": "64"}
    with EncoderServer(tiny_model("qwen2_vl"), env=env) as srv:
        yield srv


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def counts(server: EncoderServer) -> dict[str, float]:
    return {name: server.metric(f"encoder_cache_{name}_total") for name in ("hits", "misses", "single_flight_waits")}


def raw_post(server: EncoderServer, body: dict) -> socket.socket:
    """Send a whole /encode request on a socket of our own, to close it before the answer."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = f"POST /encode HTTP/1.1\r\nHost: pod\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    return sock


def test_64_identical_requests_arriving_together_are_computed_once(server):
    item = png_data_uri(96, 64, seed=640)
    before = counts(server)
    answers = encode_concurrently(server.base_url, [
        {"req_id": f"burst-{i}", "modality": "IMAGE", "mm_items": [item]} for i in range(64)
    ])
    assert [a.status_code for a in answers] == [200] * 64, [a.text[:200] for a in answers if a.status_code != 200]
    first = embedding(answers[0])
    assert all(np.array_equal(embedding(a), first) for a in answers)
    after = counts(server)
    assert after["misses"] - before["misses"] == 1
    assert (after["single_flight_waits"] - before["single_flight_waits"]) + (after["hits"] - before["hits"]) == 63


def test_waiters_get_the_rows_when_the_computing_client_disconnects(server):
    item = png_data_uri(80, 80, seed=41)
    before = counts(server)
    gone_before = server.metric("encoder_requests_total", 'code="499"')
    leader = raw_post(server, {"req_id": "leader", "modality": "IMAGE", "mm_items": [item]})
    until(lambda: counts(server)["misses"] == before["misses"] + 1, "the leader's miss")
    with ThreadPoolExecutor(8) as pool:
        waiters = [pool.submit(encode, server.base_url, f"waiter-{i}", [item]) for i in range(8)]
        until(lambda: counts(server)["single_flight_waits"] == before["single_flight_waits"] + 8, "8 waiters")
        leader.close()  # mid-way: its item is batched, not yet computed
        answers = [w.result(timeout=120) for w in waiters]
    assert [a.status_code for a in answers] == [200] * 8, [a.text[:200] for a in answers]
    assert all(np.array_equal(embedding(a), embedding(answers[0])) for a in answers)
    assert counts(server)["misses"] == before["misses"] + 1  # nobody computed it again
    until(lambda: server.metric("encoder_requests_total", 'code="499"') == gone_before + 1, "the leader's 499")
    alone = encode(server.base_url, "alone", [png_data_uri(80, 80, seed=41)])
    assert np.array_equal(embedding(alone), embedding(answers[0]))  # and now it is a hit


def test_a_computation_whose_only_client_left_is_dropped_and_computed_again_later(server):
    item = png_data_uri(72, 40, seed=7)
    before = counts(server)
    dropped = server.metric("encoder_dropped_requests_total", 'reason="client_gone"')
    leader = raw_post(server, {"req_id": "lonely", "modality": "IMAGE", "mm_items": [item]})
    until(lambda: counts(server)["misses"] == before["misses"] + 1, "the miss")
    leader.close()
    until(lambda: server.metric("encoder_dropped_requests_total", 'reason="client_gone"') == dropped + 1, "the drop")
    again = encode(server.base_url, "later", [item])
    assert again.status_code == 200, again.text
    assert counts(server)["misses"] == before["misses"] + 2  # no stale flight was left behind
    info = httpx.get(server.base_url + "/server_info", timeout=10).json()["cache"]
    assert info["in_flight"] == 0


def test_metrics_and_server_info_show_the_cache(server):
    encode(server.base_url, "seen", [png_data_uri(48, 48, seed=1)])
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    for family in ("hits_total", "misses_total", "single_flight_waits_total", "evictions_total", "bytes", "entries", "budget_bytes"):
        assert f"\nencoder_cache_{family} " in text, family
    assert server.metric("encoder_cache_budget_bytes") == BUDGET_MB * 1024 * 1024
    info = httpx.get(server.base_url + "/server_info", timeout=10).json()
    cache = info["cache"]
    assert cache["enabled"] and cache["budget_bytes"] == BUDGET_MB * 1024 * 1024
    assert 0 < cache["bytes"] == server.metric("encoder_cache_bytes") and cache["entries"] >= 1
    assert cache["fill"] == round(cache["bytes"] / cache["budget_bytes"], 4)
    assert info["settings"]["cache"] == {"cache_size_mb": BUDGET_MB}
