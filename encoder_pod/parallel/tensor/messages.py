"""The messages of a tensor-parallel group (pure, no torch): how a follower is started, and the
header rank 0 broadcasts before every collective step.

:class:`FollowerSpec` is a follower's command-line argument (JSON of plain values). A header is a msgpack map of :class:`Header`: what the followers must do next (forward, keep the
channel alive, start or stop the profiler, stop) and, for a forward, the name, dtype and shape of
every input tensor that follows plus the batch's slicing plan; for a profile start, its options. Followers build exactly the tensors the header names, so
every rank runs the same sequence of collectives; nothing is pickled.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any

import msgpack

from encoder_pod.errors import InvalidRequest
from encoder_pod.profiling import ProfileOptions

WIRE_VERSION = 2
"""Bumped on any change of :class:`Header`; every rank of a group runs one install."""

DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "uint8", "bool")
"""Tensor dtypes a header may name (the inputs the supported towers take)."""

MAX_DIMS = 8


def rank_dir(rank: int) -> str:
    """Where tensor-parallel rank ``rank`` writes its trace, under the profile's output_dir."""
    return f"tp-rank-{rank}"


@dataclass(frozen=True)
class FollowerSpec:
    """Everything a follower needs, as plain values (its command-line argument is the JSON)."""

    label: str
    """The group's name in logs, e.g. ``dp1``."""
    rank: int
    tp_size: int
    store_port: int
    settings_json: str

    def to_json(self) -> str:
        """The follower's argument."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "FollowerSpec":
        """Inverse of :meth:`to_json`."""
        return cls(**json.loads(text))


class WireError(ValueError):
    """A header that is not one of this version (a bug: both ends are one install)."""


class Op(IntEnum):
    """What the followers do after reading a header."""

    FORWARD = 1
    """Receive the named tensors, run the sharded forward, discard the output."""
    KEEPALIVE = 2
    """Nothing: proves rank 0 is alive so an idle follower's receive never times out."""
    STOP = 3
    """Leave the loop and destroy the process group."""
    PROFILE_START = 4
    """Start this rank's torch profiler with the header's options, into ``<output_dir>/tp-rank-<r>``."""
    PROFILE_STOP = 5
    """Stop this rank's torch profiler and write its trace (rank 0 decides when, num_steps included)."""


@dataclass(frozen=True)
class TensorMeta:
    """One input tensor of a forward, in broadcast order."""

    key: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Header:
    """One step of the group; ``seq`` increases by one per header (a follower checks it)."""

    op: Op
    seq: int
    tensors: tuple[TensorMeta, ...] = ()
    item_tokens: list[list[int]] = field(default_factory=list)
    """The batch's slicing plan: per request, per item, output rows."""
    profile: ProfileOptions | None = None
    """PROFILE_START only: the validated /start_profile options (output_dir is the group's)."""

    def encode(self) -> bytes:
        """msgpack bytes of this header."""
        return msgpack.packb(
            {
                "v": WIRE_VERSION,
                "op": int(self.op),
                "seq": self.seq,
                "tensors": [[t.key, t.dtype, list(t.shape)] for t in self.tensors],
                "item_tokens": self.item_tokens,
                "profile": None if self.profile is None else _profile_fields(self.profile),
            },
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, data: bytes) -> "Header":
        """Inverse of :meth:`encode`; :class:`WireError` if malformed."""
        try:
            fields: Any = msgpack.unpackb(data, raw=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise WireError(f"undecodable header: {exc}") from None
        if not isinstance(fields, dict) or fields.get("v") != WIRE_VERSION:
            raise WireError(f"header of version {fields.get('v') if isinstance(fields, dict) else None!r}, expected {WIRE_VERSION}")
        try:
            tensors = tuple(TensorMeta(str(k), str(d), tuple(int(n) for n in s)) for k, d, s in fields["tensors"])
            profile = None if fields["profile"] is None else ProfileOptions.parse(dict(fields["profile"]))
            header = cls(
                Op(fields["op"]), int(fields["seq"]), tensors, [list(map(int, r)) for r in fields["item_tokens"]], profile
            )
        except (KeyError, TypeError, ValueError, InvalidRequest) as exc:
            raise WireError(f"malformed header: {exc!r}") from None
        if header.tensors and header.op is not Op.FORWARD:
            raise WireError(f"{header.op.name} header names tensors")
        if (header.profile is not None) != (header.op is Op.PROFILE_START):
            raise WireError(f"{header.op.name} header {'without' if header.profile is None else 'with'} profile options")
        for meta in header.tensors:
            if meta.dtype not in DTYPES or len(meta.shape) > MAX_DIMS or any(n < 0 for n in meta.shape):
                raise WireError(f"tensor {meta.key!r}: unsupported {meta.dtype} {meta.shape}")
        return header


def _profile_fields(options: ProfileOptions) -> dict[str, Any]:
    return {
        "output_dir": options.output_dir,
        "activities": list(options.activities),
        "with_stack": options.with_stack,
        "record_shapes": options.record_shapes,
        "num_steps": options.num_steps,
    }
