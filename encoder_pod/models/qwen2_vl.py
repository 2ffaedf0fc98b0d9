"""Qwen2-VL and Qwen2.5-VL: the vision tower saved on its own, or read out of the whole checkpoint.

Two layouts per family, one serving path (:class:`~encoder_pod.models.qwen_vision.QwenVisionAdapter`):

- TOWER: ``*VisionTransformerPretrainedModel`` saved alone, loaded with ``from_pretrained``.
- FULL: ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` as published
  (``Qwen/Qwen2-VL-7B-Instruct``, ``Qwen/Qwen2.5-VL-7B-Instruct``): only ``model.visual`` (hub keys
  ``visual.*``: patch embed, blocks, merger) is built and read; the language model never is.

Served rows: the merger's output (width = the language model's hidden size). Qwen2.5-VL's video
items carry ``second_per_grid_ts`` (temporal patch / sampled fps) for the prefill side's rope.

Why an adapter, not the generic path (:mod:`~encoder_pod.models.generic`): the TOWER layout has
no multimodal class to call; a whole checkpoint's ``AutoProcessor`` needs torchvision (its
``Qwen2VLVideoProcessor``), so the generic path cannot open it, while this adapter serves images
and VIDEO without it (:mod:`~encoder_pod.models.qwen_vision`); it reports ``[t, h, w]`` per item
(SGLang's ``grid_dim``, vLLM's ``image_grid_thw``) and ``second_per_grid_ts``; and tensor
parallel splits both towers (``parallel/tensor/plans.py``).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, ClassVar

from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLConfig, Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VisionTransformerPretrainedModel,
    Qwen2_5_VLForConditionalGeneration,
)
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLConfig, Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import (
    Qwen2VisionTransformerPretrainedModel,
    Qwen2VLForConditionalGeneration,
)

from encoder_pod.models.base import check_loading_info
from encoder_pod.models.family import FamilyCode, Layout
from encoder_pod.models.parts import FullLayout
from encoder_pod.models.qwen_vision import VIDEO_CONFIG, QwenVisionAdapter, VideoTiming, video_patches
from encoder_pod.models.tiny_full import (
    VOCAB_SIZE,
    byte_tokenizer,
    image_processor_file,
    randomize_scaled,
    save_full,
    seed_of,
    token_ids,
)
from encoder_pod.models.vision import check_preset, randomize, save_atomically
from encoder_pod.models.weights import whole_checkpoint_report

__all__ = ["VIDEO_CONFIG", "video_patches", "Qwen2VLAdapter", "Qwen25VLAdapter", "QWEN_TOKENS", "qwen_tokenizer"]

# Tiny: fast tests, yet several 28-px merge units and (for 2.5) several attention windows.
_TINY_PROCESSOR = {"min_pixels": 56 * 56, "max_pixels": 224 * 224}
# Moderate: the processor's own defaults (56*56 .. 28*28*1280 pixels), as the real models use.
_MODERATE_PROCESSOR: dict[str, Any] = {}
# Per-frame pixel bounds. Tiny: 56x56 .. 112x112, a few rows per frame pair. Moderate: the class defaults.
_VIDEO_PIXELS = {"tiny": (56 * 56, 112 * 112), "moderate": (128 * 28 * 28, 768 * 28 * 28)}

QWEN_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}
"""The Qwen-VL placeholders, as the processors read them off the tokenizer."""


def qwen_tokenizer(named: dict[str, str] | None = None) -> Any:
    """The tiny byte tokenizer with Qwen's chat and vision specials."""
    return byte_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], named or QWEN_TOKENS, eos="<|im_end|>", pad="<|endoftext|>"
    )


class _TowerLayout(QwenVisionAdapter):
    """The tower saved on its own."""

    model_cls: ClassVar[type[Any]]

    def _load_tower(self) -> Any:
        model, info = self.model_cls.from_pretrained(self.model_dir, dtype=self.dtype, output_loading_info=True)
        check_loading_info(self.model_cls.__name__, info)
        self.weights = whole_checkpoint_report(self.model_dir)
        return model.to(self.device).eval()


class WholeQwenVisual(FullLayout, QwenVisionAdapter):
    """The tower (``model.visual``) read out of a whole Qwen-VL checkpoint (every Qwen generation keeps it there)."""

    @classmethod
    def part_paths(cls, checkpoint: Any) -> tuple[str, ...]:
        return ("model.visual",)

    def _load_tower(self) -> Any:
        full = self.open_checkpoint()
        tower = full.build_like("model.visual", self.dtype)
        self.weights = full.load({"model.visual": tower})
        return tower.to(self.device).eval()


class Qwen2VLAdapter(_TowerLayout):
    """Qwen2-VL vision tower saved alone (``qwen2_vl_vision``)."""

    name = "qwen2_vl"
    model_cls = Qwen2VisionTransformerPretrainedModel


