"""Our SGLang frames against every supported release's own receiver and unpickler code (0.5.19 .. newest).

Each release runs in its own process (tests/support/sglang_harness.py) loading that release's
real source from its wheel; the encoder side pushes over real ZMQ sockets and never imports sglang.
"""

from __future__ import annotations

import asyncio
import pickletools
import re
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
from tests.support.sglang_harness import SglangHarness

pytestmark = pytest.mark.integration


def _request(req_id: str, modality: Modality, num_parts: int, part_idx: int, port: int = 1) -> EncodeRequest:
    return EncodeRequest(req_id, modality, (ItemSpec("x"),), num_parts, part_idx, "127.0.0.1", port)


def _part(embedding: torch.Tensor, tokens: list[int], grids: list[list[int]], **extras: Any) -> EncodedPart:
    part = EncodedPart(embedding, tokens, grids)
    if extras:
        part.extras = extras  # type: ignore[attr-defined]  # adapters fill EncodedPart.extras for video
    return part


def _encoders(n: int, backend: TransferBackend = TransferBackend.ZMQ_TO_TOKENIZER) -> list[ZmqTransfer]:
    settings = load_settings(env={"ENCODER_SEND_TIMEOUT": "10"}).transfer  # the default wire: sglang, auto layout
    return [ZmqTransfer(settings, backend) for _ in range(n)]


def _push(backend: TransferBackend, sends: list[tuple[int, EncodeRequest, EncodedPart | Exception]]) -> None:
    """Each (encoder index, request, part or error) in order, through real ZmqTransfer instances."""

    async def main() -> None:
        encoders = _encoders(1 + max(i for i, _, _ in sends), backend)
        try:
            for index, request, what in sends:
                if isinstance(what, EncodedPart):
                    await encoders[index].deliver(request, what)
                else:
                    await encoders[index].deliver_error(request, what)  # type: ignore[arg-type]
        finally:
            for enc in encoders:
                await enc.close()

    asyncio.run(main())


def _values(summary: dict[str, Any], modality: str) -> np.ndarray:
    return np.asarray(summary["embeddings"][modality]["values"], dtype=np.float32)


def _qwen2_audio_rows(mel_frames: int) -> int:
    """Qwen2-Audio's rows for a mel length (SGLang's qwen_audio.py: conv stride 2, then pooling)."""
    return ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1


def _opcodes(frame: bytes) -> list[tuple[str, Any]]:
    """The pickle's opcodes; torch's storage key (a memory address inside a tensor's bytes) masked.

    The address's decimal length varies from process to process, so the frame length (FRAME's
    argument) varies with it and is left out too, and so does the choice between SHORT_BINBYTES
    and BINBYTES for the tensor's bytes (under or over 256 of them): both read as BINBYTES.
    """
    ops = []
    for op, arg, _ in pickletools.genops(frame):
        name = "BINBYTES" if op.name == "SHORT_BINBYTES" else op.name
        if name == "FRAME":
            arg = None
        elif isinstance(arg, bytes):
            arg = re.sub(rb"X[\s\S]{4}\d{6,}", b"X<storage key>", arg)
        ops.append((name, arg))
    return ops


FRAME_CASES = [
    ({"req_id": "a_local_part_0", "num_parts": 2, "part_idx": 0, "modality": "IMAGE", "grid": [[1, 2, 4], [1, 4, 4]],
      "dtype": "float32", "shape": [6, 2]},
     _request("a_local_part_0", Modality.IMAGE, 2, 0), _part(torch.zeros(6, 2), [2, 4], [[1, 2, 4], [1, 4, 4]])),
    ({"req_id": "v", "num_parts": 1, "part_idx": 0, "modality": "VIDEO", "grid": [[2, 4, 4]], "dtype": "bfloat16", "shape": [8, 4],
      "second_per_grid_ts": [1.0], "video_timestamps": [[0.25, 1.25]]},
     _request("v", Modality.VIDEO, 1, 0),
     _part(torch.zeros(8, 4, dtype=torch.bfloat16), [8], [[2, 4, 4]], second_per_grid_ts=[1.0], video_timestamps=[[0.25, 1.25]])),
    ({"req_id": "au", "num_parts": 1, "part_idx": 0, "modality": "AUDIO", "grid": [4200, 800], "dtype": "float32", "shape": [3, 2]},
     _request("au", Modality.AUDIO, 1, 0), _part(torch.zeros(3, 2), [2, 1], [[3000, 1200], [800]])),
]


