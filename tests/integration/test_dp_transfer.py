"""Data-parallel mode with the ZMQ backends: workers push to real receivers on loopback.

zmq_to_scheduler keeps a req_id's receive URLs on one worker, so the front must send every
registration and the request itself to the same rank, whichever comes first, and a registration
that arrives after a failed encode must still reach the worker that owes it the error part.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import numpy as np
import pytest

from encoder_pod.receiver import EmbeddingReceiver, RemoteEncodeError
from tests.integration.encode_client import embedding, encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

IMAGE = png_data_uri(64, 48, seed=1)


@pytest.fixture(scope="module")
def scheduler_pod(tiny_model) -> Iterator[EncoderServer]:
    env = {"ENCODER_TRANSFER_BACKEND": "zmq_to_scheduler", "ENCODER_SEND_TIMEOUT": "3", "ENCODER_WIRE_FORMAT": "encoderpool"}
    with EncoderServer(tiny_model("qwen2_vl"), env=env, args=["--dp-size", "2"]) as server:
        yield server


def _register(server: EncoderServer, req_id: str, rx: EmbeddingReceiver, count: int) -> httpx.Response:
    body = {"req_id": req_id, "receive_count": count, "receive_url": f"127.0.0.1:{rx.port}", "modality": "IMAGE"}
    return httpx.post(server.base_url + "/scheduler_receive_url", json=body, timeout=10)


def test_registrations_in_any_order_reach_the_rank_that_runs_the_request(scheduler_pod):
    want = embedding(encode(scheduler_pod.base_url, "inline", [IMAGE]))
    # Several req_ids per order, so the requests land on both ranks.
    cases = [(order, i) for order in ("before", "after", "split") for i in range(2)]
    for order, i in cases:
        req_id = f"reg-{order}-{i}"
        ranks = [EmbeddingReceiver(), EmbeddingReceiver()]
        early = {"before": ranks, "after": [], "split": ranks[:1]}[order]
        try:
            for rx in early:
                assert _register(scheduler_pod, req_id, rx, 2).status_code == 200
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(encode, scheduler_pod.base_url, req_id, [IMAGE], prefill_host="127.0.0.1")
                time.sleep(0.3)
                for rx in ranks:
                    if rx not in early:
                        assert _register(scheduler_pod, req_id, rx, 2).status_code == 200
                resp = pending.result()
            assert resp.status_code == 200 and resp.json() is None, (order, resp.text)
            for rx in ranks:
                np.testing.assert_allclose(rx.wait(req_id, timeout=10).embedding().numpy(), want, rtol=1e-4, atol=1e-5)
        finally:
            for rx in ranks:
                rx.close()
    routed = [scheduler_pod.metric("encoder_dp_routed_requests_total", f'rank="{r}"') for r in (0, 1)]
    assert min(routed) >= 1, routed


def test_late_registration_after_a_failed_encode_gets_the_error_part(scheduler_pod):
    with EmbeddingReceiver() as rx:
        assert _register(scheduler_pod, "lonely", rx, 2).status_code == 200
        resp = encode(scheduler_pod.base_url, "lonely", [IMAGE], prefill_host="127.0.0.1")
        assert resp.status_code == 502 and "only 1 of 2 receive URLs" in resp.json()["message"], resp.text
        assert _register(scheduler_pod, "lonely", rx, 1).status_code == 200
        with pytest.raises(RemoteEncodeError, match="only 1 of 2"):
            rx.wait("lonely", timeout=10)


def test_malformed_registration_is_refused_by_the_front(scheduler_pod):
    bad = httpx.post(scheduler_pod.base_url + "/scheduler_receive_url",
                     json={"req_id": "x", "receive_count": 1, "receive_url": "nope"}, timeout=10)
    assert bad.status_code == 400 and "receive_url" in bad.json()["message"]
