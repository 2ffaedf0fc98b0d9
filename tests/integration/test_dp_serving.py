"""Data-parallel mode serving: real worker processes on CPU behind one front, a tiny checkpoint.

One dp=2 server is shared by the module (each start spawns two model-loading processes, which is
the slow part on a 2-core machine).
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from tests.integration.encode_client import embedding, encode, encode_concurrently
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

# (width, height) per item: different sizes so requests differ in token counts.
REQUESTS = [
    [(64, 48)],
    [(32, 96), (120, 80)],
    [(200, 150), (48, 48)],
    [(150, 60)],
    [(70, 70), (100, 40)],
    [(56, 112)],
    [(90, 90)],
    [(40, 160), (64, 64)],
]


def _bodies(tag: str) -> list[dict]:
    return [
        {"req_id": f"{tag}-{i}", "modality": "image",
         "mm_items": [png_data_uri(w, h, seed=i * 10 + j) for j, (w, h) in enumerate(items)]}
        for i, items in enumerate(REQUESTS)
    ]


def _wait_metric(server: EncoderServer, check, timeout: float = 10.0) -> None:
    """Worker metrics arrive with heartbeats (every 0.5 s): poll until ``check(server)`` holds."""
    deadline = time.monotonic() + timeout
    while not check(server):
        assert time.monotonic() < deadline, server.log_text()[-3000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def dp_server(tiny_model) -> Iterator[EncoderServer]:
    # MAX_WAIT_MS lets each worker batch what it holds, so routing and batching both show.
    env = {"ENCODER_MAX_WAIT_MS": "50"}
    with EncoderServer(tiny_model("qwen2_vl"), env=env, args=["--dp-size", "2"]) as server:
        yield server


def test_load_spreads_over_both_workers_and_results_equal_single_process(tiny_model, dp_server):
    with EncoderServer(tiny_model("qwen2_vl")) as single:
        reference = [encode(single.base_url, b["req_id"], b["mm_items"]) for b in _bodies("ref")]
    answers = encode_concurrently(dp_server.base_url, _bodies("dp"))
    assert [r.status_code for r in answers] == [200] * len(REQUESTS), [r.text for r in answers]
    for ref, got in zip(reference, answers):
        np.testing.assert_allclose(embedding(got), embedding(ref), rtol=1e-4, atol=1e-5)
        assert got.json()["item_token_counts"] == ref.json()["item_token_counts"]
        assert got.json()["item_grids"] == ref.json()["item_grids"]
    routed = [dp_server.metric("encoder_dp_routed_requests_total", f'rank="{r}"') for r in (0, 1)]
    assert sum(routed) == len(REQUESTS) and min(routed) >= 2, routed
    # Both workers really encoded (their own batch metrics, merged with a rank label); the start-up
    # health encode adds one item per rank.
    _wait_metric(dp_server, lambda s: all(s.metric("encoder_batch_items_sum", f'rank="{r}"') > 1 for r in (0, 1)))
    assert dp_server.metric("encoder_requests_total", 'code="200"') >= len(REQUESTS)


def test_front_rejects_bad_requests_before_any_worker(dp_server):
    before = sum(dp_server.metric("encoder_dp_routed_requests_total", f'rank="{r}"') for r in (0, 1))
    bad = httpx.post(dp_server.base_url + "/encode", json={"req_id": "bad", "mm_items": []}, timeout=10)
    assert bad.status_code == 400 and bad.json()["req_id"] == "bad" and "modality" in bad.json()["message"]
    undecodable = encode(dp_server.base_url, "undecodable", ["data:image/png;base64,AAAA"])
    assert undecodable.status_code == 400 and "mm_items[0]" in undecodable.json()["message"]
    after = sum(dp_server.metric("encoder_dp_routed_requests_total", f'rank="{r}"') for r in (0, 1))
    # The malformed body never reached a worker; the undecodable item did (decoding is worker work).
    assert after == before + 1


def test_health_answers_fast_while_workers_are_busy(dp_server):
    stop = threading.Event()
    done: list[int] = []
    items = [png_data_uri(224, 224, seed=s) for s in range(6)]

    def load(worker: int) -> None:
        n = 0
        while not stop.is_set():
            done.append(encode(dp_server.base_url, f"busy-{worker}-{n}", items, timeout=120).status_code)
            n += 1

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(load, i) for i in range(6)]
        try:
            deadline = time.monotonic() + 60
            while len(done) < 6:
                assert time.monotonic() < deadline, "load never got going"
                time.sleep(0.05)
            latencies, busy = [], 0
            # One kept-alive client: the probe measures the server, not a TLS context per call.
            with httpx.Client(base_url=dp_server.base_url, timeout=5) as probe:
                for _ in range(10):
                    busy += probe.get("/server_info").json()["inflight"] > 0
                    started = time.perf_counter()
                    health = probe.get("/health")
                    latencies.append(time.perf_counter() - started)
                    assert health.status_code == 200, health.text
                    time.sleep(0.1)
        finally:
            stop.set()
            for f in futures:
                f.result()
    # Closed-loop clients leave gaps between requests (more on a loaded machine): most probes, not all.
    assert busy >= 5, f"the workers were busy for only {busy} of 10 /health probes"
    assert statistics.median(latencies) < 0.1 and max(latencies) < 1.0, latencies
    assert set(done) == {200}


def test_profile_and_info_fan_out_to_every_rank(dp_server, tmp_path: Path):
    started = httpx.post(dp_server.base_url + "/start_profile", json={"output_dir": str(tmp_path)}, timeout=60)
    assert started.status_code == 200, started.text
    assert sorted(started.json()["ranks"]) == ["0", "1"]
    assert encode(dp_server.base_url, "profiled", [png_data_uri(32, 32)]).status_code == 200
    stopped = httpx.post(dp_server.base_url + "/stop_profile", timeout=60)
    assert stopped.status_code == 200, stopped.text
    for rank in (0, 1):
        assert list((tmp_path / f"rank-{rank}").glob("encoder-trace-*.json")), rank
    info = httpx.get(dp_server.base_url + "/server_info", timeout=5).json()
    assert info["state"] == "ready" and info["dp_size"] == 2 and info["model"]["arch"] == "qwen2_vl"
    workers = info["workers"]
    assert [w["rank"] for w in workers] == [0, 1] and len({w["pid"] for w in workers}) == 2
    assert all(w["state"] == "ready" and w["placement"] == "CPU, 1 threads" for w in workers), workers

