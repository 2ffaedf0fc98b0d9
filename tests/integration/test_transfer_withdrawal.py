"""What a 502 means, over real ZMQ sockets on loopback: a receiver that accepts and then stalls
(it stops reading; a tiny RCVHWM and RCVBUF so the connection fills), then resumes. Every push the
sender gave up on (TransferFailed, the pod's 502) is never received after the resume, and every
push that succeeded is received exactly once: a timed-out push is withdrawn, not left queued."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import torch
import zmq

from encoder_pod.errors import TransferFailed
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.receiver.wire import decode_message
from encoder_pod.settings import TransferBackend, load_settings
from encoder_pod.transfer.zmq_push import ZmqTransfer

pytestmark = pytest.mark.integration


class StallingReceiver:
    """A PULL socket that reads nothing until :meth:`resume` (what a wedged prefill server does)."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, 1)
        self.sock.setsockopt(zmq.RCVBUF, 4096)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")

    def resume(self, quiet_s: float = 3.0, timeout: float = 60.0) -> Counter[tuple[str, int]]:
        """Read until nothing came for ``quiet_s``; (req_id, part_idx) of each embedding received."""
        got: Counter[tuple[str, int]] = Counter()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.sock.poll(int(quiet_s * 1000)):
            header, _ = decode_message(self.sock.recv_multipart(copy=False))
            if not header.is_error:
                got[(header.req_id, header.part_idx)] += 1
        return got

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def _request(req_id: str, port: int) -> EncodeRequest:
    return EncodeRequest(req_id, Modality.IMAGE, (ItemSpec("x"),), 1, 0, "127.0.0.1", port)


async def _push_all(transfer: ZmqTransfer, port: int, n: int, rows: int, width: int) -> tuple[set[str], set[str]]:
    part = EncodedPart(torch.randn(rows, width), [rows], [[1, 1, rows]])

    async def one(i: int) -> tuple[str, bool]:
        try:
            await transfer.deliver(_request(f"r{i}", port), part)
            return f"r{i}", True
        except TransferFailed:
            return f"r{i}", False

    results = await asyncio.gather(*(one(i) for i in range(n)))
    return {r for r, ok in results if ok}, {r for r, ok in results if not ok}


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "rows,width,n,stalls",
    [(1024, 128, 48, True), (4, 64, 48, False)],
    ids=["512KiB-parts-fill-the-connection", "1KiB-parts-fit-in-the-kernel"],
)
def test_a_failed_push_is_never_delivered_after_the_receiver_resumes(rows, width, n, stalls):
    settings = load_settings(env={"ENCODER_SEND_TIMEOUT": "3", "ENCODER_WIRE_FORMAT": "encoderpool"}).transfer
    rx = StallingReceiver()

    async def main() -> tuple[set[str], set[str], Counter[tuple[str, int]]]:
        transfer = ZmqTransfer(settings, TransferBackend.ZMQ_TO_TOKENIZER)
        try:
            ok, failed = await _push_all(transfer, rx.port, n, rows, width)
            # The receiver resumes while the pod lives on (its sockets open), as a wedged one would.
            return ok, failed, await asyncio.to_thread(rx.resume)
        finally:
            await transfer.close()

    try:
        ok, failed, got = asyncio.run(main())
    finally:
        rx.close()
    received = {req_id for req_id, _ in got}
    print(f"\n{n} pushes of {rows * width * 4} bytes to a stalled receiver: {len(ok)} succeeded, {len(failed)} failed; "
          f"after the resume {len(received)} received, {len(received & failed)} of them failed pushes, "
          f"duplicates {sum(c - 1 for c in got.values())}")
    assert ok | failed == {f"r{i}" for i in range(n)}
    assert not received & failed, "a push answered as failed (502) was delivered after all"
    assert received == ok, f"succeeded but never received: {sorted(ok - received)}"
    assert all(c == 1 for c in got.values())
    if stalls:  # 24 MiB to a reader of a few KiB: the kernel's buffers fill, later pushes time out
        assert failed and ok, "the receiver never stalled (or nothing got through): the test proves nothing"
