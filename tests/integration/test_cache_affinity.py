"""Cache affinity across pods: the receiver library's client sends each item to the pod whose
cache holds it (rendezvous hashing over the pool's endpoints), and the parts still merge in order."""

from __future__ import annotations

import asyncio
from typing import Iterator

import numpy as np
import pytest

from encoder_pod.receiver import AsyncEmbeddingReceiver, EncoderClient, affinity_key, choose
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

ITEMS = [png_data_uri(40 + 8 * k, 48, seed=300 + k) for k in range(8)]


@pytest.fixture(scope="module")
def pool(tiny_model) -> Iterator[list[EncoderServer]]:
    env = {"ENCODER_CACHE_SIZE_MB": "16", "ENCODER_WIRE_FORMAT": "encoderpool"}  # the project's receiver reads these frames
    pods = [
        EncoderServer(tiny_model("qwen2_vl"), env=env, args=["--encoder-transfer-backend", "zmq_to_tokenizer"]).start(wait_ready=False)
        for _ in range(3)
    ]
    try:
        for pod in pods:
            pod.wait_status("/health", 200, 180)
        yield pods
    finally:
        for pod in pods:
            pod.stop()


def _dispatch(urls: list[str], request_id: str, items: list[str]) -> np.ndarray:
    async def go() -> np.ndarray:
        async with AsyncEmbeddingReceiver() as rx, EncoderClient(urls, affinity=True) as client:
            await client.dispatch(request_id, [("IMAGE", item) for item in items], prefill_host="127.0.0.1", embedding_port=rx.port)
            return (await rx.wait(request_id, timeout=60)).embedding().numpy()

    return asyncio.run(go())


def _counts(pods: list[EncoderServer], name: str) -> list[float]:
    return [pod.metric(f"encoder_cache_{name}_total") for pod in pods]


def test_repeated_items_reach_the_pod_that_holds_them_and_merge_in_order(pool):
    urls = [pod.base_url for pod in pool]
    owner = [choose(affinity_key(item), urls) for item in ITEMS]
    assert len(set(owner)) > 1  # the items really spread over the pool
    first = _dispatch(urls, "turn-1", ITEMS[:5])
    misses = _counts(pool, "misses")
    assert misses == [sum(1 for k in range(5) if owner[k] == i) for i in range(3)]
    # The next turn resends the conversation's images, plus three new ones, in another order.
    turn = ITEMS[5:] + ITEMS[:5][::-1]
    second = _dispatch(urls, "turn-2", turn)
    assert _counts(pool, "hits") == [sum(1 for k in range(5) if owner[k] == i) for i in range(3)]
    assert _counts(pool, "misses") == [sum(1 for k in range(8) if owner[k] == i) for i in range(3)]
    rows = [_dispatch(urls, f"one-{k}", [item]) for k, item in enumerate(ITEMS)]
    assert np.array_equal(first, np.concatenate(rows[:5]))
    assert np.array_equal(second, np.concatenate([rows[k] for k in (5, 6, 7, 4, 3, 2, 1, 0)]))
