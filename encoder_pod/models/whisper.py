"""Whisper's encoder and Qwen2-Audio's audio tower, with ``WhisperFeatureExtractor``; each saved alone or whole.

Rows per window of ``L`` valid mel frames:

- Whisper: the stride-2 conv gives ``(L - 1) // 2 + 1`` rows (1500 for a full 30 s window). The
  encoder attends over the whole padded window (it has no mask), as Whisper was trained; longer
  audio is cut into consecutive 30 s windows. A whole ``WhisperForConditionalGeneration``
  (``openai/whisper-large-v3``) is served by reading ``model.encoder`` only, never the decoder.
- Qwen2-Audio: conv then a stride-2 average pool: ``((L - 1) // 2 + 1 - 2) // 2 + 1`` rows (750
  per 30 s), the tower's own ``_get_feat_extract_output_lengths``; padded frames are masked out of
  attention exactly as ``Qwen2AudioForConditionalGeneration`` masks them. Audio past 30 s is
  dropped, as ``Qwen2AudioProcessor`` drops it (its feature extractor truncates). The tower saved
  alone serves the tower's rows; a whole ``Qwen2AudioForConditionalGeneration``
  (``Qwen/Qwen2-Audio-7B-Instruct``) serves them through its ``multi_modal_projector``: rows of the
  language model's width, exactly what it splices in at ``<|AUDIO|>``.

Why an adapter, not the generic path (:mod:`~encoder_pod.models.generic`): neither class has a
feature method in transformers 5.23 (Whisper's rows are its encoder's, Qwen2-Audio's what its
language model receives at ``<|AUDIO|>``), the generic path serves images only, and what is
served depends on audio windows: 30 s windows and their valid rows, consecutive windows for
Whisper, masked padding and the 30 s cut for Qwen2-Audio; each family also comes as a tower
saved alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2AudioConfig, Qwen2Config, WhisperFeatureExtractor
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.qwen2_audio.configuration_qwen2_audio import Qwen2AudioEncoderConfig
from transformers.models.qwen2_audio.modeling_qwen2_audio import (
    Qwen2AudioEncoder,
    Qwen2AudioForConditionalGeneration,
)
from transformers.models.whisper.configuration_whisper import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder, WhisperForConditionalGeneration

from encoder_pod.models.audio import DEFAULT_SAMPLE_RATE, AudioAdapter, write_tiny
from encoder_pod.models.family import FamilyCode, Layout
from encoder_pod.models.parts import FullLayout
from encoder_pod.models.tiny_full import VOCAB_SIZE, byte_tokenizer, randomize_scaled, save_full, seed_of, token_ids
from encoder_pod.models.vision import check_preset

_TINY = {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128, "num_mel_bins": 80}
# whisper-tiny's encoder sizes (384 wide, 4 layers, 6 heads): 8M parameters.
_MODERATE = {"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536, "num_mel_bins": 80}


class WhisperAdapter(AudioAdapter):
    """Whisper encoder (``WhisperEncoder`` saved alone, model_type ``whisper``)."""

    name = "whisper"
    model_cls = WhisperEncoder
    config_cls = WhisperConfig
    # The decoder sizes are irrelevant to a saved encoder but must be valid for the config.
    presets = {
        "tiny": {**_TINY, "decoder_layers": 1, "decoder_attention_heads": 4, "decoder_ffn_dim": 128},
        "moderate": {**_MODERATE, "decoder_layers": 1, "decoder_attention_heads": 6, "decoder_ffn_dim": 1536},
    }

    @staticmethod
    def rows_for_frames(frames: int) -> int:
        """conv2 (kernel 3, stride 2, padding 1) output frames covering the valid input."""
        return (frames - 1) // 2 + 1 if frames > 0 else 0

    def _encode(self, features: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        return self.model(features).last_hidden_state


class WhisperFullAdapter(FullLayout, WhisperAdapter):
    """A whole Whisper (``WhisperForConditionalGeneration``): its encoder only."""

    full_classes = {"WhisperForConditionalGeneration": WhisperForConditionalGeneration}

    @classmethod
    def part_paths(cls, checkpoint: Any) -> tuple[str, ...]:
        return ("model.encoder",)

    def _load_model(self) -> Any:
        full = self.open_checkpoint()
        encoder = full.build_like("model.encoder", self.dtype)
        self.weights = full.load({"model.encoder": encoder})
        return encoder.to(self.device).eval()


class Qwen2AudioAdapter(AudioAdapter):
    """Qwen2-Audio audio tower (``Qwen2AudioEncoder`` saved alone, model_type ``qwen2_audio_encoder``)."""

    name = "qwen2_audio"
    model_cls = Qwen2AudioEncoder
    config_cls = Qwen2AudioEncoderConfig
    presets = {"tiny": _TINY, "moderate": _MODERATE}
    max_windows = 1

    @staticmethod
    def rows_for_frames(frames: int) -> int:
        """``Qwen2AudioEncoder._get_feat_extract_output_lengths``: conv stride 2, then pool stride 2."""
        if frames <= 0:
            return 0
        conv = (frames - 1) // 2 + 1
        return max((conv - 2) // 2 + 1, 0)

    def _encode(self, features: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        # As Qwen2AudioModel.forward: conv frames past each window's audio are masked out.
        conv_frames = (frames - 1) // 2 + 1
        width = (features.shape[-1] - 2) // 2 + 1
        valid = torch.arange(width, device=features.device)[None, :] < conv_frames[:, None]
        mask = create_bidirectional_mask(
            config=self.model.config,
            inputs_embeds=torch.zeros((features.shape[0], width, 1), dtype=features.dtype, device=features.device),
            attention_mask=valid.long(),
        )
        return self.model(features, attention_mask=mask).last_hidden_state


class Qwen2AudioFullAdapter(FullLayout, Qwen2AudioAdapter):
    """A whole Qwen2-Audio: tower and ``multi_modal_projector`` (rows of the language model's width)."""

    full_classes = {"Qwen2AudioForConditionalGeneration": Qwen2AudioForConditionalGeneration}
    projector: Any

    @classmethod
    def part_paths(cls, checkpoint: Any) -> tuple[str, ...]:
        return ("model.audio_tower", "model.multi_modal_projector")

    def _load_model(self) -> Any:
        full = self.open_checkpoint()
        parts = {path: full.build_like(path, self.dtype) for path in self.part_paths(self.checkpoint)}
        self.weights = full.load(parts)
        self.projector = parts["model.multi_modal_projector"].to(self.device).eval()
        self.text_width = int(full.config.text_config.hidden_size)
        return parts["model.audio_tower"].to(self.device).eval()

    def _encode(self, features: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        return self.projector(super()._encode(features, frames))

    def encoder_modules(self) -> list[Any]:
        """Tower and projector."""
        return [self.model, self.projector]

    @property
    def hidden_size(self) -> int:
        """The language model's width (the projector's output)."""
        return self.text_width


def write_full_whisper(out: Path, preset: str = "tiny") -> None:
    """A whole random ``WhisperForConditionalGeneration`` (tiny decoder), sharded, with tokenizer and extractor."""
    check_preset(preset)
    tokenizer = byte_tokenizer(["<|startoftranscript|>"], {}, eos="<|endoftext|>", pad="<|endoftext|>")
    ids = token_ids(tokenizer, ["<|endoftext|>", "<|startoftranscript|>"])
    config = WhisperConfig(
        vocab_size=VOCAB_SIZE, **_TINY, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=128,
        max_source_positions=1500, max_target_positions=64, pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"],
    )
    model = WhisperForConditionalGeneration(config)
    randomize_scaled(model, seed_of("whisper"))
    extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins, sampling_rate=DEFAULT_SAMPLE_RATE)
    save_full(out, model, tokenizer, {"preprocessor_config.json": extractor.to_dict()})


QWEN2_AUDIO_TOKENS = {"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}


def write_full_qwen2_audio(out: Path, preset: str = "tiny") -> None:
    """A whole random ``Qwen2AudioForConditionalGeneration``, sharded, with tokenizer and extractor."""
    check_preset(preset)
    tokenizer = byte_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN2_AUDIO_TOKENS,
                               eos="<|im_end|>", pad="<|endoftext|>")
    ids = token_ids(tokenizer, ["<|endoftext|>", "<|im_end|>", "<|AUDIO|>"])
    text = Qwen2Config(vocab_size=VOCAB_SIZE, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, bos_token_id=ids["<|endoftext|>"],
                       eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    audio = Qwen2AudioEncoderConfig(**{**_TINY, "num_mel_bins": 128})
    config = Qwen2AudioConfig(audio_config=audio.to_dict(), text_config=text.to_dict(), audio_token_index=ids["<|AUDIO|>"])
    model = Qwen2AudioForConditionalGeneration(config)
    randomize_scaled(model, seed_of("qwen2_audio"))
    extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=DEFAULT_SAMPLE_RATE)
    processor = {"processor_class": "Qwen2AudioProcessor", **QWEN2_AUDIO_TOKENS}
    save_full(out, model, tokenizer, {"preprocessor_config.json": extractor.to_dict(), "processor_config.json": processor})


def _code(tower: type, full: type, write_full: Any) -> FamilyCode:
    def write(out: Path, preset: str, layout: Layout) -> None:
        write_full(out, preset) if layout is Layout.FULL else write_tiny(tower, out, preset)

    return FamilyCode(adapters={Layout.TOWER: tower, Layout.FULL: full}, write_tiny=write)


WHISPER_CODE = _code(WhisperAdapter, WhisperFullAdapter, write_full_whisper)
QWEN2_AUDIO_CODE = _code(Qwen2AudioAdapter, Qwen2AudioFullAdapter, write_full_qwen2_audio)
