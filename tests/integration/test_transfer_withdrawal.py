"""What a 502 means, over real ZMQ sockets on loopback: a receiver that accepts and then stalls
(it stops reading; a tiny RCVHWM and RCVBUF so the connection fills), then resumes. Every push the
sender gave up on (TransferFailed, the pod's 502) is never received after the resume, and every
push that succeeded is received exactly once: a timed-out push is withdrawn, not left queued.
Once on the transfer alone, once through a real server's /encode."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import zmq

from encoder_pod.errors import TransferFailed
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.settings import TransferBackend, load_settings
from encoder_pod.transfer.push_sender import PushSender
from encoder_pod.transfer.zmq_push import ZmqTransfer
from tests.integration.encode_client import encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer
from tests.support.stalling_receiver import StallingReceiver

pytestmark = pytest.mark.integration


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


@pytest.mark.timeout(400)
def test_encode_answers_502_only_for_what_the_stalled_receiver_never_gets(tiny_model):
    env = {
        "ENCODER_TRANSFER_BACKEND": "zmq_to_tokenizer",
        "ENCODER_WIRE_FORMAT": "encoderpool",
        "ENCODER_SEND_TIMEOUT": "4",
    }
    items = [png_data_uri(224, 224, seed=i) for i in range(16)]  # 16 x 64 tokens of 128 floats: 0.5 MiB a part
    n = 40
    rx = StallingReceiver()
    try:
        with EncoderServer(tiny_model("qwen2_vl"), env=env) as server:

            def post(i: int) -> tuple[str, int, str]:
                resp = encode(server.base_url, f"q{i}", items, prefill_host="127.0.0.1", embedding_port=rx.port, timeout=120)
                return f"q{i}", resp.status_code, resp.text

            with ThreadPoolExecutor(n) as pool:
                answers = list(pool.map(post, range(n)))
            got = rx.resume()  # the pod still runs: a queued push would be sent now
    finally:
        rx.close()
    ok = {r for r, code, _ in answers if code == 200}
    failed = {r for r, code, _ in answers if code == 502}
    received = {req_id for req_id, _ in got}
    print(f"\n{n} /encode to a stalled receiver: {len(ok)} x 200, {len(failed)} x 502 "
          f"({next((t for _, c, t in answers if c == 502), '')[:160]}); after the resume {len(received)} received, "
          f"{len(received & failed)} of them 502s")
    assert ok | failed == {f"q{i}" for i in range(n)}, [a for a in answers if a[1] not in (200, 502)]
    assert failed and ok, "the receiver never stalled (or nothing got through): the test proves nothing"
    assert not received & failed, "a request answered 502 was delivered after all"
    assert received == ok
    assert all(c == 1 for c in got.values())


def _bind_again(ctx: zmq.Context, port: int) -> zmq.Socket:
    """A PULL socket on ``port`` once the old one let go of it (libzmq closes asynchronously)."""
    deadline = time.monotonic() + 10
    while True:
        sock = ctx.socket(zmq.PULL)
        try:
            sock.bind(f"tcp://127.0.0.1:{port}")
            return sock
        except zmq.ZMQError:
            sock.close(linger=0)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_peer_that_is_no_zmq_socket_fails_fast():
    junk = socket.create_server(("127.0.0.1", 0))
    port = junk.getsockname()[1]

    def answer_junk() -> None:
        conn, _ = junk.accept()
        with conn:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.settimeout(5)
            try:
                conn.recv(1024)
            except OSError:
                pass

    async def main() -> float:
        sender = PushSender(max_sockets=4, idle_s=60, linger_s=0)
        try:
            started = time.monotonic()
            with pytest.raises(TransferFailed, match=f"127.0.0.1:{port}: not a ZMTP peer"):
                await sender.send(f"tcp://127.0.0.1:{port}", [b"h", bytes(64 * 1024)], timeout=30)
            return time.monotonic() - started
        finally:
            await sender.close()

    thread = threading.Thread(target=answer_junk, daemon=True)
    thread.start()
    try:
        assert asyncio.run(main()) < 5
    finally:
        junk.close()
        thread.join(10)


def test_a_restarted_receiver_gets_the_next_push_and_never_half_of_one():
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []

    async def main() -> None:
        sender = PushSender(max_sockets=4, idle_s=60, linger_s=0)
        frames = [b"h", bytes(64 * 1024)]
        try:
            socks.append(ctx.socket(zmq.PULL))
            port = socks[0].bind_to_random_port("tcp://127.0.0.1")
            await sender.send(f"tcp://127.0.0.1:{port}", frames, timeout=10)
            assert [len(f) for f in socks[0].recv_multipart()] == [1, 64 * 1024]
            socks.pop().close(linger=0)  # the prefill server restarts on the same port
            socks.append(await asyncio.to_thread(_bind_again, ctx, port))
            outcomes = []
            for n in range(3):
                # A push may still meet the old connection: it fails whole, or, when libzmq had not
                # closed that connection yet, it is "sent" into it and goes down with it (TCP
                # delivers only while the connection lasts). Either way never half of one.
                try:
                    await sender.send(f"tcp://127.0.0.1:{port}", [f"h{n}".encode(), frames[1]], timeout=10)
                    outcomes.append("sent")
                except TransferFailed as exc:
                    outcomes.append(str(exc))
            assert outcomes[-1] == "sent", outcomes
            got = []
            while socks[0].poll(2000):
                head, body = socks[0].recv_multipart()
                assert len(body) == 64 * 1024, "half a message was delivered"
                got.append(head.decode())
            assert "h2" in got, (outcomes, got)  # the restarted receiver gets the next push
            assert set(got) <= {f"h{n}" for n, o in enumerate(outcomes) if o == "sent"}, (outcomes, got)
        finally:
            await sender.close()

    try:
        asyncio.run(main())
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()
