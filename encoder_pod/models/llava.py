"""LLaVA-1.5, LLaVA-NeXT and LLaVA-OneVision (llava-hf format), read out of the whole checkpoint.

Served rows are ``get_image_features(...).pooler_output`` of the family's ``...Model``, run on the
tower, projector and ``image_newline`` only (:mod:`encoder_pod.models.hosted`): the feature layer
and select strategy from the config, then ``multi_modal_projector`` (width = the language model's):

- LLaVA-1.5 (``llava-hf/llava-1.5-7b-hf``): one fixed-size image, ``(side / patch)**2`` rows
  (+1 with the ``full`` strategy).
- LLaVA-NeXT (``llava-hf/llava-v1.6-mistral-7b-hf``): anyres tiles, then *packed* as the language
  model splices them: the base tile's rows, then the unpadded tile grid with one ``image_newline``
  row per grid row. Rows per image = base + unpadded + newlines, the processor's placeholder count.
- LLaVA-OneVision (``llava-hf/llava-onevision-qwen2-7b-ov-hf``): NeXT's packing with the
  ``anyres_max_N`` downscale; an image of a prompt holding several images is its base tile
  (padded to a square) plus one newline. The pod takes the items of one request as one prompt's
  images, as SGLang's prefill side sends them.

Why an adapter, not the generic path (:mod:`~encoder_pod.models.generic`): for LLaVA-1.5 and NeXT
the generic path would compute the same rows and counts, but (1) tensor parallel shards this
adapter's CLIP or SigLIP tower (``tower``; LLaVA under ``--tp-size 2`` is tested), and the
generic path's meta model cannot be sharded; (2) rows are counted from the image size alone when
an item is decoded, where the generic path runs the processor on it; (3) NeXT and OneVision report
``[tiles, height, width]`` per item, not only the row count. OneVision's ``AutoProcessor``
needs torchvision (its video processor), so the generic path cannot open it at all; this
adapter uses the PIL image processor alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaNextConfig,
    LlavaNextImageProcessorPil,
    LlavaOnevisionConfig,
    LlavaOnevisionImageProcessorPil,
    Qwen2Config,
    SiglipVisionConfig,
)
from transformers.image_processing_utils import select_best_resolution
from transformers.models.llava.modeling_llava import LlavaForConditionalGeneration, LlavaModel
from transformers.models.llava_next.modeling_llava_next import (
    LlavaNextForConditionalGeneration,
    LlavaNextModel,
    image_size_to_num_patches,
)
from transformers.models.llava_onevision.modeling_llava_onevision import (
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionModel,
)

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
from encoder_pod.models.vision import check_preset

_TOWER = {"model.vision_tower": "vision_tower", "model.multi_modal_projector": "multi_modal_projector"}


def unpadded_grid(height: int, width: int, grid_h: int, grid_w: int) -> tuple[int, int]:
    """(rows, columns) of a ``grid_h x grid_w`` patch grid left once the padding around the image is cut."""
    if width / height > grid_w / grid_h:
        new_height = int(round(height * (grid_w / width), 7))
        return grid_h - 2 * ((grid_h - new_height) // 2), grid_w
    new_width = int(round(width * (grid_h / height), 7))
    return grid_h, grid_w - 2 * ((grid_w - new_width) // 2)


class _Llava(HostedImageAdapter):
    """The LLaVA generations: CLIP or SigLIP tower, feature layer and select strategy, projector."""

    parts = {name: path for path, name in _TOWER.items()}

    @property
    def side(self) -> int:
        """The tower's image side in pixels."""
        return int(self.config.vision_config.image_size)

    @property
    def patches_per_side(self) -> int:
        """Patches per tile side."""
        return self.side // int(self.config.vision_config.patch_size)

    @property
    def strategy(self) -> str:
        """``default`` drops the first token (CLIP's CLS), ``full`` keeps every token."""
        return str(self.config.vision_feature_select_strategy)

    @property
    def tile_rows(self) -> int:
        """Rows of one tile after the select strategy (CLIP has a CLS token, SigLIP none)."""
        cls_token = 1 if str(self.config.vision_config.model_type).startswith("clip") else 0
        return self.patches_per_side**2 + cls_token - (1 if self.strategy == "default" else 0)

    def _check(self) -> None:
        if self.strategy not in ("default", "full"):
            raise RuntimeError(f"unknown vision_feature_select_strategy {self.strategy!r} in {self.model_dir}")
        shape = self.probe_shape()[-2:]
        if shape != (self.side, self.side):
            raise RuntimeError(
                f"the image processor config in {self.model_dir} gives {shape[0]}x{shape[1]} images, "
                f"the tower takes {self.side}x{self.side}"
            )
        pinpoints = getattr(self.config, "image_grid_pinpoints", None)
        theirs = getattr(self.processor, "image_grid_pinpoints", None)
        if pinpoints is not None and [list(p) for p in theirs or []] != [list(p) for p in pinpoints]:
            raise RuntimeError(
                f"the image processor config in {self.model_dir} has image_grid_pinpoints {theirs}, "
                f"the model's config {pinpoints}"
            )


