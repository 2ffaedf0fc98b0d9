"""Gemma 3 (``google/gemma-3-4b-it`` ...): SigLIP tower and ``Gemma3MultiModalProjector``, out of the whole checkpoint.

Served rows: ``Gemma3Model.get_image_features`` run on the tower and projector only: the tower's
``last_hidden_state``, average-pooled to ``mm_tokens_per_image`` rows (256 for the released
models), RMS-normed and projected to the language model's width. Every image gives
``mm_tokens_per_image`` rows, the ``<image_soft_token>`` count the processor expands each
``<start_of_image>`` to. Pan-and-scan crops (off in the released processor configs and in the
processor's own defaults) are not made: one image, one set of rows.

Why an adapter, not the generic path (:mod:`~encoder_pod.models.generic`): the generic path
prompts with the processor's ``image_token`` itself, but ``Gemma3Processor`` expands only
``<start_of_image>`` into the ``mm_tokens_per_image`` soft tokens, so it would count one
placeholder per image where the feature method gives ``mm_tokens_per_image`` rows, and its load
would refuse the checkpoint for that. Here the count is ``mm_tokens_per_image`` from the config,
known from the item alone when it is decoded. The SigLIP tower is also exposed to tensor parallel
(``tower``, a tower type ``parallel/tensor/plans.py`` splits), which the generic path's meta
model is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from transformers import Gemma3Config, Gemma3ImageProcessorPil, Gemma3TextConfig, SiglipVisionConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3ForConditionalGeneration, Gemma3Model

from encoder_pod.models.base import MediaItem
from encoder_pod.models.family import FamilyCode, Layout
from encoder_pod.models.hosted import HostedImageAdapter
from encoder_pod.models.tiny_full import (
    VOCAB_SIZE,
    byte_tokenizer,
    image_processor_file,
    randomize_scaled,
    save_full,
    seed_of,
    token_ids,
)
from encoder_pod.models.vision import check_preset, flatten


class Gemma3Adapter(HostedImageAdapter):
    """Gemma 3 (``Gemma3ForConditionalGeneration``): ``mm_tokens_per_image`` rows per image."""

    name = "gemma3"
    full_classes = {"Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration}
    parts = {"vision_tower": "model.vision_tower", "multi_modal_projector": "model.multi_modal_projector"}
    methods = {"get_image_features": Gemma3Model.get_image_features}
    processor_cls = Gemma3ImageProcessorPil

    def _check(self) -> None:
        side = int(self.config.vision_config.image_size)
        shape = self.probe_shape()[-2:]
        if shape != (side, side):
            raise RuntimeError(
                f"the image processor config in {self.model_dir} gives {shape[0]}x{shape[1]} images, the tower takes {side}x{side}"
            )

    def rows(self, width: int, height: int) -> int:
        """``mm_tokens_per_image``, whatever the image size."""
        return int(self.config.mm_tokens_per_image)

    def process(self, requests: Sequence[Sequence[MediaItem]]) -> Any:
        """One call; pan-and-scan off (one image gives one set of rows)."""
        return self.processor(
            images=flatten(requests), return_tensors="pt", input_data_format="channels_last", do_pan_and_scan=False
        )

    def feature_kwargs(self, out: Mapping[str, Any], requests: Sequence[Sequence[MediaItem]]) -> dict[str, Any]:
        return {"pixel_values": out["pixel_values"]}


_SIDE, _PATCH, _MM_TOKENS = 32, 4, 16  # 8x8 patches, average-pooled 2x2 to 4x4 = 16 rows
GEMMA3_TOKENS = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}


def write_full(out: Path, preset: str = "tiny") -> None:
    """A whole random Gemma 3 (SigLIP tower, projector, tiny LM), sharded, with tokenizer and processor files."""
    check_preset(preset)
    tokenizer = byte_tokenizer(["<bos>", "<eos>", "<pad>"], GEMMA3_TOKENS, eos="<eos>", pad="<pad>")
    ids = token_ids(tokenizer, ["<bos>", "<eos>", "<pad>", *GEMMA3_TOKENS.values()])
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                image_size=_SIDE, patch_size=_PATCH, vision_use_head=False, layer_norm_eps=1e-6)
    text = Gemma3TextConfig(vocab_size=VOCAB_SIZE, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=12, query_pre_attn_scalar=12,
                            sliding_window=64, max_position_embeddings=2048, pad_token_id=ids["<pad>"],
                            bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"])
    config = Gemma3Config(vision_config=vision.to_dict(), text_config=text.to_dict(), mm_tokens_per_image=_MM_TOKENS,
                          image_token_index=ids["<image_soft_token>"], boi_token_index=ids["<start_of_image>"],
                          eoi_token_index=ids["<end_of_image>"])
    model = Gemma3ForConditionalGeneration(config)
    randomize_scaled(model, seed_of("gemma3"))
    image_processor = Gemma3ImageProcessorPil(size={"height": _SIDE, "width": _SIDE}, do_pan_and_scan=False)
    processor = {"processor_class": "Gemma3Processor", "image_seq_length": _MM_TOKENS}
    save_full(out, model, tokenizer, {"preprocessor_config.json": image_processor_file(image_processor),
                                      "processor_config.json": processor})


GEMMA3_CODE = FamilyCode(adapters={Layout.FULL: Gemma3Adapter}, write_tiny=lambda out, preset, layout: write_full(out, preset))
