"""Audio, tiled images and video on real servers: every request gets exactly its own embedding.

The four plain image families are covered the same way by test_batching.py; here are the three
families whose output rows are not one fixed count per item (audio windows, LLaVA-NeXT tiles)
and Qwen2-VL video, plus the loud failure when a batch's rows do not add up.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from encoder_pod.api.http_server import create_app
from encoder_pod.models.registry import load_adapter
from encoder_pod.runtime import EncoderRuntime
from encoder_pod.settings import load_settings
from encoder_pod.transfer.inline import decode_embedding
from tests.integration.encode_client import embedding, encode, encode_concurrently
from tests.support.media_files import audio_bytes, data_uri, tone, video_bytes
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

BASE_ENV = {
    "ENCODER_MAX_WAIT_MS": "300",
    "ENCODER_MAX_BATCH_SIZE": "8",
    "ENCODER_MAX_AUDIO_SECONDS": "40",
    "ENCODER_NUM_THREADS": "1",
    "ENCODER_VIDEO_FPS": "2",
    "ENCODER_VIDEO_MIN_FRAMES": "2",
    "ENCODER_VIDEO_MAX_FRAMES": "4",
}


@pytest.fixture(scope="module")
def server_for(tiny_model):
    """``server_for(arch_or_path)`` -> a started server, one per checkpoint for the module."""
    started: dict[str, EncoderServer] = {}

    def get(arch_or_path) -> EncoderServer:
        path = Path(arch_or_path) if isinstance(arch_or_path, Path) else tiny_model(arch_or_path)
        if str(path) not in started:
            started[str(path)] = EncoderServer(path, env=BASE_ENV).start()
        return started[str(path)]

    yield get
    for server in started.values():
        server.__exit__(None, None, None)


def _wav(seconds: float, rate: int = 16_000, seed: int = 0) -> str:
    return data_uri(audio_bytes(tone(seconds, rate, seed), rate), "audio/wav")


# Per request, per item: (seconds, source sample rate). Lengths differ so row counts differ;
# one item spans two 30 s windows; source rates are mixed so resampling runs inside batches.
AUDIO_REQUESTS = [
    [(1.0, 16_000)],
    [(0.4, 8_000), (2.5, 44_100)],
    [(3.0, 22_050), (0.1, 16_000), (1.7, 16_000)],
    [(31.0, 8_000)],
    [(0.8, 44_100), (5.0, 16_000)],
    [(2.0, 24_000)],
]
# Per request, per item: (width, height); LLaVA-NeXT tile counts 3, 4 or 5 per image.
IMAGE_REQUESTS = [
    [(64, 48)],
    [(32, 96), (120, 80)],
    [(200, 20), (48, 48), (90, 160)],
    [(150, 60)],
    [(70, 70), (100, 40)],
    [(1, 1)],
]


def _bodies(arch: str, tag: str) -> list[dict]:
    if arch == "llava_next":
        items = [[png_data_uri(w, h, seed=10 * i + j) for j, (w, h) in enumerate(r)] for i, r in enumerate(IMAGE_REQUESTS)]
        modality = "IMAGE"
    else:
        items = [[_wav(s, rate, seed=10 * i + j) for j, (s, rate) in enumerate(r)] for i, r in enumerate(AUDIO_REQUESTS)]
        modality = "AUDIO"
    return [{"req_id": f"{tag}-{i}", "modality": modality, "mm_items": mm} for i, mm in enumerate(items)]


def _llava_next_placeholders(ckpt: Path) -> list[list[int]]:
    """<image> tokens the real LlavaNextProcessor expands per image (the packed rows its model splices)."""
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    from tests.support import hf_processors

    tok = hf_processors.tokenizer(ckpt)
    kwargs = {k: v for k, v in json.loads((ckpt / "processor_config.json").read_text()).items() if k != "processor_class"}
    processor = LlavaNextProcessor(image_processor=LlavaNextImageProcessorPil.from_pretrained(ckpt), tokenizer=tok, **kwargs)
    counts = []
    for request in IMAGE_REQUESTS:
        images = [_noise(w, h, 0) for w, h in request]  # the count depends on the size alone
        out = processor(text=["<image> hi"] * len(images), images=images, return_tensors="pt", padding=True)
        counts.append(hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids("<image>")))
    return counts


def _noise(width: int, height: int, seed: int):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, size=(height, width, 3), dtype=np.uint8))


def _expected_counts(arch: str, ckpt: Path) -> list[list[int]]:
    """Rows per item from the family's rule, computed here from the request itself."""
    if arch == "llava_next":
        return _llava_next_placeholders(ckpt)
    rows = {"whisper": lambda f: (f - 1) // 2 + 1, "qwen2_audio": lambda f: ((f - 1) // 2 + 1 - 2) // 2 + 1}[arch]
    # Whisper encodes every 30 s window; Qwen2-Audio, as its processor, only the first.
    last = {"whisper": None, "qwen2_audio": 480_000}[arch]
    counts = []
    for request in AUDIO_REQUESTS:
        per_item = []
        for seconds, _ in request:
            samples = min(int(round(seconds * 16_000)), last or 10**12)
            windows = [min(480_000, samples - start) for start in range(0, samples, 480_000)]
            per_item.append(sum(max(rows(-(-w // 160)), 0) for w in windows))
        counts.append(per_item)
    return counts


@pytest.mark.parametrize("arch", ["whisper", "qwen2_audio", "llava_next"])
def test_concurrent_mixed_requests_each_get_their_own_embedding(server_for, tiny_model, arch):
    server = server_for(arch)
    batched = encode_concurrently(server.base_url, _bodies(arch, "b"))
    assert [r.status_code for r in batched] == [200] * len(batched), [r.text[:300] for r in batched]
    batches = server.metric("encoder_batch_size_count")
    singles = server.metric("encoder_batch_size_bucket", 'le="1.0"')
    assert batches - singles >= 1, "no batch larger than one request was formed"
    for body, resp, counts in zip(_bodies(arch, "a"), batched, _expected_counts(arch, tiny_model(arch))):
        assert resp.json()["item_token_counts"] == counts
        assert embedding(resp).shape == (sum(counts), server_info(server)["model"]["hidden_size"])
        alone = encode(server.base_url, body["req_id"], body["mm_items"], modality=body["modality"])
        np.testing.assert_allclose(embedding(resp), embedding(alone), rtol=1e-4, atol=1e-5)
        assert alone.json()["item_token_counts"] == counts
        assert resp.json()["item_grids"] == alone.json()["item_grids"]


def server_info(server: EncoderServer) -> dict:
    return httpx.get(server.base_url + "/server_info", timeout=10).json()


@pytest.mark.parametrize("arch", ["whisper", "qwen2_audio"])
def test_audio_at_other_rates_gives_the_model_rate_embedding(server_for, arch):
    server = server_for(arch)
    assert server_info(server)["model"]["sample_rate"] == 16_000
    audio_before = server.metric("encoder_audio_seconds_total")
    items_before = server.metric("encoder_items_total", 'modality="AUDIO"')
    reference = embedding(encode(server.base_url, "ref", [_wav(2.0, 16_000)], modality="AUDIO"))
    for rate in (8_000, 22_050, 44_100):
        got = embedding(encode(server.base_url, f"r{rate}", [_wav(2.0, rate)], modality="AUDIO"))
        # Measured on these tiny models: max |diff| 1e-3 .. 4e-3 (mean 1e-5 .. 4e-5) on values up
        # to ~4; another signal differs by 0.1 .. 0.15, and unresampled 22.05 kHz audio by > 1.
        np.testing.assert_allclose(got, reference, atol=0.02, rtol=0)
        assert np.abs(got - reference).mean() < 1e-3
    other = embedding(encode(server.base_url, "other", [_wav(2.0, 16_000, seed=1)], modality="AUDIO"))
    assert np.abs(other - reference).max() > 0.05  # the tolerance above does tell signals apart
    # Five 2 s clips, whatever their source rate: 10 s of audio, five AUDIO items.
    assert server.metric("encoder_audio_seconds_total") - audio_before == pytest.approx(10.0, abs=0.01)
    assert server.metric("encoder_items_total", 'modality="AUDIO"') - items_before == 5


def _checkpoint_at_24k(tiny_model, root: Path) -> Path:
    """The tiny Whisper with a 24 kHz feature extractor (20 s windows keep the tower's 3000 frames)."""
    path = Path(shutil.copytree(tiny_model("whisper"), root / "whisper-24k"))
    config = json.loads((path / "preprocessor_config.json").read_text())
    config.update(sampling_rate=24_000, chunk_length=20)
    for derived in ("n_samples", "nb_max_frames"):
        config.pop(derived, None)
    (path / "preprocessor_config.json").write_text(json.dumps(config))
    return path


def test_a_24k_model_is_fed_24k_audio(server_for, tiny_model, tmp_path_factory):
    server = server_for(_checkpoint_at_24k(tiny_model, tmp_path_factory.mktemp("ckpt")))
    model = server_info(server)["model"]
    assert (model["sample_rate"], model["sample_rate_source"], model["window_seconds"]) == (
        24_000, "preprocessor_config.json", 20.0)
    native = encode(server.base_url, "native", [_wav(1.0, 24_000)], modality="AUDIO")
    # 1 s at 24 kHz = 150 mel frames -> 75 rows; had it been resampled to 16 kHz: 50 rows.
    assert native.json()["item_token_counts"] == [75]
    for rate in (16_000, 44_100):
        resp = encode(server.base_url, f"r{rate}", [_wav(1.0, rate)], modality="AUDIO")
        assert resp.json()["item_token_counts"] == [75]
        np.testing.assert_allclose(embedding(resp), embedding(native), atol=0.02, rtol=0)


def _nan_wav() -> str:
    samples = tone(0.5, 16_000)
    samples[1000] = np.nan
    return data_uri(audio_bytes(samples, 16_000), "audio/wav")


def test_bad_audio_is_a_400_naming_the_item_and_neighbours_succeed(server_for):
    server = server_for("whisper")
    good = _wav(0.6, 16_000, seed=3)
    bad = {
        "not audio": (data_uri(b"plain text, no audio here at all" * 4, "audio/wav"), "not decodable audio"),
        "zero samples": (data_uri(audio_bytes(np.zeros(0, np.float32), 16_000), "audio/wav"), "no samples"),
        "nan": (_nan_wav(), "NaN or infinite"),
        "too long": (_wav(41.0, 8_000), "above the limit of 40s (ENCODER_MAX_AUDIO_SECONDS)"),
    }
    bodies = [{"req_id": f"bad-{i}", "modality": "AUDIO", "mm_items": [good, uri]} for i, (uri, _) in enumerate(bad.values())]
    goods = [{"req_id": f"good-{i}", "modality": "AUDIO", "mm_items": [_wav(0.5 + i, 16_000, seed=i)]} for i in range(3)]
    responses = encode_concurrently(server.base_url, bodies + goods)
    for (name, (_, words)), resp in zip(bad.items(), responses):
        assert resp.status_code == 400, (name, resp.text)
        message = resp.json()["message"]
        assert message.startswith("mm_items[1]: ") and words in message, (name, message)
    for resp, rows in zip(responses[len(bad):], [25, 75, 125]):  # 0.5, 1.5, 2.5 s: 50 rows per second
        assert resp.status_code == 200, resp.text
        assert resp.json()["item_token_counts"] == [rows] and embedding(resp).shape[0] == rows


def _mp4(seconds: float, width: int, height: int, seed: int) -> str:
    return data_uri(video_bytes(int(seconds * 12), width, height, fps=12, seed=seed), "video/mp4")


def test_video_requests_encode_alone_beside_batched_images(server_for):
    server = server_for("qwen2_vl")
    videos = [
        # 5 s at 2 fps wants 10 frames: capped at 4 (t = 2). 0.5 s wants 1: raised to 2 (t = 1).
        {"req_id": "v0", "modality": "VIDEO", "mm_items": [_mp4(5.0, 64, 48, seed=1)]},
        {"req_id": "v1", "modality": "VIDEO", "mm_items": [_mp4(0.5, 100, 40, seed=2), _mp4(1.5, 56, 56, seed=3)]},
    ]
    images = [{"req_id": f"i{i}", "modality": "IMAGE", "mm_items": [png_data_uri(40 + 16 * i, 56, seed=i)]} for i in range(3)]
    responses = encode_concurrently(server.base_url, videos + images)
    assert [r.status_code for r in responses] == [200] * 5, [r.text[:300] for r in responses]
    grids = [r.json()["item_grids"] for r in responses[:2]]
    assert grids == [[[2, 4, 4]], [[1, 2, 8], [2, 4, 4]]]
    for resp, item_grids in zip(responses[:2], grids):
        assert resp.json()["item_token_counts"] == [t * h * w // 4 for t, h, w in item_grids]
    for body, resp in zip(videos + images, responses):
        alone = encode(server.base_url, body["req_id"] + "-alone", body["mm_items"], modality=body["modality"])
        np.testing.assert_allclose(embedding(resp), embedding(alone), rtol=1e-4, atol=1e-5)


def test_corrupt_video_is_a_400_naming_the_item(server_for):
    server = server_for("qwen2_vl")
    good = _mp4(1.0, 64, 48, seed=4)
    raw = video_bytes(24, 64, 48, fps=12)
    for req_id, broken in {"half": raw[: len(raw) // 2], "text": b"not a video file at all" * 8}.items():
        resp = encode(server.base_url, req_id, [good, data_uri(broken, "video/mp4")], modality="VIDEO")
        assert resp.status_code == 400, resp.text
        assert resp.json()["message"].startswith("mm_items[1]: bytes are not a decodable video")
    assert encode(server.base_url, "fine", [good], modality="VIDEO").status_code == 200


@pytest.mark.parametrize("arch, modality", [("llava_next", "VIDEO"), ("whisper", "VIDEO"), ("whisper", "IMAGE"), ("llava_next", "AUDIO")])
def test_modalities_a_model_does_not_take_are_400(server_for, arch, modality):
    resp = encode(server_for(arch).base_url, "m", [_mp4(1.0, 32, 32, seed=0)], modality=modality)
    assert resp.status_code == 400
    assert f"{modality} not supported by this model" in resp.json()["message"]


# --- a batch whose rows do not add up ------------------------------------------------------------

def _loader_with_padding_tile_bug(always: bool):
    """The real LLaVA-NeXT adapter, plus the bug this safety net exists for: the rows of a padding
    tile are left in the output (here whenever a batch holds several requests, or always).
    Injected because a correct adapter never produces it; the test says so."""

    def load(settings):
        adapter = load_adapter(settings)
        real_forward = adapter.forward
        calls = []

        def forward(batch):
            out = real_forward(batch)
            calls.append(len(batch.item_tokens))
            # The first forward is the warmup: failing it would (rightly) keep the model from ready.
            if (always and len(calls) > 1) or len(batch.item_tokens) > 1:
                return torch.cat([out, out[: adapter.tile_rows]])
            return out

        adapter.forward = forward
        return adapter

    return load


def _run_in_process(tiny_model, always: bool, bodies: list[dict]) -> tuple[list[httpx.Response], str, EncoderRuntime]:
    settings = load_settings(env={"ENCODER_MODEL_PATH": str(tiny_model("llava_next")), "ENCODER_DEVICE": "cpu",
                                  "ENCODER_MAX_WAIT_MS": "300"})

    async def scenario():
        runtime = EncoderRuntime(settings, adapter_loader=_loader_with_padding_tile_bug(always))
        await runtime.start()
        await runtime.wait_loaded()
        app = create_app(settings, runtime)  # the HTTP edge and its error table; lifespan not used
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
                together = await asyncio.gather(*(client.post("/encode", json=b) for b in bodies))
                alone = [await client.post("/encode", json={**b, "req_id": b["req_id"] + "-alone"}) for b in bodies]
                metrics = (await client.get("/metrics")).text
        finally:
            await runtime.shutdown(grace=1)
        return together + alone, metrics, runtime

    return asyncio.run(scenario())


def _image_bodies() -> list[dict]:
    sizes = [(64, 48), (32, 96), (1, 1)]  # 5, 4 and 3 tiles
    return [{"req_id": f"t{i}", "modality": "IMAGE", "mm_items": [png_data_uri(w, h, seed=i)]} for i, (w, h) in enumerate(sizes)]


def _sample(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_rows_that_do_not_add_up_fail_the_batch_then_requests_retry_alone(tiny_model):
    bodies = _image_bodies()
    responses, metrics, _ = _run_in_process(tiny_model, always=False, bodies=bodies)
    together, alone = responses[: len(bodies)], responses[len(bodies):]
    assert [r.status_code for r in responses] == [200] * len(responses), [r.text for r in responses]
    for got, ref in zip(together, alone):
        np.testing.assert_allclose(decode_embedding(got.json()["embedding"]), decode_embedding(ref.json()["embedding"]))
        assert got.json()["item_token_counts"] == ref.json()["item_token_counts"]
    assert _sample(metrics, "encoder_slice_mismatch_total") >= 1, "the batch never failed: nothing was tested"
    assert _sample(metrics, 'encoder_batch_failures_total{stage="forward"}') >= 1


def test_rows_that_never_add_up_are_a_500_with_the_counts(tiny_model):
    bodies = _image_bodies()[:1]
    responses, metrics, _ = _run_in_process(tiny_model, always=True, bodies=bodies)
    for resp in responses:
        assert resp.status_code == 500
        body = resp.json()
        assert body["status"] == "error" and body["req_id"] in ("t0", "t0-alone")
        # 70 packed rows promised for the 64x48 image (base tile, 6x8 unpadded grid, 6 newlines);
        # one tile's 16 rows too many produced.
        assert "encoder output has 86 rows but preprocessing promised 70" in body["message"]
    assert _sample(metrics, "encoder_slice_mismatch_total") == 2
