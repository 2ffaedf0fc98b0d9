"""SGLang interop: our frames against SGLang 0.5.23's own receiver code, and its client against our pod.

SGLang is installed with ``--no-deps`` into a cache of its own (hack/sglang-receiver.sh) and runs
in a subprocess (hack/sglang_receiver_harness.py), which loads its real receiver source; the
encoder side never imports sglang.
"""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from encoder_pod.errors import RequestTimeout
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.settings import TransferBackend, load_settings
from encoder_pod.transfer.sglang_frames import SglangCodec
from encoder_pod.transfer.zmq_push import ZmqTransfer
from tests.integration.encode_client import embedding, encode
from tests.support.server import EncoderServer, png_data_uri

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RELEASE = "0.5.23"
WIRE = f"sglang={RELEASE}"


@pytest.fixture(scope="module")
def sglang_site() -> Path:
    """SGLang's code for this release, installed once into the cache (skips when PyPI is unreachable)."""
    proc = subprocess.run(["bash", str(REPO / "hack/sglang-receiver.sh"), RELEASE], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"sglang=={RELEASE} could not be installed with --no-deps (no package index?): {proc.stderr[-400:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


class Harness:
    """SGLang's receiver in a subprocess: ``ready`` once its sockets are bound, ``result`` at the end."""

    def __init__(self, site: Path, spec: dict[str, Any]) -> None:
        cmd = [sys.executable, str(REPO / "hack/sglang_receiver_harness.py"), str(site), json.dumps(spec)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self._err.append), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, sink: Any) -> None:
        for line in stream:
            sink(line)
        stream.close()

    def _next(self, tag: str, timeout: float) -> dict[str, Any]:
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"harness gave no {tag}:\n{''.join(self._err)[-3000:]}") from None
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1 :])

    def ready(self, timeout: float = 60) -> dict[str, Any]:
        return self._next("READY", timeout)

    def result(self, timeout: float = 90) -> dict[str, Any]:
        try:
            return self._next("RESULT", timeout)
        finally:
            self.proc.wait(30)


def _request(req_id: str, modality: Modality, num_parts: int, part_idx: int, port: int) -> EncodeRequest:
    return EncodeRequest(req_id, modality, (ItemSpec("x"),), num_parts, part_idx, "127.0.0.1", port)


def _encoders(n: int, backend: TransferBackend = TransferBackend.ZMQ_TO_TOKENIZER) -> list[ZmqTransfer]:
    settings = load_settings(env={"ENCODER_WIRE_FORMAT": WIRE, "ENCODER_SEND_TIMEOUT": "10"}).transfer
    return [ZmqTransfer(settings, backend) for _ in range(n)]


async def _close(encoders: list[ZmqTransfer]) -> None:
    for enc in encoders:
        await enc.close()


def _values(summary: dict[str, Any], modality: str) -> np.ndarray:
    return np.asarray(summary["embeddings"][modality]["values"], dtype=np.float32)


def test_frame0_is_byte_identical_to_sglangs_own(sglang_site):
    part = EncodedPart(torch.zeros(2, 2), [2], [[1, 2, 4]])
    codec = SglangCodec(RELEASE)
    ours = [
        codec.header(_request("a_local_part_0", Modality.IMAGE, 2, 0, 1), part, send_time=1.5).hex(),
        codec.header(_request("v", Modality.VIDEO, 1, 0, 1), EncodedPart(torch.zeros(3, 4, dtype=torch.bfloat16), [3], [[]]), send_time=2.0).hex(),
    ]
    cases = [
        {"req_id": "a_local_part_0", "num_parts": 2, "part_idx": 0, "grid_dim": [[1, 2, 4]], "modality": "IMAGE",
         "dtype": "float32", "shape": [2, 2], "send_time": 1.5},
        {"req_id": "v", "num_parts": 1, "part_idx": 0, "grid_dim": None, "modality": "VIDEO", "dtype": "bfloat16",
         "shape": [3, 4], "send_time": 2.0},
    ]
    harness = Harness(sglang_site, {"mode": "pickle", "cases": cases})
    harness.ready()
    assert harness.result()["pickles"] == ours


def test_tokenizer_receiver_merges_parts_from_several_encoders(sglang_site):
    """Image and audio parts from three encoders, out of order, after a stale part: merged by sglang."""
    harness = Harness(sglang_site, {"mode": "frames-tokenizer", "req_id": "rq"})
    port = harness.ready()["port"]
    img0, img1 = torch.randn(4, 8), torch.randn(2, 8)
    audio = torch.randn(5, 8)

    async def main():
        encoders = _encoders(3)
        try:
            await encoders[0].deliver(_request("old_local_part_0", Modality.IMAGE, 1, 0, port), EncodedPart(torch.ones(1, 8), [1], [[1, 1, 4]]))
            await encoders[2].deliver(_request("rq_local_part_2", Modality.AUDIO, 3, 2, port), EncodedPart(audio, [3, 2], [[60], [40]]))
            await encoders[1].deliver(_request("rq_local_part_1", Modality.IMAGE, 3, 1, port), EncodedPart(img1, [2], [[1, 2, 4]]))
            await encoders[0].deliver(_request("rq_local_part_0", Modality.IMAGE, 3, 0, port), EncodedPart(img0, [4], [[1, 4, 4]]))
        finally:
            await _close(encoders)

    asyncio.run(main())
    result = harness.result()
    merged = result["returned"]
    assert merged is not None, result["logs"]
    np.testing.assert_array_equal(_values(merged, "IMAGE"), torch.cat([img0, img1]).numpy())
    np.testing.assert_array_equal(_values(merged, "AUDIO"), audio.numpy())
    assert merged["meta"]["img_grid_thw"] == [[1, 4, 4], [1, 2, 4]]
    assert merged["meta"]["audio_feature_lens"] == [60, 40]
    assert any("stale" in line for line in result["logs"])


