"""Frame codecs and the wire-format setting."""

from __future__ import annotations

import typing

import pytest
import torch

from encoder_pod.errors import InvalidRequest
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.receiver.wire import decode_message
from encoder_pod.settings import SettingsError, TransferSettings, load_settings
from encoder_pod.transfer.frames import EncoderpoolCodec, codec_for
from encoder_pod.transfer.tensors import tensor_view
from encoder_pod.transfer.sglang_frames import RELEASES, SglangCodec

pytestmark = pytest.mark.unit


def test_every_accepted_sglang_release_has_a_codec():
    accepted = [v for v in typing.get_args(TransferSettings.model_fields["wire_format"].annotation) if v.startswith("sglang=")]
    assert accepted and sorted(v.partition("=")[2] for v in accepted) == sorted(RELEASES)
    for value in accepted:
        assert codec_for(value).name == value


def test_unknown_release_stops_the_pod_naming_the_variable():
    with pytest.raises(SettingsError, match="ENCODER_WIRE_FORMAT / --wire-format.*sglang=0.5.23"):
        load_settings(env={"ENCODER_WIRE_FORMAT": "sglang=0.4.0"})
    with pytest.raises(ValueError, match="unsupported SGLang release"):
        SglangCodec("0.4.0")


def test_tensor_view_is_zero_copy_and_little_endian():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    view = tensor_view(t)
    t[0, 0] = 42.0
    assert bytes(view[:4]) == torch.tensor([42.0]).numpy().tobytes()
    bf = torch.ones(2, 2, dtype=torch.bfloat16)
    assert bytes(tensor_view(bf)) == b"\x80\x3f" * 4
    assert bytes(tensor_view(t.t())) == t.t().contiguous().numpy().tobytes()  # non-contiguous: one copy


def test_encoderpool_codec_round_trips_part_and_error():
    req = EncodeRequest("q_local_part_1", Modality.VIDEO, (ItemSpec("x"),), 2, 1, "h", 5, encoder_idx=3)
    emb = torch.randn(4, 3, dtype=torch.float16)
    header, payload = decode_message(EncoderpoolCodec().part_frames(req, EncodedPart(emb, [4], [[2, 2, 4]])))
    assert (header.request_id, header.modality, header.encoder_idx, header.item_grids) == ("q", Modality.VIDEO, 3, ((2, 2, 4),))
    assert torch.equal(torch.frombuffer(bytearray(payload), dtype=torch.float16).reshape(4, 3), emb)
    error, _ = decode_message(EncoderpoolCodec().error_frames(req, InvalidRequest("nope")))
    assert (error.error_code, error.error_msg, error.error_kind.value) == (400, "nope", "invalid_request")


def test_sglang_frames_refuse_an_empty_embedding():
    req = EncodeRequest("e", Modality.IMAGE, (ItemSpec("x"),), 1, 0, "h", 5)
    with pytest.raises(ValueError, match="zero-row"):
        SglangCodec("0.5.23").part_frames(req, EncodedPart(torch.zeros(0, 4), [0], [[]]))
