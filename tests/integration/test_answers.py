"""Inline answers on a real server: JSON for curl, the wire format and msgpack on request, same embedding."""

from __future__ import annotations

import asyncio
import json
from typing import Iterator

import httpx
import numpy as np
import pytest
import torch

from encoder_pod.receiver import EncoderClient, decode_answer
from encoder_pod.transfer.inline import decode_embedding
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

ITEMS = [png_data_uri(64, 48, seed=1), png_data_uri(120, 80, seed=2), png_data_uri(48, 96, seed=3)]
BINARY_TYPES = {"binary": "application/octet-stream", "msgpack": "application/x-msgpack"}


def _post(server: EncoderServer, req_id: str, items: list[str], accept: str | None) -> httpx.Response:
    body = {"req_id": req_id, "modality": "IMAGE", "mm_items": items}
    headers = {"accept": accept} if accept else {}
    return httpx.post(server.base_url + "/encode", json=body, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[EncoderServer]:
    with EncoderServer(tiny_model("qwen2_vl")) as running:
        yield running


@pytest.fixture(scope="module")
def dp_server(tiny_model) -> Iterator[EncoderServer]:
    with EncoderServer(tiny_model("qwen2_vl"), args=["--dp-size", "2"]) as running:
        yield running


def _all_renderings(server: EncoderServer, tag: str) -> dict[str, tuple[httpx.Response, torch.Tensor]]:
    out = {}
    for name, accept in {"json": None, "curl": "*/*", **BINARY_TYPES}.items():
        resp = _post(server, f"{tag}-{name}", ITEMS, accept)
        assert resp.status_code == 200, resp.text
        header, tensor = decode_answer(resp.headers["content-type"], resp.content)
        assert header.req_id == f"{tag}-{name}" and sum(header.item_tokens) == tensor.shape[0]
        out[name] = (resp, tensor)
    return out


@pytest.mark.parametrize("which", ["server", "dp_server"])
def test_every_rendering_carries_the_same_embedding(which, request):
    """The same request answered as JSON (default and curl's */*), wire format and msgpack: equal bit for bit."""
    server = request.getfixturevalue(which)
    answers = _all_renderings(server, which)
    json_resp, reference = answers["json"]
    assert json_resp.headers["content-type"] == "application/json"
    np.testing.assert_array_equal(decode_embedding(json_resp.json()["embedding"]), reference.numpy())
    for name, (resp, tensor) in answers.items():
        assert torch.equal(tensor, reference), name
        assert resp.headers.get("vary", "").lower() == "accept"
    assert answers["binary"][0].headers["content-type"] == "application/octet-stream"
    assert answers["msgpack"][0].headers["content-type"] == "application/x-msgpack"
    # The binary bodies are smaller than base64 in JSON, and the raw tensor is all but a small header.
    assert len(answers["binary"][0].content) < 0.8 * len(json_resp.content)
    assert len(answers["binary"][0].content) - reference.numel() * reference.element_size() < 512


def test_errors_stay_json_whatever_was_asked(server):
    resp = _post(server, "bad", ["abc"], BINARY_TYPES["binary"])
    assert resp.status_code == 400 and resp.headers["content-type"] == "application/json"
    assert resp.json()["status"] == "error" and resp.json()["req_id"] == "bad"


def test_the_receiver_client_asks_for_and_reads_each_rendering(server):
    """EncoderClient.encode splits items over encoders (here the same pod twice) and merges the answers."""

    async def encode_all() -> dict[str, torch.Tensor]:
        async with EncoderClient([server.base_url, server.base_url]) as client:
            out = {}
            for answer in ("binary", "msgpack", "json"):
                got = await client.encode(f"cl-{answer}", [("IMAGE", item) for item in ITEMS], answer=answer)
                assert got.num_parts == 2 and [p.part_idx for p in got.parts] == [0, 1]
                out[answer] = got.embedding()
            return out

    merged = asyncio.run(encode_all())
    alone = [decode_answer(None, _post(server, f"alone-{i}", [item], None).content)[1] for i, item in enumerate(ITEMS)]
    for answer, tensor in merged.items():
        # The two parts are posted at once and may share a batch (not bit-invariant on CPU): each
        # item's rows equal that item encoded on its own, to float tolerance.
        assert torch.allclose(tensor, torch.cat(alone), rtol=1e-4, atol=1e-5), answer
    assert json.loads(_post(server, "plain", ITEMS[:1], "text/html").content)["status"] == "ok"
