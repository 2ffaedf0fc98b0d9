"""LLaVA-NeXT anyres on a tiny checkpoint: tiles per image, padding tiles dropped, rows per tile."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem

pytestmark = pytest.mark.integration

# (width, height): tiny tiles are 32 px with pinpoints 1x2, 2x1, 2x2, 3x1, 1x3 (+1 base tile).
SIZES = [(64, 48), (32, 96), (120, 80), (200, 20), (1, 1), (3, 500), (64, 64)]
TILES = [5, 4, 5, 4, 3, 3, 5]


def encode(adapter, requests):
    batch = adapter.preprocess(requests)
    return batch, adapter.postprocess(adapter.forward(batch), batch)


def test_tiles_per_image_follow_the_aspect_ratio(tiny_adapter, make_image):
    adapter = tiny_adapter("llava_next")
    items = [make_image(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    assert adapter.rows_per_tile == 16  # (32 / 8)^2 patches, CLS dropped
    assert [adapter.measure(item) for item in items] == [16 * n for n in TILES]
    batch = adapter.preprocess([items])
    assert batch.item_tokens == [[16 * n for n in TILES]]
    assert batch.item_grids == [[[n, h, w] for n, (w, h) in zip(TILES, SIZES)]]
    # Padding tiles never reach the tower: only the real ones are in the batch.
    assert batch.inputs["pixel_values"].shape == (sum(TILES), 3, 32, 32)


def test_batched_equals_alone_with_different_tile_counts(tiny_adapter, make_image):
    adapter = tiny_adapter("llava_next")
    requests = [
        [make_image(64, 48, seed=1)],
        [make_image(32, 96, seed=2), make_image(120, 80, seed=3)],
        [make_image(1, 1, seed=4), make_image(200, 20, seed=5), make_image(64, 64, seed=6)],
    ]
    batch, parts = encode(adapter, requests)
    for items, part, tokens in zip(requests, parts, batch.item_tokens):
        assert part.embedding.shape == (sum(tokens), adapter.hidden_size)
        _, (alone,) = encode(adapter, [items])
        assert alone.item_tokens == tokens
        torch.testing.assert_close(part.embedding, alone.embedding, atol=1e-5, rtol=1e-4)


def test_rows_are_what_llava_next_packs(tiny_model, tiny_adapter, make_image):
    """Our rows, packed by HF's own pack_image_features, equal HF's get_image_features."""
    from transformers.models.llava_next.modeling_llava_next import LlavaNextForConditionalGeneration

    adapter = tiny_adapter("llava_next")
    items = [make_image(64, 48, seed=1), make_image(32, 96, seed=2), make_image(1, 1, seed=3)]
    batch, (part,) = encode(adapter, [items])
    hf = LlavaNextForConditionalGeneration.from_pretrained(tiny_model("llava_next")).eval()
    out = adapter._process([item.data for item in items])
    with torch.inference_mode():
        expected = hf.model.get_image_features(out["pixel_values"], out["image_sizes"]).pooler_output
        per_image = torch.split(part.embedding, batch.item_tokens[0])
        tiles = [rows.reshape(grid[0], adapter.rows_per_tile, -1) for rows, grid in zip(per_image, batch.item_grids[0])]
        packed, _ = hf.model.pack_image_features(tiles, out["image_sizes"], "default", hf.model.image_newline)
    for ours, theirs in zip(packed, expected):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_language_model_is_not_kept(tiny_adapter):
    adapter = tiny_adapter("llava_next")
    assert not hasattr(adapter, "model")
    kept = {name for name, _ in adapter.tower.named_parameters()} | {name for name, _ in adapter.projector.named_parameters()}
    assert not any("language_model" in name or "lm_head" in name for name in kept)
    # The tower is cut after the feature layer (-2 of 3 layers): the last layer is never computed.
    assert len(adapter.tower.encoder.layers) == 2 and adapter.feature_layers == [2]
    assert adapter.hidden_size == 32  # the projector's output: the language model's width


def test_health_warmup_info_and_refusals(tiny_adapter, make_image):
    adapter = tiny_adapter("llava_next")
    adapter.warmup()
    assert adapter.measure(adapter.health_item(Modality.IMAGE)) == 16 * 3  # 1x2 grid + base tile
    info = adapter.info()
    assert (info["arch"], info["modalities"], info["sample_rate"]) == ("llava_next", ["IMAGE"], None)
    with pytest.raises(ValueError, match="aspect ratio"):
        adapter.measure(make_image(1, 300))
    with pytest.raises(ValueError, match="encodes IMAGE items, not VIDEO"):
        adapter.measure(MediaItem(Modality.VIDEO, None))


def _copy(tiny_model, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_model("llava_next"), tmp_path / "llava_next"))


def test_missing_tower_weight_fails_loudly(tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, tmp_path)
    weights = load_file(path / "model.safetensors")
    dropped = next(k for k in sorted(weights) if k.startswith("vision_tower.") and "layers.1.mlp.fc2" in k)
    del weights[dropped]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="missing_keys: .*layers.1.mlp.fc2"):
        load_checkpoint(path)


def test_stray_weight_fails_loudly_but_language_model_layers_do_not(tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, tmp_path)
    weights = load_file(path / "model.safetensors")
    assert any(".layers.0." in k and k.startswith("language_model.") for k in weights)  # present, skipped
    weights["multi_modal_projector.stray.weight"] = torch.zeros(2)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="unexpected_keys: .*stray"):
        load_checkpoint(path)


def test_processor_that_tiles_differently_is_refused(tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, tmp_path)
    config_path = path / "preprocessor_config.json"
    config = json.loads(config_path.read_text())
    config["image_grid_pinpoints"] = [[32, 64], [64, 32]]
    config_path.write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="image_grid_pinpoints"):
        load_checkpoint(path)
