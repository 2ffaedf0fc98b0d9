"""LLaVA-NeXT anyres on a tiny whole checkpoint: packed rows per image, what is loaded, what is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem
from tests.support import hf_processors

pytestmark = pytest.mark.integration

# (width, height): tiny tiles are 32 px with pinpoints 1x2, 2x1, 2x2, 3x1, 1x3 (+1 base tile).
SIZES = [(64, 48), (32, 96), (120, 80), (200, 20), (1, 1), (3, 500), (64, 64)]
TILES = [5, 4, 5, 4, 3, 3, 5]


def encode(adapter, requests):
    batch = adapter.preprocess(requests)
    return batch, adapter.postprocess(adapter.forward(batch), batch)


def _placeholders(ckpt: Path, images) -> list[int]:
    """<image> tokens the real LlavaNextProcessor expands, one prompt per image."""
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    tok = hf_processors.tokenizer(ckpt)
    kwargs = {k: v for k, v in json.loads((ckpt / "processor_config.json").read_text()).items() if k != "processor_class"}
    processor = LlavaNextProcessor(image_processor=LlavaNextImageProcessorPil.from_pretrained(ckpt), tokenizer=tok, **kwargs)
    out = processor(text=["<image> hi"] * len(images), images=images, return_tensors="pt", padding=True)
    return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids("<image>"))


def test_rows_are_the_packed_count_the_processor_expands(tiny_model, tiny_adapter, make_image):
    adapter = tiny_adapter("llava_next")
    items = [make_image(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    expected = _placeholders(tiny_model("llava_next"), [item.data for item in items])
    assert [adapter.measure(item) for item in items] == expected
    batch = adapter.preprocess([items])
    assert batch.item_tokens == [expected]
    assert batch.item_grids == [[[n, h, w] for n, (w, h) in zip(TILES, SIZES)]]
    # Packed rows are fewer than tiles x rows per tile: the padding around the image is cut.
    assert all(rows < n * adapter.tile_rows + 64 for rows, n in zip(expected, TILES))
    assert expected[0] != TILES[0] * adapter.tile_rows


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


def test_only_tower_projector_and_newline_are_loaded(tiny_adapter):
    adapter = tiny_adapter("llava_next")
    kept = {name for name, _ in adapter.host.named_parameters()}
    assert {name.split(".")[0] for name in kept} == {"vision_tower", "multi_modal_projector", "image_newline"}
    assert adapter.hidden_size == 48  # the projector's output: the language model's width
    assert adapter.info()["tower_parameters"] == sum(p.numel() for p in adapter.host.parameters())


def test_health_warmup_info_and_refusals(tiny_adapter, make_image):
    adapter = tiny_adapter("llava_next")
    adapter.warmup()
    item = adapter.health_item(Modality.IMAGE)
    assert adapter.measure(item) == adapter.preprocess([[item]]).item_tokens[0][0]
    info = adapter.info()
    assert (info["arch"], info["layout"], info["modalities"], info["sample_rate"]) == ("llava_next", "full", ["IMAGE"], None)
    with pytest.raises(ValueError, match="aspect ratio"):
        adapter.measure(make_image(1, 300))
    with pytest.raises(ValueError, match="encodes IMAGE items, not VIDEO"):
        adapter.measure(MediaItem(Modality.VIDEO, None))


def _copy(tiny_model, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_model("llava_next"), tmp_path / "llava_next"))


def test_processor_that_tiles_differently_is_refused(tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, tmp_path)
    config_path = path / "preprocessor_config.json"
    config = json.loads(config_path.read_text())
    config["image_grid_pinpoints"] = [[32, 64], [64, 32]]
    config_path.write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="image_grid_pinpoints"):
        load_checkpoint(path)
