"""The mooncake backend's staging table with real mooncake engines on loopback (TCP) and real ZMQ acks.

The "prefill rank" here is a bare ``mooncake.engine.TransferEngine`` with a registered host buffer
and a PULL socket; SGLang's own receiver for this flow runs in test_sglang_epd.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest
import torch
import zmq

from encoder_pod.errors import ErrorKind, InvalidRequest, ItemError, RequestTimeout, TransferFailed
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.transfer.mooncake import MooncakeStaging
from encoder_pod.transfer.mooncake_engine import MooncakeEngine
from encoder_pod.transfer.push_sender import PushSender
from encoder_pod.transfer.router import MooncakeTransfer
from encoder_pod.transfer.sglang_frames import SglangCodec
from tests.support.sglang_harness import SglangHarness

pytestmark = pytest.mark.integration


class Rank:
    """A prefill TP rank's side of mooncake: an engine, a registered landing buffer, a PULL socket for acks."""

    def __init__(self, ctx: zmq.Context, nbytes: int) -> None:
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        assert self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        self.session = f"127.0.0.1:{self.engine.get_rpc_port()}"
        self.buffer = torch.zeros(nbytes, dtype=torch.uint8)
        assert self.engine.register_memory(self.buffer.data_ptr(), nbytes) == 0
        self.sock = ctx.socket(zmq.PULL)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")

    def send_body(self, req_id: str, part_idx: int, receive_count: int, offset: int = 0, **override: Any) -> dict[str, Any]:
        return {"req_id": req_id, "part_idx": part_idx, "prefill_host": "127.0.0.1", "embedding_port": self.port,
                "session_id": self.session, "buffer_address": self.buffer.data_ptr() + offset,
                "receive_count": receive_count, **override}

    def close(self) -> None:
        self.sock.close(linger=0)
        self.engine.unregister_memory(self.buffer.data_ptr())

    def ack(self, timeout_ms: int = 10_000) -> list[bytes]:
        assert self.sock.poll(timeout_ms), "no acknowledgement arrived"
        return self.sock.recv_multipart()


@pytest.fixture
def zmq_ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.term()


def _staging(ttl: float = 30.0) -> MooncakeStaging:
    return MooncakeStaging(MooncakeEngine("127.0.0.1", "tcp"), PushSender(), SglangCodec("auto"), ttl=ttl, max_entries=8)


def _request(req_id: str, part_idx: int = 0, num_parts: int = 1) -> EncodeRequest:
    return EncodeRequest(req_id, Modality.IMAGE, (ItemSpec("x"),), num_parts, part_idx, "127.0.0.1", None)


def test_every_rank_gets_the_bytes_and_an_ack_and_the_part_lives_until_the_last(zmq_ctx, sglang_newest: SglangHarness):
    embedding = torch.randn(6, 16)
    part = EncodedPart(embedding, [2, 4], [[1, 2, 4], [1, 4, 4]])
    ranks = [Rank(zmq_ctx, embedding.numel() * 4) for _ in range(2)]

    async def main() -> list[list[bytes]]:
        staging = _staging()
        try:
            assert await MooncakeTransfer(staging).deliver(_request("r_local_part_0"), part) is None  # /encode: null
            meta = await staging.meta({"req_id": "r_local_part_0", "part_idx": 0})
            assert meta == {"req_id": "r_local_part_0", "part_idx": 0, "embedding_size": 384, "embedding_len": 6, "embedding_dim": 16}
            acks = []
            await staging.send({**meta, **ranks[0].send_body("r_local_part_0", 0, 2)})
            acks.append(ranks[0].ack())
            await staging.send({**meta, **ranks[0].send_body("r_local_part_0", 0, 2)})  # a retry from the same rank
            acks.append(ranks[0].ack())
            assert len(staging) == 1, "released before the second rank had its copy"
            await staging.send({**meta, **ranks[1].send_body("r_local_part_0", 0, 2)})
            acks.append(ranks[1].ack())
            assert len(staging) == 0, "kept after every rank had its copy"
            with pytest.raises(TransferFailed, match="no staged embedding"):
                await staging.send({**meta, **ranks[1].send_body("r_local_part_0", 0, 2)})
            return acks
        finally:
            staging.close()
            await staging._sender.close()

    try:
        acks = asyncio.run(main())
    finally:
        for rank in ranks:
            rank.close()
    for rank in ranks:
        assert torch.equal(rank.buffer.view(torch.float32).reshape(6, 16), embedding)
    assert all(len(ack) == 1 for ack in acks)  # one frame: the bytes went by mooncake
    [decoded] = sglang_newest.run({"mode": "unpickle", "frames": [acks[0][0].hex()]})["frames"]
    assert decoded["ok"] and decoded["attrs"]["shape"] == [6, 16] and decoded["attrs"]["grid_dim"] == [[1, 2, 4], [1, 4, 4]]


def test_a_pull_before_the_encode_waits_and_failures_reach_the_ranks(zmq_ctx):
    rank = Rank(zmq_ctx, 64)

    async def main() -> None:
        staging = _staging(ttl=1.0)
        try:
            early = asyncio.ensure_future(staging.meta({"req_id": "late_local_part_0", "part_idx": 0}))
            await asyncio.sleep(0.2)
            assert not early.done()
            staging.stage(_request("late_local_part_0"), EncodedPart(torch.ones(2, 8), [2], [[1, 2, 4]]))
            assert (await early)["embedding_size"] == 64

            staging.stage_error(_request("bad_local_part_0"), ItemError(1, "bytes are not a decodable image"))
            with pytest.raises(InvalidRequest, match="mm_items\\[1\\]") as info:
                await staging.meta({"req_id": "bad_local_part_0", "part_idx": 0})
            assert info.value.kind is ErrorKind.INVALID_REQUEST
            with pytest.raises(RequestTimeout, match="not ready within 1s"):
                await staging.meta({"req_id": "never_local_part_0", "part_idx": 0})
            with pytest.raises(InvalidRequest, match="embedding_size"):
                await staging.send({**rank.send_body("late_local_part_0", 0, 1), "embedding_size": 63})
            with pytest.raises(InvalidRequest, match="session_id"):
                await staging.send({**rank.send_body("late_local_part_0", 0, 1), "session_id": None})
            assert staging.sweep(now=asyncio.get_running_loop().time() + 10**9) >= 1  # unsent parts expire
        finally:
            staging.close()
            await staging._sender.close()

    try:
        asyncio.run(main())
    finally:
        rank.close()
