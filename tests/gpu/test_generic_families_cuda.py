"""The generic path on a CUDA device in bf16 (``auto`` dtype): the proof of tests/integration/test_generic_families.py.

Per family the generic path serves (docs/models.md's family table, which that integration test
writes from the same classification, builder verdicts and a real fp32 serve): its tiny whole
checkpoint served by a real ``encoder-pod serve`` with ``ENCODER_DEVICE=cuda``, one request of two
images of different sizes, rows against the HF model's own ``get_image_features`` in bf16 on the
same GPU. bf16 changes the numbers, so values are compared with a bf16 tolerance; the counts must
be exact. The proof (:func:`~tests.integration.generic_core.prove_generic_bf16`) also runs on CPU
in the integration tier, for one family, to check the test itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.generic_core import build_all, cache_dir, classify, prove_generic_bf16, served_in_docs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SERVED = served_in_docs()


@pytest.fixture(scope="module")
def built() -> dict[str, dict[str, Any]]:
    """The builder's verdict per served family (built into the cache in one subprocess, once)."""
    return build_all(cache_dir(), SERVED)


@pytest.mark.parametrize("model_type", SERVED)
def test_cuda_bf16_generic_rows_are_the_full_models(model_type: str, built: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    assert classify(model_type, tmp_path) is None, "docs/models.md's family table is stale: run test_generic_families"
    assert built[model_type]["ok"], built[model_type]
    prove_generic_bf16(model_type, cache_dir() / model_type, "cuda")
