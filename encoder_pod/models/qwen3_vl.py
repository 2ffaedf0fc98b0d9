"""Qwen3-VL (and its MoE sibling) and Qwen3.5 (and MoE): the vision tower read out of the whole checkpoint.

- Qwen3-VL (``Qwen/Qwen3-VL-8B-Instruct``, ``Qwen/Qwen3-VL-30B-A3B-Instruct``): ``model.visual``
  with its deepstack mergers. Served rows are SGLang's layout, one row per token
  ``[merger | deepstack_0 | ... ]`` along the hidden axis (width = LM hidden x (1 + deepstack
  layers)); the prefill side splits it back (``[:, :hidden]`` is spliced at the placeholders,
  block k is added after decoder layer k).
- Qwen3.5 (``Qwen3_5ForConditionalGeneration``, ``Qwen3_5MoeForConditionalGeneration``): the same
  tower without deepstack (transformers 5.23 builds none for it), so the rows are the merger's.

Both: patch 16, merge 2; video size bounds over the whole clip (``Qwen3VLVideoProcessor``), and
``video_timestamps`` per video item (seconds per temporal grid) for the prefill side's prompt.

Why an adapter, not the generic path (:mod:`~encoder_pod.models.generic`): Qwen3-VL's rows in
SGLang's deepstack layout (the generic path takes ``get_image_features``' ``pooler_output``
alone, which drops the deepstack features); for both, VIDEO without torchvision, which the checkpoints' ``AutoProcessor``
(``Qwen3VLVideoProcessor``) needs, so the generic path cannot open them; and ``[t, h, w]`` grids
and ``video_timestamps`` per item for the prefill side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForConditionalGeneration
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLForConditionalGeneration
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeForConditionalGeneration

from encoder_pod.models.family import FamilyCode, Layout
from encoder_pod.models.parts import FullLayout
from encoder_pod.models.qwen2_vl import QWEN_TOKENS, WholeQwenVisual, qwen_tokenizer
from encoder_pod.models.qwen_vision import VIDEO_CONFIG, QwenVisionAdapter, VideoTiming
from encoder_pod.models.tiny_full import VOCAB_SIZE, image_processor_file, randomize_scaled, save_full, seed_of, token_ids
from encoder_pod.models.vision import check_preset


class _Qwen3Vision(WholeQwenVisual):
    """``model.visual`` of a Qwen3-generation checkpoint."""

    clip_bounds = True
    timing = VideoTiming.TIMESTAMPS
    default_video_pixels = (128 * 32 * 32, 768 * 32 * 32)
    hidden_attr = "out_hidden_size"


class Qwen3VLAdapter(_Qwen3Vision):
    """Qwen3-VL / Qwen3-VL-MoE: merger rows with the deepstack features concatenated (SGLang's layout)."""

    name = "qwen3_vl"
    full_classes = {
        "Qwen3VLForConditionalGeneration": Qwen3VLForConditionalGeneration,
        "Qwen3VLMoeForConditionalGeneration": Qwen3VLMoeForConditionalGeneration,
    }


class Qwen35Adapter(_Qwen3Vision):
    """Qwen3.5 / Qwen3.5-MoE: merger rows (no deepstack in this tower)."""

    name = "qwen3_5"
    full_classes = {
        "Qwen3_5ForConditionalGeneration": Qwen3_5ForConditionalGeneration,
        "Qwen3_5MoeForConditionalGeneration": Qwen3_5MoeForConditionalGeneration,
    }


# Tiny sizes (transformers' own constraints): mrope_section sums to the rotary half-width, the
# learned position grid is square, deepstack layers are at most the LM's layers.
_QWEN3_VL_TEXT = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 16,
                  "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True,
                                      "rope_theta": 5000000.0}}
_QWEN3_VL_VISION = {"depth": 3, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "out_hidden_size": 64,
                    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                    "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1]}
_QWEN3_5_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 32, "layer_types": ["linear_attention", "full_attention"],
                 "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                 "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                 "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                                     "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}}
_QWEN3_5_VISION = {key: value for key, value in _QWEN3_VL_VISION.items() if key != "deepstack_visual_indexes"}
_IMAGE = {"min_pixels": 64 * 64, "max_pixels": 256 * 256, "patch_size": 16, "merge_size": 2,
          "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
# Whole-clip bounds (t_bar * h * w) of the tiny video processor.
_VIDEO = {"video_processor_type": "Qwen3VLVideoProcessor", "size": {"shortest_edge": 64 * 64, "longest_edge": 4 * 128 * 128},
          "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
          "image_std": [0.5, 0.5, 0.5], "fps": 2.0}


def write_full(family: str, out: Path, preset: str = "tiny") -> None:
    """A whole random Qwen3-VL or Qwen3.5, sharded, with tokenizer and processor files."""
    check_preset(preset)
    tokenizer = qwen_tokenizer()
    ids = token_ids(tokenizer, ["<|endoftext|>", "<|im_end|>", *QWEN_TOKENS.values()])
    text_sizes, vision, config_cls, model_cls = {
        "qwen3_vl": (_QWEN3_VL_TEXT, _QWEN3_VL_VISION, Qwen3VLConfig, Qwen3VLForConditionalGeneration),
        "qwen3_5": (_QWEN3_5_TEXT, _QWEN3_5_VISION, Qwen3_5Config, Qwen3_5ForConditionalGeneration),
    }[family]
    text = {**text_sizes, "vocab_size": VOCAB_SIZE, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    config = config_cls(
        text_config=text, vision_config=dict(vision), image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    model = model_cls(config)
    randomize_scaled(model, seed_of(family))
    files = {"preprocessor_config.json": image_processor_file(Qwen2VLImageProcessorPil(**_IMAGE)), VIDEO_CONFIG: _VIDEO}
    save_full(out, model, tokenizer, files)


def _code(family: str, adapter: type) -> FamilyCode:
    return FamilyCode(adapters={Layout.FULL: adapter}, write_tiny=lambda out, preset, layout: write_full(family, out, preset))


QWEN3_VL_CODE = _code("qwen3_vl", Qwen3VLAdapter)
QWEN3_5_CODE = _code("qwen3_5", Qwen35Adapter)
