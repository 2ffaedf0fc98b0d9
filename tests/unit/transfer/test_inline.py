"""The inline answer: built once, rendered to the exact JSON body, carried across the DP boundary as meta + frame."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from encoder_pod.models.base import EncodedPart
from encoder_pod.modality import Modality
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.transfer import inline
from encoder_pod.transfer.inline import InlineAnswer, base64_of, decode_embedding

pytestmark = pytest.mark.unit

REQUEST = EncodeRequest("r\u00e9-1", Modality.IMAGE, (ItemSpec("x"),), num_parts=2, part_idx=1, encoder_idx={"k": [1, "\u2603"]})


def _answer(rows: int, dtype: torch.dtype = torch.float32) -> tuple[InlineAnswer, torch.Tensor]:
    embedding = torch.arange(rows * 6, dtype=torch.float32).reshape(rows, 6).to(dtype) / 7
    return InlineAnswer.build(REQUEST, EncodedPart(embedding, [rows], [[1, 2, rows // 2]])), embedding


@pytest.mark.parametrize("rows", [0, 1, 5, 40_000])
def test_render_is_the_json_body_the_edge_always_sent(rows):
    answer, embedding = _answer(rows)
    rendered = b"".join(bytes(p) for p in answer.render())
    body = answer.body()
    # Byte for byte what Starlette's JSONResponse renders for the same body.
    assert rendered == json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    assert list(body) == ["status", "req_id", "modality", "num_parts", "part_idx", "encoder_idx", "embedding",
                          "item_token_counts", "item_grids"]
    assert body["embedding"]["encoding"] == "base64" and body["embedding"]["shape"] == [rows, 6]
    np.testing.assert_array_equal(decode_embedding(body["embedding"]), embedding.numpy())


def test_large_answers_render_in_pieces_without_copying_the_data():
    answer, _ = _answer(40_000)  # ~1.3 MB of base64
    pieces = answer.render()
    assert len(pieces) > 2 and all(len(p) <= inline.PIECE for p in pieces[1:-1])
    assert isinstance(pieces[1], memoryview) and pieces[1].obj is answer.data


def test_bf16_travels_as_raw_16_bit_words():
    answer, embedding = _answer(3, torch.bfloat16)
    body = answer.body()
    assert body["embedding"]["dtype"] == "bfloat16"
    np.testing.assert_array_equal(decode_embedding(body["embedding"]), embedding.float().numpy())


@pytest.mark.parametrize("size", [0, 1, 2, 3, inline.BASE64_SLICE - 1, inline.BASE64_SLICE, 2 * inline.BASE64_SLICE + 2])
def test_sliced_base64_is_plain_base64(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert bytes(base64_of(memoryview(data))) == base64.b64encode(data)


def test_the_wire_round_trip_keeps_the_frame_uncopied():
    answer, _ = _answer(4)
    meta, frame = answer.to_wire()
    assert "data" not in meta["embedding"]
    back = InlineAnswer.from_wire(meta, memoryview(frame))
    assert back.body() == answer.body()
    with pytest.raises(ValueError):
        InlineAnswer.from_wire({"status": "ok"}, b"")


def test_the_front_side_of_the_boundary_loads_no_torch():
    code = (
        "import sys; import encoder_pod.parallel.front, encoder_pod.api.http_server, encoder_pod.transfer.inline;"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
