"""CLIP / SigLIP specifics: which hidden state is served, projection checkpoints, processor fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import CLIPVisionModel, CLIPVisionModelWithProjection, SiglipVisionModel

from encoder_pod.models.clip import write_clip

pytestmark = pytest.mark.integration


def _pixels(adapter, items):
    return adapter.preprocess([items]).inputs["pixel_values"]


def test_clip_serves_penultimate_patch_tokens_without_cls(tiny_model, tiny_adapter, make_image):
    adapter = tiny_adapter("clip")
    items = [make_image(64, 48, seed=1), make_image(20, 90, seed=2)]
    # An untouched HF model: LLaVA's vision_feature_layer=-2, "default" strategy (drop CLS).
    reference = CLIPVisionModel.from_pretrained(tiny_model("clip")).eval()
    with torch.inference_mode():
        states = reference(pixel_values=_pixels(adapter, items), output_hidden_states=True).hidden_states
    expected = states[-2][:, 1:].reshape(-1, adapter.hidden_size)
    served = adapter.forward(adapter.preprocess([items]))
    torch.testing.assert_close(served, expected)
    assert adapter.measure(items[0]) == (32 // 8) ** 2 == served.shape[0] // 2
    # The last layer is never run: the served output differs from the final hidden state.
    assert not torch.allclose(states[-1][:, 1:].reshape(-1, adapter.hidden_size), served)
    assert len(adapter.tower.encoder.layers) == reference.config.num_hidden_layers - 1


def test_clip_with_projection_checkpoint_loads_its_own_class(tmp_path, load_checkpoint, make_image):
    path = tmp_path / "clip-proj"
    write_clip(path, "tiny", with_projection=True)
    assert json.loads((path / "config.json").read_text())["architectures"] == ["CLIPVisionModelWithProjection"]
    adapter = load_checkpoint(path)  # strict: the projection weight is expected, not stray
    assert isinstance(adapter.model, CLIPVisionModelWithProjection)
    items = [make_image(40, 40, seed=3)]
    reference = CLIPVisionModelWithProjection.from_pretrained(path).eval()
    with torch.inference_mode():
        states = reference(pixel_values=_pixels(adapter, items), output_hidden_states=True).hidden_states
    torch.testing.assert_close(adapter.forward(adapter.preprocess([items])), states[-2][0, 1:])


def test_siglip_serves_last_hidden_state(tiny_model, tiny_adapter, make_image):
    adapter = tiny_adapter("siglip")
    items = [make_image(64, 48, seed=1), make_image(20, 90, seed=2)]
    reference = SiglipVisionModel.from_pretrained(tiny_model("siglip")).eval()
    assert reference.use_head  # the checkpoint has a pooling head; the adapter skips it
    with torch.inference_mode():
        expected = reference(pixel_values=_pixels(adapter, items)).last_hidden_state
    served = adapter.forward(adapter.preprocess([items]))
    torch.testing.assert_close(served, expected.reshape(-1, adapter.hidden_size))
    assert adapter.measure(items[0]) == (32 // 8) ** 2


@pytest.mark.parametrize(
    ("arch", "change"),
    [
        ("clip", {"crop_size": {"height": 48, "width": 48}, "size": {"shortest_edge": 48}}),
        ("clip", {"do_center_crop": False}),  # keeps the aspect ratio: no fixed grid
        ("siglip", {"size": {"height": 40, "width": 40}}),
    ],
)
def test_processor_that_does_not_fit_the_tower_is_refused(arch, change, tiny_model, load_checkpoint, tmp_path):
    path = Path(shutil.copytree(tiny_model(arch), tmp_path / arch))
    config_path = path / "preprocessor_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **change}))
    with pytest.raises(RuntimeError, match="but the tower expects 32x32"):
        load_checkpoint(path)
