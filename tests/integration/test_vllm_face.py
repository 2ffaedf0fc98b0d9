"""``POST /v1/chat/completions`` on a real server: answers, stored files, refusals naming the field, DP mode.

The identifiers are checked against vLLM 0.34.0's own hasher (tests/support/vllm_harness.py);
the stored rows against the pod's own /encode of the same pixels.
"""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import safetensors.numpy
from PIL import Image

from tests.integration.encode_client import embedding, encode
from tests.integration.test_vllm_hash import vllm_identifiers
from tests.support.image_corpus import image_corpus
from tests.support.media_files import audio_bytes, data_uri, tone
from testkit.media import png_data_uri
from testkit.server import EncoderServer
from tests.support.vllm_harness import vllm_release

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

ENV = {"ENCODER_DEVICE": "cpu", "ENCODER_NUM_THREADS": "1", "ENCODER_MAX_WAIT_MS": "50"}
CORPUS = dict(image_corpus(1))


@contextmanager
def serving(model: Path, env: dict[str, str]) -> Iterator[EncoderServer]:
    """A server given 10 minutes to get ready (the shared 2-core machine is slow under load)."""
    server = EncoderServer(model, env=env)
    server.start(timeout=600)
    try:
        yield server
    finally:
        server.__exit__(None, None, None)


def uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def chat(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}],
            "stream": False, **extra}


def image_part(url: str, uuid: str | None = None) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}, **({"uuid": uuid} if uuid else {})}


def post(server: EncoderServer, body: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)