class LlavaAdapter(_Llava):
    """LLaVA-1.5 (``LlavaForConditionalGeneration``)."""

    name = "llava"
    full_classes = {"LlavaForConditionalGeneration": LlavaForConditionalGeneration}
    methods = {"get_image_features": LlavaModel.get_image_features}
    processor_cls = CLIPImageProcessorPil

    def rows(self, width: int, height: int) -> int:
        """Every image is resized and cropped to one tile."""
        return self.tile_rows


class LlavaNextAdapter(_Llava):
    """LLaVA-NeXT (``LlavaNextForConditionalGeneration``): anyres tiles, packed with image_newline."""

    name = "llava_next"
    full_classes = {"LlavaNextForConditionalGeneration": LlavaNextForConditionalGeneration}
    parts = {**_Llava.parts, "image_newline": "model.image_newline"}
    methods = {
        "get_image_features": LlavaNextModel.get_image_features,
        "pack_image_features": LlavaNextModel.pack_image_features,
    }
    processor_cls = LlavaNextImageProcessorPil

    def tiles(self, width: int, height: int) -> int:
        """Tiles of an image, the base tile included."""
        return int(image_size_to_num_patches((height, width), self.config.image_grid_pinpoints, self.side))

    def packed(self, width: int, height: int) -> tuple[int, int]:
        """(rows, columns) of the unpadded grid of an image's tiles (before any downscale)."""
        best_h, best_w = select_best_resolution([height, width], self.config.image_grid_pinpoints)
        grid_h = self.patches_per_side * (best_h // self.side)
        grid_w = self.patches_per_side * (best_w // self.side)
        return unpadded_grid(height, width, grid_h, grid_w)

    def rows(self, width: int, height: int) -> int:
        """Base tile + unpadded grid + one newline per grid row (``LlavaNextProcessor``'s count)."""
        rows, columns = self.packed(width, height)
        return self.tile_rows + rows * columns + rows

    def feature_kwargs(self, out: Mapping[str, Any], requests: Sequence[Sequence[MediaItem]]) -> dict[str, Any]:
        return {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}

    def grids(self, sizes: Sequence[tuple[int, int]], out: Mapping[str, Any]) -> list[list[int]]:
        """``[tiles, height, width]`` of the original image."""
        return [[self.tiles(w, h), h, w] for w, h in sizes]


class LlavaOnevisionAdapter(LlavaNextAdapter):
    """LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``): NeXT packing with ``anyres_max_N``."""

    name = "llava_onevision"
    full_classes = {"LlavaOnevisionForConditionalGeneration": LlavaOnevisionForConditionalGeneration}
    methods = {
        "get_image_features": LlavaOnevisionModel.get_image_features,
        "pack_image_features": LlavaOnevisionModel.pack_image_features,
    }
    processor_cls = LlavaOnevisionImageProcessorPil

    @property
    def max_tiles(self) -> int:
        """N of ``anyres_max_N``: past N tiles' worth of rows the unpadded grid is downscaled."""
        return int(str(self.config.vision_aspect_ratio).removeprefix("anyres_max_"))

    def rows(self, width: int, height: int) -> int:
        """Single-image prompt: base tile + the (downscaled) unpadded grid + one newline per grid row."""
        rows, columns = self.packed(width, height)
        ratio = math.sqrt(rows * columns / (self.max_tiles * self.patches_per_side**2))
        if ratio > 1.1:
            rows, columns = int(rows // ratio), int(columns // ratio)
        return self.tile_rows + rows * columns + rows

    def batch_rows(self, sizes: Sequence[tuple[int, int]], requests: Sequence[Sequence[MediaItem]]) -> list[int]:
        """An image of a request holding several images gets its base tile and one newline."""
        counts = [len(items) for items in requests for _ in items]
        return [self.rows(w, h) if n == 1 else self.tile_rows + 1 for (w, h), n in zip(sizes, counts)]

    def process(self, requests: Sequence[Sequence[MediaItem]]) -> Any:
        """One call, images nested per request: the processor pads multi-image prompts' images to squares."""
        nested = [[item.data if item.data.mode == "RGB" else item.data.convert("RGB") for item in items] for items in requests]
        return self.processor(images=nested, return_tensors="pt", input_data_format="channels_last")

    def feature_kwargs(self, out: Mapping[str, Any], requests: Sequence[Sequence[MediaItem]]) -> dict[str, Any]:
        batch_num_images = torch.as_tensor(out["batch_num_images"])
        return {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"], "batch_num_images": batch_num_images}


# --- tiny whole checkpoints ------------------------------------------------------------------------

_SIDE, _PATCH = 32, 8
_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
           "image_size": _SIDE, "patch_size": _PATCH}
_TEXT = {"vocab_size": VOCAB_SIZE, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}
_NEXT_PINPOINTS = [[_SIDE, 2 * _SIDE], [2 * _SIDE, _SIDE], [2 * _SIDE, 2 * _SIDE], [3 * _SIDE, _SIDE], [_SIDE, 3 * _SIDE]]
_OV_PINPOINTS = [[_SIDE * i, _SIDE * j] for i in range(1, 7) for j in range(1, 7)]
_LLAVA_TOKENS = {"image_token": "<image>"}


def _tokenizer(named: Mapping[str, str]) -> tuple[Any, dict[str, int]]:
    tokenizer = byte_tokenizer(["<s>", "</s>", "<pad>"], named, eos="</s>", pad="<pad>")
    ids = token_ids(tokenizer, ["<s>", "</s>", "<pad>", *named.values()])
    return tokenizer, ids


def _text(ids: Mapping[str, int]) -> dict[str, Any]:
    return {**_TEXT, "pad_token_id": ids["<pad>"], "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"]}


def write_full(family: str, out: Path, preset: str = "tiny") -> None:
    """A whole random LLaVA of ``family`` (CLIP or SigLIP tower, projector, tiny LM), sharded, with its files."""
    check_preset(preset)
    named = {**_LLAVA_TOKENS, "video_token": "<video>"} if family == "llava_onevision" else _LLAVA_TOKENS
    tokenizer, ids = _tokenizer(named)
    common = {"vision_feature_layer": -2, "vision_feature_select_strategy": "default", "image_token_index": ids["<image>"]}
    clip = CLIPVisionConfig(**_VISION, projection_dim=16).to_dict()
    processor_kwargs: dict[str, Any] = {"patch_size": _PATCH, "vision_feature_select_strategy": "default",
                                        "num_additional_image_tokens": 1, "image_token": "<image>"}
    if family == "llava":
        config: Any = LlavaConfig(vision_config=clip, text_config=LlamaConfig(**_text(ids)).to_dict(),
                                  image_seq_length=(_SIDE // _PATCH) ** 2, **common)
        model: Any = LlavaForConditionalGeneration(config)
        image_processor: Any = CLIPImageProcessorPil(size={"shortest_edge": _SIDE}, crop_size={"height": _SIDE, "width": _SIDE})
        processor = {"processor_class": "LlavaProcessor", **processor_kwargs}
    elif family == "llava_next":
        config = LlavaNextConfig(vision_config=clip, text_config=LlamaConfig(**_text(ids)).to_dict(),
                                 image_grid_pinpoints=_NEXT_PINPOINTS, image_seq_length=(_SIDE // _PATCH) ** 2, **common)
        model = LlavaNextForConditionalGeneration(config)
        image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": _SIDE}, crop_size={"height": _SIDE, "width": _SIDE},
                                                     image_grid_pinpoints=_NEXT_PINPOINTS)
        processor = {"processor_class": "LlavaNextProcessor", **processor_kwargs}
    else:
        siglip = SiglipVisionConfig(**_VISION, vision_use_head=False).to_dict()
        config = LlavaOnevisionConfig(
            vision_config=siglip, text_config=Qwen2Config(**_text(ids)).to_dict(), image_grid_pinpoints=_OV_PINPOINTS,
            vision_feature_layer=-1, vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
            image_token_index=ids["<image>"], video_token_index=ids["<video>"],
        )
        model = LlavaOnevisionForConditionalGeneration(config)
        image_processor = LlavaOnevisionImageProcessorPil(size={"height": _SIDE, "width": _SIDE},
                                                          image_grid_pinpoints=_OV_PINPOINTS)
        processor = {"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": (_SIDE // _PATCH) ** 2,
                     "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_9", **named}
    randomize_scaled(model, seed_of(family))
    files = {"preprocessor_config.json": image_processor_file(image_processor), "processor_config.json": processor}
    save_full(out, model, tokenizer, files)


def _code(family: str, adapter: type) -> FamilyCode:
    return FamilyCode(adapters={Layout.FULL: adapter}, write_tiny=lambda out, preset, layout: write_full(family, out, preset))


LLAVA_CODE = _code("llava", LlavaAdapter)
LLAVA_NEXT_CODE = _code("llava_next", LlavaNextAdapter)
LLAVA_ONEVISION_CODE = _code("llava_onevision", LlavaOnevisionAdapter)
