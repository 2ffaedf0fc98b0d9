"""Model families: discovery from config.json alone, the registry, the tiny-checkpoint entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from encoder_pod.models.families import FAMILIES, default_registry
from encoder_pod.models.family import Checkpoint, FamilyCode, FamilyRegistry, Layout, LayoutRule, ModelFamily

pytestmark = pytest.mark.unit

CONFIGS = {
    "qwen2_vl": {"model_type": "qwen2_vl_vision", "architectures": ["Qwen2VisionTransformerPretrainedModel"]},
    "qwen2_5_vl": {"model_type": "qwen2_5_vl_vision"},
    "clip": {"model_type": "clip_vision_model", "architectures": ["CLIPVisionModelWithProjection"]},
    "siglip": {"model_type": "siglip_vision_model", "architectures": ["SiglipVisionModel"]},
    "llava_next": {"model_type": "llava_next", "architectures": ["LlavaNextForConditionalGeneration"]},
    "whisper": {"model_type": "whisper", "architectures": ["WhisperEncoder"]},
    "qwen2_audio": {"model_type": "qwen2_audio_encoder", "architectures": ["Qwen2AudioEncoder"]},
}
"""One config per family (the tower layout where the family has one)."""
WHOLE = {
    "qwen2_vl": {"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"]},
    "qwen2_5_vl": {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"]},
    "qwen3_vl": {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"]},
    "qwen3_vl_moe": {"model_type": "qwen3_vl_moe", "architectures": ["Qwen3VLMoeForConditionalGeneration"]},
    "qwen3_5": {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]},
    "qwen3_5_moe": {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"]},
    "qwen2_5_omni": {"model_type": "qwen2_5_omni", "architectures": ["Qwen2_5OmniForConditionalGeneration"]},
    "qwen3_omni": {"model_type": "qwen3_omni_moe", "architectures": ["Qwen3OmniMoeForConditionalGeneration"]},
    "llava": {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"]},
    "llava_next": {"model_type": "llava_next", "architectures": ["LlavaNextForConditionalGeneration"]},
    "llava_onevision": {"model_type": "llava_onevision", "architectures": ["LlavaOnevisionForConditionalGeneration"]},
    "gemma3": {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]},
    "internvl": {"model_type": "internvl", "architectures": ["InternVLForConditionalGeneration"]},
    "qwen2_audio": {"model_type": "qwen2_audio", "architectures": ["Qwen2AudioForConditionalGeneration"]},
    "whisper": {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]},
}
"""Whole checkpoints as published (config.json's model_type and class), by the family that serves them."""
ALL_FAMILIES = sorted(set(CONFIGS) | {name.removesuffix("_moe") for name in WHOLE} | {"qwen3_omni"})


def _no_code() -> FamilyCode:
    raise AssertionError("discovery must not import a family's code")


def test_the_arch_names_of_make_tiny_model_are_the_families():
    assert default_registry().names() == ALL_FAMILIES


@pytest.mark.parametrize("kind", sorted(WHOLE))
def test_whole_checkpoints_are_found_as_full_layouts_of_their_family(kind, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(WHOLE[kind]))
    found = default_registry().discover(tmp_path)
    assert (found.family, found.layout, found.architecture) == (
        kind.removesuffix("_moe") if kind != "qwen3_omni" else kind, Layout.FULL, WHOLE[kind]["architectures"][0])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_discovery_describes_what_it_found(name, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[name]))
    found = default_registry().discover(tmp_path)
    named = CONFIGS[name].get("architectures", [None])[0]
    assert found == Checkpoint(tmp_path, name, found.layout, CONFIGS[name]["model_type"], named, {})
    assert found.layout is (Layout.FULL if name == "llava_next" else Layout.TOWER)
    assert found.family in ALL_FAMILIES
    assert found.config == CONFIGS[name]


def test_a_family_with_several_layouts_says_which_one_it_found(tmp_path):
    family = ModelFamily(
        "toy",
        [LayoutRule(Layout.TOWER, "toy_vision", ("ToyVisionModel",)), LayoutRule(Layout.FULL, "toy", ("ToyForConditionalGeneration",))],
        _no_code,
        tiny_layouts=[Layout.TOWER, Layout.FULL],
        hub_ids=["org/toy-7b"],
    )
    full = family.recognise(tmp_path, {"model_type": "toy", "architectures": ["Other", "ToyForConditionalGeneration"]})
    assert full is not None and (full.layout, full.architecture) == (Layout.FULL, "ToyForConditionalGeneration")
    tower = family.recognise(tmp_path, {"model_type": "toy_vision"})
    assert tower is not None and tower.layout is Layout.TOWER and tower.architecture is None
    assert family.recognise(tmp_path, {"model_type": "toy", "architectures": ["ToyModel"]}) is None
    assert family.tiny_layouts[0] is Layout.TOWER and family.hub_ids == ("org/toy-7b",)


def test_a_checkpoint_two_families_claim_is_refused(tmp_path):
    rule = LayoutRule(Layout.TOWER, "twin_vision", ())
    registry = FamilyRegistry([ModelFamily("a", [rule], _no_code), ModelFamily("b", [rule], _no_code)])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "twin_vision"}))
    with pytest.raises(ValueError, match="more than one encoder adapter"):
        registry.discover(tmp_path)
    with pytest.raises(ValueError, match="two families are named 'a'"):
        FamilyRegistry([ModelFamily("a", [rule], _no_code), ModelFamily("a", [rule], _no_code)])


def test_unknown_arch_and_unwritable_layout_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown arch 'gpt9'; known: clip, gemma3"):
        default_registry().get("gpt9")
    with pytest.raises(ValueError, match="clip has no tiny full checkpoint; known: tower"):
        default_registry().get("clip").write_tiny(tmp_path / "m", layout=Layout.FULL)
    with pytest.raises(ValueError, match="qwen3_vl has no tiny tower checkpoint; known: full"):
        default_registry().get("qwen3_vl").write_tiny(tmp_path / "m", layout=Layout.TOWER)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_family_serves_its_layouts_with_an_adapter_of_its_name(family, tmp_path):
    for rule in family.layouts:
        checkpoint = Checkpoint(tmp_path, family.name, rule.layout, rule.model_type, None, {})
        assert family.adapter_class(checkpoint).name == family.name


def test_discovery_imports_no_ml_stack():
    """The front, the CLI's help and fetch tools read config.json without paying for torch."""
    code = (
        "import sys, encoder_pod.models.families as f; f.default_registry(); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
