"""Settings: ENCODER_* env, SGLANG_ENCODER_* aliases, CLI flags, bounds named in errors, groups."""

from __future__ import annotations

import argparse

import pytest

from encoder_pod.settings import (
    EncoderSettings,
    SettingsError,
    TransferBackend,
    add_settings_arguments,
    all_settings,
    load_settings,
    setting_groups,
)

pytestmark = pytest.mark.unit


def test_defaults_match_contract():
    s = load_settings(env={})
    assert (s.batching.max_batch_size, s.batching.max_wait_ms, s.admission.req_timeout, s.media.mm_load_workers) == (8, 0, 180, 4)
    assert (s.parallel.dp_worker_max_inflight, s.transfer.send_timeout, s.model.image_processor_use_gpu) == (64, 180, False)
    assert s.media.allow_url_fetch is True and s.media.allowed_media_domains == [] and not s.media.allow_private_media_hosts
    assert s.media.allowed_local_media_path is None
    assert s.transfer.transfer_backend is TransferBackend.AUTO and s.server.port == 30000


def test_sglang_alias_and_encoder_name_wins():
    s = load_settings(env={"SGLANG_ENCODER_MAX_BATCH_SIZE": "3", "SGLANG_ENCODER_REQ_TIMEOUT": "7"})
    assert s.batching.max_batch_size == 3 and s.admission.req_timeout == 7
    s = load_settings(env={"SGLANG_ENCODER_MAX_BATCH_SIZE": "3", "ENCODER_MAX_BATCH_SIZE": "5"})
    assert s.batching.max_batch_size == 5


def test_cli_overrides_env():
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    args = parser.parse_args(["--max-batch-size", "16", "--no-allow-url-fetch", "--encoder-transfer-backend", "zmq_to_scheduler",
                              "--encoder-register-urls", "http://p0:8997", "http://p1:8997/", "--allowed-media-domains", "a.example"])
    s = load_settings(cli=vars(args), env={"ENCODER_MAX_BATCH_SIZE": "2"})
    assert s.batching.max_batch_size == 16 and s.media.allow_url_fetch is False
    assert s.transfer.transfer_backend is TransferBackend.ZMQ_TO_SCHEDULER
    assert s.server.register_urls == ["http://p0:8997", "http://p1:8997"] and s.media.allowed_media_domains == ["a.example"]


def test_transfer_backend_env_and_its_deprecated_doubled_name(caplog):
    assert load_settings(env={"ENCODER_TRANSFER_BACKEND": "mooncake"}).transfer.transfer_backend is TransferBackend.MOONCAKE
    assert load_settings(env={"SGLANG_ENCODER_TRANSFER_BACKEND": "inline"}).transfer.transfer_backend is TransferBackend.INLINE
    with caplog.at_level("WARNING", logger="encoder_pod.settings"):
        old = load_settings(env={"ENCODER_ENCODER_TRANSFER_BACKEND": "zmq_to_tokenizer"})
    assert old.transfer.transfer_backend is TransferBackend.ZMQ_TO_TOKENIZER
    [warning] = [r.getMessage() for r in caplog.records]
    assert "ENCODER_ENCODER_TRANSFER_BACKEND is deprecated" in warning and "ENCODER_TRANSFER_BACKEND" in warning
    caplog.clear()
    both = load_settings(env={"ENCODER_ENCODER_TRANSFER_BACKEND": "zmq_to_tokenizer", "ENCODER_TRANSFER_BACKEND": "inline"})
    assert both.transfer.transfer_backend is TransferBackend.INLINE and not caplog.records  # the current name wins, silently


def test_every_field_has_flag_and_docstring():
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    flags = {a.dest for a in parser._actions}
    for name, setting in all_settings().items():
        assert name in flags and setting.info.description, name
        assert "\n" not in setting.info.description, f"{name}: the docstring is one line"


def test_names_are_flat_and_unique_across_groups():
    """Groups organise the code only: every env name is ENCODER_<field>, whatever its group."""
    listed = [name for cls in setting_groups().values() for name in cls.model_fields]
    assert len(listed) == len(set(listed)) == len(all_settings())
    assert all_settings()["max_batch_size"].group == "batching"
    assert all_settings()["max_batch_size"].env == "ENCODER_MAX_BATCH_SIZE"


