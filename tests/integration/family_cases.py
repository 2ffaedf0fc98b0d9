"""Per family: the inputs a test sends, and what the family's own HF code says the answer is.

``reference`` runs the whole ``...ForConditionalGeneration`` (``from_pretrained`` of the same tiny
checkpoint) and returns, per item, the rows its ``get_image_features`` / ``get_audio_features``
computes: the rows its language model splices in at the item's placeholders. ``placeholders`` runs
the family's real processor on one prompt per item and counts the placeholder tokens it expands.
Neither uses any of the pod's code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image

from tests.support import hf_processors
from tests.support.media_files import audio_bytes, data_uri, tone
from tests.support.server import png_data_uri


def image(width: int, height: int, seed: int) -> Image.Image:
    """The noise image :func:`png_data_uri` encodes (PNG: lossless, so the pod decodes these pixels)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, size=(height, width, 3), dtype=np.uint8))


@dataclass(frozen=True)
class Item:
    """One media item of a test request: an image size or an audio length, and its seed."""

    size: tuple[int, int] | float
    seed: int

    def media(self, modality: str) -> Any:
        """The decoded item as the pod will see it (PIL image, or 16 kHz float32 samples)."""
        if modality == "IMAGE":
            width, height = self.size  # type: ignore[misc]
            return image(width, height, self.seed)
        return tone(float(self.size), 16_000, self.seed)  # type: ignore[arg-type]

    def uri(self, modality: str) -> str:
        """The item as the request carries it."""
        if modality == "IMAGE":
            width, height = self.size  # type: ignore[misc]
            return png_data_uri(width, height, seed=self.seed)
        return data_uri(audio_bytes(self.media(modality), 16_000), "audio/wav")


@dataclass(frozen=True)
class Check:
    """One modality of a family's proof: requests (several sizes, several items), reference rows, placeholders."""

    modality: str
    requests: Sequence[Sequence[Item]]
    reference: Callable[[Any, Path, list[list[Any]]], list[torch.Tensor]]
    """(full model, checkpoint, media per request) -> the rows of each item, in item order."""
    placeholders: Callable[[Path, list[list[Any]]], list[int]]
    """(checkpoint, media per request) -> placeholder tokens in one prompt per request holding its items."""
    width: Callable[[Any], int] = lambda config: int(config.get_text_config().hidden_size)

    def media(self) -> list[list[Any]]:
        """The decoded items, per request."""
        return [[item.media(self.modality) for item in request] for request in self.requests]


@dataclass(frozen=True)
class Case:
    """One family: its whole-model class, what of the checkpoint is the encoder, and its checks."""

    arch: str
    full_cls: str
    checks: Sequence[Check]
    tower_prefixes: tuple[str, ...]
    """Checkpoint key prefixes of tower + projector, as the hub's files name them."""
    env: dict[str, str] = field(default_factory=dict)


def case(arch: str, full_cls: str, modality: str, requests: Sequence[Sequence[Item]], reference: Any,
         placeholders: Any, tower_prefixes: tuple[str, ...], **kwargs: Any) -> Case:
    """A one-modality :class:`Case`."""
    return Case(arch, full_cls, [Check(modality, requests, reference, placeholders, **kwargs)], tower_prefixes)


@lru_cache(maxsize=4)
def full_model(full_cls: str, ckpt: Path) -> Any:
    """The whole HF model, fp32 on CPU, from the tiny checkpoint (a few are kept for the session)."""
    import transformers

    return getattr(transformers, full_cls).from_pretrained(ckpt, dtype=torch.float32).eval()


# --- Qwen vision -------------------------------------------------------------------------------

def _flat(requests: list[list[Any]]) -> list[Any]:
    return [item for request in requests for item in request]


def _qwen_reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
    from transformers import Qwen2VLImageProcessorPil

    images = _flat(requests)
    out = Qwen2VLImageProcessorPil.from_pretrained(ckpt)(images=images, return_tensors="pt")
    owner = getattr(model, "thinker", model)
    with torch.inference_mode():
        features = owner.get_image_features(out["pixel_values"], out["image_grid_thw"])
    deepstack = getattr(features, "deepstack_features", None) or []
    return [torch.cat([rows, *(layer[i] for layer in deepstack)], dim=1) for i, rows in enumerate(features.pooler_output)]


def _qwen_placeholders(processor_cls: str, token: str = "<|image_pad|>", start: str = "<|vision_start|>",
                       end: str = "<|vision_end|>") -> Callable[[Path, list[Any]], list[int]]:
    def count(ckpt: Path, requests: list[list[Any]]) -> list[int]:
        import transformers
        from transformers import Qwen2VLImageProcessorPil

        tok = hf_processors.tokenizer(ckpt)
        processor = hf_processors.without_video(getattr(transformers, processor_cls))(
            image_processor=Qwen2VLImageProcessorPil.from_pretrained(ckpt), tokenizer=tok
        )
        prompts = [f"<|im_start|>user\n{f'{start}{token}{end}' * len(r)}hi<|im_end|>" for r in requests]
        out = processor(text=prompts, images=_flat(requests), return_tensors="pt", padding=True)
        return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids(token))

    return count


