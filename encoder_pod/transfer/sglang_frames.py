"""The frames SGLang's own prefill-side receiver reads (``ENCODER_WIRE_FORMAT=sglang``, the default).

SGLang's receiver reads frame 0 as a pickle of its ``EmbeddingData`` (through an allowlisting
unpickler) and frame 1 as the raw tensor bytes. Pickle on a socket is only tolerable because that
receiver requires it and guards it; the project's own receiver library reads msgpack instead
(``ENCODER_WIRE_FORMAT=encoderpool``), and pickle is written nowhere else.

The pickle is written without importing sglang: stand-in classes are pickled under SGLang's
module and class names by a pure-Python pickler that writes those names as they are (the stock
pickler insists the name imports to the same object).

Which names: every release from 0.5.19 to 0.5.23 keeps ``EmbeddingData`` in
``sglang.srt.disaggregation.encoder.receiver`` and accepts ``Modality`` pickled as
``sglang.srt.managers.schedule_batch.Modality`` (it is defined there up to 0.5.22 and re-exported
there by 0.5.23), so ``SGLANG_VERSION=auto`` writes that layout, read by all of them. Naming a
release writes exactly what that release's own encoder writes (0.5.23 pickles the enum from its
new home, ``sglang.srt.multimodal.modality``, which older releases refuse).

The attributes are those of SGLang's ``EmbeddingData.copy_without_embedding()``, in its order,
then the video metadata its encoder adds to every embedding part (``video_timestamps``,
``second_per_grid_ts``; None unless the adapter produced them). Grids are int64 tensors as its
processors produce them; audio carries ONE length per item (the receiver flattens it and
recomputes the item's tokens from it).
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from encoder_pod.errors import EncoderError
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest
from encoder_pod.settings import SGLANG_RELEASES
from encoder_pod.transfer.tensors import tensor_view

EMBEDDING_DATA = ("sglang.srt.disaggregation.encoder.receiver", "EmbeddingData")
MODALITY_EVERY_RELEASE = ("sglang.srt.managers.schedule_batch", "Modality")
MODALITY_SINCE_0_5_23 = ("sglang.srt.multimodal.modality", "Modality")


@dataclass(frozen=True)
class SglangLayout:
    """Where the classes a frame names live, for one release or for all of them (``auto``)."""

    version: str
    embedding_data: tuple[str, str]
    modality_enum: tuple[str, str]
    pickle_protocol: int = 4


def layout_for(version: str) -> SglangLayout:
    """The layout for ``SGLANG_VERSION`` (``auto`` or one of :data:`SGLANG_RELEASES`)."""
    if version == "auto":
        return SglangLayout("auto", EMBEDDING_DATA, MODALITY_EVERY_RELEASE)
    if version not in SGLANG_RELEASES:
        raise ValueError(f"unsupported SGLang release {version!r}; supported: auto, {', '.join(SGLANG_RELEASES)}")
    modality = MODALITY_SINCE_0_5_23 if _release_tuple(version) >= (0, 5, 23) else MODALITY_EVERY_RELEASE
    return SglangLayout(version, EMBEDDING_DATA, modality)


def _release_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in version.split("."))


class _EmbeddingData:
    """Stand-in pickled as SGLang's ``EmbeddingData`` (attributes only: the receiver never calls our code)."""


class _SglangModality(Enum):
    """Stand-in pickled as SGLang's ``Modality`` enum (``Enum(IMAGE=auto(), VIDEO=auto(), AUDIO=auto())``)."""

    IMAGE = 1
    VIDEO = 2
    AUDIO = 3


_PurePickler: Any = pickle._Pickler  # the pure-Python pickler; its save/write/memoize are not in the stubs


class _NamingPickler(_PurePickler):
    """Pure-Python pickler that writes given module/name pairs for the stand-in classes."""

    def __init__(self, file: io.BytesIO, protocol: int, names: dict[type, tuple[str, str]]) -> None:
        super().__init__(file, protocol)
        self._names = names

    def save_global(self, obj: Any, name: str | None = None) -> None:
        target = self._names.get(obj) if isinstance(obj, type) else None
        if target is None:
            super().save_global(obj, name)
            return
        # Same opcodes the stock pickler writes for a class at protocol >= 4.
        self.save(target[0])
        self.save(target[1])
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)


