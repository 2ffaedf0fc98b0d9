"""A worker answers a control Call by name: a name no backend declares is an explicit error, never another operation."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from encoder_pod.errors import ErrorKind
from encoder_pod.metrics import ReplicaMetrics
from encoder_pod.parallel.messages import Call, Error, ProtocolError, WorkerSpec, pack, unpack
from encoder_pod.parallel.worker import WorkerServer
from encoder_pod.runtime import EncoderRuntime
from encoder_pod.settings import load_settings

pytestmark = pytest.mark.unit


async def _answer_to(call: Call, backend: str) -> Error:
    settings = load_settings(env={"ENCODER_TRANSFER_BACKEND": backend})
    worker = WorkerServer(WorkerSpec(0, 1, "inproc://in", "inproc://out", settings.model_dump_json(), {}), settings)
    worker.runtime = EncoderRuntime(settings, ReplicaMetrics())  # its transfer router is made at once; no model is loaded
    ctx = zmq.asyncio.Context()
    front = ctx.socket(zmq.PULL)
    front.bind("inproc://out")
    worker._out = ctx.socket(zmq.PUSH)  # the real socket pair a worker answers its front on
    worker._out.connect("inproc://out")
    try:
        worker._dispatch(call, [])
        answer, _ = unpack(await asyncio.wait_for(front.recv_multipart(), 10))
        assert isinstance(answer, Error) and answer.call_id == 7
        return answer
    finally:
        await worker.runtime.shutdown(0)
        worker._out.close(0)
        front.close(0)
        ctx.term()


def test_an_unknown_operation_over_the_dp_message_is_an_explicit_error():
    body = {"req_id": "r", "receive_count": 1, "receive_url": "h:1"}
    with pytest.raises(ProtocolError, match="Call: unknown control operation 'scheduler_receive'"):
        unpack(pack(Call(7, "scheduler_receive", body)))  # as the worker decodes the front's frames
    # Past the decoder (a Call built in the worker's process): answered with a typed 500, never run as another operation.
    answer = asyncio.run(_answer_to(Call(7, "scheduler_receive", body), "auto"))
    assert answer.kind is ErrorKind.INTERNAL and answer.http_status == 500
    assert "unknown control operation 'scheduler_receive'" in answer.message


def test_a_declared_operation_reaches_the_runtimes_transfer_router_by_name():
    """The same message with a declared name runs that operation: here, its refusal on an inline pod."""
    call, _ = unpack(pack(Call(7, "send", {"req_id": "r"})))
    answer = asyncio.run(_answer_to(call, "inline"))
    assert answer.kind is ErrorKind.INVALID_REQUEST and answer.http_status == 400
    assert answer.message.startswith("/send is mooncake's; this pod's transfer backend is inline")
