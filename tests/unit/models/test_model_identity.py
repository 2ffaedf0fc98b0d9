"""The cache namespace hashes what the adapter declares determines its rows, not what /server_info shows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from encoder_pod.cache.keys import model_namespace
from encoder_pod.settings import load_settings

pytestmark = pytest.mark.unit

SETTINGS = load_settings(env={})


def test_a_display_fact_changes_server_info_but_no_cache_key(tiny_adapter, tiny_model, load_checkpoint, tmp_path, monkeypatch):
    adapter = tiny_adapter("qwen2_vl")
    ns = model_namespace(adapter.identity(), SETTINGS)
    shown = adapter.facts().to_json()
    display = {"model_dir": "/elsewhere", "hub": {"repo": "x/y"}, "tower_parameters": 1, "weights": None, "a_new_fact": "shown"}
    monkeypatch.setattr(adapter, "info", lambda: {**shown, **display})
    assert adapter.facts().to_json() != shown  # /server_info shows the change
    assert model_namespace(adapter.identity(), SETTINGS) == ns
    # The same files in another directory (another model_dir in /server_info) compute the same rows.
    copy = load_checkpoint(Path(shutil.copytree(tiny_model("qwen2_vl"), tmp_path / "copy")), ENCODER_DEVICE="cpu", ENCODER_DTYPE="float32")
    assert copy.facts().to_json()["model_dir"] != shown["model_dir"]
    assert model_namespace(copy.identity(), SETTINGS) == ns


def test_dtype_and_processor_settings_change_the_namespace(tiny_adapter, tiny_model, load_checkpoint, tmp_path):
    adapter = tiny_adapter("qwen2_vl")
    ns = model_namespace(adapter.identity(), SETTINGS)
    bf16 = load_checkpoint(tiny_model("qwen2_vl"), ENCODER_DEVICE="cpu", ENCODER_DTYPE="bfloat16")
    assert bf16.identity().dtype == "bfloat16" and model_namespace(bf16.identity(), SETTINGS) != ns
    # The processor's own settings (its config in the checkpoint): fewer pixels, fewer rows.
    changed = Path(shutil.copytree(tiny_model("qwen2_vl"), tmp_path / "fewer-pixels"))
    config = json.loads((changed / "preprocessor_config.json").read_text())
    (changed / "preprocessor_config.json").write_text(json.dumps({**config, "max_pixels": 28 * 28 * 4}))
    fewer = load_checkpoint(changed, ENCODER_DEVICE="cpu", ENCODER_DTYPE="float32")
    assert model_namespace(fewer.identity(), SETTINGS) != ns
    # The pod's processing settings the adapter does not see: how a clip is sampled into frames.
    assert model_namespace(adapter.identity(), load_settings(env={"ENCODER_VIDEO_FPS": "4"})) != ns
    assert model_namespace(adapter.identity(), load_settings(env={"ENCODER_MAX_BATCH_SIZE": "3"})) == ns  # no effect on rows
