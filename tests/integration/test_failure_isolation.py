"""One request that breaks a batched call fails alone; its batch neighbours still succeed.

Items that the processor or model would choke on are refused before batching (measure), so
no real input reaches this path today: the fault is injected into a real tiny adapter (the
test says so), which is the only way to exercise the safety net for the unknown bug.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from encoder_pod.errors import InternalError, InvalidRequest
from encoder_pod.models.registry import load_adapter
from encoder_pod.runtime import EncoderRuntime
from encoder_pod.settings import load_settings
from tests.support.server import png_data_uri

pytestmark = pytest.mark.integration

POISON = (255, 0, 255)


def _poisoned(requests) -> bool:
    return any(item.data.getpixel((0, 0)) == POISON for items in requests for item in items)


def _faulty_loader(stage: str):
    def load(settings):
        adapter = load_adapter(settings)
        real_pre, real_fwd = adapter.preprocess, adapter.forward

        def preprocess(requests):
            if stage == "preprocess" and _poisoned(requests):
                raise ValueError("injected processor fault")
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


@pytest.mark.parametrize("stage, error", [("preprocess", InvalidRequest), ("forward", InternalError)])
def test_only_the_failing_request_fails(tiny_model, stage, error):
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
        failures = runtime.metrics.registry.get_sample_value("encoder_batch_failures_total", {"stage": stage})
        await runtime.shutdown(grace=1)
        return together, alone, failures

    together, alone, failures = asyncio.run(scenario())
    assert isinstance(together[1], error) and "injected" in together[1].message
    assert together[1].req_id == "bad"
    good_results = [r for i, r in enumerate(together) if i != 1]
    from encoder_pod.transfer.inline import decode_embedding

    for got, ref in zip(good_results, alone):
        assert not isinstance(got, Exception), got
        np.testing.assert_allclose(decode_embedding(got["embedding"]), decode_embedding(ref["embedding"]), rtol=1e-4, atol=1e-5)
    assert failures == 1, "the batch never failed as a whole: the test did not batch the poisoned request"