_QWEN_REQUESTS = [
    [Item((56, 56), 1)],
    [Item((100, 140), 2), Item((224, 168), 3)],
    [Item((300, 200), 4), Item((90, 60), 5), Item((64, 64), 6)],
]

_QWEN3_REQUESTS = [
    [Item((64, 64), 1)],
    [Item((100, 140), 2), Item((256, 192), 3)],
    [Item((300, 200), 4), Item((90, 60), 5)],
]


def _deepstack_width(config: Any) -> int:
    vision = config.vision_config
    return int(vision.out_hidden_size) * (1 + len(getattr(vision, "deepstack_visual_indexes", None) or []))


CASES: dict[str, Case] = {
    "qwen2_vl": case("qwen2_vl", "Qwen2VLForConditionalGeneration", "IMAGE", _QWEN_REQUESTS, _qwen_reference,
                     _qwen_placeholders("Qwen2VLProcessor"), ("visual.",)),
    "qwen2_5_vl": case("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "IMAGE", _QWEN_REQUESTS,
                       _qwen_reference, _qwen_placeholders("Qwen2_5_VLProcessor"), ("visual.",)),
    "qwen3_vl": case("qwen3_vl", "Qwen3VLForConditionalGeneration", "IMAGE", _QWEN3_REQUESTS, _qwen_reference,
                     _qwen_placeholders("Qwen3VLProcessor"), ("model.visual.",), width=_deepstack_width),
    "qwen3_5": case("qwen3_5", "Qwen3_5ForConditionalGeneration", "IMAGE", _QWEN3_REQUESTS, _qwen_reference,
                    _qwen_placeholders("Qwen3VLProcessor"), ("model.visual.",), width=_deepstack_width),
}


# --- LLaVA ----------------------------------------------------------------------------------------

def _llava_reference(image_processor: str, nested: bool = False) -> Callable[[Any, Path, list[list[Any]]], list[torch.Tensor]]:
    def reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
        import transformers

        processor = getattr(transformers, image_processor).from_pretrained(ckpt)
        out = processor(images=requests if nested else _flat(requests), return_tensors="pt")
        kwargs = {key: out[key] for key in ("pixel_values", "image_sizes", "batch_num_images") if key in out}
        with torch.inference_mode():
            pooled = model.model.get_image_features(**kwargs).pooler_output
        return [rows.reshape(-1, rows.shape[-1]) for rows in pooled]

    return reference


def _processor_kwargs(ckpt: Path) -> dict[str, Any]:
    kwargs = json.loads((ckpt / "processor_config.json").read_text())
    kwargs.pop("processor_class", None)
    return kwargs


def _llava_placeholders(processor_cls: str, image_processor: str) -> Callable[[Path, list[list[Any]]], list[int]]:
    def count(ckpt: Path, requests: list[list[Any]]) -> list[int]:
        import transformers

        tok = hf_processors.tokenizer(ckpt)
        cls = hf_processors.without_video(getattr(transformers, processor_cls))
        processor = cls(image_processor=getattr(transformers, image_processor).from_pretrained(ckpt), tokenizer=tok,
                        **_processor_kwargs(ckpt))
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


# --- audio ----------------------------------------------------------------------------------------

class _CaptureLanguageModelInputs:
    """What the language model receives: ``inputs_embeds`` recorded by a pre-forward hook on it."""

    def __init__(self, language_model: Any) -> None:
        self.language_model, self.calls = language_model, []

    def __enter__(self) -> "_CaptureLanguageModelInputs":
        def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            self.calls.append(kwargs.get("inputs_embeds"))

        self.handle = self.language_model.register_forward_pre_hook(hook, with_kwargs=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def _qwen2_audio_processor(ckpt: Path) -> Any:
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    return Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor.from_pretrained(ckpt),
                               tokenizer=hf_processors.tokenizer(ckpt))


def _qwen2_audio_inputs(ckpt: Path, requests: list[list[Any]]) -> Any:
    prompts = ["<|im_start|>user\n" + "<|audio_bos|><|AUDIO|><|audio_eos|>" * len(r) + "hi<|im_end|>" for r in requests]
    return _qwen2_audio_processor(ckpt)(text=prompts, audio=_flat(requests), sampling_rate=16_000,
                                        return_tensors="pt", padding=True)


