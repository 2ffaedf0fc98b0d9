"""Whole checkpoints, tower weights only: what is read (measured), what is never opened, what fails loudly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from encoder_pod.cli import main as cli
from encoder_pod.models.registry import encoder_weight_keys
from encoder_pod.models.weights import CheckpointError, read_header

pytestmark = pytest.mark.integration

INDEX = "model.safetensors.index.json"


def _weight_map(path: Path) -> dict[str, str]:
    return json.loads((path / INDEX).read_text())["weight_map"]


def _tower_bytes(path: Path, prefixes: tuple[str, ...]) -> int:
    total = 0
    for shard in sorted(set(_weight_map(path).values())):
        _, header = read_header(path / shard)
        total += sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in header.items() if k.startswith(prefixes))
    return total


def _rchar() -> int:
    """Bytes this process has read through read() syscalls so far (Linux /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _rewrite(path: Path, edit: Callable[[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> None:
    """Apply ``edit(shard, tensors)`` to every shard, then write the index to match."""
    index = json.loads((path / INDEX).read_text())
    weight_map: dict[str, str] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors = edit(shard, load_file(path / shard))
        save_file(tensors, path / shard, metadata={"format": "pt"})
        weight_map.update({key: shard for key in tensors})
    index["weight_map"] = weight_map
    (path / INDEX).write_text(json.dumps(index))


def _image_rows(adapter, make_image) -> torch.Tensor:
    batch = adapter.preprocess([[make_image(64, 48, seed=1), make_image(120, 80, seed=2)]])
    return adapter.forward(batch)


@pytest.mark.skipif(not Path("/proc/self/io").is_file(), reason="needs Linux /proc/self/io")
def test_loading_reads_the_towers_bytes_and_no_more(tiny_full_model, load_checkpoint):
    path = tiny_full_model("qwen2_5_vl")
    load_checkpoint(path, ENCODER_DEVICE="cpu")  # imports and first-use caches out of the way
    before = _rchar()
    adapter = load_checkpoint(path, ENCODER_DEVICE="cpu")
    read = _rchar() - before
    tower = _tower_bytes(path, ("visual.",))
    checkpoint = sum((path / s).stat().st_size for s in set(_weight_map(path).values()))
    assert adapter.weights is not None
    assert tower <= adapter.weights.bytes_read <= tower + 64 * 1024
    # The process's own read() count: the tower's tensors, headers, config and processor files.
    assert tower <= read <= tower + 256 * 1024, (read, tower, checkpoint)
    assert read < checkpoint / 2


def test_shards_holding_only_the_language_model_are_never_opened(tiny_full_model, load_checkpoint, make_image, tmp_path):
    original = tiny_full_model("qwen2_vl")
    path = Path(shutil.copytree(original, tmp_path / "ckpt"))
    tower_shards = {s for k, s in _weight_map(path).items() if k.startswith("visual.")}
    removed = set(_weight_map(path).values()) - tower_shards
    assert removed, "the tiny checkpoint must have shards with no tower tensor"
    for shard in removed:
        (path / shard).unlink()
    adapter = load_checkpoint(path, ENCODER_DEVICE="cpu")
    assert adapter.weights.shards_opened == sorted(tower_shards)
    reference = load_checkpoint(original, ENCODER_DEVICE="cpu")
    torch.testing.assert_close(_image_rows(adapter, make_image), _image_rows(reference, make_image), atol=0, rtol=0)


def test_a_missing_tower_tensor_fails_naming_it(tiny_full_model, load_checkpoint, tmp_path):
    path = Path(shutil.copytree(tiny_full_model("qwen2_vl"), tmp_path / "ckpt"))
    _rewrite(path, lambda shard, tensors: {k: v for k, v in tensors.items() if k != "visual.blocks.1.mlp.fc2.bias"})
    with pytest.raises(CheckpointError, match=r"model.visual .*missing \['blocks.1.mlp.fc2.bias'\]"):
        load_checkpoint(path, ENCODER_DEVICE="cpu")


def test_a_stray_tower_tensor_fails_naming_it(tiny_full_model, load_checkpoint, tmp_path):
    path = Path(shutil.copytree(tiny_full_model("llava"), tmp_path / "ckpt"))
    first = sorted(set(_weight_map(path).values()))[0]
    _rewrite(path, lambda shard, tensors: {**tensors, "multi_modal_projector.stray.weight": torch.zeros(2)}
             if shard == first else tensors)
    with pytest.raises(CheckpointError, match=r"model.multi_modal_projector .*unexpected \['stray.weight'\]"):
        load_checkpoint(path, ENCODER_DEVICE="cpu")


def test_an_index_naming_a_tensor_its_shard_lacks_fails(tiny_full_model, load_checkpoint, tmp_path):
    path = Path(shutil.copytree(tiny_full_model("qwen2_vl"), tmp_path / "ckpt"))
    index = json.loads((path / INDEX).read_text())
    shard = index["weight_map"]["visual.merger.ln_q.weight"]
    tensors = load_file(path / shard)
    del tensors["visual.merger.ln_q.weight"]
    save_file(tensors, path / shard, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="names 'visual.merger.ln_q.weight' but the shard does not hold it"):
        load_checkpoint(path, ENCODER_DEVICE="cpu")


@pytest.mark.parametrize(
    "arch, rename",
    [
        # llava-hf ships the CLIP tower under vision_tower.vision_model.*
        ("llava", lambda k: k.replace("vision_tower.", "vision_tower.vision_model.", 1) if k.startswith("vision_tower.") else k),
        # the InternVL / newer conversions: every key under model.*, the head as lm_head.*
        ("llava", lambda k: k if k.startswith("language_model.lm_head") else "model." + k.removeprefix("language_model.")),
        # Qwen2-VL in its in-memory layout (model.visual.*, model.language_model.*)
        ("qwen2_vl", lambda k: "model." + k if k.startswith("visual.") else k),
    ],
)
def test_the_hubs_other_key_layouts_load_the_same_tower(arch, rename, tiny_full_model, load_checkpoint, make_image, tmp_path):
    original = tiny_full_model(arch)
    path = Path(shutil.copytree(original, tmp_path / "ckpt"))
    _rewrite(path, lambda shard, tensors: {rename(k): v for k, v in tensors.items()})
    assert set(_weight_map(path)) != set(_weight_map(original))
    relaid = load_checkpoint(path, ENCODER_DEVICE="cpu")
    reference = load_checkpoint(original, ENCODER_DEVICE="cpu")
    assert relaid.weights.tensors == reference.weights.tensors
    torch.testing.assert_close(_image_rows(relaid, make_image), _image_rows(reference, make_image), atol=0, rtol=0)


@pytest.mark.parametrize(
    "arch, prefixes",
    [("qwen2_5_vl", ("visual.",)), ("llava_next", ("vision_tower.", "multi_modal_projector.", "image_newline")),
     ("qwen2_5_omni", ("thinker.visual.", "thinker.audio_tower.")), ("whisper", ("model.encoder.",))],
)
def test_the_keys_a_download_fetches_are_exactly_the_encoders(arch, prefixes, tiny_full_model):
    path = tiny_full_model(arch)
    keys = list(_weight_map(path))
    assert sorted(encoder_weight_keys(path, keys)) == sorted(k for k in keys if k.startswith(prefixes))


def test_bfloat16_rows_match_the_full_model_in_bfloat16(tiny_full_model, load_checkpoint, make_image):
    from transformers import Qwen2_5_VLForConditionalGeneration

    path = tiny_full_model("qwen2_5_vl")
    adapter = load_checkpoint(path, ENCODER_DEVICE="cpu", ENCODER_DTYPE="bfloat16")
    items = [make_image(64, 48, seed=1), make_image(120, 80, seed=2)]
    batch = adapter.preprocess([items])
    ours = adapter.forward(batch)
    full = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        theirs = full.get_image_features(batch.inputs["pixel_values"], batch.inputs["grid_thw"]).pooler_output
    assert ours.dtype == torch.bfloat16
    # Built in bf16 as the full model builds its tower (rotary frequencies stay fp32): the same numbers.
    torch.testing.assert_close(ours, torch.cat(theirs), atol=0, rtol=0)


def test_make_tiny_model_full_writes_a_sharded_whole_checkpoint(tmp_path, capsys):
    assert cli(["make-tiny-model", "--arch", "qwen2_vl", "--full", "--out", str(tmp_path / "q")]) == 0
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    assert len(set(_weight_map(tmp_path / "q").values())) > 4
    assert {"tokenizer.json", "preprocessor_config.json", "video_preprocessor_config.json"} <= {
        p.name for p in (tmp_path / "q").iterdir()}
    assert cli(["make-tiny-model", "--arch", "clip", "--full", "--out", str(tmp_path / "c")]) == 2
    assert "clip has no tiny full checkpoint" in capsys.readouterr().err