def stored(root: Path, identifier: str) -> np.ndarray:
    return safetensors.numpy.load_file(str(root / identifier / "encoder_cache.safetensors"))["ec_cache"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ec")


@pytest.fixture(scope="module")
def server(tiny_model, store: Path) -> Iterator[EncoderServer]:
    env = {**ENV, "ENCODER_VLLM_STORAGE_PATH": str(store), "ENCODER_VLLM_MODEL_ID": "Qwen/Qwen2-VL-2B-Instruct"}
    with serving(tiny_model("qwen2_vl"), env) as running:
        yield running


def test_off_without_a_storage_path(tiny_model):
    with serving(tiny_model("qwen2_vl"), ENV) as plain:
        resp = post(plain, chat(image_part(png_data_uri(32, 32))))
        assert resp.status_code == 404 and "ENCODER_VLLM_STORAGE_PATH" in resp.json()["message"]
        assert httpx.head(f"{plain.base_url}/v1/ec_cache/x").status_code == 404


def test_items_are_stored_under_vllms_identifiers_before_the_answer(server: EncoderServer, store: Path):
    release = vllm_release()
    rgb, rgba, rotated = CORPUS["rgb-png-0"], CORPUS["rgba-png-0"], CORPUS["exif-rotated-jpeg-0"]
    body = chat(image_part(uri(rgb), "first"), image_part(uri(rgba)), image_part(uri(rgb), "first"), image_part(uri(rotated, "image/jpeg")))
    resp = post(server, body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"] == ""
    params = answer["ec_transfer_params"]
    theirs = vllm_identifiers(release, "blake3", "Qwen/Qwen2-VL-2B-Instruct", [rgb, rgba, rgb, rotated], ["first", None, "first", None], None, None)
    assert list(params) == list(dict.fromkeys(theirs))  # vLLM's identifiers, each once, in order
    assert params["first"]["item_indices"] == [0, 2] and params[theirs[1]]["item_indices"] == [1]
    for identifier, entry in params.items():
        rows = stored(store, identifier)
        t, h, w = entry["metadata"]["image_grid_thw"]
        assert rows.shape[0] == t * h * w // 4 and rows.dtype == np.float32
    # The rows are the pod's own /encode rows of the pixels vLLM decodes: RGBA on white, EXIF upright.
    for data, identifier in ((rgba, theirs[1]), (rotated, theirs[3])):
        opened = Image.open(io.BytesIO(data))
        upright = release.image_io.ImageMediaIO().load_bytes(data).media
        png = io.BytesIO()
        upright.save(png, "PNG")
        direct = encode(server.base_url, f"direct-{identifier[:8]}", [uri(png.getvalue())])
        np.testing.assert_allclose(stored(store, identifier), embedding(direct), rtol=1e-5, atol=1e-6)
        assert upright.size == (opened.size[::-1] if identifier == theirs[3] else opened.size)
    assert httpx.head(f"{server.base_url}/v1/ec_cache/first").status_code == 200
    got = httpx.get(f"{server.base_url}/v1/ec_cache/first")
    assert got.content == (store / "first" / "encoder_cache.safetensors").read_bytes()
    assert httpx.get(f"{server.base_url}/v1/ec_cache/..%2e").status_code in (400, 404)
    assert httpx.head(f"{server.base_url}/v1/ec_cache/not-there").status_code == 404


def test_request_kwargs_are_hash_factors_and_the_background_colour_is_applied(server: EncoderServer, store: Path):
    release = vllm_release()
    rgba = CORPUS["rgba-png-0"]
    media_io = {"image": {"rgba_background_color": [0, 0, 0]}}
    resp = post(server, chat(image_part(uri(rgba), "u-1"), media_io_kwargs=media_io))
    assert resp.status_code == 200, resp.text
    [identifier] = resp.json()["ec_transfer_params"]
    assert identifier != "u-1"
    assert [identifier] == vllm_identifiers(release, "blake3", "Qwen/Qwen2-VL-2B-Instruct", [rgba], ["u-1"], None, media_io)
    on_black = release.image_io.ImageMediaIO(rgba_background_color=[0, 0, 0]).load_bytes(rgba).media
    png = io.BytesIO()
    on_black.save(png, "PNG")
    np.testing.assert_allclose(stored(store, identifier), embedding(encode(server.base_url, "black", [uri(png.getvalue())])),
                               rtol=1e-5, atol=1e-6)


REFUSALS = [
    (chat(image_part(png_data_uri(32, 32)), stream=True), "field 'stream'"),
    (chat(), "field 'messages': no media part"),
    ({"messages": "hi"}, "field 'messages'"),
    (chat({"type": "image_url"}), "field 'messages[0].content[1].image_url.url'"),
    (chat({"type": "file", "file": {}}), "field 'messages[0].content[1].type'"),
    (chat(image_part(png_data_uri(32, 32), "../etc")), "field 'messages[0].content[1].uuid'"),
    (chat(image_part(png_data_uri(32, 32)), {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}),
     "field 'messages[0].content[2]': bytes are not a decodable image"),
    (chat(image_part(png_data_uri(32, 32)), mm_processor_kwargs={"max_pixels": 1000}), "field 'mm_processor_kwargs'"),
    (chat(image_part(png_data_uri(32, 32)), media_io_kwargs={"image": {"image_mode": "RGBA"}}), "field 'media_io_kwargs.image.image_mode'"),
    (chat(image_part(png_data_uri(32, 32)), media_io_kwargs={"image": {"rgba_background_color": [1, 2]}}),
     "field 'media_io_kwargs.image.rgba_background_color'"),
    (chat({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}, "uuid": "v"}), "field 'messages[0].content[1]': video"),
    (chat({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}, "uuid": "a"}),
     "field 'messages[0].content[1]': qwen2_vl takes no audio"),
    (chat({**image_part(png_data_uri(32, 32)), "uuid": 7}), "field 'messages[0].content[1].uuid': must be a string"),
]


def test_refusals_name_the_field_and_spare_their_neighbours(server: EncoderServer):
    good = chat(image_part(png_data_uri(48, 32, seed=5), "neighbour"))
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda body: post(server, body), [good] + [body for body, _ in REFUSALS] + [good]))
    assert answers[0].status_code == answers[-1].status_code == 200
    for resp, (_, words) in zip(answers[1:-1], REFUSALS):
        assert resp.status_code == 400, (words, resp.text)
        assert words in resp.json()["message"], (words, resp.json()["message"])


EDGE_SERIES = {  # what a dashboard reads: one count per chat request, whatever its items
    "200": ("encoder_requests_total", 'code="200"'),
    "400": ("encoder_requests_total", 'code="400"'),
    "400 invalid_request": ("encoder_request_errors_total", 'code="400"', 'kind="invalid_request"'),
    "all": ("encoder_requests_total",),
    "all errors": ("encoder_request_errors_total",),
    "latency": ("encoder_request_seconds_count",),
}


