"""One request that breaks a batched call fails alone; its batch neighbours still succeed.

Items that the processor or model would choke on are refused before batching (measure), so
no real input reaches this path today: the fault is injected into a real tiny adapter (the
test says so), which is the only way to exercise the safety net for the unknown bug.

Only the caller's input is a 400: a ValueError the Hugging Face processor raises (here: a real
transformers validation function handed an array it refuses) blames the request; a ValueError
raised by our own code in preprocess is a fault of the server (500), like any forward failure.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from transformers.image_utils import infer_channel_dimension_format

from encoder_pod.errors import InternalError, InvalidRequest
from encoder_pod.models.registry import load_adapter
from encoder_pod.runtime import EncoderRuntime
from encoder_pod.settings import load_settings
from testkit.media import png_data_uri

pytestmark = pytest.mark.integration

POISON = (255, 0, 255)


def _poisoned(requests) -> bool:
    return any(item.data.getpixel((0, 0)) == POISON for items in requests for item in items)


def _faulty_loader(stage: str):
    def load(settings):
        adapter = load_adapter(settings)
        real_pre, real_fwd = adapter.preprocess, adapter.forward

        def preprocess(requests):
            if stage == "processor" and _poisoned(requests):
                # As if the processor refused this request's media: transformers' own check raises.
                infer_channel_dimension_format(np.zeros((2, 2)))
            if stage == "preprocess" and _poisoned(requests):
                raise ValueError("injected preprocess fault")
            batch = real_pre(requests)
            batch.extra["poisoned"] = _poisoned(requests)
            return batch

        def forward(batch):
            if stage == "forward" and batch.extra.get("poisoned"):
                raise RuntimeError("injected forward fault")
            return real_fwd(batch)

        adapter.preprocess, adapter.forward = preprocess, forward
        return adapter

    return load


def _poison_uri() -> str:
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 40), POISON).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    "stage, error, words",
    [
        ("processor", InvalidRequest, "items could not be preprocessed"),
        ("preprocess", InternalError, "injected preprocess fault"),
        ("forward", InternalError, "injected forward fault"),
    ],
)
def test_only_the_failing_request_fails(tiny_model, stage, error, words):
    settings = load_settings(env={"ENCODER_MODEL_PATH": str(tiny_model("qwen2_vl")), "ENCODER_MAX_WAIT_MS": "300"})
    goods = [[png_data_uri(40 + 8 * i, 32, seed=i)] for i in range(3)]

    async def scenario():
        runtime = EncoderRuntime(settings, adapter_loader=_faulty_loader(stage))
        await runtime.start()
        await runtime.wait_loaded()
        bodies = [{"req_id": f"g{i}", "modality": "IMAGE", "mm_items": items} for i, items in enumerate(goods)]
        bodies.insert(1, {"req_id": "bad", "modality": "IMAGE", "mm_items": [_poison_uri()]})
        together = await asyncio.gather(*(runtime.encode(b) for b in bodies), return_exceptions=True)
        alone = [await runtime.encode({**b, "req_id": b["req_id"] + "-alone"}) for b in bodies if b["req_id"] != "bad"]
        label = "forward" if stage == "forward" else "preprocess"
        failures = runtime.metrics.registry.get_sample_value("encoder_batch_failures_total", {"stage": label})
        await runtime.shutdown(grace=1)
        return together, alone, failures

    together, alone, failures = asyncio.run(scenario())
    assert type(together[1]) is error and words in together[1].message, together[1]
    assert together[1].req_id == "bad"
    good_results = [r for i, r in enumerate(together) if i != 1]
    from encoder_pod.transfer.inline import decode_embedding

    for got, ref in zip(good_results, alone):
        assert not isinstance(got, Exception), got
        got_body, ref_body = got.body(), ref.body()
        np.testing.assert_allclose(decode_embedding(got_body["embedding"]), decode_embedding(ref_body["embedding"]), rtol=1e-4, atol=1e-5)
    assert failures == 1, "the batch never failed as a whole: the test did not batch the poisoned request"
