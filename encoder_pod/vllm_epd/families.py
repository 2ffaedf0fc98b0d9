"""Per family: the vLLM 0.34.0 architecture that consumes the pod's rows, and what its producer reports.

A vLLM EC producer reports, per item, the placeholder metadata its model's data parser declares
(``embedding_fields`` with role ``metadata``), so the proxy can send prefill a metadata-only
item: ``image_grid_thw`` for the Qwen vision families, ``audio_num_tokens`` for Qwen2-Audio.
Families that declare none get ``metadata: {}`` and the proxy forwards the original item (with
its uuid): the consumer sizes the placeholders with its own processor and loads the rows.

The rows themselves are the pod's: post-projector, Qwen3-VL's deepstack levels concatenated on
the last dimension, as vLLM's ``embed_multimodal`` returns them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmFamily:
    """One served family as a vLLM consumer sees it."""

    architecture: str
    """vLLM's model class (registry name) for the family's whole checkpoint."""
    image_grid: bool = False
    """Reports ``image_grid_thw`` for image items."""
    audio_tokens: bool = False
    """Reports ``audio_num_tokens`` (the item's rows) for audio items."""


VLLM_FAMILIES: dict[str, VllmFamily] = {
    "qwen2_vl": VllmFamily("Qwen2VLForConditionalGeneration", image_grid=True),
    "qwen2_5_vl": VllmFamily("Qwen2_5_VLForConditionalGeneration", image_grid=True),
    "qwen3_vl": VllmFamily("Qwen3VLForConditionalGeneration", image_grid=True),
    "qwen3_5": VllmFamily("Qwen3_5ForConditionalGeneration", image_grid=True),
    "qwen2_5_omni": VllmFamily("Qwen2_5OmniForConditionalGeneration", image_grid=True),
    "qwen3_omni": VllmFamily("Qwen3OmniMoeForConditionalGeneration", image_grid=True),
    "llava": VllmFamily("LlavaForConditionalGeneration"),
    "llava_next": VllmFamily("LlavaNextForConditionalGeneration"),
    "llava_onevision": VllmFamily("LlavaOnevisionForConditionalGeneration"),
    "gemma3": VllmFamily("Gemma3ForConditionalGeneration"),
    "internvl": VllmFamily("InternVLForConditionalGeneration"),
    "qwen2_audio": VllmFamily("Qwen2AudioForConditionalGeneration", audio_tokens=True),
}
"""Families whose rows a vLLM consumer splices in (bare CLIP/SigLIP towers and Whisper have no vLLM EPD consumer)."""


def item_metadata(family: VllmFamily, modality: str, rows: int, grid: list[int]) -> dict[str, list[int]]:
    """The ``metadata`` a vLLM producer of ``family`` reports for one item."""
    if modality == "image" and family.image_grid:
        return {"image_grid_thw": [int(n) for n in grid]}
    if modality == "audio" and family.audio_tokens:
        return {"audio_num_tokens": [rows]}
    return {}
