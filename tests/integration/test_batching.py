"""Cross-request batching on a real server with real tiny checkpoints."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.integration.encode_client import embedding, encode, encode_concurrently
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

# (width, height) per item; different sizes and aspect ratios so token counts differ per request.
REQUESTS = [
    [(64, 48)],
    [(32, 96), (120, 80)],
    [(200, 150), (48, 48), (90, 160)],
    [(150, 60)],
    [(70, 70), (100, 40)],
    [(56, 112)],
]


def _bodies(tag: str) -> list[dict]:
    return [
        {"req_id": f"{tag}-{i}", "modality": "image",
         "mm_items": [png_data_uri(w, h, seed=i * 10 + j) for j, (w, h) in enumerate(items)]}
        for i, items in enumerate(REQUESTS)
    ]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "clip", "siglip"])
def test_batched_equals_alone(tiny_model, arch):
    """Each request's embedding from a shared batch equals encoding that request alone."""
    env = {"ENCODER_MAX_WAIT_MS": "300", "ENCODER_MAX_BATCH_SIZE": "8"}
    with EncoderServer(tiny_model(arch), env=env) as server:
        batched = encode_concurrently(server.base_url, _bodies("b"))
        assert [r.status_code for r in batched] == [200] * len(REQUESTS), [r.text for r in batched]
        # A histogram bucket le=1 below the count means at least one batch held 2+ requests.
        batches = server.metric("encoder_batch_size_count")
        singles = server.metric("encoder_batch_size_bucket", 'le="1.0"')
        assert batches - singles >= 1, "no batch larger than one request was formed"
        for body, resp in zip(_bodies("a"), batched):
            alone = encode(server.base_url, body["req_id"], body["mm_items"])
            np.testing.assert_allclose(embedding(resp), embedding(alone), rtol=1e-4, atol=1e-5)
            assert resp.json()["item_token_counts"] == alone.json()["item_token_counts"]
            assert len(resp.json()["item_token_counts"]) == len(body["mm_items"])
            assert sum(resp.json()["item_token_counts"]) == embedding(resp).shape[0]


def test_output_tokens_follow_image_grid(tiny_model):
    """Qwen2-VL rows per image are t*h*w/merge^2 of the reported grid, not a fixed count."""
    with EncoderServer(tiny_model("qwen2_vl")) as server:
        resp = encode(server.base_url, "grid", [png_data_uri(64, 48), png_data_uri(200, 150, seed=1)])
        body = resp.json()
        counts = body["item_token_counts"]
        assert counts[0] != counts[1]
        for (t, h, w), rows in zip(body["item_grids"], counts):
            assert t * h * w // 4 == rows



def test_requests_arriving_during_a_forward_share_the_next_batch(tiny_model):
    """One long request (48 images) occupies the model; four one-image requests arrive one by one
    during its forward (no MAX_WAIT_MS). They are not each taken as a batch of one as they come
    (which filled the pipeline with singles): they join one batch formed when the model is about
    to be free."""
    images = [png_data_uri(640, 480, seed=s, fmt="JPEG") for s in range(48)]
    with EncoderServer(tiny_model("clip", "moderate"), env={"ENCODER_MAX_BATCH_SIZE": "8"}) as server:
        before = server.metric("encoder_preprocess_seconds_count")
        with ThreadPoolExecutor(5) as pool:
            long = pool.submit(encode, server.base_url, "long", images)
            deadline = time.monotonic() + 120
            while server.metric("encoder_preprocess_seconds_count") == before:  # its forward starts now
                assert time.monotonic() < deadline and not long.done(), "the long request never reached the model"
                time.sleep(0.02)
            short = []
            for i in range(4):
                short.append(pool.submit(encode, server.base_url, f"short-{i}", images[i : i + 1]))
                time.sleep(0.02)  # one by one: an eager hand-off would take each alone
            answers = [long.result(), *(f.result() for f in short)]
        assert [r.status_code for r in answers] == [200] * 5, [r.text for r in answers]
        batches = server.metric("encoder_batch_size_count")
        at_most_two = server.metric("encoder_batch_size_bucket", 'le="2.0"')
        assert server.metric("encoder_batch_size_sum") == 5
    assert batches - at_most_two >= 1, f"the four short requests ran in {batches - 1:.0f} batches, none of 3 or more"
