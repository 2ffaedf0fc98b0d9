"""Whisper and Qwen2-Audio adapters on tiny checkpoints: valid-frame rows, windows, sample rates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from encoder_pod.media.decode import decode_item
from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem
from encoder_pod.settings import load_settings
from tests.support.media_files import audio_bytes, tone

pytestmark = pytest.mark.integration

AUDIO_ARCHS = ("whisper", "qwen2_audio")
RATE = 16_000


def _audio(seconds: float, seed: int = 0, rate: int = RATE) -> MediaItem:
    return MediaItem(Modality.AUDIO, tone(seconds, rate, seed))


def encode(adapter, requests):
    batch = adapter.preprocess(requests)
    return batch, adapter.postprocess(adapter.forward(batch), batch)


@pytest.mark.parametrize("arch", AUDIO_ARCHS)
def test_batched_equals_alone_and_rows_follow_valid_frames(arch, tiny_adapter):
    adapter = tiny_adapter(arch)
    requests = [[_audio(1.0, 1)], [_audio(0.25, 2), _audio(3.7, 3)], [_audio(0.05, 4), _audio(2.0, 5), _audio(1.0, 6)]]
    batch, parts = encode(adapter, requests)
    for items, part, tokens in zip(requests, parts, batch.item_tokens):
        assert tokens == [adapter.measure(item) for item in items]
        assert part.embedding.shape == (sum(tokens), adapter.hidden_size)
        _, (alone,) = encode(adapter, [items])
        assert alone.item_tokens == tokens
        torch.testing.assert_close(part.embedding, alone.embedding, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(parts[0].embedding[:8], parts[2].embedding[-8:])
    # Rows come from the valid mel frames (100 per second), never from the 30 s padding.
    per_second = {"whisper": 50, "qwen2_audio": 25}[arch]
    assert batch.item_tokens[0] == [per_second]
    assert batch.item_grids[0] == [[100]]


def test_long_audio_is_windowed_for_whisper_and_cut_to_30s_for_qwen2_audio(tiny_adapter):
    """65 s: Whisper encodes 30 s + 30 s + 5 s windows in order; Qwen2-Audio, as its processor, the first 30 s."""
    long = _audio(65.0, 7)
    first_30s = MediaItem(Modality.AUDIO, long.data[: 30 * RATE])
    whisper = tiny_adapter("whisper")
    batch, (part,) = encode(whisper, [[long]])
    assert batch.item_grids == [[[6500]]]  # one length per item: the valid mel frames of all windows
    assert batch.item_tokens == [[2 * 1500 + whisper.rows_for_frames(500)]] == [[whisper.measure(long)]]
    _, (first,) = encode(whisper, [[first_30s]])
    torch.testing.assert_close(part.embedding[:1500], first.embedding, atol=1e-5, rtol=1e-4)
    qwen = tiny_adapter("qwen2_audio")
    batch, (part,) = encode(qwen, [[long]])
    assert batch.item_grids == [[[3000]]] and batch.item_tokens == [[750]] == [[qwen.measure(long)]]
    _, (first,) = encode(qwen, [[first_30s]])
    torch.testing.assert_close(part.embedding, first.embedding, atol=1e-5, rtol=1e-4)
    assert qwen.info()["audio_longer_than_window"] == "truncated"


def test_rows_per_frame_rules():
    from encoder_pod.models.whisper import Qwen2AudioAdapter, WhisperAdapter

    from transformers.models.qwen2_audio.modeling_qwen2_audio import Qwen2AudioEncoder

    assert [WhisperAdapter.rows_for_frames(n) for n in (0, 1, 2, 3, 100, 3000)] == [0, 1, 1, 2, 50, 1500]
    # The tower's own rule (750 per 30 s window), for every valid frame count of a window.
    frames = torch.arange(1, 3001)
    _, expected = Qwen2AudioEncoder._get_feat_extract_output_lengths(None, frames)
    assert [Qwen2AudioAdapter.rows_for_frames(n) for n in frames.tolist()] == expected.clamp(min=0).tolist()
    assert Qwen2AudioAdapter.rows_for_frames(3000) == 750


@pytest.mark.parametrize("arch", AUDIO_ARCHS)
def test_refused_audio(arch, tiny_adapter):
    adapter = tiny_adapter(arch)
    nan = tone(0.5, RATE)
    nan[7] = np.nan
    cases = {
        "NaN or infinite": MediaItem(Modality.AUDIO, nan),
        "no samples": MediaItem(Modality.AUDIO, np.zeros(0, np.float32)),
        "mono waveform": MediaItem(Modality.AUDIO, np.zeros((10, 2), np.float32)),
        "encodes AUDIO items, not IMAGE": MediaItem(Modality.IMAGE, np.zeros(100, np.float32)),
    }
    for words, item in cases.items():
        with pytest.raises(ValueError, match=words):
            adapter.measure(item)


def test_qwen2_audio_refuses_audio_too_short_for_a_row(tiny_adapter):
    adapter = tiny_adapter("qwen2_audio")
    with pytest.raises(ValueError, match=r"10.0 ms long: too short for one output row \(at least 20.1 ms\)"):
        adapter.measure(MediaItem(Modality.AUDIO, tone(0.01, RATE)))
    assert adapter.measure(MediaItem(Modality.AUDIO, tone(adapter.min_samples / RATE, RATE))) == 1


@pytest.mark.parametrize("arch", AUDIO_ARCHS)
def test_health_item_warmup_and_info(arch, tiny_adapter):
    adapter = tiny_adapter(arch)
    item = adapter.health_item(Modality.AUDIO)
    # 10 ms at the model rate; Qwen2-Audio needs 3 mel frames (321 samples) for its first row.
    assert item.data.size == {"whisper": 160, "qwen2_audio": 321}[arch]
    assert adapter.measure(item) == 1
    adapter.warmup()
    info = adapter.info()
    assert (info["arch"], info["modalities"], info["sample_rate"]) == (arch, ["AUDIO"], RATE)
    assert info["sample_rate_source"] == "preprocessor_config.json" and info["window_seconds"] == 30.0
    assert info["hidden_size"] == adapter.hidden_size == 64
    with pytest.raises(ValueError):
        adapter.health_item(Modality.IMAGE)


def test_qwen2_audio_masks_padding_out_of_attention(tiny_adapter):
    """Without the mask a short item's rows would depend on the 30 s of padding it attends to."""
    adapter = tiny_adapter("qwen2_audio")
    batch = adapter.preprocess([[_audio(1.0, 3)]])
    features, frames = batch.inputs["input_features"], batch.inputs["frames"]
    with torch.inference_mode():
        masked = adapter._encode(features, frames)[0, :25]
        unmasked = adapter.model(features).last_hidden_state[0, :25]
        # Other padding content past the conv receptive field of the last valid row.
        noisy = features.clone()
        noisy[..., 110:] = torch.randn_like(noisy[..., 110:])
        masked_noisy = adapter._encode(noisy, frames)[0, :25]
    torch.testing.assert_close(masked, masked_noisy)
    assert not torch.allclose(masked, unmasked, atol=1e-3)