class Qwen2VLFullAdapter(WholeQwenVisual):
    """Qwen2-VL whole checkpoint (``Qwen2VLForConditionalGeneration``)."""

    name = "qwen2_vl"
    full_classes = {"Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration}


class Qwen25VLAdapter(_TowerLayout):
    """Qwen2.5-VL vision tower saved alone (``qwen2_5_vl_vision``): windowed attention, RMSNorm, SwiGLU."""

    name = "qwen2_5_vl"
    model_cls = Qwen2_5_VisionTransformerPretrainedModel
    # In 2.5, hidden_size is the tower's inner width; the merger projects to out_hidden_size.
    hidden_attr = "out_hidden_size"
    timing = VideoTiming.SECOND_PER_GRID


class Qwen25VLFullAdapter(WholeQwenVisual):
    """Qwen2.5-VL whole checkpoint (``Qwen2_5_VLForConditionalGeneration``)."""

    name = "qwen2_5_vl"
    full_classes = {"Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration}
    hidden_attr = "out_hidden_size"
    timing = VideoTiming.SECOND_PER_GRID


_TOWER_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen2_vl": {
        "tiny": {"depth": 2, "embed_dim": 64, "hidden_size": 128, "num_heads": 4, "mlp_ratio": 2},
        # 10.7M parameters: the `moderate` preset, for benchmarks.
        "moderate": {"depth": 4, "embed_dim": 384, "hidden_size": 512, "num_heads": 6, "mlp_ratio": 4},
    },
    "qwen2_5_vl": {
        # window_size 112 px = 4x4 merge units: a 224 px image spans several windows.
        "tiny": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "out_hidden_size": 128,
                 "window_size": 112, "fullatt_block_indexes": [1]},
        "moderate": {"depth": 4, "hidden_size": 384, "intermediate_size": 1024, "num_heads": 6,
                     "out_hidden_size": 512, "window_size": 112, "fullatt_block_indexes": [1, 3]},
    },
}
_TOWER_CLASSES = {
    "qwen2_vl": (Qwen2VisionTransformerPretrainedModel, Qwen2VLVisionConfig),
    "qwen2_5_vl": (Qwen2_5_VisionTransformerPretrainedModel, Qwen2_5_VLVisionConfig),
}
# The text side of the tiny whole checkpoints: mrope_section sums to head_dim / 2 (64 / 4 / 2).
_TEXT = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                                       "rope_theta": 1000000.0}}
_FULL_VISION = {
    # Merger output (hidden_size / out_hidden_size) = the language model's width, as in the real models.
    "qwen2_vl": {"depth": 2, "embed_dim": 64, "hidden_size": 64, "num_heads": 4, "mlp_ratio": 2},
    "qwen2_5_vl": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "out_hidden_size": 64,
                   "window_size": 112, "fullatt_block_indexes": [1]},
}


def processor_files(processor: Any, preset: str, family: str) -> dict[str, dict[str, Any]]:
    """``preprocessor_config.json`` and ``video_preprocessor_config.json`` as the hub's Qwen checkpoints have them."""
    low, high = _VIDEO_PIXELS[preset]
    video = {
        "video_processor_type": "Qwen2VLVideoProcessor",
        "size": {"shortest_edge": low, "longest_edge": high},
        **{key: getattr(processor, key) for key in ("patch_size", "temporal_patch_size", "merge_size")},
        **{key: list(getattr(processor, key)) for key in ("image_mean", "image_std")},
    }
    return {"preprocessor_config.json": image_processor_file(processor), VIDEO_CONFIG: video}


def write_tower(family: str, out: Path, preset: str = "tiny") -> None:
    """Seeded random tower plus a ``Qwen2VLImageProcessorPil`` config, written offline."""
    check_preset(preset)
    model_cls, config_cls = _TOWER_CLASSES[family]
    model = model_cls(config_cls(**_TOWER_PRESETS[family][preset]))
    randomize(model, seed=zlib.crc32(family.encode()))
    processor = Qwen2VLImageProcessorPil(**(_TINY_PROCESSOR if preset == "tiny" else _MODERATE_PROCESSOR))
    files = processor_files(processor, preset, family)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        (tmp / VIDEO_CONFIG).write_text(json.dumps(files[VIDEO_CONFIG], indent=2) + "\n")

    save_atomically(out, write)


def write_full(family: str, out: Path, preset: str = "tiny") -> None:
    """A whole random ``...ForConditionalGeneration`` of ``family``, sharded, with tokenizer and processor files."""
    check_preset(preset)
    tokenizer = qwen_tokenizer()
    ids = token_ids(tokenizer, ["<|endoftext|>", "<|im_end|>", *QWEN_TOKENS.values()])
    text = {**_TEXT, "vocab_size": VOCAB_SIZE, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    specials = {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
                "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}
    config_cls, model_cls = {
        "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
        "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
    }[family]
    model = model_cls(config_cls(text_config=text, vision_config=_FULL_VISION[family], **specials))
    randomize_scaled(model, seed_of(family))
    processor = Qwen2VLImageProcessorPil(**_TINY_PROCESSOR)
    save_full(out, model, tokenizer, processor_files(processor, "tiny", family))


def _code(family: str, tower: type, full: type) -> FamilyCode:
    def write_tiny(out: Path, preset: str, layout: Layout) -> None:
        (write_full if layout is Layout.FULL else write_tower)(family, out, preset)

    return FamilyCode(adapters={Layout.TOWER: tower, Layout.FULL: full}, write_tiny=write_tiny)


QWEN2_VL_CODE = _code("qwen2_vl", Qwen2VLAdapter, Qwen2VLFullAdapter)
QWEN2_5_VL_CODE = _code("qwen2_5_vl", Qwen25VLAdapter, Qwen25VLFullAdapter)
