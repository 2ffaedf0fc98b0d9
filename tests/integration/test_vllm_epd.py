"""Proof with vLLM 0.34.0's own code: a consumer finds and loads every embedding the pod stored.

Per family vLLM's EPD consumes (every one the pod serves but the bare towers and Whisper): a real
``encoder-pod serve`` of the tiny whole checkpoint is driven the way vLLM's example proxy drives an
encoder instance (one request for the images, one per other item, each part with the proxy's
``uuid`` = sha256 of its URL, ``stream: false``), then the stored embeddings are loaded

- by vLLM's own ``ECExampleConnector`` (the wheel's code): the scheduler-side instance's
  ``has_cache_item``, ``update_state_after_alloc`` and ``build_connector_meta``, then the worker
  side through the wheel's ``ensure_ec_transfer_initialized`` and the model runner's
  ``ActiveECConnector.maybe_get_output`` (which calls ``start_load_caches``), on CPU;
- by this distribution's ``EncoderPoolECConnector``, chosen by the wheel's ``ECConnectorFactory``
  from ``ec_connector_module_path`` the way vLLM does, reading the pod over HTTP;

and each loaded tensor must equal the HF model's own ``get_image_features`` /
``get_audio_features`` rows for the item (fp32 on CPU: rtol 1e-4, atol 1e-5), in the consumer's
layout (Qwen3-VL: deepstack levels concatenated on the last dimension), with as many rows as the
prompt holds placeholders. What does not run here: vLLM's model forward and its CUDA platform
(the example connector loads onto the CPU platform's device, "cpu"); vLLM's ``Request`` is a
stand-in carrying the two things the connectors read (the item's identifier and its placeholder
count).
"""

from __future__ import annotations

import hashlib
import types
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.integration.family_cases import CASES, Check, full_model
from testkit.server import EncoderServer
from tests.support.vllm_harness import vllm_release

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

FAMILIES = [name for name in CASES if name != "whisper"]
ENV = {"ENCODER_DEVICE": "cpu", "ENCODER_NUM_THREADS": "1", "ENCODER_MAX_AUDIO_SECONDS": "60"}
STARTUP_S = 900.0
"""The whole Omni checkpoints load and warm up in minutes on a busy 2-core machine."""
PART = {"IMAGE": ("image_url", "image"), "AUDIO": ("audio_url", "audio")}


def proxy_parts(check: Check) -> list[list[dict[str, Any]]]:
    """The encoder requests' content, as vLLM's proxy builds them for one client request per request of
    the check: that request's images in one, every other item alone."""
    kind, _ = PART[check.modality]
    contents = []
    for request in check.requests:
        parts = []
        for item in request:
            url = item.uri(check.modality)
            parts.append({"type": kind, kind: {"url": url}, "uuid": hashlib.sha256(url.encode()).hexdigest()})
        contents += [parts] if check.modality == "IMAGE" else [[p] for p in parts]
    return contents


def encode_like_the_proxy(base_url: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "served-model", "messages": [{"role": "user", "content": content}], "stream": False}
    resp = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    params = resp.json()["ec_transfer_params"]
    # Every item is reported under the uuid the proxy gave it, at its own position.
    assert sorted(i for entry in params.values() for i in entry["item_indices"]) == list(range(len(content)))
    for index, part in enumerate(content):
        assert index in params[part["uuid"]]["item_indices"]
    return dict(params)


class Request:
    """vLLM's ``Request`` as the EC connectors read it (a stand-in: the real one needs the whole engine)."""

    def __init__(self, identifiers: list[str], rows: list[int]) -> None:
        self.mm_features = [types.SimpleNamespace(identifier=i) for i in identifiers]
        self._rows = rows

    def get_num_encoder_embeds(self, index: int) -> int:
        return self._rows[index]


