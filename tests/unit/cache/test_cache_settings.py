"""ENCODER_CACHE_SIZE_MB: its group, its SGLang alias, its bounds."""

from __future__ import annotations

import pytest

from encoder_pod.settings import SettingsError, load_settings

pytestmark = pytest.mark.unit


def test_off_by_default_and_read_from_either_name_encoder_first():
    assert load_settings(env={}).cache.cache_size_mb == 0
    assert load_settings(env={"ENCODER_CACHE_SIZE_MB": "512"}).cache.cache_size_mb == 512
    assert load_settings(env={"SGLANG_VLM_CACHE_SIZE_MB": "100"}).cache.cache_size_mb == 100
    both = {"ENCODER_CACHE_SIZE_MB": "0", "SGLANG_VLM_CACHE_SIZE_MB": "100"}
    assert load_settings(env=both).cache.cache_size_mb == 0
    assert load_settings({"cache_size_mb": "64"}, env=both).cache.cache_size_mb == 64  # the flag wins


def test_a_bad_size_names_the_variable_and_the_flag():
    with pytest.raises(SettingsError) as err:
        load_settings(env={"SGLANG_VLM_CACHE_SIZE_MB": "-1"})
    assert "ENCODER_CACHE_SIZE_MB" in str(err.value) and "--cache-size-mb" in str(err.value) and "ge 0" in str(err.value)
