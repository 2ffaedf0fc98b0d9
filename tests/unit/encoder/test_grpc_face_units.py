"""The gRPC face's pure parts: its status table, the bodies its messages become, its setting."""

from __future__ import annotations

import argparse

import grpc
import pytest
from smg_grpc_proto import sglang_encoder_pb2 as pb

from encoder_pod.api.grpc_encoder import encode_body, registration_body, send_body
from encoder_pod.api.grpc_errors import GRPC_STATUS, refusal
from encoder_pod.errors import (
    Draining,
    DuplicateRequest,
    EncoderError,
    ErrorKind,
    InvalidRequest,
    NotReady,
    Overloaded,
    RequestTimeout,
    WorkerDied,
)
from encoder_pod.protocol import parse_encode_request
from encoder_pod.settings import SettingsError, TransferBackend, add_settings_arguments, load_settings

pytestmark = pytest.mark.unit

Code = grpc.StatusCode


def test_every_error_kind_has_a_grpc_status():
    assert set(GRPC_STATUS) == set(ErrorKind)


@pytest.mark.parametrize(("error", "code"), [
    (InvalidRequest("field 'x': bad"), Code.INVALID_ARGUMENT),
    (Overloaded("queue full"), Code.RESOURCE_EXHAUSTED),
    (Draining("draining"), Code.UNAVAILABLE),
    (NotReady("loading"), Code.UNAVAILABLE),
    (WorkerDied("all dead"), Code.UNAVAILABLE),
    (RequestTimeout("slow"), Code.DEADLINE_EXCEEDED),
    (DuplicateRequest("again"), Code.ALREADY_EXISTS),
])
def test_the_codes_a_gateway_acts_on(error: EncoderError, code: grpc.StatusCode):
    answer = refusal(error)
    assert (answer.code, answer.details) == (code, error.message)
    assert ("encoderpool-error-kind", error.kind.value) in answer.metadata


def test_a_drain_asks_for_a_retry_pushback_and_a_fault_is_internal():
    assert ("grpc-retry-pushback-ms", "1000") in refusal(Draining("draining")).metadata
    answer = refusal(KeyError("oops"))
    assert answer.code is Code.INTERNAL and "KeyError" in answer.details
    unprintable = refusal(InvalidRequest("bad", req_id="caf\u00e9"))  # metadata values are ASCII: left out
    assert [k for k, _ in unprintable.metadata] == ["encoderpool-error-kind"]


def _encode(**fields: object) -> pb.EncodeRequest:
    return pb.EncodeRequest(**{"mm_items": ["u"], "req_id": "r", "num_parts": 2, "part_idx": 1, "prefill_host": "p",
                               "embedding_port": [5, 6], **fields})


def test_an_encode_request_is_the_encode_body_sglangs_grpc_server_builds():
    body = encode_body(_encode(), "IMAGE", TransferBackend.AUTO)
    request = parse_encode_request(body)
    assert (request.req_id, request.num_parts, request.part_idx, request.prefill_host, request.ports) == ("r", 2, 1, "p", (5, 6))
    assert parse_encode_request(encode_body(_encode(embedding_port=[]), "AUDIO", TransferBackend.AUTO)).ports == ()
    assert parse_encode_request(encode_body(_encode(), "VIDEO", TransferBackend.MOONCAKE)).ports == ()  # not mooncake's
    with pytest.raises(InvalidRequest, match="field 'prefill_host'"):
        encode_body(_encode(prefill_host=" "), "IMAGE", TransferBackend.AUTO)
    with pytest.raises(InvalidRequest, match="field 'num_parts'"):
        parse_encode_request(encode_body(_encode(num_parts=0, part_idx=0), "IMAGE", TransferBackend.AUTO))


def test_send_and_registration_bodies():
    body = send_body(pb.SendRequest(req_id="r", prefill_host="h", embedding_port=7, session_id="s", buffer_address=9))
    assert body == {"req_id": "r", "prefill_host": "h", "embedding_port": 7, "session_id": "s", "buffer_address": 9,
                    "receive_count": 1}
    for missing in ("prefill_host", "embedding_port", "session_id", "buffer_address"):
        fields = {"req_id": "r", "prefill_host": "h", "embedding_port": 7, "session_id": "s", "buffer_address": 9}
        del fields[missing]
        with pytest.raises(InvalidRequest, match=f"field '{missing}'"):
            send_body(pb.SendRequest(**fields))
    assert registration_body(pb.SchedulerReceiveUrlRequest(req_id="r", receive_url="h:1", receive_count=2)) == {
        "req_id": "r", "receive_url": "h:1", "receive_count": 2}


def test_the_grpc_port_setting():
    assert load_settings(env={}).server.grpc_port == 0
    assert load_settings(env={"ENCODER_GRPC_PORT": "50051"}).server.grpc_port == 50051
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    assert load_settings(cli=vars(parser.parse_args(["--grpc-port", "7"])), env={}).server.grpc_port == 7
    with pytest.raises(SettingsError, match="ENCODER_GRPC_PORT"):
        load_settings(env={"ENCODER_GRPC_PORT": "70000"})
    with pytest.raises(SettingsError, match="must differ from the HTTP port"):
        load_settings(env={"ENCODER_GRPC_PORT": "30000"})
