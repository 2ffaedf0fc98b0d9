"""Whisper encoder and Qwen2-Audio audio tower (each saved on its own), with ``WhisperFeatureExtractor``.

Rows per window of ``L`` valid mel frames:

- Whisper: the stride-2 conv gives ``(L - 1) // 2 + 1`` rows (1500 for a full 30 s window). The
  encoder attends over the whole padded window (it has no mask), as Whisper was trained.
- Qwen2-Audio: conv then a stride-2 average pool: ``((L - 1) // 2 + 1 - 2) // 2 + 1`` rows (750
  per 30 s), the tower's own ``_get_feat_extract_output_lengths``; padded frames are masked out
  of attention exactly as ``Qwen2AudioForConditionalGeneration`` masks them. Served:
  ``last_hidden_state`` of the tower; the multi-modal projector belongs to the language model
  side, like LLaVA's projector for the CLIP tower.
"""

from __future__ import annotations

import torch
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.qwen2_audio.configuration_qwen2_audio import Qwen2AudioEncoderConfig
from transformers.models.qwen2_audio.modeling_qwen2_audio import Qwen2AudioEncoder
from transformers.models.whisper.configuration_whisper import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from encoder_pod.models.audio import AudioAdapter, write_tiny
from encoder_pod.models.family import FamilyCode, Layout

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


class Qwen2AudioAdapter(AudioAdapter):
    """Qwen2-Audio audio tower (``Qwen2AudioEncoder`` saved alone, model_type ``qwen2_audio_encoder``)."""

    name = "qwen2_audio"
    model_cls = Qwen2AudioEncoder
    config_cls = Qwen2AudioEncoderConfig
    presets = {"tiny": _TINY, "moderate": _MODERATE}

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


WHISPER_CODE = FamilyCode(
    adapters={Layout.TOWER: WhisperAdapter},
    write_tiny=lambda out, preset, layout: write_tiny(WhisperAdapter, out, preset),
)
QWEN2_AUDIO_CODE = FamilyCode(
    adapters={Layout.TOWER: Qwen2AudioAdapter},
    write_tiny=lambda out, preset, layout: write_tiny(Qwen2AudioAdapter, out, preset),
)