def _qwen2_audio_reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
    """Qwen2-Audio has no get_audio_features: the rows the language model receives at <|AUDIO|>, per item."""
    out = _qwen2_audio_inputs(ckpt, requests)
    with _CaptureLanguageModelInputs(model.model.language_model) as captured, torch.inference_mode():
        model(**out)
    token = model.config.audio_token_id
    spliced = captured.calls[0][out["input_ids"] == token]
    lengths = model.model.audio_tower._get_feat_extract_output_lengths(out["feature_attention_mask"].sum(-1))[1]
    return list(torch.split(spliced, lengths.tolist()))


def _qwen2_audio_placeholders(ckpt: Path, requests: list[list[Any]]) -> list[int]:
    out = _qwen2_audio_inputs(ckpt, requests)
    return hf_processors.count(out["input_ids"], hf_processors.tokenizer(ckpt).convert_tokens_to_ids("<|AUDIO|>"))


def _whisper_features(ckpt: Path, waves: list[Any]) -> Any:
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor.from_pretrained(ckpt)(waves, sampling_rate=16_000, return_attention_mask=True,
                                                         return_tensors="pt")


def _whisper_reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
    """The encoder's rows over each item's valid mel frames (the decoder of a pipeline pads its own)."""
    out = _whisper_features(ckpt, _flat(requests))
    with torch.inference_mode():
        hidden = model.get_encoder()(out["input_features"]).last_hidden_state
    valid = (out["attention_mask"].sum(-1) - 1) // 2 + 1
    return [hidden[i, : int(n)] for i, n in enumerate(valid)]


def _whisper_rows(ckpt: Path, requests: list[list[Any]]) -> list[int]:
    """Whisper has no placeholders: its rows per request from the extractor's valid frames (conv stride 2)."""
    out = _whisper_features(ckpt, _flat(requests))
    rows = ((out["attention_mask"].sum(-1) - 1) // 2 + 1).tolist()
    grouped, start = [], 0
    for request in requests:
        grouped.append(sum(rows[start : start + len(request)]))
        start += len(request)
    return grouped


_AUDIO_REQUESTS = [
    [Item(1.0, 1)],
    [Item(2.5, 2), Item(0.4, 3)],
    [Item(31.0, 4), Item(3.0, 5)],  # Qwen2-Audio's processor keeps the first 30 s
]
_WHISPER_REQUESTS = [[Item(1.0, 1)], [Item(2.5, 2), Item(0.4, 3)], [Item(12.5, 4)]]

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
    "qwen2_audio": case("qwen2_audio", "Qwen2AudioForConditionalGeneration", "AUDIO", _AUDIO_REQUESTS,
                        _qwen2_audio_reference, _qwen2_audio_placeholders, ("audio_tower.", "multi_modal_projector.")),
    "whisper": case("whisper", "WhisperForConditionalGeneration", "AUDIO", _WHISPER_REQUESTS, _whisper_reference,
                    _whisper_rows, ("model.encoder.",), width=lambda config: int(config.d_model)),
})


# --- Gemma 3, InternVL ----------------------------------------------------------------------------

def _hosted_reference(image_processor: str, **call: Any) -> Callable[[Any, Path, list[list[Any]]], list[torch.Tensor]]:
    def reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
        import transformers

        processor = getattr(transformers, image_processor).from_pretrained(ckpt)
        out = processor(images=_flat(requests), return_tensors="pt", **call)
        with torch.inference_mode():
            pooled = model.model.get_image_features(pixel_values=out["pixel_values"]).pooler_output
        tiles = out.get("num_patches", [1] * len(_flat(requests)))
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
                                **_processor_kwargs(ckpt))
    prompts = ["<bos>user " + "<start_of_image>" * len(r) + " describe" for r in requests]
    out = processor(text=prompts, images=requests, return_tensors="pt", padding=True)
    # The prompt's placeholder is <start_of_image>; the language model splices at <image_soft_token>.
    return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids("<image_soft_token>"))


def _internvl_placeholders(ckpt: Path, requests: list[list[Any]]) -> list[int]:
    from transformers import GotOcr2ImageProcessorPil, InternVLProcessor

    tok = hf_processors.tokenizer(ckpt)
    processor = hf_processors.without_video(InternVLProcessor)(
        image_processor=GotOcr2ImageProcessorPil.from_pretrained(ckpt), tokenizer=tok, **_processor_kwargs(ckpt)
    )
    prompts = ["<|im_start|>user\n" + "<IMG_CONTEXT>" * len(r) + "describe<|im_end|>" for r in requests]
    out = processor(text=prompts, images=_flat(requests), return_tensors="pt", padding=True)
    return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids("<IMG_CONTEXT>"))


_TILED_REQUESTS = [
    [Item((50, 30), 1)],
    [Item((30, 90), 2), Item((64, 64), 3)],
    [Item((20, 20), 4), Item((130, 40), 5)],
]

