"""Tensor-parallel serving on CPU (gloo): real groups of processes, tiny checkpoints with 4 heads.

Each server start spawns a front, a rank 0 and a follower that each import torch and load the
model, the slow part on a 2-core machine: servers are shared per module where the test allows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from tests.integration.encode_client import embedding, encode, encode_concurrently
from testkit.media import png_data_uri
from testkit.server import EncoderServer, free_port

pytestmark = pytest.mark.integration

TP2 = ["--tp-size", "2"]
# (width, height) per item: different sizes, so a batch mixes token counts.
REQUESTS = [[(64, 48)], [(32, 96), (120, 80)], [(200, 150)], [(70, 70), (100, 40)], [(56, 112)], [(90, 90)]]


def _bodies(tag: str) -> list[dict]:
    return [
        {"req_id": f"{tag}-{i}", "modality": "image",
         "mm_items": [png_data_uri(w, h, seed=i * 10 + j) for j, (w, h) in enumerate(items)]}
        for i, items in enumerate(REQUESTS)
    ]


def _reference(model) -> list[httpx.Response]:
    with EncoderServer(model) as single:
        return [encode(single.base_url, b["req_id"], b["mm_items"]) for b in _bodies("ref")]


def _assert_equal_to(reference: list[httpx.Response], answers: list[httpx.Response]) -> None:
    assert [r.status_code for r in answers] == [200] * len(reference), [r.text[:300] for r in answers]
    for ref, got in zip(reference, answers):
        np.testing.assert_allclose(embedding(got), embedding(ref), rtol=1e-4, atol=1e-5)
        assert got.json()["item_token_counts"] == ref.json()["item_token_counts"]


def _group(server: EncoderServer, rank: int = 0) -> dict:
    worker = httpx.get(server.base_url + "/server_info", timeout=10).json()["workers"][rank]
    return worker["model"]["tensor_parallel"]


@pytest.fixture(scope="module")
def qwen_tp2(tiny_model) -> Iterator[EncoderServer]:
    # MAX_WAIT_MS makes the batcher gather concurrent requests into one broadcast forward.
    with EncoderServer(tiny_model("qwen2_vl"), env={"ENCODER_MAX_WAIT_MS": "50"}, args=TP2) as server:
        yield server


@pytest.mark.timeout(240)
def test_qwen2_vl_tp2_equals_tp1_under_concurrent_batched_load(tiny_model, qwen_tp2):
    reference = _reference(tiny_model("qwen2_vl"))
    _assert_equal_to(reference, encode_concurrently(qwen_tp2.base_url, _bodies("tp")))
    info = httpx.get(qwen_tp2.base_url + "/server_info", timeout=10).json()
    assert info["mode"] == "tensor_parallel" and info["tp_size"] == 2
    assert len(_group(qwen_tp2)["follower_pids"]) == 1
    # Batches really formed: fewer forwards than requests (warmup and health add a few steps).
    assert qwen_tp2.metric("encoder_batch_size_count") < len(REQUESTS) + 2


@pytest.mark.timeout(120)
def test_a_malformed_request_mid_batch_never_reaches_the_follower(qwen_tp2):
    before = _group(qwen_tp2)
    good = _bodies("mid")[:4]
    bad = {"req_id": "mid-bad", "modality": "image", "mm_items": [png_data_uri(40, 40), "data:image/png;base64,AAAA"]}
    answers = encode_concurrently(qwen_tp2.base_url, [good[0], good[1], bad, good[2], good[3]], timeout=60)
    codes = [r.status_code for r in answers]
    assert codes == [200, 200, 400, 200, 200], [r.text[:300] for r in answers]
    assert "item 1" in answers[2].text or "mm_items[1]" in answers[2].text, answers[2].text
    # The group still steps together: a following request answers, nothing restarted.
    assert encode(qwen_tp2.base_url, "after-bad", [png_data_uri(64, 64)], timeout=30).status_code == 200
    after = _group(qwen_tp2)
    assert after["follower_pids"] == before["follower_pids"]
    info = httpx.get(qwen_tp2.base_url + "/server_info", timeout=10).json()
    assert info["workers"][0]["deaths"] == 0
    assert "ranks out of step" not in qwen_tp2.log_text()


def _traces(rank_dir: Path, wait_s: float = 30.0) -> list[Path]:
    """The complete Chrome traces in ``rank_dir``: a follower writes its own after rank 0 answers."""
    deadline = time.monotonic() + wait_s
    while True:
        complete = []
        for path in sorted(rank_dir.glob("encoder-trace-*.json")):
            try:
                json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            complete.append(path)
        if complete or time.monotonic() > deadline:
            return complete
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_profiling_goes_through_the_broadcast_path_to_every_tp_rank(qwen_tp2, tmp_path: Path):
    url = qwen_tp2.base_url
    before = _group(qwen_tp2)
    item = [png_data_uri(64, 48, seed=5)]
    expected = embedding(encode(url, "prof-before", item, timeout=60))

    started = httpx.post(url + "/start_profile", json={"output_dir": str(tmp_path / "manual")}, timeout=60)
    assert started.status_code == 200, started.text
    for i in range(2):
        np.testing.assert_allclose(embedding(encode(url, f"prof-{i}", item, timeout=60)), expected, rtol=1e-5, atol=1e-6)
    stopped = httpx.post(url + "/stop_profile", timeout=60)
    assert stopped.status_code == 200, stopped.text
    # The front's DP layout (rank-0: the only group), then one directory per tensor-parallel rank.
    for tp_rank in (0, 1):
        assert _traces(tmp_path / "manual" / "rank-0" / f"tp-rank-{tp_rank}"), f"no trace for tp rank {tp_rank}"

    # num_steps: rank 0 counts the forwards and broadcasts the stop; both ranks write a trace.
    auto = {"output_dir": str(tmp_path / "auto"), "num_steps": 2, "record_shapes": True}
    assert httpx.post(url + "/start_profile", json=auto, timeout=60).status_code == 200
    for i in range(3):
        np.testing.assert_allclose(embedding(encode(url, f"auto-{i}", item, timeout=60)), expected, rtol=1e-5, atol=1e-6)
    for tp_rank in (0, 1):
        assert _traces(tmp_path / "auto" / "rank-0" / f"tp-rank-{tp_rank}"), f"no auto-stop trace for tp rank {tp_rank}"
    assert httpx.post(url + "/stop_profile", timeout=60).status_code == 400  # already stopped, on every rank

    # A malformed body is refused on rank 0 and never broadcast.
    bad = httpx.post(url + "/start_profile", json={"output_dir": str(tmp_path / "bad"), "activities": ["TPU"]}, timeout=60)
    assert bad.status_code == 400, bad.text

    # The group is still one group in step, and still encodes correctly.
    after = encode(url, "prof-after", item, timeout=60)
    np.testing.assert_allclose(embedding(after), expected, rtol=1e-5, atol=1e-6)
    assert _group(qwen_tp2)["follower_pids"] == before["follower_pids"]
    assert httpx.get(url + "/server_info", timeout=10).json()["workers"][0]["deaths"] == 0
    log = qwen_tp2.log_text()
    assert "ranks out of step" not in log and "no handler for" not in log and "PROFILE_START failed" not in log


@pytest.mark.timeout(240)
def test_clip_tp2_equals_tp1_under_concurrent_load(tiny_model):
    reference = _reference(tiny_model("clip"))
    with EncoderServer(tiny_model("clip"), env={"ENCODER_MAX_WAIT_MS": "50"}, args=TP2) as server:
        _assert_equal_to(reference, encode_concurrently(server.base_url, _bodies("tp")))
        assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200


@pytest.mark.timeout(300)
def test_tp2_by_dp2_equals_tp1(tiny_model):
    """Four model processes on two cores: slow, but two real groups behind one front."""
    reference = _reference(tiny_model("clip"))
    with EncoderServer(tiny_model("clip"), env={"ENCODER_MAX_WAIT_MS": "20"}, args=[*TP2, "--dp-size", "2"]) as server:
        _assert_equal_to(reference, encode_concurrently(server.base_url, _bodies("tpdp")))
        workers = httpx.get(server.base_url + "/server_info", timeout=10).json()["workers"]
        assert [w["state"] for w in workers] == ["ready", "ready"]
        followers = {pid for w in workers for pid in w["model"]["tensor_parallel"]["follower_pids"]}
        assert len(followers) == 2


@pytest.mark.timeout(120)
def test_sizes_that_do_not_divide_stop_the_pod_at_start(tiny_model):
    cmd = [sys.executable, "-m", "encoder_pod.cli", "serve", "--model-path", str(tiny_model("clip")),
           "--port", str(free_port()), "--tp-size", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    refusal = [line for line in proc.stderr.splitlines() if line.startswith("encoder-pod: ")]
    assert len(refusal) == 1, proc.stderr[-2000:]
    assert "--tp-size: 3" in refusal[0] and "4 attention heads do not divide by 3" in refusal[0], refusal
