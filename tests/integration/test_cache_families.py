"""A cache hit returns exactly the rows a fresh compute gives, for every family and modality served.

In process: a real runtime (cache on) on each family's tiny checkpoint. The fresh compute is the
adapter's own four stages on the same decoded item, outside the runtime and its cache. The
families come from the registry, so a family added there is covered here without an edit.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
import torch

from encoder_pod.media.decode import decode_item
from encoder_pod.media.sources import MediaSources
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncoderAdapter
from encoder_pod.models.families import default_registry
from encoder_pod.runtime import EncoderRuntime
from encoder_pod.settings import EncoderSettings, load_settings
from encoder_pod.transfer.inline import InlineAnswer
from tests.support.media_files import audio_bytes, data_uri, tone, video_bytes
from testkit.media import png_data_uri

pytestmark = pytest.mark.integration


def media(modality: Modality, seed: int) -> str:
    """A small item of ``modality`` whose content depends on ``seed``."""
    if modality is Modality.IMAGE:
        return png_data_uri(64 + 8 * seed, 48, seed=seed)
    if modality is Modality.AUDIO:
        return data_uri(audio_bytes(tone(0.7 + 0.1 * seed, 16000, seed=seed), 16000), "audio/wav")
    return data_uri(video_bytes(4, 64, 48, fps=4, seed=seed), "video/mp4")


def rows(answer: InlineAnswer | None) -> tuple[bytes, list[Any], list[Any], dict[str, Any]]:
    """An inline answer's raw embedding bytes, shape, token counts and everything else."""
    assert answer is not None
    body = json.loads(b"".join(bytes(piece) for piece in answer.render_json()))
    embedding = body.pop("embedding")
    return base64.b64decode(embedding["data"]), embedding["shape"], body.pop("item_token_counts"), body


def fresh(adapter: EncoderAdapter, settings: EncoderSettings, modality: Modality, sources: list[str]) -> torch.Tensor:
    """The rows of ``sources`` as one request, computed by the adapter alone."""
    fetch = MediaSources(settings.media, max_bytes=settings.server.max_request_bytes)
    items = [decode_item(modality, fetch.fetch(s), adapter, settings.media) for s in sources]
    for item in items:
        adapter.measure(item)
    batch = adapter.preprocess([items])
    [part] = adapter.postprocess(adapter.forward(batch), batch)
    return part.embedding.contiguous()


async def started(settings: EncoderSettings) -> EncoderRuntime:
    runtime = EncoderRuntime(settings)
    await runtime.start()
    assert await runtime.wait_loaded() is not None and runtime.adapter is not None, runtime.load_error
    return runtime


def settings_for(path: Any) -> EncoderSettings:
    return load_settings(env={"ENCODER_MODEL_PATH": str(path), "ENCODER_DEVICE": "cpu", "ENCODER_CACHE_SIZE_MB": "64"})


@pytest.mark.parametrize("family", default_registry().names())
def test_a_hit_is_bit_identical_to_a_fresh_compute(family, tiny_model):
    settings = settings_for(tiny_model(family))

    async def scenario() -> None:
        runtime = await started(settings)
        adapter = runtime.adapter
        assert adapter is not None
        try:
            for modality in sorted(adapter.modalities, key=lambda m: m.value):
                item = media(modality, seed=1)
                body = {"req_id": f"{family}-{modality.value}", "modality": modality.value, "mm_items": [item]}
                before = dict(runtime.info()["cache"])
                first = rows(await runtime.encode(body))
                hit = rows(await runtime.encode({**body, "req_id": body["req_id"] + "-again"}))
                after = runtime.info()["cache"]
                assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (1, 1), modality
                reference = await asyncio.to_thread(fresh, adapter, settings, modality, [item])
                expected = reference.numpy().tobytes()
                assert hit[0] == first[0] == expected, f"{family} {modality.value}: hit rows differ from a fresh compute"
                assert hit[1:3] == first[1:3] and hit[1] == list(reference.shape)
                assert {k: v for k, v in hit[3].items() if k != "req_id"} == {k: v for k, v in first[3].items() if k != "req_id"}
        finally:
            await runtime.shutdown(grace=1)

    asyncio.run(scenario())


def test_a_request_mixing_hits_and_misses_computes_only_the_misses_in_order(tiny_model):
    settings = settings_for(tiny_model("qwen2_vl"))
    a, b, c = (media(Modality.IMAGE, seed) for seed in (2, 3, 4))

    async def scenario() -> None:
        runtime = await started(settings)
        adapter = runtime.adapter
        assert adapter is not None
        try:
            warm, _, warm_tokens, _ = rows(await runtime.encode({"req_id": "warm", "modality": "IMAGE", "mm_items": [a, c]}))
            width = len(warm) // sum(warm_tokens)
            a_rows, c_rows = warm[: warm_tokens[0] * width], warm[warm_tokens[0] * width :]
            before = dict(runtime.info()["cache"])
            mixed = rows(await runtime.encode({"req_id": "mixed", "modality": "IMAGE", "mm_items": [c, b, a, b]}))
            after = runtime.info()["cache"]
            assert after["hits"] - before["hits"] == 2 and after["misses"] - before["misses"] == 1
            assert after["single_flight_waits"] - before["single_flight_waits"] == 1  # the second b
            # Hits are the rows as first computed (a and c in one batch), the miss computed alone.
            b_rows = (await asyncio.to_thread(fresh, adapter, settings, Modality.IMAGE, [b])).numpy().tobytes()
            assert mixed[0] == c_rows + b_rows + a_rows + b_rows
            assert mixed[2] == [warm_tokens[1], len(b_rows) // width, warm_tokens[0], len(b_rows) // width]
            # ... and agree with the four computed together up to float rounding (batching is not bit-invariant on CPU).
            whole = await asyncio.to_thread(fresh, adapter, settings, Modality.IMAGE, [c, b, a, b])
            np.testing.assert_allclose(np.frombuffer(mixed[0], np.float32), whole.numpy().ravel(), rtol=1e-4, atol=1e-5)
        finally:
            await runtime.shutdown(grace=1)

    asyncio.run(scenario())
