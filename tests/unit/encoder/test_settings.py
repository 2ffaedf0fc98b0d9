"""Settings: ENCODER_* env, SGLANG_ENCODER_* aliases, CLI flags, bounds named in errors."""

from __future__ import annotations

import argparse

import pytest

from encoder_pod.settings import EncoderSettings, SettingsError, TransferBackend, add_settings_arguments, load_settings

pytestmark = pytest.mark.unit


def test_defaults_match_contract():
    s = load_settings(env={})
    assert (s.max_batch_size, s.max_wait_ms, s.req_timeout, s.mm_load_workers) == (8, 0, 180, 4)
    assert (s.dp_worker_max_inflight, s.send_timeout, s.image_processor_use_gpu) == (64, 180, False)
    assert s.allow_url_fetch is False and s.allowed_local_media_path is None
    assert s.encoder_transfer_backend is TransferBackend.INLINE and s.port == 30000


def test_sglang_alias_and_encoder_name_wins():
    s = load_settings(env={"SGLANG_ENCODER_MAX_BATCH_SIZE": "3", "SGLANG_ENCODER_REQ_TIMEOUT": "7"})
    assert s.max_batch_size == 3 and s.req_timeout == 7
    s = load_settings(env={"SGLANG_ENCODER_MAX_BATCH_SIZE": "3", "ENCODER_MAX_BATCH_SIZE": "5"})
    assert s.max_batch_size == 5


def test_cli_overrides_env():
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    args = parser.parse_args(["--max-batch-size", "16", "--allow-url-fetch", "--encoder-transfer-backend", "zmq_to_scheduler"])
    s = load_settings(cli=vars(args), env={"ENCODER_MAX_BATCH_SIZE": "2"})
    assert s.max_batch_size == 16 and s.allow_url_fetch is True
    assert s.encoder_transfer_backend is TransferBackend.ZMQ_TO_SCHEDULER


def test_every_field_has_flag_and_docstring():
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    flags = {a.dest for a in parser._actions}
    for name, info in EncoderSettings.model_fields.items():
        assert name in flags and info.description, name


@pytest.mark.parametrize(
    "env, words",
    [
        ({"ENCODER_MAX_BATCH_SIZE": "0"}, ["ENCODER_MAX_BATCH_SIZE", "--max-batch-size", "ge 1"]),
        ({"ENCODER_PORT": "70000"}, ["ENCODER_PORT", "le 65535"]),
        ({"ENCODER_REQ_TIMEOUT": "-1"}, ["ENCODER_REQ_TIMEOUT"]),
        ({"SGLANG_ENCODER_MM_LOAD_WORKERS": "many"}, ["ENCODER_MM_LOAD_WORKERS"]),
        ({"ENCODER_ENCODER_TRANSFER_BACKEND": "rdma"}, ["ENCODER_ENCODER_TRANSFER_BACKEND", "inline"]),
        ({"ENCODER_VIDEO_MIN_FRAMES": "10", "ENCODER_VIDEO_MAX_FRAMES": "2"}, ["video_min_frames"]),
    ],
)
def test_bad_values_stop_with_named_variable(env, words):
    with pytest.raises(SettingsError) as info:
        load_settings(env=env)
    for word in words:
        assert word in str(info.value)


def test_url_hosts_split():
    s = load_settings(env={"ENCODER_ALLOWED_URL_HOSTS": "a.example, B.example ,"})
    assert s.allowed_url_hosts == ["a.example", "b.example"]
