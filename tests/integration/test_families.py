"""Whole HF checkpoints served: per family, the rows its language model consumes, and no more read.

For each family a tiny random ``...ForConditionalGeneration`` (built by transformers' own class,
sharded with an index) is served by a real ``encoder-pod serve``. Requests of several items and
sizes go in concurrently (so they share batches) and then one item at a time; every item's rows
must equal the full model's own ``get_image_features`` / ``get_audio_features`` on the same input,
and their count must equal the placeholder tokens the family's real processor puts in a prompt.
/server_info must report the family, the language model's width and what was read.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from encoder_pod.models.weights import read_header
from tests.integration.encode_client import embedding, encode, encode_concurrently
from tests.integration.family_cases import CASES, Check, full_model
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

ENV = {"ENCODER_MAX_WAIT_MS": "400", "ENCODER_MAX_BATCH_SIZE": "8", "ENCODER_NUM_THREADS": "1",
       "ENCODER_DEVICE": "cpu", "ENCODER_MAX_AUDIO_SECONDS": "60"}


def _tower_bytes(ckpt: Path, prefixes: tuple[str, ...]) -> tuple[int, int]:
    """(bytes of the tensors under ``prefixes``, bytes of every tensor), from the shards' own headers."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    wanted = total = 0
    for shard in sorted(set(index.values())):
        _, header = read_header(ckpt / shard)
        sizes = {k: e["data_offsets"][1] - e["data_offsets"][0] for k, e in header.items() if k != "__metadata__"}
        wanted += sum(n for k, n in sizes.items() if k.startswith(prefixes))
        total += sum(sizes.values())
    return wanted, total


def _bodies(check: Check, tag: str) -> list[dict]:
    return [{"req_id": f"{tag}-{i}", "modality": check.modality, "mm_items": [item.uri(check.modality) for item in request]}
            for i, request in enumerate(check.requests)]


def _rows_per_item(resp: httpx.Response) -> list[np.ndarray]:
    rows = embedding(resp).astype(np.float32)
    counts = resp.json()["item_token_counts"]
    assert sum(counts) == rows.shape[0]
    return np.split(rows, np.cumsum(counts)[:-1])


def _served(server: EncoderServer, check: Check) -> tuple[list[httpx.Response], list[httpx.Response]]:
    """Every request at once (they share batches), then each request alone."""
    before = server.metric("encoder_batch_size_count") - server.metric("encoder_batch_size_bucket", 'le="1.0"')
    batched = encode_concurrently(server.base_url, _bodies(check, f"b-{check.modality}"))
    assert [r.status_code for r in batched] == [200] * len(batched), [r.text[:300] for r in batched]
    after = server.metric("encoder_batch_size_count") - server.metric("encoder_batch_size_bucket", 'le="1.0"')
    assert after > before, "no batch of 2+ requests was formed"
    alone = [encode(server.base_url, body["req_id"], body["mm_items"], modality=check.modality)
             for body in _bodies(check, f"a-{check.modality}")]
    return batched, alone


def _prove(check: Check, model, ckpt: Path, batched: list[httpx.Response], alone: list[httpx.Response]) -> None:
    media = check.media()
    reference = check.reference(model, ckpt, media)
    served = [rows for resp in batched for rows in _rows_per_item(resp)]
    single = [rows for resp in alone for rows in _rows_per_item(resp)]
    # Per item: the full model's own rows, by shape and value, batched and alone.
    assert [r.shape for r in served] == [r.shape for r in single] == [tuple(r.shape) for r in reference]
    for i, (got, one, ref) in enumerate(zip(served, single, reference)):
        np.testing.assert_allclose(got, one, rtol=1e-4, atol=1e-5, err_msg=f"{check.modality} item {i}: batched vs alone")
        np.testing.assert_allclose(got, ref.float().numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{check.modality} item {i}: vs HF")
    # Per request: as many rows as the real processor puts placeholders in a prompt holding its items.
    assert [sum(r.json()["item_token_counts"]) for r in batched] == check.placeholders(ckpt, media)
    assert served[0].shape[1] == check.width(model.config)


@pytest.mark.parametrize("arch", sorted(CASES))
def test_full_checkpoint_serves_what_the_language_model_consumes(arch, tiny_full_model):
    case = CASES[arch]
    ckpt = tiny_full_model(arch)
    with EncoderServer(ckpt, env={**ENV, **case.env}) as server:
        answers = [_served(server, check) for check in case.checks]
        info = httpx.get(server.base_url + "/server_info", timeout=10).json()["model"]
    model = full_model(case.full_cls, ckpt)
    for check, (batched, alone) in zip(case.checks, answers):
        _prove(check, model, ckpt, batched, alone)
    tower, checkpoint = _tower_bytes(ckpt, case.tower_prefixes)
    assert (info["family"], info["layout"], info["dtype"]) == (arch, "full", "float32")
    assert info["output_width"] == case.checks[0].width(model.config)
    assert info["tower_parameters"] == sum(
        p.numel() for name, p in model.named_parameters() if name.startswith(case.modules))
    assert info["weights"]["checkpoint_bytes"] == checkpoint
    # Exactly the tower's and projector's tensors, plus the headers of the shards opened.
    assert tower <= info["weights_bytes_loaded"] <= tower + 64 * 1024 * info["weights"]["shards_opened"]
    assert info["weights"]["shards_opened"] < info["weights"]["shards_total"]
