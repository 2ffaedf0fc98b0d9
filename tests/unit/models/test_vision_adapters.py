"""Behaviour every image adapter shares, on real tiny checkpoints of all four families."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem, read_config
from encoder_pod.models.families import default_registry
from encoder_pod.models.family import Layout
from encoder_pod.models.registry import make_tiny_model

pytestmark = pytest.mark.integration

ARCHS = ("qwen2_vl", "qwen2_5_vl", "clip", "siglip")

# Sizes that stress the processors: 1x1, 3 px wide/high (could pass for a channel axis), an
# aspect ratio of exactly 200 (the largest accepted), odd sizes, one above the tiny max_pixels.
EDGE_SIZES = [(1, 1), (3, 500), (500, 3), (1, 200), (200, 1), (17, 90), (90, 17), (640, 480), (28, 28)]


def encode(adapter, requests):
    """preprocess -> forward -> postprocess, as the batch worker runs them."""
    batch = adapter.preprocess(requests)
    return batch, adapter.postprocess(adapter.forward(batch), batch)


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_equals_unbatched(arch, tiny_adapter, make_image):
    adapter = tiny_adapter(arch)
    requests = [
        [make_image(64, 48, seed=1)],
        [make_image(30, 100, seed=2), make_image(224, 224, seed=3)],
        [make_image(120, 40, seed=4), make_image(56, 56, seed=5), make_image(300, 200, seed=6)],
    ]
    batch, parts = encode(adapter, requests)

    assert len(parts) == len(requests)
    for items, part, tokens in zip(requests, parts, batch.item_tokens):
        assert tokens == [adapter.measure(item) for item in items]
        assert part.item_tokens == tokens
        assert part.embedding.shape == (sum(tokens), adapter.hidden_size)
        _, (alone,) = encode(adapter, [items])
        assert alone.item_tokens == tokens
        torch.testing.assert_close(part.embedding, alone.embedding, atol=1e-5, rtol=1e-4)
    # Different images give different rows: a slicing bug could not hide behind equal outputs.
    assert not torch.allclose(parts[0].embedding[:4], parts[1].embedding[:4])


@pytest.mark.parametrize("arch", ARCHS)
def test_measure_agrees_with_processor_on_edge_sizes(arch, tiny_adapter, make_image):
    adapter = tiny_adapter(arch)
    items = [make_image(w, h, seed=i) for i, (w, h) in enumerate(EDGE_SIZES)]
    batch, parts = encode(adapter, [[item] for item in items])

    for (w, h), item, tokens, part in zip(EDGE_SIZES, items, batch.item_tokens, parts):
        assert tokens == [adapter.measure(item)], f"{w}x{h}"
        assert part.embedding.shape[0] == tokens[0] > 0, f"{w}x{h}"
        assert torch.isfinite(part.embedding).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("size", [(1, 201), (1000, 2), (2, 20000)])
def test_extreme_aspect_ratio_refused(arch, size, tiny_adapter, make_image):
    adapter = tiny_adapter(arch)
    with pytest.raises(ValueError, match=rf"{size[0]}x{size[1]} has aspect ratio \d+:1; at most 200:1"):
        adapter.measure(make_image(*size))


@pytest.mark.parametrize("arch", ARCHS)
def test_items_that_are_not_images_refused(arch, tiny_adapter):
    adapter = tiny_adapter(arch)
    with pytest.raises(ValueError, match=r"encodes IMAGE(, VIDEO)? items, not AUDIO"):
        adapter.measure(MediaItem(Modality.AUDIO, torch.zeros(160).numpy()))
    with pytest.raises(ValueError, match="must be a decoded image, got ndarray"):
        adapter.measure(MediaItem(Modality.IMAGE, torch.zeros(8, 8, 3).numpy()))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shape", [(3, 500, 3), (1, 1, 3), (500, 3, 3)])
def test_processor_call_declares_channels_last(arch, shape, tiny_adapter):
    """A (3, W, 3) or (1, 1, 3) array is ambiguous; the adapter's one processor call must say HWC.

    PIL images are always read as HWC, but an array (from a future decoder) would otherwise be
    taken as channels-first: another grid for Qwen, a broken image for CLIP.
    """
    adapter = tiny_adapter(arch)
    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    from_array = adapter._process([pixels])
    from_pil = adapter._process([Image.fromarray(pixels, mode="RGB")])
    assert from_array.keys() == from_pil.keys()
    for key in from_pil:
        torch.testing.assert_close(from_array[key], from_pil[key])


@pytest.mark.parametrize("arch", ARCHS)
def test_non_rgb_images_are_converted(arch, tiny_adapter, make_image):
    adapter = tiny_adapter(arch)
    rgb = make_image(40, 30, seed=9)
    grey = MediaItem(Modality.IMAGE, rgb.data.convert("L"))
    rgba = MediaItem(Modality.IMAGE, rgb.data.convert("RGBA"))
    batch, parts = encode(adapter, [[grey], [rgba], [rgb]])
    assert batch.item_tokens == [[adapter.measure(rgb)]] * 3
    torch.testing.assert_close(parts[1].embedding, parts[2].embedding)  # opaque alpha changes nothing


@pytest.mark.parametrize("arch", ARCHS)
def test_health_item_warmup_and_info(arch, tiny_adapter):
    adapter = tiny_adapter(arch)
    item = adapter.health_item(Modality.IMAGE)
    assert item.data.size == (32, 32)
    adapter.warmup()
    info = adapter.info()
    served = ["IMAGE", "VIDEO"] if arch.startswith("qwen") else ["IMAGE"]  # Qwen2-VL towers take clips too
    assert (info["arch"], info["modalities"], info["dtype"]) == (arch, served, "float32")
    assert info["hidden_size"] == adapter.hidden_size > 0
    facts = adapter.facts()  # what serving reads, typed; /server_info renders exactly the info above
    assert (facts.family, facts.modalities, facts.dtype, facts.hidden_size) == (arch, tuple(map(Modality, served)), "float32", adapter.hidden_size)
    assert facts.to_json() == info and "family" not in facts.details
    with pytest.raises(ValueError):
        adapter.health_item(Modality.AUDIO)


@pytest.mark.parametrize("arch", ARCHS)
def test_missing_weight_fails_loudly(arch, tiny_model, load_checkpoint, tmp_path):
    path = Path(shutil.copytree(tiny_model(arch), tmp_path / arch))
    weights = load_file(path / "model.safetensors")
    dropped = sorted(weights)[len(weights) // 2]
    del weights[dropped]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match=rf"missing_keys: .*{dropped.split('.')[-2]}"):
        load_checkpoint(path)


@pytest.mark.parametrize("arch", ARCHS)
def test_unexpected_weight_fails_loudly(arch, tiny_model, load_checkpoint, tmp_path):
    path = Path(shutil.copytree(tiny_model(arch), tmp_path / arch))
    weights = load_file(path / "model.safetensors")
    weights["stray_head.weight"] = torch.zeros(2, 2)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="unexpected_keys: .*stray_head"):
        load_checkpoint(path)


@pytest.mark.parametrize("arch", ARCHS)
def test_each_checkpoint_matches_only_its_own_family(arch, tiny_model):
    registry = default_registry()
    config = read_config(tiny_model(arch))
    found = registry.discover(tiny_model(arch))
    assert (found.family, found.layout, found.path) == (arch, Layout.TOWER, tiny_model(arch))
    assert found.architecture in {"Qwen2VisionTransformerPretrainedModel", "Qwen2_5_VisionTransformerPretrainedModel",
                                  "CLIPVisionModel", "SiglipVisionModel"}
    assert [f.family for f in registry.recognise_all(tiny_model(arch), config)] == [arch]


@pytest.mark.parametrize(
    "config",
    [
        # Dual-encoder checkpoints are not towers (their weights are prefixed), nor whole vision-language ones.
        {"model_type": "qwen2_vl", "architectures": ["Qwen2VLModel"]},
        {"model_type": "clip", "architectures": ["CLIPModel"]},
        {"model_type": "siglip", "architectures": ["SiglipModel"]},
        {"model_type": "siglip2_vision_model", "architectures": ["Siglip2VisionModel"]},
        {"model_type": "whisper", "architectures": ["WhisperForAudioClassification"]},
        # Contradicting fields: trust neither.
        {"model_type": "clip_vision_model", "architectures": ["SiglipVisionModel"]},
        {"architectures": ["CLIPVisionModel"]},
    ],
)
def test_other_families_are_not_matched(config, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    registry = default_registry()
    assert registry.recognise_all(tmp_path, config) == []
    with pytest.raises(ValueError, match="no encoder adapter"):
        registry.discover(tmp_path)


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_weights_are_not_a_fresh_init(arch, tiny_adapter):
    """A key that silently fell back to init would look like this; the written weights must not."""
    model = tiny_adapter(arch).model
    torch.manual_seed(0)
    fresh = type(model)(model.config)
    loaded = dict(model.named_parameters())
    for name, param in fresh.named_parameters():
        if name in loaded:  # the CLIP adapter trims its last layer after loading
            assert not torch.allclose(param, loaded[name]), name


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_matches_float32_loosely(arch, tiny_model, tiny_adapter, load_checkpoint, make_image):
    bf16 = load_checkpoint(tiny_model(arch), ENCODER_DEVICE="cpu", ENCODER_DTYPE="bfloat16")
    requests = [[make_image(64, 48, seed=1), make_image(50, 90, seed=2)]]
    _, (low,) = encode(bf16, requests)
    _, (full,) = encode(tiny_adapter(arch), requests)
    assert low.embedding.dtype == torch.bfloat16
    torch.testing.assert_close(low.embedding.float(), full.embedding, atol=0.1, rtol=0.1)


def test_make_tiny_model_refuses_unknown_names(tmp_path):
    known = "clip, gemma3, internvl, llava, llava_next, llava_onevision, qwen2_5_omni, qwen2_5_vl, qwen2_audio, qwen2_vl, qwen3_5, qwen3_omni, qwen3_vl, siglip, whisper"
    with pytest.raises(ValueError, match=f"unknown arch 'nope'; known: {known}"):
        make_tiny_model("nope", tmp_path / "a")
    with pytest.raises(ValueError, match="unknown preset 'huge'; known: tiny, moderate"):
        make_tiny_model("clip", tmp_path / "b", preset="huge")
    assert not (tmp_path / "b" / "config.json").exists()