def test_each_chat_request_moves_the_edge_series_by_one_as_an_encode_does(server: EncoderServer):
    """A success (two images, one /encode inside) and a 400: each is one answer under /encode's codes."""
    before = {name: server.metric(*series) for name, series in EDGE_SERIES.items()}
    ok = post(server, chat(image_part(png_data_uri(40, 40, seed=21)), image_part(png_data_uri(32, 56, seed=22), "counted")))
    bad = post(server, chat(image_part(png_data_uri(32, 32)), {"type": "image_url"}))
    assert (ok.status_code, bad.status_code) == (200, 400), (ok.text, bad.text)
    after = {name: server.metric(*series) for name, series in EDGE_SERIES.items()}
    moved = {name: after[name] - before[name] for name in after if after[name] != before[name]}
    assert moved == {"200": 1, "400": 1, "400 invalid_request": 1, "all": 2, "all errors": 1, "latency": 2}


def test_data_parallel_workers_store_the_same_files(tiny_model, server: EncoderServer, store: Path, tmp_path: Path):
    body = chat(image_part(png_data_uri(64, 40, seed=9), "dp-a"), image_part(uri(CORPUS["p-trns-png-0"])))
    single = post(server, body)
    env = {**ENV, "ENCODER_VLLM_STORAGE_PATH": str(tmp_path), "ENCODER_DP_SIZE": "2", "ENCODER_VLLM_MODEL_ID": "Qwen/Qwen2-VL-2B-Instruct"}
    with serving(tiny_model("qwen2_vl"), env) as dp:
        answers = [post(dp, body) for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3 and single.status_code == 200
    params = single.json()["ec_transfer_params"]
    assert all(a.json()["ec_transfer_params"] == params for a in answers)
    for identifier in params:
        np.testing.assert_allclose(stored(tmp_path, identifier), stored(store, identifier), rtol=1e-5, atol=1e-6)


def test_audio_needs_a_uuid_and_reports_its_rows(tiny_model, tmp_path: Path):
    wav = audio_bytes(tone(1.0, 16_000, seed=3), 16_000)
    env = {**ENV, "ENCODER_VLLM_STORAGE_PATH": str(tmp_path)}
    with serving(tiny_model("qwen2_audio"), env) as audio:
        missing = post(audio, chat({"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}))
        assert missing.status_code == 400
        assert "field 'messages[0].content[1].uuid': required for audio items" in missing.json()["message"]
        resp = post(audio, chat({"type": "audio_url", "audio_url": {"url": data_uri(wav, "audio/wav")}, "uuid": "clip-1"}))
        assert resp.status_code == 200, resp.text
        entry = resp.json()["ec_transfer_params"]["clip-1"]
        assert entry["modality"] == "audio" and entry["metadata"] == {"audio_num_tokens": [stored(tmp_path, "clip-1").shape[0]]}
        assert json.loads(json.dumps(entry))["item_indices"] == [0]


def test_a_chat_request_arriving_during_the_drain_is_refused_as_encode_is(tiny_model, tmp_path: Path):
    """SIGTERM with an /encode held by its origin: a new chat request is 503 draining with Retry-After,
    the held request is delivered, the pod exits 0 (a chat request was served, uncounted by the drain)."""
    import signal
    import time

    from tests.support.media_host import MediaHost

    env = {**ENV, "ENCODER_VLLM_STORAGE_PATH": str(tmp_path), "ENCODER_ALLOWED_MEDIA_DOMAINS": "127.0.0.1"}
    with MediaHost() as host, ThreadPoolExecutor(1) as pool:
        server = EncoderServer(tiny_model("qwen2_vl"), env=env)
        server.start(timeout=600)
        try:
            held = pool.submit(encode, server.base_url, "held", [host.base_url + "/held/32x32.png"])
            deadline = time.monotonic() + 30
            while httpx.get(server.base_url + "/server_info", timeout=5).json()["inflight"] < 1:
                assert time.monotonic() < deadline, "the held request never became in flight"
                time.sleep(0.05)
            server.proc.send_signal(signal.SIGTERM)
            while httpx.get(server.base_url + "/health", timeout=5).status_code == 200:
                assert time.monotonic() < deadline + 5, "/health never turned 503 after SIGTERM"
                time.sleep(0.05)
            late = post(server, chat(image_part(png_data_uri(32, 32), "late")))
            assert late.status_code == 503 and late.json()["message"].startswith("draining"), late.text
            assert late.headers.get("retry-after") == "1" and not (tmp_path / "late").exists()
            host.release()
            assert held.result(60).status_code == 200
            assert server.proc.wait(60) == 0
        finally:
            server.stop()
