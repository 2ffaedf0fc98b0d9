"""Whole checkpoints on a CUDA device in bf16 (``auto`` dtype): the same proof as tests/integration/test_families.py.

Per family: the adapter built from the tiny whole checkpoint on the GPU, rows for several requests
in one batch and each request alone, against the full HF model's own ``get_image_features`` /
``get_audio_features`` in bf16 on the same GPU; row counts against the real processor's
placeholders. bf16 changes the numbers, so values are compared with a bf16 tolerance; the counts
must be exact.
"""

from __future__ import annotations

import pytest
import torch

from encoder_pod.models.registry import load_adapter
from encoder_pod.settings import load_settings
from tests.integration.family_cases import CASES, full_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BF16 = {"atol": 3e-2, "rtol": 3e-2}
"""bf16 keeps 8 bits of mantissa (about 0.4% per rounding); the towers are a few layers deep."""


def _encode(adapter, requests):
    batch = adapter.preprocess(requests)
    return adapter.postprocess(adapter.forward(batch), batch)


def _items(check):
    from encoder_pod.modality import Modality
    from encoder_pod.models.base import MediaItem

    return [[MediaItem(Modality[check.modality], media) for media in request] for request in check.media()]


@pytest.mark.parametrize("arch", sorted(CASES))
def test_cuda_bf16_rows_are_the_full_models(arch, tiny_full_model):
    prove_bf16(arch, tiny_full_model(arch), "cuda")


def prove_bf16(arch: str, ckpt, device: str) -> None:
    """The proof on ``device`` in bf16 (``cuda`` here; callable on ``cpu`` to check the test itself)."""
    case = CASES[arch]
    env = {"ENCODER_MODEL_PATH": str(ckpt), "ENCODER_DEVICE": device, "ENCODER_DTYPE": "bfloat16" if device == "cpu" else "auto"}
    adapter = load_adapter(load_settings(env=env).model)
    assert (adapter.device.type, adapter.dtype) == (device, torch.bfloat16)
    assert adapter.info()["dtype"] == "bfloat16" and adapter.weights.shards_opened
    model = full_model(case.full_cls, ckpt, device, torch.bfloat16)
    for check in case.checks:
        requests = _items(check)
        parts = _encode(adapter, requests)
        reference = check.reference(model, ckpt, check.media())
        served = [rows for part in parts for rows in torch.split(part.embedding, part.item_tokens)]
        assert [tuple(r.shape) for r in served] == [tuple(r.shape) for r in reference]
        assert [sum(part.item_tokens) for part in parts] == check.placeholders(ckpt, check.media())
        for i, (got, ref) in enumerate(zip(served, reference)):
            assert got.dtype == torch.bfloat16 and got.device.type == "cpu"
            torch.testing.assert_close(got.float(), ref.float().cpu(), **BF16, msg=f"{arch} {check.modality} item {i}")
        for items, part in zip(requests, parts):
            (alone,) = _encode(adapter, [items])
            assert alone.item_tokens == part.item_tokens
            torch.testing.assert_close(part.embedding.float(), alone.embedding.float(), **BF16)