@pytest.mark.parametrize(
    "env, words",
    [
        ({"ENCODER_MAX_BATCH_SIZE": "0"}, ["ENCODER_MAX_BATCH_SIZE", "--max-batch-size", "ge 1"]),
        ({"ENCODER_PORT": "70000"}, ["ENCODER_PORT", "le 65535"]),
        ({"ENCODER_REQ_TIMEOUT": "-1"}, ["ENCODER_REQ_TIMEOUT"]),
        ({"SGLANG_ENCODER_MM_LOAD_WORKERS": "many"}, ["ENCODER_MM_LOAD_WORKERS"]),
        ({"ENCODER_TRANSFER_BACKEND": "rdma"}, ["ENCODER_TRANSFER_BACKEND", "--encoder-transfer-backend", "mooncake"]),
        ({"ENCODER_REGISTER_URLS": "p0:8997"}, ["ENCODER_REGISTER_URLS", "--encoder-register-urls", "http(s)"]),
        ({"ENCODER_ALLOWED_MEDIA_DOMAINS": "http://a.example"}, ["ENCODER_ALLOWED_MEDIA_DOMAINS", "host name only"]),
        ({"ENCODER_ALLOWED_MEDIA_DOMAINS": "a.example:8080"}, ["ENCODER_ALLOWED_MEDIA_DOMAINS", "ports"]),
        ({"ENCODER_ALLOWED_MEDIA_DOMAINS": "a.*.example"}, ["ENCODER_ALLOWED_MEDIA_DOMAINS", "wildcard"]),
        ({"ENCODER_VIDEO_MIN_FRAMES": "10", "ENCODER_VIDEO_MAX_FRAMES": "2"}, ["ENCODER_VIDEO_MIN_FRAMES", "ENCODER_VIDEO_MAX_FRAMES"]),
        # The CRD refuses the same pair (spec.batching.maxBatchSize <= maxQueue): so does the pod.
        ({"ENCODER_MAX_QUEUE": "4"}, ["ENCODER_MAX_BATCH_SIZE / --max-batch-size (8) must not exceed ENCODER_MAX_QUEUE", "(4)"]),
        ({"ENCODER_MAX_BATCH_SIZE": "64", "SGLANG_ENCODER_MAX_QUEUE": "32"}, ["ENCODER_MAX_QUEUE", "drawn from the queue"]),
        ({"ENCODER_IMAGE_PROCESSOR_USE_GPU": "true"}, ["ENCODER_IMAGE_PROCESSOR_USE_GPU", "--image-processor-use-gpu", "torchvision"]),
    ],
)
def test_bad_values_stop_with_named_variable(env, words):
    with pytest.raises(SettingsError) as info:
        load_settings(env=env)
    for word in words:
        assert word in str(info.value)


def test_settings_error_is_an_ordinary_exception():
    """Library code raises it; only the CLI turns it into an exit code (asyncio and except Exception see it)."""
    assert issubclass(SettingsError, Exception) and not issubclass(SettingsError, SystemExit)


def test_media_domains_normalised_as_sglang_does_plus_wildcards():
    s = load_settings(env={"ENCODER_ALLOWED_MEDIA_DOMAINS": "a.example, B.Example. ,[::1], *.CDN.example, 127.0.0.1 bücher.example"})
    assert s.media.allowed_media_domains == ["*.cdn.example", "127.0.0.1", "::1", "a.example", "b.example", "xn--bcher-kva.example"]
    old = load_settings(env={"ENCODER_ALLOWED_URL_HOSTS": "a.example"})  # the earlier name, deprecated
    assert old.media.allowed_media_domains == ["a.example"]


def test_json_round_trip_is_exact():
    """Workers and tensor-parallel ranks rebuild the settings from the JSON their parent sends."""
    s = load_settings(env={"ENCODER_ALLOWED_MEDIA_DOMAINS": "a.example", "ENCODER_TRANSFER_BACKEND": "zmq_to_scheduler",
                           "ENCODER_TP_SIZE": "2", "ENCODER_MAX_WAIT_MS": "2.5", "ENCODER_ALLOWED_LOCAL_MEDIA_PATH": "/m"})
    again = EncoderSettings.model_validate_json(s.model_dump_json())
    assert again == s and again.transfer.transfer_backend is TransferBackend.ZMQ_TO_SCHEDULER


def test_settings_are_immutable():
    s = load_settings(env={})
    with pytest.raises(ValueError):
        s.batching.max_batch_size = 3  # type: ignore[misc]


def test_image_processor_use_gpu_keeps_sglangs_name_with_false_only():
    """SGLang deployments that set it false still start; true is refused, never silently ignored."""
    assert load_settings(env={"SGLANG_ENCODER_IMAGE_PROCESSOR_USE_GPU": "false"}).model.image_processor_use_gpu is False
    with pytest.raises(SettingsError, match="not supported"):
        load_settings(cli={"image_processor_use_gpu": True}, env={})


def test_a_batch_as_large_as_the_queue_is_allowed():
    s = load_settings(env={"ENCODER_MAX_QUEUE": "16", "ENCODER_MAX_BATCH_SIZE": "16"})
    assert (s.batching.max_batch_size, s.admission.max_queue) == (16, 16)
