"""Every family of the installed transformers whose class has feature methods, served or refused.

The families are enumerated from transformers itself (its image-text-to-text, multimodal-LM and
speech-seq2seq tables, every class there with ``get_image_features`` / ``get_video_features`` /
``get_audio_features``). Each is one of:

- **hand-written**: a family this pod has its own adapter for (tested in ``test_families.py``);
- **refused**: the pod's start-up check refuses its checkpoint (the reason it prints), or its tiny
  checkpoint cannot be built generically (the builder's reason);
- **served**: a tiny random whole checkpoint (``encoder_pod.models.tiny_generic``: default config
  shrunk before anything is built, the family's own processor) is served by a real
  ``encoder-pod serve``; one request of two images of different sizes must come back with the
  processor's placeholder count per image and rows equal to the HF model's own
  ``get_image_features`` on each image (``from_pretrained`` of the whole tiny model, in-process).

Tiny checkpoints are built once per transformers version and builder source, in one subprocess
(memory freed per family), into ``$ENCODERPOOL_CACHE``. The family table of docs/models.md is
this test's output: it rewrites the table and fails when the table changed. The gpu tier serves
the families it lists as generic in bf16 on a GPU (``tests/gpu/test_generic_families_cuda.py``);
that proof also runs here on CPU for one family, to check the test itself. The shared pieces are
in :mod:`tests.integration.generic_core`.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest

from encoder_pod.models import tiny_generic
from encoder_pod.transfer.inline import decode_embedding
from testkit.media import png_data_uri
from testkit.server import EncoderServer
from tests.integration.generic_core import (
    BEGIN, DOC, END, IMAGES, build_all, cache_dir, classify, prove_generic_bf16, reference, wait_loaded,
)

pytestmark = pytest.mark.integration

CPU_CHECKED = "paligemma"
"""The one small generic family whose bf16 proof (the gpu tier's) is also run here, on CPU."""


def serve_and_check(model_dir: Path) -> str:
    """Serve ``model_dir``; '' when the rows are right, else what went wrong."""
    try:
        with warnings.catch_warnings():  # the families' own code warns (numpy's __array__ copy keyword)
            warnings.simplefilter("ignore")
            counts, rows = reference(model_dir)
    except Exception as exc:  # the family's own model or processor, not the pod
        return f"tiny checkpoint: its own get_image_features fails on its processor's output: {type(exc).__name__}: {exc}"
    server = EncoderServer(model_dir, env={"HF_HUB_OFFLINE": "1", "ENCODER_DEVICE": "cpu"})
    server.start(wait_ready=False)
    try:
        refused = wait_loaded(server, model_dir.name)
        if refused:
            return refused
        server.wait_status("/health", 200, 120)
        items = [png_data_uri(w, h, seed) for w, h, seed in IMAGES]
        resp = httpx.post(server.base_url + "/encode", json={"req_id": "r", "mm_items": items, "modality": "IMAGE"},
                          timeout=240)
        if resp.status_code != 200:
            return f"encode answered {resp.status_code}: {resp.text[:200]}"
        body = resp.json()
        got = decode_embedding(body["embedding"])
        assert body["item_token_counts"] == counts, (body["item_token_counts"], counts)
        want = np.concatenate(rows)
        assert got.shape == want.shape, (got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        return ""
    finally:
        server.stop()


def table(outcomes: dict[str, tuple[str, str]]) -> str:
    lines = ["| model type | served by | note |", "|---|---|---|"]
    for model_type, (kind, note) in sorted(outcomes.items()):
        lines.append(f"| `{model_type}` | {kind} | {' '.join(note.split()).replace('|', '/')[:160]} |")
    served = sum(1 for kind, _ in outcomes.values() if kind == "generic")
    hand = sum(1 for kind, _ in outcomes.values() if kind == "hand-written")
    summary = (f"{len(outcomes)} families with feature methods in this transformers: {served} served by the "
               f"generic path, {hand} by hand-written adapters, {len(outcomes) - served - hand} refused.")
    return "\n".join([summary, "", *lines])


def test_every_family_with_feature_methods_is_served_or_refused_with_a_reason(tmp_path: Path) -> None:
    started = time.monotonic()
    outcomes: dict[str, tuple[str, str]] = {}
    generic = []
    for model_type in tiny_generic.feature_families():
        found = classify(model_type, tmp_path)
        if found is None:
            generic.append(model_type)
        else:
            outcomes[model_type] = found
    cache = cache_dir()
    built = build_all(cache, generic)
    failures = {}
    for model_type in generic:
        verdict = built[model_type]
        if not verdict["ok"]:
            outcomes[model_type] = ("refused", f"tiny checkpoint: {verdict['reason']}")
            continue
        problem = serve_and_check(cache / model_type)
        if problem:
            failures[model_type] = problem
            outcomes[model_type] = ("refused", problem)
        else:
            outcomes[model_type] = ("generic", f"{verdict['class']}, {verdict['processor']}")
    served = [t for t, (kind, _) in outcomes.items() if kind == "generic"]
    print(f"\n{len(outcomes)} families: {len(served)} generic, took {time.monotonic() - started:.0f}s")
    print(table(outcomes))
    assert len(served) >= 7, outcomes

    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = f"{head}{BEGIN}\n{table(outcomes)}\n{END}{tail}"
    if new != text:
        DOC.write_text(new)
    assert new == text, "docs/models.md's family table changed: it is rewritten, commit it"


def test_the_gpu_tiers_bf16_proof_holds_on_cpu(tmp_path: Path) -> None:
    """``prove_generic_bf16`` (tests/gpu/test_generic_families_cuda.py) run on CPU with ENCODER_DTYPE=bfloat16.

    Checks the gpu tier's test itself where no GPU is lent: one small family served generically.
    """
    assert classify(CPU_CHECKED, tmp_path) is None, f"{CPU_CHECKED} is no longer taken by the generic path"
    cache = cache_dir()
    verdict = build_all(cache, [CPU_CHECKED])[CPU_CHECKED]
    assert verdict["ok"], verdict
    prove_generic_bf16(CPU_CHECKED, cache / CPU_CHECKED, "cpu")