CASES.update({
    "gemma3": case("gemma3", "Gemma3ForConditionalGeneration", "IMAGE", _TILED_REQUESTS,
                   _hosted_reference("Gemma3ImageProcessorPil"), _gemma3_placeholders,
                   ("vision_tower.", "multi_modal_projector.")),
    "internvl": case("internvl", "InternVLForConditionalGeneration", "IMAGE", _TILED_REQUESTS,
                     _hosted_reference("GotOcr2ImageProcessorPil", crop_to_patches=True), _internvl_placeholders,
                     ("vision_tower.", "multi_modal_projector.")),
})


# --- Qwen2.5-Omni, Qwen3-Omni -------------------------------------------------------------------

def _omni_processor(ckpt: Path, processor_cls: str) -> Any:
    import transformers
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    return hf_processors.without_video(getattr(transformers, processor_cls))(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(ckpt),
        feature_extractor=WhisperFeatureExtractor.from_pretrained(ckpt),
        tokenizer=hf_processors.tokenizer(ckpt),
    )


def _omni_placeholders(processor_cls: str, modality: str, tokens: dict[str, str]) -> Callable[[Path, list[list[Any]]], list[int]]:
    def count(ckpt: Path, requests: list[list[Any]]) -> list[int]:
        processor = _omni_processor(ckpt, processor_cls)
        key = "image" if modality == "IMAGE" else "audio"
        piece = f"{tokens[key + '_bos']}{tokens[key]}{tokens[key + '_eos']}"
        prompts = ["<|im_start|>user\n" + piece * len(r) + "hi<|im_end|>" for r in requests]
        media = {"images": _flat(requests)} if modality == "IMAGE" else {"audio": _flat(requests)}
        out = processor(text=prompts, return_tensors="pt", padding=True, **media)
        return hf_processors.count(out["input_ids"], processor.tokenizer.convert_tokens_to_ids(tokens[key]))

    return count


def _omni_audio_reference(padding: str) -> Callable[[Any, Path, list[list[Any]]], list[torch.Tensor]]:
    """The thinker's own get_audio_features, on each item's features as its processor extracts a one-clip request."""

    def reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
        from transformers import WhisperFeatureExtractor

        extractor = WhisperFeatureExtractor.from_pretrained(ckpt)
        rows = []
        for wave in _flat(requests):
            out = extractor([wave], sampling_rate=16_000, padding=padding, truncation=padding == "max_length",
                            return_attention_mask=True, return_tensors="pt")
            with torch.inference_mode():
                rows.append(model.thinker.get_audio_features(out["input_features"], out["attention_mask"]).last_hidden_state)
        return rows

    return reference


_OMNI25 = {"image": "<|IMAGE|>", "image_bos": "<|vision_bos|>", "image_eos": "<|vision_eos|>",
           "audio": "<|AUDIO|>", "audio_bos": "<|audio_bos|>", "audio_eos": "<|audio_eos|>"}
_OMNI3 = {"image": "<|image_pad|>", "image_bos": "<|vision_start|>", "image_eos": "<|vision_end|>",
          "audio": "<|audio_pad|>", "audio_bos": "<|audio_start|>", "audio_eos": "<|audio_end|>"}
# Lengths of whole 10 ms hops; 0.4 s and 0.7 s are shorter than Qwen3-Omni's 1 s audio chunk.
_OMNI_AUDIO = [[Item(1.0, 1)], [Item(2.5, 2), Item(0.4, 3)], [Item(0.7, 4)], [Item(4.3, 5)]]

CASES.update({
    "qwen2_5_omni": Case("qwen2_5_omni", "Qwen2_5OmniForConditionalGeneration", [
        Check("IMAGE", _QWEN_REQUESTS, _qwen_reference, _omni_placeholders("Qwen2_5OmniProcessor", "IMAGE", _OMNI25)),
        Check("AUDIO", _OMNI_AUDIO, _omni_audio_reference("max_length"),
              _omni_placeholders("Qwen2_5OmniProcessor", "AUDIO", _OMNI25)),
    ], ("thinker.visual.", "thinker.audio_tower.")),
    "qwen3_omni": Case("qwen3_omni", "Qwen3OmniMoeForConditionalGeneration", [
        Check("IMAGE", _QWEN3_REQUESTS, _qwen_reference, _omni_placeholders("Qwen3OmniMoeProcessor", "IMAGE", _OMNI3),
              width=lambda config: _deepstack_width(config.thinker_config)),
        Check("AUDIO", _OMNI_AUDIO, _omni_audio_reference("longest"),
              _omni_placeholders("Qwen3OmniMoeProcessor", "AUDIO", _OMNI3),
              width=lambda config: int(config.thinker_config.audio_config.output_dim)),
    ], ("thinker.visual.", "thinker.audio_tower.")),
})
