"""Per family, audio: Qwen2-Audio, Whisper, and the Omni models (their images and their audio)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from tests.integration.family_core import (
    QWEN3_REQUESTS,
    QWEN_REQUESTS,
    Case,
    Check,
    Item,
    case,
    deepstack_width,
    flat,
    on,
    qwen_reference,
)
from tests.support import hf_processors

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
    return _qwen2_audio_processor(ckpt)(text=prompts, audio=flat(requests), sampling_rate=16_000,
                                        return_tensors="pt", padding=True)


def _qwen2_audio_reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
    """Qwen2-Audio has no get_audio_features: the rows the language model receives at <|AUDIO|>, per item."""
    out = on(model, _qwen2_audio_inputs(ckpt, requests))
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
    out = on(model, _whisper_features(ckpt, flat(requests)))
    with torch.inference_mode():
        hidden = model.get_encoder()(out["input_features"]).last_hidden_state
    valid = (out["attention_mask"].sum(-1) - 1) // 2 + 1
    return [hidden[i, : int(n)] for i, n in enumerate(valid)]


def _whisper_rows(ckpt: Path, requests: list[list[Any]]) -> list[int]:
    """Whisper has no placeholders: its rows per request from the extractor's valid frames (conv stride 2)."""
    out = _whisper_features(ckpt, flat(requests))
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

AUDIO_CASES: dict[str, Case] = {
    "qwen2_audio": case("qwen2_audio", "Qwen2AudioForConditionalGeneration", "AUDIO", _AUDIO_REQUESTS,
                        _qwen2_audio_reference, _qwen2_audio_placeholders, ("audio_tower.", "multi_modal_projector.")),
    "whisper": case("whisper", "WhisperForConditionalGeneration", "AUDIO", _WHISPER_REQUESTS, _whisper_reference,
                    _whisper_rows, ("model.encoder.",), width=lambda config: int(config.d_model)),
}


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
        media = {"images": flat(requests)} if modality == "IMAGE" else {"audio": flat(requests)}
        out = processor(text=prompts, return_tensors="pt", padding=True, **media)
        return hf_processors.count(out["input_ids"], processor.tokenizer.convert_tokens_to_ids(tokens[key]))

    return count


def _omni_audio_reference(padding: str) -> Callable[[Any, Path, list[list[Any]]], list[torch.Tensor]]:
    """The thinker's own get_audio_features, on each item's features as its processor extracts a one-clip request."""

    def reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
        from transformers import WhisperFeatureExtractor

        extractor = WhisperFeatureExtractor.from_pretrained(ckpt)
        rows = []
        for wave in flat(requests):
            out = on(model, extractor([wave], sampling_rate=16_000, padding=padding, truncation=padding == "max_length",
                                      return_attention_mask=True, return_tensors="pt"))
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

AUDIO_CASES.update({
    "qwen2_5_omni": Case("qwen2_5_omni", "Qwen2_5OmniForConditionalGeneration", [
        Check("IMAGE", QWEN_REQUESTS, qwen_reference, _omni_placeholders("Qwen2_5OmniProcessor", "IMAGE", _OMNI25)),
        Check("AUDIO", _OMNI_AUDIO, _omni_audio_reference("max_length"),
              _omni_placeholders("Qwen2_5OmniProcessor", "AUDIO", _OMNI25)),
    ], ("thinker.visual.", "thinker.audio_tower.")),
    "qwen3_omni": Case("qwen3_omni", "Qwen3OmniMoeForConditionalGeneration", [
        Check("IMAGE", QWEN3_REQUESTS, qwen_reference, _omni_placeholders("Qwen3OmniMoeProcessor", "IMAGE", _OMNI3),
              width=lambda config: deepstack_width(config.thinker_config)),
        Check("AUDIO", _OMNI_AUDIO, _omni_audio_reference("longest"),
              _omni_placeholders("Qwen3OmniMoeProcessor", "AUDIO", _OMNI3),
              width=lambda config: int(config.thinker_config.audio_config.output_dim)),
    ], ("thinker.visual.", "thinker.audio_tower.")),
})