def consumer_load(release: Any, ec: dict[str, Any], identifiers: list[str], rows: list[int]) -> dict[str, torch.Tensor]:
    """What a vLLM consumer with ``ec`` as its --ec-transfer-config loads for one prompt of these items."""
    config = release.loader.vllm_config(release, **ec)
    role = release.base.ECConnectorRole
    cls = release.factory.ECConnectorFactory.get_connector_class(config.ec_transfer_config)
    scheduler = cls(config, role.SCHEDULER)
    request = Request(identifiers, rows)
    for index, identifier in enumerate(identifiers):  # Scheduler._try_schedule_encoder_inputs, then the allocation
        assert scheduler.has_cache_item(identifier), identifier
        scheduler.update_state_after_alloc(request, index)
    meta = scheduler.build_connector_meta(release.loader.SchedulerOutput())
    scheduler.shutdown()  # as the scheduler does at exit
    release.state.ensure_ec_transfer_shutdown()
    release.state.ensure_ec_transfer_initialized(config)
    try:
        cache: dict[str, torch.Tensor] = {}
        active = release.runner.ActiveECConnector(config, cache)
        with active.maybe_get_output(release.loader.SchedulerOutput(ec_connector_metadata=meta)):
            pass  # the encoder and the gather run here in vLLM; the loads happened on entry
        return cache
    finally:
        release.state.ensure_ec_transfer_shutdown()


@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_consumers_load_the_hf_models_own_rows(family: str, tiny_full_model, tmp_path: Path):
    release = vllm_release()
    case = CASES[family]
    ckpt = tiny_full_model(family)
    store = tmp_path / "ec"
    model = full_model(case.full_cls, ckpt)
    server = EncoderServer(ckpt, env={**ENV, "ENCODER_VLLM_STORAGE_PATH": str(store)})
    server.start(timeout=STARTUP_S)
    try:
        for check in case.checks:
            contents = proxy_parts(check)
            reported: dict[str, Any] = {}
            for content in contents:
                reported.update(encode_like_the_proxy(server.base_url, content))
            identifiers = [part["uuid"] for content in contents for part in content]
            reference = check.reference(model, ckpt, check.media())
            rows = [int(r.shape[0]) for r in reference]
            # Per request of the check: the prompt's placeholders are the rows of its items.
            per_request = np.cumsum([0] + [len(r) for r in check.requests])
            assert [sum(rows[a:b]) for a, b in zip(per_request[:-1], per_request[1:])] == check.placeholders(ckpt, check.media())
            _check_metadata(family, check, reported, identifiers, rows)
            example = consumer_load(release, {"ec_connector": "ECExampleConnector", "ec_role": "ec_consumer",
                                              "ec_connector_extra_config": {"shared_storage_path": str(store)}}, identifiers, rows)
            ours = consumer_load(release, {"ec_connector": "EncoderPoolECConnector", "ec_role": "ec_consumer",
                                           "ec_connector_module_path": "encoder_pod.vllm_epd.connector",
                                           "ec_connector_extra_config": {"encoder_urls": [server.base_url]}}, identifiers, rows)
            for i, (identifier, ref) in enumerate(zip(identifiers, reference)):
                for name, loaded in (("ECExampleConnector", example), ("EncoderPoolECConnector", ours)):
                    got = loaded[identifier]
                    assert got.device.type == "cpu" and got.dtype == torch.float32
                    assert tuple(got.shape) == (rows[i], check.width(model.config)), (name, i)
                    np.testing.assert_allclose(got.numpy(), ref.float().numpy(), rtol=1e-4, atol=1e-5,
                                               err_msg=f"{family} {check.modality} item {i} via {name}")
    finally:
        server.__exit__(None, None, None)  # stops it, removes its log


def _check_metadata(family: str, check: Check, reported: dict[str, Any], identifiers: list[str], rows: list[int]) -> None:
    """The placeholder metadata a vLLM producer of the family would report."""
    for identifier, count in zip(identifiers, rows):
        metadata = reported[identifier]["metadata"]
        if check.modality == "IMAGE" and family.startswith("qwen"):
            t, h, w = metadata["image_grid_thw"]
            assert t * h * w // 4 == count  # vLLM's Qwen rule: grid / spatial_merge_size**2
        elif check.modality == "AUDIO" and family == "qwen2_audio":
            assert metadata == {"audio_num_tokens": [count]}
        else:
            assert metadata == {}, (family, metadata)
