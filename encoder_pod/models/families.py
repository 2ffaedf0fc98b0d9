"""The families this build serves, and the registry over them (no torch at import).

To add a family: a :class:`~encoder_pod.models.family.ModelFamily` here with its layouts, and a
loader of its :class:`~encoder_pod.models.family.FamilyCode` (the adapter classes per layout and
the tiny-checkpoint writer), which imports the family's module only when called.
"""

from __future__ import annotations

from encoder_pod.models.family import FamilyCode, FamilyRegistry, Layout, LayoutRule, ModelFamily


def _qwen2_vl() -> FamilyCode:
    from encoder_pod.models.qwen2_vl import QWEN2_VL_CODE

    return QWEN2_VL_CODE


def _qwen2_5_vl() -> FamilyCode:
    from encoder_pod.models.qwen2_vl import QWEN2_5_VL_CODE

    return QWEN2_5_VL_CODE


def _qwen3_vl() -> FamilyCode:
    from encoder_pod.models.qwen3_vl import QWEN3_VL_CODE

    return QWEN3_VL_CODE


def _qwen3_5() -> FamilyCode:
    from encoder_pod.models.qwen3_vl import QWEN3_5_CODE

    return QWEN3_5_CODE


def _qwen2_5_omni() -> FamilyCode:
    from encoder_pod.models.qwen_omni_tiny import QWEN2_5_OMNI_CODE

    return QWEN2_5_OMNI_CODE


def _qwen3_omni() -> FamilyCode:
    from encoder_pod.models.qwen_omni_tiny import QWEN3_OMNI_CODE

    return QWEN3_OMNI_CODE


def _clip() -> FamilyCode:
    from encoder_pod.models.clip import CLIP_CODE

    return CLIP_CODE


def _siglip() -> FamilyCode:
    from encoder_pod.models.clip import SIGLIP_CODE

    return SIGLIP_CODE


def _llava() -> FamilyCode:
    from encoder_pod.models.llava import LLAVA_CODE

    return LLAVA_CODE


def _llava_next() -> FamilyCode:
    from encoder_pod.models.llava import LLAVA_NEXT_CODE

    return LLAVA_NEXT_CODE


def _llava_onevision() -> FamilyCode:
    from encoder_pod.models.llava import LLAVA_ONEVISION_CODE

    return LLAVA_ONEVISION_CODE


def _gemma3() -> FamilyCode:
    from encoder_pod.models.gemma3 import GEMMA3_CODE

    return GEMMA3_CODE


def _internvl() -> FamilyCode:
    from encoder_pod.models.internvl import INTERNVL_CODE

    return INTERNVL_CODE


def _whisper() -> FamilyCode:
    from encoder_pod.models.whisper import WHISPER_CODE

    return WHISPER_CODE