def _copy(tiny_model, arch, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_model(arch), tmp_path / arch))


def _edit_json(path: Path, **changes) -> None:
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def test_a_24k_model_gets_24k_audio(tiny_model, load_checkpoint, tmp_path):
    """A checkpoint whose feature extractor says 24 kHz: decoded audio is resampled to 24 kHz."""
    path = _copy(tiny_model, "whisper", tmp_path)
    # 20 s windows at 24 kHz keep 3000 mel frames (hop 160), the window this tower takes.
    _edit_json(path / "preprocessor_config.json", sampling_rate=24000, chunk_length=20, n_samples=None, nb_max_frames=None)
    adapter = load_checkpoint(path)
    assert adapter.sample_rate == 24000 and adapter.feature_extractor.sampling_rate == 24000
    settings = load_settings(env={}).media
    item = decode_item(Modality.AUDIO, audio_bytes(tone(1.0, 16000), 16000), adapter, settings)
    assert item.data.size == 24000
    # 1 s at 24 kHz is 150 mel frames -> 75 rows; 16 kHz samples fed as-is would give 50.
    batch, (part,) = encode(adapter, [[item]])
    assert batch.item_grids == [[[150]]] and part.item_tokens == [75]
    native = decode_item(Modality.AUDIO, audio_bytes(tone(1.0, 24000), 24000), adapter, settings)
    _, (ref,) = encode(adapter, [[native]])
    torch.testing.assert_close(part.embedding, ref.embedding, atol=0.02, rtol=0)


def test_rate_only_in_config_json_builds_the_extractor_for_it(tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, "qwen2_audio", tmp_path)
    _edit_json(path / "preprocessor_config.json", sampling_rate=None, chunk_length=20, n_samples=None, nb_max_frames=None)
    _edit_json(path / "config.json", sampling_rate=24000)
    adapter = load_checkpoint(path)
    assert (adapter.sample_rate, adapter.info()["sample_rate_source"]) == (24000, "config.json")
    assert adapter.feature_extractor.sampling_rate == 24000 and adapter.feature_extractor.n_samples == 480000
    from transformers import WhisperFeatureExtractor

    # The mel filters are the 24 kHz ones, not the class default's 16 kHz ones.
    at_24k = WhisperFeatureExtractor(feature_size=80, sampling_rate=24000, chunk_length=20)
    np.testing.assert_allclose(adapter.feature_extractor.mel_filters, at_24k.mel_filters)
    assert not np.allclose(adapter.feature_extractor.mel_filters, WhisperFeatureExtractor(feature_size=80).mel_filters)


def test_window_that_does_not_fit_the_tower_is_refused(tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, "whisper", tmp_path)
    _edit_json(path / "preprocessor_config.json", chunk_length=10, n_samples=None, nb_max_frames=None)
    with pytest.raises(RuntimeError, match="1000 mel frames per window vs 3000 the tower takes"):
        load_checkpoint(path)


@pytest.mark.parametrize("arch", AUDIO_ARCHS)
def test_missing_weight_fails_loudly(arch, tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, arch, tmp_path)
    weights = load_file(path / "model.safetensors")
    dropped = next(k for k in sorted(weights) if "layers.1.fc1" in k)
    del weights[dropped]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="missing_keys: .*layers.1.fc1"):
        load_checkpoint(path)


@pytest.mark.parametrize("arch", ["whisper", "qwen2_audio", "llava_next"])
def test_each_new_checkpoint_matches_only_its_own_family(arch, tiny_model):
    """Seven families share one registry: a checkpoint must select exactly one adapter."""
    from encoder_pod.models.families import default_registry
    from encoder_pod.models.family import read_config

    registry = default_registry()
    config = read_config(tiny_model(arch))
    assert registry.discover(tiny_model(arch)).family == arch
    assert [found.family for found in registry.recognise_all(tiny_model(arch), config)] == [arch]
