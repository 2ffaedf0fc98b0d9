"""Cache keys: same bytes -> same key however they were sent; another model -> another key."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from encoder_pod.cache.keys import content_digest, item_key, model_namespace
from encoder_pod.facts import ModelIdentity
from encoder_pod.models import checkpoint
from encoder_pod.models.checkpoint import file_facts
from encoder_pod.media.sources import MediaSources
from encoder_pod.modality import Modality
from encoder_pod.settings import load_settings

pytestmark = pytest.mark.unit

DATA = bytes(range(256)) * 40


def _identity(model_dir: Path, **over: object) -> ModelIdentity:
    fields: dict[str, Any] = {"family": "qwen2_vl", "architecture": None, "layout": "tower", "files": file_facts(model_dir),
                              "dtype": "float32", "device": "cpu"}
    return ModelIdentity(**{**fields, **over})


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2_vl_vision"}))
    (d / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136}))
    (d / "model.safetensors").write_bytes(b"\0" * 1024)
    return d


def test_the_same_bytes_give_the_same_key_from_every_source(tmp_path: Path):
    (tmp_path / "img.bin").write_bytes(DATA)
    sources = MediaSources(load_settings(env={"ENCODER_ALLOWED_LOCAL_MEDIA_PATH": str(tmp_path)}).media, max_bytes=1 << 20)
    b64 = base64.b64encode(DATA).decode()
    sent = [f"data:image/png;base64,{b64}", b64, "img.bin", f"file://{tmp_path / 'img.bin'}"]
    digests = {content_digest(sources.fetch(source)) for source in sent}
    assert digests == {hashlib.sha256(DATA).digest()}
    verified = "sha256:" + hashlib.sha256(DATA).hexdigest()
    assert content_digest(DATA, verified) == hashlib.sha256(DATA).digest()  # a client's verified hash, not hashed again


def test_keys_differ_by_modality_content_and_namespace(model_dir: Path):
    ns = model_namespace(_identity(model_dir), load_settings(env={}))
    digest = content_digest(DATA)
    assert item_key(ns, Modality.IMAGE, digest) == item_key(ns, Modality.IMAGE, content_digest(bytes(DATA)))
    assert item_key(ns, Modality.IMAGE, digest) != item_key(ns, Modality.VIDEO, digest)
    assert item_key(ns, Modality.IMAGE, digest) != item_key(ns, Modality.IMAGE, content_digest(DATA + b"x"))
    assert item_key(ns, Modality.IMAGE, digest) != item_key(b"another model", Modality.IMAGE, digest)


def test_the_namespace_changes_with_the_model_and_the_settings_that_change_outputs(model_dir: Path, tmp_path: Path):
    base = load_settings(env={})
    ns = model_namespace(_identity(model_dir), base)
    assert model_namespace(_identity(model_dir), load_settings(env={"ENCODER_MAX_BATCH_SIZE": "3"})) == ns  # no effect on rows
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    assert model_namespace(_identity(other), base) == ns  # the same files elsewhere compute the same rows
    changes = [
        _identity(model_dir, dtype="bfloat16"),
        _identity(model_dir, device="cuda:0"),
        _identity(model_dir, family="qwen2_5_vl"),
        _identity(model_dir, layout="full"),
    ]
    assert len({ns, *(model_namespace(identity, base) for identity in changes)}) == 1 + len(changes)
    for env in ({"ENCODER_VIDEO_FPS": "4"}, {"ENCODER_VIDEO_MAX_FRAMES": "8"}, {"ENCODER_TP_SIZE": "2"}):
        assert model_namespace(_identity(model_dir), load_settings(env=env)) != ns, env
    (model_dir / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 6272}))
    assert model_namespace(_identity(model_dir), base) != ns  # the processor config changed in place
    processor_changed = model_namespace(_identity(model_dir), base)
    (model_dir / "model.safetensors").write_bytes(b"\1" * 1024)
    assert model_namespace(_identity(model_dir), base) != processor_changed  # new weights in place


def test_large_files_are_identified_by_name_size_and_time(model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(checkpoint, "SMALL_FILE_BYTES", 512)
    weights = model_dir / "model.safetensors"
    stat = weights.stat()
    assert ("model.safetensors", 1024, stat.st_mtime_ns) in file_facts(model_dir)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert ("model.safetensors", 1024, stat.st_mtime_ns + 1) in file_facts(model_dir)