def _qwen2_audio() -> FamilyCode:
    from encoder_pod.models.whisper import QWEN2_AUDIO_CODE

    return QWEN2_AUDIO_CODE


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily(
        "qwen2_vl",
        [
            LayoutRule(Layout.TOWER, "qwen2_vl_vision", ("Qwen2VisionTransformerPretrainedModel",)),
            LayoutRule(Layout.FULL, "qwen2_vl", ("Qwen2VLForConditionalGeneration",)),
        ],
        _qwen2_vl,
        tiny_layouts=[Layout.TOWER, Layout.FULL],
        hub_ids=["Qwen/Qwen2-VL-2B-Instruct", "Qwen/Qwen2-VL-7B-Instruct", "Qwen/Qwen2-VL-72B-Instruct"],
    ),
    ModelFamily(
        "qwen2_5_vl",
        [
            LayoutRule(Layout.TOWER, "qwen2_5_vl_vision", ("Qwen2_5_VisionTransformerPretrainedModel",)),
            LayoutRule(Layout.FULL, "qwen2_5_vl", ("Qwen2_5_VLForConditionalGeneration",)),
        ],
        _qwen2_5_vl,
        tiny_layouts=[Layout.TOWER, Layout.FULL],
        hub_ids=["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-72B-Instruct"],
    ),
    ModelFamily(
        "qwen3_vl",
        [
            LayoutRule(Layout.FULL, "qwen3_vl", ("Qwen3VLForConditionalGeneration",)),
            LayoutRule(Layout.FULL, "qwen3_vl_moe", ("Qwen3VLMoeForConditionalGeneration",)),
        ],
        _qwen3_vl,
        hub_ids=["Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen/Qwen3-VL-235B-A22B-Instruct"],
    ),
    ModelFamily(
        "qwen3_5",
        [
            LayoutRule(Layout.FULL, "qwen3_5", ("Qwen3_5ForConditionalGeneration",)),
            LayoutRule(Layout.FULL, "qwen3_5_moe", ("Qwen3_5MoeForConditionalGeneration",)),
        ],
        _qwen3_5,
        hub_ids=["Qwen/Qwen3.5-9B", "Qwen/Qwen3.5-35B-A3B"],
    ),
    ModelFamily(
        "qwen2_5_omni",
        [LayoutRule(Layout.FULL, "qwen2_5_omni", ("Qwen2_5OmniForConditionalGeneration",))],
        _qwen2_5_omni,
        hub_ids=["Qwen/Qwen2.5-Omni-7B", "Qwen/Qwen2.5-Omni-3B"],
    ),
    ModelFamily(
        "qwen3_omni",
        [LayoutRule(Layout.FULL, "qwen3_omni_moe", ("Qwen3OmniMoeForConditionalGeneration",))],
        _qwen3_omni,
        hub_ids=["Qwen/Qwen3-Omni-30B-A3B-Instruct"],
    ),
    ModelFamily(
        "clip",
        [LayoutRule(Layout.TOWER, "clip_vision_model", ("CLIPVisionModel", "CLIPVisionModelWithProjection"))],
        _clip,
    ),
    ModelFamily("siglip", [LayoutRule(Layout.TOWER, "siglip_vision_model", ("SiglipVisionModel",))], _siglip),
    ModelFamily(
        "llava",
        [LayoutRule(Layout.FULL, "llava", ("LlavaForConditionalGeneration",))],
        _llava,
        hub_ids=["llava-hf/llava-1.5-7b-hf", "llava-hf/llava-1.5-13b-hf"],
    ),
    ModelFamily(
        "llava_next",
        [LayoutRule(Layout.FULL, "llava_next", ("LlavaNextForConditionalGeneration",))],
        _llava_next,
        hub_ids=["llava-hf/llava-v1.6-mistral-7b-hf", "llava-hf/llava-v1.6-vicuna-7b-hf"],
    ),
    ModelFamily(
        "llava_onevision",
        [LayoutRule(Layout.FULL, "llava_onevision", ("LlavaOnevisionForConditionalGeneration",))],
        _llava_onevision,
        hub_ids=["llava-hf/llava-onevision-qwen2-7b-ov-hf", "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"],
    ),
    ModelFamily(
        "gemma3",
        [LayoutRule(Layout.FULL, "gemma3", ("Gemma3ForConditionalGeneration",))],
        _gemma3,
        hub_ids=["google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it"],
    ),
    ModelFamily(
        "internvl",
        [LayoutRule(Layout.FULL, "internvl", ("InternVLForConditionalGeneration",))],
        _internvl,
        hub_ids=["OpenGVLab/InternVL3-1B-hf", "OpenGVLab/InternVL3-8B-hf"],
    ),
    ModelFamily(
        "whisper",
        [
            LayoutRule(Layout.TOWER, "whisper", ("WhisperEncoder",)),
            LayoutRule(Layout.FULL, "whisper", ("WhisperForConditionalGeneration",)),
        ],
        _whisper,
        tiny_layouts=[Layout.TOWER, Layout.FULL],
        hub_ids=["openai/whisper-large-v3", "openai/whisper-small"],
    ),
    ModelFamily(
        "qwen2_audio",
        [
            LayoutRule(Layout.TOWER, "qwen2_audio_encoder", ("Qwen2AudioEncoder",)),
            LayoutRule(Layout.FULL, "qwen2_audio", ("Qwen2AudioForConditionalGeneration",)),
        ],
        _qwen2_audio,
        tiny_layouts=[Layout.TOWER, Layout.FULL],
        hub_ids=["Qwen/Qwen2-Audio-7B-Instruct", "Qwen/Qwen2-Audio-7B"],
    ),
)
"""Every family of this build (an immutable table)."""


def default_registry() -> FamilyRegistry:
    """A registry over :data:`FAMILIES`."""
    return FamilyRegistry(FAMILIES)
