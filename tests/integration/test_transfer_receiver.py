"""The receiver library and the PUSH socket pool over real ZMQ sockets on loopback (no server)."""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
import torch
import zmq

from encoder_pod.errors import InvalidRequest, TransferFailed
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.receiver import (
    AsyncEmbeddingReceiver,
    EmbeddingReceiver,
    MalformedMessage,
    PayloadMismatch,
    RemoteEncodeError,
    RequestExpired,
    UnsupportedVersion,
    WaitTimeout,
)
from encoder_pod.settings import TransferBackend, load_settings
from encoder_pod.transfer.frames import EncoderpoolCodec
from encoder_pod.transfer.push_sender import PushSender
from encoder_pod.transfer.zmq_push import ZmqTransfer
from testkit.server import free_port

pytestmark = pytest.mark.integration


def request(req_id: str, port: int | tuple[int, ...], num_parts: int = 1, part_idx: int = 0) -> EncodeRequest:
    return EncodeRequest(req_id, Modality.IMAGE, (ItemSpec("x"),), num_parts, part_idx, "127.0.0.1", port)


def good(req_id: str, rows: int = 3) -> list[bytes]:
    part = EncodedPart(torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4), [rows], [[1, 1, rows]])
    return [bytes(f) for f in EncoderpoolCodec().part_frames(request(req_id, 1), part)]


