"""Qwen2-VL / Qwen2.5-VL specifics: merged output, grid rule, measure follows the processor config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

QWEN_ARCHS = ("qwen2_vl", "qwen2_5_vl")


@pytest.mark.parametrize("arch", QWEN_ARCHS)
def test_output_is_the_merged_pooler_output(arch, tiny_adapter, make_image):
    adapter = tiny_adapter(arch)
    items = [make_image(100, 60, seed=1), make_image(224, 224, seed=2)]
    batch = adapter.preprocess([items])
    grids = batch.item_grids[0]
    # The rule the prefill side relies on: t*h*w / merge^2 rows per image, from image_grid_thw.
    assert batch.item_tokens[0] == [t * h * w // 4 for t, h, w in grids]
    with torch.inference_mode():
        reference = adapter.model(batch.inputs["pixel_values"], grid_thw=batch.inputs["grid_thw"])
    served = adapter.forward(batch)
    torch.testing.assert_close(served, reference.pooler_output)
    assert reference.last_hidden_state.shape[0] == 4 * served.shape[0]  # pre-merge rows are not served
    assert served.shape[1] == adapter.hidden_size


@pytest.mark.parametrize("arch", QWEN_ARCHS)
def test_grids_follow_smart_resize(arch, tiny_adapter, make_image):
    adapter = tiny_adapter(arch)
    # tiny processor: 56*56 <= pixels <= 224*224, factor 28. Keys are (width, height).
    cases = {
        (1, 1): [1, 4, 4],  # scaled up to 56x56
        (3, 500): [1, 52, 2],  # scaled up to 1456x56, aspect ratio kept
        (500, 3): [1, 2, 52],
        (224, 224): [1, 16, 16],
        (640, 480): [1, 12, 18],  # scaled down to 168x252 (under 224*224 pixels)
    }
    batch = adapter.preprocess([[make_image(w, h)] for w, h in cases])
    assert [grids[0] for grids in batch.item_grids] == list(cases.values())


@pytest.mark.parametrize("arch", QWEN_ARCHS)
def test_measure_reads_the_checkpoints_processor_config(arch, tiny_model, load_checkpoint, make_image, tmp_path):
    path = Path(shutil.copytree(tiny_model(arch), tmp_path / arch))
    config_path = path / "preprocessor_config.json"
    config = json.loads(config_path.read_text())
    config["size"] = {"shortest_edge": 28 * 28, "longest_edge": 112 * 112}
    config_path.write_text(json.dumps(config))
    adapter = load_checkpoint(path)
    item = make_image(640, 480)
    assert adapter.measure(item) == 12  # resized to 84x112: 6x8 patches, 3x4 merged rows
    batch = adapter.preprocess([[item]])
    assert batch.item_tokens == [[12]] and batch.item_grids == [[[1, 6, 8]]]


@pytest.mark.parametrize("arch", QWEN_ARCHS)
def test_the_processor_itself_refuses_what_measure_refuses(arch, tiny_adapter, make_image):
    """measure()'s aspect bound is the processor's own: without it the batch would fail later."""
    adapter = tiny_adapter(arch)
    with pytest.raises(ValueError, match="aspect ratio must be smaller than 200"):
        adapter.processor(images=[make_image(1, 201).data], input_data_format="channels_last")


@pytest.mark.parametrize("arch", QWEN_ARCHS)
def test_processor_that_does_not_fit_the_tower_is_refused(arch, tiny_model, load_checkpoint, tmp_path):
    path = Path(shutil.copytree(tiny_model(arch), tmp_path / arch))
    config_path = path / "preprocessor_config.json"
    config = json.loads(config_path.read_text())
    config["patch_size"] = 16
    config_path.write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="patch_size: processor 16 vs tower 14"):
        load_checkpoint(path)


def test_qwen25_hidden_size_is_the_merger_output(tiny_adapter):
    adapter = tiny_adapter("qwen2_5_vl")
    assert adapter.model.config.hidden_size == 64  # inner width
    assert adapter.hidden_size == adapter.model.config.out_hidden_size == 128
