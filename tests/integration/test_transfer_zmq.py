"""Both ZMQ backends on a real server, pushing to real receivers on loopback."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch

from encoder_pod.receiver import AsyncEmbeddingReceiver, EmbeddingReceiver, EncoderClient, RemoteEncodeError
from tests.integration.encode_client import embedding, encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

IMAGES = [png_data_uri(64, 48, seed=1), png_data_uri(32, 96, seed=2), png_data_uri(48, 48, seed=3)]


def _server(model, backend: str, send_timeout: str = "3") -> EncoderServer:
    env = {"ENCODER_TRANSFER_BACKEND": backend, "ENCODER_SEND_TIMEOUT": send_timeout, "ENCODER_WIRE_FORMAT": "encoderpool"}
    return EncoderServer(model, env=env)


@pytest.fixture(scope="module")
def servers(tiny_model):
    """One zmq_to_scheduler pod and three zmq_to_tokenizer pods (the multi-encoder test uses all three)."""
    model = tiny_model("qwen2_vl")
    started = [_server(model, "zmq_to_scheduler").start(wait_ready=False)]
    started += [_server(model, "zmq_to_tokenizer").start(wait_ready=False) for _ in range(3)]
    try:
        for server in started:
            server.wait_status("/health", 200, 180)
        yield {"scheduler": started[0], "tokenizers": started[1:]}
    finally:
        for server in started:
            server.stop()


def inline(server: EncoderServer, item: str) -> np.ndarray:
    return embedding(encode(server.base_url, f"inline-{time.monotonic_ns()}", [item]))


def test_tokenizer_push_equals_inline_embedding(servers):
    server = servers["tokenizers"][0]
    with EmbeddingReceiver() as rx:
        resp = encode(server.base_url, "tok-1", IMAGES[:2], prefill_host="127.0.0.1", embedding_port=rx.port)
        assert resp.status_code == 200 and resp.json() is None, resp.text
        got = rx.wait("tok-1", timeout=10)
    want = np.concatenate([inline(server, IMAGES[0]), inline(server, IMAGES[1])])
    np.testing.assert_allclose(got.embedding().numpy(), want, rtol=1e-4, atol=1e-5)
    image = next(iter(got.modalities.values()))
    assert sum(image.item_tokens) == want.shape[0] and len(image.item_grids) == 2


@pytest.mark.parametrize("n_ports", [1, 2, 4])
def test_scheduler_pushes_the_same_embedding_to_every_port(servers, n_ports):
    server = servers["scheduler"]
    receivers = [EmbeddingReceiver() for _ in range(n_ports)]
    try:
        resp = encode(server.base_url, f"sch-{n_ports}", IMAGES[:1], prefill_host="127.0.0.1",
                      embedding_port=[rx.port for rx in receivers])
        assert resp.status_code == 200 and resp.json() is None, resp.text
        got = [rx.wait(f"sch-{n_ports}", timeout=10).embedding() for rx in receivers]
    finally:
        for rx in receivers:
            rx.close()
    assert all(torch.equal(g, got[0]) for g in got)
    np.testing.assert_allclose(got[0].numpy(), inline(server, IMAGES[0]), rtol=1e-4, atol=1e-5)


def _register(server: EncoderServer, req_id: str, rx: EmbeddingReceiver, count: int) -> httpx.Response:
    body = {"req_id": req_id, "receive_count": count, "receive_url": f"127.0.0.1:{rx.port}", "modality": "IMAGE"}
    return httpx.post(server.base_url + "/scheduler_receive_url", json=body, timeout=10)


@pytest.mark.parametrize("order", ["before", "after", "split"])
def test_registration_in_either_order(servers, order):
    server, req_id = servers["scheduler"], f"reg-{order}"
    ranks = [EmbeddingReceiver(), EmbeddingReceiver()]
    early = {"before": ranks, "after": [], "split": ranks[:1]}[order]
    try:
        for rx in early:
            assert _register(server, req_id, rx, 2).status_code == 200
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(encode, server.base_url, req_id, IMAGES[:1], prefill_host="127.0.0.1", embedding_port=None)
            time.sleep(0.5)
            assert order == "before" or not pending.done()  # /encode waits for the missing registrations
            for rx in ranks:
                if rx not in early:
                    assert _register(server, req_id, rx, 2).status_code == 200
            resp = pending.result()
        assert resp.status_code == 200, resp.text
        shapes = [rx.wait(req_id, timeout=10).embedding().shape for rx in ranks]
        assert shapes[0] == shapes[1]
    finally:
        for rx in ranks:
            rx.close()


def test_missing_registration_fails_within_send_timeout_and_is_forgotten(servers):
    server = servers["scheduler"]
    with EmbeddingReceiver() as rx:
        assert _register(server, "lonely", rx, 2).status_code == 200
        started = time.monotonic()
        resp = encode(server.base_url, "lonely", IMAGES[:1], prefill_host="127.0.0.1")
        elapsed = time.monotonic() - started
        assert resp.status_code == 502, resp.text
        assert "only 1 of 2 receive URLs" in resp.json()["message"] and 2.9 < elapsed < 6
        # The failed attempt forgot its registration; a rank that registers late still gets the
        # error part, so it stops waiting.
        assert _register(server, "lonely", rx, 1).status_code == 200
        with pytest.raises(RemoteEncodeError, match="only 1 of 2"):
            rx.wait("lonely", timeout=10)
    with EmbeddingReceiver() as fresh:
        # Nothing stale is left: the same req_id registered anew completes normally.
        assert _register(server, "lonely", fresh, 1).status_code == 200
        assert encode(server.base_url, "lonely", IMAGES[:1], prefill_host="127.0.0.1").status_code == 200
        assert fresh.wait("lonely", timeout=10).embedding().shape[0] > 0
    assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200


def test_bad_registrations_and_ports_are_400(servers):
    server, tok = servers["scheduler"], servers["tokenizers"][0]
    bad = httpx.post(server.base_url + "/scheduler_receive_url", json={"req_id": "x", "receive_count": 1, "receive_url": "nope"})
    assert bad.status_code == 400 and "receive_url" in bad.json()["message"]
    for port in ([1, 2], None):
        resp = encode(tok.base_url, "tok-ports", IMAGES[:1], prefill_host="127.0.0.1", embedding_port=port)
        assert resp.status_code == 400 and "embedding_port" in resp.json()["message"]
    wrong = httpx.post(tok.base_url + "/scheduler_receive_url", json={"req_id": "x", "receive_count": 1, "receive_url": "h:1"})
    assert wrong.status_code == 400


def test_error_part_reaches_the_receiver(servers):
    server = servers["tokenizers"][0]
    with EmbeddingReceiver() as rx:
        resp = encode(server.base_url, "broken", ["data:image/png;base64,AAAA"], prefill_host="127.0.0.1", embedding_port=rx.port)
        assert resp.status_code == 400
        with pytest.raises(RemoteEncodeError) as info:
            rx.wait("broken", timeout=10)
    assert info.value.status == 400 and info.value.message.endswith(resp.json()["message"])


def test_three_encoders_each_serve_one_part_merged_in_order(servers):
    urls = [s.base_url for s in servers["tokenizers"]]

    async def main():
        async with AsyncEmbeddingReceiver() as rx, EncoderClient(urls) as client:
            plans = await client.dispatch("multi", [("IMAGE", item) for item in IMAGES], prefill_host="127.0.0.1", embedding_port=rx.port)
            return plans, await rx.wait("multi", timeout=20)

    plans, got = asyncio.run(main())
    assert [(p.part_idx, p.encoder_url, p.items) for p in plans] == [(i, urls[i], (IMAGES[i],)) for i in range(3)]
    assert [h.part_idx for h in got.parts] == [0, 1, 2]
    want = np.concatenate([inline(servers["tokenizers"][i], IMAGES[i]) for i in range(3)])
    np.testing.assert_allclose(got.embedding().numpy(), want, rtol=1e-4, atol=1e-5)
