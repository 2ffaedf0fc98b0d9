"""The cache with data and tensor parallelism: repeats find their rows, rank 0 decides hits first."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from tests.integration.encode_client import embedding, encode, encode_concurrently
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

CACHE = {"ENCODER_CACHE_SIZE_MB": "32"}


def ranked(server: EncoderServer, name: str, rank: int) -> float:
    return server.metric(name, f'rank="{rank}"')


def settled(server: EncoderServer, name: str, value: float, *labels: str, timeout: float = 30.0) -> float:
    """The metric once it reads ``value`` (workers report theirs with each heartbeat), else its last value."""
    deadline = time.monotonic() + timeout
    while (got := server.metric(name, *labels)) != value and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def test_data_parallel_repeats_go_to_the_worker_that_computed_them(tiny_model):
    items = [png_data_uri(40 + 8 * k, 56, seed=100 + k) for k in range(6)]
    with EncoderServer(tiny_model("qwen2_vl"), env=CACHE, args=["--dp-size", "2"]) as server:
        first = [encode(server.base_url, f"first-{k}", [item]) for k, item in enumerate(items)]
        assert settled(server, "encoder_cache_misses_total", 6) == 6
        misses = [ranked(server, "encoder_cache_misses_total", r) for r in (0, 1)]
        assert sum(misses) == 6 and min(misses) >= 1  # new items spread by load over both workers
        again = [encode(server.base_url, f"again-{k}", [item]) for k, item in reversed(list(enumerate(items)))][::-1]
        burst = encode_concurrently(server.base_url, [
            {"req_id": f"burst-{k}", "modality": "IMAGE", "mm_items": [item]} for k, item in enumerate(items)
        ])
        for a, b, c in zip(first, again, burst):
            assert np.array_equal(embedding(a), embedding(b)) and np.array_equal(embedding(a), embedding(c))
        assert settled(server, "encoder_cache_hits_total", 12) == 12
        assert server.metric("encoder_cache_misses_total") == 6  # every repeat hit the worker holding it
        assert server.metric("encoder_dp_cache_routed_requests_total", 'by="key"') == 12
        deadline = time.monotonic() + 30
        while (info := httpx.get(server.base_url + "/server_info", timeout=10).json())["cache"]["hits"] != 12:
            assert time.monotonic() < deadline, info["cache"]
            time.sleep(0.1)
        assert info["cache"]["enabled"] and info["cache"]["entries"] == 6 and info["cache"]["routing_keys"] == 6
        assert [w["cache"]["entries"] for w in info["workers"]] == misses


def test_tensor_parallel_rank_0_serves_hits_without_a_broadcast(tiny_model):
    a, b = png_data_uri(64, 48, seed=1), png_data_uri(48, 64, seed=2)
    with EncoderServer(tiny_model("qwen2_vl"), env=CACHE, args=["--tp-size", "2"]) as server:

        def steps() -> int:
            worker = httpx.get(server.base_url + "/server_info", timeout=10).json()["workers"][0]
            return int(worker["model"]["tensor_parallel"]["steps"])

        first = encode(server.base_url, "a-1", [a])
        before = steps()
        hits = [encode(server.base_url, f"a-hit-{i}", [a]) for i in range(5)]
        assert steps() - before < 5  # hits never reach the group (a probe encode may, at most)
        assert all(np.array_equal(embedding(h), embedding(first)) for h in hits)
        mixed = encode(server.base_url, "mixed", [b, a])  # the followers are still in step
        assert mixed.status_code == 200, mixed.text
        assert np.array_equal(embedding(mixed)[-embedding(first).shape[0]:], embedding(first))
        assert settled(server, "encoder_cache_hits_total", 6) == 6 and server.metric("encoder_cache_misses_total") == 2
