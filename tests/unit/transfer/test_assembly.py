"""Merging parts: order, modalities, errors, duplicates and expiry (pure state, no sockets)."""

from __future__ import annotations

import pytest
import torch

from encoder_pod.errors import ErrorKind
from encoder_pod.modality import Modality
from encoder_pod.receiver.assembly import Assembler, Completed, Failed, Rejected
from encoder_pod.receiver.errors import InconsistentParts, PayloadMismatch, RemoteEncodeError, RequestExpired
from encoder_pod.receiver.wire import pack_error_header, pack_part_header

pytestmark = pytest.mark.unit


def part(rid: str, idx: int, n: int, tensor: torch.Tensor, modality=Modality.IMAGE, tokens=None):
    tokens = tokens or [tensor.shape[0]]
    header = pack_part_header(
        req_id=f"{rid}_local_part_{idx}", num_parts=n, part_idx=idx, modality=modality,
        dtype=str(tensor.dtype).removeprefix("torch."), shape=list(tensor.shape), item_tokens=tokens,
        item_grids=[[1, idx, t] for t in tokens], send_time=0,
    )
    return [header, tensor.contiguous().view(torch.uint8).numpy().tobytes()]


def error(rid: str, idx: int, n: int):
    return [pack_error_header(req_id=f"{rid}_local_part_{idx}", num_parts=n, part_idx=idx, modality=Modality.IMAGE,
                              error_kind=ErrorKind.TIMEOUT, error_code=504, error_msg="slow", send_time=0)]


def test_parts_out_of_order_merge_in_part_order_per_modality():
    asm = Assembler()
    a, b, c = torch.randn(3, 4), torch.randn(2, 4), torch.randn(5, 8, dtype=torch.bfloat16)
    assert asm.feed(part("r", 2, 3, c, Modality.AUDIO), 0) is None
    assert asm.feed(part("r", 1, 3, b, tokens=[1, 1]), 0) is None
    done = asm.feed(part("r", 0, 3, a), 0)
    assert isinstance(done, Completed) and done.request_id == "r"
    image = done.result.modalities[Modality.IMAGE]
    assert torch.equal(image.embedding, torch.cat([a, b]))
    assert image.item_tokens == (3, 1, 1) and image.item_grids == ((1, 0, 3), (1, 1, 1), (1, 1, 1))
    assert torch.equal(done.result.embedding(Modality.AUDIO), c)
    assert [h.part_idx for h in done.result.parts] == [0, 1, 2]
    assert asm.pending == 0


def test_error_part_fails_the_request_with_its_kind_and_later_parts_are_stale():
    asm = Assembler()
    assert asm.feed(part("r", 0, 2, torch.ones(1, 2)), 0) is None
    failed = asm.feed(error("r", 1, 2), 0)
    assert isinstance(failed, Failed) and isinstance(failed.error, RemoteEncodeError)
    assert (failed.error.kind, failed.error.status, failed.error.part_idx) == (ErrorKind.TIMEOUT, 504, 1)
    assert asm.feed(part("r", 1, 2, torch.ones(1, 2)), 1) is None and asm.pending == 0


@pytest.mark.parametrize("second, needle", [
    (lambda: part("r", 0, 2, torch.ones(1, 2)), "arrived twice"),
    (lambda: part("r", 1, 3, torch.ones(1, 2)), "says 3 parts"),
    (lambda: part("r", 1, 2, torch.ones(1, 3)), "float32 x 3"),
    (lambda: part("r", 1, 2, torch.ones(1, 2, dtype=torch.float16)), "float16"),
])
def test_disagreeing_parts_fail_the_request(second, needle):
    asm = Assembler()
    asm.feed(part("r", 0, 2, torch.ones(1, 2)), 0)
    failed = asm.feed(second(), 0)
    assert isinstance(failed, Failed) and isinstance(failed.error, InconsistentParts) and needle in failed.error.message


def test_bad_payload_fails_its_request_and_garbage_is_rejected_alone():
    asm = Assembler()
    header, payload = part("r", 0, 1, torch.ones(2, 2))
    failed = asm.feed([header, payload[:-1]], 0)
    assert isinstance(failed, Failed) and failed.request_id == "r" and isinstance(failed.error, PayloadMismatch)
    rejected = asm.feed([b"\xff\xfe"], 0)
    assert isinstance(rejected, Rejected)


def test_incomplete_requests_expire():
    asm = Assembler(expire_after=10)
    asm.feed(part("r", 0, 2, torch.ones(1, 2)), 100)
    assert asm.next_expiry() == 110
    assert asm.expire(109.9) == []
    [failed] = asm.expire(110)
    assert isinstance(failed.error, RequestExpired) and (failed.error.received, failed.error.num_parts) == (1, 2)
    assert asm.pending == 0


def test_pending_requests_are_bounded():
    asm = Assembler(max_pending=2)
    asm.feed(part("a", 0, 2, torch.ones(1, 2)), 0)
    asm.feed(part("b", 0, 2, torch.ones(1, 2)), 0)
    failed = asm.feed(part("c", 0, 2, torch.ones(1, 2)), 0)
    assert isinstance(failed, Failed) and "already pending" in failed.error.message
