"""The typed front <-> worker messages: round trips, and refusals of anything else."""

from __future__ import annotations

import msgpack
import pytest

from encoder_pod.errors import ErrorKind, RequestTimeout, WorkerDied
from encoder_pod.facts import CacheFacts, ModelFacts, ReplicaReport, TensorParallelFacts
from encoder_pod.modality import Modality
from encoder_pod.parallel.messages import (
    WIRE_VERSION,
    Call,
    START_PROFILE,
    Encode,
    Error,
    MetricFamily,
    MetricSample,
    ProtocolError,
    Result,
    Status,
    encode_frames,
    pack,
    request_from_wire,
    unpack,
)
from encoder_pod.protocol import parse_encode_request
from encoder_pod.readiness import LoadStep, ReplicaState

pytestmark = pytest.mark.unit

BODY = {
    "req_id": "r1_local_part_1", "modality": "image", "mm_items": ["data:image/png;base64,AAAA", {"url": "x", "max_pixels": 9}],
    "num_parts": 2, "part_idx": 1, "prefill_host": "10.0.0.1", "embedding_port": [5000, 5001], "encoder_idx": {"a": 1},
    "hashes": [1, 2],
}


def test_request_survives_the_wire_exactly():
    request = parse_encode_request({**BODY, "mm_items": [*BODY["mm_items"], "caf\u00e9 \ud800"]})
    frames = encode_frames(7, request)
    msg, items = unpack(frames)
    assert isinstance(msg, Encode) and msg.call_id == 7
    # Each item's source is a raw frame of its own, never inside the msgpack header.
    assert [bytes(f) for f in items][0] == b"data:image/png;base64,AAAA" and b"AAAA" not in bytes(frames[0])
    assert request_from_wire(msg.request, items) == request


def test_item_frames_must_match_the_items():
    msg, items = unpack(encode_frames(1, parse_encode_request(BODY)))
    assert isinstance(msg, Encode)
    with pytest.raises(ProtocolError, match="item frames"):
        request_from_wire(msg.request, items[:1])


def test_raw_frame_travels_beside_the_header():
    msg, frames = unpack(pack(Result(1, 3, 9, inline={"embedding": {"shape": [2, 4]}}), b"QUJD"))
    assert isinstance(msg, Result) and msg.inline == {"embedding": {"shape": [2, 4]}} and msg.rank == 1 and msg.generation == 3
    assert msg.body is None
    assert [bytes(f) for f in frames] == [b"QUJD"]


def test_error_keeps_kind_and_status_across_the_boundary():
    err = RequestTimeout("too slow", req_id="r")
    msg, _ = unpack(pack(Error.of(0, 1, 5, err)))
    assert isinstance(msg, Error) and msg.kind is ErrorKind.TIMEOUT and msg.http_status == 504
    back = msg.to_exception()
    assert isinstance(back, RequestTimeout) and back.http_status == 504 and back.req_id == "r"
    assert isinstance(unpack(pack(Error.of(0, 1, 5, WorkerDied("x"))))[0].to_exception(), WorkerDied)


def test_enums_come_back_typed():
    call, _ = unpack(pack(Call(1, START_PROFILE, {"num_steps": 2})))
    assert isinstance(call, Call) and call.op == START_PROFILE and call.args == {"num_steps": 2}
    families = (MetricFamily("m", "counter", "M.", "", (MetricSample("_total", {"a": "b"}, 1.0),)),)
    status, _ = unpack(pack(Status(0, 1, 123, ReplicaState.READY, None, 1.5, metrics=families)))
    assert isinstance(status, Status) and status.state is ReplicaState.READY and status.metrics == families
    assert isinstance(status.metrics[0], MetricFamily) and isinstance(status.metrics[0].samples[0], MetricSample)
    assert status.step is None
    loading, _ = unpack(pack(Status(0, 1, 123, ReplicaState.LOADING, LoadStep.WARMING_UP, 0.5)))
    assert isinstance(loading, Status) and loading.step is LoadStep.WARMING_UP and not loading.refused
    refused, _ = unpack(pack(Status(0, 1, 123, ReplicaState.FAILED, None, 2.0, error="cannot serve model_type 'x': y", refused=True)))
    assert isinstance(refused, Status) and refused.refused is True and refused.error == "cannot serve model_type 'x': y"


def test_replica_report_comes_back_typed():
    tp = TensorParallelFacts(2, "dp0", (41, 42), 7)
    model = ModelFacts("qwen2_vl", (Modality.IMAGE, Modality.VIDEO), "bfloat16", 64, {"layout": "full", "weights": {"n": 1}}, tp)
    cache = CacheFacts(True, 100, 30, 2, 0, 1, 0, 5, 2, 0)
    report = ReplicaReport(queue_depth=3, inflight=4, model=model, cache=cache)
    status, _ = unpack(pack(Status(0, 1, 123, ReplicaState.READY, None, 1.5, report=report)))
    assert isinstance(status, Status) and status.report == report
    assert status.report.model is not None and status.report.model.modalities[0] is Modality.IMAGE
    assert status.report.model.to_json()["tensor_parallel"] == {"tp_size": 2, "label": "dp0", "follower_pids": [41, 42], "steps": 7}
    assert status.report.cache.to_json()["fill"] == 0.3
    bare, _ = unpack(pack(Status(0, 1, 123, ReplicaState.LOADING, LoadStep.IMPORTING, 0.1, report=ReplicaReport(0, 0, None, cache))))
    assert isinstance(bare, Status) and bare.report is not None and bare.report.model is None
    fields = msgpack.unpackb(pack(Status(0, 1, 123, ReplicaState.READY, None, 1.5, report=report))[0])
    del fields["report"]["model"]["family"]
    with pytest.raises(ProtocolError, match="Status"):
        unpack([msgpack.packb(fields)])


@pytest.mark.parametrize(
    "header, words",
    [
        ({"v": WIRE_VERSION + 1, "k": 2, "call_id": 1}, "version"),
        ({"v": WIRE_VERSION, "k": 99}, "unknown message kind"),
        ({"v": WIRE_VERSION, "k": 2}, "without field 'call_id'"),
        ({"v": WIRE_VERSION, "k": 3, "call_id": 1, "op": "rm -rf", "args": {}}, "Call"),
        ([1, 2], "not a map"),
    ],
)
def test_anything_else_is_a_protocol_error(header, words):
    with pytest.raises(ProtocolError, match=words):
        unpack([msgpack.packb(header)])


def test_garbage_and_pickles_are_refused():
    import pickle

    with pytest.raises(ProtocolError):
        unpack([pickle.dumps({"v": WIRE_VERSION, "k": 2, "call_id": 1})])
    with pytest.raises(ProtocolError):
        unpack([])
