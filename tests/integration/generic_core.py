"""The pieces of the generic path's proofs: tiny checkpoints per family, their verdicts, the HF reference.

Shared by ``tests/integration/test_generic_families.py`` (every family, fp32 on CPU) and
``tests/gpu/test_generic_families_cuda.py`` (the served families in bf16 on a GPU).
:func:`reference` runs the whole HF model (``from_pretrained`` of the tiny checkpoint) and its
own ``get_image_features`` on each image alone; :func:`prove_generic_bf16` serves the checkpoint
with a real ``encoder-pod serve`` in bf16 and compares. Neither reference nor counts use the
pod's code beyond :func:`~encoder_pod.models.generic.feature_rows` (how a feature method's output
becomes rows).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from encoder_pod.exitcodes import ExitCode
from encoder_pod.models import tiny_generic
from encoder_pod.models.families import default_registry
from encoder_pod.models.generic import feature_rows
from encoder_pod.models.servable import model_class, refusal
from encoder_pod.transfer.inline import decode_embedding
from testkit.media import png_data_uri
from testkit.server import EncoderServer

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "models.md"
BEGIN, END = "<!-- generic-families:begin -->", "<!-- generic-families:end -->"
IMAGES = ((64, 48, 1), (40, 72, 2))  # (width, height, seed): two sizes in one request

BF16 = {"atol": 3e-2, "rtol": 3e-2}
"""bf16 keeps 8 bits of mantissa (about 0.4% per rounding); the towers are a few layers deep, and the
pod runs both images through one padded processor call where the reference runs each alone."""


def cache_dir() -> Path:
    """Where this transformers version's tiny checkpoints live (keyed by the builder's source too)."""
    import transformers

    source = Path(tiny_generic.__file__).read_bytes()
    key = f"{transformers.__version__}-{hashlib.sha256(source).hexdigest()[:12]}"
    root = Path(os.environ.get("ENCODERPOOL_CACHE") or Path.home() / ".cache" / "encoderpool")
    out = root / "tiny-generic" / key
    out.mkdir(parents=True, exist_ok=True)
    return out


def build_all(cache: Path, types: list[str]) -> dict[str, dict[str, Any]]:
    """The builder's verdict per type, building only what the cache lacks (one subprocess)."""
    results_file = cache / "results.jsonl"
    known = {}
    if results_file.is_file():
        known = {r["model_type"]: r for r in map(json.loads, results_file.read_text().splitlines())}
    todo = [t for t in types if t not in known]
    if todo:
        done = subprocess.run([sys.executable, "-m", "encoder_pod.models.tiny_generic", str(cache), *todo],
                              capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert [r["model_type"] for r in lines] == todo, done.stderr[-3000:]
        with results_file.open("a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        known.update({r["model_type"]: r for r in lines})
    return {t: known[t] for t in types}


def classify(model_type: str, tmp: Path) -> tuple[str, str] | None:
    """("hand-written" | "refused", why) from config.json alone, or None when the generic path takes it."""
    cls = model_class({"model_type": model_type})
    config = {"model_type": model_type, "architectures": [cls.__name__]}
    where = tmp / model_type
    where.mkdir()
    (where / "config.json").write_text(json.dumps(config))
    if default_registry().recognise_all(where, config):
        return "hand-written", f"its own adapter ({cls.__name__})"
    refused = refusal(where, default_registry())
    return ("refused", refused.reason) if refused is not None else None


def served_in_docs() -> list[str]:
    """The model types docs/models.md's family table says the generic path serves.

    The table is the integration tier's output (it rewrites it from :func:`classify`, the builder's
    verdicts and a real fp32 serve, and fails when it changed), so this is that derivation's last
    result, read without its cost (enumerating transformers alone takes tens of seconds).
    """
    _, _, rest = DOC.read_text().partition(BEGIN)
    return re.findall(r"^\| `([^`]+)` \| generic \|", rest.partition(END)[0], flags=re.M)


def reference(model_dir: Path, device: str = "cpu", dtype: torch.dtype | None = None) -> tuple[list[int], list[np.ndarray]]:
    """Per image: the processor's placeholder count and the HF model's own feature rows (float32, on CPU).

    The whole model is loaded on ``device``, in ``dtype`` with float inputs cast to it, or (None)
    in the dtype ``from_pretrained`` picks (the checkpoint's: fp32) with the processor's inputs as they are.
    """
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    cls = model_class(json.loads((model_dir / "config.json").read_text()))
    model = (cls.from_pretrained(model_dir) if dtype is None else cls.from_pretrained(model_dir, dtype=dtype)).to(device).eval()
    token = processor.image_token
    token_id = processor.image_token_id if isinstance(getattr(processor, "image_token_id", None), int) \
        else processor.tokenizer.convert_tokens_to_ids(token)
    counts, rows = [], []
    accepts = inspect.signature(model.get_image_features).parameters
    for width, height, seed in IMAGES:
        data = base64.b64decode(png_data_uri(width, height, seed).split(",", 1)[1])
        image = Image.open(io.BytesIO(data)).convert("RGB")
        encoded = processor(text=[token], images=[image], return_tensors="pt")
        counts.append(int((encoded["input_ids"][0] == token_id).sum()))
        kwargs = {}
        for key, value in encoded.items():
            if key not in accepts or key in ("input_ids", "attention_mask"):
                continue
            if isinstance(value, torch.Tensor):
                value = value.to(device, dtype if dtype is not None and value.is_floating_point() else None)
            kwargs[key] = value
        with torch.no_grad():
            rows.append(feature_rows(model.get_image_features(**kwargs)).float().cpu().numpy())
    return counts, rows


def wait_loaded(server: EncoderServer, model_type: str) -> str:
    """'' once the server is ready; the reason when it exited refusing the checkpoint at load.

    A load failure must stop the process with code 3 and a last line naming the model type and
    the reason (as the start-up check's refusals do); a server that stays up unready fails the test.
    """
    assert server.proc is not None
    deadline = time.monotonic() + 240
    failed_at = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            log = server.log_text()
            last = log.strip().splitlines()[-1]
            assert server.proc.returncode == ExitCode.MODEL_LOAD_FAILED, log[-3000:]
            prefix = f"cannot serve model_type {model_type!r}: "
            assert prefix in last and "Traceback" not in log, log[-3000:]
            return "refused at load (exit 3): " + last.split(prefix, 1)[1].removeprefix("the generic path cannot load it: ")
        try:
            state = httpx.get(server.base_url + "/server_info", timeout=10).json()["state"]
        except httpx.TransportError:  # not listening yet, or just stopped
            state = "loading"
        if state == "ready":
            return ""
        if state == "failed":  # the exit follows within a second or two (uvicorn's shutdown)
            failed_at = failed_at or time.monotonic()
            stuck = time.monotonic() - failed_at > 15
            assert not stuck, f"the server stayed up failed instead of exiting 3:\n{server.log_text()[-3000:]}"
        else:
            assert state == "loading", server.log_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"not loaded after 240 s:\n{server.log_text()[-3000:]}")


def prove_generic_bf16(model_type: str, model_dir: Path, device: str) -> None:
    """The generic path in bf16 on ``device`` (``cuda`` in the gpu tier; callable on ``cpu`` to check the test itself).

    A real ``encoder-pod serve`` with the dtype the pod picks there (``auto`` on a GPU, which is
    bf16; ``bfloat16`` named on CPU, where ``auto`` is fp32) must report bf16 on ``device`` and
    answer one request of two images of different sizes with the processor's placeholder count per
    image (exact) and the HF model's own ``get_image_features`` rows in bf16 on the same device
    (within :data:`BF16`). A checkpoint the pod refuses at load is skipped with the reason.
    """
    dtype = "bfloat16" if device == "cpu" else "auto"
    server = EncoderServer(model_dir, env={"HF_HUB_OFFLINE": "1", "ENCODER_DEVICE": device, "ENCODER_DTYPE": dtype})
    server.start(wait_ready=False)
    try:
        refused = wait_loaded(server, model_type)
        if refused:
            pytest.skip(f"{model_type}: {refused}")
        server.wait_status("/health", 200, 120)
        model = httpx.get(server.base_url + "/server_info", timeout=10).json()["model"]
        assert (model["dtype"], model["device"].split(":")[0]) == ("bfloat16", device), model
        items = [png_data_uri(w, h, seed) for w, h, seed in IMAGES]
        resp = httpx.post(server.base_url + "/encode", json={"req_id": "r", "mm_items": items, "modality": "IMAGE"},
                          timeout=240)
        assert resp.status_code == 200, resp.text[:500]
        body = resp.json()
    finally:
        server.stop()
    with warnings.catch_warnings():  # the families' own code warns (numpy's __array__ copy keyword)
        warnings.simplefilter("ignore")
        counts, rows = reference(model_dir, device, torch.bfloat16)
    assert body["embedding"]["dtype"] == "bfloat16", body["embedding"]["dtype"]
    assert body["item_token_counts"] == counts, (body["item_token_counts"], counts)
    got = decode_embedding(body["embedding"])
    want = np.concatenate(rows)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, **BF16, err_msg=f"{model_type} bf16 on {device}")
