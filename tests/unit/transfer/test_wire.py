"""The encoderpool wire format: round trips, the documented bytes, and strict rejection."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import msgpack
import pytest

from encoder_pod.errors import ErrorKind
from encoder_pod.modality import Modality
from encoder_pod.receiver.errors import MalformedMessage, PayloadMismatch, UnsupportedVersion
from encoder_pod.receiver.wire import decode_message, pack_error_header, pack_part_header, split_body

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[3] / "docs" / "wire-format.md"


def _example_part() -> bytes:
    return pack_part_header(
        req_id="r1_local_part_0", num_parts=2, part_idx=0, modality=Modality.IMAGE, dtype="float32",
        shape=[2, 2], item_tokens=[2], item_grids=[[1, 2, 4]], send_time=1700000000.5,
    )


def _example_error() -> bytes:
    return pack_error_header(
        req_id="r1_local_part_1", num_parts=2, part_idx=1, modality=Modality.IMAGE,
        error_kind=ErrorKind.INVALID_REQUEST, error_code=400, error_msg="mm_items[0]: cannot be decoded",
        send_time=1700000000.5,
    )


def _doc_bytes(marker: str) -> bytes:
    text = DOC.read_text()
    block = re.search(rf"<!-- wire-example:{marker} -->\n```\n(.*?)```", text, re.S)
    assert block, f"docs/wire-format.md lost its {marker} example"
    out = bytearray()
    for line in block.group(1).splitlines():
        out += bytes.fromhex(line[6:54])
    return bytes(out)


def test_documented_example_bytes_are_what_the_writer_writes():
    assert _doc_bytes("part-header") == _example_part()
    assert _doc_bytes("part-payload") == struct.pack("<4f", 1.0, 2.0, -1.0, 0.5)
    assert _doc_bytes("error-header") == _example_error()


def test_documented_example_reads_back():
    header, payload = decode_message([_doc_bytes("part-header"), _doc_bytes("part-payload")])
    assert (header.req_id, header.request_id, header.num_parts, header.part_idx) == ("r1_local_part_0", "r1", 2, 0)
    assert header.modality is Modality.IMAGE and header.shape == (2, 2) and header.dtype == "float32"
    assert header.item_tokens == (2,) and header.item_grids == ((1, 2, 4),)
    assert bytes(payload) == struct.pack("<4f", 1.0, 2.0, -1.0, 0.5)
    error, none = decode_message([_doc_bytes("error-header")])
    assert none is None and error.error_kind is ErrorKind.INVALID_REQUEST and error.error_code == 400


def _raw_part(**changes):
    raw = msgpack.unpackb(_example_part())
    for key, value in changes.items():
        if value is KeyError:
            raw.pop(key)
        else:
            raw[key] = value
    return msgpack.packb(raw)


PAYLOAD = b"\0" * 16


@pytest.mark.parametrize(
    "frames, error, needle",
    [
        ([], MalformedMessage, "empty message"),
        ([b"\xc1garbage"], MalformedMessage, "not msgpack"),
        ([b"\x80\x04\x95pickle"], MalformedMessage, "SGLang pickle"),
        ([msgpack.packb([1, 2])], MalformedMessage, "must be a msgpack map"),
        ([_example_part()[:40], PAYLOAD], MalformedMessage, "not msgpack"),
        ([_raw_part(v=2), PAYLOAD], UnsupportedVersion, "version 2"),
        ([_raw_part(kind="blob"), PAYLOAD], MalformedMessage, "'kind'"),
        ([_raw_part(dtype="int4"), PAYLOAD], MalformedMessage, "'dtype'"),
        ([_raw_part(shape=[2]), PAYLOAD], MalformedMessage, "'shape'"),
        ([_raw_part(shape=[0, 2]), b""], MalformedMessage, "'shape'"),
        ([_raw_part(item_tokens=[1]), PAYLOAD], MalformedMessage, "sum to the 2 rows"),
        ([_raw_part(item_grids=[]), PAYLOAD], MalformedMessage, "'item_grids'"),
        ([_raw_part(part_idx=2), PAYLOAD], MalformedMessage, "'part_idx'"),
        ([_raw_part(num_parts=True), PAYLOAD], MalformedMessage, "'num_parts'"),
        ([_raw_part(modality="image"), PAYLOAD], MalformedMessage, "'modality'"),
        ([_raw_part(send_time="now"), PAYLOAD], MalformedMessage, "'send_time'"),
        ([_raw_part(surprise=1), PAYLOAD], MalformedMessage, "unknown ['surprise']"),
        ([_raw_part(shape=KeyError), PAYLOAD], MalformedMessage, "missing ['shape']"),
        ([_example_part()], MalformedMessage, "2 frame(s), got 1"),
        ([_example_part(), PAYLOAD, PAYLOAD], MalformedMessage, "got 3"),
        ([_example_part(), PAYLOAD[:15]], PayloadMismatch, "15 bytes"),
        ([_example_part(), PAYLOAD + b"\0"], PayloadMismatch, "need 16"),
        ([_example_error(), PAYLOAD], MalformedMessage, "1 frame(s), got 2"),
    ],
)
def test_malformed_messages_raise_typed_errors(frames, error, needle):
    with pytest.raises(error) as info:
        decode_message(frames)
    assert needle in info.value.message


def test_errors_after_the_req_id_name_it():
    with pytest.raises(PayloadMismatch) as info:
        decode_message([_example_part(), b"\0"])
    assert info.value.req_id == "r1_local_part_0"


def test_request_id_strips_only_the_matching_part_suffix():
    def header(req_id, part_idx):
        raw = pack_part_header(req_id=req_id, num_parts=3, part_idx=part_idx, modality=Modality.AUDIO, dtype="bfloat16",
                               shape=[1, 1], item_tokens=[1], item_grids=[[]], send_time=0)
        return decode_message([raw, b"\0\0"])[0]

    assert header("a_local_part_2", 2).request_id == "a"
    assert header("a_local_part_2", 1).request_id == "a_local_part_2"
    assert header("plain", 0).request_id == "plain"


def test_documented_http_body_is_the_two_frames_behind_a_length():
    header, payload = _doc_bytes("part-header"), _doc_bytes("part-payload")
    body = b"\x00\x00\x00\x91" + header + payload
    assert len(header) == 0x91
    frames = split_body(body)
    assert [bytes(f) for f in frames] == [header, payload]
    assert decode_message(frames)[0].req_id == "r1_local_part_0"
    for bad in (b"\x00\x00", b"\x00\x00\x01\x00" + header, b"\x00\x10\x00\x01" + b"x" * 1_048_577):
        with pytest.raises(MalformedMessage, match="frame-0 length"):
            split_body(bad)
