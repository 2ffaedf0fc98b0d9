"""Per family: the inputs a test sends and what the family's own HF code says the answer is.

Vision families here, audio (and the Omni models) in :mod:`tests.integration.family_cases_audio`;
:data:`CASES` holds both. See :mod:`tests.integration.family_core` for what a check is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from tests.integration.family_cases_audio import AUDIO_CASES
from tests.integration.family_core import (
    QWEN3_REQUESTS,
    QWEN_REQUESTS,
    Case,
    Check,
    Item,
    case,
    deepstack_width,
    flat,
    full_model,
    on,
    processor_kwargs,
    qwen_placeholders,
    qwen_reference,
)
from tests.support import hf_processors

__all__ = ["CASES", "Case", "Check", "full_model"]

CASES: dict[str, Case] = {
    "qwen2_vl": case("qwen2_vl", "Qwen2VLForConditionalGeneration", "IMAGE", QWEN_REQUESTS, qwen_reference,
                     qwen_placeholders("Qwen2VLProcessor"), ("visual.",)),
    "qwen2_5_vl": case("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "IMAGE", QWEN_REQUESTS,
                       qwen_reference, qwen_placeholders("Qwen2_5_VLProcessor"), ("visual.",)),
    "qwen3_vl": case("qwen3_vl", "Qwen3VLForConditionalGeneration", "IMAGE", QWEN3_REQUESTS, qwen_reference,
                     qwen_placeholders("Qwen3VLProcessor"), ("model.visual.",), width=deepstack_width),
    "qwen3_5": case("qwen3_5", "Qwen3_5ForConditionalGeneration", "IMAGE", QWEN3_REQUESTS, qwen_reference,
                    qwen_placeholders("Qwen3VLProcessor"), ("model.visual.",), width=deepstack_width),
}


# --- LLaVA ----------------------------------------------------------------------------------------

def _llava_reference(image_processor: str, nested: bool = False) -> Callable[[Any, Path, list[list[Any]]], list[torch.Tensor]]:
    def reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
        import transformers

        processor = getattr(transformers, image_processor).from_pretrained(ckpt)
        out = processor(images=requests if nested else flat(requests), return_tensors="pt")
        kwargs = on(model, {key: out[key] for key in ("pixel_values", "image_sizes", "batch_num_images") if key in out})
        with torch.inference_mode():
            pooled = model.model.get_image_features(**kwargs).pooler_output
        return [rows.reshape(-1, rows.shape[-1]) for rows in pooled]

    return reference


def _llava_placeholders(processor_cls: str, image_processor: str) -> Callable[[Path, list[list[Any]]], list[int]]:
    def count(ckpt: Path, requests: list[list[Any]]) -> list[int]:
        import transformers

        tok = hf_processors.tokenizer(ckpt)
        cls = hf_processors.without_video(getattr(transformers, processor_cls))
        processor = cls(image_processor=getattr(transformers, image_processor).from_pretrained(ckpt), tokenizer=tok,
                        **processor_kwargs(ckpt))
        prompts = [f"USER: {'<image>' * len(r)} what is this? ASSISTANT:" for r in requests]
        out = processor(text=prompts, images=requests, return_tensors="pt", padding=True)
        return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids("<image>"))

    return count


_LLAVA_REQUESTS = [
    [Item((50, 30), 1)],
    [Item((30, 90), 2), Item((64, 64), 3)],
    [Item((20, 20), 4), Item((97, 41), 5)],
]
_OV_REQUESTS = [
    [Item((50, 30), 1)],
    [Item((30, 90), 2)],
    [Item((192, 192), 3)],  # the 6x6 pinpoint: past 9 tiles' rows, so anyres_max_9 downscales
    [Item((200, 70), 4), Item((20, 20), 5)],  # a two-image prompt: base tile + newline each
]


# --- Gemma 3, InternVL ----------------------------------------------------------------------------

def _hosted_reference(image_processor: str, **call: Any) -> Callable[[Any, Path, list[list[Any]]], list[torch.Tensor]]:
    def reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
        import transformers

        processor = getattr(transformers, image_processor).from_pretrained(ckpt)
        out = processor(images=flat(requests), return_tensors="pt", **call)
        with torch.inference_mode():
            pooled = model.model.get_image_features(pixel_values=on(model, out)["pixel_values"]).pooler_output
        tiles = out.get("num_patches", [1] * len(flat(requests)))
        per_tile = list(pooled)
        rows, start = [], 0
        for n in (int(t) for t in tiles):
            rows.append(torch.cat(per_tile[start : start + n]).reshape(-1, pooled.shape[-1]))
            start += n
        return rows

    return reference


def _gemma3_placeholders(ckpt: Path, requests: list[list[Any]]) -> list[int]:
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    tok = hf_processors.tokenizer(ckpt)
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil.from_pretrained(ckpt), tokenizer=tok,
                                **processor_kwargs(ckpt))
    prompts = ["<bos>user " + "<start_of_image>" * len(r) + " describe" for r in requests]
    out = processor(text=prompts, images=requests, return_tensors="pt", padding=True)
    # The prompt's placeholder is <start_of_image>; the language model splices at <image_soft_token>.
    return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids("<image_soft_token>"))


def _internvl_placeholders(ckpt: Path, requests: list[list[Any]]) -> list[int]:
    from transformers import GotOcr2ImageProcessorPil, InternVLProcessor

    tok = hf_processors.tokenizer(ckpt)
    processor = hf_processors.without_video(InternVLProcessor)(
        image_processor=GotOcr2ImageProcessorPil.from_pretrained(ckpt), tokenizer=tok, **processor_kwargs(ckpt)
    )
    prompts = ["<|im_start|>user\n" + "<IMG_CONTEXT>" * len(r) + "describe<|im_end|>" for r in requests]
    out = processor(text=prompts, images=flat(requests), return_tensors="pt", padding=True)
    return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids("<IMG_CONTEXT>"))


_TILED_REQUESTS = [
    [Item((50, 30), 1)],
    [Item((30, 90), 2), Item((64, 64), 3)],
    [Item((20, 20), 4), Item((130, 40), 5)],
]

CASES.update({
    "llava": case("llava", "LlavaForConditionalGeneration", "IMAGE", _LLAVA_REQUESTS,
                  _llava_reference("CLIPImageProcessorPil"), _llava_placeholders("LlavaProcessor", "CLIPImageProcessorPil"),
                  ("vision_tower.", "multi_modal_projector.")),
    "llava_next": case("llava_next", "LlavaNextForConditionalGeneration", "IMAGE", _LLAVA_REQUESTS,
                       _llava_reference("LlavaNextImageProcessorPil"),
                       _llava_placeholders("LlavaNextProcessor", "LlavaNextImageProcessorPil"),
                       ("vision_tower.", "multi_modal_projector.", "image_newline")),
    "llava_onevision": case("llava_onevision", "LlavaOnevisionForConditionalGeneration", "IMAGE", _OV_REQUESTS,
                            _llava_reference("LlavaOnevisionImageProcessorPil", nested=True),
                            _llava_placeholders("LlavaOnevisionProcessor", "LlavaOnevisionImageProcessorPil"),
                            ("vision_tower.", "multi_modal_projector.", "image_newline")),
    "gemma3": case("gemma3", "Gemma3ForConditionalGeneration", "IMAGE", _TILED_REQUESTS,
                   _hosted_reference("Gemma3ImageProcessorPil"), _gemma3_placeholders,
                   ("vision_tower.", "multi_modal_projector.")),
    "internvl": case("internvl", "InternVLForConditionalGeneration", "IMAGE", _TILED_REQUESTS,
                     _hosted_reference("GotOcr2ImageProcessorPil", crop_to_patches=True), _internvl_placeholders,
                     ("vision_tower.", "multi_modal_projector.")),
})


CASES.update(AUDIO_CASES)