def malformed() -> list[tuple[str | None, list[bytes], type]]:
    """(req_id the error names, frames, error type): one of each kind of damage."""
    header, payload = good("bad-count")
    raw = msgpack.unpackb(good("bad-version")[0])
    raw["v"] = 99
    return [
        (None, [b"\x00\x01garbage"], MalformedMessage),
        (None, [good("cut")[0][:30], payload], MalformedMessage),
        ("bad-count", [header, payload[:-4]], PayloadMismatch),
        ("bad-version", [msgpack.packb(raw), payload], UnsupportedVersion),
        (None, [b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00"], MalformedMessage),
        (None, [], MalformedMessage),
    ]


class Pusher:
    """A plain PUSH socket: sends whatever frames a test hands it."""

    def __init__(self, port: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def send(self, frames: list[bytes]) -> None:
        if frames:
            self.sock.send_multipart(frames)
        else:
            self.sock.send(b"", zmq.SNDMORE)  # an empty multipart cannot be sent: a zero-length lone frame is the closest
            self.sock.send(b"")

    def close(self) -> None:
        self.sock.close(linger=1000)
        self.ctx.term()


def test_sync_receiver_survives_malformed_frames():
    rejected = []
    with EmbeddingReceiver(on_rejected=rejected.append, expire_after=30) as rx:
        pusher = Pusher(rx.port)
        try:
            for _, frames, _ in malformed():
                pusher.send(frames)
            pusher.send(good("fine"))
            got = rx.wait("fine", timeout=10)
            assert got.embedding().shape == (3, 4)
            for req_id, _, error in malformed():
                if req_id is not None:
                    with pytest.raises(error):
                        rx.wait(req_id, timeout=5)
            assert rx.rejected == len(rejected) >= 3
            assert all(isinstance(e, MalformedMessage) for e in rejected)
            with pytest.raises(WaitTimeout):
                rx.wait("never", timeout=0.2)
        finally:
            pusher.close()


def test_async_receiver_survives_malformed_frames_and_expires_requests():
    # Every wait is in place before the first frame goes out: with expire_after=0.5 an outcome nobody
    # has claimed yet is dropped after half a second, and on a loaded machine "fine" can take longer
    # than that to come back, so waiting for the requests one after another would race the expiry.
    async def expect(rx, req_id, error, match=None):
        with pytest.raises(error, match=match):
            await rx.wait(req_id, timeout=10)

    async def main():
        async with AsyncEmbeddingReceiver(expire_after=0.5) as rx:
            pusher = Pusher(rx.port)
            try:
                fine = asyncio.ensure_future(rx.wait("fine", timeout=10))
                failures = [asyncio.ensure_future(expect(rx, req_id, error)) for req_id, _, error in malformed() if req_id is not None]
                failures.append(asyncio.ensure_future(expect(rx, "half", RequestExpired, match="1 of 2 parts")))
                await asyncio.sleep(0)  # each wait registers its waiter before anything is sent
                for _, frames, _ in malformed():
                    pusher.send(frames)
                half = EncoderpoolCodec().part_frames(request("half_local_part_0", 1, 2, 0), EncodedPart(torch.ones(1, 2), [1], [[]]))
                pusher.send([bytes(f) for f in half])
                pusher.send(good("fine"))
                assert (await fine).embedding().shape == (3, 4)
                await asyncio.gather(*failures)
                assert rx.rejected >= 3
            finally:
                pusher.close()

    asyncio.run(main())


def test_async_receiver_takes_every_message_of_a_burst_including_those_before_it_started():
    """ZMQ's descriptor signals once for many messages: none may be left in the socket unread."""
    async def main():
        rx = AsyncEmbeddingReceiver(expire_after=30)
        pusher = Pusher(rx.port)
        try:
            before = [f"early-{n}" for n in range(5)]
            for req_id in before:
                pusher.send(good(req_id))
            deadline = time.monotonic() + 10
            while rx._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN == 0:  # queued in the socket, nobody reading
                assert time.monotonic() < deadline, "the early messages never reached the socket"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            async with rx:
                burst = [f"burst-{n}" for n in range(300)]  # more than one drain takes in a loop turn
                for req_id in burst:
                    pusher.send(good(req_id))
                got = await asyncio.wait_for(asyncio.gather(*(rx.wait(r, timeout=20) for r in before + burst)), 30)
                assert [g.embedding().shape for g in got] == [(3, 4)] * len(before + burst)
        finally:
            pusher.close()

    asyncio.run(main())


def test_transfer_delivers_parts_and_errors_to_the_receiver():
    async def main():
        transfer = ZmqTransfer(load_settings(env={"ENCODER_SEND_TIMEOUT": "5", "ENCODER_WIRE_FORMAT": "encoderpool"}).transfer, TransferBackend.ZMQ_TO_TOKENIZER)
        try:
            async with AsyncEmbeddingReceiver() as rx:
                emb = torch.randn(4, 8, dtype=torch.bfloat16)
                await transfer.deliver(request("m_local_part_1", rx.port, 2, 1), EncodedPart(emb, [4], [[1, 2, 8]]))
                await transfer.deliver_error(request("m_local_part_0", rx.port, 2, 0), InvalidRequest("mm_items[0]: no"))
                with pytest.raises(RemoteEncodeError) as info:
                    await rx.wait("m", timeout=5)
                assert (info.value.status, info.value.part_idx) == (400, 0) and "mm_items[0]" in info.value.message
        finally:
            await transfer.close()

    asyncio.run(main())


def test_pool_is_bounded_and_idle_sockets_close():
    async def main():
        sender = PushSender(max_sockets=2, idle_s=0.3, linger_s=0)
        receivers = [EmbeddingReceiver() for _ in range(3)]
        try:
            for rx in receivers:
                await sender.send(f"tcp://127.0.0.1:{rx.port}", good(f"to-{rx.port}"), timeout=5)
                assert sender.open_sockets <= 2
            for rx in receivers:
                assert rx.wait(f"to-{rx.port}", timeout=5).embedding().shape == (3, 4)
            deadline = time.monotonic() + 5
            while sender.open_sockets and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert sender.open_sockets == 0
        finally:
            await sender.close()
            for rx in receivers:
                rx.close()

    asyncio.run(main())


def test_dead_destination_costs_only_its_own_callers():
    async def main():
        sender = PushSender(max_sockets=1, idle_s=60, linger_s=0)
        dead = f"tcp://127.0.0.1:{free_port()}"
        try:
            with EmbeddingReceiver() as rx:
                parked = asyncio.ensure_future(sender.send(dead, good("d"), timeout=1.5))
                await asyncio.sleep(0.1)
                # The only pooled socket is busy with the dead peer: a new destination fails fast.
                started = time.monotonic()
                with pytest.raises(TransferFailed, match="ENCODER_TRANSFER_MAX_SOCKETS"):
                    await sender.send(f"tcp://127.0.0.1:{rx.port}", good("live"), timeout=5)
                assert time.monotonic() - started < 0.5
                with pytest.raises(TransferFailed, match=r"127\.0\.0\.1:\d+ accepted no connection within 1\.[45]"):
                    await parked
                # Once the dead send gave up, its idle socket makes room for the live destination.
                started = time.monotonic()
                await sender.send(f"tcp://127.0.0.1:{rx.port}", good("live"), timeout=5)
                assert time.monotonic() - started < 0.5
                assert rx.wait("live", timeout=5).embedding().shape == (3, 4)
        finally:
            await sender.close()

    asyncio.run(main())


def test_no_task_or_socket_growth_pushing_to_dead_ports():
    async def main():
        settings = load_settings(env={"ENCODER_SEND_TIMEOUT": "0.05", "ENCODER_TRANSFER_MAX_SOCKETS": "4"}).transfer
        transfer = ZmqTransfer(settings, TransferBackend.ZMQ_TO_SCHEDULER)
        ports = [free_port() for _ in range(10)]
        part = EncodedPart(torch.ones(2, 2), [2], [[]])
        try:
            tasks_before = len(asyncio.all_tasks())
            for i in range(50):
                req = request(f"d{i}", (ports[i % 10], ports[(i + 1) % 10]))
                with pytest.raises(TransferFailed, match=f"127.0.0.1:{ports[i % 10]}"):
                    await transfer.deliver(req, part)
                await transfer.deliver_error(req, TransferFailed("x"))
                assert transfer.sender.open_sockets <= 4
            assert len(asyncio.all_tasks()) == tasks_before
        finally:
            await transfer.close()

    asyncio.run(main())
