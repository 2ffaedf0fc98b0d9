"""Whole checkpoints under tensor parallelism (gloo on CPU): the tower read out of them is the one split.

Qwen2-VL's tower and LLaVA's CLIP tower are the families tensor parallel splits; read out of their
whole checkpoints they must still be split over the group and serve the full model's own rows.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.integration.encode_client import embedding, encode_concurrently
from tests.integration.family_cases import CASES, full_model
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("arch", ["qwen2_vl", "llava"])
def test_tp2_serves_the_full_models_rows(arch, tiny_full_model):
    case = CASES[arch]
    check = case.checks[0]
    ckpt = tiny_full_model(arch)
    bodies = [{"req_id": f"tp-{i}", "modality": check.modality, "mm_items": [item.uri(check.modality) for item in r]}
              for i, r in enumerate(check.requests)]
    env = {"ENCODER_MAX_WAIT_MS": "50", "ENCODER_DEVICE": "cpu"}
    with EncoderServer(ckpt, env=env, args=["--tp-size", "2"]) as server:
        answers = encode_concurrently(server.base_url, bodies)
        worker = httpx.get(server.base_url + "/server_info", timeout=10).json()["workers"][0]
    assert [r.status_code for r in answers] == [200] * len(bodies), [r.text[:300] for r in answers]
    assert worker["model"]["tensor_parallel"]["tp_size"] == 2 and worker["model"]["layout"] == "full"
    reference = check.reference(full_model(case.full_cls, ckpt), ckpt, check.media())
    served = np.concatenate([embedding(r) for r in answers])
    np.testing.assert_allclose(served, np.concatenate([r.numpy() for r in reference]), rtol=1e-4, atol=1e-5)
