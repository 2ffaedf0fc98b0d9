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
this test's output: it rewrites the table and fails when the table changed.
"""

from __future__ import annotations

import hashlib
import json
import os
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

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "models.md"
BEGIN, END = "<!-- generic-families:begin -->", "<!-- generic-families:end -->"
IMAGES = ((64, 48, 1), (40, 72, 2))  # (width, height, seed): two sizes in one request


def cache_dir() -> Path:
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


def reference(model_dir: Path) -> tuple[list[int], list[np.ndarray]]:
    """Per image: the processor's placeholder count and the HF model's own feature rows."""
    from PIL import Image
    import io, base64  # noqa: E401

    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = model_class(json.loads((model_dir / "config.json").read_text())).from_pretrained(model_dir).eval()
    token = processor.image_token
    token_id = processor.image_token_id if isinstance(getattr(processor, "image_token_id", None), int) \
        else processor.tokenizer.convert_tokens_to_ids(token)
    counts, rows = [], []
    accepts = __import__("inspect").signature(model.get_image_features).parameters
    for width, height, seed in IMAGES:
        data = base64.b64decode(png_data_uri(width, height, seed).split(",", 1)[1])
        image = Image.open(io.BytesIO(data)).convert("RGB")
        encoded = processor(text=[token], images=[image], return_tensors="pt")
        counts.append(int((encoded["input_ids"][0] == token_id).sum()))
        with torch.no_grad():
            kwargs = {k: v for k, v in encoded.items() if k in accepts and k not in ("input_ids", "attention_mask")}
            rows.append(feature_rows(model.get_image_features(**kwargs)).float().numpy())
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