def test_frame0_is_what_each_releases_own_encoder_writes(sglang: SglangHarness):
    """SGLANG_VERSION=<release>: the same pickle as that release's EmbeddingData(**aux).copy_without_embedding()."""
    codec = SglangCodec(sglang.release)
    cases = [case for case, _, _ in FRAME_CASES] + [
        {"req_id": "e_local_part_1", "num_parts": 2, "part_idx": 1, "modality": "IMAGE", "error_msg": "slow", "error_code": 504}]
    theirs = [bytes.fromhex(h) for h in sglang.run({"mode": "pickle", "cases": cases})["pickles"]]
    ours = [codec.header(request, part) for _, request, part in FRAME_CASES]
    ours.append(codec.error_frames(_request("e_local_part_1", Modality.IMAGE, 2, 1), RequestTimeout("slow"))[0])
    for case, mine, own in zip(cases, ours, theirs):
        assert _opcodes(mine) == _opcodes(own), case["req_id"]


def test_auto_frames_are_read_by_every_release_and_0_5_23s_own_only_by_it(sglang: SglangHarness):
    auto, newest = SglangCodec("auto"), SglangCodec("0.5.23")
    error = RequestTimeout("slow")
    frames = [auto.header(r, p) for _, r, p in FRAME_CASES] + [auto.error_frames(FRAME_CASES[0][1], error)[0]]
    frames += [newest.header(FRAME_CASES[0][1], FRAME_CASES[0][2])]
    decoded = sglang.run({"mode": "unpickle", "frames": [f.hex() for f in frames]})["frames"]
    for frame in decoded[:4]:
        assert frame["ok"], frame
        assert frame["class"] == "sglang.srt.disaggregation.encoder.receiver.EmbeddingData" and frame["modality_is_receivers"]
    assert decoded[2]["attrs"]["grid_dim"] == [4200, 800]  # one length per item, windows summed
    assert decoded[1]["attrs"]["second_per_grid_ts"] == [1.0] and decoded[1]["attrs"]["video_timestamps"] == [[0.25, 1.25]]
    assert (decoded[3]["attrs"]["error_code"], decoded[3]["attrs"]["error_msg"]) == (504, "slow")
    # 0.5.23's own layout names the enum's new module, which older allowlists refuse: why auto is the default.
    assert decoded[4]["ok"] is (sglang.release == "0.5.23"), decoded[4]


def test_tokenizer_receiver_merges_parts_from_several_encoders(sglang: SglangHarness):
    """Image and audio parts from three encoders, out of order (after a stale part where the release filters them)."""
    port = sglang.start({"mode": "frames-tokenizer", "req_id": "rq"})["port"]
    img0, img1, audio = torch.randn(4, 8), torch.randn(2, 8), torch.randn(5, 8)
    # 0.5.19's tokenizer path has no stale-part filter (a part of another rid would be merged): the pod
    # never sends one there (each request gets a fresh port), so only later releases see the stray.
    stale = [] if sglang.release == "0.5.19" else [
        (0, _request("old_local_part_0", Modality.IMAGE, 1, 0, port), _part(torch.ones(1, 8), [1], [[1, 1, 4]]))]
    _push(TransferBackend.ZMQ_TO_TOKENIZER, stale + [
        (2, _request("rq_local_part_2", Modality.AUDIO, 3, 2, port), _part(audio, [3, 2], [[60], [40]])),
        (1, _request("rq_local_part_1", Modality.IMAGE, 3, 1, port), _part(img1, [2], [[1, 2, 4]])),
        (0, _request("rq_local_part_0", Modality.IMAGE, 3, 0, port), _part(img0, [4], [[1, 4, 4]])),
    ])
    result = sglang.result()
    merged = result["returned"]
    assert merged is not None, result["logs"]
    np.testing.assert_array_equal(_values(merged, "IMAGE"), torch.cat([img0, img1]).numpy())
    np.testing.assert_array_equal(_values(merged, "AUDIO"), audio.numpy())
    assert merged["meta"]["img_grid_thw"] == [[1, 4, 4], [1, 2, 4]] and merged["meta"]["audio_feature_lens"] == [60, 40]
    if stale:
        assert any("stale" in line.lower() for line in result["logs"]), result["logs"]


def test_tokenizer_receiver_stops_on_an_error_part(sglang: SglangHarness):
    port = sglang.start({"mode": "frames-tokenizer", "req_id": "er"})["port"]
    _push(TransferBackend.ZMQ_TO_TOKENIZER, [
        (0, _request("er_local_part_0", Modality.IMAGE, 2, 0, port), _part(torch.ones(2, 4), [2], [[1, 2, 4]])),
        (1, _request("er_local_part_1", Modality.IMAGE, 2, 1, port), RequestTimeout("took too long")),
    ])
    result = sglang.result()
    assert result["returned"] is None
    assert any("took too long" in line and "504" in line for line in result["logs"]), result["logs"]


