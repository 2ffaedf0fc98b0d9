"""The image adapters on a CUDA device with ``auto`` dtype (bf16): same rows, same slicing as on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem
from encoder_pod.models.registry import load_adapter
from encoder_pod.settings import load_settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _image(width: int, height: int, seed: int) -> MediaItem:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return MediaItem(Modality.IMAGE, Image.fromarray(pixels))


def _encode(adapter, requests):
    batch = adapter.preprocess(requests)
    return adapter.postprocess(adapter.forward(batch), batch)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "clip", "siglip"])
def test_cuda_bf16_batched_equals_unbatched_and_tracks_cpu(arch, tiny_model):
    path = str(tiny_model(arch))
    gpu = load_adapter(load_settings(env={"ENCODER_MODEL_PATH": path, "ENCODER_DEVICE": "cuda"}).model)
    cpu = load_adapter(load_settings(env={"ENCODER_MODEL_PATH": path, "ENCODER_DEVICE": "cpu"}).model)
    assert (gpu.device.type, gpu.dtype) == ("cuda", torch.bfloat16)
    requests = [[_image(64, 48, 1)], [_image(30, 100, 2), _image(224, 224, 3)], [_image(3, 500, 4)]]
    parts = _encode(gpu, requests)
    for items, part in zip(requests, parts):
        assert part.embedding.device.type == "cpu" and part.embedding.dtype == torch.bfloat16
        assert part.item_tokens == [gpu.measure(item) for item in items]
        (alone,) = _encode(gpu, [items])
        torch.testing.assert_close(part.embedding, alone.embedding, atol=5e-2, rtol=5e-2)
        (reference,) = _encode(cpu, [items])
        torch.testing.assert_close(part.embedding.float(), reference.embedding, atol=1e-1, rtol=1e-1)
