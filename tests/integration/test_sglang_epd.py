"""EPD with SGLang's own prefill-side code: two pods per model, every transfer backend, every release.

The prefill side is each release's real code from its wheel (tests/support/sglang_harness.py):
``MMReceiverHTTP._extract_url_data`` / ``_assign_items_by_modality`` / ``encode`` split a
multimodal request over the two pods as SGLang splits it (``num_parts``/``part_idx``, modality by
modality, a shuffled encoder order) and post ``/encode``; the embeddings come back through the
backend's own receive path and are assembled by SGLang's ``MultiModalEmbeddingData``:

- zmq_to_tokenizer: ``MMReceiverBase.recv_mm_data`` / ``_recv_mm_data`` (a per-request PULL socket);
- zmq_to_scheduler: two TP ranks, each a ``WaitingZmqRequest`` on its own shared PULL socket,
  registering through ``/scheduler_receive_url`` (``_ReceiveRegistrationRunner`` on 0.5.20+);
- mooncake: two TP ranks, each a ``WaitingRDMARequest`` with SGLang's own
  ``MooncakeTransferEngine`` (the mooncake-transfer-engine-non-cuda package, TCP on loopback):
  ``/scheduler_receive_meta_data``, a landing buffer, ``/send``, the ZMQ acknowledgements.

What cannot run here and is replaced: the model's multimodal processor (it needs the language
model's tokenizer and config; a recorder keeps what SGLang hands it, except for audio, where
Qwen2-Audio's own ``get_mm_data`` and the base processor's layout check from the wheel run);
SGLang's ``EmbeddingPool`` (CUDA memory; a host-memory pool with its alloc/release interface is
registered with the rank's engine instead); the scheduler loop and the TP all-reduce of the
request status (each rank is polled in turn: ``_drain_scheduler_embeddings`` then
``_try_recv_mm_data``, as the scheduler tick does); ``MMReceiverHTTP.__init__`` (it reads
SGLang's global server config; the object is built with ``__new__`` and the same attributes).

The pods run with no transfer setting at all (``auto``). The check: what SGLang assembled equals
each pod's own reference output (inline, item by item), in SGLang's order.
"""

from __future__ import annotations

from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from encoder_pod.models.base import EncodedPart
from tests.integration.encode_client import embedding, encode
from tests.support.media_files import audio_bytes, data_uri, tone, video_bytes
from testkit.media import png_data_uri
from testkit.server import EncoderServer
from tests.support.sglang_harness import SglangHarness

pytestmark = pytest.mark.integration

POD_ENV = {
    "ENCODER_NUM_THREADS": "1",
    "ENCODER_MAX_AUDIO_SECONDS": "60",
    "ENCODER_VIDEO_FPS": "2",
    "ENCODER_VIDEO_MIN_FRAMES": "2",
    "ENCODER_VIDEO_MAX_FRAMES": "4",
    "ENCODER_SEND_TIMEOUT": "60",
}
IMAGES = [png_data_uri(64, 48, seed=7), png_data_uri(40, 80, seed=8), png_data_uri(48, 48, seed=9)]
VIDEOS = [data_uri(video_bytes(8, 64, 48, fps=4, seed=s), "video/mp4") for s in (1, 2)]
AUDIOS = [data_uri(audio_bytes(tone(seconds, 16_000, seed=s), 16_000), "audio/wav") for seconds, s in ((42.0, 1), (6.0, 2))]


@pytest.fixture(scope="module")
def pods(tiny_model) -> Iterator[dict[str, list[EncoderServer]]]:
    """Two Qwen2.5-VL pods (image, video) and two Qwen2-Audio pods, all with default transfer settings."""
    started = {
        "vl": [EncoderServer(tiny_model("qwen2_5_vl"), env=POD_ENV).start(wait_ready=False) for _ in range(2)],
        "audio": [EncoderServer(tiny_model("qwen2_audio"), env=POD_ENV).start(wait_ready=False) for _ in range(2)],
    }
    try:
        for group in started.values():
            for pod in group:
                pod.wait_status("/health", 200, 240)
        yield started
    finally:
        for group in started.values():
            for pod in group:
                pod.stop()


@pytest.fixture(scope="module")
def references(pods) -> dict[str, list[np.ndarray]]:
    """Each pod's own output, item by item (inline), in SGLang's order."""

    def ref(pod: EncoderServer, items: list[str], modality: str) -> list[np.ndarray]:
        return [embedding(encode(pod.base_url, f"ref-{modality}-{i}", [item], modality)) for i, item in enumerate(items)]

    vl, audio = pods["vl"][0], pods["audio"][0]
    return {"IMAGE": ref(vl, IMAGES, "IMAGE"), "VIDEO": ref(vl, VIDEOS, "VIDEO"), "AUDIO": ref(audio, AUDIOS, "AUDIO")}


def _spec(backend: str, pods: list[EncoderServer], rid: str, **media: Any) -> dict[str, Any]:
    mode = "dispatch-tokenizer" if backend == "zmq_to_tokenizer" else "dispatch-ranks"
    return {"mode": mode, "backend": backend, "encode_urls": [p.base_url for p in pods], "rid": rid, "tp": 2,
            "dtype": "float32", "timeout": 90, **media}


def _assembled(result: dict[str, Any]) -> list[dict[str, Any]]:
    """What SGLang handed the model's processor, per rank (one entry on the tokenizer path)."""
    if "returned" in result:
        assert result["returned"] is not None, result["logs"]
        return [result["returned"]]
    assert result["dispatch_error"] is None, result
    out = []
    for rank in result["ranks"]:
        [state] = rank.values()
        assert state["status"] == "SUCCESS", (state, result["logs"])
        out.append(state["mm"])
    return out


