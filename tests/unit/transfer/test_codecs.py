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
from encoder_pod.settings import SGLANG_RELEASES, SettingsError, TransferSettings, WireFormat, load_settings
from encoder_pod.transfer.frames import EncoderpoolCodec, codec_for
from encoder_pod.transfer.tensors import tensor_view
from encoder_pod.transfer.sglang_frames import MODALITY_EVERY_RELEASE, MODALITY_SINCE_0_5_23, SglangCodec, grid_dim, layout_for

pytestmark = pytest.mark.unit


def test_every_sglang_version_setting_has_a_layout():
    accepted = typing.get_args(TransferSettings.model_fields["sglang_version"].annotation)
    assert accepted == ("auto", *SGLANG_RELEASES)
    for value in accepted:
        assert codec_for(f"sglang={value}").name == f"sglang={value}"
    # auto names Modality where every release's allowlist has it; 0.5.23's own encoder uses its new module.
    assert layout_for("auto").modality_enum == layout_for("0.5.19").modality_enum == MODALITY_EVERY_RELEASE
    assert layout_for("0.5.23").modality_enum == MODALITY_SINCE_0_5_23


def test_wire_defaults_to_sglang_frames_and_the_old_value_still_parses():
    s = load_settings(env={}).transfer
    assert (s.wire_format, s.sglang_version) == (WireFormat.SGLANG, "auto")
    old = load_settings(env={"ENCODER_WIRE_FORMAT": "sglang=0.5.22"}).transfer
    assert (old.wire_format, old.sglang_version) == (WireFormat.SGLANG, "0.5.22")
    assert load_settings(env={"ENCODER_WIRE_FORMAT": "encoderpool"}).transfer.wire_format is WireFormat.ENCODERPOOL


def test_unknown_release_stops_the_pod_naming_the_variable():
    with pytest.raises(SettingsError, match="ENCODER_SGLANG_VERSION / --sglang-version.*0.5.23"):
        load_settings(env={"ENCODER_SGLANG_VERSION": "0.4.0"})
    with pytest.raises(SettingsError, match="ENCODER_SGLANG_VERSION"):
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


def test_grids_are_int64_tensors_and_audio_has_one_length_per_item():
    image = grid_dim(Modality.IMAGE, EncodedPart(torch.zeros(6, 2), [2, 4], [[1, 2, 4], [1, 4, 4]]))
    assert image is not None and image.dtype == torch.int64 and image.tolist() == [[1, 2, 4], [1, 4, 4]]
    assert grid_dim(Modality.IMAGE, EncodedPart(torch.zeros(2, 2), [2], [[]])) is None  # a family without grids
    audio = grid_dim(Modality.AUDIO, EncodedPart(torch.zeros(3, 2), [2, 1], [[3000, 1200], [800]]))
    assert audio is not None and audio.tolist() == [4200, 800] and audio.dim() == 1
    assert grid_dim(Modality.AUDIO, EncodedPart(torch.zeros(3, 2), [2, 1], [[], []])).tolist() == [2, 1]  # type: ignore[union-attr]
