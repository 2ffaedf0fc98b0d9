"""The storage a vLLM consumer's ``ECExampleConnector`` reads: one safetensors file per item.

Layout (vLLM 0.34.0, ``example_connector.py``): ``<root>/<identifier>/encoder_cache.safetensors``
holding one tensor named ``ec_cache``, ``[rows, width]`` in the consumer's dtype. The consumer's
scheduler asks ``os.path.exists`` of that name and its worker loads the file, so a file must appear
whole under its final name: it is written to a temporary name in the same folder and renamed.

vLLM deletes nothing; this store is bounded by bytes and by age (:class:`EcStore`), oldest first.
The identifier is joined into a path by vLLM as it is, so one that is not a single safe path
component is refused (:func:`check_identifier`): writing it anywhere else would be a file the
consumer never finds.

The file is written without torch (the data-parallel front never loads it): safetensors is an
8-byte little-endian header length, a JSON header padded with spaces to 8 bytes, then the bytes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from encoder_pod.errors import InvalidRequest

log = logging.getLogger(__name__)

FILE_NAME = "encoder_cache.safetensors"
TENSOR_NAME = "ec_cache"
MAX_IDENTIFIER = 255
_SAFE = re.compile(r"[A-Za-z0-9_.:@+=-]+")

SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def check_identifier(identifier: str, field: str) -> str:
    """``identifier`` if it is one safe path component (vLLM joins it into a path unchanged), else 400 naming ``field``."""
    if not isinstance(identifier, str) or not identifier:
        raise InvalidRequest(f"field '{field}': must be a non-empty string")
    if len(identifier) > MAX_IDENTIFIER:
        raise InvalidRequest(f"field '{field}': longer than {MAX_IDENTIFIER} characters (one path component of the shared storage)")
    if identifier in (".", "..") or not _SAFE.fullmatch(identifier):
        raise InvalidRequest(
            f"field '{field}': {identifier[:80]!r} is not a safe file name: vLLM's ECExampleConnector joins it into a path "
            "unchanged, so it may only hold letters, digits and _ . : @ + = - (and may not be '.' or '..')"
        )
    return identifier


def cast_rows(data: bytes | memoryview, dtype: str, to: str) -> tuple[bytes | memoryview, str]:
    """Little-endian tensor bytes of ``dtype`` as ``to`` (bf16 rounded to nearest even, as torch casts)."""
    if to == dtype:
        return data, dtype
    values = _as_float32(np.frombuffer(data, dtype=np.uint8), dtype) if dtype != "float64" else np.frombuffer(data, "<f8")
    if to == "bfloat16":
        f32 = values.astype("<f4")
        bits = f32.view("<u4").astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
        rounded[np.isnan(f32)] = 0x7FC0
        return rounded.tobytes(), to
    with np.errstate(over="ignore"):  # beyond float16's range is inf, as torch casts it
        return values.astype({"float32": "<f4", "float16": "<f2", "float64": "<f8"}[to]).tobytes(), to


def _as_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (raw.view("<u2").astype(np.uint32) << 16).view("<f4")
    return raw.view({"float32": "<f4", "float16": "<f2"}[dtype]).astype("<f4")


def safetensors_bytes(data: bytes | memoryview, dtype: str, shape: tuple[int, ...]) -> list[bytes | memoryview]:
    """The pieces of a safetensors file holding one tensor ``ec_cache``."""
    nbytes = memoryview(data).nbytes
    expected = _SIZES[dtype] * int(np.prod(shape))
    if nbytes != expected:
        raise ValueError(f"{nbytes} bytes do not make a {dtype} tensor of shape {list(shape)} ({expected} bytes)")
    header = json.dumps({TENSOR_NAME: {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [0, nbytes]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return [struct.pack("<Q", len(header)), header, data]


@dataclass
class _Entry:
    size: int
    mtime: float


class EcStore:
    """``<root>/<identifier>/encoder_cache.safetensors`` files, bounded by ``max_bytes`` and ``max_age_s``.

    One lock guards the index (writers run on media threads, the sweep on the loop's thread pool);
    the index is rebuilt from the folder at start, so files of an earlier run count and age too.
    """

    def __init__(self, root: str | Path, max_bytes: int, max_age_s: float) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._bytes = 0
        self.evicted = 0
        self.root.mkdir(parents=True, exist_ok=True)
        self._scan()

    def _scan(self) -> None:
        for folder in self.root.iterdir():
            path = folder / FILE_NAME
            try:
                stat = path.stat()
            except OSError:
                continue
            self._entries[folder.name] = _Entry(stat.st_size, stat.st_mtime)
            self._bytes += stat.st_size

    def path(self, identifier: str) -> Path:
        """Where vLLM's example connector looks for ``identifier``."""
        return self.root / identifier / FILE_NAME

    def __len__(self) -> int:
        return len(self._entries)

    def write(self, identifier: str, data: bytes | memoryview, dtype: str, shape: tuple[int, ...]) -> int:
        """Store one item's tensor atomically (temp file, fsync, rename); returns the file's size."""
        pieces = safetensors_bytes(data, dtype, shape)
        size = sum(memoryview(p).nbytes for p in pieces)
        if size > self.max_bytes:
            raise InvalidRequest(f"embedding of {size} bytes exceeds the whole store (ENCODER_VLLM_STORAGE_MAX_MB)")
        folder = self.root / identifier
        folder.mkdir(exist_ok=True)
        tmp = folder / f".{FILE_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as out:
            for piece in pieces:
                out.write(piece)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, folder / FILE_NAME)
        with self._lock:
            old = self._entries.pop(identifier, None)
            self._bytes += size - (old.size if old else 0)
            self._entries[identifier] = _Entry(size, time.time())
            victims = self._over_budget_locked(keep=identifier)
        self._remove(victims)
        return size

    def _over_budget_locked(self, keep: str) -> list[str]:
        victims = []
        for name in list(self._entries):  # insertion order is write order: oldest first
            if self._bytes <= self.max_bytes:
                break
            if name == keep:
                continue
            self._bytes -= self._entries.pop(name).size
            victims.append(name)
        return victims

    def sweep(self, now: float | None = None) -> int:
        """Remove files older than ``max_age_s``; how many went."""
        cutoff = (now if now is not None else time.time()) - self.max_age_s
        with self._lock:
            victims = [name for name, entry in self._entries.items() if entry.mtime < cutoff]
            for name in victims:
                self._bytes -= self._entries.pop(name).size
        self._remove(victims)
        return len(victims)

    def _remove(self, names: list[str]) -> None:
        for name in names:
            folder = self.root / name
            try:
                (folder / FILE_NAME).unlink(missing_ok=True)
                folder.rmdir()
            except OSError as exc:  # another writer's temp file, or already gone
                log.debug("evicting %s: %s", name, exc)
            self.evicted += 1

    def read(self, identifier: str) -> bytes | None:
        """The stored file's bytes (the network connector's answer), or None."""
        try:
            return self.path(identifier).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def has(self, identifier: str) -> bool:
        """Whether the item's file is there (what the consumer's ``has_cache_item`` asks)."""
        return self.path(identifier).is_file()
