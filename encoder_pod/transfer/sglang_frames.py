"""Opt-in frames for an unmodified SGLang prefill server (``ENCODER_WIRE_FORMAT=sglang=<release>``).

SGLang's receiver reads frame 0 as a pickle of its ``EmbeddingData`` (through an allowlisting
unpickler) and frame 1 as the raw tensor bytes. Pickle on a socket is only tolerable because that
receiver requires it and guards it; the project's own format stays the default.

The pickle is written without importing sglang: stand-in classes are pickled under SGLang's
module and class names by a pure-Python pickler that writes those names as they are (the stock
pickler insists the name imports to the same object). The class paths are release-specific, so
each supported release is a row of :data:`RELEASES`; an unknown release fails at start.
"""

from __future__ import annotations

import io
import pickle
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from encoder_pod.errors import EncoderError
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest
from encoder_pod.transfer.tensors import tensor_view


@dataclass(frozen=True)
class SglangRelease:
    """Where one SGLang release keeps the classes its receiver unpickles."""

    release: str
    embedding_data: tuple[str, str]
    modality_enum: tuple[str, str]
    modality_values: dict[Modality, int]
    pickle_protocol: int = 4


RELEASES: dict[str, SglangRelease] = {
    "0.5.23": SglangRelease(
        release="0.5.23",
        embedding_data=("sglang.srt.disaggregation.encoder.receiver", "EmbeddingData"),
        modality_enum=("sglang.srt.multimodal.modality", "Modality"),
        # sglang's Modality is Enum(IMAGE=auto(), VIDEO=auto(), AUDIO=auto()).
        modality_values={Modality.IMAGE: 1, Modality.VIDEO: 2, Modality.AUDIO: 3},
    ),
}


class _EmbeddingData:
    """Stand-in pickled as SGLang's ``EmbeddingData`` (attributes only: the receiver never calls our code)."""


class _SglangModality(Enum):
    """Stand-in pickled as SGLang's ``Modality`` enum."""

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


def _grid_dim(modality: Modality, part: EncodedPart) -> Any:
    """``grid_dim`` as the release's receiver reads it: per-item grids; for AUDIO a tensor of lengths."""
    if modality is Modality.AUDIO:
        # The receiver calls .flatten() on audio grids; adapters put the feature length per item in
        # item_grids, and when they do not the output length is the best available stand-in.
        flat = [int(n) for grid in part.item_grids for n in grid]
        return torch.tensor(flat or [int(n) for n in part.item_tokens], dtype=torch.int64)
    if not any(part.item_grids):
        return None
    return [[int(n) for n in grid] for grid in part.item_grids]


class SglangCodec:
    """Frames SGLang ``release``'s prefill-side receiver accepts, for zmq_to_tokenizer and zmq_to_scheduler."""

    def __init__(self, release: str) -> None:
        try:
            self.release = RELEASES[release]
        except KeyError:
            raise ValueError(
                f"ENCODER_WIRE_FORMAT sglang={release}: unsupported SGLang release; supported: {', '.join(sorted(RELEASES))}"
            ) from None
        self.name = f"sglang={release}"
        self._names = {_EmbeddingData: self.release.embedding_data, _SglangModality: self.release.modality_enum}

    def _modality(self, modality: Modality) -> _SglangModality:
        return _SglangModality(self.release.modality_values[modality])

    def _dumps(self, attrs: dict[str, Any]) -> bytes:
        obj = _EmbeddingData()
        obj.__dict__.update(attrs)
        buf = io.BytesIO()
        _NamingPickler(buf, self.release.pickle_protocol, self._names).dump(obj)
        return buf.getvalue()

    def _attrs(self, request: EncodeRequest, **fields: Any) -> dict[str, Any]:
        # Attribute order as SGLang's EmbeddingData.__init__ sets them (copy_without_embedding).
        return {
            "req_id": request.req_id,
            "num_parts": request.num_parts,
            "part_idx": request.part_idx,
            "grid_dim": fields.get("grid_dim"),
            "modality": self._modality(request.modality),
            "embedding": None,
            "send_time": fields.get("send_time", time.time()),
            "dtype": fields.get("dtype"),
            "shape": fields.get("shape"),
            "_mr_ptr": None,
            "error_msg": fields.get("error_msg"),
            "error_code": fields.get("error_code"),
        }

    def header(self, request: EncodeRequest, part: EncodedPart, send_time: float | None = None) -> bytes:
        """Frame 0 of an embedding part."""
        fields: dict[str, Any] = dict(
            grid_dim=_grid_dim(request.modality, part),
            dtype=part.embedding.dtype,
            shape=[int(n) for n in part.embedding.shape],
        )
        if send_time is not None:
            fields["send_time"] = send_time
        return self._dumps(self._attrs(request, **fields))

    def part_frames(self, request: EncodeRequest, part: EncodedPart) -> list[Any]:
        """Pickled header + zero-copy payload (the receiver rejects an empty frame 1, so rows must be >= 1)."""
        if part.embedding.shape[0] == 0:
            raise ValueError("SGLang's receiver cannot take a zero-row embedding")
        return [self.header(request, part), tensor_view(part.embedding)]

    def error_frames(self, request: EncodeRequest, error: EncoderError) -> list[Any]:
        """Frame 0 alone with ``error_msg`` and ``error_code`` (the HTTP status)."""
        return [self._dumps(self._attrs(request, error_msg=error.message, error_code=int(error.http_status)))]
