"""The env and command the operator renders are exactly what ``encoder-pod serve`` reads.

The rendered env goes through ``encoder_pod.settings.load_settings`` (the pod's own parser) and
is compared field by field with the spec; the command's flags go through the pod's own argparse
flags. A renamed setting on either side fails here instead of being ignored by the pod.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import pytest

from encoder_pod.settings import add_settings_arguments, all_settings, load_settings
from encoderpool_operator import names
from encoderpool_operator.podenv import container_command, container_env, encoder_settings
from encoderpool_operator.spec import Pool, PoolSpec

pytestmark = pytest.mark.unit

SPECS = {
    "defaults": {"model": "/opt/m"},
    "cpu": {"model": "/opt/m", "device": "cpu", "parallelism": {"data": 3}, "port": 31000},
    "gpu-tuned": {
        "model": "qwen", "modelVolume": {"persistentVolumeClaim": {"claimName": "c"}, "mountPath": "/w"},
        "parallelism": {"tensor": 2, "data": 4},
        "batching": {"maxBatchSize": 64, "maxWaitMs": 2.5, "maxBatchTokens": 123456, "requestTimeoutSeconds": 30.5,
                     "maxQueue": 4096, "dpWorkerMaxInflight": 7, "mmLoadWorkers": 16, "imageProcessorUseGPU": True},
        "transfer": {"backend": "zmq_to_tokenizer", "sendTimeoutSeconds": 12},
    },
    "scheduler-transfer": {"model": "/opt/m", "transfer": {"backend": "zmq_to_scheduler"}},
}


def expected_fields(spec: PoolSpec) -> dict[str, Any]:
    """What each EncoderSettings field must be for this spec."""
    b = spec.batching
    return {
        "model_path": spec.model_path,
        "host": "0.0.0.0",
        "port": spec.port,
        "device": "cuda" if spec.gpus_per_pod else "cpu",
        "dp_size": spec.parallelism.data,
        "tp_size": spec.parallelism.tensor,
        "max_batch_size": b.max_batch_size,
        "max_wait_ms": b.max_wait_ms,
        "max_batch_tokens": b.max_batch_tokens,
        "req_timeout": b.request_timeout_seconds,
        "max_queue": b.max_queue,
        "dp_worker_max_inflight": b.dp_worker_max_inflight,
        "mm_load_workers": b.mm_load_workers,
        "image_processor_use_gpu": b.image_processor_use_gpu,
        "encoder_transfer_backend": spec.transfer.backend,
        "send_timeout": spec.transfer.send_timeout_seconds,
    }


@pytest.mark.parametrize("case", sorted(SPECS))
def test_rendered_env_loads_into_the_pod_settings(case: str, make_pool: Callable[..., Pool]) -> None:
    spec = make_pool(SPECS[case]).spec
    env = {e["name"]: e["value"] for e in container_env(spec) if "value" in e}
    loaded = load_settings(env=env).flat()
    for field, value in expected_fields(spec).items():
        got = loaded[field]
        got = got.value if hasattr(got, "value") else got  # enums compare by value
        assert got == value, f"{field}: pod reads {got!r}, spec says {value!r}"


@pytest.mark.parametrize("case", sorted(SPECS))
def test_command_flags_mean_the_same_as_the_env(case: str, make_pool: Callable[..., Pool]) -> None:
    spec = make_pool(SPECS[case]).spec
    command = container_command(spec)
    assert command[:2] == ["encoder-pod", "serve"]
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    flags = vars(parser.parse_args(command[2:]))
    env = {e["name"]: e["value"] for e in container_env(spec) if "value" in e}
    from_flags = load_settings(cli=flags, env={})
    from_env = load_settings(env=env)
    for field in ("model_path", "host", "port", "dp_size", "tp_size"):
        assert from_flags.flat()[field] == from_env.flat()[field]


def test_every_managed_variable_is_a_pod_setting() -> None:
    """No ENCODER_* variable the operator sets is silently ignored by the pod (extra='ignore')."""
    for var in names.MANAGED_ENV:
        assert var.removeprefix("ENCODER_").lower() in all_settings(), var


def test_rendered_names_are_exactly_the_managed_list() -> None:
    assert tuple(encoder_settings(PoolSpec(model="/m"))) == names.MANAGED_ENV


def test_spec_env_overrides_cache_dirs_but_keeps_unique_names(make_pool: Callable[..., Pool]) -> None:
    spec = make_pool({"model": "/m", "env": [{"name": "HF_HOME", "value": "/data/hf"},
                                             {"name": "ENCODER_DTYPE", "value": "float16"}]}).spec
    env = container_env(spec)
    listed = [e["name"] for e in env]
    assert len(listed) == len(set(listed)), "server-side apply refuses duplicate env names"
    values = {e["name"]: e.get("value") for e in env}
    assert values["HF_HOME"] == "/data/hf" and values["ENCODER_DTYPE"] == "float16"
    assert load_settings(env={k: v for k, v in values.items() if v is not None}).model.dtype == "float16"


def test_value_from_is_passed_through(make_pool: Callable[..., Pool]) -> None:
    ref = {"secretKeyRef": {"name": "hf", "key": "token"}}
    spec = make_pool({"model": "/m", "env": [{"name": "HF_TOKEN", "valueFrom": ref}]}).spec
    assert container_env(spec)[-1] == {"name": "HF_TOKEN", "valueFrom": ref}
