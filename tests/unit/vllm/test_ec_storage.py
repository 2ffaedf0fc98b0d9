"""The ECExampleConnector layout the pod writes: exact bytes, atomic names, safe identifiers, bounds."""

from __future__ import annotations

import os

import pytest
import safetensors.torch
import torch

from encoder_pod.errors import InvalidRequest
from encoder_pod.transfer.tensors import tensor_bytes
from encoder_pod.vllm_epd.storage import EcStore, cast_rows, check_identifier

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_file_is_one_ec_cache_tensor_safetensors_reads(tmp_path, dtype):
    store = EcStore(tmp_path, max_bytes=1 << 20, max_age_s=60)
    tensor = torch.randn(7, 12).to(dtype)
    store.write("abc", tensor_bytes(tensor), str(dtype).removeprefix("torch."), (7, 12))
    path = tmp_path / "abc" / "encoder_cache.safetensors"
    loaded = safetensors.torch.load_file(str(path))
    assert list(loaded) == ["ec_cache"]
    assert loaded["ec_cache"].dtype == dtype and torch.equal(loaded["ec_cache"], tensor)
    assert os.listdir(tmp_path / "abc") == ["encoder_cache.safetensors"]  # no temporary file left behind
    assert store.read("abc") == path.read_bytes() and store.has("abc") and not store.has("abd")


def test_cast_to_the_consumers_dtype_is_torchs_cast():
    values = torch.cat([torch.randn(4096) * 1e3, torch.tensor([0.0, -0.0, 1e-40, 3.3895e38, float("inf"), float("-inf")])])
    for to in (torch.bfloat16, torch.float16):
        data, name = cast_rows(tensor_bytes(values), "float32", str(to).removeprefix("torch."))
        ours = torch.frombuffer(bytearray(data), dtype=to)
        assert torch.equal(ours, values.to(to)), to
    nan, _ = cast_rows(tensor_bytes(torch.tensor([float("nan")])), "float32", "bfloat16")
    assert torch.isnan(torch.frombuffer(bytearray(nan), dtype=torch.bfloat16)).all()
    back, _ = cast_rows(tensor_bytes(values.to(torch.bfloat16)), "bfloat16", "float32")
    assert torch.equal(torch.frombuffer(bytearray(back), dtype=torch.float32), values.to(torch.bfloat16).float())


@pytest.mark.parametrize("bad", ["../etc", "a/b", "/abs", "..", ".", "", "x\x00y", "a b", "x" * 256, "dir\\name"])
def test_identifiers_that_are_not_one_safe_path_component_are_refused(bad):
    with pytest.raises(InvalidRequest, match=r"messages\[0\]\.content\[1\]\.uuid"):
        check_identifier(bad, "messages[0].content[1].uuid")


@pytest.mark.parametrize("good", ["3f2a" * 16, "lora-x:3f2a", "img_1.png", "a@b+c=d"])
def test_identifiers_vllm_makes_are_kept_verbatim(good):
    assert check_identifier(good, "uuid") == good


def test_size_bound_evicts_the_oldest_first(tmp_path):
    store = EcStore(tmp_path, max_bytes=10_000, max_age_s=3600)
    data = bytes(4000)
    safetensors_size = store.write("a", data, "float32", (1000,))
    store.write("b", data, "float32", (1000,))
    assert len(store) == 2 and sum(f.stat().st_size for f in tmp_path.glob('*/*')) == 2 * safetensors_size
    store.write("c", data, "float32", (1000,))  # over 10 kB: "a" goes
    assert not store.has("a") and store.has("b") and store.has("c") and store.evicted == 1
    assert not (tmp_path / "a").exists()
    store.write("b", data, "float32", (1000,))  # rewritten: now the newest
    store.write("d", data, "float32", (1000,))
    assert store.has("b") and not store.has("c")
    with pytest.raises(InvalidRequest, match="ENCODER_VLLM_STORAGE_MAX_MB"):
        store.write("huge", bytes(40_000), "float32", (10_000,))


def test_age_bound_and_files_of_an_earlier_run(tmp_path):
    first = EcStore(tmp_path, max_bytes=1 << 20, max_age_s=100)
    first.write("old", bytes(8), "float32", (2,))
    again = EcStore(tmp_path, max_bytes=1 << 20, max_age_s=100)  # a restarted pod counts what is there
    assert len(again) == 1 == len(first)
    again.write("new", bytes(8), "float32", (2,))
    os.utime(tmp_path / "old" / "encoder_cache.safetensors", (0, 0))
    again = EcStore(tmp_path, max_bytes=1 << 20, max_age_s=100)
    assert again.sweep() == 1 and not again.has("old") and again.has("new")


def test_shape_and_bytes_must_agree(tmp_path):
    store = EcStore(tmp_path, max_bytes=1 << 20, max_age_s=60)
    with pytest.raises(ValueError, match="do not make"):
        store.write("x", bytes(10), "float32", (3,))