def grid_dim(modality: Modality, part: EncodedPart) -> torch.Tensor | None:
    """``grid_dim`` as SGLang's encoder sends it.

    IMAGE/VIDEO: the per-item grids as an int64 tensor ``[items, k]`` (None for families without
    a grid). AUDIO: a 1-D int64 tensor with ONE length per item: the sum of the item's grid (an
    adapter that splits long audio into windows reports each window; their sum is the item's
    feature length), or its output rows when the adapter reports no grid.
    """
    if modality is Modality.AUDIO:
        lengths = [sum(int(n) for n in grid) for grid in part.item_grids]
        if not lengths or not all(part.item_grids):
            lengths = [int(n) for n in part.item_tokens]
        return torch.tensor(lengths, dtype=torch.int64)
    grids = [[int(n) for n in grid] for grid in part.item_grids]
    if not grids or not all(grids) or len({len(g) for g in grids}) != 1:
        return None
    return torch.tensor(grids, dtype=torch.int64)


def video_meta(part: EncodedPart) -> dict[str, Any]:
    """``video_timestamps`` (a list per video of floats) and ``second_per_grid_ts`` (float32 tensor, one per video)."""
    extras: dict[str, Any] = getattr(part, "extras", None) or {}
    stamps = extras.get("video_timestamps")
    per_grid = extras.get("second_per_grid_ts")
    return {
        "video_timestamps": None if stamps is None else [[float(t) for t in video] for video in stamps],
        "second_per_grid_ts": None if per_grid is None else torch.tensor([float(v) for v in per_grid], dtype=torch.float32),
    }


class SglangCodec:
    """Frames SGLang's prefill-side receiver accepts, for zmq_to_tokenizer, zmq_to_scheduler and mooncake acks."""

    def __init__(self, version: str = "auto") -> None:
        self.layout = layout_for(version)
        self.name = f"sglang={version}"
        self._names = {_EmbeddingData: self.layout.embedding_data, _SglangModality: self.layout.modality_enum}

    def _dumps(self, attrs: dict[str, Any]) -> bytes:
        obj = _EmbeddingData()
        obj.__dict__.update(attrs)
        buf = io.BytesIO()
        _NamingPickler(buf, self.layout.pickle_protocol, self._names).dump(obj)
        return buf.getvalue()

    @staticmethod
    def _attrs(request: EncodeRequest, **fields: Any) -> dict[str, Any]:
        # Attribute order as SGLang's EmbeddingData.__init__ sets them (copy_without_embedding).
        return {
            "req_id": request.req_id,
            "num_parts": int(request.num_parts),
            "part_idx": int(request.part_idx),
            "grid_dim": fields.get("grid_dim"),
            "modality": _SglangModality[request.modality.value],
            "embedding": None,
            "send_time": fields.get("send_time"),
            "dtype": fields.get("dtype"),
            "shape": fields.get("shape"),
            "_mr_ptr": None,
            "error_msg": fields.get("error_msg"),
            "error_code": fields.get("error_code"),
        }

    def header(self, request: EncodeRequest, part: EncodedPart, send_time: float | None = None) -> bytes:
        """Frame 0 of an embedding part (also the one-frame mooncake acknowledgement)."""
        attrs = self._attrs(
            request,
            grid_dim=grid_dim(request.modality, part),
            dtype=part.embedding.dtype,
            shape=[int(n) for n in part.embedding.shape],
            send_time=send_time,
        )
        attrs.update(video_meta(part))
        return self._dumps(attrs)

    def part_frames(self, request: EncodeRequest, part: EncodedPart) -> list[Any]:
        """Pickled header + zero-copy payload (the receiver rejects an empty frame 1, so rows must be >= 1)."""
        if part.embedding.shape[0] == 0:
            raise ValueError("SGLang's receiver cannot take a zero-row embedding")
        return [self.header(request, part), tensor_view(part.embedding)]

    def error_frames(self, request: EncodeRequest, error: EncoderError) -> list[Any]:
        """Frame 0 alone with ``error_msg`` and ``error_code`` (the HTTP status, an ``http.HTTPStatus`` value)."""
        return [self._dumps(self._attrs(request, error_msg=error.message, error_code=int(error.http_status)))]