def test_tokenizer_receiver_stops_on_an_error_part(sglang_site):
    harness = Harness(sglang_site, {"mode": "frames-tokenizer", "req_id": "er"})
    port = harness.ready()["port"]

    async def main():
        encoders = _encoders(2)
        try:
            await encoders[0].deliver(_request("er_local_part_0", Modality.IMAGE, 2, 0, port), EncodedPart(torch.ones(2, 4), [2], [[1, 2, 4]]))
            await encoders[1].deliver_error(_request("er_local_part_1", Modality.IMAGE, 2, 1, port), RequestTimeout("took too long"))
        finally:
            await _close(encoders)

    asyncio.run(main())
    result = harness.result()
    assert result["returned"] is None
    assert any("took too long" in line and "error_code=504" in line for line in result["logs"]), result["logs"]


def test_scheduler_drain_routes_parts_errors_and_strays(sglang_site):
    harness = Harness(sglang_site, {"mode": "frames-scheduler", "rids": ["ok", "bad"]})
    port = harness.ready()["port"]
    parts = [torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(1, 16, dtype=torch.bfloat16)]

    async def main():
        encoders = _encoders(2, TransferBackend.ZMQ_TO_SCHEDULER)
        try:
            await encoders[0].deliver(_request("ghost_local_part_0", Modality.IMAGE, 1, 0, port), EncodedPart(torch.ones(1, 16), [1], [[1, 1, 4]]))
            await encoders[1].deliver(_request("ok_local_part_1", Modality.IMAGE, 2, 1, port), EncodedPart(parts[1], [1], [[1, 2, 2]]))
            await encoders[0].deliver(_request("ok_local_part_0", Modality.IMAGE, 2, 0, port), EncodedPart(parts[0], [3], [[1, 2, 6]]))
            await encoders[0].deliver(_request("bad_local_part_0", Modality.AUDIO, 2, 0, port), EncodedPart(torch.ones(2, 16), [2], [[9]]))
            await encoders[1].deliver_error(_request("bad_local_part_1", Modality.AUDIO, 2, 1, port), RequestTimeout("slow audio"))
        finally:
            await _close(encoders)

    asyncio.run(main())
    result = harness.result()
    [rank] = result["ranks"]
    assert rank["ok"]["status"] == "SUCCESS", rank["ok"]
    got = _values(rank["ok"]["mm"], "IMAGE")
    np.testing.assert_array_equal(got, torch.cat(parts).float().numpy())
    assert rank["ok"]["mm"]["embeddings"]["IMAGE"]["dtype"] == "bfloat16"
    assert rank["ok"]["mm"]["meta"]["img_grid_thw"] == [[1, 2, 6], [1, 2, 2]]
    assert (rank["bad"]["status"], rank["bad"]["error_code"]) == ("FAIL", 504) and "slow audio" in rank["bad"]["error_msg"]
    assert any("inactive request" in line for line in result["logs"])


@pytest.fixture(scope="module")
def sglang_pods(tiny_model):
    """Our pods in SGLang frame mode, one per ZMQ backend."""
    model = tiny_model("qwen2_vl")
    pods = {
        backend: EncoderServer(model, env={"ENCODER_ENCODER_TRANSFER_BACKEND": backend, "ENCODER_SEND_TIMEOUT": "20"},
                               args=["--wire-format", WIRE]).start(wait_ready=False)
        for backend in ("zmq_to_tokenizer", "zmq_to_scheduler")
    }
    try:
        for pod in pods.values():
            pod.wait_status("/health", 200, 180)
        yield pods
    finally:
        for pod in pods.values():
            pod.stop()


IMAGES = [png_data_uri(64, 48, seed=7), png_data_uri(40, 80, seed=8), png_data_uri(48, 48, seed=9)]


def _inline(pod: EncoderServer) -> np.ndarray:
    return np.concatenate([embedding(encode(pod.base_url, f"inline-{i}", [img])) for i, img in enumerate(IMAGES)])


def test_sglang_client_zmq_to_tokenizer_against_our_pod(sglang_site, sglang_pods):
    """sglang's recv_mm_data -> MMReceiverHTTP.encode posts to our /encode (listed twice: two parts)."""
    pod = sglang_pods["zmq_to_tokenizer"]
    harness = Harness(sglang_site, {"mode": "http-tokenizer", "encode_urls": [pod.base_url, pod.base_url], "images": IMAGES})
    harness.ready()
    result = harness.result()
    merged = result["returned"]
    assert merged is not None, result["logs"]
    np.testing.assert_allclose(_values(merged, "IMAGE"), _inline(pod), rtol=1e-4, atol=1e-5)
    assert len(merged["meta"]["img_grid_thw"]) == len(IMAGES)


@pytest.mark.parametrize("register_first", [True, False])
def test_sglang_client_zmq_to_scheduler_registers_and_receives(sglang_site, sglang_pods, register_first):
    """Two prefill TP ranks register through /scheduler_receive_url; /encode carries a null port."""
    pod = sglang_pods["zmq_to_scheduler"]
    spec = {"mode": "http-scheduler", "encode_urls": [pod.base_url, pod.base_url], "images": IMAGES, "tp": 2,
            "rid": f"sched-{register_first}", "register_first": register_first}
    harness = Harness(sglang_site, spec)
    harness.ready()
    result = harness.result()
    assert result["dispatch_error"] is None, result
    want = _inline(pod)
    for rank in result["ranks"]:
        state = rank[spec["rid"]]
        assert state["status"] == "SUCCESS", (state, result["logs"])
        np.testing.assert_allclose(_values(state["mm"], "IMAGE"), want, rtol=1e-4, atol=1e-5)