def test_scheduler_drain_routes_parts_errors_and_strays(sglang: SglangHarness):
    port = sglang.start({"mode": "frames-scheduler", "rids": {"ok": {}, "bad": {}}})["port"]
    parts = [torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(1, 16, dtype=torch.bfloat16)]
    _push(TransferBackend.ZMQ_TO_SCHEDULER, [
        (0, _request("ghost_local_part_0", Modality.IMAGE, 1, 0, port), _part(torch.ones(1, 16), [1], [[1, 1, 4]])),
        (1, _request("ok_local_part_1", Modality.IMAGE, 2, 1, port), _part(parts[1], [1], [[1, 2, 2]])),
        (0, _request("ok_local_part_0", Modality.IMAGE, 2, 0, port), _part(parts[0], [3], [[1, 2, 6]])),
        (0, _request("bad_local_part_0", Modality.AUDIO, 2, 0, port), _part(torch.ones(2, 16), [2], [[9]])),
        (1, _request("bad_local_part_1", Modality.AUDIO, 2, 1, port), RequestTimeout("slow audio")),
    ])
    result = sglang.result()
    [rank] = result["ranks"]
    assert rank["ok"]["status"] == "SUCCESS", (rank["ok"], result["logs"])
    np.testing.assert_array_equal(_values(rank["ok"]["mm"], "IMAGE"), torch.cat(parts).float().numpy())
    assert rank["ok"]["mm"]["embeddings"]["IMAGE"]["dtype"] == "bfloat16"
    assert rank["ok"]["mm"]["meta"]["img_grid_thw"] == [[1, 2, 6], [1, 2, 2]]
    assert (rank["bad"]["status"], rank["bad"]["error_code"]) == ("FAIL", 504) and "slow audio" in rank["bad"]["error_msg"]
    assert any("inactive request" in line for line in result["logs"]), result["logs"]


@pytest.mark.parametrize("windows", [[[3000, 1200]], [[3000], [1200]]], ids=["one-42s-item", "two-items"])
def test_audio_lengths_pass_the_releases_layout_check(sglang: SglangHarness, windows):
    """Qwen2-Audio's own get_mm_data (and 0.5.20+'s layout check) over our audio grid: every row consumed.

    An adapter that splits a 42 s item into 30 s windows reports each window; the frame carries ONE
    length per item (their sum), which is what SGLang's encoder sends and its receiver checks.
    """
    items = len(windows)
    spec = {"mode": "frames-tokenizer", "req_id": "au", "processor": "qwen2_audio", "audio_items": items}
    port = sglang.start(spec)["port"]
    rows = [sum(_qwen2_audio_rows(w) for w in item) for item in windows]
    audio = torch.randn(sum(rows), 8)
    _push(TransferBackend.ZMQ_TO_TOKENIZER, [(0, _request("au_local_part_0", Modality.AUDIO, 1, 0, port), _part(audio, rows, windows))])
    result = sglang.result()
    merged = result["returned"]
    assert merged is not None, result["logs"]
    assert [item["rows"][0] for item in merged["items"]] == rows
    np.testing.assert_array_equal(_values(merged, "AUDIO"), audio.numpy())
    assert merged["meta"]["audio_feature_lens"] == [sum(item) for item in windows]


def test_video_timing_reaches_the_processor_as_sglangs_encoder_sends_it(sglang: SglangHarness):
    port = sglang.start({"mode": "frames-tokenizer", "req_id": "vd"})["port"]
    clips = [torch.randn(8, 4), torch.randn(4, 4)]
    _push(TransferBackend.ZMQ_TO_TOKENIZER, [
        (1, _request("vd_local_part_1", Modality.VIDEO, 2, 1, port),
         _part(clips[1], [4], [[1, 4, 4]], second_per_grid_ts=[2.0], video_timestamps=[[0.5]])),
        (0, _request("vd_local_part_0", Modality.VIDEO, 2, 0, port),
         _part(clips[0], [8], [[2, 4, 4]], second_per_grid_ts=[1.0], video_timestamps=[[0.25, 1.25]])),
    ])
    merged = sglang.result()["returned"]
    np.testing.assert_array_equal(_values(merged, "VIDEO"), torch.cat(clips).numpy())
    assert merged["meta"]["video_grid_thw"] == [[2, 4, 4], [1, 4, 4]]
    assert merged["meta"]["second_per_grid_ts"] == [1.0, 2.0] and merged["meta"]["video_timestamps"] == [[0.25, 1.25], [0.5]]
    assert merged["meta_types"]["second_per_grid_ts"] == "list[Tensor]"  # chained per video, as from SGLang's encoder
