"""Where an audio model's sample rate comes from: its own config files, in a fixed order."""

from __future__ import annotations

import json
import logging

import pytest

from encoder_pod.models.audio import resolve_sample_rate

pytestmark = pytest.mark.unit


def _write(root, files):
    for name, content in files.items():
        (root / name).write_text(json.dumps(content))
    return root


@pytest.mark.parametrize(
    "files, rate, source",
    [
        # The feature extractor's own rate wins over everything else.
        ({"preprocessor_config.json": {"sampling_rate": 24000}, "config.json": {"sampling_rate": 16000}},
         24000, "preprocessor_config.json"),
        # A processor config (top level or its feature_extractor section) comes next.
        ({"preprocessor_config.json": {"feature_size": 80}, "processor_config.json": {"feature_extractor": {"sampling_rate": 22050}}},
         22050, "processor_config.json"),
        ({"processor_config.json": {"sampling_rate": 44100}, "config.json": {"sampling_rate": 16000}},
         44100, "processor_config.json"),
        # Then the model config: top level or its audio_config.
        ({"preprocessor_config.json": {}, "config.json": {"audio_config": {"sampling_rate": 24000}}},
         24000, "config.json"),
        ({"config.json": {"sampling_rate": 48000.0}}, 48000, "config.json"),
    ],
)
def test_rate_is_read_from_the_checkpoint(tmp_path, files, rate, source):
    assert resolve_sample_rate(_write(tmp_path, files), "whisper") == (rate, source)


def test_fallback_is_16k_with_a_warning_naming_the_model(tmp_path, caplog):
    _write(tmp_path, {"preprocessor_config.json": {"feature_size": 80}, "config.json": {"model_type": "whisper"}})
    with caplog.at_level(logging.WARNING, logger="encoder_pod.models.audio"):
        assert resolve_sample_rate(tmp_path, "qwen2_audio") == (16000, "default")
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "qwen2_audio" in record.getMessage() and str(tmp_path) in record.getMessage()
    assert "16000 Hz" in record.getMessage()


def test_no_warning_when_the_checkpoint_says(tmp_path, caplog):
    _write(tmp_path, {"preprocessor_config.json": {"sampling_rate": 16000}})
    with caplog.at_level(logging.WARNING, logger="encoder_pod.models.audio"):
        resolve_sample_rate(tmp_path, "whisper")
    assert not caplog.records


@pytest.mark.parametrize("value", [0, -16000, 16000.5, "16k", True, 10_000_000])
def test_nonsense_rate_stops_the_load(tmp_path, value):
    _write(tmp_path, {"preprocessor_config.json": {"sampling_rate": value}})
    with pytest.raises(RuntimeError, match="preprocessor_config.json: sampling_rate"):
        resolve_sample_rate(tmp_path, "whisper")
