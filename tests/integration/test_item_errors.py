"""Only the caller's media is a 400: a bad item is named, a fault of ours is a 500 logged once.

In process: a real runtime on a tiny checkpoint behind the real HTTP edge (its one error table),
driven over ASGI.
"""

from __future__ import annotations

import asyncio
import base64
import logging

import httpx
import pytest

from encoder_pod.api.http_server import create_app
from encoder_pod.media import decode
from encoder_pod.runtime import EncoderRuntime
from encoder_pod.settings import load_settings
from testkit.media import png_data_uri

pytestmark = pytest.mark.integration


def _truncated_png() -> str:
    whole = base64.b64decode(png_data_uri(128, 128).split(",", 1)[1])
    return "data:image/png;base64," + base64.b64encode(whole[:300]).decode()


def _post(tiny_model, bodies: list[dict]) -> list[httpx.Response]:
    settings = load_settings(env={"ENCODER_MODEL_PATH": str(tiny_model("qwen2_vl")), "ENCODER_DEVICE": "cpu"})

    async def scenario() -> list[httpx.Response]:
        runtime = EncoderRuntime(settings)
        await runtime.start()
        await runtime.wait_loaded()
        transport = httpx.ASGITransport(app=create_app(settings, runtime))  # lifespan not used
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
                return [await client.post("/encode", json=body) for body in bodies]
        finally:
            await runtime.shutdown(grace=1)

    return asyncio.run(scenario())


def test_corrupt_image_is_a_400_naming_the_item(tiny_model):
    body = {"req_id": "corrupt", "modality": "IMAGE", "mm_items": [png_data_uri(32, 32), _truncated_png()]}
    (resp,) = _post(tiny_model, [body])
    assert resp.status_code == 400, resp.text
    assert resp.json()["message"].startswith("mm_items[1]: ") and "truncated" in resp.json()["message"]
    assert resp.json()["req_id"] == "corrupt"


def test_a_decoder_bug_is_a_500_logged_once_not_blamed_on_the_item(tiny_model, monkeypatch, caplog):
    """Fault injection: no real input makes our decoder raise a plain RuntimeError (that would be
    a bug, and fixed), so one is injected into the real decode path to show what the caller gets
    when the server itself is at fault: 500, with the traceback in the log exactly once."""

    def broken_decoder(data: bytes, max_pixels: int):
        raise RuntimeError("injected decoder bug")

    monkeypatch.setattr(decode, "decode_image", broken_decoder)
    body = {"req_id": "ours", "modality": "IMAGE", "mm_items": [png_data_uri(32, 32)]}
    with caplog.at_level(logging.ERROR):
        (resp,) = _post(tiny_model, [body])
    assert resp.status_code == 500, resp.text
    message = resp.json()["message"]
    assert "injected decoder bug" in message and "inside the server" in message and resp.json()["req_id"] == "ours"
    tracebacks = [r for r in caplog.records if r.exc_info and "injected decoder bug" in str(r.exc_info[1])]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
