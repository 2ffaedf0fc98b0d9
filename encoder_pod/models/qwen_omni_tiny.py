"""Tiny whole Qwen2.5-Omni and Qwen3-Omni checkpoints (thinker, talker and speech decoder all real, all tiny)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniForConditionalGeneration
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeForConditionalGeneration

from encoder_pod.models.audio import DEFAULT_SAMPLE_RATE
from encoder_pod.models.family import FamilyCode, Layout
from encoder_pod.models.qwen_omni import Qwen3OmniAdapter, Qwen25OmniAdapter
from encoder_pod.models.qwen_vision import VIDEO_CONFIG
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

_ROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1000000.0}
_OMNI25_TOKENS = {"image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
                  "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
                  "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}
_OMNI3_TOKENS = {"image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
                 "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
                 "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1}


def _tokenizer(named: dict[str, str]) -> tuple[Any, dict[str, int]]:
    tokenizer = byte_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], named, eos="<|im_end|>", pad="<|endoftext|>")
    return tokenizer, token_ids(tokenizer, ["<|endoftext|>", "<|im_end|>", *named.values()])


def _text(ids: dict[str, int], **sizes: Any) -> dict[str, Any]:
    return {"vocab_size": VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"], **sizes}


def _qwen2_5_omni(ids: dict[str, int]) -> Qwen2_5OmniConfig:
    tokens = {"image_token_index": ids["<|IMAGE|>"], "video_token_index": ids["<|VIDEO|>"],
              "audio_token_index": ids["<|AUDIO|>"], "audio_start_token_id": ids["<|audio_bos|>"],
              "audio_end_token_id": ids["<|audio_eos|>"], "vision_start_token_id": ids["<|vision_bos|>"]}
    thinker = {
        "audio_config": {"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128,
                         "d_model": 64, "output_dim": 64, "n_window": 100, "max_source_positions": 1500},
        "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "out_hidden_size": 64,
                          "window_size": 112, "fullatt_block_indexes": [1], "patch_size": 14, "spatial_merge_size": 2,
                          "temporal_patch_size": 2},
        "text_config": _text(ids, intermediate_size=256, rope_parameters=dict(_ROPE)),
        **tokens,
    }
    talker = {"vocab_size": VOCAB_SIZE, "embedding_size": 64, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "rope_parameters": dict(_ROPE), **tokens, "vision_end_token_id": ids["<|vision_eos|>"],
              "tts_text_start_token_id": 300, "tts_text_end_token_id": 301, "tts_text_pad_token_id": 302,
              "tts_codec_start_token_id": 4000, "tts_codec_end_token_id": 4001, "tts_codec_pad_token_id": 4002,
              "tts_codec_mask_token_id": 4003}
    token2wav = {"dit_config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 16,
                                "ff_mult": 2, "emb_dim": 16, "num_embeds": 512, "mel_dim": 80, "enc_emb_dim": 16,
                                "enc_dim": 16, "enc_channels": [32, 32, 32, 32, 96], "enc_attention_channels": 16,
                                "enc_se_channels": 16, "look_ahead_layers": [1], "look_backward_layers": [0]},
                 "bigvgan_config": {"mel_dim": 80, "upsample_initial_channel": 64}}
    return Qwen2_5OmniConfig(thinker_config=thinker, talker_config=talker, token2wav_config=token2wav,
                             enable_audio_output=True)


def _qwen3_omni(ids: dict[str, int]) -> Qwen3OmniMoeConfig:
    rope = {**_ROPE, "mrope_interleaved": True}
    tokens = {"audio_token_id": ids["<|audio_pad|>"], "image_token_id": ids["<|image_pad|>"],
              "video_token_id": ids["<|video_pad|>"], "audio_start_token_id": ids["<|audio_start|>"],
              "vision_start_token_id": ids["<|vision_start|>"]}
    thinker = {
        # n_window stays 50: the processor's own row count assumes it.
        "audio_config": {"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128,
                         "d_model": 64, "output_dim": 64, "n_window": 50, "n_window_infer": 400, "conv_chunksize": 500,
                         "downsample_hidden_size": 16, "max_source_positions": 1500},
        "vision_config": {"depth": 3, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "out_hidden_size": 64,
                          "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                          "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1]},
        "text_config": _text(ids, intermediate_size=128, head_dim=16, rope_parameters=dict(rope), **_MOE),
        **tokens,
    }
    talker = {
        # shared_expert_intermediate_size and spatial_merge_size are read by the talker though its
        # 5.23 config classes do not declare them (the released configs carry both).
        "text_config": {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                        "rope_parameters": dict(rope), **_MOE, "shared_expert_intermediate_size": 32},
        "code_predictor_config": {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "num_code_groups": 4},
        "num_code_groups": 4, "thinker_hidden_size": 64, "accept_hidden_layer": 1, "spatial_merge_size": 2,
        "codec_eos_token_id": 500, "codec_nothink_id": 501, "codec_think_bos_id": 502, "codec_think_eos_id": 503,
        "codec_pad_id": 504, "codec_bos_id": 505, **tokens,
    }
    code2wav = {"codebook_size": 64, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
                "intermediate_size": 64, "num_hidden_layers": 1, "num_quantizers": 4, "sliding_window": 8,
                "decoder_dim": 32, "upsample_rates": [2, 2, 2, 2], "upsampling_ratios": [2, 2]}
    return Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
                              enable_audio_output=True)


def write_full(family: str, out: Path, preset: str = "tiny") -> None:
    """A whole random Omni model (every part real, all tiny), sharded, with tokenizer and processor files."""
    check_preset(preset)
    named = _OMNI25_TOKENS if family == "qwen2_5_omni" else _OMNI3_TOKENS
    tokenizer, ids = _tokenizer(named)
    if family == "qwen2_5_omni":
        model: Any = Qwen2_5OmniForConditionalGeneration(_qwen2_5_omni(ids))
        patch, low, high = 14, 56 * 56, 224 * 224
    else:
        model = Qwen3OmniMoeForConditionalGeneration(_qwen3_omni(ids))
        patch, low, high = 16, 64 * 64, 256 * 256
    randomize_scaled(model, seed_of(family))
    image = Qwen2VLImageProcessorPil(min_pixels=low, max_pixels=high, patch_size=patch, merge_size=2)
    video = {"video_processor_type": "Qwen2VLVideoProcessor", "size": {"shortest_edge": low, "longest_edge": high // 4},
             "patch_size": patch, "temporal_patch_size": 2, "merge_size": 2,
             "image_mean": list(image.image_mean), "image_std": list(image.image_std)}
    extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=DEFAULT_SAMPLE_RATE)
    files = {"preprocessor_config.json": {**image_processor_file(image), **_feature_extractor_fields(extractor)},
             VIDEO_CONFIG: video}
    speakers = io.BytesIO()
    torch.save({}, speakers)  # Qwen2.5-Omni's from_pretrained requires spk_dict.pt beside config.json
    save_full(out, model, tokenizer, files, extra={"spk_dict.pt": speakers.getvalue()} if family == "qwen2_5_omni" else None)


def _feature_extractor_fields(extractor: WhisperFeatureExtractor) -> dict[str, Any]:
    """The released Omni checkpoints keep the Whisper extractor's fields in preprocessor_config.json too."""
    fields = extractor.to_dict()
    fields.pop("mel_filters", None)
    return {key: value for key, value in fields.items() if key not in ("feature_extractor_type",)}


QWEN2_5_OMNI_CODE = FamilyCode(adapters={Layout.FULL: Qwen25OmniAdapter},
                               write_tiny=lambda out, preset, layout: write_full("qwen2_5_omni", out, preset))
QWEN3_OMNI_CODE = FamilyCode(adapters={Layout.FULL: Qwen3OmniAdapter},
                             write_tiny=lambda out, preset, layout: write_full("qwen3_omni", out, preset))
