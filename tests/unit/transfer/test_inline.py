"""The inline answer: built once, rendered to the exact JSON body or to either binary body, carried
across the DP boundary as meta + raw frame, and read back by the receiver library."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import subprocess
import sys
import threading

import msgpack
import numpy as np
import pytest
import torch

from encoder_pod.api.answers import LOOP_JSON_BYTES, answer_response
from encoder_pod.errors import InvalidRequest
from encoder_pod.models.base import EncodedPart
from encoder_pod.modality import Modality
from encoder_pod.offload import Offload
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.receiver.answers import BINARY, JSON, MSGPACK, decode_answer
from encoder_pod.receiver.errors import MalformedMessage, PayloadMismatch
from encoder_pod.receiver.wire import DTYPE_SIZES, pack_part_header
from encoder_pod.transfer import inline
from encoder_pod.transfer.inline import InlineAnswer, base64_of, decode_embedding

pytestmark = pytest.mark.unit

REQUEST = EncodeRequest("r\u00e9-1", Modality.IMAGE, (ItemSpec("x"),), num_parts=2, part_idx=1, encoder_idx={"k": [1, "\u2603"]})


def _answer(rows: int, dtype: torch.dtype = torch.float32, request: EncodeRequest = REQUEST) -> tuple[InlineAnswer, torch.Tensor]:
    embedding = torch.arange(rows * 6, dtype=torch.float32).reshape(rows, 6).to(dtype) / 7
    return InlineAnswer.build(request, EncodedPart(embedding, [rows], [[1, 2, rows // 2]])), embedding


def _joined(pieces) -> bytes:
    return b"".join(bytes(p) for p in pieces)


@pytest.mark.parametrize("rows", [0, 1, 5, 40_000])
def test_render_json_is_the_json_body_the_edge_always_sent(rows):
    answer, embedding = _answer(rows)
    rendered = _joined(answer.render_json())
    body = answer.body()
    # Byte for byte what Starlette's JSONResponse renders for the same body.
    assert rendered == json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    assert list(body) == ["status", "req_id", "modality", "num_parts", "part_idx", "encoder_idx", "embedding",
                          "item_token_counts", "item_grids"]
    assert body["embedding"]["encoding"] == "base64" and body["embedding"]["shape"] == [rows, 6]
    np.testing.assert_array_equal(decode_embedding(body["embedding"]), embedding.numpy())


def test_an_integer_beyond_64_bits_is_still_echoed_in_json():
    request = EncodeRequest("r", Modality.IMAGE, (ItemSpec("x"),), encoder_idx=10**30)
    answer, _ = _answer(1, request=request)
    assert json.loads(_joined(answer.render_json()))["encoder_idx"] == 10**30
    with pytest.raises(InvalidRequest, match="encoder_idx"):
        answer.render_msgpack()


def test_large_answers_render_in_pieces_and_the_binary_ones_without_copying_the_data():
    answer, _ = _answer(60_000)  # ~1.4 MB raw, ~1.9 MB of base64
    pieces = answer.render_json()
    assert len(pieces) > 3 and all(len(p) <= inline.PIECE for p in pieces[1:-1])
    for binary in (answer.render_binary(), answer.render_msgpack()):
        assert len(binary) > 2 and all(isinstance(p, memoryview) and p.obj is answer.data.obj for p in binary[1:])


def test_bf16_travels_as_raw_16_bit_words():
    answer, embedding = _answer(3, torch.bfloat16)
    body = answer.body()
    assert body["embedding"]["dtype"] == "bfloat16"
    np.testing.assert_array_equal(decode_embedding(body["embedding"]), embedding.float().numpy())
    for content_type, pieces in ((BINARY, answer.render_binary()), (MSGPACK, answer.render_msgpack())):
        header, tensor = decode_answer(content_type, _joined(pieces))
        assert header.dtype == "bfloat16" and torch.equal(tensor, embedding)


@pytest.mark.parametrize("size", [0, 1, 2, 3, inline.BASE64_SLICE - 1, inline.BASE64_SLICE, 2 * inline.BASE64_SLICE + 2])
def test_sliced_base64_is_plain_base64(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert bytes(base64_of(memoryview(data))) == base64.b64encode(data)


def test_the_binary_body_is_the_wire_format_behind_a_length():
    request = EncodeRequest("r1_local_part_0", Modality.IMAGE, (ItemSpec("x"),), num_parts=2, part_idx=0, encoder_idx=3)
    answer, embedding = _answer(4, request=request)
    body = _joined(answer.render_binary())
    (size,) = struct.unpack(">I", body[:4])
    header = msgpack.unpackb(body[4 : 4 + size])
    assert header["v"] == 1 and header["kind"] == "part" and header["req_id"] == "r1_local_part_0"
    assert (header["dtype"], header["shape"], header["item_tokens"], header["encoder_idx"]) == ("float32", [4, 6], [4], 3)
    assert body[4 + size :] == embedding.numpy().astype("<f4").tobytes()


@pytest.mark.parametrize("encoder_idx", [None, 3, "enc-a", True, {"k": 1}])
def test_frame_0_is_what_the_wire_formats_own_writer_writes(encoder_idx):
    request = EncodeRequest("r_local_part_1", Modality.AUDIO, (ItemSpec("x"),), num_parts=3, part_idx=1, encoder_idx=encoder_idx)
    answer, _ = _answer(2, torch.float16, request=request)
    expected = pack_part_header(
        req_id="r_local_part_1", num_parts=3, part_idx=1, modality=Modality.AUDIO, dtype="float16", shape=[2, 6],
        item_tokens=[2], item_grids=[[1, 2, 1]], send_time=1700000000.25,
        encoder_idx=encoder_idx if isinstance(encoder_idx, (int, str)) and not isinstance(encoder_idx, bool) else None,
    )
    assert answer.wire_header(1700000000.25) == expected
    assert set(inline.WIRE_DTYPES) == set(DTYPE_SIZES)


def test_the_msgpack_body_is_one_map_any_msgpack_reader_takes():
    answer, embedding = _answer(5)
    value = msgpack.unpackb(_joined(answer.render_msgpack()))
    assert list(value)[-1] == "embedding" and value["encoder_idx"] == {"k": [1, "\u2603"]}
    assert {k: v for k, v in value.items() if k != "embedding"} == {k: v for k, v in answer.body().items() if k != "embedding"}
    assert value["embedding"]["encoding"] == "raw" and value["embedding"]["shape"] == [5, 6]
    assert value["embedding"]["data"] == embedding.numpy().tobytes()


@pytest.mark.parametrize("content_type", [JSON, BINARY, MSGPACK, "application/json; charset=utf-8", None])
def test_every_rendering_reads_back_to_the_same_header_and_tensor(content_type):
    answer, embedding = _answer(7)
    fmt = (content_type or JSON).split(";")[0]
    render = {JSON: answer.render_json, BINARY: answer.render_binary, MSGPACK: answer.render_msgpack}[fmt]
    header, tensor = decode_answer(content_type, _joined(render()))
    assert (header.req_id, header.num_parts, header.part_idx, header.modality) == ("r\u00e9-1", 2, 1, Modality.IMAGE)
    assert header.item_tokens == (7,) and header.item_grids == ((1, 2, 3),) and header.encoder_idx is None
    assert torch.equal(tensor, embedding)
    tensor += 1  # the tensor owns its memory: the answer's bytes are untouched
    assert torch.equal(decode_answer(content_type, _joined(render()))[1], embedding)


def test_answers_that_do_not_add_up_are_refused_typed():
    answer, _ = _answer(3)
    binary = _joined(answer.render_binary())
    with pytest.raises(PayloadMismatch):
        decode_answer(BINARY, binary[:-4])
    with pytest.raises(MalformedMessage, match="frame-0 length"):
        decode_answer(BINARY, b"\xff\xff\xff\x00" + binary[4:])
    body = answer.body()
    body["item_token_counts"] = [2]
    with pytest.raises(MalformedMessage, match="item_tokens"):
        decode_answer(JSON, json.dumps(body).encode())
    with pytest.raises(MalformedMessage, match="not a successful"):
        decode_answer(JSON, b'{"status": "error", "message": "x", "req_id": null}')
    with pytest.raises(MalformedMessage, match="not msgpack"):
        decode_answer(MSGPACK, b"\xc1")
    with pytest.raises(MalformedMessage, match="deeper than"):
        decode_answer(JSON, b"[" * 100_000)


def test_the_wire_round_trip_keeps_the_frame_uncopied():
    answer, _ = _answer(4)
    meta, frame = answer.to_wire()
    assert "data" not in meta["embedding"] and memoryview(frame).nbytes == 4 * 6 * 4
    back = InlineAnswer.from_wire(meta, memoryview(frame))
    assert back.body() == answer.body()
    assert _joined(back.render_msgpack()) == _joined(answer.render_msgpack())
    with pytest.raises(ValueError):
        InlineAnswer.from_wire({"status": "ok"}, b"")


def test_the_front_side_of_the_boundary_loads_no_torch():
    code = (
        "import sys; import encoder_pod.parallel.front, encoder_pod.api.http_server, encoder_pod.transfer.inline;"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("rows", [4, LOOP_JSON_BYTES // 24 + 1])  # 96 bytes / under the limit, 256 KiB + 24
def test_a_json_answer_goes_to_a_thread_only_when_large_and_reads_back_the_same(rows):
    """A small embedding's base64 costs less than a thread hand-off: rendered on the loop; a large one never is."""
    answer, embedding = _answer(rows)
    offload = Offload(name="test-offload")
    threads: list[str] = []
    real_render = answer.render_json

    def render() -> list:
        threads.append(threading.current_thread().name)
        return real_render()

    object.__setattr__(answer, "render_json", render)
    sent: list[bytes] = []

    async def send(message: dict) -> None:
        sent.append(message.get("body", b""))

    async def answer_it() -> None:
        response = await answer_response(answer, "application/json", offload)
        await response({"type": "http"}, None, send)

    try:
        asyncio.run(answer_it())
    finally:
        offload.close()
    on_loop = memoryview(answer.data).nbytes <= LOOP_JSON_BYTES
    assert (threads == [threading.main_thread().name]) is on_loop, threads
    header, tensor = decode_answer(JSON, b"".join(sent))
    assert header.req_id == REQUEST.req_id and torch.equal(tensor, embedding)
