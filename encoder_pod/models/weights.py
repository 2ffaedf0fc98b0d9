"""Reading chosen tensors out of a safetensors checkpoint: only their shards, only their bytes.

A full multimodal checkpoint is mostly language model (an 8B Qwen2.5-VL holds a 0.7B vision
tower). The index (``model.safetensors.index.json``) names the shard of every tensor and each
shard's header names every tensor's byte range, so the encoder side can be read without touching
anything else: :class:`SafetensorsIndex` opens only the shards that hold a wanted tensor and reads
exactly that tensor's bytes with ``seek`` + ``readinto`` straight into the tensor's storage. The
reader counts every byte it reads (headers included), so "bytes read" in /server_info and the
benchmarks is a measurement of the I/O issued, not an estimate (no mmap, whose page faults read
ahead by an unknown amount).
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024
"""safetensors caps the JSON header at 100 MB; a larger length field means a damaged file."""

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


class CheckpointError(RuntimeError):
    """The checkpoint's files do not hold what the model needs (missing, unexpected or damaged tensors)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its shard, dtype, shape and byte range after the header."""

    shard: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data."""
        return self.end - self.begin


@dataclass
class ReadReport:
    """What one selective read cost, as measured by the reader."""

    tensors: int = 0
    bytes_read: int = 0
    """Header and tensor bytes actually read from disk."""
    shards_opened: list[str] = field(default_factory=list)
    shards_total: int = 0
    checkpoint_bytes: int = 0
    """Bytes of every tensor of the checkpoint (the index's ``total_size``), or of its weight files."""

    def merge(self, other: "ReadReport") -> "ReadReport":
        """Both reads together (two towers of one checkpoint)."""
        return ReadReport(
            tensors=self.tensors + other.tensors,
            bytes_read=self.bytes_read + other.bytes_read,
            shards_opened=sorted(set(self.shards_opened) | set(other.shards_opened)),
            shards_total=max(self.shards_total, other.shards_total),
            checkpoint_bytes=max(self.checkpoint_bytes, other.checkpoint_bytes),
        )

    def as_dict(self) -> dict[str, Any]:
        """For /server_info and the benchmarks."""
        return {
            "tensors": self.tensors,
            "bytes_read": self.bytes_read,
            "shards_opened": len(self.shards_opened),
            "shards_total": self.shards_total,
            "checkpoint_bytes": self.checkpoint_bytes,
        }


def read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """(bytes of the length field plus header, the header) of one safetensors file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path} is not a safetensors file (shorter than its length field)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path} declares a {length}-byte header: not a safetensors file")
        header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    return 8 + length, header


def weight_map(model_dir: Path) -> tuple[dict[str, str], int | None]:
    """(tensor name -> shard file, the index's total tensor bytes if it says), from the index or the single file."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_NAME
    if index.is_file():
        raw = json.loads(index.read_text())
        mapping = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(mapping, dict) or not mapping:
            raise CheckpointError(f"{index} has no weight_map")
        total = (raw.get("metadata") or {}).get("total_size")
        return {str(k): str(v) for k, v in mapping.items()}, int(total) if isinstance(total, (int, float)) else None
    single = model_dir / SINGLE_NAME
    if not single.is_file():
        raise CheckpointError(f"no {INDEX_NAME} or {SINGLE_NAME} in {model_dir}")
    _, header = read_header(single)
    return {key: SINGLE_NAME for key in header if key != "__metadata__"}, None


class SafetensorsIndex:
    """The tensors of one checkpoint directory; reads any subset of them, counting the bytes.

    Shards are only looked at when a wanted tensor is in them: a snapshot that holds just the
    encoder's shards (``encoder-pod fetch-model``) is a complete checkpoint for the encoder.
    """

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        self.weight_map, self._total = weight_map(self.model_dir)
        self.shards = sorted(set(self.weight_map.values()))

    @property
    def checkpoint_bytes(self) -> int:
        """Size of the whole checkpoint's weights: the index's ``total_size``, else the shard files' sizes."""
        if self._total is not None:
            return self._total
        return sum((self.model_dir / shard).stat().st_size for shard in self.shards)

    def read_into(self, targets: Mapping[str, torch.Tensor]) -> ReadReport:
        """Fill each tensor of ``targets`` (checkpoint key -> the module's own tensor) from the checkpoint.

        Each tensor's bytes are read alone, straight into the target's storage when it is a
        contiguous CPU tensor of the file's dtype (no second copy, no second page-in), else into
        a scratch tensor that is then cast into the target. Shapes must match exactly.
        """
        by_shard: dict[str, list[str]] = defaultdict(list)
        for key in targets:
            if key not in self.weight_map:
                raise CheckpointError(f"{self.model_dir}: no tensor {key!r} in the checkpoint")
            by_shard[self.weight_map[key]].append(key)
        missing = [shard for shard in by_shard if not (self.model_dir / shard).is_file()]
        if missing:
            raise CheckpointError(f"{self.model_dir}: shards holding the encoder's tensors are not there: {sorted(missing)}")
        report = ReadReport(shards_total=len(self.shards), checkpoint_bytes=self.checkpoint_bytes)
        with torch.no_grad():
            for shard, names in sorted(by_shard.items()):
                report.bytes_read += self._read_shard(self.model_dir / shard, names, targets)
                report.shards_opened.append(shard)
        report.tensors = len(targets)
        return report

    @staticmethod
    def _read_shard(path: Path, names: list[str], targets: Mapping[str, torch.Tensor]) -> int:
        """Read ``names`` from one shard into their targets; returns the bytes read."""
        header_bytes, header = read_header(path)
        total = header_bytes
        infos = {name: _tensor_info(path, name, header) for name in names}
        for name, info in infos.items():
            if tuple(targets[name].shape) != info.shape:
                raise CheckpointError(f"{path}: {name} has shape {info.shape}, the model's is {tuple(targets[name].shape)}")
        with open(path, "rb", buffering=0) as f:
            # In file order: a shard is then read front to back, never seeking backwards.
            for name, info in sorted(infos.items(), key=lambda item: item[1].begin):
                target = targets[name].detach()
                direct = target.device.type == "cpu" and target.is_contiguous() and target.dtype == _DTYPES[info.dtype]
                tensor = target if direct else torch.empty(info.shape, dtype=_DTYPES[info.dtype])
                buffer = tensor.view(-1).view(torch.uint8).numpy().data if tensor.numel() else memoryview(b"")
                if len(buffer) != info.nbytes:
                    raise CheckpointError(f"{path}: {name} is {info.nbytes} bytes, its shape and dtype need {len(buffer)}")
                f.seek(header_bytes + info.begin)
                got = f.readinto(buffer) if info.nbytes else 0
                if got != info.nbytes:
                    raise CheckpointError(f"{path}: {name} is truncated ({got} of {info.nbytes} bytes)")
                total += got
                if not direct:
                    target.copy_(tensor)
        return total


def _tensor_info(path: Path, name: str, header: Mapping[str, Any]) -> TensorInfo:
    entry = header.get(name)
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path}: the index names {name!r} but the shard does not hold it")
    dtype = entry.get("dtype")
    if dtype not in _DTYPES:
        raise CheckpointError(f"{path}: {name} has dtype {dtype!r}, which this reader does not know")
    begin, end = entry["data_offsets"]
    return TensorInfo(path.name, dtype, tuple(int(n) for n in entry["shape"]), int(begin), int(end))


def check_names(own: Iterable[str], found: Iterable[str], what: str) -> None:
    """:class:`CheckpointError` naming the tensors ``what`` has that the checkpoint lacks, or the other way."""
    expected, got = set(own), set(found)
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''} ({len(missing)})")
        if unexpected:
            parts.append(f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''} ({len(unexpected)})")
        raise CheckpointError(f"checkpoint does not match {what}: {'; '.join(parts)}")


def whole_checkpoint_report(model_dir: Path) -> ReadReport:
    """What loading every tensor of a checkpoint reads (a tower saved on its own), from the headers."""
    index = SafetensorsIndex(model_dir)
    report = ReadReport(shards_total=len(index.shards), checkpoint_bytes=index.checkpoint_bytes)
    for shard in index.shards:
        header_bytes, header = read_header(index.model_dir / shard)
        tensors = [entry for key, entry in header.items() if key != "__metadata__"]
        report.tensors += len(tensors)
        report.bytes_read += header_bytes + sum(int(e["data_offsets"][1]) - int(e["data_offsets"][0]) for e in tensors)
        report.shards_opened.append(shard)
    return report