def _check(got: dict[str, Any], modality: str, want: list[np.ndarray]) -> None:
    values = np.asarray(got["embeddings"][modality]["values"], dtype=np.float32)
    np.testing.assert_allclose(values, np.concatenate(want), rtol=1e-4, atol=1e-5)


BACKENDS = ["zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"]
EXTRAS = "extras" in EncodedPart.__dataclass_fields__
"""Whether the adapters report per-request facts (EncodedPart.extras: video timing) yet."""


@pytest.mark.parametrize("backend", BACKENDS)
def test_images_and_videos_split_over_two_pods(sglang: SglangHarness, pods, references, backend):
    spec = _spec(backend, pods["vl"], f"vl-{backend}-{sglang.release}", images=IMAGES, videos=VIDEOS)
    ready = sglang.start(spec)
    result = sglang.result(240)
    for got in _assembled(result):
        _check(got, "IMAGE", references["IMAGE"])
        _check(got, "VIDEO", references["VIDEO"])
        assert len(got["meta"]["img_grid_thw"]) == len(IMAGES) and len(got["meta"]["video_grid_thw"]) == len(VIDEOS)
        if EXTRAS:  # Qwen2.5-VL's seconds per temporal patch reach SGLang's processor, one per video
            per_grid = got["meta"]["second_per_grid_ts"]
            assert len(per_grid) == len(VIDEOS) and all(v > 0 for v in per_grid), got["meta"]
    if "assigned" in ready:  # both pods got work: the request really was split
        assert all(sum(counts) == n and 0 not in counts for counts, n in
                   zip(ready["assigned"].values(), (len(IMAGES), len(VIDEOS)))), ready


@pytest.mark.parametrize("backend", BACKENDS)
def test_audio_split_over_two_pods_passes_the_layout_check(sglang: SglangHarness, pods, references, backend):
    """A 42 s clip (two 30 s windows on the pod) and a 6 s one, through Qwen2-Audio's own processor code."""
    spec = _spec(backend, pods["audio"], f"au-{backend}-{sglang.release}", audios=AUDIOS, processor="qwen2_audio",
                 audio_items=len(AUDIOS))
    sglang.start(spec)
    for got in _assembled(sglang.result(240)):
        _check(got, "AUDIO", references["AUDIO"])
        assert len(got["meta"]["audio_feature_lens"]) == len(AUDIOS)  # one length per item
        # Qwen2-Audio's own code turned each length into the item's rows: exactly the pod's.
        assert [item["rows"][0] for item in got["items"]] == [r.shape[0] for r in references["AUDIO"]]


def test_profile_routes_answer_get_and_post(pods):
    """SGLang's /start_profile and /stop_profile take GET as well as POST."""
    pod = pods["vl"][1]
    assert httpx.get(pod.base_url + "/start_profile", timeout=60).status_code == 200
    assert httpx.get(pod.base_url + "/stop_profile", timeout=60).status_code == 200
    assert httpx.post(pod.base_url + "/start_profile", json={"num_steps": 1}, timeout=60).status_code == 200
    assert encode(pod.base_url, "after-profile", IMAGES[:1]).status_code == 200


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_undecodable_item_fails_the_request_on_every_rank_with_its_400(sglang: SglangHarness, pods, backend):
    """One pod's part cannot be decoded: SGLang's receive path ends with that error instead of waiting out its timeout."""
    bad = "data:image/png;base64," + "A" * 64
    spec = _spec(backend, pods["vl"], f"bad-{backend}-{sglang.release}", images=[IMAGES[0], bad])
    spec["timeout"] = 30
    sglang.start(spec)
    result = sglang.result(120)
    if "returned" in result:  # zmq_to_tokenizer: the dispatch error (or the error part) ends the wait
        assert result["returned"] is None
        assert any("mm_items[" in line or "Encoder" in line for line in result["logs"]), result["logs"]
        return
    # 0.5.19's mooncake receive thread fails the request with the message only (no code): its own behaviour.
    code = None if (backend, sglang.release) == ("mooncake", "0.5.19") else 400
    for rank in result["ranks"]:
        [state] = rank.values()
        assert (state["status"], state["error_code"]) == ("FAIL", code), (state, result["logs"])
        assert "mm_items[" in state["error_msg"]


@pytest.fixture(scope="module")
def dp_pod(tiny_model) -> Iterator[EncoderServer]:
    with EncoderServer(tiny_model("qwen2_5_vl"), env=POD_ENV, args=["--dp-size", "2"]) as pod:
        yield pod


@pytest.mark.parametrize("backend", ["mooncake", "zmq_to_scheduler"])
def test_a_data_parallel_pod_routes_every_rank_call_to_the_worker_holding_the_part(dp_pod, sglang_newest, backend):
    """--dp-size 2: the prefill ranks' calls about a part (receive URLs, size pulls, /send) reach the worker that has it."""
    want = [embedding(encode(dp_pod.base_url, f"dp-ref-{backend}-{i}", [img])) for i, img in enumerate(IMAGES)]
    for attempt in range(2):  # two requests of two concurrent parts each (the front spreads them over its workers)
        spec = _spec(backend, [dp_pod, dp_pod], f"dp-{backend}-{attempt}", images=IMAGES)
        sglang_newest.start(spec)
        for got in _assembled(sglang_newest.result(240)):
            _check(got, "IMAGE", want)
